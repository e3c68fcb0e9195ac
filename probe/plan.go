// Package probe schedules synthetic checks (probes) of the channels that
// serve a model: which is due (its interval has passed, nothing else tells
// about its channel's health, its daily budget is not spent), rounds of
// them, and on a fleet sharing a database, only on the instance that
// leads. It keeps the process's record of what probes found and spent.
//
// It knows a Target, which sends a probe and judges its answer, never
// the handler that implements one; it knows nothing of Caddy, HTTP or
// the wallet's stores.
package probe

import (
	"errors"
	"fmt"
	"time"

	"github.com/llmfailover/caddy-llm-failover/history"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// Defaults; a bare `probe` takes them.
const (
	DefaultInterval  = 90 * time.Second
	DefaultMaxTokens = 16 // GPT-5 refuses fewer
	DefaultPrompt    = "Say OK."
	DefaultBudget    = "1"
)

// Plan is one model's synthetic checks, defaults applied.
type Plan struct {
	// Interval is how often an idle channel is probed.
	Interval time.Duration
	// MaxTokens caps a probe's output.
	MaxTokens int
	// Prompt is a probe's one user message.
	Prompt string
	// Budget is what the probes of one channel may cost per UTC day.
	Budget wallet.Micros
}

// NewPlan applies the defaults to zero values and checks the rest;
// budget is in dollars, as an exact decimal.
func NewPlan(interval time.Duration, maxTokens int, prompt, budget string) (Plan, error) {
	p := Plan{Interval: interval, MaxTokens: maxTokens, Prompt: prompt}
	if p.Interval == 0 {
		p.Interval = DefaultInterval
	}
	if p.MaxTokens == 0 {
		p.MaxTokens = DefaultMaxTokens
	}
	if p.Prompt == "" {
		p.Prompt = DefaultPrompt
	}
	if budget == "" {
		budget = DefaultBudget
	}
	var err error
	if p.Budget, err = wallet.ParseMicros(budget); err != nil {
		return Plan{}, fmt.Errorf("budget: %w", err)
	}
	switch {
	case p.Interval < 0:
		return Plan{}, errors.New("interval must not be negative")
	case p.MaxTokens < 0:
		return Plan{}, errors.New("max_tokens must not be negative")
	case p.Budget < 0:
		return Plan{}, errors.New("budget must not be negative")
	}
	return p, nil
}

// Outcome is what a probe found, as the history, the status page, the
// metrics and the logs show it.
type Outcome string

const (
	// Passed: content committed with a 2xx.
	Passed Outcome = "passed"
	// Failed: the channel failed the probe; it opens at once.
	Failed Outcome = "failed"
	// Limited: the channel rate-limited the probe.
	Limited Outcome = "rate_limited"
	// ConfigError: the probe itself was refused (its parameters, or the
	// probe account), which says nothing of the channel.
	ConfigError Outcome = "probe_config_error"
)

// Class is what the outcome says about the channel, for the history.
func (o Outcome) Class() history.Class {
	switch o {
	case Passed:
		return history.Success
	case Limited:
		return history.Limited
	case ConfigError:
		return history.Client
	}
	return history.Down
}
