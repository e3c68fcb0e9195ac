//go:build linux

package soak

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"

	"github.com/llmfailover/caddy-llm-failover/internal/backoff"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// fault is how a front answers the requests that arrive while it is set.
type fault int32

const (
	healthy fault = iota
	// faultReset reads the request and resets the connection (RST)
	// without a byte of answer.
	faultReset
	// faultCut relays the answer up to its first content frame and hangs
	// up (FIN) without the chunked body's end; a JSON answer is cut
	// halfway through its announced Content-Length.
	faultCut
	// faultStall relays up to the first content frame (half of a JSON
	// body) and then sends nothing for stallFor, longer than the
	// gateway's stream_idle_timeout, then hangs up.
	faultStall
	// fault5xx answers 500, 502, 503 (and 529 on Anthropic's APIs) in
	// turn, each in the provider's own error format.
	fault5xx
	// fault429RetryAfter answers 429 with Retry-After (retry-after-ms on
	// Azure, as it sends).
	fault429RetryAfter
	// fault429 answers 429 naming no wait, as Vertex and Gemini do.
	fault429
	// faultMalformed relays the answer with a malformed frame right after
	// the first content frame (SSE data that is not JSON; on Bedrock an
	// event-stream chunk whose payload is not JSON); a JSON answer's body
	// is replaced by bytes that are not JSON.
	faultMalformed
	numFaults
)

var faultNames = [numFaults]string{"healthy", "reset", "cut_after_content", "stall", "5xx_burst", "429_retry_after", "429_no_retry_after", "malformed_frame"}

func (f fault) String() string { return faultNames[f] }

// dialect is how an upstream words its errors.
type dialect int

const (
	dialectOpenAI dialect = iota
	dialectAzure
	dialectGoogle
	dialectAnthropic
	dialectBedrock
)

// front is a fault-injecting HTTP proxy in front of one fake upstream.
// The fakes (internal/fakeproviders, internal/faultupstream) speak each
// provider's real wire format and check its authentication; the front
// adds the faults on top, the same way for all of them, so every fault
// kind reaches every provider adapter: it sees the frames (SSE events, or
// Bedrock's binary event-stream messages) and can cut, stall or corrupt
// the answer right after its first content. It keeps the Host header,
// which Bedrock's SigV4 signature covers.
type front struct {
	name     string
	dialect  dialect
	target   *url.URL
	pace     time.Duration // between relayed frames: streams last long enough to be caught by a reload or a kill
	stallFor time.Duration
	srv      *httptest.Server
	client   *http.Client

	mode     atomic.Int32
	n5xx     atomic.Int64
	answered [numFaults]atomic.Int64 // requests answered under each fault
}

func newFront(name string, d dialect, target string, pace, stallFor time.Duration) *front {
	u, err := url.Parse(target)
	if err != nil {
		panic(err)
	}
	f := &front{name: name, dialect: d, target: u, pace: pace, stallFor: stallFor,
		client: &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: 64, DisableCompression: true, IdleConnTimeout: 30 * time.Second,
		}}}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	// Resets and cuts are the point; net/http's complaints about them are noise.
	f.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	f.srv.Start()
	return f
}

func (f *front) URL() string { return f.srv.URL }

func (f *front) set(m fault) { f.mode.Store(int32(m)) }

func (f *front) close() {
	f.srv.CloseClientConnections()
	f.srv.Close()
	f.client.CloseIdleConnections()
}

