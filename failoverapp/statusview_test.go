package failoverapp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/history"
	"github.com/llmfailover/caddy-llm-failover/journal"
	"github.com/llmfailover/caddy-llm-failover/latency"
)

// A window's JSON carries its input and cache-read tokens and their
// share; without input tokens the share is absent, never 0 or NaN.
func TestWindowCacheReadShare(t *testing.T) {
	for _, tc := range []struct {
		c    history.Counts
		want string
	}{
		{history.Counts{Attempts: 2, Successes: 2, InputTokens: 1000, CacheReadTokens: 250},
			`"input_tokens":1000,"cache_read_tokens":250,"cache_read_share":0.25}`},
		{history.Counts{Attempts: 1, Successes: 1, InputTokens: 40},
			`"input_tokens":40,"cache_read_tokens":0,"cache_read_share":0}`},
		{history.Counts{Attempts: 1, Successes: 1}, `"input_tokens":0,"cache_read_tokens":0}`},
		{history.Counts{}, `"input_tokens":0,"cache_read_tokens":0}`},
	} {
		b, err := json.Marshal(windowOf(tc.c))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(string(b), tc.want) {
			t.Errorf("%+v: %s, want it to end %s", tc.c, b, tc.want)
		}
	}
}

// A window's success rate is null in JSON when no attempt judged the
// upstreams (none, or client errors only): no data, as the page's "–",
// never 1.
func TestWindowSuccessRateWithoutVerdict(t *testing.T) {
	for _, tc := range []struct {
		c    history.Counts
		want string
	}{
		{history.Counts{}, `"success_rate":null`},
		{history.Counts{Attempts: 3, Client: 3}, `"success_rate":null`},
		{history.Counts{Attempts: 4, Successes: 3, Down: 1}, `"success_rate":0.75`},
	} {
		b, _ := json.Marshal(windowOf(tc.c))
		if !strings.Contains(string(b), tc.want) {
			t.Errorf("%+v: %s, want %s", tc.c, b, tc.want)
		}
		bars, _ := json.Marshal(barsOf([]history.Bar{{Counts: tc.c}}))
		if !strings.Contains(string(bars), tc.want) {
			t.Errorf("bar %+v: %s, want %s", tc.c, bars, tc.want)
		}
	}
}

func learningChannel(name string) *Channel {
	ch := &Channel{Name: name, Breaker: breaker.New(breaker.Config{Failures: 3, Window: time.Minute, Cooldown: time.Minute, Trials: 1}),
		Latency: latency.NewLearner()}
	ch.learning.Store(&Learning{Config: latency.Config{}.WithDefaults(), Ceilings: [latency.NumKinds]time.Duration{30 * time.Second, 30 * time.Second, time.Minute}})
	return ch
}

