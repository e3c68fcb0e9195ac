package faultupstream

import (
	"bufio"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/backoff"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// Default usage numbers. They are fixed so tests can assert exact token
// accounting without parsing anything.
const (
	DefaultPromptTokens     = 11
	DefaultCompletionTokens = 7
)

// Created is the timestamp put in every answer; fixed so answers are
// byte-for-byte reproducible.
const Created = 1700000000

// DefaultName is the name OK() puts in its content.
const DefaultName = "upstream"

// protocol is the API family a request belongs to, picked from its path.
type protocol int

const (
	protoUnknown protocol = iota
	protoChat
	protoResponses
	protoEmbeddings
	protoMessages
	protoModels
)

// protocolOf recognises the API the way the gateway does, by path suffix,
// so that any prefix a provider adds still works.
func protocolOf(path string) protocol {
	switch provider.APIFromPath(path) {
	case provider.OpenAIChat:
		return protoChat
	case provider.OpenAIResponses:
		return protoResponses
	case provider.OpenAIEmbeddings:
		return protoEmbeddings
	case provider.AnthropicMessages:
		return protoMessages
	case provider.OpenAIModels:
		return protoModels
	}
	return protoUnknown
}

// request is the part of a request body the fake cares about. Bodies that
// are not JSON (GETs, garbage) simply leave it zero.
type request struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Input      json.RawMessage `json:"input"`
	Dimensions int             `json:"dimensions"`
	Encoding   string          `json:"encoding_format"`
}

func parseRequest(r *http.Request) (request, protocol) {
	var req request
	if r.Body != nil {
		_ = json.NewDecoder(r.Body).Decode(&req)
	}
	return req, protocolOf(r.URL.Path)
}

// isAnthropic tells the Anthropic flavour of /models apart from OpenAI's;
// the SDKs always send this header.
func isAnthropic(r *http.Request, p protocol) bool {
	return p == protoMessages || r.Header.Get("anthropic-version") != ""
}

// Answer is a well-formed reply for whichever API the request path names,
// optionally with one stream fault. It is a value: the With* methods return
// modified copies, so one Answer can be shared by many servers.
//
// Paths (matched by suffix, query ignored):
//   - /chat/completions: OpenAI chat completion, or SSE chunks when the body
//     has "stream":true (role chunk, one chunk per content piece, finish
//     chunk, a usage chunk with "choices":[] when
//     stream_options.include_usage is set, then "data: [DONE]").
//   - /responses: Responses API object, or its SSE event sequence ending in
//     response.completed.
//   - /embeddings: one small deterministic vector per input, honouring
//     "dimensions" and "encoding_format":"base64" (the OpenAI SDKs ask for
//     base64 by default).
//   - /messages: Anthropic message, or its SSE event sequence ending in
//     message_stop.
//   - /models: a model list, Anthropic-shaped when the request carries an
//     anthropic-version header.
//   - anything else: 404 with an OpenAI-style error body.
//
// Every answer echoes the request's "model", carries the Answer's name in its
// text ("Hello from <name>") and in the X-Fault-Upstream header, and reports
// the configured usage. /models and unknown paths ignore the stream faults.
type Answer struct {
	name             string
	pieces           []string
	promptTokens     int
	completionTokens int
	models           []string
	eventDelay       time.Duration
	keepalives       int

	// Stream faults. Each is described on the constructor that sets it.
	errAt        errPoint
	firstToken   time.Duration
	cutAfter     int
	stallAfter   int
	stallFor     time.Duration
	pauseAfter   int
	resume       <-chan struct{}
	noTerminal   bool
	malformedAt1 bool
}

type errPoint int

const (
	errNone errPoint = iota
	errFirstFrame
	errAfterPreamble
)

// OK answers normally, with name DefaultName.
func OK() Answer { return OKNamed(DefaultName) }

// OKNamed answers normally with "Hello from <name>" as the text, so a test
// can tell which upstream served a request that went through a gateway.
func OKNamed(name string) Answer {
	return Answer{
		name:             name,
		pieces:           []string{"Hello", " from", " " + name},
		promptTokens:     DefaultPromptTokens,
		completionTokens: DefaultCompletionTokens,
	}
}

// Named returns a copy with another name (and the matching text pieces).
func (a Answer) Named(name string) Answer {
	a.name = name
	a.pieces = []string{"Hello", " from", " " + name}
	return a
}

