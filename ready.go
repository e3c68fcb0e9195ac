package llmfailover

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
)

// readyTimeout bounds the wallet store check of one readiness answer.
const readyTimeout = 2 * time.Second

// readiness answers a load balancer's readiness check, served by
// llm_status at any path ending in /ready: 200 "ready", or 503 with one
// reason per line when a required wallet store is unreachable (a wallet
// that refuses requests on store errors, the default) or a background job
// is overdue (it has not succeeded for two of its intervals).
func readiness(ctx context.Context) (reasons []string) {
	for _, s := range caddykit.Jobs.Statuses() {
		if s.Overdue {
			reasons = append(reasons, fmt.Sprintf("job %s is overdue (last success %s)", s.Name, s.LastSuccess.UTC().Format(time.RFC3339)))
		}
	}
	reg := activeRegistry()
	if reg == nil {
		return reasons
	}
	reg.mu.Lock()
	handlers := append([]*Handler(nil), reg.handlers...)
	reg.mu.Unlock()
	for _, h := range handlers {
		if h.wallet == nil || h.wallet.allow {
			continue
		}
		ctx, cancel := context.WithTimeout(ctx, readyTimeout)
		st, err := h.wallet.w.Store()
		if err == nil {
			err = st.Ping(ctx)
		}
		cancel()
		if err != nil {
			reasons = append(reasons, fmt.Sprintf("wallet %s: store unreachable: %v", h.wallet.w.Name(), err))
		}
	}
	return reasons
}

func serveReady(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if reasons := readiness(r.Context()); len(reasons) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("not ready:\n" + strings.Join(reasons, "\n") + "\n"))
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}
