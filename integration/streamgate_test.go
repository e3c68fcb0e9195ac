package integration_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// gateChannels serves model m (OpenAI paths) and model claude (Anthropic
// path) from channel a, then b. Each channel is sent its own upstream model
// name, which the gateway renames back to the client's in every event that
// echoes it (chat chunks, message_start, response.created): the channel
// that answered is told by the X-Served-By and X-Fault-Upstream headers
// and by the upstream's text ("primary" anywhere in a client's body means
// the failed primary leaked through the gate), and "from-a" or "from-b"
// anywhere means a rename leaked.
const gateChannels = `
		channel a %s {
			pass_response_header X-Fault-Upstream
		}
		channel b %s {
			pass_response_header X-Fault-Upstream
		}
		model m {
			route a cost 1 1 upstream_model from-a
			route b cost 2 2 upstream_model from-b
		}
		model claude {
			route a cost 1 1 upstream_model from-a
			route b cost 2 2 upstream_model from-b
		}
		%s
`

// Texts of the faultupstream's in-stream errors, which must never reach a
// client whose request failed over.
var upstreamErrorTexts = []string{
	"Rate limit reached",             // chat error frame
	"Overloaded", "overloaded_error", // Anthropic error event
	"The model failed to generate a response.", // response.failed
	"response.failed",
}

// streamed is a response read line by line, with the time (since the
// request was sent) of the headers, of the first line containing the
// marker, and of the end of the body.
type streamed struct {
	res       *http.Response
	body      []byte
	err       error // the body's read error; nil for a clean end
	headersAt time.Duration
	markerAt  time.Duration // -1 if the marker never came
	endAt     time.Duration
	lines     []timedLine
}

type timedLine struct {
	at   time.Duration
	text string
}

// at is when the first line containing sub arrived, or -1.
func (s streamed) at(sub string) time.Duration {
	for _, l := range s.lines {
		if strings.Contains(l.text, sub) {
			return l.at
		}
	}
	return -1
}

// streamPost sends body to the gateway and reads the answer as it arrives.
// ctx may be nil.
func streamPost(t *testing.T, ctx context.Context, path string, body []byte, marker string, hdr ...string) streamed {
	t.Helper()
	if ctx == nil {
		ctx = context.Background()
	}
	req := newPost(t, ctx, path, body, hdr...)
	client := &http.Client{Timeout: 30 * time.Second}
	start := time.Now()
	res, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer res.Body.Close()
	s := streamed{res: res, headersAt: time.Since(start), markerAt: -1}
	br := bufio.NewReader(res.Body)
	var buf bytes.Buffer
	for {
		line, err := br.ReadBytes('\n')
		buf.Write(line)
		if len(line) > 0 {
			s.lines = append(s.lines, timedLine{time.Since(start), string(line)})
		}
		if marker != "" && s.markerAt < 0 && bytes.Contains(line, []byte(marker)) {
			s.markerAt = time.Since(start)
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				s.err = err
			}
			break
		}
	}
	s.endAt = time.Since(start)
	s.body = buf.Bytes()
	return s
}

// okStream checks a 200 event stream that ended cleanly.
func okStream(t *testing.T, s streamed) {
	t.Helper()
	if s.res.StatusCode != 200 {
		t.Fatalf("status %d: %s", s.res.StatusCode, s.body)
	}
	if ct := s.res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("Content-Type %q: %s", ct, s.body)
	}
	if s.err != nil {
		t.Fatalf("reading the stream: %v\n%s", s.err, s.body)
	}
}

func servedBy(t *testing.T, s streamed, channel, upstreamName string) {
	t.Helper()
	if got := s.res.Header.Get("X-Served-By"); got != channel {
		t.Errorf("X-Served-By = %q, want %q", got, channel)
	}
	if got := s.res.Header.Get("X-Fault-Upstream"); got != upstreamName {
		t.Errorf("X-Fault-Upstream = %q, want %q (upstream response headers of the wrong attempt?)", got, upstreamName)
	}
}

func count(body []byte, sub string) int { return bytes.Count(body, []byte(sub)) }

// frames splits an SSE body into its events (raw text, without the blank
// line), skipping nothing.
func frames(body []byte) []string {
	var out []string
	for _, f := range strings.Split(strings.ReplaceAll(string(body), "\r\n", "\n"), "\n\n") {
		if strings.TrimSpace(f) != "" {
			out = append(out, f)
		}
	}
	return out
}

