package caddykit

import (
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
)

// The plugin's collectors, each with the app whose running config it
// describes. Every config's registry gets all of them (RegisterAll),
// from the admin API's module too: Caddy puts a new config's admin
// endpoint, and with it the registry /metrics serves, in place before it
// provisions the config's apps, and keeps it when the config is then
// refused. Registered only by the apps and handlers that provisioned, a
// refusal that came before them left the running config's series out of
// /metrics until the next good reload. Each reports only while the
// running config has its app, so that a config without wallets shows no
// wallet gauge, whichever config's registry is served.
var (
	metricsMu sync.Mutex
	metricSet []prometheus.Collector
)

// AddMetrics adds package-level collectors describing the running
// config's app (its module ID), for RegisterAll; packages call it from
// init.
func AddMetrics(app string, collectors ...prometheus.Collector) {
	metricsMu.Lock()
	defer metricsMu.Unlock()
	for _, c := range collectors {
		metricSet = append(metricSet, activeOnly{app: app, c: c})
	}
}

// RegisterAll registers every collector AddMetrics was given into reg.
func RegisterAll(reg prometheus.Registerer) error {
	metricsMu.Lock()
	all := append([]prometheus.Collector(nil), metricSet...)
	metricsMu.Unlock()
	return Register(reg, all...)
}

// activeOnly reports c's metrics while the running config has app.
type activeOnly struct {
	app string
	c   prometheus.Collector
}

func (a activeOnly) Describe(ch chan<- *prometheus.Desc) { a.c.Describe(ch) }

func (a activeOnly) Collect(ch chan<- prometheus.Metric) {
	if _, err := caddy.ActiveContext().AppIfConfigured(a.app); err == nil {
		a.c.Collect(ch)
	}
}
