package status

import (
	"net/http"
	"strings"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
)

// serveReady answers a load balancer's readiness check, at any path of
// the status page ending in /ready: 200 "ready", or 503 with one reason
// per line (failoverapp.Ready).
func serveReady(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if reasons := failoverapp.Ready(r.Context()); len(reasons) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("not ready:\n" + strings.Join(reasons, "\n") + "\n"))
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}
