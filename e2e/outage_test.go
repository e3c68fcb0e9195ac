package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/faultproxy"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/wallet"
	"github.com/llmfailover/caddy-llm-failover/walletapp"
)

// portsOutage: TestBinaryStartsWithItsDatabasesDown.
var portsOutage = ports{19611, 19612}

const oneDollar = wallet.Micros(1_000_000)

// outageSite bills model "billed" and not model "free", keeps its history
// in PostgreSQL and has a status page; both databases are reached through
// {env.LLMF_E2E_DSN}.
func outageSite(p ports, upstream string) string {
	global := withWallet(withFailover(globalOptions(p), "history postgres {env.LLMF_E2E_DSN}"), "\t\tstore postgres {env.LLMF_E2E_DSN}")
	return global + fmt.Sprintf(`http://:%d {
	bind 127.0.0.1
	handle /status* {
		llm_status
	}
	handle /free/* {
		uri strip_prefix /free
		llm_failover {
			channel up %[2]s
			model free {
				route up
			}
		}
	}
	llm_failover {
		channel up %[2]s
		model billed {
			route up
			price 2 8
		}
		wallet
	}
}
`, p.HTTP, upstream)
}

// `caddy run` with the wallet's and the history's PostgreSQL down: the
// server starts (it used to exit, taking every site with it), readiness
// stays 200 and names both outages, billed requests answer 503 in the
// API's format (on_store_error deny) while unbilled ones are served, and
// once the database answers, billed requests are served and charged
// within seconds, and the history flushes, with no restart or reload.
func TestBinaryStartsWithItsDatabasesDown(t *testing.T) {
	caddyBin(t)
	dsn := createDatabase(t, postgresDSN(t))
	secret := accountIn(t, dsn, "acct")
	proxy, viaProxy, err := faultproxy.Postgres(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	proxy.Refuse(true)

	up := fu.New(fu.OKNamed("up"))
	defer up.Close()
	in := newInstance(t, "outage", portsOutage, outageSite(portsOutage, up.URL), "LLMF_E2E_DSN="+viaProxy)

	ready := func() (int, string) {
		res, err := gatewayClient.Get(in.gatewayURL() + "/status/ready")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	// The history store's first flush fails within one interval (5 s).
	if !waitFor(15*time.Second, func() bool {
		code, body := ready()
		return code == 200 && strings.Contains(body, "wallet default: store unreachable") && strings.Contains(body, "job history_flush is failing")
	}) {
		code, body := ready()
		t.Fatalf("ready with both databases down: %d %q; want 200 naming both under degraded", code, body)
	}

	code, _, body := post(t, in.gatewayURL()+"/v1/chat/completions", fu.ChatRequest("billed", false), "Authorization", "Bearer "+secret)
	if code != http.StatusServiceUnavailable || !strings.Contains(string(body), `"error"`) || !strings.Contains(string(body), "billing is temporarily unavailable") {
		t.Fatalf("billed with the wallet down: %d %s", code, body)
	}
	if code, _, body := post(t, in.gatewayURL()+"/free/v1/chat/completions", fu.ChatRequest("free", false)); code != 200 {
		t.Fatalf("unbilled with the databases down: %d %s", code, body)
	}
	if res, err := gatewayClient.Get(in.gatewayURL() + "/status"); err != nil || res.StatusCode != 200 {
		t.Fatalf("status page with the history store down: %v %v", res, err)
	} else {
		res.Body.Close()
	}

	proxy.Refuse(false)
	began := time.Now()
	if !waitFor(20*time.Second, func() bool {
		code, _, _ := post(t, in.gatewayURL()+"/v1/chat/completions", fu.ChatRequest("billed", false), "Authorization", "Bearer "+secret)
		return code == 200
	}) {
		t.Fatal("billed requests were not served within 20s of the database answering")
	}
	t.Logf("billed requests served %v after the database came back", time.Since(began).Round(100*time.Millisecond))
	if !waitFor(20*time.Second, func() bool {
		code, body := ready()
		return code == 200 && !strings.Contains(body, "degraded")
	}) {
		code, body := ready()
		t.Fatalf("ready after the database came back: %d %q", code, body)
	}
	var acct walletapp.AccountView
	money := func(s string) wallet.Micros {
		m, err := wallet.ParseMicros(strings.TrimPrefix(s, "$"))
		if err != nil {
			t.Fatalf("amount %q: %v", s, err)
		}
		return m
	}
	if !waitFor(10*time.Second, func() bool {
		in.admin(http.MethodGet, "/llm_wallet/accounts/acct", nil, 200, &acct)
		return money(acct.Reserved) == 0
	}) {
		t.Fatalf("still reserved: %+v", acct)
	}
	if money(acct.Balance) >= oneDollar {
		t.Errorf("the requests served after recovery were not charged: balance %s", acct.Balance)
	}
}

// accountIn creates account id with $1 and a key directly in the wallet
// database at dsn (migrating it), for a test whose gateway cannot reach
// it yet.
func accountIn(t *testing.T, dsn, id string) (secret string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := wallet.OpenPostgres(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.CreateAccount(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Credit(ctx, id, oneDollar, "test"); err != nil {
		t.Fatal(err)
	}
	secret, _, err = st.CreateKey(ctx, id, "test")
	if err != nil {
		t.Fatal(err)
	}
	return secret
}
