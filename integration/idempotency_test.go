package integration_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/idempotency"
	"github.com/llmfailover/caddy-llm-failover/idempotency/store"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/internal/pgtest"
	"github.com/llmfailover/caddy-llm-failover/wallet"
	"github.com/llmfailover/caddy-llm-failover/walletapp"
)

// idempotentGateway loads walletChannels with idempotency on (options in
// its block) and a fresh SQLite wallet, and returns a funded key.
func idempotentGateway(t *testing.T, a, b *fu.Server, options string) (secret string) {
	t.Helper()
	gatewayWith(t, storeOption("sqlite "+t.TempDir()+"/w.db"), walletChannels+"\t\tidempotency {\n"+options+"\n\t\t}\n", a.URL, b.URL)
	secret, _ = newWalletAccount(t, "idem", "1000")
	return secret
}

// keyed is a request with an Idempotency-Key and the client's wallet key.
func keyed(t *testing.T, secret, key string, body []byte) *http.Request {
	t.Helper()
	return newPost(t, context.Background(), "/v1/chat/completions", body, append(bearer(secret), "Idempotency-Key", key)...)
}

// do sends req and returns its status, headers and whole body.
func do(t *testing.T, req *http.Request) (int, http.Header, []byte) {
	t.Helper()
	res, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Errorf("%s: %v", req.URL.Path, err)
		return 0, nil, nil
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Errorf("%s: reading: %v", req.URL.Path, err)
	}
	return res.StatusCode, res.Header, b
}

// charges counts the account's charge rows.
func charges(t *testing.T, account string) int {
	t.Helper()
	n := 0
	for _, e := range requestRows(t, account) {
		if e.Kind == wallet.KindCharge {
			n++
		}
	}
	return n
}

// Many pairs of concurrent duplicates, streaming and not, billed: each
// call runs upstream once and is charged once, and both requests of a
// pair get the same answer.
func TestIdempotentConcurrentDuplicates(t *testing.T) {
	const pairs = 1000
	a := upstream(t, fu.SlowHeaders(20*time.Millisecond, fu.OKNamed("a").WithUsage(10, 5).WithPieces("one", " two", " three")))
	b := upstream(t, fu.OK())
	secret := idempotentGateway(t, a, b, "")
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	for i := range pairs {
		stream := i%2 == 0
		body := fu.ChatRequest("m", stream)
		key := fmt.Sprintf("pair-%d", i)
		var got [2][]byte
		var status [2]int
		var pair sync.WaitGroup
		for j := range 2 {
			wg.Add(1)
			pair.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer pair.Done()
				defer func() { <-sem }()
				status[j], _, got[j] = do(t, keyed(t, secret, key, body))
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pair.Wait()
			if status[0] != 200 || status[1] != 200 || !bytes.Equal(got[0], got[1]) {
				t.Errorf("pair %d (stream %v): %d %q and %d %q", i, stream, status[0], got[0], status[1], got[1])
			}
		}()
	}
	wg.Wait()
	waitUnreserved(t, "idem")
	if n := a.Hits(); n != pairs {
		t.Errorf("%d upstream runs for %d calls", n, pairs)
	}
	if n := charges(t, "idem"); n != pairs {
		t.Errorf("%d charge rows for %d calls", n, pairs)
	}
}

