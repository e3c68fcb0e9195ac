package integration_test

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// backupMessage is a continuation under an identity of its own (message
// id, model) and with its own final usage, which the client must not see
// except for the usage.
func backupMessage(pieces []string) fu.Behavior {
	steps := []any{
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_backup\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"backup-model\",\"content\":[],\"usage\":{\"input_tokens\":300,\"output_tokens\":1}}}\n\n",
		"event: ping\ndata: {\"type\":\"ping\"}\n\n",
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
	}
	for _, p := range pieces {
		steps = append(steps, fmt.Sprintf("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":%q}}\n\n", p))
	}
	steps = append(steps,
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":17}}\n\n",
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	return sseScript(steps...)
}

// The client sees one message: the first attempt's id and model only, the
// continuation's final usage, and the seam as an HTTP trailer announced
// with the headers and as an SSE comment. The access log still gets its
// line.
func TestResumeOneIdentityAndTrailer(t *testing.T) {
	pieces := resumePieces()
	a := upstream(t, fu.OKNamed("primary").WithPieces(pieces...).WithCutAfter(40))
	b := upstream(t, backupMessage(pieces[40:]))
	_, accessLog := loggedGateway(t, gateChannels, a.URL, b.URL, "stream_resume continue")
	s := resumePost(t)
	wantText(t, s, strings.Join(pieces, ""))
	mustNotContain(t, s.body, "msg_backup", "backup-model", `"input_tokens":300`)
	var start struct {
		Message struct{ ID, Model string } `json:"message"`
	}
	evs := mustSSE(t, s.body)
	for _, ev := range evs {
		if ev.Name == "message_start" {
			if err := json.Unmarshal([]byte(ev.Data), &start); err != nil {
				t.Fatal(err)
			}
		}
	}
	if start.Message.ID != "msg_fault1" || start.Message.Model != "claude" {
		t.Errorf("message_start names %+v, want the first attempt's id and the model asked for", start.Message)
	}
	var final string
	for _, ev := range evs {
		if ev.Name == "message_delta" {
			final = ev.Data
		}
	}
	if !strings.Contains(final, `"output_tokens":17`) {
		t.Errorf("final usage %q is not the continuation's", final)
	}
	// Go's client takes the announcement (Trailer:) out of the headers
	// and fills Response.Trailer at the end of the body; its server sends
	// only announced trailers.
	if got := s.res.Trailer.Get("X-Llm-Failover-Resumed"); got != "a -> b (prefill)" {
		t.Errorf("trailer %s = %q, want \"a -> b (prefill)\" (trailers %v)", "X-Llm-Failover-Resumed", got, s.res.Trailer)
	}
	mustContain(t, s.body, ": llm-failover resumed from a on b (prefill)\n")
	eventually(t, 5*time.Second, "the access log line", func() bool {
		b, _ := os.ReadFile(accessLog)
		return strings.Contains(string(b), "/v1/messages")
	})
	line, _ := os.ReadFile(accessLog)
	var entry struct {
		Status int `json:"status"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(string(line))), &entry); err != nil || entry.Status != 200 {
		t.Errorf("access log line %s: %v", line, err)
	}
}

// A continuation channel that never sends its headers is abandoned after
// stream_header_timeout, not after a fresh deadline: the client gets the
// original failure's error event at once, and no trailer value.
func TestResumeSilentFallbackAbandoned(t *testing.T) {
	pieces := resumePieces()
	a := upstream(t, fu.OKNamed("primary").WithPieces(pieces...).WithCutAfter(40))
	b := upstream(t, fu.NoHeaders())
	gateway(t, gateChannels, a.URL, b.URL, "stream_resume continue\nstream_header_timeout 300ms")
	s := resumePost(t)
	originalErrorLast(t, s, pieces[:40])
	if at := s.at("event: error"); at < 250*time.Millisecond || at > 3*time.Second {
		t.Fatalf("the error event came after %s; stream_header_timeout is 300ms", at)
	}
	if got := s.res.Trailer.Get("X-Llm-Failover-Resumed"); got != "" {
		t.Errorf("a failed resume sent trailer %q", got)
	}
	hits(t, b, 1)
}

// A continuation that sends headers but no content is abandoned when the
// resume's own bound, stream_idle_timeout from the break, runs out; its
// empty stream is never committed (the gate fails over, whatever
// stream_gate_failover says).
func TestResumeContentlessFallbackBounded(t *testing.T) {
	pieces := resumePieces()
	a := upstream(t, fu.OKNamed("primary").WithPieces(pieces...).WithCutAfter(40))
	b := upstream(t, fu.SlowFirstToken(20*time.Second))
	gateway(t, gateChannels, a.URL, b.URL, "stream_resume continue\nstream_idle_timeout 500ms")
	s := resumePost(t)
	originalErrorLast(t, s, pieces[:40])
	if at := s.at("event: error"); at < 450*time.Millisecond || at > 4*time.Second {
		t.Fatalf("the error event came after %s; the resume has stream_idle_timeout, 500ms", at)
	}
	mustNotContain(t, s.body, "llm-failover resumed")
}

// originalErrorLast checks a stream whose resume failed: the delivered
// text, then the first attempt's truncation error event, once.
func originalErrorLast(t *testing.T, s streamed, delivered []string) {
	t.Helper()
	okStream(t, s)
	if got, want := fu.StreamText(mustSSE(t, s.body)), strings.Join(delivered, ""); got != want {
		t.Fatalf("text %q, want %q", got, want)
	}
	fs := frames(s.body)
	if last := fs[len(fs)-1]; !strings.HasPrefix(last, "event: error\n") || !strings.Contains(last, "incomplete") {
		t.Fatalf("last event is not the original truncation error: %q\n%s", last, s.body)
	}
	if n := count(s.body, "event: error"); n != 1 {
		t.Fatalf("%d error events:\n%s", n, s.body)
	}
}
