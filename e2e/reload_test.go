package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// TestBinaryReloadKeepsStream runs `caddy reload` while a billed stream is
// in flight: the stream must finish untouched (every event, [DONE], no
// error event) and be charged on the wallet both configs share, and a
// breaker opened before the reload must still be open after it, since a
// reload must not forget which upstream is failing. Then a reload that
// fails to provision must leave all of that as it was.
func TestBinaryReloadKeepsStream(t *testing.T) {
	// 12 pieces: role + 12 content + finish + usage + [DONE] = 16 events,
	// 200ms apart: about 3s.
	pieces := []string{"one", " two", " three", " four", " five", " six", " seven", " eight", " nine", " ten", " eleven", " twelve"}
	slow := fu.New(fu.OKNamed("slow").WithPieces(pieces...).WithEventDelay(200 * time.Millisecond))
	defer slow.Close()
	flaky := fu.New(fu.Status(503, ""))
	defer flaky.Close()
	spare := fu.New(fu.OKNamed("spare"))
	defer spare.Close()

	p := portsReload
	handler := func(idle string) string {
		return fmt.Sprintf(`
		channel slow %s
		channel flaky %s
		channel spare %s
		model gpt-slow {
			route slow cost 1 2
		}
		model gpt-flaky {
			route flaky cost 1 1
			route spare cost 2 2
		}
		breaker {
			window   5m
			failures 3
			cooldown 120s
		}
		stream_idle_timeout %s
		wallet
`, slow.URL, flaky.URL, spare.URL, idle)
	}
	config := func(idle string) string { return globalOptions(p) + site(p, handler(idle)) }
	in := newInstance(t, "reload", p, config("60s"))
	gw := in.gatewayURL()
	secret := in.newAccount("acme", "5")
	key := []string{"Authorization", "Bearer " + secret}

	// Open flaky's breaker: three 503s (each request fails over to spare).
	for i := 0; i < 3; i++ {
		if status, hdr, body := post(t, gw+"/v1/chat/completions", fu.ChatRequest("gpt-flaky", false), key...); status != 200 || hdr.Get("X-Served-By") != "spare" {
			t.Fatalf("request %d to gpt-flaky: status %d served by %q, want 200 from spare; body %s", i+1, status, hdr.Get("X-Served-By"), body)
		}
	}
	if flaky.Hits() != 3 {
		t.Fatalf("flaky was called %d times, want 3", flaky.Hits())
	}
	flakyState := func() channelInfo {
		t.Helper()
		var chans []channelInfo
		in.admin(http.MethodGet, "/llm_failover/channels", nil, 200, &chans)
		for _, c := range chans {
			if c.Name == "flaky" {
				return c
			}
		}
		t.Fatalf("no channel flaky in %+v", chans)
		return channelInfo{}
	}
	before := flakyState()
	if before.State != "open" || before.TimesOpened != 1 {
		t.Fatalf("after 3 failures flaky is %+v, want open, opened once", before)
	}

	// Start the slow stream.
	req, _ := http.NewRequest(http.MethodPost, gw+"/v1/chat/completions", strings.NewReader(string(fu.ChatRequest("gpt-slow", true))))
	req.Header.Set("Authorization", "Bearer "+secret)
	start := time.Now()
	resp, err := gatewayClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: status %d, body %s", resp.StatusCode, b)
	}

	// Reload once the stream is well under way (after the 3rd event).
	var reloadOut string
	var reloadErr error
	var reloadAt, reloadTook time.Duration
	var wg sync.WaitGroup
	var once sync.Once
	count := 0
	events, readErr := readSSE(resp.Body, start, func(sseEvent) {
		count++
		if count != 3 {
			return
		}
		once.Do(func() {
			in.writeConfig(config("61s")) // harmless change
			wg.Add(1)
			go func() {
				defer wg.Done()
				reloadAt = time.Since(start)
				reloadOut, reloadErr = runCaddy(t, in.env, "reload", "--config", in.cfgPath, "--adapter", "caddyfile", "--address", in.adminAddr())
				reloadTook = time.Since(start) - reloadAt
			}()
		})
	})
	total := time.Since(start)
	wg.Wait()
	t.Logf("stream: %d events in %v; reload started at %v and took %v", len(events), total.Round(time.Millisecond), reloadAt.Round(time.Millisecond), reloadTook.Round(time.Millisecond))
	if reloadErr != nil {
		t.Fatalf("caddy reload: %v\n%s", reloadErr, reloadOut)
	}
	if reloadAt == 0 {
		t.Fatalf("the stream ended before the reload started (%d events)", len(events))
	}
	if readErr != nil {
		t.Errorf("the stream broke during the reload: %v", readErr)
	}
	text, sawErr := chatText(events)
	if want := strings.Join(pieces, ""); text != want {
		t.Errorf("streamed text %q, want %q", text, want)
	}
	if sawErr {
		t.Errorf("the stream carried an error event: %+v", events)
	}
	if len(events) == 0 || events[len(events)-1].Data != "[DONE]" {
		t.Fatalf("the stream does not end with [DONE]: %+v", events)
	}
	if last := events[len(events)-1].At; last < reloadAt+reloadTook {
		t.Errorf("the stream ended (%v) before the reload was done (%v): the test proved nothing (machine too slow?)", last, reloadAt+reloadTook)
	}

	// The stream was billed on the store both configs share: charged, not
	// left reserved. 11 input tokens at $1/M, 7 output at $2/M.
	var acct account
	if !waitFor(5*time.Second, func() bool { acct = in.account("acme"); return micros(t, acct.Reserved) == 0 }) {
		t.Errorf("the stream's reservation is still held after the reload: %+v", acct)
	}
	streamCharged := false
	for _, e := range in.ledger("acme") {
		streamCharged = streamCharged || e.Kind == "charge" && e.Model == "gpt-slow" && e.Cost == "0.000025"
	}
	if !streamCharged {
		t.Errorf("the stream that spanned the reload was not charged: %+v", in.ledger("acme"))
	}

	// The new config is live...
	var cfg map[string]any
	in.admin(http.MethodGet, "/config/", nil, 200, &cfg)
	hs := findHandlers(cfg, "llm_failover")
	if len(hs) != 1 || hs[0]["stream_idle_timeout"] != float64(61*time.Second) {
		t.Errorf("after reload the live config's llm_failover is %v, want stream_idle_timeout 61s", hs)
	}
	// ...and still remembers that flaky is failing.
	after := flakyState()
	if after.State != "open" || after.TimesOpened != 1 || !after.OpenUntil.Equal(before.OpenUntil) {
		t.Errorf("after reload flaky is %+v, want still open (as before: %+v)", after, before)
	}
	hits := flaky.Hits()
	if status, hdr, body := post(t, gw+"/v1/chat/completions", fu.ChatRequest("gpt-flaky", false), key...); status != 200 || hdr.Get("X-Served-By") != "spare" {
		t.Errorf("gpt-flaky after reload: status %d served by %q, want 200 from spare; body %s", status, hdr.Get("X-Served-By"), body)
	}
	if flaky.Hits() != hits {
		t.Errorf("after reload the open channel was called again (%d → %d hits): its breaker was forgotten", hits, flaky.Hits())
	}
	// A fresh request works on the new config.
	status, _, body := post(t, gw+"/v1/chat/completions", fu.ChatRequest("gpt-slow", false), key...)
	if status != 200 || !strings.Contains(string(body), "twelve") {
		t.Errorf("request after reload: status %d body %s", status, body)
	}

	// A reload that fails to provision changes nothing. In the broken
	// config a handler identical to the running one provisions first (it
	// takes references on the shared breakers and wallet store), then a
	// second one fails, and Caddy cleans the first one up again: that must
	// release its references without closing what the running config uses.
	broken := globalOptions(p) + fmt.Sprintf(`http://:%d {
	bind 127.0.0.1
	route {
		llm_failover /v1/* {
%s
		}
		llm_failover {
			channel x %s
			model gpt-x {
				route no-such-channel
			}
		}
	}
}
`, p.HTTP, handler("61s"), spare.URL)
	in.writeConfig(broken)
	out, err := runCaddy(t, in.env, "reload", "--config", in.cfgPath, "--adapter", "caddyfile", "--address", in.adminAddr())
	if err == nil || !strings.Contains(out, "no-such-channel") {
		t.Fatalf("reload of a config routing to an unknown channel: err %v, want a refusal naming it:\n%s", err, out)
	}
	status, _, body = post(t, gw+"/v1/chat/completions", fu.ChatRequest("gpt-slow", false), key...)
	if status != 200 {
		t.Errorf("billed request after a failed reload: status %d body %s (was the wallet store closed?)", status, body)
	}
	if !waitFor(5*time.Second, func() bool { acct = in.account("acme"); return micros(t, acct.Reserved) == 0 }) {
		t.Errorf("reservation not settled after a failed reload: %+v", acct)
	}
	if after := flakyState(); after.State != "open" || !after.OpenUntil.Equal(before.OpenUntil) {
		t.Errorf("after a failed reload flaky is %+v, want still open as before (%+v)", after, before)
	}
	hits = flaky.Hits()
	if status, hdr, body := post(t, gw+"/v1/chat/completions", fu.ChatRequest("gpt-flaky", false), key...); status != 200 || hdr.Get("X-Served-By") != "spare" || flaky.Hits() != hits {
		t.Errorf("gpt-flaky after a failed reload: status %d served by %q (flaky hits %d → %d); body %s", status, hdr.Get("X-Served-By"), hits, flaky.Hits(), body)
	}
}

type channelInfo struct {
	Name        string    `json:"name"`
	State       string    `json:"state"`
	Failures    int       `json:"failures_in_window"`
	OpenUntil   time.Time `json:"open_until"`
	TimesOpened uint64    `json:"times_opened"`
}