// A duplicate after the call completed is answered from the kept answer,
// byte for byte, marked as a replay: no upstream call, no ledger row. A
// different body under the same key is a 422.
func TestIdempotentReplayAfterCompletion(t *testing.T) {
	a := upstream(t, fu.OKNamed("a").WithUsage(10, 5))
	b := upstream(t, fu.OK())
	secret := idempotentGateway(t, a, b, "")
	for _, stream := range []bool{false, true} {
		body := fu.ChatRequest("m", stream)
		key := fmt.Sprintf("replay-%v", stream)
		status, h1, first := do(t, keyed(t, secret, key, body))
		waitUnreserved(t, "idem")
		hits, rows := a.Hits(), len(requestRows(t, "idem"))
		status2, h2, again := do(t, keyed(t, secret, key, body))
		if status != 200 || status2 != 200 || !bytes.Equal(first, again) {
			t.Fatalf("stream %v: %d %q, then %d %q", stream, status, first, status2, again)
		}
		if h1.Get("Idempotent-Replayed") != "" || h2.Get("Idempotent-Replayed") != "true" || h2.Get("Content-Type") != h1.Get("Content-Type") {
			t.Errorf("stream %v: headers %v then %v", stream, h1, h2)
		}
		if a.Hits() != hits || len(requestRows(t, "idem")) != rows {
			t.Errorf("stream %v: the replay reached the upstream (%d) or the ledger (%d rows)", stream, a.Hits()-hits, len(requestRows(t, "idem"))-rows)
		}
		other := bytes.Replace(body, []byte("Say hello."), []byte("Say goodbye."), 1)
		if bytes.Equal(other, body) {
			t.Fatalf("the test's body %s has no \"Say hello.\"", body)
		}
		status, _, refused := do(t, keyed(t, secret, key, other))
		if msg, _, code := openAIError(t, refused); status != 422 || code != "idempotency_key_reused" {
			t.Errorf("another body under the key: %d %s %s", status, code, msg)
		}
	}
}

// followMidStream sends body under key and, once the upstream holds the
// stream after its first piece ("alpha"), a duplicate, read up to that
// piece: the duplicate certainly joined a stream under way. It returns the
// duplicate's response (closed at the test's end), what it read, and the
// first request's answer when it completes.
func followMidStream(t *testing.T, secret, key string, body []byte, a *fu.Server) (*http.Response, []byte, <-chan []byte) {
	t.Helper()
	firstDone := make(chan []byte, 1)
	go func() {
		_, _, got := do(t, keyed(t, secret, key, body))
		firstDone <- got
	}()
	eventually(t, 5*time.Second, "the first stream under way", func() bool { return a.Hits() == 1 })
	res, err := http.DefaultClient.Do(keyed(t, secret, key, body))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	var read []byte
	buf := make([]byte, 512)
	for !bytes.Contains(read, []byte("alpha")) {
		n, err := res.Body.Read(buf)
		read = append(read, buf[:n]...)
		if err != nil {
			t.Fatalf("the duplicate ended before the first piece: %v\n%s", err, read)
		}
	}
	return res, read, firstDone
}

// A duplicate that arrives mid-stream gets the whole stream: what was
// delivered so far, then the rest as it comes. The upstream holds the
// stream after its first piece until the duplicate has read that piece,
// so the duplicate certainly joined a stream under way (a replay of a
// finished one could not have read anything yet).
func TestIdempotentDuplicateMidStream(t *testing.T) {
	pieces := []string{"alpha", " beta", " gamma", " delta", " epsilon"}
	resume := make(chan struct{})
	a := upstream(t, fu.OKNamed("a").WithPieces(pieces...).WithPauseAfter(1, resume).WithUsage(10, 5))
	b := upstream(t, fu.OK())
	secret := idempotentGateway(t, a, b, "")
	body := fu.ChatRequest("m", true)
	// The duplicate reads up to the first piece while the upstream waits,
	// then the rest comes.
	res, second, firstDone := followMidStream(t, secret, "mid", body, a)
	close(resume)
	rest, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	second = append(second, rest...)
	first := <-firstDone
	if res.StatusCode != 200 || res.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(first, second) {
		t.Fatalf("duplicate: %d %v\n%s\nfirst:\n%s", res.StatusCode, res.Header, second, first)
	}
	if got := fu.StreamText(mustSSE(t, second)); got != strings.Join(pieces, "") {
		t.Errorf("duplicate's text %q", got)
	}
	waitUnreserved(t, "idem")
	if a.Hits() != 1 || charges(t, "idem") != 1 {
		t.Errorf("%d upstream runs, %d charges", a.Hits(), charges(t, "idem"))
	}
}

