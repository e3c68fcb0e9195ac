//go:build linux

package soak

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// Outcome classes of one request as its client saw it. Whether a class is
// expected depends on the request and on what was going on (see judge).
const (
	classOK           = "ok"                // 200, complete: JSON with content, or a stream that ended with its terminal event
	classErrorEvent   = "error_event"       // 200 stream that ended with an error event in its dialect
	classClientAbort  = "client_abort"      // the client hung up after the first content, on purpose
	classGatewayError = "gateway_error"     // 429 or 5xx in the API's error format: no channel could answer
	classStore503     = "store_unavailable" // 503 "billing is temporarily unavailable" (on_store_error deny)
	class401          = "refused_401"       // unknown key
	class402          = "refused_402"       // balance cannot cover the request
	classConnError    = "conn_error"        // no answer at all (refused, reset before headers)
	classTransportCut = "transport_cut"     // the body ended with a transport error (the connection died)
	classSilentCut    = "silent_cut"        // a 200 stream that ended cleanly with neither its terminal nor an error event
	classErrorThenEnd = "error_then_end"    // a stream with an error event that then ended as if complete
	classBadBody      = "bad_body"          // a 200 JSON answer that is no answer, or an error not in the API's format
	classOther4xx     = "other_4xx"         // any other client error: our requests are valid
	classHung         = "hung"              // no answer, or no end of it, within the client's timeout
)

// clientTimeout bounds a request on the client's side: far beyond what
// the gateway's own bounds allow (deadline 15s before an answer is
// committed, stream_idle_timeout 2s after), so a request that reaches it
// hung in the gateway.
const clientTimeout = 60 * time.Second

// record is what the client log keeps of one request.
type record struct {
	Seq      int       `json:"seq"`
	Inst     int       `json:"inst"`
	API      string    `json:"api"`
	Model    string    `json:"model"`
	Stream   bool      `json:"stream"`
	Acct     string    `json:"acct"`              // funded, poor, badkey, free
	Account  string    `json:"account,omitempty"` // the wallet account the key bills
	Slow     bool      `json:"slow,omitempty"`
	Abort    bool      `json:"abort,omitempty"`
	Sent     time.Time `json:"sent"`
	Done     time.Time `json:"done"`
	Status   int       `json:"status"`
	ReqID    string    `json:"request_id,omitempty"`
	ServedBy string    `json:"served_by,omitempty"`
	Class    string    `json:"class"`
	Detail   string    `json:"detail,omitempty"`
	Resumed  bool      `json:"resumed,omitempty"`
	Reused   bool      `json:"reused,omitempty"` // sent on a kept-alive connection
	Conn     string    `json:"conn,omitempty"`   // the connection's local address: which requests shared it
	Bytes    int       `json:"bytes"`
	// Set by the judge.
	Defect string `json:"defect,omitempty"`
	Why    string `json:"why,omitempty"` // why an outcome that is not ok was expected
}

func (r *record) billed() bool { return r.Acct != "free" }

// load is the clients: workers that each keep one request in flight, a
// slow reader, and the client log.
type load struct {
	gws     []*gateway
	keys    map[string][]wallKey // by account kind
	clients []*http.Client       // one pool per instance
	slow    *http.Client

	// paused holds new requests back while a resource sample waits for
	// the ones in flight (inflight) to end and measures.
	paused   atomic.Bool
	inflight atomic.Int64
	// mid counts, per instance, the billed streams that delivered content
	// and have not ended: the kill waits for some, so that it cuts streams
	// whose money the killed instance holds.
	mid  []atomic.Int64
	stop chan struct{}
	wg   sync.WaitGroup
	seq  atomic.Int64

	mu      sync.Mutex
	records []*record
	log     io.Writer // JSON lines, one per request
}

// wallKey is a wallet key and the account it bills.
type wallKey struct{ account, secret string }

func newLoad(gws []*gateway, keys map[string][]wallKey, log io.Writer) *load {
	l := &load{gws: gws, keys: keys, stop: make(chan struct{}), log: log, mid: make([]atomic.Int64, len(gws))}
	for range gws {
		l.clients = append(l.clients, &http.Client{Timeout: clientTimeout, Transport: &http.Transport{
			MaxIdleConnsPerHost: 32, IdleConnTimeout: 20 * time.Second, DisableCompression: true,
		}})
	}
	// The slow reader's receive buffer is small, so the gateway's writes
	// wait for it instead of filling the kernel's buffers at once.
	d := &net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		return errors.Join(err, serr)
	}}
	l.slow = &http.Client{Timeout: clientTimeout, Transport: &http.Transport{DialContext: d.DialContext, DisableCompression: true}}
	return l
}