// cleanChatFromBackup checks a chat stream that the backup served alone.
func cleanChatFromBackup(t *testing.T, s streamed) {
	t.Helper()
	okStream(t, s)
	servedBy(t, s, "b", "backup")
	mustNotContain(t, s.body, "from-a", "from-b", "primary")
	mustNotContain(t, s.body, upstreamErrorTexts...)
	fs := frames(s.body)
	if len(fs) == 0 || !strings.HasPrefix(fs[0], "data: {") || !strings.Contains(fs[0], `"role":"assistant"`) || !strings.Contains(fs[0], `"model":"m"`) {
		t.Fatalf("first frame is not the backup's role chunk:\n%s", s.body)
	}
	if n := count(s.body, `"role":"assistant"`); n != 1 {
		t.Fatalf("%d role chunks, want 1:\n%s", n, s.body)
	}
	if got := fu.StreamText(mustSSE(t, s.body)); got != "Hello from backup" {
		t.Fatalf("text %q:\n%s", got, s.body)
	}
	if last := fs[len(fs)-1]; last != "data: [DONE]" {
		t.Fatalf("stream does not end with [DONE] but %q", last)
	}
	if n := count(s.body, "[DONE]"); n != 1 {
		t.Fatalf("%d [DONE], want 1", n)
	}
}

func mustSSE(t *testing.T, body []byte) []fu.Event {
	t.Helper()
	evs, err := fu.ReadSSE(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parsing SSE: %v\n%s", err, body)
	}
	return evs
}

// 1. An error as the very first frame never reaches the client.
func TestStreamErrorFirstFrameFailsOver(t *testing.T) {
	a := upstream(t, fu.ErrorFirstFrame().Named("primary"))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, gateChannels, a.URL, b.URL, "")
	s := streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("m", true), "")
	cleanChatFromBackup(t, s)
	hits(t, a, 1)
	hits(t, b, 1)
	if got := s.res.Header.Get("X-Attempts"); got != "2" {
		t.Errorf("X-Attempts = %q, want 2", got)
	}
}

// 2. A role chunk is not content: an error after it still fails over, and
// the held role chunk is dropped with the attempt.
func TestStreamErrorAfterRoleFailsOver(t *testing.T) {
	a := upstream(t, fu.ErrorAfterRole().Named("primary"))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, gateChannels, a.URL, b.URL, "")
	s := streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("m", true), "")
	cleanChatFromBackup(t, s)
	hits(t, a, 1)
	hits(t, b, 1)

	// Its error event was a rate limit, which parks the primary: the next
	// request goes straight to the backup.
	cleanChatFromBackup(t, streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("m", true), ""))
	hits(t, a, 1)
	hits(t, b, 2)
	if code, body := brkAdmin(t, http.MethodPost, "/llm_failover/channels/a/reset"); code != 200 {
		t.Fatalf("reset: %d %s", code, body)
	}

	// The same with the role chunk in a read of its own, so that the gate
	// has to judge it alone, and a server error.
	a.Set(sseScript(roleFrame+"\n\n", 100*time.Millisecond, errFrame+"\n\n"))
	s = streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("m", true), "")
	cleanChatFromBackup(t, s)
	mustNotContain(t, s.body, "blew up")
	hits(t, a, 2)
	hits(t, b, 3)
}

// 3. Anthropic: message_start and ping are preamble; the error after them
// fails over and the client gets exactly one message_start, the backup's.
func TestStreamAnthropicErrorAfterPreambleFailsOver(t *testing.T) {
	a := upstream(t, fu.AnthropicErrorAfterPreamble().Named("primary"))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, gateChannels, a.URL, b.URL, "")
	s := streamPost(t, nil, "/v1/messages", fu.MessagesRequest("claude", true), "", "anthropic-version", "2023-06-01")
	okStream(t, s)
	servedBy(t, s, "b", "backup")
	mustNotContain(t, s.body, "from-a", "primary", "event: error")
	mustNotContain(t, s.body, upstreamErrorTexts...)
	fs := frames(s.body)
	if len(fs) == 0 || !strings.HasPrefix(fs[0], "event: message_start\n") || !strings.Contains(fs[0], `"model":"claude"`) {
		t.Fatalf("first frame is not the backup's message_start:\n%s", s.body)
	}
	if n := count(s.body, "event: message_start"); n != 1 {
		t.Fatalf("%d message_start events, want 1:\n%s", n, s.body)
	}
	if n := count(s.body, "event: ping"); n != 1 {
		t.Fatalf("%d ping events, want 1:\n%s", n, s.body)
	}
	if !strings.HasPrefix(fs[len(fs)-1], "event: message_stop\n") {
		t.Fatalf("stream does not end with message_stop:\n%s", s.body)
	}
	if got := fu.StreamText(mustSSE(t, s.body)); got != "Hello from backup" {
		t.Fatalf("text %q", got)
	}
	hits(t, a, 1)
	hits(t, b, 1)
}