// A client that goes away mid-stream does not end the call: it runs on
// for the grace period, and the client's retry gets the whole answer,
// run and charged once.
func TestIdempotentClientGoneThenRetry(t *testing.T) {
	pieces := []string{"one", " two", " three", " four", " five", " six"}
	a := upstream(t, fu.OKNamed("a").WithPieces(pieces...).WithEventDelay(50*time.Millisecond).WithUsage(10, 5))
	b := upstream(t, fu.OK())
	secret := idempotentGateway(t, a, b, "grace 10s")
	body := fu.ChatRequest("m", true)
	ctx, cancel := context.WithCancel(context.Background())
	req := keyed(t, secret, "gone", body).WithContext(ctx)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	_, _ = res.Body.Read(buf) // the stream has started
	cancel()
	res.Body.Close()
	status, _, again := do(t, keyed(t, secret, "gone", body))
	if status != 200 || fu.StreamText(mustSSE(t, again)) != strings.Join(pieces, "") {
		t.Fatalf("retry: %d\n%s", status, again)
	}
	waitUnreserved(t, "idem")
	if a.Hits() != 1 || charges(t, "idem") != 1 {
		t.Errorf("%d upstream runs, %d charges", a.Hits(), charges(t, "idem"))
	}
}

// A failed call is not kept: its retry runs again. An answer larger than
// max_answer is not kept either, and its duplicate gets 409 rather than a
// second run.
func TestIdempotentFailuresRunAgainLargeAnswersConflict(t *testing.T) {
	a := upstream(t, fu.Status(503, ""))
	b := upstream(t, fu.Status(503, ""))
	secret := idempotentGateway(t, a, b, "max_answer 200")
	body := fu.ChatRequest("m", false)
	for range 2 {
		if status, _, got := do(t, keyed(t, secret, "fails", body)); status != 503 {
			t.Fatalf("%d %s", status, got)
		}
	}
	if a.Hits() != 2 {
		t.Errorf("the failed call ran %d times, want 2 (not kept)", a.Hits())
	}
	a.Set(fu.OKNamed("a").WithPieces(strings.Repeat("long answer ", 40)).WithUsage(10, 5))
	if status, _, got := do(t, keyed(t, secret, "large", body)); status != 200 {
		t.Fatalf("%d %s", status, got)
	}
	status, _, got := do(t, keyed(t, secret, "large", body))
	if _, _, code := openAIError(t, got); status != 409 || code != "idempotency_answer_not_kept" {
		t.Errorf("duplicate of a large answer: %d %s", status, got)
	}
	if a.Hits() != 3 {
		t.Errorf("%d upstream runs, want 3", a.Hits())
	}
}

// Idempotency needs to know the client: without a wallet it is refused.
func TestIdempotencyNeedsAuthentication(t *testing.T) {
	status, body := tryLoad(t, "channel a http://127.0.0.1:9\n\t\tmodel m {\n\t\t\troute a\n\t\t}\n\t\tauth off\n\t\tidempotency")
	if status == 200 || !strings.Contains(body, "idempotency: needs authenticated clients") {
		t.Errorf("%d %s", status, body)
	}
}

// A `caddy reload` in the middle of a call changes nothing: its duplicate,
// sent after the reload, follows the run the old config started, and the
// call is run and charged once.
func TestIdempotentAcrossReload(t *testing.T) {
	pieces := []string{"one", " two", " three", " four", " five", " six", " seven", " eight"}
	a := upstream(t, fu.OKNamed("a").WithPieces(pieces...).WithEventDelay(80*time.Millisecond).WithUsage(10, 5))
	b := upstream(t, fu.OK())
	dir := t.TempDir()
	load := func() {
		gatewayWith(t, storeOption("sqlite "+dir+"/w.db"), walletChannels+"\t\tidempotency\n", a.URL, b.URL)
	}
	load()
	secret, _ := newWalletAccount(t, "reload", "1000")
	body := fu.ChatRequest("m", true)
	firstDone := make(chan []byte)
	go func() {
		_, _, got := do(t, keyed(t, secret, "reload", body))
		firstDone <- got
	}()
	eventually(t, 5*time.Second, "the first stream under way", func() bool { return a.Hits() == 1 })
	load() // the same config again: a reload
	status, h, second := do(t, keyed(t, secret, "reload", body))
	first := <-firstDone
	if status != 200 || h.Get("Idempotent-Replayed") != "true" || !bytes.Equal(first, second) ||
		fu.StreamText(mustSSE(t, first)) != strings.Join(pieces, "") {
		t.Fatalf("after the reload: %d %v\n%s\nfirst:\n%s", status, h, second, first)
	}
	waitUnreserved(t, "reload")
	if a.Hits() != 1 || charges(t, "reload") != 1 {
		t.Errorf("%d upstream runs, %d charges", a.Hits(), charges(t, "reload"))
	}
}

