package integration_test

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/jackc/pgx/v5"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
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

// Readiness fails while a required wallet store is unreachable, says
// why, and recovers with the store; a wallet that serves unbilled on
// store errors (allow) does not need its store to be ready.
func TestReadinessWalletStoreUnreachable(t *testing.T) {
	if testing.Short() {
		t.Skip("in-process Caddy tests are skipped with -short")
	}
	up := upstream(t, fu.OK())
	dsn := freshSchema(t, postgresDSN(t))
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	hostPort := net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port))
	proxy := newTCPProxy(t, hostPort)
	viaProxy := strings.Replace(dsn, hostPort, proxy.ln.Addr().String(), 1)
	if viaProxy == dsn {
		t.Fatalf("cannot rewrite the host of DSN %q", dsn)
	}
	url := fmt.Sprintf("http://localhost:%d/status/ready", httpPort)
	const unreachable = "store unreachable"
	tc := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tc.InitServer(readyStoreConfig(viaProxy, up.URL, "deny"), "caddyfile")
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()

	// Other tests' jobs may be overdue in this process; only the store's
	// line is this test's.
	if _, body := getBody(t, url); strings.Contains(string(body), unreachable) {
		t.Fatalf("store up: %q", body)
	}
	proxy.setDown(true)
	res, body := getBody(t, url)
	if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), unreachable) {
		t.Fatalf("store down: %d %q; want 503 naming the store", res.StatusCode, body)
	}
	if strings.Contains(string(body), cfg.Password) && cfg.Password != "" {
		t.Errorf("readiness answer carries the database password: %q", body)
	}

	// allow: requests are served unbilled, so readiness does not hang on
	// the store.
	tc.InitServer(readyStoreConfig(viaProxy, up.URL, "allow"), "caddyfile")
	if _, body := getBody(t, url); strings.Contains(string(body), unreachable) {
		t.Errorf("on_store_error allow with the store down: %q", body)
	}

	tc.InitServer(readyStoreConfig(viaProxy, up.URL, "deny"), "caddyfile")
	proxy.setDown(false)
	eventually(t, 10*time.Second, "readiness to recover with the store", func() bool {
		_, body := getBody(t, url)
		return !strings.Contains(string(body), unreachable)
	})
}