// WithPieces replaces the streamed content pieces; the non-streaming text is
// their concatenation. Useful for long streams in benchmarks.
func (a Answer) WithPieces(pieces ...string) Answer {
	a.pieces = append([]string(nil), pieces...)
	return a
}

// WithUsage sets the reported prompt (input) and completion (output) tokens.
func (a Answer) WithUsage(prompt, completion int) Answer {
	a.promptTokens, a.completionTokens = prompt, completion
	return a
}

// WithModels sets the ids /models lists; by default it lists "<name>-model".
func (a Answer) WithModels(ids ...string) Answer {
	a.models = append([]string(nil), ids...)
	return a
}

// WithEventDelay waits d between consecutive SSE events, for time-to-first-
// byte versus total-time tests.
func (a Answer) WithEventDelay(d time.Duration) Answer {
	a.eventDelay = d
	return a
}

// WithPauseAfter holds a stream after its n-th content event until resume
// is closed (or the request ends): a test can act while a stream is
// certainly under way, without sleeping.
func (a Answer) WithPauseAfter(n int, resume <-chan struct{}) Answer {
	a.pauseAfter, a.resume = n, resume
	return a
}

// WithKeepalives sends n SSE comment lines (": ping") before the first event,
// as proxies and some providers do; clients must ignore them.
func (a Answer) WithKeepalives(n int) Answer {
	a.keepalives = n
	return a
}

// Text is the full content text of the answer.
func (a Answer) Text() string { return strings.Join(a.pieces, "") }

// EventDelay is OK() with d between SSE events.
func EventDelay(d time.Duration) Answer { return OK().WithEventDelay(d) }

// Keepalive is OK() with n ": ping" comments before the first event.
func Keepalive(n int) Answer { return OK().WithKeepalives(n) }

// ErrorFirstFrame commits a 200 SSE stream whose very first event is the
// provider's error: for chat `data: {"error":{... rate_limit_exceeded ...}}`,
// for messages `event: error` overloaded_error, for responses
// response.failed. A non-streaming request gets the equivalent HTTP error
// instead (chat/other 429, messages 529, responses 500), which is what the
// providers do when they fail before answering.
func ErrorFirstFrame() Answer {
	a := OK()
	a.errAt = errFirstFrame
	return a
}

// ErrorAfterPreamble sends the stream's preamble (chat: role-only chunk;
// messages: message_start and ping; responses: response.created and
// response.in_progress) and then the provider's error event, with no
// content. Non-streaming requests are treated as by ErrorFirstFrame.
func ErrorAfterPreamble() Answer {
	a := OK()
	a.errAt = errAfterPreamble
	return a
}

// ErrorAfterRole is ErrorAfterPreamble named for chat completions: a
// role-only chunk, then a rate-limit error chunk.
func ErrorAfterRole() Answer { return ErrorAfterPreamble() }

// AnthropicErrorAfterPreamble is ErrorAfterPreamble named for messages:
// message_start, ping, then `event: error` with overloaded_error.
func AnthropicErrorAfterPreamble() Answer { return ErrorAfterPreamble() }

// ResponsesFailed is ErrorAfterPreamble named for the Responses API:
// response.created, response.in_progress, then response.failed.
func ResponsesFailed() Answer { return ErrorAfterPreamble() }

// SlowFirstToken sends the preamble at once, then waits d before the first
// content event. A non-streaming request waits d before its headers.
func SlowFirstToken(d time.Duration) Answer {
	a := OK()
	a.firstToken = d
	return a
}

// CutMidStream sends the preamble and two content events, then closes the
// TCP connection without finishing the chunked body or sending any terminal
// event. It closes with a FIN rather than a reset so the client reliably
// receives the content before it sees the truncation. A non-streaming request
// gets a truncated JSON body (see TruncatedJSON).
func CutMidStream() Answer {
	a := OK()
	a.cutAfter = 2
	return a
}

// StallMidStream sends two content events, then goes silent for d (or until
// the client leaves), then finishes normally. A non-streaming request gets
// headers and half its body, the stall, then the rest.
func StallMidStream(d time.Duration) Answer {
	a := OK()
	a.stallAfter, a.stallFor = 2, d
	return a
}

// NoDoneCleanEnd sends every event except the terminal one ([DONE],
// message_stop, response.completed) and ends the body cleanly, so only a
// client that checks for the terminal event notices. Non-streaming requests
// are answered normally.
func NoDoneCleanEnd() Answer {
	a := OK()
	a.noTerminal = true
	return a
}

