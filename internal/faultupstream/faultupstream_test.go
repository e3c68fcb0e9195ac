package faultupstream

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// start runs a Server for one test with a client of its own, so idle
// keep-alive connections never leak from one test into another.
func start(t *testing.T, b Behavior) (*Server, *http.Client) {
	t.Helper()
	s := New(b)
	tr := &http.Transport{}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		s.Close()
	})
	return s, &http.Client{Transport: tr}
}

func post(t *testing.T, c *http.Client, url string, body []byte) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return c.Do(req)
}

func mustPost(t *testing.T, c *http.Client, url string, body []byte) *http.Response {
	t.Helper()
	resp, err := post(t, c, url, body)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func decode(t *testing.T, resp *http.Response) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// dig walks decoded JSON by keys and indexes, failing on a wrong shape.
func dig(t *testing.T, v any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("at %q: not an object: %v", k, v)
			}
			v = m[k]
		case int:
			a, ok := v.([]any)
			if !ok || k >= len(a) {
				t.Fatalf("at [%d]: not an array long enough: %v", k, v)
			}
			v = a[k]
		}
	}
	return v
}

func unmarshal(t *testing.T, s string) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("bad JSON %q: %v", s, err)
	}
	return v
}

func names(evs []Event) string {
	var ns []string
	for _, e := range evs {
		ns = append(ns, e.Name)
	}
	return strings.Join(ns, ",")
}

func readEvents(t *testing.T, resp *http.Response) []Event {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("Content-Type %q", ct)
	}
	evs, err := ReadSSE(resp.Body)
	if err != nil {
		t.Fatalf("reading stream: %v (after %d events)", err, len(evs))
	}
	return evs
}

func waitIdle(t *testing.T, s *Server) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for s.InFlight() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d handlers still running", s.InFlight())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestChatJSON(t *testing.T) {
	s, c := start(t, OKNamed("backup"))
	resp := mustPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("gpt-x", false))
	if resp.StatusCode != 200 || resp.Header.Get("X-Fault-Upstream") != "backup" {
		t.Fatalf("status %d, X-Fault-Upstream %q", resp.StatusCode, resp.Header.Get("X-Fault-Upstream"))
	}
	v := decode(t, resp)
	if dig(t, v, "object") != "chat.completion" || dig(t, v, "model") != "gpt-x" {
		t.Fatalf("bad answer %v", v)
	}
	if got := dig(t, v, "choices", 0, "message", "content"); got != "Hello from backup" {
		t.Fatalf("content %q", got)
	}
	if dig(t, v, "choices", 0, "finish_reason") != "stop" {
		t.Fatal("finish_reason")
	}
	if dig(t, v, "usage", "prompt_tokens") != 11.0 || dig(t, v, "usage", "completion_tokens") != 7.0 || dig(t, v, "usage", "total_tokens") != 18.0 {
		t.Fatalf("usage %v", v["usage"])
	}
}

func TestChatStream(t *testing.T) {
	s, c := start(t, OKNamed("backup").WithUsage(3, 4))
	evs := readEvents(t, mustPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("gpt-x", true)))
	// role, 3 pieces, finish, usage, [DONE]
	if len(evs) != 7 {
		t.Fatalf("%d events: %v", len(evs), evs)
	}
	first := unmarshal(t, evs[0].Data)
	if dig(t, first, "choices", 0, "delta", "role") != "assistant" || dig(t, first, "choices", 0, "delta", "content") != "" {
		t.Fatalf("first chunk %v", first)
	}
	if StreamText(evs) != "Hello from backup" {
		t.Fatalf("text %q", StreamText(evs))
	}
	for _, e := range evs[:5] {
		m := unmarshal(t, e.Data)
		if u, ok := m["usage"]; !ok || u != nil {
			t.Fatalf("chunk without usage:null: %s", e.Data)
		}
		if m["model"] != "gpt-x" || m["object"] != "chat.completion.chunk" {
			t.Fatalf("chunk %s", e.Data)
		}
	}
	if dig(t, unmarshal(t, evs[4].Data), "choices", 0, "finish_reason") != "stop" {
		t.Fatalf("finish chunk %s", evs[4].Data)
	}
	u := unmarshal(t, evs[5].Data)
	if len(dig(t, u, "choices").([]any)) != 0 || dig(t, u, "usage", "prompt_tokens") != 3.0 || dig(t, u, "usage", "completion_tokens") != 4.0 {
		t.Fatalf("usage chunk %s", evs[5].Data)
	}
	if evs[6].Data != "[DONE]" {
		t.Fatalf("last %q", evs[6].Data)
	}
}

