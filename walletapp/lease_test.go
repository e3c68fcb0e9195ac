package walletapp

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
	"github.com/llmfailover/caddy-llm-failover/jobs"
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
	st := fundedAccount(t, w, "acme", 1_000_000_000)
	bg := context.Background()
	if err := w.Reserve(bg, wallet.Reservation{ID: "r1", Account: "acme", Amount: 1_000}); err != nil {
		t.Fatal(err)
	}
	settled := make(chan error, 1)
	w.SettleAsync("r1", []wallet.Entry{{Cost: 10}, {Cost: 20, Note: "continuation"}}, func(_ wallet.Micros, err error) { settled <- err })
	if err := <-settled; err != nil {
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
	// The run that returned the lease is recorded just after it returns.
	job := caddykit.Jobs.Job(LeaseJobPrefix+"w", 0).Status(time.Now())
	for end := time.Now().Add(2 * time.Second); job.Runs == 0 && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		job = caddykit.Jobs.Job(LeaseJobPrefix+"w", 0).Status(time.Now())
	}
	if job.Runs == 0 || job.LastSuccess.IsZero() || job.Overdue {
		t.Errorf("the renewer's job: %+v", job)
	}
	if acct.Balance != 1_000_000_000-30 {
		t.Errorf("balance %s, want both entries charged", acct.Balance)
	}
	rows, err := st.Usage(bg, "acme", 0, 10)
	if err != nil || len(rows) != 3 || !strings.Contains(rows[0].Note, "continuation") {
		t.Errorf("ledger = %+v, %v", rows, err)
	}
}

// The renewer's runs are a job of their own, and a renewer that stops
// succeeding fails the sweeper's runs, whose heartbeat operators watch.
func TestStalledRenewerFailsTheSweep(t *testing.T) {
	reg := jobs.NewRegistry(nil)
	h := &storeHolder{leaseJob: reg.Job(LeaseJobPrefix+"t", leaseRenewEvery), opened: time.Now()}
	now := time.Now()
	if err := h.renewerStalled(now); err != nil {
		t.Fatalf("a renewer within its grace after open: %v", err)
	}
	if err := h.renewerStalled(now.Add(renewerStallLimit + time.Second)); err == nil || !strings.Contains(err.Error(), "never succeeded") {
		t.Fatalf("a renewer that never ran: %v", err)
	}
	bg := context.Background()
	_ = h.leaseJob.Run(bg, func(context.Context) (jobs.Summary, error) { return "renewed", nil })
	if err := h.renewerStalled(time.Now()); err != nil {
		t.Fatalf("just renewed: %v", err)
	}
	_ = h.leaseJob.Run(bg, func(context.Context) (jobs.Summary, error) { return "", errors.New("database gone") })
	err := h.renewerStalled(time.Now().Add(renewerStallLimit + time.Second))
	if err == nil || !strings.Contains(err.Error(), "database gone") || !strings.Contains(err.Error(), LeaseJobPrefix+"t") {
		t.Fatalf("a renewer failing since its last success: %v", err)
	}
}