// start runs workers request loops and one slow reader.
func (l *load) start(workers int, seed uint64) {
	for w := range workers {
		l.wg.Add(1)
		go l.worker(rand.New(rand.NewPCG(seed, uint64(w))), w)
	}
	l.wg.Add(1)
	go l.slowReader()
}

// finish stops every worker after its current request.
func (l *load) finish() {
	close(l.stop)
	l.wg.Wait()
	l.closeIdle()
}

func (l *load) closeIdle() {
	for _, c := range append(l.clients, l.slow) {
		c.CloseIdleConnections()
	}
}

func (l *load) stopped() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

// quiesce holds new requests back and waits until none is in flight, at
// most d (a request that hangs must not stop the soak: it is a defect of
// its own); it reports whether it got there, and returns the function
// that lets requests go again.
func (l *load) quiesce(d time.Duration) (resume func(), quiet bool) {
	l.paused.Store(true)
	quiet = waitFor(d, func() bool { return l.inflight.Load() == 0 })
	return func() { l.paused.Store(false) }, quiet
}

// enter waits while a sample is being taken and counts a request in
// flight; exit ends it.
func (l *load) enter() {
	for {
		for l.paused.Load() {
			time.Sleep(10 * time.Millisecond)
		}
		l.inflight.Add(1)
		if !l.paused.Load() {
			return
		}
		l.inflight.Add(-1)
	}
}

func (l *load) exit() { l.inflight.Add(-1) }

// request is one request a worker sends.
type request struct {
	inst   int
	api    string // chat, responses, messages
	model  string
	stream bool
	acct   string
	key    wallKey
	slow   bool
	abort  bool
}

// pick draws the traffic mix: 45% chat, 35% Messages, 20% Responses;
// 55% streams; 25% unbilled, 4% a key whose account is empty, 4% an
// unknown key, the rest funded wallet keys; 5% of streams hung up on by
// the client after the first content.
func (l *load) pick(r *rand.Rand, worker int) request {
	q := request{inst: (worker + r.IntN(2)) % 2, stream: r.IntN(100) < 55}
	switch n := r.IntN(100); {
	case n < 45:
		q.api, q.model = "chat", chatModels[r.IntN(len(chatModels))]
	case n < 80:
		q.api, q.model = "messages", messagesModels[r.IntN(len(messagesModels))]
	default:
		q.api, q.model = "responses", respModels[r.IntN(len(respModels))]
	}
	switch n := r.IntN(100); {
	case n < 25:
		q.acct = "free"
	case n < 29:
		q.acct = "poor"
	case n < 33:
		q.acct = "badkey"
	default:
		q.acct = "funded"
	}
	q.abort = q.stream && r.IntN(100) < 5
	if ks := l.keys[q.acct]; len(ks) > 0 {
		q.key = ks[r.IntN(len(ks))]
	}
	return q
}

func (l *load) worker(r *rand.Rand, w int) {
	defer l.wg.Done()
	for !l.stopped() {
		q := l.pick(r, w)
		l.enter()
		rec := l.do(l.clients[q.inst], q)
		l.exit()
		l.add(rec)
		if rec.Class == classConnError {
			// The instance is down (killed): do not spin on refusals.
			time.Sleep(100 * time.Millisecond)
		} else {
			time.Sleep(time.Duration(r.IntN(20)) * time.Millisecond)
		}
	}
}

