package failover

import (
	"bytes"
	"compress/flate"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// Upstreams that echo a channel's credential where it used to get past
// the mask: in a refusal inside a stream, in an error event after
// content, in an error body the transport did not decode. Each was a
// defect found by an audit of bad upstream input; badinput_test.go has
// the rest, and uses these helpers.

const echoedKey = "upstream-secret-4f1c9a0b7d2e"

// badEngine: channel "bad" (credential header hk: echoedKey) then, if
// backup, a healthy channel answering "Hello from backup".
func badEngine(t *testing.T, o Options, ad provider.Adapter, hk string, bad fu.Behavior, backup bool) *Engine {
	chs := []testChannel{{name: uniqueName("bad"), url: upstream(t, bad).URL, adapter: ad}}
	if backup {
		chs = append(chs, testChannel{name: uniqueName("ok"), url: upstream(t, fu.OKNamed("backup")).URL, adapter: ad})
	}
	p := testPlan(t, o, nil, chs...)
	if hk != "" {
		p.Channels[0].Header.Set(hk, echoedKey)
	}
	return testEngine(t, p)
}

// send serves one request; false when it is still being served after 10s.
func send(e *Engine, path string, body []byte) (*httptest.ResponseRecorder, bool) {
	w, done := httptest.NewRecorder(), make(chan struct{})
	go func() {
		defer close(done)
		serveDirect(e, w, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))
	}()
	select {
	case <-done:
		return w, true
	case <-time.After(10 * time.Second):
		return nil, false
	}
}

func sse(body string) fu.BehaviorFunc {
	return func(w http.ResponseWriter, r *http.Request, _ int64) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte(strings.ReplaceAll(body, "KEY", r.Header.Get("X-Api-Key")+r.Header.Get("Authorization"))))
	}
}

func TestStreamRefusalMasksEchoedKey(t *testing.T) {
	e := badEngine(t, Options{}, new(provider.Anthropic), "X-Api-Key", sse(`event: error
data: {"type":"error","error":{"type":"invalid_request_error","message":"bad x-api-key KEY"}}

`), false)
	w, _ := send(e, "/v1/messages", fu.MessagesRequest("m", true))
	if w.Code != 400 || strings.Contains(w.Body.String(), echoedKey) {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
}

// D2: an error event after content is forwarded unmasked.
func TestErrorFrameAfterContentMasksEchoedKey(t *testing.T) {
	e := badEngine(t, Options{}, nil, "Authorization", sse(`data: {"choices":[{"index":0,"delta":{"content":"Hello"}}]}

data: {"error":{"message":"upstream auth KEY expired","type":"server_error"}}

`), false)
	w, _ := send(e, "/v1/chat/completions", fu.ChatRequest("m", true))
	if strings.Contains(w.Body.String(), echoedKey) {
		t.Fatalf("key reached the client: %s", w.Body)
	}
}

// An error event after content whose echoed key is split across two
// reads: the first half went out as read before the event was known for
// an error.
func TestSplitErrorFrameAfterContentMasksEchoedKey(t *testing.T) {
	e := badEngine(t, Options{}, nil, "Authorization", fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		w.Header().Set("Content-Type", "text/event-stream")
		event := `data: {"error":{"message":"upstream auth ` + r.Header.Get("Authorization") + ` expired","type":"server_error"}}` + "\n\n"
		half := strings.Index(event, echoedKey) + len(echoedKey)/2
		for _, part := range []string{`data: {"choices":[{"index":0,"delta":{"content":"Hello"}}]}` + "\n\n", event[:half], event[half:]} {
			_, _ = w.Write([]byte(part))
			w.(http.Flusher).Flush()
			time.Sleep(20 * time.Millisecond)
		}
	}), false)
	w, _ := send(e, "/v1/chat/completions", fu.ChatRequest("m", true))
	if body := w.Body.String(); !strings.Contains(body, "Hello") || strings.Contains(body, echoedKey[:len(echoedKey)/2]) {
		t.Fatalf("(part of) the key reached the client: %s", body)
	}
}

// An error event after content that is held back for a resume (the
// deferred break) and then written because no channel continued the
// stream (the only one after it refuses) is masked like any error event.
func TestDeferredErrorEventMasksEchoedKey(t *testing.T) {
	bad := sse(`data: {"choices":[{"index":0,"delta":{"content":"Hello"}}]}

data: {"error":{"message":"upstream auth KEY expired","type":"server_error"}}

`)
	refuse := fu.Status(http.StatusBadRequest, fu.OpenAIErrorBody("prefix not supported", "invalid_request_error", ""))
	p := testPlan(t, Options{}, func(m *Model) { m.Resume = ResumeContinue },
		testChannel{name: uniqueName("bad"), url: upstream(t, bad).URL, adapter: &provider.OpenAI{Continuation: "prefix"}},
		testChannel{name: uniqueName("next"), url: upstream(t, refuse).URL, adapter: &provider.OpenAI{Continuation: "prefix"}})
	p.Channels[0].Header.Set("Authorization", "Bearer "+echoedKey)
	e := testEngine(t, p)
	if !e.models["m"].resumable[provider.OpenAIChat] {
		t.Fatal("the model's chat streams are not resumable: the break would not be deferred")
	}
	w, ok := send(e, "/v1/chat/completions", fu.ChatRequest("m", true))
	if !ok {
		t.Fatal("no answer")
	}
	body := w.Body.String()
	if !strings.Contains(body, "Hello") || !strings.Contains(body, "expired") {
		t.Fatalf("the deferred error event did not reach the client: status %d: %q", w.Code, body)
	}
	if strings.Contains(body, echoedKey) {
		t.Errorf("the deferred error event carries the channel's key: %q", body)
	}
}

