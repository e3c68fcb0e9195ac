package failover

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/llmfailover/caddy-llm-failover/internal/fakeproviders"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// An upstream that names itself with the channel's key (in the answer's
// "model", where a compromised or misconfigured upstream can put any
// string) must not get the key into an exported span: docs/operations.md
// promises no credential in any span.
func TestSpanResponseModelMasksEchoedKey(t *testing.T) {
	echo := fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`, key)
	})
	p := testPlan(t, Options{}, nil, testChannel{name: uniqueName("echo"), url: upstream(t, echo).URL})
	p.Channels[0].Header.Set("Authorization", "Bearer "+echoedKey)
	e := testEngine(t, p)

	rec := tracetest.NewSpanRecorder()
	tp := trace.NewTracerProvider(trace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(fu.ChatRequest("m", false))).WithContext(ctx)
	w := httptest.NewRecorder()
	serveDirect(e, w, req)
	span.End()
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	ended := rec.Ended()
	if len(ended) < 3 {
		t.Fatalf("%d spans, want the request's, the gateway's and the attempt's", len(ended))
	}
	for _, s := range ended {
		for _, a := range s.Attributes() {
			if strings.Contains(a.Value.Emit(), echoedKey) {
				t.Errorf("span %q: attribute %s carries the channel's key: %q", s.Name(), a.Key, a.Value.Emit())
			}
		}
	}
}

// azureKey is shaped like an Azure OpenAI key: 32 hex digits, which no
// credential shape matches once one of them is cut off.
const azureKey = "3f9a1c0b7d2e4f6a8b9c0d1e2f3a4b5c"

// An upstream's error message is cut at 512 bytes before its secrets are
// masked: a key that straddles the cut loses its tail, is no longer the
// configured value, and all but its last characters reach the failover
// log line and the client's 502/503 body.
func TestCutUpstreamMessageMasksEchoedKey(t *testing.T) {
	pad := strings.Repeat("x ", 236) + "x" // 473 bytes: the key starts at byte 481, 31 of its 32 digits before the cut
	bad := upstream(t, fu.Status(http.StatusServiceUnavailable, fu.OpenAIErrorBody(pad+"api-key "+azureKey+" is over its quota", "server_error", "")))
	p := testPlan(t, Options{}, nil, testChannel{name: uniqueName("cut"), url: bad.URL})
	p.Channels[0].Header.Set("Api-Key", azureKey)
	e := testEngine(t, p)
	core, logs := observer.New(zap.DebugLevel)
	e.logger = zap.New(core)

	w, ok := send(e, "/v1/chat/completions", fu.ChatRequest("m", false))
	if !ok {
		t.Fatal("no answer")
	}
	leaked := azureKey[:20] // any long part of the key
	if strings.Contains(w.Body.String(), leaked) {
		t.Errorf("the client's %d body quotes part of the key: %s", w.Code, w.Body)
	}
	for _, l := range logs.All() {
		for k, v := range l.ContextMap() {
			if strings.Contains(fmt.Sprint(v), leaked) {
				t.Errorf("log %q: field %s quotes part of the key: %v", l.Message, k, v)
			}
		}
	}
}

// The doctor's problem is one line of the operator's terminal (`caddy
// llm-failover doctor` prints it as it is): an upstream's message must
// not get terminal control sequences into it, which could rewrite what
// the operator reads (erase the FAIL line, fake an "ok") or, in some
// terminals, set the clipboard.
func TestDoctorProblemHasNoControlCharacters(t *testing.T) {
	msg := "Incorrect API key\x1b[2K\r\x1b[1Achannel: ok\x1b]52;c;ZWNobyBwd25lZA==\x07\x08\x00"
	bad := upstream(t, fu.Status(http.StatusUnauthorized, fu.OpenAIErrorBody(msg, "invalid_request_error", "invalid_api_key")))
	name := uniqueName("doc")
	e := testEngine(t, testPlan(t, Options{}, nil, testChannel{name: name, url: bad.URL}))
	routes, found := doctor{e}.CheckChannel(context.Background(), name)
	if !found || len(routes) == 0 {
		t.Fatalf("found %v, %d routes", found, len(routes))
	}
	for _, r := range routes {
		if r.OK || r.Problem == "" {
			t.Fatalf("route %+v: want the refusal as its problem", r)
		}
		for _, s := range []string{r.Problem, r.Hint} {
			if i := strings.IndexFunc(s, func(c rune) bool { return c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0xa0) }); i >= 0 {
				t.Errorf("the doctor's line carries control character %q: %q", s[i], s)
			}
		}
	}
}

// A Vertex channel's OAuth access token is its credential for the hour:
// an upstream (a proxy in front of Vertex, a compromised endpoint) that
// echoes it in a refusal must not get it to the client in the 4xx body
// passed back, as a configured key would not.
func TestVertexAccessTokenMaskedInPassedBackRefusal(t *testing.T) {
	fake := fakeproviders.NewVertex("proj", "us-east5", time.Hour)
	t.Cleanup(fake.Close)
	sa, err := fake.WriteServiceAccount(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	v := &provider.Vertex{Project: "proj", Region: "us-east5", CredentialsFile: sa}
	if err := v.Provision(testContext(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = v.Cleanup() })
	var seen atomic.Value
	echo := fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		seen.Store(tok)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `[{"error":{"code":400,"message":"Request had invalid authentication credentials %s for this model.","status":"INVALID_ARGUMENT"}}]`, tok)
	})
	e := testEngine(t, testPlan(t, Options{}, nil, testChannel{name: uniqueName("vertex"), url: upstream(t, echo).URL, adapter: v}))
	w, ok := send(e, "/v1/chat/completions", fu.ChatRequest("m", false))
	if !ok {
		t.Fatal("no answer")
	}
	tok, _ := seen.Load().(string)
	if tok == "" {
		t.Fatalf("the upstream got no token; status %d: %s", w.Code, w.Body)
	}
	if strings.Contains(w.Body.String(), tok) {
		t.Errorf("the client's %d body carries the channel's access token %q: %s", w.Code, tok, w.Body)
	}
}
