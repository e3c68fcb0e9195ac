package integration_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "modernc.org/sqlite"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/internal/pgtest"
	"github.com/llmfailover/caddy-llm-failover/wallet"
	"github.com/llmfailover/caddy-llm-failover/walletapp"
)

// These tests pin what each path off the happy one charges, on SQLite and
// on PostgreSQL.

// walletStore is one store a test runs on: the llm_wallet store option and
// a way to tamper with the database behind the wallet's back.
type walletStore struct {
	option string
	exec   func(t *testing.T, query string, args ...any)
}

// eachWalletStore runs f on a fresh SQLite file and a fresh PostgreSQL
// schema.
func eachWalletStore(t *testing.T, f func(t *testing.T, s walletStore)) {
	t.Run("sqlite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "w.db")
		f(t, walletStore{option: "sqlite " + path, exec: func(t *testing.T, q string, args ...any) {
			db, err := sql.Open("sqlite", path)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if _, err := db.Exec(q, args...); err != nil {
				t.Fatal(err)
			}
		}})
	})
	t.Run("postgres", func(t *testing.T) {
		dsn := pgtest.FreshDSN(t)
		t.Setenv("LLMF_IT_WALLET_DSN", dsn)
		f(t, walletStore{option: "postgres {env.LLMF_IT_WALLET_DSN}", exec: func(t *testing.T, q string, args ...any) {
			ctx := context.Background()
			c, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(ctx)
			q = strings.Replace(q, "?", "$1", 1)
			if _, err := c.Exec(ctx, q, args...); err != nil {
				t.Fatal(err)
			}
		}})
	})
}

// attemptsFirst waits for an account's ledger to hold n request rows and
// returns them with the failed attempts first: those are written in the
// background, so they may land after the settlement.
func attemptsFirst(t *testing.T, account string, n int) []walletapp.EntryView {
	t.Helper()
	var rows []walletapp.EntryView
	eventually(t, 10*time.Second, fmt.Sprintf("%d ledger rows", n), func() bool {
		rows = requestRows(t, account)
		return len(rows) >= n
	})
	sort.SliceStable(rows, func(i, j int) bool {
		return rows[i].Kind == wallet.KindFailedAttempt && rows[j].Kind != wallet.KindFailedAttempt
	})
	return rows
}

// walletOptions is the llm_wallet global option block for store with
// extra lines.
func walletOptions(store string, extra ...string) string {
	return "\tllm_wallet {\n\t\tstore " + store + "\n" + strings.Join(extra, "\n") + "\n\t}"
}

// lighthousePieces are 20 content pieces of 8 words of English each, from
// provider/testdata/estimate. cl100k_base counts 29, 37 and 45 tokens in
// the first 3, 4 and 5 (o200k_base one fewer).
func lighthousePieces(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "provider", "testdata", "estimate", "english.txt"))
	if err != nil {
		t.Fatal(err)
	}
	words := strings.Fields(string(b))
	pieces := make([]string, 20)
	for i := range pieces {
		pieces[i] = " " + strings.Join(words[i*8:(i+1)*8], " ")
	}
	return pieces
}

// within checks got against a true token count at the estimator's
// documented tolerance (10%, see provider.TokenEstimator).
func within(t *testing.T, what string, got, lo, hi int64) {
	t.Helper()
	if float64(got) < 0.9*float64(lo) || float64(got) > 1.1*float64(hi) {
		t.Errorf("%s: charged %d output tokens, true count %d-%d (±10%%)", what, got, lo, hi)
	}
}

// estimatedRow returns the single charge row of an account, checking that
// it is an estimate of a partly delivered answer, not the bound.
func estimatedRow(t *testing.T, account string, body []byte) walletapp.EntryView {
	t.Helper()
	rows := requestRows(t, account)
	settledOnce(t, rows)
	if len(rows) != 1 || rows[0].Kind != wallet.KindCharge {
		t.Fatalf("ledger rows: %s", kinds(rows))
	}
	e := rows[0]
	if !strings.HasPrefix(e.Note, "estimated: ") {
		t.Errorf("an estimated charge's note is %q", e.Note)
	}
	// The input is the request's text, far below its bound (bytes + 1024).
	if e.TokensIn <= 0 || e.TokensIn > int64(len(body))/2 {
		t.Errorf("input charged as %d tokens for a %d-byte body", e.TokensIn, len(body))
	}
	if parseMoney(t, e.Cost) != priceM.Cost(e.TokensIn, e.TokensOut) {
		t.Errorf("cost %s for %d in, %d out", e.Cost, e.TokensIn, e.TokensOut)
	}
	return e
}

