// Package chain turns a model's configured routes into the ordered list of
// channels one request will try. It never crosses models: every route of a
// Model serves that model, so failing over along a chain can never answer
// with a different model than the client asked for.
//
// Two policies exist. Cost (the default) is static and readable: routes
// sorted by price, the same chain for every client. Weighted orders routes by
// a configured weight scaled by each channel's rolling success rate, so a
// degrading channel sinks below its backup as its calls fail and climbs
// back as they succeed.
package chain

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"time"
)

// Policy selects how a model's routes are ordered.
type Policy uint8

const (
	// Cost tries the cheapest route first (input + output price per
	// million tokens; ties keep the order in which routes were written).
	Cost Policy = iota
	// Weighted tries routes by weight × success rate².
	Weighted
)

func (p Policy) String() string {
	if p == Weighted {
		return "weighted"
	}
	return "cost"
}

// ParsePolicy parses "cost" or "weighted"; "" means cost.
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "", "cost":
		return Cost, nil
	case "weighted":
		return Weighted, nil
	}
	return Cost, fmt.Errorf("unknown policy %q (want cost or weighted)", s)
}

// Route is one channel that serves a model.
type Route struct {
	// Channel is the index of the channel in the caller's channel table;
	// Name is its name, for logs and status.
	Channel int
	Name    string
	// InputCost and OutputCost are prices per million tokens in the
	// caller's integer money unit.
	InputCost, OutputCost int64
	// UpstreamModel is the name this channel knows the model by, when it
	// differs (a dated snapshot, a deployment name).
	UpstreamModel string
	// Weight is the configured weight under the weighted policy (default 1).
	Weight int
}

// Model is one model's resolved chain.
type Model struct {
	Name    string
	Policy  Policy
	MaxHops int
	// Explore is the share of requests, under the weighted policy, that
	// try a lower-ranked available route first, so that a recovering
	// channel gets the traffic it needs to prove itself.
	Explore float64
	// Routes are sorted by cost (the order the cost policy uses).
	Routes []Route
}

// DefaultExplore is the share of weighted traffic that explores.
const DefaultExplore = 0.05

// New builds a model's chain, sorting routes cheapest first.
func New(name string, policy Policy, maxHops int, routes []Route) (*Model, error) {
	if len(routes) == 0 {
		return nil, fmt.Errorf("model %q has no routes", name)
	}
	if len(routes) > MaxRoutes {
		return nil, fmt.Errorf("model %q has %d routes; at most %d are allowed", name, len(routes), MaxRoutes)
	}
	if maxHops < 1 {
		return nil, fmt.Errorf("model %q: max hops must be at least 1, got %d", name, maxHops)
	}
	sorted := append([]Route(nil), routes...)
	sort.SliceStable(sorted, func(i, j int) bool {
		return sorted[i].InputCost+sorted[i].OutputCost < sorted[j].InputCost+sorted[j].OutputCost
	})
	for i := range sorted {
		if sorted[i].Weight <= 0 {
			sorted[i].Weight = 1
		}
	}
	return &Model{Name: name, Policy: policy, MaxHops: maxHops, Explore: DefaultExplore, Routes: sorted}, nil
}

// Health is what the chain needs to know about channels, by index.
type Health interface {
	// Available reports whether the channel may be sent a request now.
	Available(channel int, now time.Time) bool
	// ReadyAt reports when an unavailable channel becomes available, and
	// whether it is held back by a rate limit (parked: the upstream asked
	// for no requests until then, whether or not it is also open) rather
	// than by failures alone (open).
	ReadyAt(channel int, now time.Time) (at time.Time, parked bool)
	// SuccessRate is the channel's rolling success rate in [0, 1].
	SuccessRate(channel int) float64
}

// Plan is the outcome of planning one request.
type Plan struct {
	// Candidates are the routes to try, in order.
	Candidates []*Route
	// Skipped are routes left out because their channel was unavailable.
	Skipped []*Route
	// LastResorts are set only when no candidate is left: the open
	// channels that are not parked, the one whose cooldown ends first
	// first. Failing every request untried would turn the breakers into
	// an outage of their own, so the caller may send one of them a last
	// resort (the breaker decides whether it may); rate limits, which the
	// upstream asked us to honour, are never overridden.
	LastResorts []*Route
	// RetryAt is set only when no candidate is left: when the first of
	// the skipped channels becomes available, for a Retry-After.
	RetryAt time.Time
}

// MaxRoutes is the most routes one model may have.
const MaxRoutes = 16

// Scratch is the memory one Plan uses; a caller keeps it on its stack so
// that planning allocates nothing.
type Scratch struct {
	order, cands, skipped, lastResorts [MaxRoutes]*Route
	lastResortAt                       [MaxRoutes]time.Time
}

// Plan orders the routes for one request. The Plan's slices point into s.
func (m *Model) Plan(h Health, now time.Time, s *Scratch) Plan {
	order := s.order[:0]
	for i := range m.Routes {
		order = append(order, &m.Routes[i])
	}
	if m.Policy == Weighted {
		m.weigh(order, h)
	}
	p := Plan{Candidates: s.cands[:0], Skipped: s.skipped[:0]}
	for _, r := range order {
		if len(p.Candidates) == m.MaxHops {
			break
		}
		if h.Available(r.Channel, now) {
			p.Candidates = append(p.Candidates, r)
		} else {
			p.Skipped = append(p.Skipped, r)
		}
	}
	if len(p.Candidates) > 0 {
		return p
	}
	p.LastResorts = s.lastResorts[:0]
	for _, r := range p.Skipped {
		at, parked := h.ReadyAt(r.Channel, now)
		if p.RetryAt.IsZero() || at.Before(p.RetryAt) {
			p.RetryAt = at
		}
		if parked {
			continue
		}
		// Insertion by readiness; ties keep the chain's order.
		i := len(p.LastResorts)
		p.LastResorts = append(p.LastResorts, r)
		for ; i > 0 && at.Before(s.lastResortAt[i-1]); i-- {
			p.LastResorts[i], s.lastResortAt[i] = p.LastResorts[i-1], s.lastResortAt[i-1]
		}
		p.LastResorts[i], s.lastResortAt[i] = r, at
	}
	return p
}

// Score is a route's rank under the weighted policy: its weight times its
// channel's success rate squared. Squaring makes a channel failing 30% of
// its calls (0.49) sink below an equally weighted healthy backup at once.
func Score(weight int, successRate float64) float64 {
	return float64(weight) * successRate * successRate
}

// weigh sorts routes by Score, highest first. With probability Explore a random
// lower-ranked route is moved to the front so that a sunk channel keeps
// getting a trickle of traffic and can climb back; the others keep their
// order behind it, so the best route stays the next hop and MaxHops cannot
// cut it from the chain.
func (m *Model) weigh(order []*Route, h Health) {
	var scores [MaxRoutes]float64
	for i, r := range order {
		scores[i] = Score(r.Weight, h.SuccessRate(r.Channel))
	}
	// Insertion sort: chains are a handful of routes and this allocates
	// nothing, unlike sort.Slice.
	for i := 1; i < len(order); i++ {
		for j := i; j > 0 && scores[j] > scores[j-1]; j-- {
			scores[j], scores[j-1] = scores[j-1], scores[j]
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
	if len(order) > 1 && m.Explore > 0 && rand.Float64() < m.Explore {
		k := 1 + rand.IntN(len(order)-1)
		explored := order[k]
		copy(order[1:k+1], order[:k])
		order[0] = explored
	}
}
