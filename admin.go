package llmfailover

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/wallet"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI serves the handler's state on Caddy's admin endpoint:
//
//	GET  /llm_failover/chains                  each model's ordered channels
//	GET  /llm_failover/channels                each channel's breaker state
//	POST /llm_failover/channels/<name>/reset   close one channel's breaker by hand
//
// Caddy re-creates admin modules on every config load, so the module holds
// nothing: it reads the live handlers and the pooled channel state.
type adminAPI struct{}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.llm_failover",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

// Routes returns the admin routes.
func (a *adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/llm_failover/", Handler: caddy.AdminHandlerFunc(a.serve)}}
}

func (a *adminAPI) serve(w http.ResponseWriter, r *http.Request) error {
	path := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/llm_failover/"), "/")
	switch {
	case path == "chains":
		if err := onlyMethod(r, http.MethodGet); err != nil {
			return err
		}
		return writeJSON(w, chainsView())
	case path == "channels":
		if err := onlyMethod(r, http.MethodGet); err != nil {
			return err
		}
		return writeJSON(w, channelsView(time.Now()))
	case strings.HasPrefix(path, "channels/") && strings.HasSuffix(path, "/reset"):
		if err := onlyMethod(r, http.MethodPost); err != nil {
			return err
		}
		name := strings.TrimSuffix(strings.TrimPrefix(path, "channels/"), "/reset")
		return resetChannel(w, name)
	}
	return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no such llm_failover endpoint: %s", r.URL.Path)}
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
func chainsView() []chainView {
	now := time.Now()
	var out []chainView
	for _, h := range live.list() {
		for _, name := range h.modelList {
			m := h.models[name]
			cv := chainView{Model: name, Policy: m.chain.Policy.String(), MaxHops: m.chain.MaxHops}
			for _, r := range m.chain.Routes {
				b := h.channels[r.Channel].state.breaker
				rate, _ := b.SuccessRate()
				rv := routeView{
					Channel: r.Name, InputCost: wallet.Micros(r.InputCost).String(), OutputCost: wallet.Micros(r.OutputCost).String(),
					UpstreamModel: r.UpstreamModel, SuccessRate: rate, State: b.State(now).String(),
				}
				if m.chain.Policy.String() == "weighted" {
					rv.Weight = r.Weight
				}
				cv.Channels = append(cv.Channels, rv)
			}
			out = append(out, cv)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Model < out[j].Model })
	return out
}

type channelView struct {
	Name          string    `json:"name"`
	BaseURL       string    `json:"base_url"`
	State         string    `json:"state"`
	Failures      int       `json:"failures_in_window"`
	OpenUntil     time.Time `json:"open_until,omitzero"`
	ParkedUntil   time.Time `json:"parked_until,omitzero"`
	RetryIn       string    `json:"retry_in,omitempty"`
	SuccessRate   float64   `json:"success_rate"`
	Calls         int       `json:"calls"`
	TimesOpened   uint64    `json:"times_opened"`
	CurrentWeight []string  `json:"weights,omitempty"`
}

func channelsView(now time.Time) []channelView {
	seen := make(map[*channelState]bool)
	var out []channelView
	for _, h := range live.list() {
		for _, ch := range h.channels {
			if seen[ch.state] {
				continue
			}
			seen[ch.state] = true
			s := ch.state.breaker.Snapshot(now)
			cv := channelView{
				Name: ch.name, BaseURL: ch.base.Redacted(), State: s.State.String(), Failures: s.FailuresInWindow,
				OpenUntil: s.OpenUntil, ParkedUntil: s.ParkedUntil, SuccessRate: s.SuccessRate,
				Calls: s.Calls, TimesOpened: s.Opened,
			}
			if s.RetryIn > 0 {
				cv.RetryIn = s.RetryIn.Round(time.Millisecond).String()
			}
			// The weight a channel has right now, per weighted model.
			for _, name := range h.modelList {
				m := h.models[name]
				if m.chain.Policy.String() != "weighted" {
					continue
				}
				for _, r := range m.chain.Routes {
					if r.Name == ch.name {
						cv.CurrentWeight = append(cv.CurrentWeight, fmt.Sprintf("%s=%.2f", name, float64(r.Weight)*s.SuccessRate*s.SuccessRate))
					}
				}
			}
			out = append(out, cv)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func resetChannel(w http.ResponseWriter, name string) error {
	now := time.Now()
	found := false
	for _, h := range live.list() {
		for _, ch := range h.channels {
			if ch.name != name {
				continue
			}
			found = true
			if tr := ch.state.breaker.Reset(now); tr.Changed() {
				breakerTransitions.WithLabelValues(ch.name, tr.To.String()).Inc()
				h.logger.Warn("breaker reset by hand", zap.String("channel", ch.name), zap.String("from", tr.From.String()))
			}
		}
	}
	if !found {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no channel named %q", name)}
	}
	return writeJSON(w, map[string]string{"channel": name, "state": "closed"})
}

func onlyMethod(r *http.Request, method string) error {
	if r.Method != method {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed; use %s", r.Method, method)}
	}
	return nil
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// Interface guards
var (
	_ caddy.AdminRouter = (*adminAPI)(nil)
)