func TestWalletChargesWhatWasDelivered(t *testing.T) {
	eachWalletStore(t, func(t *testing.T, s walletStore) {
		pieces := lighthousePieces(t)
		body := chatStreamBody(false)

		t.Run("upstream cuts after 5 of 20 chunks", func(t *testing.T) {
			a := upstream(t, fu.OKNamed("a").WithPieces(pieces...).WithCutAfter(5))
			b := upstream(t, fu.OKNamed("b"))
			gatewayWith(t, walletOptions(s.option), walletChannels, a.URL, b.URL)
			secret, _ := newWalletAccount(t, "cut", "1")
			res, got := post(t, "/v1/chat/completions", body, bearer(secret)...)
			if res.StatusCode != 200 {
				t.Fatalf("status %d: %s", res.StatusCode, got)
			}
			mustContain(t, got, "the history of coastal trade", `"error"`)
			waitUnreserved(t, "cut")
			e := estimatedRow(t, "cut", body)
			within(t, "5 chunks", e.TokensOut, 44, 45)
			if !strings.Contains(e.Note, "without a usage report") {
				t.Errorf("note %q", e.Note)
			}
		})

		t.Run("client leaves after 3 chunks", func(t *testing.T) {
			a := upstream(t, fu.OKNamed("a").WithPieces(pieces...).WithEventDelay(300*time.Millisecond))
			b := upstream(t, fu.OKNamed("b"))
			gatewayWith(t, walletOptions(s.option), walletChannels, a.URL, b.URL)
			secret, _ := newWalletAccount(t, "gone", "1")
			streamUntil(t, "/v1/chat/completions", body, "relied on fires", bearer(secret)...)
			waitUnreserved(t, "gone")
			e := estimatedRow(t, "gone", body)
			// The fourth chunk may have been read as the client left.
			within(t, "3 chunks", e.TokensOut, 28, 37)
			if !strings.Contains(e.Note, "client left") {
				t.Errorf("note %q", e.Note)
			}
		})
	})
}

// TestWalletStreamOutlivesReservationTTL: a live request keeps its
// reservation, so a stream three times longer than reservation_ttl is
// charged its usage, never swept free.
func TestWalletStreamOutlivesReservationTTL(t *testing.T) {
	eachWalletStore(t, func(t *testing.T, s walletStore) {
		const ttl = time.Second
		a := upstream(t, fu.OKNamed("a").WithPieces(lighthousePieces(t)...).WithEventDelay(3*ttl/20).WithUsage(100, 20))
		b := upstream(t, fu.OKNamed("b"))
		gatewayWith(t, walletOptions(s.option, "\t\treservation_ttl 1s"), walletChannels, a.URL, b.URL)
		secret, _ := newWalletAccount(t, "long", "1")
		began := time.Now()
		res, got := post(t, "/v1/chat/completions", chatStreamBody(false), bearer(secret)...)
		if res.StatusCode != 200 || !bytes.Contains(got, []byte("[DONE]")) {
			t.Fatalf("status %d: %s", res.StatusCode, got)
		}
		if took := time.Since(began); took < 3*ttl {
			t.Fatalf("the stream took %s, not 3× the TTL: the test proves nothing", took)
		}
		waitUnreserved(t, "long")
		rows := requestRows(t, "long")
		if len(rows) != 1 || rows[0].Kind != wallet.KindCharge || parseMoney(t, rows[0].Cost) != priceM.Cost(100, 20) {
			t.Fatalf("ledger rows: %s %+v", kinds(rows), rows)
		}
		// A request that is gone (never settled, never extended) is still
		// swept: the keep-alive holds only live ones.
		var st map[string]any
		mustWalletCall(t, http.MethodGet, "status", nil, &st)
		if st["last_sweep"] == nil {
			t.Errorf("status %v", st)
		}
	})
}