// A stream that broke after content was billed for what it delivered, so
// it is kept as it was delivered: its duplicate gets the same bytes,
// ending with the same error event, and no second run.
func TestIdempotentBrokenStreamReplayedAsDelivered(t *testing.T) {
	a := upstream(t, fu.CutMidStream())
	b := upstream(t, fu.OK())
	secret := idempotentGateway(t, a, b, "")
	body := fu.ChatRequest("m", true)
	status, _, first := do(t, keyed(t, secret, "broken", body))
	if status != 200 || !bytes.Contains(first, []byte(`"error"`)) {
		t.Fatalf("the first run: %d\n%s", status, first)
	}
	waitUnreserved(t, "idem")
	status, h, again := do(t, keyed(t, secret, "broken", body))
	if status != 200 || h.Get("Idempotent-Replayed") != "true" || !bytes.Equal(first, again) {
		t.Fatalf("the duplicate: %d %v\n%s\nfirst:\n%s", status, h, again, first)
	}
	if a.Hits() != 1 || b.Hits() != 0 || charges(t, "idem") != 1 {
		t.Errorf("%d runs on a, %d on b, %d charges", a.Hits(), b.Hits(), charges(t, "idem"))
	}
}

// A duplicate that joined a stream under way must never get a clean end
// of a stream it did not get whole. When the first run's answer outgrows
// max_answer after the duplicate started following it, the duplicate's
// response is cut (the client sees an error), not ended as if complete
// with the rest of the answer missing.
func TestIdempotentFollowerOfAnOverflowingStreamIsNeverTruncatedCleanly(t *testing.T) {
	pieces := []string{"alpha", strings.Repeat(" beta", 60), strings.Repeat(" gamma", 60), " delta"}
	resume := make(chan struct{})
	a := upstream(t, fu.OKNamed("a").WithPieces(pieces...).WithPauseAfter(1, resume).WithUsage(10, 5))
	b := upstream(t, fu.OK())
	secret := idempotentGateway(t, a, b, "max_answer 1KiB")
	body := fu.ChatRequest("m", true)
	res, second, firstDone := followMidStream(t, secret, "overflow", body, a)
	close(resume)
	rest, err := io.ReadAll(res.Body)
	second = append(second, rest...)
	first := <-firstDone
	if fu.StreamText(mustSSE(t, first)) != strings.Join(pieces, "") {
		t.Fatalf("the first run's own answer:\n%s", first)
	}
	if err == nil && !bytes.Equal(first, second) {
		t.Fatalf("the duplicate ended cleanly with %d of the answer's %d bytes (text %q of %q)",
			len(second), len(first), fu.StreamText(mustSSE(t, second)), strings.Join(pieces, ""))
	}
	waitUnreserved(t, "idem")
	if a.Hits() != 1 {
		t.Errorf("%d upstream runs", a.Hits())
	}
}

