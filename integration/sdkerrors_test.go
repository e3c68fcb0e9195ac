package integration_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// The Anthropic SDK lists models with GET /v1/models and always sends
// anthropic-version; the gateway answers that list in Anthropic's format.
// Its refusals must be in Anthropic's format too: the SDK reads
// err.type and err.apiMessage from {"type":"error","error":{...}}, and an
// OpenAI-shaped body gives an AuthenticationError whose type is
// "invalid_request_error".
func TestAnthropicModelListRefusalIsAnthropicShaped(t *testing.T) {
	a := upstream(t, fu.OK())
	walletGateway(t, a, a)
	for _, tc := range []struct {
		method string
		hdr    []string
		status int
		typ    string
	}{
		{http.MethodGet, nil, 401, "authentication_error"},
		{http.MethodGet, []string{"X-Api-Key", "sk-wrong"}, 401, "authentication_error"},
	} {
		req, _ := http.NewRequest(tc.method, gatewayURL+"/v1/models", nil)
		req.Header.Set("Anthropic-Version", "2023-06-01")
		for i := 0; i+1 < len(tc.hdr); i += 2 {
			req.Header.Set(tc.hdr[i], tc.hdr[i+1])
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != tc.status {
			t.Fatalf("%s %v: status %d, want %d: %s", tc.method, tc.hdr, res.StatusCode, tc.status, body)
		}
		if !strings.HasPrefix(string(body), `{"type":"error"`) {
			t.Fatalf("%s %v with anthropic-version: body is not Anthropic-shaped: %s", tc.method, tc.hdr, body)
		}
		if _, typ := anthropicError(t, body); typ != tc.typ {
			t.Errorf("%s %v: error type %q, want %q", tc.method, tc.hdr, typ, tc.typ)
		}
	}
	hits(t, a, 0)
}

// A duplicate of a call whose answer was too large to keep gets 409
// idempotency_answer_not_kept: it is never run again under that key, so
// the official SDKs, which retry every 409 unless x-should-retry says
// otherwise, must be told not to (their retries would each get the same
// 409, after backoff).
func TestIdempotentUnkeptAnswerConflictIsNotRetriedBySDKs(t *testing.T) {
	a := upstream(t, fu.OKNamed("a").WithPieces(strings.Repeat("long answer ", 40)).WithUsage(10, 5))
	b := upstream(t, fu.OK())
	secret := idempotentGateway(t, a, b, "max_answer 200")
	body := fu.ChatRequest("m", false)
	if status, _, got := do(t, keyed(t, secret, "large", body)); status != 200 {
		t.Fatalf("%d %s", status, got)
	}
	status, hdr, got := do(t, keyed(t, secret, "large", body))
	if _, _, code := openAIError(t, got); status != 409 || code != "idempotency_answer_not_kept" {
		t.Fatalf("duplicate of a large answer: %d %s", status, got)
	}
	if v := hdr.Get("X-Should-Retry"); v != "false" {
		t.Errorf("409 idempotency_answer_not_kept: X-Should-Retry %q, want false (the SDKs retry a 409 otherwise)", v)
	}
}

// sdkEvents decodes an SSE body the way the official SDKs' SSEDecoder
// does (lines split at LF, CRLF or CR; an event dispatched at each blank
// line when it has an event name or data; a pending one flushed at EOF).
func sdkEvents(body string) []sdkEvent {
	var out []sdkEvent
	var ev sdkEvent
	var data []string
	has := false
	dispatch := func() {
		if ev.name == "" && len(data) == 0 {
			return
		}
		ev.data = strings.Join(data, "\n")
		out = append(out, ev)
		ev, data, has = sdkEvent{}, nil, false
	}
	body = strings.ReplaceAll(body, "\r\n", "\n")
	body = strings.ReplaceAll(body, "\r", "\n")
	for _, line := range strings.Split(body, "\n") {
		if line == "" {
			dispatch()
			continue
		}
		if strings.HasPrefix(line, ":") {
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "event":
			ev.name, has = value, true
		case "data":
			data, has = append(data, value), true
		}
	}
	if has {
		dispatch()
	}
	return out
}

type sdkEvent struct{ name, data string }

// sdkVerdict is what an official SDK's stream iterator does with events:
// "apierror" when it throws APIError (the gateway's or upstream's error
// event), "syntaxerror" when it throws on data that is not JSON before
// that, "end" when the iteration ends without an error.
func sdkVerdict(anthropic bool, evs []sdkEvent) string {
	for _, ev := range evs {
		if anthropic {
			// @anthropic-ai/sdk core/streaming.js
			switch {
			case ev.name == "ping" || ev.name == "":
				continue
			case ev.name == "error":
				return "apierror"
			case ev.data == "":
				continue
			}
			if !json.Valid([]byte(ev.data)) {
				return "syntaxerror"
			}
			continue
		}
		// openai core/streaming.js
		if ev.data == "[DONE]" {
			return "end"
		}
		if !json.Valid([]byte(ev.data)) {
			return "syntaxerror"
		}
		var v struct {
			Error json.RawMessage `json:"error"`
		}
		_ = json.Unmarshal([]byte(ev.data), &v)
		if ev.name == "error" || (len(v.Error) > 0 && string(v.Error) != "null") {
			return "apierror"
		}
	}
	return "end"
}

// An upstream that cuts its stream inside an event, after content: the
// gateway ends the stream with its error event ("truncated"), and the
// official SDKs must raise it as an APIError. A half event ended with a
// blank line is dispatched by their SSE decoders before the error event,
// and its data, not JSON, makes them throw a SyntaxError instead: the
// gateway's error is never seen.
func TestCutInsideAnEventReachesSDKsAsAPIError(t *testing.T) {
	for _, tc := range []struct {
		name, path string
		anthropic  bool
		whole      string
		half       string
		body       string
	}{
		{"openai chat", "/v1/chat/completions", false,
			"data: " + `{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}` + "\n\n",
			`data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"cont`,
			`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`},
		{"anthropic", "/v1/messages", true,
			"event: message_start\ndata: " + `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"usage":{"input_tokens":3,"output_tokens":1}}}` + "\n\n" +
				"event: content_block_start\ndata: " + `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` + "\n\n" +
				"event: content_block_delta\ndata: " + `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}` + "\n\n",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"del",
			`{"model":"m","stream":true,"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`},
		{"responses", "/v1/responses", false,
			"event: response.output_text.delta\ndata: " + `{"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi"}` + "\n\n",
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_te",
			`{"model":"m","stream":true,"input":"hi"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := upstream(t, fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, tc.whole)
				w.(http.Flusher).Flush()
				time.Sleep(50 * time.Millisecond)
				_, _ = io.WriteString(w, tc.half)
				w.(http.Flusher).Flush()
				time.Sleep(50 * time.Millisecond)
				panic(http.ErrAbortHandler) // the connection is cut mid-event
			}))
			gateway(t, oneChannel, a.URL, "")
			res, got := post(t, tc.path, []byte(tc.body), "anthropic-version", "2023-06-01")
			if res.StatusCode != 200 {
				t.Fatalf("status %d: %s", res.StatusCode, got)
			}
			if v := sdkVerdict(tc.anthropic, sdkEvents(string(got))); v != "apierror" {
				t.Fatalf("the SDK's stream ends with %s, want the gateway's error event as an APIError; body:\n%s", v, got)
			}
		})
	}
}

// An upstream that answers with a status outside HTTP's range (600-999)
// gave no answer: docs/errors.md says the client gets 502 when the last
// failure was "a bad answer", never the upstream's non-HTTP status.
func TestStatusOutsideHTTPRangeIsA502(t *testing.T) {
	a := upstream(t, fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(600)
		_, _ = io.WriteString(w, `{"error":{"message":"odd"}}`)
	}))
	gateway(t, oneChannel, a.URL, "")
	res, got := post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
	if res.StatusCode != http.StatusBadGateway {
		t.Errorf("status %d, want 502: %s", res.StatusCode, got)
	}
}

// An OpenAI-compatible host may answer an Anthropic path with an
// OpenAI-style error (provider.UpstreamMessage reads both): after
// content, `data: {"error":...}` without an event name. The gateway
// judges the stream ended by that error and appends nothing, but the
// Anthropic SDK skips every event without a name: its iteration ends as
// if the answer were whole. docs/errors.md: a broken stream ends "with an
// error event in the API's format".
func TestAnthropicStreamUnnamedUpstreamErrorReachesSDK(t *testing.T) {
	a := upstream(t, fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "event: message_start\ndata: "+`{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"usage":{"input_tokens":3,"output_tokens":1}}}`+"\n\n"+
			"event: content_block_start\ndata: "+`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`+"\n\n"+
			"event: content_block_delta\ndata: "+`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`+"\n\n")
		w.(http.Flusher).Flush()
		time.Sleep(50 * time.Millisecond)
		_, _ = io.WriteString(w, `data: {"error":{"message":"backend failed","type":"server_error","code":null}}`+"\n\n")
	}))
	gateway(t, oneChannel, a.URL, "")
	res, got := post(t, "/v1/messages", []byte(`{"model":"m","stream":true,"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`), "anthropic-version", "2023-06-01")
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, got)
	}
	if v := sdkVerdict(true, sdkEvents(string(got))); v != "apierror" {
		t.Fatalf("the Anthropic SDK's stream ends with %s, want an APIError; body:\n%s", v, got)
	}
}