func TestWalletFreeCalls(t *testing.T) {
	eachWalletStore(t, func(t *testing.T, s walletStore) {
		counter := upstream(t, fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"input_tokens":12}`)
		}))
		gatewayWith(t, walletOptions(s.option), walletChannels, counter.URL, counter.URL)
		// An empty account: count_tokens reserves nothing, so it is served.
		secret, _ := newWalletAccount(t, "free", "")
		body := []byte(`{"model":"claude","messages":[{"role":"user","content":"How many tokens is this?"}]}`)
		res, got := post(t, "/v1/messages/count_tokens", body, "x-api-key", secret, "anthropic-version", "2023-06-01")
		if res.StatusCode != 200 || !bytes.Contains(got, []byte(`"input_tokens":12`)) {
			t.Fatalf("count_tokens: status %d: %s", res.StatusCode, got)
		}
		// Still authenticated: no key, no upstream call.
		if res, got := post(t, "/v1/messages/count_tokens", body, "anthropic-version", "2023-06-01"); res.StatusCode != 401 {
			t.Fatalf("count_tokens without a key: status %d: %s", res.StatusCode, got)
		}
		// The model list needs a key like every endpoint (the security
		// rule), and costs nothing: no reservation, no ledger row.
		for _, tc := range []struct {
			hdr  []string
			want int
		}{{nil, 401}, {[]string{"Authorization", "Bearer " + secret}, 200}} {
			req, _ := http.NewRequest(http.MethodGet, gatewayURL+"/v1/models", nil)
			for i := 0; i+1 < len(tc.hdr); i += 2 {
				req.Header.Set(tc.hdr[i], tc.hdr[i+1])
			}
			mres, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			mres.Body.Close()
			if mres.StatusCode != tc.want {
				t.Fatalf("GET /v1/models with %v: status %d, want %d", tc.hdr, mres.StatusCode, tc.want)
			}
		}
		bal, reserved := balanceOf(t, "free")
		if bal != 0 || reserved != 0 {
			t.Fatalf("balance %s reserved %s after free calls", bal, reserved)
		}
		if rows := requestRows(t, "free"); len(rows) != 0 {
			t.Fatalf("free calls left ledger rows: %s", kinds(rows))
		}
	})
}

// TestWalletOnlyTheServedAnswerIsBilled: a 200 that fails the stream gate
// (an error frame before any content) is a channel failure, never charged;
// the backup that served is charged once.
func TestWalletOnlyTheServedAnswerIsBilled(t *testing.T) {
	eachWalletStore(t, func(t *testing.T, s walletStore) {
		a := upstream(t, fu.ErrorAfterPreamble().WithUsage(5000, 5000))
		b := upstream(t, fu.OKNamed("b").WithUsage(100, 20))
		gatewayWith(t, walletOptions(s.option), walletChannels, a.URL, b.URL)
		secret, _ := newWalletAccount(t, "acct", "1")
		res, got := postSettled(t, "acct", "/v1/chat/completions", chatStreamBody(true), bearer(secret)...)
		if res.StatusCode != 200 || res.Header.Get("X-Served-By") != "b" {
			t.Fatalf("status %d served by %q: %s", res.StatusCode, res.Header.Get("X-Served-By"), got)
		}
		rows := attemptsFirst(t, "acct", 2)
		want := priceM.Cost(100, 20)
		if got := settledOnce(t, rows); got != want {
			t.Errorf("charged %s, want %s: %s", got, want, kinds(rows))
		}
		for _, e := range rows {
			if e.Channel == "a" && (e.Kind != wallet.KindFailedAttempt || e.Cost != "0") {
				t.Errorf("the failed channel's row %+v", e)
			}
		}
	})
}

// A CDN's text/html 200 is a channel failure (unexpected_content_type):
// never billed, and the backup's answer is billed once.
func TestWalletForeignContent200IsNotBilled(t *testing.T) {
	eachWalletStore(t, func(t *testing.T, s walletStore) {
		cdn := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = io.WriteString(w, "<html><body>502 Bad Gateway</body></html>")
		}))
		defer cdn.Close()
		b := upstream(t, fu.OKNamed("b").WithUsage(100, 20))
		gatewayWith(t, walletOptions(s.option), walletChannels, cdn.URL, b.URL)
		secret, _ := newWalletAccount(t, "acct", "1")
		for _, stream := range []bool{false, true} {
			res, got := postSettled(t, "acct", "/v1/chat/completions", chatStreamBody(stream), bearer(secret)...)
			if res.StatusCode != 200 || res.Header.Get("X-Served-By") != "b" || bytes.Contains(got, []byte("<html>")) {
				t.Fatalf("stream=%v: status %d served by %q: %s", stream, res.StatusCode, res.Header.Get("X-Served-By"), got)
			}
		}
		rows := attemptsFirst(t, "acct", 4)
		charged := wallet.Micros(0)
		for _, e := range rows {
			if e.Channel == "a" && (e.Kind != wallet.KindFailedAttempt || e.Cost != "0") {
				t.Errorf("the CDN channel's row %+v", e)
			}
			if e.Kind == wallet.KindCharge {
				c, _ := wallet.ParseMicros(e.Cost)
				charged += c
			}
		}
		if want := 2 * priceM.Cost(100, 20); charged != want {
			t.Errorf("charged %s, want %s: %s", charged, want, kinds(rows))
		}
	})
}

func TestWalletLimitForms(t *testing.T) {
	eachWalletStore(t, func(t *testing.T, s walletStore) {
		a := upstream(t, fu.OKNamed("a").WithUsage(10, 10))
		gatewayWith(t, walletOptions(s.option), walletChannels, a.URL, a.URL)
		// pricey costs $0.001 a token: $25 covers 20,000 output tokens and
		// the input bound, not 100,000.
		secret, _ := newWalletAccount(t, "acct", "25")
		req := func(limit string) []byte {
			return []byte(`{"model":"pricey","max_tokens":` + limit + `,"messages":[{"role":"user","content":"hi"}]}`)
		}
		for _, limit := range []string{"1e5", "100000.0", "1E+5", "100000"} {
			res, got := post(t, "/v1/chat/completions", req(limit), bearer(secret)...)
			if res.StatusCode != 402 || !bytes.Contains(got, []byte("may cost up to $101.")) {
				t.Errorf("max_tokens %s: status %d: %s", limit, res.StatusCode, got)
			}
		}
		for _, limit := range []string{`"100"`, "1.5", "-1", "1e18", "true"} {
			res, got := post(t, "/v1/chat/completions", req(limit), bearer(secret)...)
			if msg, _, _ := openAIError(t, got); res.StatusCode != 400 || !strings.Contains(msg, "max_tokens") {
				t.Errorf("max_tokens %s: status %d: %s", limit, res.StatusCode, got)
			}
		}
		if res, got := postSettled(t, "acct", "/v1/chat/completions", req("2e4"), bearer(secret)...); res.StatusCode != 200 {
			t.Errorf("max_tokens 2e4: status %d: %s", res.StatusCode, got)
		}
		hits(t, a, 1)
	})
}

const storedContextChannels = `
		channel a %s
		model m {
			route a
			price 2 8
		}
		model windowed {
			route a
			price 2 8
			max_input_tokens 200000
		}
		wallet
`

func TestWalletStoredContext(t *testing.T) {
	eachWalletStore(t, func(t *testing.T, s walletStore) {
		a := upstream(t, fu.OKNamed("a").WithUsage(150000, 10))
		gatewayWith(t, walletOptions(s.option), storedContextChannels, a.URL)
		secret, _ := newWalletAccount(t, "acct", "10")
		body := func(model string) []byte {
			return []byte(`{"model":"` + model + `","previous_response_id":"resp_123","input":"and then?"}`)
		}
		res, got := post(t, "/v1/responses", body("m"), bearer(secret)...)
		if res.StatusCode != 400 || !bytes.Contains(got, []byte("max_input_tokens")) || !bytes.Contains(got, []byte("previous_response_id")) {
			t.Fatalf("stored context without max_input_tokens: status %d: %s", res.StatusCode, got)
		}
		hits(t, a, 0)
		// With the option, the bound covers the stored input, so the
		// upstream's 150,000 input tokens are plausible and charged.
		res, got = postSettled(t, "acct", "/v1/responses", body("windowed"), bearer(secret)...)
		if res.StatusCode != 200 {
			t.Fatalf("status %d: %s", res.StatusCode, got)
		}
		rows := requestRows(t, "acct")
		if len(rows) != 1 || rows[0].TokensIn != 150000 || parseMoney(t, rows[0].Cost) != priceM.Cost(150000, 10) {
			t.Fatalf("ledger rows %+v", rows)
		}
	})
}

func TestWalletImplausibleUsage(t *testing.T) {
	eachWalletStore(t, func(t *testing.T, s walletStore) {
		a := upstream(t, fu.OKNamed("a").WithUsage(-5, 10))
		gatewayWith(t, walletOptions(s.option), walletChannels, a.URL, a.URL)
		secret, _ := newWalletAccount(t, "acct", "1")
		body := fu.ChatRequest("m", false)
		res, got := postSettled(t, "acct", "/v1/chat/completions", body, bearer(secret)...)
		if res.StatusCode != 200 {
			t.Fatalf("status %d: %s", res.StatusCode, got)
		}
		rows := requestRows(t, "acct")
		if len(rows) != 1 {
			t.Fatalf("ledger rows %s", kinds(rows))
		}
		e := rows[0]
		in, out := wallet.Estimate{BodyBytes: len(body), MaxOutput: 16384}.Bounds()
		if e.TokensIn != in || e.TokensOut != out || parseMoney(t, e.Cost) != priceM.Cost(in, out) || !strings.Contains(e.Note, "implausible") {
			t.Fatalf("negative usage charged as %+v, want the bound %d in, %d out", e, in, out)
		}
	})
}

// TestWalletFailoverDoesNotWaitOnTheStore: with a store that takes a
// second per statement, the gap between a failed attempt and the next
// channel stays what it is without a wallet; the failed attempt's row
// still lands.
func TestWalletFailoverDoesNotWaitOnTheStore(t *testing.T) {
	proxy, slow := pgProxy(t, pgtest.FreshDSN(t))
	t.Setenv("LLMF_IT_WALLET_DSN", slow)

	var mu sync.Mutex
	var failedAt, backupAt time.Time
	a := upstream(t, fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		mu.Lock()
		failedAt = time.Now()
		mu.Unlock()
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	b := upstream(t, fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, n int64) {
		mu.Lock()
		backupAt = time.Now()
		mu.Unlock()
		fu.OKNamed("b").WithUsage(10, 10).Serve(w, r, n)
	}))
	gatewayWith(t, walletOptions("postgres {env.LLMF_IT_WALLET_DSN}", "\t\tadmission_timeout 60s"), walletChannels, a.URL, b.URL)
	secret, _ := newWalletAccount(t, "acct", "1")
	proxy.Delay(time.Second)
	res, got := post(t, "/v1/chat/completions", fu.ChatRequest("m", false), bearer(secret)...)
	if res.StatusCode != 200 || res.Header.Get("X-Served-By") != "b" {
		t.Fatalf("status %d served by %q: %s", res.StatusCode, res.Header.Get("X-Served-By"), got)
	}
	mu.Lock()
	gap := backupAt.Sub(failedAt)
	mu.Unlock()
	t.Logf("failover gap with a store taking 1s per statement: %s", gap)
	if gap > 500*time.Millisecond {
		t.Errorf("failing over took %s: it waited on the store", gap)
	}
	proxy.Delay(0)
	eventually(t, 60*time.Second, "the failed attempt's row and the charge", func() bool {
		return len(requestRows(t, "acct")) == 2
	})
	if k := kinds(requestRows(t, "acct")); !strings.Contains(k, wallet.KindFailedAttempt+"/a") || !strings.Contains(k, wallet.KindCharge+"/b") {
		t.Errorf("ledger rows %s", k)
	}
}

// auditClean runs the audit through the admin API and the CLI and fails
// the test on any difference.
func auditClean(t *testing.T) {
	t.Helper()
	var a walletapp.AuditView
	mustWalletCall(t, http.MethodGet, "audit", nil, &a)
	if !a.Clean || a.Accounts == 0 {
		t.Errorf("audit: %+v", a)
	}
	var out bytes.Buffer
	if err := walletapp.RunCommand(&out, fmt.Sprintf("localhost:%d", adminPort), "", []string{"audit"}); err != nil || !strings.HasPrefix(out.String(), "clean") {
		t.Errorf("caddy llm-wallet audit: %v\n%s", err, out.String())
	}
}

func TestWalletAudit(t *testing.T) {
	eachWalletStore(t, func(t *testing.T, s walletStore) {
		a := upstream(t, fu.OKNamed("a").WithUsage(100, 20))
		gatewayWith(t, walletOptions(s.option), walletChannels, a.URL, a.URL)
		secret, _ := newWalletAccount(t, "acct", "1")
		newWalletAccount(t, "other", "2")
		postSettled(t, "acct", "/v1/chat/completions", fu.ChatRequest("m", false), bearer(secret)...)
		auditClean(t)

		// A difference injected behind the ledger's back is reported.
		s.exec(t, "UPDATE accounts SET balance = balance + 42 WHERE id = ?", "acct")
		var v walletapp.AuditView
		mustWalletCall(t, http.MethodGet, "audit", nil, &v)
		if v.Clean || len(v.Differences) != 1 || v.Differences[0].Account != "acct" ||
			parseMoney(t, v.Differences[0].Balance)-parseMoney(t, v.Differences[0].Ledger) != 42 {
			t.Fatalf("audit after tampering: %+v", v)
		}
		var out bytes.Buffer
		err := walletapp.RunCommand(&out, fmt.Sprintf("localhost:%d", adminPort), "", []string{"audit"})
		if err == nil || !strings.Contains(out.String(), "acct") {
			t.Fatalf("caddy llm-wallet audit after tampering: %v\n%s", err, out.String())
		}
		var one walletapp.AuditView
		mustWalletCall(t, http.MethodGet, "audit?account=other", nil, &one)
		if !one.Clean || one.Accounts != 1 {
			t.Errorf("audit of the untouched account: %+v", one)
		}
	})
}

// On /v1/completions the upstream generates max_tokens for each choice
// of each prompt: best_of (generated server-side and all billed, "it can
// quickly consume your token quota") and a batch of prompts (an array)
// multiply the output as n does. The reservation covered one completion,
// so the upstream's true report was "implausible" and capped at the
// bound: the client paid for one completion, the operator for the other
// 19.
func TestWalletCompletionsMultipliersAreReserved(t *testing.T) {
	const maxTokens, times = 100, 20
	prompts := make([]string, times)
	for i := range prompts {
		prompts[i] = fmt.Sprintf("%q", fmt.Sprint("Say this is test ", i))
	}
	for name, body := range map[string]string{
		"best_of":            fmt.Sprintf(`{"model":"pricey","prompt":"Say this is a test","max_tokens":%d,"best_of":%d}`, maxTokens, times),
		"a batch of prompts": fmt.Sprintf(`{"model":"pricey","prompt":[%s],"max_tokens":%d}`, strings.Join(prompts, ","), maxTokens),
	} {
		t.Run(name, func(t *testing.T) {
			a := upstream(t, fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"id":"cmpl-1","object":"text_completion","created":1,"model":"pricey","choices":[{"text":"best","index":0,"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":%d,"total_tokens":%d}}`,
					maxTokens*times, 2+maxTokens*times)
			}))
			b := upstream(t, fu.OKNamed("b"))
			walletGateway(t, a, b)
			// pricey costs $0.001 a token: $100 covers the 2,000 output
			// tokens and the input bound.
			secret, _ := newWalletAccount(t, "acct", "100")
			res, got := postSettled(t, "acct", "/v1/completions", []byte(body), bearer(secret)...)
			if res.StatusCode != 200 {
				t.Fatalf("status %d: %s", res.StatusCode, got)
			}
			rows := requestRows(t, "acct")
			if len(rows) != 1 {
				t.Fatalf("ledger rows %s", kinds(rows))
			}
			if e := rows[0]; e.TokensOut != maxTokens*times || strings.Contains(e.Note, "implausible") {
				t.Errorf("%s × max_tokens %d charged as %d output tokens (%s): the upstream billed %d",
					name, maxTokens, e.TokensOut, e.Note, maxTokens*times)
			}
		})
	}
}
