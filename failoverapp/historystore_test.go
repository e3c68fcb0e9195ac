package failoverapp

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/history"
	"github.com/llmfailover/caddy-llm-failover/history/store"
	"github.com/llmfailover/caddy-llm-failover/internal/faultproxy"
	"github.com/llmfailover/caddy-llm-failover/internal/pgtest"
	"github.com/llmfailover/caddy-llm-failover/journal"
)

// A history store that stops answering costs the status page one bounded
// read, not one per page view: concurrent views do not queue behind the
// read, and views soon after a failed read do not try again.
func TestHistoryReadsDoNotQueueBehindAHungStore(t *testing.T) {
	proxy, dsn, err := faultproxy.Postgres(pgtest.FreshDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := store.OpenPostgres(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s := &statusState{history: history.NewRecorder(), journal: journal.New(journal.DefaultSize),
		since: map[string]time.Time{}, started: time.Now()}
	s.attach(&historyHolder{store: st, state: s, logger: zap.NewNop()})
	if rec, _ := s.sources(time.Now()); rec == s.history {
		t.Fatal("with the store up, the page shows this instance's history only")
	}

	proxy.Freeze(true)
	later := time.Now().Add(time.Minute) // past the read cache
	began := time.Now()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if rec, _ := s.sources(later); rec == nil {
				t.Error("no history")
			}
		})
	}
	wg.Wait()
	// One bounded read (2 s) at most; queued views took 5 s each.
	if took := time.Since(began); took > 4*time.Second {
		t.Errorf("4 page views with the store hung took %v", took)
	}
	began = time.Now()
	if rec, _ := s.sources(later.Add(time.Second)); rec != s.history {
		t.Error("a view just after a failed read does not show this instance's history")
	}
	if took := time.Since(began); took > 500*time.Millisecond {
		t.Errorf("a view just after a failed read waited %v on the store", took)
	}

	proxy.Freeze(false)
	proxy.Reset() // the hung connections
	if rec, _ := s.sources(later.Add(time.Minute)); rec == s.history {
		t.Error("once the store answers again, the page still shows this instance's history only")
	}
}

// TestHistorySQLitePathWithUnsetVariable: an unset variable in the
// history's path is a load error naming it, not a history.db at the root.
func TestHistorySQLitePathWithUnsetVariable(t *testing.T) {
	s := &HistorySQLite{Path: "{env.LLMF_TEST_UNSET_STATE_DIR}/history.db"}
	err := s.Provision(caddy.Context{})
	if err == nil || !strings.Contains(err.Error(), "LLMF_TEST_UNSET_STATE_DIR") {
		t.Fatalf("provisioned at %q (err %v)", s.abs, err)
	}
}

// TestProbeLeaderDSNChecked: a probe_leader DSN that cannot parse is a
// load error, as the history's and the wallet's are; accepted, every
// election fails and no instance of the fleet ever probes.
func TestProbeLeaderDSNChecked(t *testing.T) {
	base, err := caddy.ProvisionContext(&caddy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(base)
	defer cancel()
	_, err = ctx.LoadModuleByID("llm_failover", []byte(`{"probe_leader":{"dsn":"postgres://u:p@db:notaport/x"}}`))
	if err == nil {
		t.Fatal("an unparsable probe_leader DSN loaded")
	}
	if strings.Contains(err.Error(), "u:p") {
		t.Fatalf("the error shows the DSN: %v", err)
	}
}