// A duplicate that follows a run which then ends without any answer (its
// client left and the grace period ran out before the upstream answered)
// must not get an empty 200: there was no answer to share, so the
// duplicate is answered on its own (a run of its own, or an error),
// never with a success that carries nothing.
func TestIdempotentFollowerOfARunThatEndsWithoutAnswer(t *testing.T) {
	a := upstream(t, fu.SlowHeaders(1500*time.Millisecond, fu.OKNamed("a").WithUsage(10, 5)))
	b := upstream(t, fu.OK())
	secret := idempotentGateway(t, a, b, "grace 300ms")
	body := fu.ChatRequest("m", false)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		res, err := http.DefaultClient.Do(keyed(t, secret, "no-answer", body).WithContext(ctx))
		if err == nil {
			res.Body.Close()
		}
	}()
	eventually(t, 5*time.Second, "the first run under way", func() bool { return a.Hits() == 1 })
	cancel() // the first client leaves; its run has 300ms of grace
	status, h, got := do(t, keyed(t, secret, "no-answer", body))
	if status == 200 && len(got) == 0 {
		t.Fatalf("the duplicate got an empty 200 (headers %v)", h)
	}
	if status == 200 && !bytes.Contains(got, []byte("choices")) {
		t.Fatalf("the duplicate got a 200 that is no answer: %q", got)
	}
}

// A stream that may be resumed (stream_resume continue) holds its break
// back; when its idempotent run is ended by the grace period mid-stream
// (its client left), what was recorded must still end honestly: its
// client's retry is answered with the kept answer, which must not be a
// truncated stream ending as if complete (no [DONE], no error event).
func TestIdempotentResumableStreamCutByGraceIsNotKeptAsComplete(t *testing.T) {
	pieces := []string{"one", " two", " three", " four", " five", " six", " seven", " eight", " nine", " ten"}
	a := upstream(t, fu.OKNamed("a").WithPieces(pieces...).WithEventDelay(150*time.Millisecond).WithUsage(10, 5))
	b := upstream(t, fu.OK())
	gatewayWith(t, storeOption("sqlite "+t.TempDir()+"/w.db"),
		walletChannels+"\t\tstream_resume continue\n\t\tidempotency {\n\t\t\tgrace 300ms\n\t\t}\n", a.URL, b.URL)
	secret, _ := newWalletAccount(t, "idem", "1000")
	body := fu.ChatRequest("m", true)
	ctx, cancel := context.WithCancel(context.Background())
	res, err := http.DefaultClient.Do(keyed(t, secret, "grace-cut", body).WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	_, _ = res.Body.Read(buf) // the stream has started
	cancel()
	res.Body.Close()
	waitUnreserved(t, "idem") // the run ended (its grace ran out mid-stream)
	status, _, again := do(t, keyed(t, secret, "grace-cut", body))
	if status == 200 && !bytes.Contains(again, []byte("[DONE]")) && !bytes.Contains(again, []byte(`"error"`)) {
		t.Fatalf("the retry got a truncated stream that ends as if complete:\n%s", again)
	}
}

// A key names one request: the same key and body sent to another
// endpoint is another request, never answered with the first endpoint's
// kept answer (a chat completion replayed to a legacy completions call).
func TestIdempotentKeyIsNotReplayedToAnotherEndpoint(t *testing.T) {
	a := upstream(t, fu.OKNamed("a").WithUsage(10, 5))
	b := upstream(t, fu.OK())
	secret := idempotentGateway(t, a, b, "")
	body := fu.ChatRequest("m", false)
	if status, _, got := do(t, keyed(t, secret, "endpoint", body)); status != 200 {
		t.Fatalf("chat: %d %s", status, got)
	}
	waitUnreserved(t, "idem")
	req := newPost(t, context.Background(), "/v1/completions", body, append(bearer(secret), "Idempotency-Key", "endpoint")...)
	status, h, got := do(t, req)
	if h.Get("Idempotent-Replayed") == "true" {
		t.Fatalf("the chat answer was replayed to /v1/completions: %d %s", status, got)
	}
}

// A duplicate answered from a kept answer to a client that stops
// reading, TCP open, is cut by the write deadline as a first run's answer
// is: the replay must not hold its goroutine, its connection and the kept
// answer's bytes (which the table may have let go of) for as long as the
// client keeps the connection.
func TestIdempotentReplayToAClientThatStopsReadingIsCut(t *testing.T) {
	const size = 32 << 20
	a := upstream(t, fu.OK().WithPieces(strings.Repeat("x", size)))
	b := upstream(t, fu.OK())
	gatewayWith(t, storeOption("sqlite "+t.TempDir()+"/w.db"),
		walletChannels+"\t\tstream_idle_timeout 1s\n\t\tidempotency {\n\t\t\tmax_answer 64MiB\n\t\t\tmax_stored 128MiB\n\t\t}\n", a.URL, b.URL)
	secret, _ := newWalletAccount(t, "idem", "1000")
	body := fu.ChatRequest("m", false)
	if status, _, got := do(t, keyed(t, secret, "big", body)); status != 200 || len(got) < size {
		t.Fatalf("first run: status %d, %d bytes", status, len(got))
	}
	conn, err := net.Dial("tcp", fmt.Sprintf("localhost:%d", httpPort))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer %s\r\nIdempotency-Key: big\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", secret, len(body), body)
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != 200 || res.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %v, %v", res, err)
	}
	// Read nothing for well past stream_idle_timeout (32 MiB is more than
	// the sockets' buffers hold), then everything: the gateway must have
	// cut the answer by then.
	time.Sleep(5 * time.Second)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.Copy(io.Discard, res.Body)
	if err == nil && n == res.ContentLength {
		t.Fatalf("a client that read nothing for 5 s still got the whole %d-byte replay: nothing cut it", n)
	}
	t.Logf("replay cut after %d of %d bytes: %v", n, res.ContentLength, err)
}