// Claude opens a tool_use block's input with an empty partial_json (and
// a ping): nothing of the answer yet, as the block's start is not, so an
// overloaded error after it still fails over, as after message_start.
func TestStreamAnthropicErrorAfterEmptyToolInputFailsOver(t *testing.T) {
	a := upstream(t, sseScript(
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_primary\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"from-a\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":20,\"output_tokens\":1}}}\n\n",
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_primary\",\"name\":\"weather\",\"input\":{}}}\n\n",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\"}}\n\n",
		"event: ping\ndata: {\"type\": \"ping\"}\n\n",
		50*time.Millisecond,
		"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
	))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, gateChannels, a.URL, b.URL, "")
	s := streamPost(t, nil, "/v1/messages", fu.MessagesRequest("claude", true), "", "anthropic-version", "2023-06-01")
	okStream(t, s)
	servedBy(t, s, "b", "backup")
	mustNotContain(t, s.body, "toolu_primary", "msg_primary", "event: error")
	mustNotContain(t, s.body, upstreamErrorTexts...)
	if n := count(s.body, "event: message_start"); n != 1 {
		t.Fatalf("%d message_start events, want 1:\n%s", n, s.body)
	}
	hits(t, a, 1)
	hits(t, b, 1)
}

// 4. Responses API: response.created / in_progress are preamble; a
// response.failed after them fails over.
func TestStreamResponsesFailedFailsOver(t *testing.T) {
	a := upstream(t, fu.ResponsesFailed().Named("primary"))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, gateChannels, a.URL, b.URL, "")
	s := streamPost(t, nil, "/v1/responses", fu.ResponsesRequest("m", true), "")
	okStream(t, s)
	servedBy(t, s, "b", "backup")
	mustNotContain(t, s.body, "from-a", "primary")
	mustNotContain(t, s.body, upstreamErrorTexts...)
	fs := frames(s.body)
	if len(fs) == 0 || !strings.HasPrefix(fs[0], "event: response.created\n") || !strings.Contains(fs[0], `"model":"m"`) {
		t.Fatalf("first frame is not the backup's response.created:\n%s", s.body)
	}
	for _, ev := range []string{"event: response.created", "event: response.in_progress", "event: response.completed"} {
		if n := count(s.body, ev); n != 1 {
			t.Fatalf("%d %q, want 1:\n%s", n, ev, s.body)
		}
	}
	if !strings.HasPrefix(fs[len(fs)-1], "event: response.completed\n") {
		t.Fatalf("stream does not end with response.completed:\n%s", s.body)
	}
	if got := fu.StreamText(mustSSE(t, s.body)); got != "Hello from backup" {
		t.Fatalf("text %q", got)
	}
	hits(t, a, 1)
	hits(t, b, 1)
}

// 5. A slow first token within the gate is waited for, not failed over.
func TestStreamSlowFirstTokenUnderGate(t *testing.T) {
	a := upstream(t, fu.SlowFirstToken(500*time.Millisecond).Named("primary"))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, gateChannels, a.URL, b.URL, "")
	s := streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("m", true), "")
	okStream(t, s)
	servedBy(t, s, "a", "primary")
	if got := fu.StreamText(mustSSE(t, s.body)); got != "Hello from primary" {
		t.Fatalf("text %q:\n%s", got, s.body)
	}
	mustContain(t, s.body, `"model":"m"`, "data: [DONE]")
	mustNotContain(t, s.body, "from-a")
	if s.endAt < 450*time.Millisecond {
		t.Fatalf("ended after %s, before the first token was even sent", s.endAt)
	}
	hits(t, a, 1)
	hits(t, b, 0)
}