// slowReader streams the long answer (about 300 KB) on a funded key,
// reading it at about 100 KB/s through a 4 KB receive buffer.
func (l *load) slowReader() {
	defer l.wg.Done()
	for i := 0; !l.stopped(); i++ {
		q := request{inst: i % 2, api: "chat", model: longModel, stream: true, acct: "funded", key: l.keys["funded"][i%len(l.keys["funded"])], slow: true}
		l.enter()
		rec := l.do(l.slow, q)
		l.exit()
		l.add(rec)
		if rec.Class == classConnError {
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func (l *load) add(rec *record) {
	rec.Seq = int(l.seq.Add(1))
	b, _ := json.Marshal(rec)
	l.mu.Lock()
	l.records = append(l.records, rec)
	if l.log != nil {
		_, _ = l.log.Write(append(b, '\n'))
	}
	l.mu.Unlock()
}

// body is the request body of q, the smallest real request of its API.
func (q request) body() []byte {
	switch q.api {
	case "responses":
		return fu.ResponsesRequest(q.model, q.stream)
	case "messages":
		return fu.MessagesRequest(q.model, q.stream)
	}
	return fu.ChatRequest(q.model, q.stream)
}

func (q request) path() string {
	p := map[string]string{"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}[q.api]
	if q.acct == "free" {
		return "/free" + p
	}
	return p
}

// do sends q and reads the answer as the client of that API would.
func (l *load) do(c *http.Client, q request) *record {
	rec := &record{Inst: q.inst, API: q.api, Model: q.model, Stream: q.stream, Acct: q.acct, Account: q.key.account,
		Slow: q.slow, Abort: q.abort, Sent: time.Now()}
	defer func() { rec.Done = time.Now() }()
	req, _ := http.NewRequest(http.MethodPost, l.gws[q.inst].gatewayURL()+q.path(), bytes.NewReader(q.body()))
	req.Header.Set("Content-Type", "application/json")
	if key := q.key.secret; key != "" {
		if q.api == "messages" {
			req.Header.Set("X-Api-Key", key)
		} else {
			req.Header.Set("Authorization", "Bearer "+key)
		}
	}
	if q.api == "messages" {
		req.Header.Set("Anthropic-Version", "2023-06-01")
	}
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { rec.Reused, rec.Conn = i.Reused, i.Conn.LocalAddr().String() },
	}))
	res, err := c.Do(req)
	if err != nil {
		rec.Class, rec.Detail = classConnError, err.Error()
		if errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "Client.Timeout") {
			rec.Class = classHung
		}
		return rec
	}
	defer res.Body.Close()
	rec.Status, rec.ReqID, rec.ServedBy = res.StatusCode, res.Header.Get("X-Request-Id"), res.Header.Get("X-Served-By")
	var body io.Reader = res.Body
	if q.slow {
		body = &slowReader{r: res.Body}
	}
	if res.StatusCode != http.StatusOK || !q.stream {
		b, err := io.ReadAll(body)
		rec.Bytes = len(b)
		if err != nil {
			rec.Class, rec.Detail = classTransportCut, fmt.Sprintf("reading the body: %v", err)
			if errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "Client.Timeout") {
				rec.Class = classHung
			}
			return rec
		}
		rec.Class, rec.Detail = classifyWhole(q.api, res.StatusCode, b)
		return rec
	}
	counted := false
	defer func() {
		if counted {
			l.mid[q.inst].Add(-1)
		}
	}()
	rec.Class, rec.Detail, rec.Resumed, rec.Bytes = classifyStream(q.api, body, q.abort, func() {
		if rec.billed() {
			counted = true
			l.mid[q.inst].Add(1)
		}
	})
	return rec
}

// slowReader reads at most 512 bytes every 5 ms.
type slowReader struct{ r io.Reader }

func (s *slowReader) Read(p []byte) (int, error) {
	time.Sleep(5 * time.Millisecond)
	if len(p) > 512 {
		p = p[:512]
	}
	return s.r.Read(p)
}

// classifyWhole judges a whole (non-stream, or error) answer.
func classifyWhole(api string, status int, b []byte) (class, detail string) {
	if status == http.StatusOK {
		if text := answerText(api, b); text == "" {
			return classBadBody, fmt.Sprintf("200 without an answer: %.200q", b)
		}
		return classOK, ""
	}
	msg, ok := errorMessage(api, b)
	if !ok {
		return classBadBody, fmt.Sprintf("status %d, not an error in the %s format: %.200q", status, api, b)
	}
	switch {
	case status == http.StatusUnauthorized:
		return class401, msg
	case status == http.StatusPaymentRequired:
		return class402, msg
	case status == http.StatusServiceUnavailable && strings.Contains(msg, "billing is temporarily unavailable"):
		return classStore503, msg
	case status == http.StatusTooManyRequests || status >= 500:
		return classGatewayError, fmt.Sprintf("%d: %s", status, msg)
	}
	return classOther4xx, fmt.Sprintf("%d: %s", status, msg)
}

