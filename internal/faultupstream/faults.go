package faultupstream

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/backoff"
)

// OpenAIErrorBody is an error body in OpenAI's shape:
// {"error":{"message":...,"type":...,"param":null,"code":...}}.
func OpenAIErrorBody(message, typ, code string) string {
	return string(mustJSON(openAIError(message, typ, code)))
}

// AnthropicErrorBody is an error body in Anthropic's shape:
// {"type":"error","error":{"type":...,"message":...}}.
func AnthropicErrorBody(typ, message string) string {
	return string(mustJSON(anthropicError(typ, message)))
}

func openAIError(message, typ, code string) map[string]any {
	var c any
	if code != "" {
		c = code
	}
	return map[string]any{"error": map[string]any{"message": message, "type": typ, "param": nil, "code": c}}
}

func anthropicError(typ, message string) map[string]any {
	return map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": message}}
}

// StatusAnswer answers with a fixed status and body. Build it with Status.
type StatusAnswer struct {
	code   int
	body   string
	delay  time.Duration
	header http.Header
}

// Status answers code with body. An empty body is replaced by a realistic
// error body for the request's API: Anthropic-shaped for /messages,
// OpenAI-shaped otherwise, with the error type the provider uses for that
// status. A body starting with '{' or '[' is sent as application/json,
// anything else as text/plain (what an HTML-less load balancer would send).
func Status(code int, body string) StatusAnswer { return StatusAnswer{code: code, body: body} }

// After waits d (or until the client leaves) before answering, e.g. a 503
// that takes as long as a real overloaded backend.
func (s StatusAnswer) After(d time.Duration) StatusAnswer {
	s.delay = d
	return s
}

// WithHeader adds a response header, e.g. WithHeader("Retry-After", "30").
func (s StatusAnswer) WithHeader(key, value string) StatusAnswer {
	s.header = s.header.Clone()
	if s.header == nil {
		s.header = http.Header{}
	}
	s.header.Add(key, value)
	return s
}

// Serve implements Behavior.
func (s StatusAnswer) Serve(w http.ResponseWriter, r *http.Request, _ int64) {
	if !backoff.Sleep(r.Context(), s.delay) {
		return
	}
	for k, vs := range s.header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	body := s.body
	if body == "" {
		body = defaultErrorBody(s.code, protocolOf(r.URL.Path))
	}
	ct := "text/plain; charset=utf-8"
	if t := strings.TrimSpace(body); strings.HasPrefix(t, "{") || strings.HasPrefix(t, "[") {
		ct = "application/json"
	}
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", ct)
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(s.code)
	_, _ = w.Write([]byte(body))
}

func defaultErrorBody(code int, p protocol) string {
	msg := http.StatusText(code)
	if msg == "" {
		msg = "status " + strconv.Itoa(code)
	}
	if p == protoMessages {
		typ := map[int]string{
			400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
			404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error",
		}[code]
		if typ == "" {
			typ = "api_error"
			if code < 500 {
				typ = "invalid_request_error"
			}
		}
		if code == 529 {
			msg = "Overloaded"
		}
		return AnthropicErrorBody(typ, msg)
	}
	typ, ecode := "invalid_request_error", ""
	switch {
	case code == 401:
		ecode = "invalid_api_key"
	case code == 429:
		typ, ecode = "requests", "rate_limit_exceeded"
	case code >= 500:
		typ = "server_error"
	}
	return OpenAIErrorBody(msg, typ, ecode)
}

// Reset reads the request and then resets the TCP connection (RST, via
// SO_LINGER 0) without sending a byte, like a crashing upstream or a
// firewall. Clients see "connection reset by peer".
func Reset() Behavior {
	return BehaviorFunc(func(w http.ResponseWriter, _ *http.Request, _ int64) { hangUp(w, true) })
}

// CloseNoResponse reads the request and closes the connection cleanly (FIN)
// without a response; Go clients report EOF, curl "empty reply".
func CloseNoResponse() Behavior {
	return BehaviorFunc(func(w http.ResponseWriter, _ *http.Request, _ int64) { hangUp(w, false) })
}

// NoHeaders reads the request and never answers. It returns, releasing the
// connection, once the client goes away or the Server closes.
func NoHeaders() Behavior {
	return BehaviorFunc(func(_ http.ResponseWriter, r *http.Request, _ int64) { <-r.Context().Done() })
}

// SlowHeaders waits d before handing the request to then; if the client
// leaves first, nothing is sent.
func SlowHeaders(d time.Duration, then Behavior) Behavior {
	return BehaviorFunc(func(w http.ResponseWriter, r *http.Request, n int64) {
		if backoff.Sleep(r.Context(), d) {
			then.Serve(w, r, n)
		}
	})
}