// 6. Gate expiry: by default the stream commits (headers go out at the
// gate) and the primary's slow content follows; with "failover" the
// backup serves and nothing of the primary is seen.
func TestStreamGateExpiry(t *testing.T) {
	t.Run("commit", func(t *testing.T) {
		// The token comes 2s in, far enough from the 200ms gate that a
		// loaded CI machine cannot blur the two.
		a := upstream(t, fu.SlowFirstToken(2*time.Second).Named("primary"))
		b := upstream(t, fu.OKNamed("backup"))
		gateway(t, gateChannels, a.URL, b.URL, "stream_gate 200ms")
		s := streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("m", true), `"content":"Hello"`)
		okStream(t, s)
		servedBy(t, s, "a", "primary")
		if got := fu.StreamText(mustSSE(t, s.body)); got != "Hello from primary" {
			t.Fatalf("text %q:\n%s", got, s.body)
		}
		mustContain(t, s.body, "data: [DONE]")
		mustNotContain(t, s.body, "from-b", `"error"`)
		// The headers went out when the gate expired, not with the token.
		if s.headersAt > 1500*time.Millisecond {
			t.Errorf("headers after %s; the gate (200ms) should have committed them", s.headersAt)
		}
		if s.markerAt < 1900*time.Millisecond {
			t.Errorf("first content after %s, before the upstream sent it", s.markerAt)
		}
		hits(t, a, 1)
		hits(t, b, 0)
	})
	t.Run("failover", func(t *testing.T) {
		a := upstream(t, fu.SlowFirstToken(3*time.Second).Named("primary"))
		b := upstream(t, fu.OKNamed("backup"))
		gateway(t, gateChannels, a.URL, b.URL, "stream_gate 200ms failover")
		s := streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("m", true), "")
		cleanChatFromBackup(t, s)
		if s.endAt > 2*time.Second {
			t.Errorf("took %s: the primary was waited for past the gate", s.endAt)
		}
		hits(t, a, 1)
		hits(t, b, 1)
		eventually(t, 2*time.Second, "the abandoned primary request to be cancelled", func() bool { return a.InFlight() == 0 })
	})
}

// 7. A committed stream that is cut ends with an error event in the
// client's dialect, and nothing after it.
func TestStreamCutAfterCommit(t *testing.T) {
	t.Run("openai", func(t *testing.T) {
		a := upstream(t, fu.CutMidStream().Named("primary"))
		b := upstream(t, fu.OKNamed("backup"))
		gateway(t, gateChannels, a.URL, b.URL, "")
		s := streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("m", true), "")
		okStream(t, s)
		servedBy(t, s, "a", "primary")
		if got := fu.StreamText(mustSSE(t, s.body)); got != "Hello from" {
			t.Fatalf("text %q:\n%s", got, s.body)
		}
		fs := frames(s.body)
		last := fs[len(fs)-1]
		if !strings.HasPrefix(last, `data: {"error":`) || !strings.Contains(last, "stream_truncated") {
			t.Fatalf("last event is not the truncation error: %q\n%s", last, s.body)
		}
		mustNotContain(t, s.body, "[DONE]", "from-b")
		if n := count(s.body, `"error":`); n != 1 {
			t.Fatalf("%d error events, want 1", n)
		}
		hits(t, a, 1)
		hits(t, b, 0)
	})
	t.Run("anthropic", func(t *testing.T) {
		a := upstream(t, fu.CutMidStream().Named("primary"))
		b := upstream(t, fu.OKNamed("backup"))
		gateway(t, gateChannels, a.URL, b.URL, "")
		s := streamPost(t, nil, "/v1/messages", fu.MessagesRequest("claude", true), "", "anthropic-version", "2023-06-01")
		okStream(t, s)
		servedBy(t, s, "a", "primary")
		if got := fu.StreamText(mustSSE(t, s.body)); got != "Hello from" {
			t.Fatalf("text %q:\n%s", got, s.body)
		}
		fs := frames(s.body)
		last := fs[len(fs)-1]
		if !strings.HasPrefix(last, "event: error\ndata: ") || !strings.Contains(last, "stream_truncated") && !strings.Contains(last, "incomplete") {
			t.Fatalf("last event is not an Anthropic error: %q\n%s", last, s.body)
		}
		mustNotContain(t, s.body, "message_stop", "from-b")
		if n := count(s.body, "event: message_start"); n != 1 {
			t.Fatalf("%d message_start", n)
		}
		hits(t, a, 1)
		hits(t, b, 0)
	})
}

