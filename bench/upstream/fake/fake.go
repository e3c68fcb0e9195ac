// Package fake is the benchmarks' fake LLM provider (bench/upstream serves
// it on its own; bench/load -upstream serves it inside the load generator,
// so that the two share one Go runtime instead of two processes taking
// turns on one CPU).
//
// POST /v1/chat/completions answers a fixed chat.completion JSON (about
// 600 bytes), or, when the request body asks for "stream": true, a fixed
// OpenAI-style SSE stream of Chunks content chunks, a finish chunk and
// "data: [DONE]", flushed event by event. A stream whose request sets
// stream_options.include_usage also gets OpenAI's usage-only chunk before
// [DONE]: the gateway asks for it when it bills, and without it every
// billed stream would be charged from an estimate, with a warning.
//
// POST /fail/v1/chat/completions answers 503 with a small OpenAI-style
// error, as an overloaded provider does: the channel a failover benchmark
// fails over from. POST /reset/v1/chat/completions resets the connection
// (TCP RST) after reading the request, and POST
// /errorframe/v1/chat/completions answers 200 with an SSE stream whose
// first event is an error: the other kinds of failure a failover time is
// measured for. GET /stats prints how many requests are being answered.
//
// Every response is built once at start-up; a request costs one pooled
// body read and the writes. It is meant to cost far less CPU than the
// proxy under test.
package fake

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Config shapes the answers.
type Config struct {
	// Chunks is the number of content chunks per SSE stream (at least 1).
	Chunks int
	// RoleChunk sends a role-only chunk before the first content chunk,
	// as real providers do (the stream gate holds it until content).
	RoleChunk bool
	// EventDelay is slept before each SSE event.
	EventDelay time.Duration
	// FirstTokenDelay sends a stream's headers at once, then waits this
	// long before its first event: streams waiting for their first token.
	FirstTokenDelay time.Duration
}

const (
	created = "1767225600"
	model   = "m-2026-01-01"
)

// completionJSON is the non-streaming answer (padded to about 600 bytes
// with a realistic usage block and system fingerprint).
const completionJSON = `{"id":"chatcmpl-bench0000000000000000000000001","object":"chat.completion","created":` + created +
	`,"model":"` + model + `","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! This is a fixed answer from the benchmark upstream, as long as a short reply.","refusal":null},"logprobs":null,"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":12,"completion_tokens":38,"total_tokens":50,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},` +
	`"system_fingerprint":"fp_bench0001"}` + "\n"

// overloaded is the failing path's answer.
const overloaded = `{"error":{"message":"The server is overloaded, please try again later.","type":"server_error","param":null,"code":null}}` + "\n"

// errorFrame is the error-frame path's whole answer: a stream that fails
// in its first event, as OpenAI streams report an overload mid-request.
const errorFrame = `data: {"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}` + "\n\n"

var (
	streamKey  = []byte(`"stream"`)
	usageKeys  = [][]byte{[]byte(`"include_usage":true`), []byte(`"include_usage": true`)}
	bodyPool   = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}
	hdrJSON    = []string{"application/json"}
	hdrSSE     = []string{"text/event-stream; charset=utf-8"}
	hdrNoCache = []string{"no-cache"}
)

// Upstream is the fake provider.
type Upstream struct {
	cfg        Config
	completion []byte
	hdrLen     []string
	failLen    []string
	events     [][]byte // the SSE stream, one element per event
	withUsage  [][]byte // the same with the usage chunk before [DONE]
	inflight   atomic.Int64
	mux        *http.ServeMux
}

var _ http.Handler = (*Upstream)(nil)

// New builds the fake provider's answers once.
func New(cfg Config) (*Upstream, error) {
	if cfg.Chunks < 1 {
		return nil, fmt.Errorf("fake upstream: %d chunks: at least 1 is needed", cfg.Chunks)
	}
	u := &Upstream{
		cfg:        cfg,
		completion: []byte(completionJSON),
		hdrLen:     []string{strconv.Itoa(len(completionJSON))},
		failLen:    []string{strconv.Itoa(len(overloaded))},
		events:     buildEvents(cfg.Chunks, cfg.RoleChunk, false),
		withUsage:  buildEvents(cfg.Chunks, cfg.RoleChunk, true),
		mux:        http.NewServeMux(),
	}
	u.mux.HandleFunc("/v1/chat/completions", u.answer)
	u.mux.HandleFunc("/fail/v1/chat/completions", u.fail)
	u.mux.HandleFunc("/reset/v1/chat/completions", reset)
	u.mux.HandleFunc("/errorframe/v1/chat/completions", failFrame)
	u.mux.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintf(w, "%d\n", u.inflight.Load()) })
	return u, nil
}

// Events is the number of SSE events a stream sends.
func (u *Upstream) Events() int { return len(u.events) }

// CompletionLen is the size of the JSON answer.
func (u *Upstream) CompletionLen() int { return len(u.completion) }

// ServeHTTP answers one request.
func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) { u.mux.ServeHTTP(w, r) }