// A reload that moves the wallet off PostgreSQL, the fleet's idempotency
// store, while a keyed stream runs: the old config's run still holds its
// claim there, and must record its answer when it ends, or the fleet's
// other instances see the call running, then (once the lease passes)
// abandoned, and run it again for its client's retry: a second upstream
// run, and a second charge.
func TestIdempotentRunAcrossReloadOffTheFleetStoreRecordsItsAnswer(t *testing.T) {
	pieces := []string{"one", " two", " three", " four", " five", " six", " seven", " eight"}
	a := upstream(t, fu.OKNamed("a").WithPieces(pieces...).WithEventDelay(250*time.Millisecond).WithUsage(10, 5))
	b := upstream(t, fu.OK())
	dsn := pgtest.FreshDSN(t)
	t.Setenv("LLMF_IT_WALLET_DSN", dsn)
	gatewayWith(t, storeOption("postgres {env.LLMF_IT_WALLET_DSN}"), walletChannels+"\t\tidempotency\n", a.URL, b.URL)
	secret, keyID := newWalletAccount(t, "fleet", "1000")
	body := fu.ChatRequest("m", true)
	firstDone := make(chan []byte)
	go func() {
		_, _, got := do(t, keyed(t, secret, "moved", body))
		firstDone <- got
	}()
	eventually(t, 5*time.Second, "the first stream under way", func() bool { return a.Hits() == 1 })
	gatewayWith(t, storeOption("sqlite "+t.TempDir()+"/w.db"), walletChannels+"\t\tidempotency\n", a.URL, b.URL)
	first := <-firstDone
	if fu.StreamText(mustSSE(t, first)) != strings.Join(pieces, "") {
		t.Fatalf("the stream across the reload:\n%s", first)
	}

	// What another instance of the fleet finds for the client's retry.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := store.OpenPostgres(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	id := idempotency.ID(walletapp.DefaultName+"\x00fleet\x00"+keyID, "moved")
	now := time.Now()
	c, err := st.Claim(ctx, id, idempotency.Fingerprint("POST /v1/chat/completions", body), "another-instance", now.Add(30*time.Second), now.Add(time.Hour), now)
	if err != nil {
		t.Fatal(err)
	}
	if c.State != store.Done || c.Answer == nil {
		t.Fatalf("the fleet's store has the call as %v (answer %v), want done with its answer: "+
			"another instance would run it again", c.State, c.Answer != nil)
	}
}