// 8. A committed stream that stalls is ended by stream_idle_timeout with
// an error event, and the upstream request is cancelled.
func TestStreamStallAfterCommit(t *testing.T) {
	a := upstream(t, fu.StallMidStream(10*time.Second).Named("primary"))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, gateChannels, a.URL, b.URL, "stream_idle_timeout 300ms")
	s := streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("m", true), "")
	okStream(t, s)
	if s.endAt > 5*time.Second {
		t.Fatalf("stream ended after %s; the idle timeout is 300ms", s.endAt)
	}
	if s.endAt < 250*time.Millisecond {
		t.Fatalf("stream ended after %s, before the idle timeout", s.endAt)
	}
	if got := fu.StreamText(mustSSE(t, s.body)); got != "Hello from" {
		t.Fatalf("text %q:\n%s", got, s.body)
	}
	fs := frames(s.body)
	last := fs[len(fs)-1]
	if !strings.HasPrefix(last, `data: {"error":`) || !strings.Contains(last, "stream_stalled") {
		t.Fatalf("last event is not the stall error: %q\n%s", last, s.body)
	}
	mustNotContain(t, s.body, "[DONE]", "from-b")
	eventually(t, 2*time.Second, "the stalled upstream request to be cancelled", func() bool { return a.InFlight() == 0 })
	hits(t, a, 1)
	hits(t, b, 0)
}

// 9. No [DONE], but a finish_reason and a clean close: the stream is whole
// and ends at once, without an appended error.
func TestStreamNoDoneCleanEnd(t *testing.T) {
	a := upstream(t, fu.NoDoneCleanEnd().Named("primary"))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, gateChannels, a.URL, b.URL, "")
	s := streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("m", true), "")
	okStream(t, s)
	servedBy(t, s, "a", "primary")
	if s.endAt > 2*time.Second {
		t.Fatalf("took %s", s.endAt)
	}
	mustContain(t, s.body, `"finish_reason":"stop"`)
	mustNotContain(t, s.body, "[DONE]", `"error"`, "stream_truncated")
	if got := fu.StreamText(mustSSE(t, s.body)); got != "Hello from primary" {
		t.Fatalf("text %q", got)
	}
	hits(t, b, 0)
}

// 10. A malformed chunk after commit is forwarded byte for byte.
func TestStreamMalformedChunkPassesThrough(t *testing.T) {
	a := upstream(t, fu.MalformedChunkAfterContent().Named("primary"))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, gateChannels, a.URL, b.URL, "")
	s := streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("m", true), "")
	okStream(t, s)
	servedBy(t, s, "a", "primary")
	mustContain(t, s.body, "\ndata: {not json\n\n")
	if got := fu.StreamText(mustSSE(t, s.body)); got != "Hello from primary" {
		t.Fatalf("text %q", got)
	}
	fs := frames(s.body)
	if fs[len(fs)-1] != "data: [DONE]" {
		t.Fatalf("stream does not end with [DONE]:\n%s", s.body)
	}
	mustNotContain(t, s.body, "stream_truncated", `"error"`)
	hits(t, b, 0)
}

// 11. Keep-alive comments are not decisive; they are held and delivered
// with the rest once content commits the stream.
func TestStreamKeepalivesBeforeContent(t *testing.T) {
	a := upstream(t, fu.Keepalive(3).Named("primary").WithEventDelay(50*time.Millisecond))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, gateChannels, a.URL, b.URL, "")
	s := streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("m", true), "")
	okStream(t, s)
	servedBy(t, s, "a", "primary")
	if !bytes.HasPrefix(s.body, []byte(": ping\n\n: ping\n\n: ping\n\ndata: {")) {
		t.Fatalf("the keep-alives are not delivered ahead of the stream:\n%s", s.body)
	}
	if got := fu.StreamText(mustSSE(t, s.body)); got != "Hello from primary" {
		t.Fatalf("text %q", got)
	}
	mustContain(t, s.body, "data: [DONE]")
	hits(t, b, 0)

	// Keep-alives ahead of an error frame do not commit either.
	a.Set(fu.ErrorFirstFrame().Named("primary").WithKeepalives(3).WithEventDelay(50 * time.Millisecond))
	s = streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("m", true), "")
	cleanChatFromBackup(t, s)
	mustNotContain(t, s.body, ": ping")
}