func TestChatStreamWithoutUsage(t *testing.T) {
	s, c := start(t, OK())
	evs := readEvents(t, mustPost(t, c, s.URL+"/chat/completions", []byte(`{"model":"m","stream":true}`)))
	if len(evs) != 6 || evs[5].Data != "[DONE]" || strings.Contains(evs[4].Data, "usage") {
		t.Fatalf("events %v", evs)
	}
	if StreamText(evs) != "Hello from "+DefaultName {
		t.Fatal(StreamText(evs))
	}
}

func TestResponses(t *testing.T) {
	s, c := start(t, OKNamed("backup"))
	v := decode(t, mustPost(t, c, s.URL+"/v1/responses", ResponsesRequest("gpt-r", false)))
	if v["object"] != "response" || v["status"] != "completed" || v["model"] != "gpt-r" {
		t.Fatalf("%v", v)
	}
	if dig(t, v, "output", 0, "content", 0, "text") != "Hello from backup" || dig(t, v, "usage", "input_tokens") != 11.0 || dig(t, v, "usage", "output_tokens") != 7.0 {
		t.Fatalf("%v", v)
	}

	evs := readEvents(t, mustPost(t, c, s.URL+"/v1/responses", ResponsesRequest("gpt-r", true)))
	want := "response.created,response.in_progress,response.output_item.added,response.content_part.added," +
		"response.output_text.delta,response.output_text.delta,response.output_text.delta," +
		"response.output_text.done,response.content_part.done,response.output_item.done,response.completed"
	if names(evs) != want {
		t.Fatalf("events %s", names(evs))
	}
	for i, e := range evs {
		m := unmarshal(t, e.Data)
		if m["type"] != e.Name || m["sequence_number"] != float64(i) {
			t.Fatalf("event %d: %s", i, e.Data)
		}
	}
	if StreamText(evs) != "Hello from backup" {
		t.Fatal(StreamText(evs))
	}
	done := unmarshal(t, evs[len(evs)-1].Data)
	if dig(t, done, "response", "status") != "completed" || dig(t, done, "response", "usage", "total_tokens") != 18.0 {
		t.Fatalf("completed %v", done)
	}
}

func TestEmbeddings(t *testing.T) {
	s, c := start(t, OK())
	v := decode(t, mustPost(t, c, s.URL+"/v1/embeddings", EmbeddingsRequest("emb", "a", "b", "c")))
	data := dig(t, v, "data").([]any)
	if len(data) != 3 || v["model"] != "emb" || dig(t, v, "usage", "prompt_tokens") != 11.0 {
		t.Fatalf("%v", v)
	}
	if n := len(dig(t, data[2], "embedding").([]any)); n != DefaultDimensions || dig(t, data[2], "index") != 2.0 {
		t.Fatalf("vector %v", data[2])
	}

	v = decode(t, mustPost(t, c, s.URL+"/v1/embeddings", []byte(`{"model":"emb","input":[[1,2,3]],"dimensions":4,"encoding_format":"base64"}`)))
	data = dig(t, v, "data").([]any)
	raw, err := base64.StdEncoding.DecodeString(dig(t, data[0], "embedding").(string))
	if len(data) != 1 || err != nil || len(raw) != 16 {
		t.Fatalf("base64 embedding: %v %v", v, err)
	}
	v = decode(t, mustPost(t, c, s.URL+"/v1/embeddings", []byte(`{"model":"emb","input":[1,2,3]}`)))
	if len(dig(t, v, "data").([]any)) != 1 {
		t.Fatal("one token array is one input")
	}
}

