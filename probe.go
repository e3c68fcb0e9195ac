package llmfailover

import (
	"bytes"
	"context"
	"fmt"
	"hash/fnv"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/breaker"
	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/history"
	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
	"github.com/llmfailover/caddy-llm-failover/internal/leader"
	"github.com/llmfailover/caddy-llm-failover/jobs"
	"github.com/llmfailover/caddy-llm-failover/provider"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// Probe defaults; a bare `probe` takes them.
const (
	DefaultProbeInterval  = 90 * time.Second
	DefaultProbeMaxTokens = 16 // GPT-5 refuses fewer
	DefaultProbePrompt    = "Say OK."
	DefaultProbeBudget    = "1"
)

// proberJob is the prober's name in the jobs view and for heartbeats.
const proberJob = "prober"

// ProbeConfig turns on synthetic checks of a model's channels. A channel
// is probed only when nobody else is telling about its health: when it
// had no real traffic for an interval, or when it is half-open (the probe
// is then the trial, so no client request is sent to a channel that may
// still be broken). A busy healthy channel is never probed.
type ProbeConfig struct {
	// Interval is how often an idle channel is probed. Default: 90s.
	Interval caddy.Duration `json:"interval,omitempty"`
	// MaxTokens caps the probe's output. Default: 16.
	MaxTokens int `json:"max_tokens,omitempty"`
	// Prompt is the probe's one user message. Default: "Say OK."
	Prompt string `json:"prompt,omitempty"`
	// Budget is what the probes of one channel may cost per UTC day, in
	// dollars, at the route's cost; once spent the channel is not probed
	// until the next day. Default: 1.
	Budget string `json:"budget,omitempty"`
}

// probePlan is a provisioned ProbeConfig.
type probePlan struct {
	interval  time.Duration
	maxTokens int
	prompt    string
	budget    wallet.Micros
}

func (c *ProbeConfig) plan() (*probePlan, error) {
	if c == nil {
		return nil, nil
	}
	p := &probePlan{interval: time.Duration(c.Interval), maxTokens: c.MaxTokens, prompt: c.Prompt}
	if p.interval == 0 {
		p.interval = DefaultProbeInterval
	}
	if p.maxTokens == 0 {
		p.maxTokens = DefaultProbeMaxTokens
	}
	if p.prompt == "" {
		p.prompt = DefaultProbePrompt
	}
	budget := c.Budget
	if budget == "" {
		budget = DefaultProbeBudget
	}
	var err error
	if p.budget, err = wallet.ParseMicros(budget); err != nil {
		return nil, fmt.Errorf("budget: %w", err)
	}
	switch {
	case p.interval < 0:
		return nil, fmt.Errorf("interval must not be negative")
	case p.maxTokens < 0:
		return nil, fmt.Errorf("max_tokens must not be negative")
	case p.budget < 0:
		return nil, fmt.Errorf("budget must not be negative")
	}
	return p, nil
}

// Probe outcomes, as the history, the status page and the logs show them.
const (
	probePassed      = "passed"
	probeFailed      = "failed"
	probeLimited     = "rate_limited"
	probeConfigError = "probe_config_error"
)

// probes is what the probes found and spent, process-wide like the
// breakers: a reload keeps the day's spend, so a reload loop cannot
// reset a budget.
var probes = &probeState{history: history.NewRecorder(), channels: map[string]*probeRecord{}}

type probeState struct {
	history *history.Recorder // probe attempts only, apart from real traffic
	mu      sync.Mutex
	// channels are keyed by channel name.
	channels map[string]*probeRecord
}

// probeRecord is one channel's last probe and today's probe spend.
type probeRecord struct {
	At      time.Time
	Model   string
	Result  string
	Reason  string
	Day     string // UTC date of Spent
	Spent   wallet.Micros
	Stopped bool // the day's budget is spent; logged once
}

func (s *probeState) record(channel string) *probeRecord {
	r := s.channels[channel]
	if r == nil {
		r = &probeRecord{}
		s.channels[channel] = r
	}
	return r
}

// view returns a copy of the channel's record, its day rolled at now.
func (s *probeState) view(channel string, now time.Time) (probeRecord, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.channels[channel]
	if !ok {
		return probeRecord{}, false
	}
	c := *r
	if c.Day != now.UTC().Format(time.DateOnly) {
		c.Spent, c.Stopped = 0, false
	}
	return c, true
}

// overBudget reports whether the channel's probes spent budget today; the
// first time it does, in a day, logOnce is called.
func (s *probeState) overBudget(channel string, budget wallet.Micros, now time.Time, logOnce func(spent wallet.Micros)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.record(channel)
	if day := now.UTC().Format(time.DateOnly); r.Day != day {
		r.Day, r.Spent, r.Stopped = day, 0, false
	}
	if r.Spent < budget {
		return false
	}
	if !r.Stopped {
		r.Stopped = true
		probeBudgetSpent.WithLabelValues(channel).Set(1)
		logOnce(r.Spent)
	}
	return true
}

func (s *probeState) finished(channel, model, result, reason string, cost wallet.Micros, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.record(channel)
	if day := at.UTC().Format(time.DateOnly); r.Day != day {
		r.Day, r.Spent, r.Stopped = day, 0, false
		probeBudgetSpent.WithLabelValues(channel).Set(0)
	}
	r.At, r.Model, r.Result, r.Reason = at, model, result, reason
	r.Spent += cost
	probeSpend.WithLabelValues(channel).Add(float64(cost) / 1e6)
}

// prober runs the synthetic checks of one config's handlers, as the job
// "prober". With an elector, only the instance holding the lock probes.
type prober struct {
	handlers []*Handler
	elector  *leader.Elector
	every    time.Duration
	logger   *zap.Logger

	mu   sync.Mutex
	last map[probeKey]time.Time // when each model's channel was last probed

	cancel context.CancelFunc
	done   chan struct{}

	// Only the round goroutine touches these.
	campaigned time.Time // when this instance last asked to lead
	leading    bool
}

type probeKey struct {
	h       *Handler
	model   string
	channel int
}

// proberLockKey is the advisory lock the probing instance holds.
func proberLockKey() int64 {
	f := fnv.New64a()
	_, _ = f.Write([]byte("caddy-llm-failover prober"))
	return int64(f.Sum64())
}

// newProber returns the prober of the handlers that probe a model, nil
// when none does.
func newProber(handlers []*Handler, logger *zap.Logger) *prober {
	p := &prober{logger: logger, last: map[probeKey]time.Time{}}
	for _, h := range handlers {
		probing := false
		for _, name := range h.modelList {
			if pp := h.models[name].probe; pp != nil {
				probing = true
				if p.every == 0 || pp.interval < p.every {
					p.every = pp.interval
				}
			}
		}
		if !probing {
			continue
		}
		p.handlers = append(p.handlers, h)
		if h.probeLeaderDSN != "" && p.elector == nil {
			p.elector = leader.New(h.probeLeaderDSN, proberLockKey())
		}
	}
	if len(p.handlers) == 0 {
		return nil
	}
	return p
}

// start runs a round every tick until stop.
func (p *prober) start() {
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel, p.done = cancel, make(chan struct{})
	job := caddykit.Jobs.Job(proberJob, p.every)
	go func() {
		defer close(p.done)
		// The tick is a fraction of the shortest interval, so that a
		// channel falls due at most a tick late.
		t := time.NewTicker(max(p.every/4, 10*time.Millisecond))
		defer t.Stop()
		for {
			_ = job.Run(ctx, p.round)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// stop ends the rounds, waits for the one running and gives up the lock.
func (p *prober) stop() {
	if p.cancel == nil {
		return
	}
	p.cancel()
	<-p.done
	if p.elector != nil {
		p.elector.Resign()
	}
}

// round probes every channel that is due, concurrently, and waits for them.
func (p *prober) round(ctx context.Context) (summary jobs.Summary, err error) {
	if p.elector != nil {
		// Once per interval, not per tick: a follower's campaign opens a
		// connection. A dead leader is replaced within an interval.
		if time.Since(p.campaigned) >= p.every {
			p.campaigned = time.Now()
			lead, err := p.elector.Campaign(ctx)
			if err != nil {
				p.leading = false
				p.logger.Warn("prober: leader election failed; not probing", zap.Error(err))
				return "", err
			}
			p.leading = lead
		}
		if !p.leading {
			return "another instance probes", nil
		}
	}
	now := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	counts := map[string]int{}
	for _, h := range p.handlers {
		for _, name := range h.modelList {
			m := h.models[name]
			if m.probe == nil {
				continue
			}
			for i := range m.chain.Routes {
				route := &m.chain.Routes[i]
				key := probeKey{h, name, route.Channel}
				if !p.due(h, m, key, now) {
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					result, sent := h.probeChannel(ctx, name, m, route)
					if !sent {
						return // the trial slots are taken by clients
					}
					p.mu.Lock()
					p.last[key] = now
					p.mu.Unlock()
					mu.Lock()
					counts[result]++
					mu.Unlock()
				}()
			}
		}
	}
	wg.Wait()
	return jobs.Summary(fmt.Sprintf("probes: %d passed, %d failed, %d rate limited, %d config errors",
		counts[probePassed], counts[probeFailed], counts[probeLimited], counts[probeConfigError])), nil
}

// due decides whether the model's channel is probed now: its interval
// has passed since its last probe, its breaker says nobody else is
// telling about its health, a probe can be written for it and its daily
// budget is not spent. The probe's walk then admits it like any request:
// a half-open channel's trial slot, so that no client request is sent to
// it while the probe tells whether it recovered.
func (p *prober) due(h *Handler, m *model, key probeKey, now time.Time) bool {
	ch := h.channels[key.channel]
	interval := m.probe.interval
	p.mu.Lock()
	last := p.last[key]
	p.mu.Unlock()
	if now.Sub(last) < interval {
		return false
	}
	switch ch.state.breaker.State(now) {
	case breaker.Open, breaker.Parked:
		// Nobody may be sent; the probe comes once the cooldown ends.
		return false
	case breaker.Closed:
		if now.Sub(ch.state.lastTraffic()) < interval {
			return false // real traffic tells already
		}
	}
	if _, ok := provider.ProbeAPI(ch.adapter); !ok {
		return false
	}
	return !probes.overBudget(ch.name, m.probe.budget, now, func(spent wallet.Micros) {
		h.logger.Warn("daily probe budget spent; no more probes of this channel today",
			zap.String("channel", ch.name), zap.String("spent", spent.String()), zap.String("budget", m.probe.budget.String()))
	})
}

// probeChannel sends one synthetic check through the same walk as client
// traffic (admission, adapter, timers, stream gate, breaker, metrics) and
// reports its result; ok is false when the channel's breaker admitted
// nothing (its trial slots are taken by clients). The answer goes to a
// ResponseWriter that keeps only its status.
func (h *Handler) probeChannel(ctx context.Context, modelName string, m *model, route *chain.Route) (result string, ok bool) {
	ch := h.channels[route.Channel]
	api, _ := provider.ProbeAPI(ch.adapter)
	path, hdr, body, err := provider.ProbeRequest(api, modelName, m.probe.prompt, m.probe.maxTokens)
	if err != nil {
		h.logger.Error("building a probe", zap.String("channel", ch.name), zap.Error(err))
		return probeConfigError, true
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://probe.invalid"+path, bytes.NewReader(body))
	if err != nil {
		return probeConfigError, true
	}
	r.Header = hdr
	x := newExchange(&probeWriter{header: http.Header{}}, r, api, modeSynthetic)
	x.model = m
	x.body, _ = api.AskUsage(body, provider.Request{}) // the probe pays for what it used
	if x.req, err = api.ParseRequest(x.body); err != nil {
		return probeConfigError, true
	}
	if h.wallet != nil {
		// The operator's system account pays for probes.
		rt := *h.wallet
		rt.account = h.ProbeAccount
		x.repl = caddy.NewReplacer()
		bill, refusal := rt.admit(x, false)
		if refusal != nil {
			h.logger.Warn("probe account refused; probe not sent", zap.String("channel", ch.name),
				zap.String("account", h.ProbeAccount), zap.String("reason", refusal.Message))
			return probeConfigError, true
		}
		x.bill = bill
		defer x.bill.close()
	}
	began := time.Now()
	end := h.walk(x, []*chain.Route{route}, nil, began.Add(min(time.Duration(h.Deadline), m.probe.interval)))
	if x.attempts == 0 {
		return "", false
	}
	result, reason := probeOutcome(end)
	var cost wallet.Micros
	if meter := x.meter; meter != nil {
		u := meter.Usage()
		cost = wallet.Price{Input: wallet.Micros(route.InputCost), Output: wallet.Micros(route.OutputCost)}.Cost(u.Input, u.Output)
	}
	at := time.Now()
	probes.finished(ch.name, modelName, result, reason, cost, at)
	probes.history.Record(history.Attempt{At: at, Model: modelName, Channel: ch.name, Class: probeClass(result), Reason: reason, TTFT: ttftOf(x, began)})
	probesTotal.WithLabelValues(ch.name, result).Inc()
	if result != probePassed {
		h.logger.Warn("probe did not pass", zap.String("model", modelName), zap.String("channel", ch.name),
			zap.String("result", result), zap.String("reason", reason))
	}
	return result, true
}

// judgeSynthetic judges a probe's attempt before it is recorded: it
// passes only when content was committed with a 2xx; a 400 or 422 (or an
// in-stream refusal) is the probe's own parameters, not the channel, and
// is not recorded; any other refusal a client would get passed through
// (401, 403, 404) is the channel failing, and becomes a failure for the
// breaker.
func judgeSynthetic(x *exchange, res attemptResult) (judged attemptResult, record bool) {
	switch {
	case res.verdict == passed && (res.status == http.StatusBadRequest || res.status == http.StatusUnprocessableEntity):
		return res, false
	case res.verdict == passed:
		return retryWith(&failure{reason: reasonStatus, status: res.status}), true
	case res.verdict == served && x.committedAt.IsZero():
		return retryWith(&failure{reason: reasonClosedEarly}), true
	}
	return res, true
}

// probeOutcome is a probe's result and its reason, from how its walk
// ended.
func probeOutcome(end walkEnd) (result, reason string) {
	res := end.res
	if !end.answered {
		res = retryWith(end.last)
	}
	switch {
	case res.verdict == passed:
		return probeConfigError, fmt.Sprintf("%s %d", reasonStatus, res.status)
	case res.verdict == clientGone:
		return probeFailed, "stopped"
	case res.fail != nil && res.fail.status == http.StatusTooManyRequests:
		return probeLimited, string(res.fail.reason)
	case res.fail != nil:
		return probeFailed, res.fail.String()
	}
	return probePassed, ""
}

func probeClass(result string) history.Class {
	switch result {
	case probePassed:
		return history.Success
	case probeLimited:
		return history.Limited
	case probeConfigError:
		return history.Client
	}
	return history.Down
}

func ttftOf(x *exchange, began time.Time) time.Duration {
	if x.committedAt.IsZero() {
		return 0
	}
	return x.committedAt.Sub(began)
}

// probeWriter is a probe's ResponseWriter: it keeps the status and
// discards the body, whose tokens the meter has counted on the way.
type probeWriter struct {
	header http.Header
	status int
}

func (w *probeWriter) Header() http.Header { return w.header }
func (w *probeWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func (w *probeWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return len(p), nil
}

// Flush lets the stream gate flush as it does to a client.
func (w *probeWriter) Flush() {}

// Interface guards
var _ http.Flusher = (*probeWriter)(nil)

// unmarshalProbe reads `probe [{ interval <d>; max_tokens <n>; prompt <text>; budget <dollars> }]`.
func unmarshalProbe(d *caddyfile.Dispenser) (*ProbeConfig, error) {
	if err := caddykit.NoMoreArgs(d); err != nil {
		return nil, err
	}
	p := &ProbeConfig{}
	seen := caddykit.Seen{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if err := seen.Once(d, "probe: "); err != nil {
			return nil, err
		}
		var err error
		switch d.Val() {
		case "interval":
			if p.Interval, err = caddykit.DurationArg(d); err == nil {
				err = caddykit.NoMoreArgs(d)
			}
		case "max_tokens":
			if p.MaxTokens, err = caddykit.IntArg(d, 1); err == nil {
				err = caddykit.NoMoreArgs(d)
			}
		case "prompt":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return nil, d.ArgErr()
			}
			p.Prompt = strings.Join(args, " ")
		case "budget":
			if !d.NextArg() {
				return nil, d.ArgErr()
			}
			p.Budget = d.Val()
			err = caddykit.NoMoreArgs(d)
		default:
			return nil, d.Errf("unrecognized probe option '%s' (want interval, max_tokens, prompt or budget)", d.Val())
		}
		if err != nil {
			return nil, err
		}
	}
	return p, nil
}

// probeView is a channel's synthetic checks on the status page.
type probeView struct {
	Windows    map[string]windowView `json:"windows"`
	LastAt     time.Time             `json:"last_at"`
	LastResult string                `json:"last_result"`
	LastReason string                `json:"last_reason,omitempty"`
	// SpentToday is what today's (UTC) probes cost, in dollars.
	SpentToday    string `json:"spent_today"`
	BudgetStopped bool   `json:"budget_stopped"`
}

func probeViewOf(channel string, now time.Time) *probeView {
	rec, ok := probes.view(channel, now)
	if !ok || rec.At.IsZero() {
		return nil
	}
	return &probeView{Windows: windowsOf(probes.history.Channel(channel, now, durations()...)),
		LastAt: rec.At.UTC(), LastResult: rec.Result, LastReason: rec.Reason,
		SpentToday: rec.Spent.String(), BudgetStopped: rec.Stopped}
}
