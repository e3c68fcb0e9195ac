package walletapp

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// sqliteApp provisions an llm_wallet app with one wallet "w" on the SQLite
// file at path, not yet started.
func sqliteApp(t testing.TB, path string) (*App, *Wallet) {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	a := &App{Wallets: map[string]*Config{"w": {StoreRaw: []byte(fmt.Sprintf(`{"backend":"sqlite","path":%q}`, path))}}}
	if err := a.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	w, err := a.Wallet("w")
	if err != nil {
		t.Fatal(err)
	}
	return a, w
}

// fundedAccount creates account id with balance on w's store, which it
// returns.
func fundedAccount(tb testing.TB, w *Wallet, id string, balance wallet.Micros) wallet.Store {
	tb.Helper()
	st, err := w.Store()
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := st.CreateAccount(context.Background(), id); err != nil {
		tb.Fatal(err)
	}
	if _, err := st.Credit(context.Background(), id, balance, "test"); err != nil {
		tb.Fatal(err)
	}
	return st
}

// A wallet whose config was unloaded refuses every later use with
// ErrUnloaded, which the handler never treats as a store outage that
// on_store_error allow could serve through; and it does not reopen the
// store behind the pool's back.
func TestUnloadedWalletRefuses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.db")
	a, w := sqliteApp(t, path)
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Provision touched the disk: %v", err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	exit := w.Enter()
	if err := a.Cleanup(); err != nil {
		t.Fatal(err)
	}
	// The request that entered before Cleanup still has its store.
	if _, err := w.Authenticate(context.Background(), "sk-llmf-nope"); errors.Is(err, ErrUnloaded) {
		t.Fatalf("a request that entered before Cleanup lost its store: %v", err)
	}
	exit()

	late, lw := sqliteApp(t, filepath.Join(t.TempDir(), "late.db"))
	if err := late.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if _, err := lw.Authenticate(context.Background(), "sk-llmf-nope"); !errors.Is(err, ErrUnloaded) {
		t.Fatalf("a wallet used after Cleanup: err = %v, want ErrUnloaded", err)
	}
	if n, _ := stores.References(late.wallets["w"].backend.PoolKey()); n != 0 {
		t.Fatal("a use after Cleanup reopened the store")
	}
}

// Releasing a store (here at Cleanup, as at shutdown, after which Caddy
// exits) waits for the settlements already decided, which run after
// their requests' handlers returned, and not for requests still being
// served.
func TestReleaseWaitsForSettlements(t *testing.T) {
	a, w := sqliteApp(t, filepath.Join(t.TempDir(), "w.db"))
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	serving := w.Enter() // a long stream: not waited for
	defer serving()
	pending := testutil.ToFloat64(settlementsPending)
	_, end, err := w.beginSettle() // as SettleAsync does until the batch is written
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(settlementsPending); got != pending+1 {
		t.Fatalf("wallet_settlements_pending %v after beginSettle, want %v", got, pending+1)
	}
	cleaned := make(chan error, 1)
	go func() { cleaned <- a.Cleanup() }()
	select {
	case err := <-cleaned:
		t.Fatalf("Cleanup returned (%v) with a settlement unwritten", err)
	case <-time.After(200 * time.Millisecond):
	}
	end()
	if got := testutil.ToFloat64(settlementsPending); got != pending {
		t.Fatalf("wallet_settlements_pending %v after the settlement, want %v", got, pending)
	}
	select {
	case err := <-cleaned:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Cleanup still waits after the settlement ended (or waits for the request being served)")
	}
}

// TestSQLitePathWithUnsetVariable: `store sqlite {env.STATE_DIRECTORY}/wallet.db`
// with the variable unset must not become /wallet.db (an unknown
// placeholder replaced by nothing): like a DSN's, an unset variable is a
// load error naming it.
func TestSQLitePathWithUnsetVariable(t *testing.T) {
	s := &SQLite{Path: "{env.LLMF_TEST_UNSET_STATE_DIR}/wallet.db"}
	err := s.Provision(caddy.Context{})
	if err == nil || !strings.Contains(err.Error(), "LLMF_TEST_UNSET_STATE_DIR") {
		t.Fatalf("provisioned at %q (err %v)", s.abs, err)
	}
	dir := t.TempDir()
	t.Setenv("LLMF_TEST_STATE_DIR", dir)
	s = &SQLite{Path: "{env.LLMF_TEST_STATE_DIR}/wallet.db"}
	if err := s.Provision(caddy.Context{}); err != nil || s.abs != filepath.Join(dir, "wallet.db") {
		t.Fatalf("path %q, err %v", s.abs, err)
	}
}