// 12. Non-streaming answers are read whole before commit: a 200 with an
// error body, or a truncated body, fails over.
func TestStreamNonStreamingBadBodiesFailOver(t *testing.T) {
	cases := map[string]struct {
		bad  fu.Behavior
		leak []string
	}{
		"200 with error body": {fu.JSONErrorWith200(), []string{"The server had an error", `"error"`}},
		"truncated body":      {fu.TruncatedJSON(), []string{"from-a", "primary"}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			a := upstream(t, c.bad)
			b := upstream(t, fu.OKNamed("backup"))
			gateway(t, gateChannels, a.URL, b.URL, "")
			res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
			if res.StatusCode != 200 {
				t.Fatalf("status %d: %s", res.StatusCode, body)
			}
			mustContain(t, body, "Hello from backup", `"model":"m"`)
			mustNotContain(t, body, "from-b")
			mustNotContain(t, body, c.leak...)
			if got := res.Header.Get("X-Served-By"); got != "b" {
				t.Errorf("X-Served-By = %q", got)
			}
			hits(t, a, 1)
			hits(t, b, 1)
			// A streaming request answered the same way fails over too.
			res, body = post(t, "/v1/chat/completions", fu.ChatRequest("m", true))
			if res.StatusCode != 200 {
				t.Fatalf("streaming: status %d: %s", res.StatusCode, body)
			}
			if got := fu.StreamText(mustSSE(t, body)); got != "Hello from backup" {
				t.Fatalf("streaming: text %q:\n%s", got, body)
			}
			mustNotContain(t, body, c.leak...)
		})
	}
}

// 13. Events reach the client as the upstream sends them, not at the end.
func TestStreamDeliveredIncrementally(t *testing.T) {
	a := upstream(t, fu.EventDelay(300*time.Millisecond).Named("primary"))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, gateChannels, a.URL, b.URL, "")
	s := streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("m", true), `"content":"Hello"`)
	okStream(t, s)
	servedBy(t, s, "a", "primary")
	if s.markerAt < 0 {
		t.Fatalf("no content:\n%s", s.body)
	}
	// 7 events, 300ms apart: the content pieces are events 2-4 (~300ms,
	// ~600ms, ~900ms), the end comes ~1.8s in. The first piece goes out
	// with the commit; the last one shows that events forwarded after the
	// commit are flushed as they come too.
	last := s.at(`"content":" primary"`)
	t.Logf("first content at %s, last content at %s, end at %s", s.markerAt, last, s.endAt)
	if s.markerAt > time.Second {
		t.Fatalf("first content only after %s", s.markerAt)
	}
	if gap := s.endAt - s.markerAt; gap < 500*time.Millisecond {
		t.Fatalf("first content at %s, end at %s: the stream was buffered", s.markerAt, s.endAt)
	}
	if last < 0 || s.endAt-last < 500*time.Millisecond || last-s.markerAt < 300*time.Millisecond {
		t.Fatalf("content pieces at %s and %s, end at %s: events after the commit were buffered", s.markerAt, last, s.endAt)
	}
	if got := fu.StreamText(mustSSE(t, s.body)); got != "Hello from primary" {
		t.Fatalf("text %q", got)
	}
	hits(t, b, 0)
}

// 14. A client that leaves mid-stream takes the upstream request with it,
// and no other channel is tried.
func TestStreamClientGoneCancelsUpstream(t *testing.T) {
	a := upstream(t, fu.StallMidStream(30*time.Second).Named("primary"))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, gateChannels, a.URL, b.URL, "")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gatewayURL+"/v1/chat/completions", bytes.NewReader(fu.ChatRequest("m", true)))
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	br := bufio.NewReader(res.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended before its content: %v", err)
		}
		if strings.Contains(line, `"content":" from"`) {
			break
		}
	}
	if a.InFlight() != 1 {
		t.Fatalf("upstream in flight = %d, want 1 while stalled", a.InFlight())
	}
	cancel()
	res.Body.Close()
	left := time.Now()
	eventually(t, 2*time.Second, "the upstream request to be cancelled", func() bool { return a.InFlight() == 0 })
	t.Logf("upstream released %s after the client left", time.Since(left))
	time.Sleep(100 * time.Millisecond)
	hits(t, a, 1)
	hits(t, b, 0)
}

