package integration_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// resumePieces is a 60-token answer; the continuation serves its tail.
func resumePieces() []string {
	p := make([]string, 60)
	for i := range p {
		p[i] = fmt.Sprintf(" t%02d", i)
	}
	return p
}

// wantText checks a clean stream whose accumulated text is exactly want.
func wantText(t *testing.T, s streamed, want string) {
	t.Helper()
	okStream(t, s)
	if got := fu.StreamText(mustSSE(t, s.body)); got != want {
		t.Fatalf("text %q, want %q:\n%s", got, want, s.body)
	}
}

// resumeRequest is a streamed Messages request whose max_tokens leaves
// room for a continuation after the fakes' 40 pieces (about 80 tokens):
// a continuation asks for what is left of the client's limit, and none
// is sought once the delivered text used it up.
func resumeRequest(model string) []byte {
	return []byte(`{"model":"` + model + `","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":"Say hello."}]}`)
}

func resumePost(t *testing.T) streamed {
	return streamPost(t, nil, "/v1/messages", resumeRequest("claude"), "", "anthropic-version", "2023-06-01")
}

// A Messages stream cut after 40 of 60 text deltas is finished by the
// backup from an assistant prefill, as one message.
func TestResumeCutStreamDeliveredWhole(t *testing.T) {
	pieces := resumePieces()
	a := upstream(t, fu.OKNamed("primary").WithPieces(pieces...).WithCutAfter(40))
	b := upstream(t, fu.OKNamed("backup").WithPieces(pieces[40:]...))
	gateway(t, gateChannels, a.URL, b.URL, "stream_resume continue")
	resumed := resumes(t, "claude", "resumed")
	s := resumePost(t)
	wantText(t, s, strings.Join(pieces, ""))
	if got := resumes(t, "claude", "resumed") - resumed; got != 1 {
		t.Errorf("resumes_total{outcome=resumed} grew by %v, want 1", got)
	}
	// What a resume costs: from the last delivered delta to the seam.
	t.Logf("resume took %s from the 40th delta to the first continued one", s.at(" t40")-s.at(" t39"))
	for sub, n := range map[string]int{"event: message_start": 1, "event: content_block_start": 1, "event: message_stop": 1,
		"event: message_delta": 1, ": llm-failover resumed from a on b (prefill)\n": 1, "event: error": 0, `"index":1`: 0} {
		if got := count(s.body, sub); got != n {
			t.Errorf("%d × %q, want %d:\n%s", got, sub, n, s.body)
		}
	}
	prefill := b.LastRequest().Body
	if want := `{"content":"` + strings.Join(pieces[:40], "") + `","role":"assistant"}`; !strings.Contains(string(prefill), want) {
		t.Fatalf("backup request lacks the prefill %s:\n%s", want, prefill)
	}
	hits(t, a, 1)
	hits(t, b, 1)
	// The journal says how much the client had when the stream broke.
	var journaled failoverapp.DecisionsAnswer
	if err := adminGet(t, "/llm_failover/decisions?reason=resumed", &journaled); err != nil {
		t.Fatal(err)
	}
	want := provider.EstimateTokens([]byte(strings.Join(pieces[:40], "")))
	// The journal outlives configs: this request's decision is the newest.
	if journaled.Total == 0 || journaled.Decisions[0].DeliveredTokens != want || journaled.Decisions[0].Next != "b" {
		t.Errorf("journal %+v, want the newest resumed decision with %d delivered tokens", journaled, want)
	}
}

// A stall after 20 deltas is resumed once stream_idle_timeout passes.
func TestResumeStalledStream(t *testing.T) {
	pieces := resumePieces()
	a := upstream(t, stallAfter(pieces, 20))
	b := upstream(t, fu.OKNamed("backup").WithPieces(pieces[20:]...))
	gateway(t, gateChannels, a.URL, b.URL, "stream_resume continue\nstream_idle_timeout 300ms")
	s := resumePost(t)
	wantText(t, s, strings.Join(pieces, ""))
	if s.endAt < 250*time.Millisecond || s.endAt > 5*time.Second {
		t.Fatalf("ended after %s; the idle timeout is 300ms", s.endAt)
	}
	mustContain(t, s.body, ": llm-failover resumed from a on b")
}

// stallAfter streams a Messages answer, then goes silent after n deltas.
func stallAfter(pieces []string, n int) fu.Behavior {
	return sseScript(append(anthropicSteps(pieces[:n]), 10*time.Second)...)
}