// answerText is the generated text of a JSON answer of the API.
func answerText(api string, b []byte) string {
	var v struct {
		Type    string `json:"type"`
		Status  string `json:"status"`
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		Output []struct {
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"output"`
	}
	if json.Unmarshal(b, &v) != nil {
		return ""
	}
	var sb strings.Builder
	switch api {
	case "chat":
		for _, c := range v.Choices {
			sb.WriteString(c.Message.Content)
		}
	case "messages":
		if v.Type != "message" {
			return ""
		}
		for _, c := range v.Content {
			sb.WriteString(c.Text)
		}
	case "responses":
		if v.Status != "completed" {
			return ""
		}
		for _, o := range v.Output {
			for _, c := range o.Content {
				sb.WriteString(c.Text)
			}
		}
	}
	return sb.String()
}

// errorMessage reads an error body in the API's own format: OpenAI's
// {"error":{"message":...}}, Anthropic's {"type":"error","error":{...}}.
func errorMessage(api string, b []byte) (string, bool) {
	var v struct {
		Type  string `json:"type"`
		Error *struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &v) != nil || v.Error == nil || v.Error.Message == "" {
		return "", false
	}
	if api == "messages" && (v.Type != "error" || v.Error.Type == "") {
		return "", false
	}
	return v.Error.Message, true
}

// sseEvent is one server-sent event.
type sseEvent struct{ name, data string }

// classifyStream reads a 200 stream to its end (or, with abort, to its
// first content) and judges how it ended: its terminal event (complete),
// an error event in its dialect, a transport error, or neither (a silent
// cut). A resumed stream carries the gateway's seam comment.
func classifyStream(api string, body io.Reader, abort bool, firstContent func()) (class, detail string, resumed bool, n int) {
	br := bufio.NewReaderSize(body, 64<<10)
	var (
		events []sseEvent
		cur    sseEvent
		data   []string
		have   bool
		rerr   error
	)
	for {
		line, err := br.ReadString('\n')
		n += len(line)
		if err != nil {
			if err != io.EOF || line != "" {
				rerr = err
			}
			break
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if have {
				cur.data = strings.Join(data, "\n")
				events = append(events, cur)
				if firstContent != nil && isContentEvent(cur) {
					firstContent()
					firstContent = nil
					if abort {
						return classClientAbort, "", resumed, n
					}
				}
			}
			cur, data, have = sseEvent{}, nil, false
		case strings.HasPrefix(line, ":"):
			if strings.Contains(line, "llm-failover resumed") {
				resumed = true
			}
		case strings.HasPrefix(line, "event:"):
			cur.name, have = strings.TrimSpace(strings.TrimPrefix(line, "event:")), true
		case strings.HasPrefix(line, "data:"):
			data, have = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " ")), true
		}
	}
	if rerr != nil {
		if errors.Is(rerr, context.DeadlineExceeded) || strings.Contains(rerr.Error(), "Client.Timeout") {
			return classHung, fmt.Sprintf("after %d events: %v", len(events), rerr), resumed, n
		}
		return classTransportCut, fmt.Sprintf("after %d events: %v", len(events), rerr), resumed, n
	}
	if len(events) == 0 {
		return classSilentCut, "a 200 stream without one event", resumed, n
	}
	errAt := -1
	for i, ev := range events {
		if isErrorEvent(api, ev) {
			errAt = i
			break
		}
	}
	last := events[len(events)-1]
	terminal := map[string]bool{
		"chat":      last.data == "[DONE]",
		"messages":  last.name == "message_stop",
		"responses": last.name == "response.completed",
	}[api]
	switch {
	case errAt >= 0 && errAt == len(events)-1:
		return classErrorEvent, fmt.Sprintf("error event after %d events: %.200s", len(events)-1, last.data), resumed, n
	case errAt >= 0:
		return classErrorThenEnd, fmt.Sprintf("error event %d of %d: %.200s; last %q %.100s", errAt+1, len(events), events[errAt].data, last.name, last.data), resumed, n
	case !terminal:
		return classSilentCut, fmt.Sprintf("ended after %d events with %q %.200s", len(events), last.name, last.data), resumed, n
	}
	if text := streamText(events); text == "" {
		return classBadBody, fmt.Sprintf("complete stream of %d events without text", len(events)), resumed, n
	}
	return classOK, "", resumed, n
}

// isErrorEvent: chat's `data: {"error":...}`, Anthropic's and the
// Responses API's `event: error`, and Responses' response.failed.
func isErrorEvent(api string, ev sseEvent) bool {
	if ev.name == "error" || (api == "responses" && ev.name == "response.failed") {
		return true
	}
	if api != "chat" || !strings.HasPrefix(ev.data, "{") {
		return false
	}
	var v struct {
		Error json.RawMessage `json:"error"`
	}
	return json.Unmarshal([]byte(ev.data), &v) == nil && len(v.Error) > 0 && string(v.Error) != "null"
}

func isContentEvent(ev sseEvent) bool {
	return streamText([]sseEvent{ev}) != ""
}

func streamText(events []sseEvent) string {
	evs := make([]fu.Event, len(events))
	for i, ev := range events {
		evs[i] = fu.Event{Name: ev.name, Data: ev.data}
	}
	return fu.StreamText(evs)
}