// JSONErrorWith200 answers 200 application/json with an error body (Anthropic-
// shaped on /messages, OpenAI-shaped elsewhere), even for streaming
// requests, as some OpenAI-compatible providers do. A gateway that trusts the
// status code will pass it off as success.
func JSONErrorWith200() Behavior {
	return BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		body := OpenAIErrorBody("The server had an error while processing your request.", "server_error", "server_error")
		if protocolOf(r.URL.Path) == protoMessages {
			body = AnthropicErrorBody("api_error", "Internal server error")
		}
		writeRaw(w, http.StatusOK, []byte(body))
	})
}

// TruncatedJSON answers 200 with the normal non-streaming JSON body for the
// request's API (even when it asked to stream), but sends only half of the
// Content-Length it announced before closing the connection.
func TruncatedJSON() Behavior {
	return BehaviorFunc(func(w http.ResponseWriter, r *http.Request, n int64) {
		req, p := parseRequest(r)
		truncate(w, mustJSON(OK().jsonBody(req, p, n)))
	})
}

// counter numbers the calls to one composite behaviour, independently of the
// server's hit count, so the behaviour means the same wherever it is used.
type counter struct{ n atomic.Int64 }

func (c *counter) next() int64 { return c.n.Add(1) }

// Sequence serves its k-th request with bs[k-1]; once past the end it keeps
// using the last one. Sequence() with no behaviours is OK().
func Sequence(bs ...Behavior) Behavior {
	if len(bs) == 0 {
		return OK()
	}
	bs = append([]Behavior(nil), bs...)
	c := &counter{}
	return BehaviorFunc(func(w http.ResponseWriter, r *http.Request, n int64) {
		k := int(min(c.next(), int64(len(bs))))
		bs[k-1].Serve(w, r, n)
	})
}

// FailFirst serves its first n requests with fail and the rest with ok.
func FailFirst(n int, fail, ok Behavior) Behavior {
	c := &counter{}
	return BehaviorFunc(func(w http.ResponseWriter, r *http.Request, hit int64) {
		if c.next() <= int64(n) {
			fail.Serve(w, r, hit)
			return
		}
		ok.Serve(w, r, hit)
	})
}

// FailEvery serves every k-th request (k, 2k, ...) with fail, the others
// with ok.
func FailEvery(k int, fail, ok Behavior) Behavior {
	if k <= 0 {
		return ok
	}
	c := &counter{}
	return BehaviorFunc(func(w http.ResponseWriter, r *http.Request, hit int64) {
		if c.next()%int64(k) == 0 {
			fail.Serve(w, r, hit)
			return
		}
		ok.Serve(w, r, hit)
	})
}

// FailRatio fails a fixed fraction of requests, spread evenly and
// deterministically: request k fails when floor(k*ratio) steps up, so any
// first N requests contain exactly floor(N*ratio) failures. Runs are
// reproducible, unlike random sampling, yet failures are interleaved.
// ratio is taken to six decimals and counted in integers, so 0.29 means
// 29 failures per 100 rather than whatever float rounding makes of it.
func FailRatio(ratio float64, fail, ok Behavior) Behavior {
	const scale = 1_000_000
	per := int64(math.Round(ratio * scale))
	c := &counter{}
	return BehaviorFunc(func(w http.ResponseWriter, r *http.Request, hit int64) {
		k := c.next()
		if k*per/scale > (k-1)*per/scale {
			fail.Serve(w, r, hit)
			return
		}
		ok.Serve(w, r, hit)
	})
}

// ---- request bodies for tests ----

func message(content string) []any {
	return []any{map[string]any{"role": "user", "content": content}}
}

// ChatRequest is a minimal chat completions body; streaming bodies ask for
// usage too, as gateways that bill usually do.
func ChatRequest(model string, stream bool) []byte {
	body := map[string]any{"model": model, "messages": message("Say hello.")}
	if stream {
		body["stream"] = true
		body["stream_options"] = map[string]any{"include_usage": true}
	}
	return mustJSON(body)
}

// ResponsesRequest is a minimal Responses API body.
func ResponsesRequest(model string, stream bool) []byte {
	body := map[string]any{"model": model, "input": "Say hello."}
	if stream {
		body["stream"] = true
	}
	return mustJSON(body)
}

// EmbeddingsRequest is an embeddings body with one input per string.
func EmbeddingsRequest(model string, inputs ...string) []byte {
	var in any = "hello"
	if len(inputs) == 1 {
		in = inputs[0]
	} else if len(inputs) > 1 {
		in = inputs
	}
	return mustJSON(map[string]any{"model": model, "input": in, "encoding_format": "float"})
}

// MessagesRequest is a minimal Anthropic messages body.
func MessagesRequest(model string, stream bool) []byte {
	body := map[string]any{"model": model, "max_tokens": 64, "messages": message("Say hello.")}
	if stream {
		body["stream"] = true
	}
	return mustJSON(body)
}