func TestMessages(t *testing.T) {
	s, c := start(t, OKNamed("backup").WithUsage(20, 5))
	resp := mustPost(t, c, s.URL+"/v1/messages", MessagesRequest("claude-x", false))
	v := decode(t, resp)
	if v["type"] != "message" || v["model"] != "claude-x" || dig(t, v, "content", 0, "text") != "Hello from backup" ||
		v["stop_reason"] != "end_turn" || dig(t, v, "usage", "input_tokens") != 20.0 || dig(t, v, "usage", "output_tokens") != 5.0 {
		t.Fatalf("%v", v)
	}
	if resp.Header.Get("request-id") == "" {
		t.Fatal("no request-id")
	}

	evs := readEvents(t, mustPost(t, c, s.URL+"/v1/messages", MessagesRequest("claude-x", true)))
	want := "message_start,ping,content_block_start,content_block_delta,content_block_delta,content_block_delta,content_block_stop,message_delta,message_stop"
	if names(evs) != want {
		t.Fatalf("events %s", names(evs))
	}
	for _, e := range evs {
		if unmarshal(t, e.Data)["type"] != e.Name {
			t.Fatalf("type mismatch %s", e.Data)
		}
	}
	start := unmarshal(t, evs[0].Data)
	if dig(t, start, "message", "usage", "input_tokens") != 20.0 || dig(t, start, "message", "model") != "claude-x" {
		t.Fatalf("message_start %v", start)
	}
	delta := unmarshal(t, evs[7].Data)
	if dig(t, delta, "delta", "stop_reason") != "end_turn" || dig(t, delta, "usage", "output_tokens") != 5.0 {
		t.Fatalf("message_delta %v", delta)
	}
	if StreamText(evs) != "Hello from backup" {
		t.Fatal(StreamText(evs))
	}
}

