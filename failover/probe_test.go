package failover

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/probe"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// Every priced route tells the scheduler the most its probe can cost, so
// that concurrent probes hold it against the daily budget: at least the
// plan's whole output at the route's price, and nothing for a free route.
func TestProbeRoutesTellTheirMaxCost(t *testing.T) {
	e := testEngine(t, testPlan(t, Options{}, func(m *Model) {
		plan, err := probe.NewPlan(time.Minute, 0, "", "")
		if err != nil {
			t.Fatal(err)
		}
		m.Probe = &plan
		m.Chain.Routes[1].InputCost, m.Chain.Routes[1].OutputCost = 2_000_000, 8_000_000
	}, testChannel{name: uniqueName("free"), url: "http://127.0.0.1:1"}, testChannel{name: uniqueName("priced"), url: "http://127.0.0.1:1"}))
	routes := prober{e}.Routes()
	if len(routes) != 2 {
		t.Fatalf("%d routes", len(routes))
	}
	if routes[0].MaxCost != 0 {
		t.Errorf("a free route's probe may cost %s", routes[0].MaxCost)
	}
	out := wallet.Price{Output: 8_000_000}.Cost(0, int64(routes[1].Plan.MaxTokens))
	if routes[1].MaxCost < out || routes[1].MaxCost <= 0 {
		t.Errorf("a priced route's probe may cost %s, below its output alone (%s)", routes[1].MaxCost, out)
	}
}

// A synthetic check is counted by probes_total and kept in the probes'
// own history; caddy_llm_failover_attempts_total counts real traffic,
// as the status page's channel windows do: a channel nobody uses but
// whose probes pass must not show a success rate made of probes.
func TestProbesAreNotCountedAsTrafficAttempts(t *testing.T) {
	up := upstream(t, fu.OK())
	name := uniqueName("probed")
	e := testEngine(t, testPlan(t, Options{}, func(m *Model) {
		plan, err := probe.NewPlan(time.Minute, 0, "", "")
		if err != nil {
			t.Fatal(err)
		}
		m.Probe = &plan
	}, testChannel{name: name, url: up.URL}))
	s := probe.NewScheduler([]probe.Target{prober{e}}, probe.NewLedger(), nil, zap.NewNop())
	if _, err := s.Round(context.Background()); err != nil {
		t.Fatal(err)
	}
	hits(t, up, 1)
	if n := testutil.ToFloat64(attemptsTotal.WithLabelValues("m", name, string(outcomeOK))); n != 0 {
		t.Errorf("attempts_total{outcome=ok} counts %v probe(s) as traffic", n)
	}
	if h := histogramCount(t, attemptDuration.WithLabelValues(name).(prometheus.Histogram)); h != 0 {
		t.Errorf("attempt_duration_seconds observed %d probe(s) as traffic", h)
	}
}

func histogramCount(t *testing.T, h prometheus.Histogram) uint64 {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// A probe that finds its half-open channel's trial slot taken by a
// client is not sent (the trial tells about the channel already); it is
// no request that skipped the channel: channel_skipped_total counts
// requests ("Requests that skipped a channel before sending because its
// breaker was open or it was parked"), and a synthetic check must not
// count as client traffic in any metric.
func TestProbeNotSentIsNoSkippedRequest(t *testing.T) {
	up := upstream(t, fu.OK())
	name := uniqueName("halfopen")
	e := testEngine(t, testPlan(t, Options{Breaker: breaker.Config{Cooldown: time.Millisecond}}, func(m *Model) {
		plan, err := probe.NewPlan(time.Minute, 0, "", "")
		if err != nil {
			t.Fatal(err)
		}
		m.Probe = &plan
	}, testChannel{name: name, url: up.URL}))
	b := e.channels[0].health.Breaker
	for range 3 {
		b.RecordFailure(time.Now())
	}
	time.Sleep(5 * time.Millisecond) // past the cooldown: half-open
	trial, ok := b.Admit(time.Now()) // a client's trial
	if !ok {
		t.Fatal("no trial admitted")
	}
	defer trial.Done()
	routes := prober{e}.Routes()
	if _, sent := (prober{e}).Probe(context.Background(), routes[0]); sent {
		t.Fatal("a probe was sent while a client held the trial slot")
	}
	hits(t, up, 0)
	if n := testutil.ToFloat64(channelSkipped.WithLabelValues(name)); n != 0 {
		t.Errorf("channel_skipped_total counts %v probe(s) as requests that skipped the channel", n)
	}
}

// OpenAI's and Azure's reasoning models refuse a chat request's
// max_tokens ("Use 'max_completion_tokens' instead."): a probe that gets
// that answer asks again at once with max_completion_tokens, passes, and
// the channel's later probes of the model ask so from the start.
func TestProbeLearnsMaxCompletionTokens(t *testing.T) {
	var sent []string
	var mu sync.Mutex
	up := upstream(t, fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		sent = append(sent, string(body))
		mu.Unlock()
		if bytes.Contains(body, []byte(`"max_tokens"`)) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.","type":"invalid_request_error","param":"max_tokens","code":"unsupported_parameter"}}`)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		fu.OK().Serve(w, r, 0)
	}))
	e := testEngine(t, testPlan(t, Options{}, func(m *Model) {
		plan, err := probe.NewPlan(time.Minute, 0, "", "")
		if err != nil {
			t.Fatal(err)
		}
		m.Probe = &plan
	}, testChannel{name: uniqueName("gpt5"), url: up.URL}))
	routes := prober{e}.Routes()
	for i := range 2 {
		res, ok := (prober{e}).Probe(context.Background(), routes[0])
		if !ok || res.Outcome != probe.Passed {
			t.Fatalf("probe %d: %+v (sent %v)", i+1, res, ok)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 3 || !strings.Contains(sent[0], `"max_tokens"`) || !strings.Contains(sent[1], `"max_completion_tokens"`) || !strings.Contains(sent[2], `"max_completion_tokens"`) {
		t.Fatalf("the upstream got %d probes: %q", len(sent), sent)
	}
}