func buildEvents(n int, roleChunk, usage bool) [][]byte {
	prefix := `data: {"id":"chatcmpl-bench0000000000000000000000001","object":"chat.completion.chunk","created":` + created +
		`,"model":"` + model + `","system_fingerprint":"fp_bench0001","choices":[{"index":0,`
	var out [][]byte
	if roleChunk {
		// What real providers send first: a role-only chunk, which the
		// stream gate holds (it is not yet decisive).
		out = append(out, []byte(prefix+`"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}]}`+"\n\n"))
	}
	for i := 0; i < n; i++ {
		delta := fmt.Sprintf(`"delta":{"content":" token%d"}`, i)
		if i == 0 && !roleChunk {
			delta = `"delta":{"role":"assistant","content":"Hello"}`
		}
		out = append(out, []byte(prefix+delta+`,"logprobs":null,"finish_reason":null}]}`+"\n\n"))
	}
	out = append(out, []byte(prefix+`"delta":{},"logprobs":null,"finish_reason":"stop"}]}`+"\n\n"))
	if usage {
		// What OpenAI sends for include_usage: no choices, the usage of
		// the whole answer.
		out = append(out, []byte(`data: {"id":"chatcmpl-bench0000000000000000000000001","object":"chat.completion.chunk","created":`+created+
			`,"model":"`+model+`","system_fingerprint":"fp_bench0001","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":`+strconv.Itoa(n)+
			`,"total_tokens":`+strconv.Itoa(12+n)+`,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}`+"\n\n"))
	}
	out = append(out, []byte("data: [DONE]\n\n"))
	return out
}

// wantsStream reports whether a JSON body sets "stream" to true. It looks
// for the key and then, past blanks and the colon, for the literal true;
// good enough for the bodies the benchmark sends.
func wantsStream(body []byte) bool {
	for {
		i := bytes.Index(body, streamKey)
		if i < 0 {
			return false
		}
		body = body[i+len(streamKey):]
		j := 0
		for j < len(body) && (body[j] == ' ' || body[j] == '\t' || body[j] == '\r' || body[j] == '\n' || body[j] == ':') {
			j++
		}
		if bytes.HasPrefix(body[j:], []byte("true")) {
			return true
		}
	}
}

// wantsUsage reports whether a body sets stream_options.include_usage,
// written as the gateway and the SDKs write it.
func wantsUsage(body []byte) bool {
	for _, k := range usageKeys {
		if bytes.Contains(body, k) {
			return true
		}
	}
	return false
}

func (u *Upstream) answer(w http.ResponseWriter, r *http.Request) {
	u.inflight.Add(1)
	defer u.inflight.Add(-1)
	if r.Method != http.MethodPost {
		w.Header()["Allow"] = []string{"POST"}
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	bp := bodyPool.Get().(*[]byte)
	buf := bytes.NewBuffer((*bp)[:0])
	_, err := buf.ReadFrom(io.LimitReader(r.Body, 1<<20))
	stream := err == nil && wantsStream(buf.Bytes())
	events := u.events
	if stream && wantsUsage(buf.Bytes()) {
		events = u.withUsage
	}
	*bp = buf.Bytes()[:0]
	bodyPool.Put(bp)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	h := w.Header()
	if !stream {
		h["Content-Type"] = hdrJSON
		h["Content-Length"] = u.hdrLen
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(u.completion)
		return
	}
	h["Content-Type"] = hdrSSE
	h["Cache-Control"] = hdrNoCache
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	if u.cfg.FirstTokenDelay > 0 {
		if f != nil {
			f.Flush()
		}
		select {
		case <-time.After(u.cfg.FirstTokenDelay):
		case <-r.Context().Done():
			return
		}
	}
	for _, ev := range events {
		if u.cfg.EventDelay > 0 {
			time.Sleep(u.cfg.EventDelay)
		}
		if _, err := w.Write(ev); err != nil {
			return
		}
		if f != nil {
			f.Flush()
		}
	}
}

// fail answers 503, after reading the body as a real upstream would.
func (u *Upstream) fail(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
	h := w.Header()
	h["Content-Type"] = hdrJSON
	h["Content-Length"] = u.failLen
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = io.WriteString(w, overloaded)
}

// failFrame answers 200 with an SSE stream whose first event is an error.
func failFrame(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
	h := w.Header()
	h["Content-Type"] = hdrSSE
	h["Cache-Control"] = hdrNoCache
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, errorFrame)
}

// reset reads the request, then resets the connection: no answer at all.
func reset(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // close sends RST, not FIN
	}
	_ = conn.Close()
}

// Serve answers on ln until it fails, over HTTP/1.1 and over HTTP/2
// without TLS (h2c, prior knowledge): hosted providers answer over HTTP/2,
// and bench/scale.sh measures a channel that talks to its upstream that way.
func (u *Upstream) Serve(ln net.Listener) error {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0), Protocols: &protocols}
	return srv.Serve(ln)
}
