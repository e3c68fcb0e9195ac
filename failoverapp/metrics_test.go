package failoverapp

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmfailover/caddy-llm-failover/latency"
)

// The gauge shows learned deadlines only, in seconds: a kind or class
// with too few samples waits the configured timeout, which is config, not
// news. Two channels of one name report the longer deadline, so that the
// series stay unique.
func TestLearnedDeadlineGauge(t *testing.T) {
	now := time.Now()
	small, large := latency.ClassOf(1000, 500), latency.ClassOf(200<<10, 0)
	alpha := learningChannel("alpha")
	for range 60 {
		// 3 × p99 of 100 ms is below the 5 s floor, and of a 1 s pause
		// below the 20 s stall floor.
		alpha.Latency.Observe(latency.Header, small, 100*time.Millisecond, latency.DefaultWindow, now)
		alpha.Latency.Observe(latency.Gap, small, time.Second, latency.DefaultWindow, now)
	}
	for range 10 {
		alpha.Latency.Observe(latency.FirstContent, large, 2*time.Second, latency.DefaultWindow, now)
	}
	otherKeys := learningChannel("alpha")
	for range 60 {
		// 3 × p99 of 25 s is above the one-minute gap ceiling.
		otherKeys.Latency.Observe(latency.Gap, small, 25*time.Second, latency.DefaultWindow, now)
	}
	notLearning := &Channel{Name: "beta", Latency: latency.NewLearner()}
	for range 60 {
		notLearning.Latency.Observe(latency.Header, small, time.Second, latency.DefaultWindow, now)
	}
	c := learnedDeadlines{channels: func() []*Channel { return []*Channel{alpha, otherKeys, notLearning} }}
	want := `
# HELP caddy_llm_failover_learned_deadline_seconds Deadline learned per channel, kind of wait and request size class (prompt/output: s, m, l), for the kinds and classes with enough samples; the others wait the configured timeout.
# TYPE caddy_llm_failover_learned_deadline_seconds gauge
caddy_llm_failover_learned_deadline_seconds{channel="alpha",class="s/s",kind="gap"} 60
caddy_llm_failover_learned_deadline_seconds{channel="alpha",class="s/s",kind="header"} 5
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// The engine counts a learned deadline's cut by channel and kind.
func TestLearnedDeadlineFired(t *testing.T) {
	before := testutil.ToFloat64(learnedDeadlineFired.WithLabelValues("fired-test", "first_content"))
	LearnedDeadlineFired("fired-test", latency.FirstContent.String())
	LearnedDeadlineFired("fired-test", latency.FirstContent.String())
	if got := testutil.ToFloat64(learnedDeadlineFired.WithLabelValues("fired-test", "first_content")) - before; got != 2 {
		t.Errorf("counted %v cuts, want 2", got)
	}
}

// Caddy makes a registry per config load and a reload registers into it
// again: registering twice is no error, and a registry gathers without
// a running config.
func TestRegisterMetricsTwice(t *testing.T) {
	reg := prometheus.NewRegistry()
	for range 2 {
		if err := registerMetrics(reg); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
}
