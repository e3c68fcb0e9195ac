package llmfailover

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/chain"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// loadHandler provisions an llm_failover handler from its JSON outside a
// running Caddy.
func loadHandler(t *testing.T, cfg string) *Handler {
	t.Helper()
	ctx, cancel := provisionContext(t)
	t.Cleanup(cancel)
	mod, err := ctx.LoadModuleByID("http.handlers.llm_failover", json.RawMessage(cfg))
	if err != nil {
		t.Fatal(err)
	}
	h := mod.(*Handler)
	t.Cleanup(func() { _ = h.Cleanup() })
	return h
}

// serveDirect runs one request through h's ServeHTTP, as Caddy would.
func serveDirect(h *Handler, w http.ResponseWriter, r *http.Request) {
	r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, &caddyhttp.Server{})
	_ = h.ServeHTTP(w, r, nil)
}

// When every channel is open, the last-resort ticket taken for the one
// whose cooldown ends first is released even if the client is gone
// before the walk starts: a leaked trial slot would refuse every trial of
// the channel's next half-open phases.
func TestLastResortTicketReleasedWhenClientIsGone(t *testing.T) {
	up := upstream(t, fu.OK())
	name := uniqueName("lr")
	h := loadHandler(t, fmt.Sprintf(`{"channels":[{"name":%q,"base_url":%q}],"auth":"off",
		"models":[{"name":"m","routes":[{"channel":%q}]}]}`, name, up.URL, name))
	b := h.channels[0].state.breaker
	now := time.Now()
	for range 3 {
		b.RecordFailure(now)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(string(fu.ChatRequest("m", false)))).WithContext(ctx)
	serveDirect(h, httptest.NewRecorder(), req)

	hits(t, up, 0)
	if s := b.Snapshot(time.Now()); s.TrialsInFlight != 0 {
		t.Fatalf("%d trial(s) still in flight after the request ended", s.TrialsInFlight)
	}
	// After the cooldown the channel takes its half-open trial.
	if tk, ok := b.Admit(now.Add(b.Config().Cooldown + time.Second)); !ok || !tk.Trial() {
		t.Fatal("the half-open channel refuses its trial: a ticket leaked")
	} else {
		tk.Done()
	}
}

// A continuation whose time is already up admits no channel: checking
// the deadline after admission leaked the half-open channel's trial slot.
func TestContinuationPastItsDeadlineTakesNoTicket(t *testing.T) {
	up := upstream(t, fu.OK())
	name := uniqueName("cont")
	h := loadHandler(t, fmt.Sprintf(`{"channels":[{"name":%q,"base_url":%q,"provider":{"name":"anthropic"}}],"auth":"off",
		"stream_idle_timeout":1,"breaker":{"cooldown":1000000},
		"models":[{"name":"m","routes":[{"channel":%q}]}]}`, name, up.URL, name))
	b := h.channels[0].state.breaker
	for range 3 {
		b.RecordFailure(time.Now())
	}
	time.Sleep(5 * time.Millisecond) // past the 1ms cooldown: half-open

	req := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(string(fu.MessagesRequest("m", true))))
	x := newExchange(httptest.NewRecorder(), req, provider.AnthropicMessages, modeChain)
	x.model = h.models["m"]
	x.req.Model = "m"
	x.resume = &resumeState{wanted: true, from: "elsewhere", errEvent: []byte("event: error\ndata: {}\n\n")}
	h.resume(x, []*chain.Route{&x.model.chain.Routes[0]})

	hits(t, up, 0)
	if s := b.Snapshot(time.Now()); s.TrialsInFlight != 0 {
		t.Fatalf("%d trial(s) in flight after a continuation that was never sent", s.TrialsInFlight)
	}
}

// Synthetic checks go through the same walk as client requests, so the
// answers they buffer are released from the process-wide memory budget.
func TestProbesReleaseHeldBytes(t *testing.T) {
	up := upstream(t, fu.Status(401, fu.OpenAIErrorBody("bad key", "invalid_request_error", "invalid_api_key")))
	name := uniqueName("pr")
	h := loadHandler(t, fmt.Sprintf(`{"channels":[{"name":%q,"base_url":%q}],"auth":"off",
		"models":[{"name":"m","probe":{"interval":1000000},"routes":[{"channel":%q}]}]}`, name, up.URL, name))
	p := newProber([]*Handler{h}, zap.NewNop())
	before := heldBytes.Load()
	for range 10 {
		h.channels[0].state.breaker.Reset(time.Now()) // a failed probe opens it
		time.Sleep(2 * time.Millisecond)              // past the interval
		if _, err := p.round(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	hits(t, up, 10)
	if held := heldBytes.Load() - before; held != 0 {
		t.Fatalf("%d bytes still counted as held after ten probes", held)
	}
}

// hangUpAfter is a client that hangs up right after it reads marker: its
// request's context ends as soon as the marker is written to it.
type hangUpAfter struct {
	*httptest.ResponseRecorder
	marker string
	cancel context.CancelFunc
	seen   atomic.Bool
}

func (w *hangUpAfter) Write(p []byte) (int, error) {
	n, err := w.ResponseRecorder.Write(p)
	if strings.Contains(w.Body.String(), w.marker) && w.seen.CompareAndSwap(false, true) {
		w.cancel()
	}
	return n, err
}

// A committed stream the upstream cuts, or ends with an error event, is
// the channel's failure even when the client hangs up right after it
// (httpx does): asking first whether the client had gone recorded it as
// the client's departure, and a channel that kept cutting streams never
// opened.
func TestCutStreamIsTheChannelsFaultWhenTheClientHangsUpAfter(t *testing.T) {
	errorAfterContent := fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hel"}}]}`+"\n\n")
		w.(http.Flusher).Flush()
		_, _ = io.WriteString(w, `data: {"error":{"message":"the upstream is overloaded","type":"server_error"}}`+"\n\n")
	})
	for _, tc := range []struct {
		name   string
		up     fu.Behavior
		marker string
		reason string
	}{
		{"error event", errorAfterContent, "overloaded", string(reasonErrorFrame)},
		{"cut", fu.CutMidStream(), "stream_truncated", string(reasonTruncated)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := upstream(t, tc.up)
			name := uniqueName("cut")
			h := loadHandler(t, fmt.Sprintf(`{"channels":[{"name":%q,"base_url":%q}],"auth":"off",
				"models":[{"name":"m","routes":[{"channel":%q}]}]}`, name, up.URL, name))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			w := &hangUpAfter{ResponseRecorder: httptest.NewRecorder(), marker: tc.marker, cancel: cancel}
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(string(fu.ChatRequest("m", true)))).WithContext(ctx)
			serveDirect(h, w, req)

			if !w.seen.Load() {
				t.Fatalf("the client never saw %q: %s", tc.marker, w.Body.String())
			}
			if s := h.channels[0].state.breaker.Snapshot(time.Now()); s.FailuresInWindow != 1 {
				t.Fatalf("%d failure(s) counted against the channel, want 1 (%s)", s.FailuresInWindow, tc.reason)
			}
		})
	}
}