// MalformedChunkAfterContent sends one content event, then an event whose
// data is "{not json", then the rest of the stream normally. Non-streaming
// requests are answered normally.
func MalformedChunkAfterContent() Answer {
	a := OK()
	a.malformedAt1 = true
	return a
}

// Serve implements Behavior.
func (a Answer) Serve(w http.ResponseWriter, r *http.Request, n int64) {
	req, p := parseRequest(r)
	w.Header().Set("X-Fault-Upstream", a.name)
	switch p {
	case protoUnknown:
		writeJSON(w, http.StatusNotFound, openAIError("Unknown request URL: "+r.Method+" "+r.URL.Path, "invalid_request_error", "unknown_url"))
		return
	case protoModels:
		writeJSON(w, http.StatusOK, a.modelList(isAnthropic(r, p)))
		return
	case protoEmbeddings:
		if a.errAt != errNone {
			a.errorStatus(w, p)
			return
		}
		a.serveBody(w, r, a.embeddings(req, n))
		return
	}
	if p == protoMessages {
		w.Header().Set("request-id", fmt.Sprintf("req_fault%d", n))
	} else {
		w.Header().Set("x-request-id", fmt.Sprintf("req_fault%d", n))
	}
	if !req.Stream {
		if a.errAt != errNone {
			a.errorStatus(w, p)
			return
		}
		body := a.jsonBody(req, p, n)
		if !backoff.Sleep(r.Context(), a.firstToken) {
			return
		}
		a.serveBody(w, r, body)
		return
	}
	var events []event
	switch p {
	case protoChat:
		events = a.chatEvents(req, n)
	case protoResponses:
		events = a.responsesEvents(req, n)
	case protoMessages:
		events = a.messagesEvents(req, n)
	}
	a.stream(w, r, p, req, n, events)
}

// jsonBody is the non-streaming answer for the three generation APIs.
func (a Answer) jsonBody(req request, p protocol, n int64) any {
	switch p {
	case protoChat:
		return a.chatJSON(req, n)
	case protoResponses:
		return a.responseObject(req, n, "completed")
	case protoMessages:
		return a.messageJSON(req, n)
	case protoEmbeddings:
		return a.embeddings(req, n)
	}
	return a.modelList(false)
}

// errorStatus is the non-streaming form of the in-stream error faults.
func (a Answer) errorStatus(w http.ResponseWriter, p protocol) {
	switch p {
	case protoMessages:
		writeJSON(w, 529, anthropicError("overloaded_error", "Overloaded"))
	case protoResponses:
		writeJSON(w, http.StatusInternalServerError, openAIError("The model failed to generate a response.", "server_error", "server_error"))
	default:
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusTooManyRequests, rateLimitError())
	}
}

// serveBody writes a JSON body, applying the faults that make sense without
// SSE: a cut truncates it, a stall pauses halfway.
func (a Answer) serveBody(w http.ResponseWriter, r *http.Request, body any) {
	b := mustJSON(body)
	switch {
	case a.cutAfter > 0:
		truncate(w, b)
	case a.stallAfter > 0:
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.WriteHeader(http.StatusOK)
		half := len(b) / 2
		_, _ = w.Write(b[:half])
		_ = http.NewResponseController(w).Flush()
		if !backoff.Sleep(r.Context(), a.stallFor) {
			return
		}
		_, _ = w.Write(b[half:])
	default:
		writeRaw(w, http.StatusOK, b)
	}
}

// event is one SSE event plus its role in the stream, which is what the
// fault knobs key on.
type event struct {
	name string // SSE "event:" field; empty for OpenAI chat
	data string
	kind eventKind
}

type eventKind int

const (
	kindPreamble eventKind = iota // before any structure: role chunk, message_start, ping, created
	kindFrame                     // structure around content: block start/stop, item added
	kindContent                   // carries content text
	kindFinish                    // finish_reason, message_delta, done events, usage chunk
	kindTerminal                  // [DONE], message_stop, response.completed
)

func (e event) bytes() []byte {
	var sb strings.Builder
	if e.name != "" {
		sb.WriteString("event: ")
		sb.WriteString(e.name)
		sb.WriteByte('\n')
	}
	sb.WriteString("data: ")
	sb.WriteString(e.data)
	sb.WriteString("\n\n")
	return []byte(sb.String())
}