// A failure's detail quotes what the upstream sent where the gateway
// expected an API answer (here its Content-Type): an upstream that echoes
// the channel's key there must not get it into the failover log line.
func TestFailureDetailMasksEchoedKey(t *testing.T) {
	e := badEngine(t, Options{}, nil, "Authorization", fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		w.Header().Set("Content-Type", "text/html; charset="+r.Header.Get("Authorization"))
		_, _ = w.Write([]byte("<html>sign in</html>"))
	}), true)
	core, logs := observer.New(zap.DebugLevel)
	e.logger = zap.New(core)
	w, ok := send(e, "/v1/chat/completions", fu.ChatRequest("m", false))
	wantBackup(t, w, ok)
	quoted := false
	for _, l := range logs.All() {
		for k, v := range l.ContextMap() {
			s := fmt.Sprint(v)
			if k == "detail" && strings.Contains(s, "content type") {
				quoted = true
			}
			if strings.Contains(s, echoedKey) {
				t.Errorf("log %q: field %s carries the channel's key: %s", l.Message, k, s)
			}
		}
	}
	if !quoted {
		t.Fatalf("no log line quotes the content type as its detail: %v", logs.All())
	}
}

// D3: a 4xx in an encoding the transport did not decode is masked blind.
func TestCompressedErrorBodyMasksEchoedKey(t *testing.T) {
	e := badEngine(t, Options{}, nil, "Authorization", fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		var b bytes.Buffer
		zw, _ := flate.NewWriter(&b, flate.DefaultCompression)
		fmt.Fprintf(zw, `{"error":{"message":"invalid key %s","type":"invalid_request_error"}}`, r.Header.Get("Authorization"))
		_ = zw.Close()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", "deflate")
		w.WriteHeader(400)
		_, _ = w.Write(b.Bytes())
	}), false)
	w, _ := send(e, "/v1/chat/completions", fu.ChatRequest("m", false))
	// A body the gateway cannot read is not passed on: the client gets
	// the status, in its API's format, unencoded.
	if w.Code != 400 || w.Header().Get("Content-Encoding") != "" || !strings.Contains(w.Body.String(), `"error"`) ||
		strings.Contains(w.Body.String(), echoedKey) {
		t.Fatalf("status %d, Content-Encoding %q: %q", w.Code, w.Header().Get("Content-Encoding"), w.Body)
	}
}

// D4: a 101 to a POST that asked for no upgrade.

// splitEcho answers with contentType, writing body (KEY replaced by the
// request's credential) in two reads split inside the credential.
func splitEcho(contentType, body string) fu.BehaviorFunc {
	return func(w http.ResponseWriter, r *http.Request, _ int64) {
		w.Header().Set("Content-Type", contentType)
		out := strings.ReplaceAll(body, "KEY", r.Header.Get("Authorization"))
		half := strings.Index(out, echoedKey) + len(echoedKey)/2
		for _, part := range []string{out[:half], out[half:]} {
			_, _ = w.Write([]byte(part))
			w.(http.Flusher).Flush()
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// An upstream's model output that echoes the channel's credential (a
// debugging proxy, a server that quotes its request) is masked like its
// errors, in a stream however its reads split the key, in a whole JSON
// answer, and in a stream of JSON lines.
func TestAnswersMaskEchoedKey(t *testing.T) {
	for _, c := range []struct {
		name, path string
		req        []byte
		upstream   fu.BehaviorFunc
	}{
		{"stream", "/v1/chat/completions", fu.ChatRequest("m", true), splitEcho("text/event-stream",
			`data: {"choices":[{"index":0,"delta":{"content":"your key is KEY"}}]}`+"\n\n"+
				`data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")},
		{"json", "/v1/chat/completions", fu.ChatRequest("m", false), splitEcho("application/json",
			`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"your key is KEY"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}`)},
		{"json lines", "/v1/chat/completions", fu.ChatRequest("m", true), splitEcho("application/x-ndjson",
			`{"message":{"content":"your key is KEY"}}`+"\n"+`{"done":true}`+"\n")},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := badEngine(t, Options{}, nil, "Authorization", c.upstream, false)
			w, ok := send(e, c.path, c.req)
			if !ok {
				t.Fatal("still served after 10s")
			}
			body := w.Body.String()
			if w.Code != 200 || !strings.Contains(body, "your key is [REDACTED]") || strings.Contains(body, echoedKey[:len(echoedKey)/2]) {
				t.Fatalf("status %d: (part of) the key reached the client, or the answer did not: %s", w.Code, body)
			}
			if cl := w.Header().Get("Content-Length"); cl != "" && cl != fmt.Sprint(len(body)) {
				t.Fatalf("Content-Length %s for a body of %d bytes", cl, len(body))
			}
		})
	}
}

// A key the channel sends in its base URL's query, echoed back by the
// upstream, is masked like a header's.
func TestBaseQueryKeyEchoIsMasked(t *testing.T) {
	echo := fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"error":{"message":"bad request to %s","type":"invalid_request_error"}}`, r.URL.RequestURI())
	})
	p := testPlan(t, Options{}, nil, testChannel{name: uniqueName("q"), url: upstream(t, echo).URL + "?api-key=" + echoedKey})
	e := testEngine(t, p)
	w, _ := send(e, "/v1/chat/completions", fu.ChatRequest("m", false))
	if body := w.Body.String(); w.Code != 400 || !strings.Contains(body, "api-key=[REDACTED]") || strings.Contains(body, echoedKey) {
		t.Fatalf("status %d: %s", w.Code, body)
	}
}
