package walletapp

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// The collectors live at package level, so they survive a reload, and are
// registered into every config's registry.
var (
	sweepHeartbeat = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "wallet_sweep_last_success_timestamp_seconds",
		Help: "When the reservation sweeper last completed; alert when it is older than a few minutes.",
	})
	sweepTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "wallet_sweep_total",
		Help: "Sweeper results: expired reservations released, and failed sweeps.",
	}, []string{"result"})
)

func registerMetrics(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{sweepHeartbeat, sweepTotal} {
		if err := reg.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if !errors.As(err, &already) {
				return fmt.Errorf("registering wallet metrics: %w", err)
			}
		}
	}
	return nil
}
