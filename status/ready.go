package status

import (
	"net/http"
	"strings"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
)

// serveReady answers a load balancer's readiness check, at any path of
// the status page ending in /ready: 503 with one reason per line when
// the instance cannot serve, else 200 "ready", followed by what it serves
// despite ("degraded:", one line each; see failoverapp.Ready).
func serveReady(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	unready, degraded := failoverapp.Ready()
	var b strings.Builder
	if len(unready) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		b.WriteString("not ready:\n" + strings.Join(unready, "\n") + "\n")
	} else {
		b.WriteString("ready\n")
	}
	if len(degraded) > 0 {
		b.WriteString("degraded:\n" + strings.Join(degraded, "\n") + "\n")
	}
	_, _ = w.Write([]byte(b.String()))
}