// An error frame after commit is forwarded and ends the stream; the
// attempt must not be retried on another channel, whose answer would be
// glued onto the one the client already has.
func TestStreamErrorAfterCommitIsNotRetried(t *testing.T) {
	t.Run("after content", func(t *testing.T) {
		a := upstream(t, sseScript(roleFrame+"\n\n"+helloFrame+"\n\n", 50*time.Millisecond, errFrame+"\n\n"))
		b := upstream(t, fu.OKNamed("backup"))
		gateway(t, gateChannels, a.URL, b.URL, "")
		s := streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("m", true), "")
		okStream(t, s)
		if got := s.res.Header.Get("X-Served-By"); got != "a" {
			t.Errorf("X-Served-By = %q, want a", got)
		}
		fs := frames(s.body)
		if last := fs[len(fs)-1]; last != errFrame {
			t.Fatalf("the stream does not end with the upstream's error frame:\n%s", s.body)
		}
		mustNotContain(t, s.body, "backup", "from-b", "[DONE]", "stream_truncated")
		hits(t, a, 1)
		hits(t, b, 0)
	})
	t.Run("after gate expiry", func(t *testing.T) {
		// The role chunk comes at once, the error 600ms later; the gate
		// commits at 200ms, so the error reaches the client.
		a := upstream(t, sseScript(roleFrame+"\n\n", 600*time.Millisecond, "data: "+fu.OpenAIErrorBody("primary overloaded", "server_error", "")+"\n\n"))
		b := upstream(t, fu.OKNamed("backup"))
		gateway(t, gateChannels, a.URL, b.URL, "stream_gate 200ms")
		s := streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("m", true), "")
		okStream(t, s)
		if got := s.res.Header.Get("X-Served-By"); got != "a" {
			t.Errorf("X-Served-By = %q, want a", got)
		}
		fs := frames(s.body)
		if len(fs) != 2 || !strings.Contains(fs[0], `"role":"assistant"`) || !strings.HasPrefix(fs[1], `data: {"error":`) {
			t.Fatalf("want the primary's role chunk and its error frame, nothing else:\n%s", s.body)
		}
		mustNotContain(t, s.body, "backup", "from-b", "[DONE]")
		hits(t, a, 1)
		hits(t, b, 0)
	})
}

// Hand-written chat frames for sseScript.
const (
	roleFrame  = `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`
	helloFrame = `data: {"choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}`
	errFrame   = `data: {"error":{"message":"primary blew up mid-answer","type":"server_error","param":null,"code":"server_error"}}`
)

// sseScript answers 200 text/event-stream and plays steps: a string is
// written and flushed, a time.Duration is waited (or the client's
// departure). The body then ends cleanly.
func sseScript(steps ...any) fu.Behavior {
	return fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Fault-Upstream", "script")
		w.WriteHeader(200)
		rc := http.NewResponseController(w)
		_ = rc.Flush()
		for _, s := range steps {
			switch s := s.(type) {
			case string:
				if _, err := io.WriteString(w, s); err != nil || rc.Flush() != nil {
					return
				}
			case time.Duration:
				select {
				case <-time.After(s):
				case <-r.Context().Done():
					return
				}
			default:
				panic("sseScript: bad step")
			}
		}
	})
}

// A client that leaves while the stream is still held in the gate: the
// upstream request is cancelled and no other channel is tried for nobody.
func TestStreamClientGoneBeforeCommit(t *testing.T) {
	a := upstream(t, fu.SlowFirstToken(30*time.Second).Named("primary"))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, gateChannels, a.URL, b.URL, "")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gatewayURL+"/v1/chat/completions", bytes.NewReader(fu.ChatRequest("m", true)))
	req.Header.Set("Content-Type", "application/json")
	if res, err := http.DefaultClient.Do(req); err == nil {
		res.Body.Close()
		t.Fatalf("got a response (status %d) while the gate should still hold it", res.StatusCode)
	}
	eventually(t, 2*time.Second, "the upstream request to be cancelled", func() bool { return a.InFlight() == 0 && a.Hits() == 1 })
	time.Sleep(100 * time.Millisecond)
	hits(t, b, 0)
}