// stream plays events to the client, flushing each one, with the Answer's
// delays and fault applied.
func (a Answer) stream(w http.ResponseWriter, r *http.Request, p protocol, req request, n int64, events []event) {
	ctx := r.Context()
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if rc.Flush() != nil {
		return
	}
	send := func(b []byte) bool {
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	for i := 0; i < a.keepalives; i++ {
		if !send([]byte(": ping\n\n")) || !backoff.Sleep(ctx, a.eventDelay) {
			return
		}
	}
	content := 0
	for i, ev := range events {
		if a.errAt == errFirstFrame && i == 0 || a.errAt == errAfterPreamble && ev.kind != kindPreamble {
			send(errorEvent(p, req, n, i).bytes())
			return
		}
		if a.noTerminal && ev.kind == kindTerminal {
			continue
		}
		if ev.kind == kindContent && content == 0 && !backoff.Sleep(ctx, a.firstToken) {
			return
		}
		if i > 0 && !backoff.Sleep(ctx, a.eventDelay) {
			return
		}
		if !send(ev.bytes()) {
			return
		}
		if ev.kind != kindContent {
			continue
		}
		content++
		if a.malformedAt1 && content == 1 {
			if !send(event{name: ev.name, data: "{not json"}.bytes()) {
				return
			}
		}
		if content == a.cutAfter {
			hangUp(w, false)
			return
		}
		if content == a.stallAfter && !backoff.Sleep(ctx, a.stallFor) {
			return
		}
		if content == a.pauseAfter && a.resume != nil {
			select {
			case <-a.resume:
			case <-ctx.Done():
				return
			}
		}
	}
}

// hangUp takes the connection away from net/http and closes it, so the
// client sees the response end without its terminating chunk. reset sends an
// RST instead of a FIN. Over HTTP/2, which cannot give a request's
// connection away, it resets the request's stream: the server answers
// the handler's http.ErrAbortHandler with RST_STREAM (INTERNAL_ERROR).
func hangUp(w http.ResponseWriter, reset bool) {
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	closeConn(conn, buf, reset)
}

func closeConn(conn net.Conn, buf *bufio.ReadWriter, reset bool) {
	if buf != nil {
		_ = buf.Flush()
	}
	if tc, ok := conn.(*net.TCPConn); ok && reset {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

func errorEvent(p protocol, req request, n int64, seq int) event {
	switch p {
	case protoMessages:
		return event{name: "error", data: string(mustJSON(anthropicError("overloaded_error", "Overloaded")))}
	case protoResponses:
		resp := responseShell(req, n, "failed")
		resp["error"] = map[string]any{"code": "server_error", "message": "The model failed to generate a response."}
		return event{name: "response.failed", data: string(mustJSON(map[string]any{
			"type": "response.failed", "sequence_number": seq, "response": resp,
		}))}
	default:
		return event{data: string(mustJSON(rateLimitError()))}
	}
}

func rateLimitError() map[string]any {
	return openAIError("Rate limit reached for requests. Please try again in 1s.", "requests", "rate_limit_exceeded")
}

// ---- OpenAI chat completions ----

func (a Answer) chatUsage() map[string]any {
	return map[string]any{
		"prompt_tokens":     a.promptTokens,
		"completion_tokens": a.completionTokens,
		"total_tokens":      a.promptTokens + a.completionTokens,
	}
}

func (a Answer) chatJSON(req request, n int64) map[string]any {
	return map[string]any{
		"id":                 fmt.Sprintf("chatcmpl-fault%d", n),
		"object":             "chat.completion",
		"created":            Created,
		"model":              req.Model,
		"system_fingerprint": "fp_fault",
		"choices": []any{map[string]any{
			"index":         0,
			"message":       map[string]any{"role": "assistant", "content": a.Text(), "refusal": nil},
			"logprobs":      nil,
			"finish_reason": "stop",
		}},
		"usage": a.chatUsage(),
	}
}

func (a Answer) chatEvents(req request, n int64) []event {
	includeUsage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	chunk := func(delta map[string]any, finish any) string {
		c := map[string]any{
			"id":                 fmt.Sprintf("chatcmpl-fault%d", n),
			"object":             "chat.completion.chunk",
			"created":            Created,
			"model":              req.Model,
			"system_fingerprint": "fp_fault",
			"choices": []any{map[string]any{
				"index": 0, "delta": delta, "logprobs": nil, "finish_reason": finish,
			}},
		}
		// OpenAI puts "usage":null on every chunk once usage was requested.
		if includeUsage {
			c["usage"] = nil
		}
		return string(mustJSON(c))
	}
	evs := []event{{data: chunk(map[string]any{"role": "assistant", "content": "", "refusal": nil}, nil), kind: kindPreamble}}
	for _, p := range a.pieces {
		evs = append(evs, event{data: chunk(map[string]any{"content": p}, nil), kind: kindContent})
	}
	evs = append(evs, event{data: chunk(map[string]any{}, "stop"), kind: kindFinish})
	if includeUsage {
		evs = append(evs, event{data: string(mustJSON(map[string]any{
			"id":                 fmt.Sprintf("chatcmpl-fault%d", n),
			"object":             "chat.completion.chunk",
			"created":            Created,
			"model":              req.Model,
			"system_fingerprint": "fp_fault",
			"choices":            []any{},
			"usage":              a.chatUsage(),
		})), kind: kindFinish})
	}
	return append(evs, event{data: "[DONE]", kind: kindTerminal})
}

// ---- OpenAI Responses API ----

func responseShell(req request, n int64, status string) map[string]any {
	return map[string]any{
		"id":         fmt.Sprintf("resp_fault%d", n),
		"object":     "response",
		"created_at": Created,
		"status":     status,
		"model":      req.Model,
		"output":     []any{},
		"error":      nil,
		"usage":      nil,
	}
}

func (a Answer) outputMessage(n int64, status string, text *string) map[string]any {
	content := []any{}
	if text != nil {
		content = append(content, map[string]any{"type": "output_text", "text": *text, "annotations": []any{}})
	}
	return map[string]any{
		"id": fmt.Sprintf("msg_fault%d", n), "type": "message", "status": status,
		"role": "assistant", "content": content,
	}
}

func (a Answer) responseObject(req request, n int64, status string) map[string]any {
	resp := responseShell(req, n, status)
	text := a.Text()
	resp["output"] = []any{a.outputMessage(n, "completed", &text)}
	resp["usage"] = map[string]any{
		"input_tokens":          a.promptTokens,
		"input_tokens_details":  map[string]any{"cached_tokens": 0},
		"output_tokens":         a.completionTokens,
		"output_tokens_details": map[string]any{"reasoning_tokens": 0},
		"total_tokens":          a.promptTokens + a.completionTokens,
	}
	return resp
}

func (a Answer) responsesEvents(req request, n int64) []event {
	var evs []event
	add := func(kind eventKind, typ string, fields map[string]any) {
		fields["type"] = typ
		fields["sequence_number"] = len(evs)
		evs = append(evs, event{name: typ, data: string(mustJSON(fields)), kind: kind})
	}
	itemID := fmt.Sprintf("msg_fault%d", n)
	text := a.Text()
	part := func(t string) map[string]any {
		return map[string]any{"type": "output_text", "text": t, "annotations": []any{}}
	}
	add(kindPreamble, "response.created", map[string]any{"response": responseShell(req, n, "in_progress")})
	add(kindPreamble, "response.in_progress", map[string]any{"response": responseShell(req, n, "in_progress")})
	add(kindFrame, "response.output_item.added", map[string]any{"output_index": 0, "item": a.outputMessage(n, "in_progress", nil)})
	add(kindFrame, "response.content_part.added", map[string]any{"item_id": itemID, "output_index": 0, "content_index": 0, "part": part("")})
	for _, p := range a.pieces {
		add(kindContent, "response.output_text.delta", map[string]any{"item_id": itemID, "output_index": 0, "content_index": 0, "delta": p, "logprobs": []any{}})
	}
	add(kindFinish, "response.output_text.done", map[string]any{"item_id": itemID, "output_index": 0, "content_index": 0, "text": text, "logprobs": []any{}})
	add(kindFinish, "response.content_part.done", map[string]any{"item_id": itemID, "output_index": 0, "content_index": 0, "part": part(text)})
	add(kindFinish, "response.output_item.done", map[string]any{"output_index": 0, "item": a.outputMessage(n, "completed", &text)})
	add(kindTerminal, "response.completed", map[string]any{"response": a.responseObject(req, n, "completed")})
	return evs
}

// ---- Anthropic messages ----

func (a Answer) messageJSON(req request, n int64) map[string]any {
	return map[string]any{
		"id":            fmt.Sprintf("msg_fault%d", n),
		"type":          "message",
		"role":          "assistant",
		"model":         req.Model,
		"content":       []any{map[string]any{"type": "text", "text": a.Text()}},
		"stop_reason":   "end_turn",
		"stop_sequence": nil,
		"usage":         map[string]any{"input_tokens": a.promptTokens, "output_tokens": a.completionTokens},
	}
}

func (a Answer) messagesEvents(req request, n int64) []event {
	var evs []event
	add := func(kind eventKind, typ string, fields map[string]any) {
		fields["type"] = typ
		evs = append(evs, event{name: typ, data: string(mustJSON(fields)), kind: kind})
	}
	start := a.messageJSON(req, n)
	start["content"] = []any{}
	start["stop_reason"] = nil
	// Anthropic reports the input up front and a token-so-far output count.
	start["usage"] = map[string]any{"input_tokens": a.promptTokens, "output_tokens": 1}
	add(kindPreamble, "message_start", map[string]any{"message": start})
	add(kindPreamble, "ping", map[string]any{})
	add(kindFrame, "content_block_start", map[string]any{"index": 0, "content_block": map[string]any{"type": "text", "text": ""}})
	for _, p := range a.pieces {
		add(kindContent, "content_block_delta", map[string]any{"index": 0, "delta": map[string]any{"type": "text_delta", "text": p}})
	}
	add(kindFrame, "content_block_stop", map[string]any{"index": 0})
	add(kindFinish, "message_delta", map[string]any{
		"delta": map[string]any{"stop_reason": "end_turn", "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": a.completionTokens},
	})
	add(kindTerminal, "message_stop", map[string]any{})
	return evs
}

// ---- OpenAI embeddings ----

// DefaultDimensions is the vector length when the request names none; small
// because nothing looks at the numbers.
const DefaultDimensions = 8

func (a Answer) embeddings(req request, n int64) map[string]any {
	dims := req.Dimensions
	if dims <= 0 {
		dims = DefaultDimensions
	}
	count := inputCount(req.Input)
	data := make([]any, 0, count)
	for i := 0; i < count; i++ {
		vec := make([]float32, dims)
		for j := range vec {
			vec[j] = float32((i+1)*(j+1)%97) / 97
		}
		var emb any = vec
		if req.Encoding == "base64" {
			raw := make([]byte, 4*dims)
			for j, v := range vec {
				binary.LittleEndian.PutUint32(raw[4*j:], math.Float32bits(v))
			}
			emb = base64.StdEncoding.EncodeToString(raw)
		}
		data = append(data, map[string]any{"object": "embedding", "index": i, "embedding": emb})
	}
	return map[string]any{
		"object": "list",
		"data":   data,
		"model":  req.Model,
		"usage":  map[string]any{"prompt_tokens": a.promptTokens, "total_tokens": a.promptTokens},
	}
}

// inputCount is how many embeddings an "input" asks for: a string or one
// token array is one; an array of strings or of token arrays is one each.
func inputCount(raw json.RawMessage) int {
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil || len(list) == 0 {
		return 1
	}
	switch strings.TrimSpace(string(list[0]))[0] {
	case '"', '[':
		return len(list)
	}
	return 1
}

// ---- models ----

func (a Answer) modelList(anthropic bool) map[string]any {
	ids := a.models
	if len(ids) == 0 {
		ids = []string{a.name + "-model"}
	}
	data := make([]any, 0, len(ids))
	for _, id := range ids {
		if anthropic {
			data = append(data, map[string]any{"type": "model", "id": id, "display_name": id, "created_at": "2023-11-14T22:13:20Z"})
		} else {
			data = append(data, map[string]any{"id": id, "object": "model", "created": Created, "owned_by": "faultupstream"})
		}
	}
	if anthropic {
		return map[string]any{"data": data, "has_more": false, "first_id": ids[0], "last_id": ids[len(ids)-1]}
	}
	return map[string]any{"object": "list", "data": data}
}

// ---- helpers ----

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("faultupstream: " + err.Error())
	}
	return b
}

func writeRaw(w http.ResponseWriter, code int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

func writeJSON(w http.ResponseWriter, code int, v any) { writeRaw(w, code, mustJSON(v)) }

// truncate promises len(b) bytes, sends half, and hangs up.
func truncate(w http.ResponseWriter, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b[:len(b)/2])
	_ = http.NewResponseController(w).Flush()
	hangUp(w, false)
}
