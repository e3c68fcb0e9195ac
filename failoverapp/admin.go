package failoverapp

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI serves the handler's state on Caddy's admin endpoint:
//
//	GET  /llm_failover/chains                  each model's ordered channels
//	GET  /llm_failover/channels                each channel's breaker state
//	GET  /llm_failover/jobs                    each background job: last run, success, error, next due
//	POST /llm_failover/channels/<name>/reset   close one channel's breaker by hand
//	POST /llm_failover/channels/<name>/check   a plain and a streamed request per model route (doctor.go)
//	POST /llm_failover/drill[?model=<name>]    each channel of each chain made to fail in turn (drill.go)
//	GET  /llm_failover/status                  the status page's JSON (statusview.go)
//	GET  /llm_failover/decisions?...           the failover decision journal (decisions.go)
//
// Caddy re-creates admin modules on every config load, so the module holds
// nothing: it reads the running config's app at request time.
type adminAPI struct{}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.llm_failover",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

// Provision registers the plugin's metrics into the new config's
// registry. Caddy provisions admin modules, and serves /metrics from that
// registry, before it provisions the config's apps, and goes on serving
// it when the config is then refused: registered only by the apps and
// handlers, the running config's series left /metrics after a reload
// refused before them. The collectors report the running config's state.
func (a *adminAPI) Provision(ctx caddy.Context) error {
	return caddykit.RegisterAll(ctx.GetMetricsRegistry())
}

// Routes returns the admin routes.
func (a *adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/llm_failover/", Handler: caddy.AdminHandlerFunc(a.serve)}}
}

func (a *adminAPI) serve(w http.ResponseWriter, r *http.Request) error {
	path := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/llm_failover/"), "/")
	switch {
	case path == "chains":
		if err := caddykit.OnlyMethod(r, http.MethodGet); err != nil {
			return err
		}
		return caddykit.WriteJSON(w, chainsView(activeSnapshot()))
	case path == "jobs":
		if err := caddykit.OnlyMethod(r, http.MethodGet); err != nil {
			return err
		}
		return caddykit.WriteJSON(w, jobsView())
	case path == "channels":
		if err := caddykit.OnlyMethod(r, http.MethodGet); err != nil {
			return err
		}
		return caddykit.WriteJSON(w, channelsView(activeSnapshot()))
	case strings.HasPrefix(path, "channels/") && strings.HasSuffix(path, "/reset"):
		if err := caddykit.OnlyMethod(r, http.MethodPost); err != nil {
			return err
		}
		name := strings.TrimSuffix(strings.TrimPrefix(path, "channels/"), "/reset")
		return resetChannel(w, active(), name)
	case strings.HasPrefix(path, "channels/") && strings.HasSuffix(path, "/check"):
		return serveCheck(w, r, active(), strings.TrimSuffix(strings.TrimPrefix(path, "channels/"), "/check"))
	case path == "drill":
		return serveDrill(w, r, active())
	case path == "status":
		return serveStatus(w, r)
	case path == "decisions":
		return serveDecisions(w, r)
	}
	return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no such llm_failover endpoint: %s", r.URL.Path)}
}

// activeSnapshot reads the running config's channels; empty when no
// config has an llm_failover app.
func activeSnapshot() Snapshot {
	if a := active(); a != nil {
		return a.Snapshot(time.Now())
	}
	return Snapshot{}
}

type chainView struct {
	Model    string      `json:"model"`
	Policy   string      `json:"policy"`
	MaxHops  int         `json:"max_hops"`
	Channels []routeView `json:"channels"`
}

type routeView struct {
	Channel       string  `json:"channel"`
	InputCost     string  `json:"input_cost_per_mtok"`
	OutputCost    string  `json:"output_cost_per_mtok"`
	UpstreamModel string  `json:"upstream_model,omitempty"`
	Weight        int     `json:"weight,omitempty"`
	SuccessRate   float64 `json:"success_rate"`
	State         string  `json:"state"`
}

// chainsView lists every model's chain in the order the cost policy tries
// it; under the weighted policy the live order also depends on the
// success rates shown next to each channel.
func chainsView(snap Snapshot) []chainView {
	out := make([]chainView, 0, len(snap.Models))
	for _, m := range snap.Models {
		cv := chainView{Model: m.Name, Policy: m.Policy.String(), MaxHops: m.MaxHops}
		for _, r := range m.Routes {
			rv := routeView{
				Channel: r.Route.Name, InputCost: wallet.Micros(r.Route.InputCost).String(), OutputCost: wallet.Micros(r.Route.OutputCost).String(),
				UpstreamModel: r.Route.UpstreamModel, SuccessRate: r.Health.SuccessRate, State: r.Health.State.String(),
			}
			if m.Policy == chain.Weighted {
				rv.Weight = r.Route.Weight
			}
			cv.Channels = append(cv.Channels, rv)
		}
		out = append(out, cv)
	}
	return out
}

// ChannelStateView is one channel in GET /llm_failover/channels.
type ChannelStateView struct {
	Name           string    `json:"name"`
	BaseURL        string    `json:"base_url"`
	State          string    `json:"state"`
	Failures       int       `json:"failures_in_window"`
	OpenUntil      time.Time `json:"open_until,omitzero"`
	ParkedUntil    time.Time `json:"parked_until,omitzero"`
	RetryIn        string    `json:"retry_in,omitempty"`
	TrialsInFlight int       `json:"trials_in_flight"`
	SuccessRate    float64   `json:"success_rate"`
	Calls          int       `json:"calls"`
	TimesOpened    uint64    `json:"times_opened"`
	CurrentWeight  []string  `json:"weights,omitempty"`
	// NoPrefillModels are the upstream models that refused a
	// continuation's prefill on this channel since the process started;
	// their continuations are asked in the instructed form.
	NoPrefillModels []string `json:"no_prefill_models,omitempty"`
}

func channelsView(snap Snapshot) []ChannelStateView {
	out := make([]ChannelStateView, 0, len(snap.Channels))
	for _, c := range snap.Channels {
		s := c.Health
		cv := ChannelStateView{
			Name: c.Name, BaseURL: c.BaseURL, State: s.State.String(), Failures: s.FailuresInWindow,
			OpenUntil: s.OpenUntil, ParkedUntil: s.ParkedUntil, TrialsInFlight: s.TrialsInFlight,
			SuccessRate: s.SuccessRate, Calls: s.Calls, TimesOpened: s.Opened, NoPrefillModels: c.NoPrefill,
		}
		if s.RetryIn > 0 {
			cv.RetryIn = s.RetryIn.Round(time.Millisecond).String()
		}
		for _, w := range c.Weights {
			cv.CurrentWeight = append(cv.CurrentWeight, fmt.Sprintf("%s=%.2f", w.Model, w.Score))
		}
		out = append(out, cv)
	}
	return out
}

func resetChannel(w http.ResponseWriter, a *App, name string) error {
	if a == nil || !a.reset(name, time.Now()) {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no channel named %q", name)}
	}
	return caddykit.WriteJSON(w, map[string]string{"channel": name, "state": "closed"})
}

// Interface guards
var (
	_ caddy.AdminRouter = (*adminAPI)(nil)
	_ caddy.Provisioner = (*adminAPI)(nil)
)