// A channel whose deadlines are learned shows them, per kind and size
// class it has observations of, learned or still the configured timeout;
// a channel no handler learns shows none, not an empty list.
func TestStatusViewShowsLearnedDeadlines(t *testing.T) {
	now := time.Now()
	small := latency.ClassOf(1000, 500)
	learning := learningChannel("alpha")
	for range 60 {
		learning.Latency.Observe(latency.Header, small, 100*time.Millisecond, latency.DefaultWindow, now)
	}
	for range 10 {
		learning.Latency.Observe(latency.FirstContent, small, 2*time.Second, latency.DefaultWindow, now)
	}
	plain := &Channel{Name: "beta", Breaker: breaker.New(breaker.Config{Failures: 3, Window: time.Minute, Cooldown: time.Minute, Trials: 1}),
		Latency: latency.NewLearner()}
	plain.Latency.Observe(latency.Header, small, time.Second, latency.DefaultWindow, now)
	a := modelApp(t, now, []chain.Route{{Channel: 0, Name: "alpha"}, {Channel: 1, Name: "beta", InputCost: 1}}, learning, plain)

	b, err := json.Marshal(a.statusView(now, "t", false))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Models []struct {
			Channels []struct {
				Name             string            `json:"name"`
				LearnedDeadlines []json.RawMessage `json:"learned_deadlines"`
			} `json:"channels"`
		} `json:"models"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Models) != 1 || len(got.Models[0].Channels) != 2 {
		t.Fatalf("view: %s", b)
	}
	// The sketch rounds durations up to its buckets: the expected
	// quantiles are its own. 3 × p99 of 100 ms is below the 5 s floor.
	quantile := func(k latency.Kind, q float64) int64 {
		d, _ := learning.Latency.Quantile(k, small, q, latency.DefaultWindow, now)
		return d.Milliseconds()
	}
	want := []string{
		fmt.Sprintf(`{"kind":"header","class":"s/s","limit_ms":5000,"learned":true,"quantile_ms":%d,"percentile":99,"samples":60,"median_ms":%d}`,
			quantile(latency.Header, 0.99), quantile(latency.Header, 0.5)),
		fmt.Sprintf(`{"kind":"first_content","class":"s/s","limit_ms":30000,"learned":false,"quantile_ms":0,"percentile":99,"samples":10,"median_ms":%d}`,
			quantile(latency.FirstContent, 0.5)),
	}
	for _, c := range got.Models[0].Channels {
		switch c.Name {
		case "alpha":
			if len(c.LearnedDeadlines) != len(want) {
				t.Fatalf("alpha: %d learned deadlines, want %d: %s", len(c.LearnedDeadlines), len(want), b)
			}
			for i, w := range want {
				if string(c.LearnedDeadlines[i]) != w {
					t.Errorf("alpha deadline %d: %s, want %s", i, c.LearnedDeadlines[i], w)
				}
			}
		case "beta":
			if c.LearnedDeadlines != nil {
				t.Errorf("beta learns nothing, yet shows %s", c.LearnedDeadlines)
			}
		}
	}
	if bytes.Count(b, []byte(`"learned_deadlines"`)) != 1 {
		t.Errorf("learned_deadlines should appear for alpha only: %s", b)
	}
	if hidden, _ := json.Marshal(a.statusView(now, "t", true)); bytes.Contains(hidden, []byte("learned_deadlines")) {
		t.Errorf("a public page shows learned deadlines: %s", hidden)
	}
}

// A model is down while none of its channels may be sent anything: a
// half-open channel whose trial slots are all taken (its trial is under
// way, every other request is refused with 503) is no working channel.
// The model must not read operational then, beside its own ongoing "no
// working channel" incident.
func TestStatusViewModelDownWhileItsTrialSlotIsTaken(t *testing.T) {
	now := time.Now()
	ch := &Channel{Name: "only", Breaker: breaker.New(breaker.Config{Failures: 1, Window: time.Minute, Cooldown: time.Second, Trials: 1}),
		Latency: latency.NewLearner()}
	a := modelApp(t, now, []chain.Route{{Channel: 0, Name: ch.Name}}, ch)
	a.transitioned(ch, ch.Breaker.RecordFailure(now), "status")

	trial := now.Add(2 * time.Second)
	ticket, ok := ch.Breaker.Admit(trial)
	if !ok || !ticket.Trial() {
		t.Fatalf("no trial admitted after the cooldown")
	}
	defer ticket.Done()
	if ch.Breaker.Available(trial) {
		t.Fatal("the breaker admits more than its one trial")
	}
	v := a.statusView(trial, "t", false)
	if got := v.Models[0].Status; got != StatusDown {
		t.Errorf("model %s while its only channel's one trial slot is taken, want down", got)
	}
}

// modelApp is an app whose one model "m" routes over chs, as a handler
// would register them, with an in-memory status started at now.
func modelApp(t *testing.T, now time.Time, routes []chain.Route, chs ...*Channel) *App {
	t.Helper()
	m, err := chain.New("m", chain.Cost, len(routes), routes)
	if err != nil {
		t.Fatal(err)
	}
	a := &App{logger: zap.NewNop(), status: &statusState{history: history.NewRecorder(), journal: journal.New(journal.DefaultSize),
		since: map[string]time.Time{}, started: now}}
	for _, ch := range chs {
		a.channels = append(a.channels, &registeredChannel{ch: ch})
	}
	a.Model(Model{Chain: m, Channels: chs})
	return a
}
