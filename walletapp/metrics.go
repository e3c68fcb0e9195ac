package walletapp

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
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
	settlementsPending = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "wallet_settlements_pending",
		Help: "Settlements decided but not yet written (they are written after the answer, batched up to 20 ms apart); one that keeps growing means the store does not keep up, and each holds its reservation's money meanwhile.",
	})
	keepAliveTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "wallet_keepalive_total",
		Help: "Batched extensions of live requests' reservations, and failed lease renewals, by result.",
	}, []string{"result"})
)

func registerMetrics(reg prometheus.Registerer) error {
	return caddykit.Register(reg, sweepHeartbeat, sweepTotal, keepAliveTotal, settlementsPending)
}
