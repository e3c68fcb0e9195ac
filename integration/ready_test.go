package integration_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/jackc/pgx/v5"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/internal/pgtest"
)

// readyStoreConfig is a gateway billing to the PostgreSQL store at dsn,
// with on_store_error mode, and llm_status answering /status/ready.
func readyStoreConfig(dsn, upstream, mode string) string {
	return fmt.Sprintf(`{
	skip_install_trust
	admin localhost:%d
	http_port %d
	https_port %d
	grace_period 1ns
	log {
		level ERROR
	}
	llm_wallet {
		store postgres %s
	}
}
http://localhost:%d {
	handle /status* {
		llm_status
	}
	llm_failover {
		channel rdA %s
		model rdm {
			route rdA
			price 2 8
		}
		wallet {
			on_store_error %s
		}
	}
}
`, adminPort, httpPort, 9443+portOffset, dsn, httpPort, upstream, mode)
}

// A wallet store that does not answer makes readiness say so, in the
// body: an instance whose own SQLite store fails is not ready, but a
// PostgreSQL store is shared by every instance, so its outage keeps the
// answer 200 (a load balancer would otherwise drop every instance, and
// every site they serve, at once), whatever on_store_error says.
func TestReadinessWalletStoreUnreachable(t *testing.T) {
	if testing.Short() {
		t.Skip("in-process Caddy tests are skipped with -short")
	}
	up := upstream(t, fu.OK())
	dsn := pgtest.FreshDSN(t)
	proxy, viaProxy := pgProxy(t, dsn)
	url := fmt.Sprintf("http://localhost:%d/status/ready", httpPort)
	const unreachable = "wallet default: store unreachable"
	tc := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	for _, mode := range []string{"deny", "allow"} {
		tc.InitServer(readyStoreConfig(viaProxy, up.URL, mode), "caddyfile")
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
		// Other tests' jobs may be overdue in this process; only the
		// store's line is this test's.
		if _, body := getBody(t, url); strings.Contains(string(body), unreachable) {
			t.Fatalf("%s, store up: %q", mode, body)
		}
		proxy.Refuse(true)
		// The checks' outcome is reused for 2 s.
		var res *http.Response
		var body []byte
		eventually(t, 5*time.Second, "readiness to name the store", func() bool {
			res, body = getBody(t, url)
			return strings.Contains(string(body), unreachable)
		})
		if res.StatusCode != http.StatusOK || !strings.Contains(string(body), "degraded:\n") {
			t.Fatalf("%s, store down: %d %q; want 200 naming the store under degraded", mode, res.StatusCode, body)
		}
		// What the driver says names the database's host, user and name:
		// logged, never shown to whoever polls /ready.
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		for _, secret := range []string{cfg.Password, cfg.User, cfg.Database, proxy.Addr()} {
			if secret != "" && strings.Contains(string(body), secret) {
				t.Errorf("readiness answer shows %q: %q", secret, body)
			}
		}
		proxy.Refuse(false)
		eventually(t, 10*time.Second, "readiness to recover with the store", func() bool {
			_, body := getBody(t, url)
			return !strings.Contains(string(body), unreachable)
		})
	}
}
