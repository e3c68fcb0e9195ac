package failoverapp

import (
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
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
	Heartbeats  int       `json:"heartbeats"`
}

func jobsView() []JobView {
	out := []JobView{}
	for _, s := range caddykit.Jobs.Statuses() {
		v := JobView{
			Job: s.Name, Running: s.Running, LastStart: s.LastStart, LastSuccess: s.LastSuccess,
			LastError: s.LastError, LastErrorAt: s.LastErrorAt, DurationMS: float64(s.Duration.Microseconds()) / 1000,
			Runs: s.Runs, Failures: s.Failures, NextDue: s.NextDue, Overdue: s.Overdue, Heartbeats: s.Heartbeats,
		}
		if s.Every > 0 {
			v.Every = s.Every.String()
		}
		out = append(out, v)
	}
	return out
}