// anthropicSteps are the opening events of a Messages stream with one
// text delta per piece.
func anthropicSteps(pieces []string) []any {
	steps := []any{"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude\",\"content\":[],\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n",
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"}
	for _, p := range pieces {
		steps = append(steps, fmt.Sprintf("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":%q}}\n\n", p))
	}
	return steps
}

// A backup that rejects the prefill is asked again in the instructed
// form; when it rejects that too, the client has the original failure's
// error event, not the 400.
func TestResumePrefillRejectedKeepsOriginalError(t *testing.T) {
	pieces := resumePieces()
	a := upstream(t, fu.OKNamed("primary").WithPieces(pieces...).WithCutAfter(40))
	b := upstream(t, fu.Status(400, `{"type":"error","error":{"type":"invalid_request_error","message":"prefill rejected"}}`))
	gateway(t, gateChannels, a.URL, b.URL, "stream_resume continue")
	failed := resumes(t, "claude", "failed")
	s := resumePost(t)
	if got := resumes(t, "claude", "failed") - failed; got != 1 {
		t.Errorf("resumes_total{outcome=failed} grew by %v, want 1", got)
	}
	originalErrorLast(t, s, pieces[:40])
	mustNotContain(t, s.body, "llm-failover resumed", "message_stop")
	hits(t, b, 2)
}

// A stream with a tool_use block is never resumed.
func TestResumeNotForToolUse(t *testing.T) {
	a := upstream(t, sseScript(
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"claude\",\"content\":[],\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n",
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"f\",\"input\":{}}}\n\n",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\\\"\"}}\n\n"))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, gateChannels, a.URL, b.URL, "stream_resume continue")
	s := resumePost(t)
	okStream(t, s)
	fs := frames(s.body)
	if last := fs[len(fs)-1]; !strings.HasPrefix(last, "event: error\n") {
		t.Fatalf("last event is not an error: %q\n%s", last, s.body)
	}
	hits(t, b, 0)
}

// stream_resume takes continue or off, handler-wide or per model; a
// model's own setting wins.
func TestResumeConfig(t *testing.T) {
	for _, bad := range []string{"stream_resume", "stream_resume on", "stream_resume continue off"} {
		if code, body := tryLoad(t, `channel a http://127.0.0.1:9 {
		}
		model m {
			route a
		}
		%s`, bad); code == 200 {
			t.Errorf("%q accepted: %s", bad, body)
		}
	}
	pieces := resumePieces()
	a := upstream(t, fu.OKNamed("primary").WithPieces(pieces...).WithCutAfter(40))
	b := upstream(t, fu.OKNamed("backup").WithPieces(pieces[40:]...))
	gateway(t, `channel a %s {
		}
		channel b %s {
		}
		model claude {
			route a cost 1 1
			route b cost 2 2
			stream_resume off
		}
		stream_resume continue`, a.URL, b.URL)
	s := resumePost(t)
	okStream(t, s)
	if got := fu.StreamText(mustSSE(t, s.body)); got != strings.Join(pieces[:40], "") {
		t.Fatalf("model's stream_resume off was not honoured: %q", got)
	}
	hits(t, b, 0)
}

// An error event after content is resumed like a cut: the client never
// sees it, and gets the whole answer.
func TestResumeAfterErrorEvent(t *testing.T) {
	pieces := resumePieces()
	steps := anthropicSteps(pieces[:40])
	steps = append(steps, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n")
	a := upstream(t, sseScript(steps...))
	b := upstream(t, fu.OKNamed("backup").WithPieces(pieces[40:]...))
	gateway(t, gateChannels, a.URL, b.URL, "stream_resume continue")
	s := resumePost(t)
	wantText(t, s, strings.Join(pieces, ""))
	mustNotContain(t, s.body, "event: error", "Overloaded")
	mustContain(t, s.body, ": llm-failover resumed from a on b", "event: message_stop")
}

// resumes reads caddy_llm_failover_resumes_total{form,model,outcome},
// summed over the forms.
func resumes(t *testing.T, model, outcome string) float64 {
	t.Helper()
	var sum float64
	for _, form := range []string{"prefill", "instructed", "none"} {
		v, _ := brkMetric(t, fmt.Sprintf(`caddy_llm_failover_resumes_total{form=%q,model=%q,outcome=%q}`, form, model, outcome))
		sum += v
	}
	return sum
}
