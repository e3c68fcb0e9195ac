package breaker

import (
	"errors"
	"fmt"
	"time"
)

// Defaults from the failover spec; see the package documentation for why.
const (
	DefaultWindow   = 5 * time.Minute
	DefaultFailures = 3
	DefaultCooldown = 60 * time.Second
	DefaultMaxPark  = 5 * time.Minute
	// DefaultPark is how long a rate limit that names no wait parks a
	// channel: long enough to stop hammering a quota, short enough that a
	// per-minute quota is tried again within its minute.
	DefaultPark   = 10 * time.Second
	DefaultTrials = 1
)

// MaxFailures bounds Config.Failures: the failure timestamps live in a
// fixed ring of this size so memory per channel is constant.
const MaxFailures = 64

// ringSize is the number of outcomes the success-rate ring remembers, and
// therefore the ceiling on Config.MinCalls.
const ringSize = 100

// ErrInvalidConfig is wrapped by every error Validate returns so callers can
// tell configuration mistakes apart with errors.Is.
var ErrInvalidConfig = errors.New("invalid breaker config")

// Config tunes a Breaker. Zero fields take the package defaults.
type Config struct {
	// Window is how far back outage failures count toward tripping.
	Window time.Duration
	// Failures is the number of failures inside Window that trips the
	// breaker (1..MaxFailures).
	Failures int
	// Cooldown is how long the channel stays open after a trip.
	Cooldown time.Duration

	// MinCalls enables ratio mode when > 0: the breaker also needs at
	// least MinCalls recorded outcomes (max 100) whose failure share is
	// at least FailureRatio.
	MinCalls int
	// FailureRatio is the failure share (0 < r <= 1) ratio mode requires.
	// It is ignored when MinCalls is 0.
	FailureRatio float64

	// MaxPark caps how long a Retry-After can park the channel.
	MaxPark time.Duration
	// Park is how long a rate limit parks the channel when the upstream
	// says nothing of when to come back (ParkFor).
	Park time.Duration
	// Trials is how many requests a half-open channel (or the last resort
	// of an open one) may have in flight at once; every other request is
	// refused until one of them ends.
	Trials int
}

// WithDefaults returns c with every zero field set to its default. Negative
// values are left alone so Validate can report them.
func (c Config) WithDefaults() Config {
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.Failures == 0 {
		c.Failures = DefaultFailures
	}
	if c.Cooldown == 0 {
		c.Cooldown = DefaultCooldown
	}
	if c.MaxPark == 0 {
		c.MaxPark = DefaultMaxPark
	}
	if c.Park == 0 {
		c.Park = DefaultPark
	}
	if c.Trials == 0 {
		c.Trials = DefaultTrials
	}
	return c
}

// Validate reports every problem with c after defaults are applied, so a
// zero field is fine but a negative one is not.
func (c Config) Validate() error {
	d := c.WithDefaults()
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if d.Window < 0 {
		bad("window must be positive, got %s", d.Window)
	}
	if d.Failures < 1 || d.Failures > MaxFailures {
		bad("failures must be between 1 and %d, got %d", MaxFailures, d.Failures)
	}
	if d.Cooldown < 0 {
		bad("cooldown must be positive, got %s", d.Cooldown)
	}
	if d.MaxPark < 0 {
		bad("max_park must be positive, got %s", d.MaxPark)
	}
	if d.Park < 0 {
		bad("park must be positive, got %s", d.Park)
	}
	if d.Trials < 1 {
		bad("trials must be at least 1, got %d", d.Trials)
	}
	if d.MinCalls < 0 || d.MinCalls > ringSize {
		bad("min_calls must be between 0 and %d, got %d", ringSize, d.MinCalls)
	}
	// The negated form also rejects NaN, which fails every comparison.
	if d.MinCalls > 0 && !(d.FailureRatio > 0 && d.FailureRatio <= 1) {
		bad("failure_ratio must be in (0, 1] when min_calls is set, got %v", d.FailureRatio)
	}
	return errors.Join(errs...)
}

// sanitize makes any Config usable. New and SetConfig have no error return,
// so instead of failing they fall back to defaults or the nearest legal
// value; provisioning code is expected to call Validate first.
func (c Config) sanitize() Config {
	c = c.WithDefaults()
	if c.Window < 0 {
		c.Window = DefaultWindow
	}
	if c.Cooldown < 0 {
		c.Cooldown = DefaultCooldown
	}
	if c.MaxPark < 0 {
		c.MaxPark = DefaultMaxPark
	}
	if c.Park < 0 {
		c.Park = DefaultPark
	}
	c.Failures = min(max(c.Failures, 1), MaxFailures)
	c.Trials = max(c.Trials, 1)
	c.MinCalls = min(max(c.MinCalls, 0), ringSize)
	if c.MinCalls > 0 && !(c.FailureRatio > 0 && c.FailureRatio <= 1) {
		// A broken ratio must not silently turn into "never open".
		c.MinCalls = 0
	}
	return c
}
