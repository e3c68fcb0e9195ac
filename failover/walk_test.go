package failover

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/probe"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// When every channel is open, the last-resort ticket taken for the one
// whose cooldown ends first is released even if the client is gone
// before the walk starts: a leaked trial slot would refuse every trial of
// the channel's next half-open phases.
func TestLastResortTicketReleasedWhenClientIsGone(t *testing.T) {
	up := upstream(t, fu.OK())
	e := testEngine(t, testPlan(t, Options{}, nil, testChannel{name: uniqueName("lr"), url: up.URL}))
	b := e.channels[0].health.Breaker
	now := time.Now()
	for range 3 {
		b.RecordFailure(now)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(string(fu.ChatRequest("m", false)))).WithContext(ctx)
	serveDirect(e, httptest.NewRecorder(), req)

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
	e := testEngine(t, testPlan(t, Options{StreamIdleTimeout: time.Nanosecond, Breaker: breaker.Config{Cooldown: time.Millisecond}}, nil,
		testChannel{name: uniqueName("cont"), url: up.URL, adapter: new(provider.Anthropic)}))
	b := e.channels[0].health.Breaker
	for range 3 {
		b.RecordFailure(time.Now())
	}
	time.Sleep(5 * time.Millisecond) // past the 1ms cooldown: half-open

	req := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(string(fu.MessagesRequest("m", true))))
	x := newExchange(httptest.NewRecorder(), req, provider.AnthropicMessages, modeChain)
	x.model = e.models["m"]
	x.req.Model = "m"
	x.resume = &resumeState{wanted: true, from: "elsewhere", errEvent: []byte("event: error\ndata: {}\n\n")}
	e.resume(x, []*chain.Route{&x.model.Chain.Routes[0]}, attemptResult{verdict: broken})

	hits(t, up, 0)
	if s := b.Snapshot(time.Now()); s.TrialsInFlight != 0 {
		t.Fatalf("%d trial(s) in flight after a continuation that was never sent", s.TrialsInFlight)
	}
}

// Synthetic checks go through the same walk as client requests, so the
// answers they buffer are released from the process-wide memory budget.
func TestProbesReleaseHeldBytes(t *testing.T) {
	up := upstream(t, fu.Status(401, fu.OpenAIErrorBody("bad key", "invalid_request_error", "invalid_api_key")))
	e := testEngine(t, testPlan(t, Options{}, func(m *Model) {
		// A probe's deadline is its interval: long enough that a loaded
		// machine still sends it (1 ms lost one probe in ten).
		plan, err := probe.NewPlan(50*time.Millisecond, 0, "", "")
		if err != nil {
			t.Fatal(err)
		}
		m.Probe = &plan
	}, testChannel{name: uniqueName("pr"), url: up.URL}))
	s := probe.NewScheduler([]probe.Target{prober{e}}, probe.NewLedger(), nil, zap.NewNop())
	before := failoverapp.HeldBytes()
	for range 10 {
		e.channels[0].health.Breaker.Reset(time.Now()) // a failed probe opens it
		time.Sleep(55 * time.Millisecond)              // past the interval
		if _, err := s.Round(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	hits(t, up, 10)
	if held := failoverapp.HeldBytes() - before; held != 0 {
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
			e := testEngine(t, testPlan(t, Options{}, nil, testChannel{name: uniqueName("cut"), url: up.URL}))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			w := &hangUpAfter{ResponseRecorder: httptest.NewRecorder(), marker: tc.marker, cancel: cancel}
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(string(fu.ChatRequest("m", true)))).WithContext(ctx)
			serveDirect(e, w, req)

			if !w.seen.Load() {
				t.Fatalf("the client never saw %q: %s", tc.marker, w.Body.String())
			}
			if s := e.channels[0].health.Breaker.Snapshot(time.Now()); s.FailuresInWindow != 1 {
				t.Fatalf("%d failure(s) counted against the channel, want 1 (%s)", s.FailuresInWindow, tc.reason)
			}
		})
	}
}

// A failover line has no empty detail field: it is there only when
// something went wrong locally.
func TestFailoverLineDetailOnlyWhenThere(t *testing.T) {
	if f := detailField(""); f.Type != zapcore.SkipType {
		t.Errorf("empty detail logged as %+v", f)
	}
	if f := detailField("dial tcp: refused"); f.Key != "detail" || f.String != "dial tcp: refused" {
		t.Errorf("detail logged as %+v", f)
	}
}

// A resume goes only to the channels after the one that broke: a model
// whose only channel able to continue is its first holds no money for a
// continuation (it was counted, and the extra reservation caused false
// 402s).
func TestNoContinuationReservedWhenOnlyTheFirstCanContinue(t *testing.T) {
	plan := func(first, second provider.Adapter) *Model {
		e := testEngine(t, testPlan(t, Options{}, func(m *Model) { m.Resume = ResumeContinue },
			testChannel{name: uniqueName("rc"), url: "http://127.0.0.1:1", adapter: first},
			testChannel{name: uniqueName("rc"), url: "http://127.0.0.1:1", adapter: second}))
		return e.models["m"]
	}
	if m := plan(&provider.OpenAI{Continuation: "prefix"}, &provider.OpenAI{Continuation: "off"}); m.resumable[provider.OpenAIChat] {
		t.Error("chat counted as resumable: only the first channel can continue")
	}
	if m := plan(&provider.OpenAI{Continuation: "off"}, &provider.OpenAI{Continuation: "prefix"}); !m.resumable[provider.OpenAIChat] {
		t.Error("chat not resumable though the second channel can continue")
	}
}

// A request the gateway's memory budget kept from every channel is the
// gateway's load, not the chain's verdict: its 503 does not tell the
// official SDKs to give up (errors.md), while a chain that failed for
// real does.
func TestOverloadedRefusalLeavesSDKRetriesOn(t *testing.T) {
	a, b := upstream(t, fu.OK()), upstream(t, fu.OK())
	e := testEngine(t, testPlan(t, Options{}, nil,
		testChannel{name: uniqueName("ov"), url: a.URL}, testChannel{name: uniqueName("ov"), url: b.URL}))
	post := func() *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		serveDirect(e, w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(string(fu.ChatRequest("m", false)))))
		return w
	}

	const all = 1 << 50
	e.memory.Hold(all)
	w := post()
	e.memory.Release(all)
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), provider.ErrMemoryBudget.Error()) {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if got := w.Header().Get("X-Should-Retry"); got != "" {
		t.Fatalf("X-Should-Retry %q on the gateway's own overload", got)
	}
	hits(t, a, 0)
	hits(t, b, 0)

	a.Set(fu.Status(http.StatusServiceUnavailable, ""))
	b.Set(fu.Status(http.StatusServiceUnavailable, ""))
	if w := post(); w.Code != http.StatusServiceUnavailable || w.Header().Get("X-Should-Retry") != "false" {
		t.Fatalf("every channel failing: status %d, X-Should-Retry %q", w.Code, w.Header().Get("X-Should-Retry"))
	}
}
