package integration_test

import (
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// Without a wallet the history still counts output tokens: the usage the
// upstream reported, JSON or streamed, and an estimate of the content
// delivered for a stream that reported none.
func TestHistoryOutputTokensWithoutWallet(t *testing.T) {
	a := upstream(t, fu.OKNamed("tokens").WithUsage(10, 42))
	b := upstream(t, fu.OKNamed("backup"))
	statusGateway(t, "tk", a.URL, b.URL, "failures 60")
	tokens := func() int64 {
		return channelWindow(t, fetchStatus(t, adminURL+"/llm_failover/status"), "tkA", "5m").OutputTokens
	}
	// An attempt is recorded once its answer is written; wait for it.
	waitTokens := func(want int64) int64 {
		t.Helper()
		var got int64
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if got = tokens(); got >= want {
				break
			}
		}
		return got
	}
	base := tokens()
	send := func(body []byte) {
		t.Helper()
		if res, out := post(t, "/v1/chat/completions", body); res.StatusCode != 200 {
			t.Fatalf("status %d: %s", res.StatusCode, out)
		}
	}

	send(fu.ChatRequest("tkm", false))
	if got := waitTokens(base+42) - base; got != 42 {
		t.Errorf("JSON answer: history recorded %d output tokens, want 42", got)
	}
	send(fu.ChatRequest("tkm", true)) // asks include_usage
	if got := waitTokens(base+84) - base; got != 84 {
		t.Errorf("stream with usage: history recorded %d output tokens, want 84", got)
	}
	// Nobody asked for usage and no wallet asks it for them: the upstream
	// reports none, and the delivered text is estimated.
	send([]byte(`{"model":"tkm","stream":true,"messages":[{"role":"user","content":"Say hello."}]}`))
	got := waitTokens(base+85) - base - 84
	if got <= 0 || got > 40 {
		t.Errorf("stream without usage: history recorded %d estimated output tokens, want a few", got)
	}
	// Metering asks the upstream nothing more than the client did.
	mustNotContain(t, a.LastRequest().Body, "include_usage")
}