func (f *front) serve(w http.ResponseWriter, r *http.Request) {
	defer func() {
		// A handler that returns because the gateway went away would
		// otherwise end its answer cleanly; dropping the connection is
		// the only honest outcome (as faultupstream does).
		if r.Context().Err() != nil {
			panic(http.ErrAbortHandler)
		}
	}()
	m := fault(f.mode.Load())
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	f.answered[m].Add(1)
	anthropicAPI := strings.HasSuffix(r.URL.Path, "/messages") || strings.Contains(r.URL.Path, "/publishers/anthropic/") || strings.HasPrefix(r.URL.Path, "/model/")
	switch m {
	case faultReset:
		hangUp(w, true)
		return
	case fault5xx:
		codes := []int{500, 502, 503}
		if anthropicAPI && f.dialect != dialectBedrock {
			codes = append(codes, 529)
		}
		code := codes[int(f.n5xx.Add(1))%len(codes)]
		f.errorAnswer(w, code, anthropicAPI, false)
		return
	case fault429RetryAfter, fault429:
		f.errorAnswer(w, http.StatusTooManyRequests, anthropicAPI, m == fault429RetryAfter)
		return
	}

	out, err := http.NewRequestWithContext(r.Context(), r.Method, "", bytes.NewReader(body))
	if err != nil {
		return
	}
	out.URL = &url.URL{Scheme: f.target.Scheme, Host: f.target.Host, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
	out.Host = r.Host
	out.Header = r.Header.Clone()
	out.ContentLength = int64(len(body))
	res, err := f.client.Do(out)
	if err != nil {
		if r.Context().Err() == nil {
			http.Error(w, "front: "+err.Error(), http.StatusBadGateway)
		}
		return
	}
	defer res.Body.Close()
	ct := res.Header.Get("Content-Type")
	es := strings.HasPrefix(ct, "application/vnd.amazon.eventstream")
	stream := es || strings.HasPrefix(ct, "text/event-stream")
	for k, vs := range res.Header {
		if k == "Content-Length" || k == "Transfer-Encoding" || k == "Connection" {
			continue
		}
		w.Header()[k] = vs
	}
	if res.StatusCode != http.StatusOK || !stream {
		f.relayWhole(w, r, res, m)
		return
	}
	w.WriteHeader(res.StatusCode)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	br := bufio.NewReaderSize(res.Body, 64<<10)
	faulted := false
	for {
		frame, err := readFrame(br, es)
		if len(frame) > 0 {
			if f.pace > 0 && !backoff.Sleep(r.Context(), f.pace) {
				return
			}
			if _, werr := w.Write(frame); werr != nil || rc.Flush() != nil {
				return
			}
			if !faulted && (m == faultCut || m == faultStall || m == faultMalformed) && isContent(frame, es) {
				faulted = true
				switch m {
				case faultCut:
					hangUp(w, false)
					return
				case faultStall:
					if backoff.Sleep(r.Context(), f.stallFor) {
						hangUp(w, false)
					}
					return
				case faultMalformed:
					if _, werr := w.Write(malformedFrame(frame, es)); werr != nil || rc.Flush() != nil {
						return
					}
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// relayWhole relays an answer that is not a stream (JSON, or an error of
// any kind), applying the fault to a 200.
func (f *front) relayWhole(w http.ResponseWriter, r *http.Request, res *http.Response, m fault) {
	b, err := io.ReadAll(res.Body)
	if err != nil {
		hangUp(w, false)
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	if res.StatusCode != http.StatusOK {
		m = healthy
	}
	switch m {
	case faultCut, faultStall:
		w.WriteHeader(res.StatusCode)
		_, _ = w.Write(b[:len(b)/2])
		_ = http.NewResponseController(w).Flush()
		if m == faultStall && !backoff.Sleep(r.Context(), f.stallFor) {
			return
		}
		hangUp(w, false)
	case faultMalformed:
		bad := []byte("{not json")
		bad = append(bad, bytes.Repeat([]byte(" "), max(0, len(b)-len(bad)))...)
		w.Header().Set("Content-Length", strconv.Itoa(len(bad)))
		w.WriteHeader(res.StatusCode)
		_, _ = w.Write(bad)
	default:
		w.WriteHeader(res.StatusCode)
		_, _ = w.Write(b)
	}
}

// errorAnswer answers status in the provider's own error format, as the
// real provider words a rate limit or an outage.
func (f *front) errorAnswer(w http.ResponseWriter, status int, anthropicAPI, retryAfter bool) {
	h := w.Header()
	if retryAfter {
		if f.dialect == dialectAzure {
			h.Set("Retry-After-Ms", "800")
		} else {
			h.Set("Retry-After", "1")
		}
	}
	var body string
	switch {
	case f.dialect == dialectBedrock:
		typ := map[int]string{429: "ThrottlingException", 500: "InternalServerException", 502: "ServiceUnavailableException", 503: "ServiceUnavailableException"}[status]
		h.Set("X-Amzn-Errortype", typ+":http://internal.amazon.com/coral/com.amazon.bedrock/")
		msg := "Too many requests, please wait before trying again."
		if status != 429 {
			msg = "The service is temporarily unable to handle the request."
		}
		body = fmt.Sprintf(`{"message":%q}`, msg)
	case f.dialect == dialectGoogle:
		st, msg := "UNAVAILABLE", "The model is overloaded. Please try again later."
		if status == 429 {
			st, msg = "RESOURCE_EXHAUSTED", "Resource exhausted, please try again later."
		} else if status == 500 {
			st, msg = "INTERNAL", "Internal error encountered."
		}
		body = fmt.Sprintf(`[{"error":{"code":%d,"message":%q,"status":%q}}]`, status, msg, st)
	case anthropicAPI:
		typ, msg := "api_error", "Internal server error"
		switch status {
		case 429:
			typ, msg = "rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"
		case 529:
			typ, msg = "overloaded_error", "Overloaded"
		}
		body = fu.AnthropicErrorBody(typ, msg)
	case f.dialect == dialectAzure:
		msg := "The server had an error while processing your request."
		if status == 429 {
			msg = "Requests to the ChatCompletions_Create Operation have exceeded token rate limit of your current tier. Please retry after 1 second."
		}
		body = fmt.Sprintf(`{"error":{"code":"%d","message":%q}}`, status, msg)
	default:
		body = fu.OpenAIErrorBody("The server had an error while processing your request.", "server_error", "")
		if status == 429 {
			body = fu.OpenAIErrorBody("Rate limit reached for requests. Please try again in 1s.", "requests", "rate_limit_exceeded")
		}
	}
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

// readFrame reads one SSE event (through its blank line) or one AWS
// event-stream message (its length is its first four bytes).
func readFrame(br *bufio.Reader, es bool) ([]byte, error) {
	if es {
		prelude, err := br.Peek(4)
		if err != nil {
			rest, _ := io.ReadAll(br)
			return rest, err
		}
		n := int(binary.BigEndian.Uint32(prelude))
		if n < 16 || n > 16<<20 {
			rest, _ := io.ReadAll(br)
			return rest, fmt.Errorf("event-stream message of %d bytes", n)
		}
		frame := make([]byte, n)
		_, err = io.ReadFull(br, frame)
		return frame, err
	}
	var frame []byte
	for {
		line, err := br.ReadBytes('\n')
		frame = append(frame, line...)
		if err != nil {
			return frame, err
		}
		if len(bytes.TrimRight(line, "\r\n")) == 0 && len(bytes.TrimSpace(frame)) > 0 {
			return frame, nil
		}
	}
}

// chatContent matches a chat chunk's non-empty content delta (the role
// chunk's content is "").
var chatContent = regexp.MustCompile(`"content":"[^"]`)

// isContent reports whether a frame carries generated text.
func isContent(frame []byte, es bool) bool {
	if es {
		frame = eventStreamPayload(frame)
		return bytes.Contains(frame, []byte("content_block_delta"))
	}
	return bytes.Contains(frame, []byte("content_block_delta")) ||
		bytes.Contains(frame, []byte("response.output_text.delta")) ||
		chatContent.Match(frame)
}

// eventStreamPayload decodes a Bedrock chunk's {"bytes":"<base64>"}.
func eventStreamPayload(frame []byte) []byte {
	msg, err := eventstream.NewDecoder().Decode(bytes.NewReader(frame), nil)
	if err != nil {
		return nil
	}
	var p struct {
		Bytes string `json:"bytes"`
	}
	if json.Unmarshal(msg.Payload, &p) != nil {
		return nil
	}
	b, _ := base64.StdEncoding.DecodeString(p.Bytes)
	return b
}

// malformedFrame is a frame of the same kind as after whose payload is
// not JSON: for SSE the same event name with `data: {not json`, for
// Bedrock a well-framed chunk whose bytes are not JSON.
func malformedFrame(after []byte, es bool) []byte {
	if es {
		var buf bytes.Buffer
		payload, _ := json.Marshal(map[string]string{"bytes": base64.StdEncoding.EncodeToString([]byte("{not json"))})
		_ = eventstream.NewEncoder().Encode(&buf, eventstream.Message{Headers: eventstream.Headers{
			{Name: ":message-type", Value: eventstream.StringValue("event")},
			{Name: ":event-type", Value: eventstream.StringValue("chunk")},
			{Name: ":content-type", Value: eventstream.StringValue("application/json")},
		}, Payload: payload})
		return buf.Bytes()
	}
	var name string
	for _, line := range strings.Split(string(after), "\n") {
		if v, ok := strings.CutPrefix(line, "event:"); ok {
			name = strings.TrimSpace(v)
		}
	}
	if name != "" {
		return []byte("event: " + name + "\ndata: {not json\n\n")
	}
	return []byte("data: {not json\n\n")
}

// hangUp takes the connection from net/http and closes it: with a FIN
// (the answer ends without its chunked terminator), or with an RST.
func hangUp(w http.ResponseWriter, reset bool) {
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	if buf != nil {
		_ = buf.Flush()
	}
	if tc, ok := conn.(*net.TCPConn); ok && reset {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}
