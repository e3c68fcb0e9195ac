package walletapp

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmfailover/caddy-llm-failover/wallet"
)

func TestLeaseTTLOption(t *testing.T) {
	app, err := parseAll(t, "llm_wallet {\nlease_ttl 10s\n}")
	if err != nil {
		t.Fatal(err)
	}
	if got := time.Duration(app.Wallets["default"].LeaseTTL); got != 10*time.Second {
		t.Fatalf("lease_ttl = %v", got)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	for _, bad := range []caddy.Duration{caddy.Duration(500 * time.Millisecond), caddy.Duration(-time.Second)} {
		a := &App{Wallets: map[string]*Config{"w": {LeaseTTL: bad}}}
		if err := a.Provision(ctx); err == nil {
			t.Errorf("lease_ttl %v accepted", time.Duration(bad))
		}
	}
}

// The store holder renews the store's leases every second: an idle
// lease gives its money back to the account without anyone calling the
// store.
func TestHolderRenewsLeases(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.db")
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	a := &App{Wallets: map[string]*Config{"w": {
		StoreRaw: []byte(fmt.Sprintf(`{"backend":"sqlite","path":%q}`, path)),
		LeaseTTL: caddy.Duration(3 * time.Second),
	}}}
	if err := a.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	defer a.Cleanup()
	w, _ := a.Wallet("w")
	st, err := w.Store()
	if err != nil {
		t.Fatal(err)
	}
	bg := context.Background()
	if _, err := st.CreateAccount(bg, "acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Credit(bg, "acme", 1_000_000_000, "t"); err != nil {
		t.Fatal(err)
	}
	if err := w.Reserve(bg, wallet.Reservation{ID: "r1", Account: "acme", Amount: 1_000}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Settle(bg, "r1", wallet.Entry{Cost: 10}, wallet.Entry{Cost: 20, Note: "continuation"}); err != nil {
		t.Fatal(err)
	}
	acct, _ := st.Account(bg, "acme")
	if acct.Reserved == 0 {
		t.Fatal("no lease held right after a request on a rich account")
	}
	deadline := time.Now().Add(5 * time.Second)
	for acct.Reserved != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the idle lease was not returned: %+v", acct)
		}
		time.Sleep(100 * time.Millisecond)
		acct, _ = st.Account(bg, "acme")
	}
	if acct.Balance != 1_000_000_000-30 {
		t.Errorf("balance %s, want both entries charged", acct.Balance)
	}
	rows, err := st.Usage(bg, "acme", 0, 10)
	if err != nil || len(rows) != 3 || !strings.Contains(rows[0].Note, "continuation") {
		t.Errorf("ledger = %+v, %v", rows, err)
	}
}
