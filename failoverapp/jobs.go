package failoverapp

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
	"github.com/llmfailover/caddy-llm-failover/walletapp"
)

// JobView is one background job in GET /llm_failover/jobs. Heartbeat
// receivers are counted, never shown: their URLs are secrets.
type JobView struct {
	Job         string    `json:"job"`
	Every       string    `json:"every,omitempty"`
	Running     bool      `json:"running"`
	LastStart   time.Time `json:"last_start,omitzero"`
	LastSuccess time.Time `json:"last_success,omitzero"`
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
	DurationMS  float64   `json:"duration_ms"`
	Runs        uint64    `json:"runs"`
	Failures    uint64    `json:"failures"`
	NextDue     time.Time `json:"next_due,omitzero"`
	Overdue     bool      `json:"overdue"`
	Hung        bool      `json:"hung"`
	Heartbeats  int       `json:"heartbeats"`
}

func jobsView() []JobView {
	out := []JobView{}
	for _, s := range caddykit.Jobs.Statuses() {
		v := JobView{
			Job: s.Name, Running: s.Running, LastStart: s.LastStart, LastSuccess: s.LastSuccess,
			LastError: s.LastError, LastErrorAt: s.LastErrorAt, DurationMS: float64(s.Duration.Microseconds()) / 1000,
			Runs: s.Runs, Failures: s.Failures, NextDue: s.NextDue, Overdue: s.Overdue, Hung: s.Hung, Heartbeats: s.Heartbeats,
		}
		if s.Every > 0 {
			v.Every = s.Every.String()
		}
		out = append(out, v)
	}
	return out
}

// wallets is this config's wallet app, nil when it has none.
func (a *App) wallets() *walletapp.App {
	if app, err := a.ctx.AppIfConfigured("llm_wallet"); err == nil {
		return app.(*walletapp.App)
	}
	return nil
}

// checkHeartbeatNames refuses, while the config provisions (so `caddy
// validate` says so), a heartbeat whose job no config could run: not
// prober, history_flush or idempotency_sweep, nor a wallet job of a wallet this config
// declares ("default" when it declares none). A receiver of a misspelt
// job is never pinged, and a Healthchecks-style receiver never alerts on
// a check it was never pinged on.
func (a *App) checkHeartbeatNames() error {
	wallets := []string{walletapp.DefaultName}
	if w := a.wallets(); w != nil && len(w.Names()) > 0 {
		wallets = w.Names()
	}
	possible := []string{ProberJob, HistoryFlushJob, IdempotencySweepJob}
	for _, w := range wallets {
		possible = append(possible, walletapp.JobNames(w)...)
	}
	for _, hb := range a.Heartbeats {
		if !slices.Contains(possible, hb.Job) {
			return fmt.Errorf("heartbeat %q: no such job; the jobs this config can run are %s", hb.Job, strings.Join(possible, ", "))
		}
	}
	return nil
}

// checkHeartbeatJobs refuses, at Start (once every handler has
// registered its probes and its wallet), a heartbeat of a job this
// config does not run: the prober without a probe, history_flush without
// a history store, a wallet job of a wallet that is not used.
func (a *App) checkHeartbeatJobs() error {
	var running []string
	for _, t := range a.probes {
		if len(t.Routes()) > 0 {
			running = append(running, ProberJob)
			break
		}
	}
	if a.history != nil {
		running = append(running, HistoryFlushJob)
	}
	if len(a.idempotencyKeys) > 0 {
		running = append(running, IdempotencySweepJob)
	}
	if w := a.wallets(); w != nil {
		for _, name := range w.Names() {
			running = append(running, walletapp.JobNames(name)...)
		}
	}
	for _, hb := range a.Heartbeats {
		if slices.Contains(running, hb.Job) {
			continue
		}
		why := map[string]string{
			ProberJob:           "no model of this config has a probe block",
			HistoryFlushJob:     "this config has no history store (llm_failover { history ... })",
			IdempotencySweepJob: "no model of this config is idempotent",
		}[hb.Job]
		if why == "" {
			why = "no handler of this config bills to that wallet"
		}
		runs := "none"
		if len(running) > 0 {
			runs = strings.Join(running, ", ")
		}
		return fmt.Errorf("heartbeat %q: the job does not run: %s; the jobs this config runs: %s", hb.Job, why, runs)
	}
	return nil
}
