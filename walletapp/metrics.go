package walletapp

import (
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
	"github.com/llmfailover/caddy-llm-failover/wallet"
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
	writeRetries = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "wallet_write_retries_total",
		Help: "Wallet writes run again after a transient database error (a connection lost or refused, a deadlock, serialization failure, lock or statement timeout, SQLite busy past its timeout); a steady rise means the database is unwell.",
	})
	settlementsUnwritten = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "caddy", Subsystem: "llm_failover", Name: "wallet_settlements_unwritten_total",
		Help: "Settlements that could not be written, the database failing for longer than writes are retried (30 s) or the store closing first: those answers went unbilled, and each is logged with its request ID. Any rise deserves a look.",
	})
)

func init() {
	caddykit.AddMetrics("llm_wallet", sweepHeartbeat, sweepTotal, keepAliveTotal, settlementsPending, writeRetries, settlementsUnwritten)
}

// registerMetrics registers every collector of the plugin
// (caddykit.RegisterAll), these included.
func registerMetrics(reg prometheus.Registerer) error {
	return caddykit.RegisterAll(reg)
}

// storeObserver counts and logs a store's write faults (wallet.Observer).
type storeObserver struct{ logger *zap.Logger }

func (o storeObserver) WriteRetried(what string, err error) {
	writeRetries.Inc()
	o.logger.Debug("retrying a wallet write after a transient database error", zap.String("write", what), zap.Error(err))
}

func (o storeObserver) SettlementUnwritten(requestID, account string, err error) {
	settlementsUnwritten.Inc()
	o.logger.Error("a settlement could not be written: this answer was not charged, and its reservation's money stays held until it expires",
		zap.String("request_id", requestID), zap.String("account", account), zap.Error(err))
}

var _ wallet.Observer = storeObserver{}