func TestModelsAndUnknownPath(t *testing.T) {
	s, c := start(t, OK().WithModels("a", "b"))
	resp, err := c.Get(s.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	v := decode(t, resp)
	resp.Body.Close()
	if v["object"] != "list" || dig(t, v, "data", 1, "id") != "b" || dig(t, v, "data", 0, "object") != "model" {
		t.Fatalf("%v", v)
	}

	req, _ := http.NewRequest(http.MethodGet, s.URL+"/v1/models", nil)
	req.Header.Set("anthropic-version", "2023-06-01")
	resp, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	v = decode(t, resp)
	resp.Body.Close()
	if v["has_more"] != false || dig(t, v, "data", 0, "type") != "model" || v["last_id"] != "b" {
		t.Fatalf("anthropic list %v", v)
	}

	resp = mustPost(t, c, s.URL+"/v1/nope", nil)
	v = decode(t, resp)
	if resp.StatusCode != 404 || dig(t, v, "error", "code") != "unknown_url" {
		t.Fatalf("%d %v", resp.StatusCode, v)
	}
}

func TestStatus(t *testing.T) {
	s, c := start(t, Status(503, "").After(150*time.Millisecond))
	t0 := time.Now()
	resp := mustPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", false))
	if el := time.Since(t0); el < 150*time.Millisecond {
		t.Fatalf("answered after %v", el)
	}
	v := decode(t, resp)
	if resp.StatusCode != 503 || dig(t, v, "error", "type") != "server_error" || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("%d %v", resp.StatusCode, v)
	}

	s.Set(Status(429, "").WithHeader("Retry-After", "30"))
	resp = mustPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", false))
	v = decode(t, resp)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "30" || dig(t, v, "error", "code") != "rate_limit_exceeded" {
		t.Fatalf("%d %v %v", resp.StatusCode, resp.Header, v)
	}

	s.Set(Status(529, ""))
	resp = mustPost(t, c, s.URL+"/v1/messages", MessagesRequest("c", false))
	v = decode(t, resp)
	if resp.StatusCode != 529 || v["type"] != "error" || dig(t, v, "error", "type") != "overloaded_error" {
		t.Fatalf("%d %v", resp.StatusCode, v)
	}

	body := `{"error":{"message":"bad thing","type":"invalid_request_error","code":"bad"}}`
	s.Set(Status(400, body))
	resp = mustPost(t, c, s.URL+"/v1/chat/completions", nil)
	got, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 400 || string(got) != body {
		t.Fatalf("%d %s", resp.StatusCode, got)
	}

	s.Set(Status(502, "Bad Gateway\n"))
	resp = mustPost(t, c, s.URL+"/v1/chat/completions", nil)
	if resp.StatusCode != 502 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("%d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}

func TestStatusDelayEndsWithClient(t *testing.T) {
	s, c := start(t, Status(503, "").After(time.Hour))
	c.Timeout = 100 * time.Millisecond
	if _, err := post(t, c, s.URL+"/v1/chat/completions", nil); err == nil {
		t.Fatal("expected timeout")
	}
	waitIdle(t, s)
}

func TestReset(t *testing.T) {
	s, c := start(t, Reset())
	_, err := post(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", false))
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("want connection reset, got %v", err)
	}
	if s.Hits() != 1 {
		t.Fatalf("hits %d", s.Hits())
	}
}

func TestCloseNoResponse(t *testing.T) {
	s, c := start(t, CloseNoResponse())
	_, err := post(t, c, s.URL+"/v1/chat/completions", nil)
	if !errors.Is(err, io.EOF) {
		t.Fatalf("want EOF, got %v", err)
	}
}

func TestNoHeaders(t *testing.T) {
	s, c := start(t, NoHeaders())
	c.Timeout = 200 * time.Millisecond
	t0 := time.Now()
	_, err := post(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", false))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("want timeout, got %v", err)
	}
	if el := time.Since(t0); el > 2*time.Second {
		t.Fatalf("took %v", el)
	}
	// The handler must notice the client left rather than hang forever.
	waitIdle(t, s)
	if s.Hits() != 1 {
		t.Fatalf("hits %d", s.Hits())
	}
}

func TestCloseEndsHangingHandlers(t *testing.T) {
	s := New(NoHeaders())
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	errc := make(chan error, 1)
	go func() {
		resp, err := (&http.Client{Transport: tr}).Post(s.URL+"/v1/messages", "application/json", nil)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	for s.InFlight() == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	t0 := time.Now()
	s.Close()
	if el := time.Since(t0); el > 3*time.Second || s.InFlight() != 0 {
		t.Fatalf("Close took %v with %d in flight", el, s.InFlight())
	}
	if err := <-errc; err == nil {
		t.Fatal("client got an answer from a closed server")
	}
	s.Close() // idempotent
}

func TestSlowHeaders(t *testing.T) {
	s, c := start(t, SlowHeaders(150*time.Millisecond, Status(418, "")))
	t0 := time.Now()
	resp := mustPost(t, c, s.URL+"/v1/chat/completions", nil)
	if el := time.Since(t0); el < 150*time.Millisecond || resp.StatusCode != 418 {
		t.Fatalf("%d after %v", resp.StatusCode, el)
	}
}

func TestErrorFirstFrame(t *testing.T) {
	s, c := start(t, ErrorFirstFrame())
	evs := readEvents(t, mustPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", true)))
	if len(evs) != 1 || dig(t, unmarshal(t, evs[0].Data), "error", "code") != "rate_limit_exceeded" {
		t.Fatalf("%v", evs)
	}
	resp := mustPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", false))
	if resp.StatusCode != 429 || dig(t, decode(t, resp), "error", "code") != "rate_limit_exceeded" {
		t.Fatalf("non-stream %d", resp.StatusCode)
	}
}

func TestErrorAfterPreamble(t *testing.T) {
	s, c := start(t, ErrorAfterRole())
	evs := readEvents(t, mustPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", true)))
	if len(evs) != 2 || dig(t, unmarshal(t, evs[0].Data), "choices", 0, "delta", "role") != "assistant" ||
		dig(t, unmarshal(t, evs[1].Data), "error", "code") != "rate_limit_exceeded" {
		t.Fatalf("%v", evs)
	}

	s.Set(AnthropicErrorAfterPreamble())
	evs = readEvents(t, mustPost(t, c, s.URL+"/v1/messages", MessagesRequest("c", true)))
	if names(evs) != "message_start,ping,error" {
		t.Fatalf("%s", names(evs))
	}
	e := unmarshal(t, evs[2].Data)
	if e["type"] != "error" || dig(t, e, "error", "type") != "overloaded_error" || dig(t, e, "error", "message") != "Overloaded" {
		t.Fatalf("%v", e)
	}
	resp := mustPost(t, c, s.URL+"/v1/messages", MessagesRequest("c", false))
	if resp.StatusCode != 529 || dig(t, decode(t, resp), "error", "type") != "overloaded_error" {
		t.Fatalf("non-stream %d", resp.StatusCode)
	}

	s.Set(ResponsesFailed())
	evs = readEvents(t, mustPost(t, c, s.URL+"/v1/responses", ResponsesRequest("r", true)))
	if names(evs) != "response.created,response.in_progress,response.failed" {
		t.Fatalf("%s", names(evs))
	}
	f := unmarshal(t, evs[2].Data)
	if dig(t, f, "response", "status") != "failed" || dig(t, f, "response", "error", "code") != "server_error" || f["sequence_number"] != 2.0 {
		t.Fatalf("%v", f)
	}
}

// timedPost sends body and notes when each event arrived, measured from
// before the request was sent: only such lower bounds stay true on a loaded
// machine, where the client may read several events in one late wake-up.
func timedPost(t *testing.T, c *http.Client, url string, body []byte) ([]Event, []time.Duration, error) {
	t.Helper()
	t0 := time.Now()
	resp := mustPost(t, c, url, body)
	var evs []Event
	var at []time.Duration
	err := ScanSSE(resp.Body, func(e Event) bool {
		evs, at = append(evs, e), append(at, time.Since(t0))
		return true
	})
	return evs, at, err
}

// holdAt reads a stream that must go silent after want events: it checks
// that they arrive and that nothing follows within quiet, then hangs up.
func holdAt(t *testing.T, s *Server, c *http.Client, url string, body []byte, want int, quiet time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var mu sync.Mutex
	seen := 0
	go func() {
		_ = ScanSSE(resp.Body, func(Event) bool { mu.Lock(); seen++; mu.Unlock(); return true })
	}()
	deadline := time.Now().Add(4 * time.Second)
	for {
		mu.Lock()
		n := seen
		mu.Unlock()
		if n >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(quiet)
	mu.Lock()
	n := seen
	mu.Unlock()
	if n != want {
		t.Fatalf("saw %d events before the silence, want %d", n, want)
	}
	// A client that gives up during the silence must free the handler.
	cancel()
	waitIdle(t, s)
}

func TestSlowFirstToken(t *testing.T) {
	s, c := start(t, SlowFirstToken(200*time.Millisecond))
	evs, at, err := timedPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", true))
	if err != nil || len(evs) != 7 {
		t.Fatalf("%v %v", evs, err)
	}
	if at[1] < 200*time.Millisecond {
		t.Fatalf("first content at %v", at[1])
	}
	s.Set(SlowFirstToken(time.Hour))
	holdAt(t, s, c, s.URL+"/v1/messages", MessagesRequest("c", true), 3, 150*time.Millisecond)
}

func TestStallMidStream(t *testing.T) {
	s, c := start(t, StallMidStream(250*time.Millisecond))
	evs, at, err := timedPost(t, c, s.URL+"/v1/messages", MessagesRequest("c", true))
	if err != nil || len(evs) != 9 {
		t.Fatalf("%s %v", names(evs), err)
	}
	if at[5] < 250*time.Millisecond {
		t.Fatalf("third delta at %v", at[5])
	}
	s.Set(StallMidStream(time.Hour))
	holdAt(t, s, c, s.URL+"/v1/chat/completions", ChatRequest("m", true), 3, 150*time.Millisecond)
}

func TestCutMidStream(t *testing.T) {
	s, c := start(t, CutMidStream())
	evs, err := ReadSSE(mustPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", true)).Body)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("want unexpected EOF, got %v", err)
	}
	if len(evs) != 3 || StreamText(evs) != "Hello from" {
		t.Fatalf("%v", evs)
	}

	evs, err = ReadSSE(mustPost(t, c, s.URL+"/v1/messages", MessagesRequest("c", true)).Body)
	if !errors.Is(err, io.ErrUnexpectedEOF) || names(evs) != "message_start,ping,content_block_start,content_block_delta,content_block_delta" {
		t.Fatalf("%s %v", names(evs), err)
	}

	resp := mustPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", false))
	if _, err := io.ReadAll(resp.Body); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("non-stream: %v", err)
	}
}

func TestNoDoneCleanEnd(t *testing.T) {
	s, c := start(t, NoDoneCleanEnd())
	evs := readEvents(t, mustPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", true)))
	last := unmarshal(t, evs[len(evs)-1].Data)
	if len(evs) != 6 || strings.Contains(evs[len(evs)-1].Data, "[DONE]") || last["usage"] == nil {
		t.Fatalf("%v", evs)
	}
	evs = readEvents(t, mustPost(t, c, s.URL+"/v1/messages", MessagesRequest("c", true)))
	if evs[len(evs)-1].Name != "message_delta" {
		t.Fatalf("%s", names(evs))
	}
}

func TestMalformedChunk(t *testing.T) {
	s, c := start(t, MalformedChunkAfterContent())
	evs := readEvents(t, mustPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", true)))
	if len(evs) != 8 || evs[2].Data != "{not json" || evs[7].Data != "[DONE]" || StreamText(evs) != "Hello from upstream" {
		t.Fatalf("%v", evs)
	}
	evs = readEvents(t, mustPost(t, c, s.URL+"/v1/messages", MessagesRequest("c", true)))
	if evs[4].Name != "content_block_delta" || evs[4].Data != "{not json" || evs[len(evs)-1].Name != "message_stop" {
		t.Fatalf("%v", evs)
	}
	// The fault is about streams; plain requests stay parseable.
	v := decode(t, mustPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", false)))
	if dig(t, v, "choices", 0, "message", "content") != "Hello from upstream" {
		t.Fatalf("%v", v)
	}
}

func TestEventDelay(t *testing.T) {
	s, c := start(t, EventDelay(40*time.Millisecond))
	_, at, err := timedPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", true))
	if err != nil || len(at) != 7 || at[6] < 6*40*time.Millisecond {
		t.Fatalf("%v %v", at, err)
	}
}

// A paused stream sends its first piece, then nothing until resumed.
func TestPauseAfter(t *testing.T) {
	resume := make(chan struct{})
	s, c := start(t, OK().WithPauseAfter(1, resume))
	body := mustPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", true)).Body
	var got []byte
	buf := make([]byte, 512)
	for !bytes.Contains(got, []byte(`"Hello"`)) {
		n, err := body.Read(buf)
		if got = append(got, buf[:n]...); err != nil {
			t.Fatalf("%q %v", got, err)
		}
	}
	read := make(chan []byte)
	go func() { rest, _ := io.ReadAll(body); read <- rest }()
	select {
	case rest := <-read:
		t.Fatalf("the stream went on before it was resumed: %q", rest)
	case <-time.After(100 * time.Millisecond):
	}
	close(resume)
	if rest := <-read; !bytes.Contains(rest, []byte(" from")) || !bytes.HasSuffix(rest, []byte("data: [DONE]\n\n")) {
		t.Fatalf("after resuming: %q", rest)
	}
}

func TestKeepalive(t *testing.T) {
	s, c := start(t, Keepalive(2))
	raw, err := io.ReadAll(mustPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", true)).Body)
	if err != nil || !bytes.HasPrefix(raw, []byte(": ping\n\n: ping\n\ndata: {")) {
		t.Fatalf("%q %v", raw, err)
	}
	evs, err := ReadSSE(bytes.NewReader(raw))
	if err != nil || len(evs) != 7 {
		t.Fatalf("comments leaked into events: %v", evs)
	}
}

func TestJSONErrorWith200(t *testing.T) {
	s, c := start(t, JSONErrorWith200())
	resp := mustPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", true))
	v := decode(t, resp)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || dig(t, v, "error", "type") != "server_error" {
		t.Fatalf("%d %v", resp.StatusCode, v)
	}
	v = decode(t, mustPost(t, c, s.URL+"/v1/messages", MessagesRequest("c", false)))
	if v["type"] != "error" || dig(t, v, "error", "type") != "api_error" {
		t.Fatalf("%v", v)
	}
}

func TestTruncatedJSON(t *testing.T) {
	s, c := start(t, TruncatedJSON())
	resp := mustPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", true))
	got, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !errors.Is(err, io.ErrUnexpectedEOF) || int64(len(got)) >= resp.ContentLength || json.Valid(got) {
		t.Fatalf("%d %d/%d %v", resp.StatusCode, len(got), resp.ContentLength, err)
	}
}

func statuses(t *testing.T, s *Server, c *http.Client, n int) []int {
	t.Helper()
	var out []int
	for i := 0; i < n; i++ {
		resp := mustPost(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", false))
		_, _ = io.Copy(io.Discard, resp.Body)
		out = append(out, resp.StatusCode)
	}
	return out
}

func eq(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestComposition(t *testing.T) {
	s, c := start(t, Sequence(Status(500, ""), Status(502, ""), OK()))
	if got := statuses(t, s, c, 4); !eq(got, []int{500, 502, 200, 200}) {
		t.Fatalf("Sequence %v", got)
	}
	s.Set(FailFirst(2, Status(503, ""), OK()))
	if got := statuses(t, s, c, 4); !eq(got, []int{503, 503, 200, 200}) {
		t.Fatalf("FailFirst %v", got)
	}
	s.Set(FailEvery(3, Status(503, ""), OK()))
	if got := statuses(t, s, c, 6); !eq(got, []int{200, 200, 503, 200, 200, 503}) {
		t.Fatalf("FailEvery %v", got)
	}
	s.Set(FailRatio(0.3, Status(503, ""), OK()))
	if got := statuses(t, s, c, 10); !eq(got, []int{200, 200, 200, 503, 200, 200, 503, 200, 200, 503}) {
		t.Fatalf("FailRatio %v", got)
	}
	s.Set(FailRatio(0.29, Status(503, ""), OK()))
	fails := 0
	for _, code := range statuses(t, s, c, 100) {
		if code == 503 {
			fails++
		}
	}
	if fails != 29 {
		t.Fatalf("FailRatio(0.29) failed %d of 100", fails)
	}
	// Nested composites count their own calls.
	s.Set(Sequence(Status(500, ""), FailFirst(1, Status(501, ""), SlowHeaders(time.Millisecond, Status(202, "")))))
	if got := statuses(t, s, c, 4); !eq(got, []int{500, 501, 202, 202}) {
		t.Fatalf("nested %v", got)
	}
	if s.Hits() != 128 {
		t.Fatalf("hits %d", s.Hits())
	}
	s.ResetHits()
	if s.Hits() != 0 {
		t.Fatal("ResetHits")
	}
}

func TestLastRequest(t *testing.T) {
	s, c := start(t, Reset())
	if s.LastRequest().Method != "" {
		t.Fatal("recorded before any request")
	}
	body := ChatRequest("gpt-x", true)
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/openai/v1/chat/completions?api-version=2024-10-21", bytes.NewReader(body))
	req.Host = "api.example.test"
	req.Header.Set("Authorization", "Bearer sk-up")
	req.Header.Set("X-Custom", "1")
	_, _ = c.Do(req) // reset: recording must not depend on answering
	r := s.LastRequest()
	if r.Method != "POST" || r.Path != "/openai/v1/chat/completions" || r.Query != "api-version=2024-10-21" ||
		r.Host != "api.example.test" || r.Header.Get("Authorization") != "Bearer sk-up" || r.Header.Get("X-Custom") != "1" ||
		!bytes.Equal(r.Body, body) {
		t.Fatalf("%+v", r)
	}
	r.Header.Set("X-Custom", "changed")
	r.Body[0] = 'X'
	if r2 := s.LastRequest(); r2.Header.Get("X-Custom") != "1" || r2.Body[0] != '{' {
		t.Fatal("LastRequest shares memory with the server")
	}
}

func TestConcurrentSetAndServe(t *testing.T) {
	s, c := start(t, OK())
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				stream := i%2 == 0
				resp, err := post(t, c, s.URL+"/v1/chat/completions", ChatRequest("m", stream))
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if g == 0 {
					s.Set(FailEvery(2, Status(503, ""), OKNamed("x")))
				}
				_ = s.LastRequest()
			}
		}(g)
	}
	wg.Wait()
	if s.Hits() != 160 {
		t.Fatalf("hits %d", s.Hits())
	}
}
