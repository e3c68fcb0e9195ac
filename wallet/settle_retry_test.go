package wallet

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmfailover/caddy-llm-failover/internal/faultproxy"
	"github.com/llmfailover/caddy-llm-failover/internal/pgtest"
	"github.com/llmfailover/caddy-llm-failover/internal/sqlitefile"
)

// These tests use nothing but the Store and the test hooks every version
// of the package has (the tracer, the proxy), so that they also run, and
// fail, against the store as it was before settlements were retried.

// settleBatchSQL is a line of the settlement batch statement (pgSettleBatch).
const settleBatchSQL = "FROM unnest($2::text[], $3::bigint[]) AS j(account_id, charged)"

// cutter is a pgx tracer that breaks, through the fault proxy, the
// connection about to send the next statement matching its armed
// pattern, once that connection has run it before (so that the statement
// is prepared and its execution is the request cut, not a prepare).
type cutter struct {
	proxy *faultproxy.Proxy

	mu      sync.Mutex
	ran     map[*pgx.Conn]map[string]bool // statements each connection ran
	pattern string
	how     faultproxy.CutPoint
	cuts    int
}

type cutterKey struct{}

func (c *cutter) arm(pattern string, how faultproxy.CutPoint) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pattern, c.how = pattern, how
}

func (c *cutter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cuts
}

func (c *cutter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pattern != "" && strings.Contains(data.SQL, c.pattern) && c.ran[conn][c.pattern] {
		c.proxy.Cut(conn.PgConn().Conn().LocalAddr().String(), c.how)
		c.pattern = ""
		c.cuts++
	}
	return context.WithValue(ctx, cutterKey{}, data.SQL)
}

func (c *cutter) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	sql, _ := ctx.Value(cutterKey{}).(string)
	if data.Err != nil || sql == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ran == nil {
		c.ran = map[*pgx.Conn]map[string]bool{}
	}
	if c.ran[conn] == nil {
		c.ran[conn] = map[string]bool{}
	}
	for _, p := range []string{settleBatchSQL, pgGrowSQL, pgShrinkSQL} {
		if strings.Contains(sql, p) {
			c.ran[conn][p] = true
		}
	}
}

// Lines of the lease statements (pgGrow, pgShrink).
const (
	pgGrowSQL   = "SELECT id, balance - reserved AS avail FROM accounts WHERE id = $1 FOR UPDATE"
	pgShrinkSQL = "UPDATE leases y SET amount = y.amount - s.spare FROM s"
)

// faultyPG opens a PostgreSQL store through a fault proxy, on one writer
// connection (pool_max_conns=2: one writes, one reads), with a cutter;
// params are more DSN parameters, name then value. It returns the DSN
// without the proxy too.
func faultyPG(t *testing.T, opts Options, params ...string) (*sqlStore, *faultproxy.Proxy, *cutter, string) {
	t.Helper()
	dsn := pgtest.FreshDSN(t)
	proxy, via, err := faultproxy.Postgres(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	u, err := url.Parse(via)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("pool_max_conns", "2")
	for i := 0; i+1 < len(params); i += 2 {
		q.Set(params[i], params[i+1])
	}
	u.RawQuery = q.Encode()
	c := &cutter{proxy: proxy}
	opts.tracer = c
	st, err := OpenPostgres(context.Background(), u.String(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st.(*sqlStore), proxy, c, dsn
}

// request is one billed request of a test: its reservation and its cost.
type request struct {
	Reservation
	cost Micros
}

// reserveAll reserves n requests spread over accounts, each with its own
// request ID (as the gateway's are).
func reserveAll(t *testing.T, s Store, tag string, n int, accounts ...string) []request {
	t.Helper()
	var rs []request
	for i := range n {
		id := fmt.Sprintf("%s-%d-%s", tag, i, testReservationID())
		r := request{Reservation{ID: id, Account: accounts[i%len(accounts)], Model: "m", RequestID: id, Amount: 10_000}, Micros(1_000 + i)}
		if err := s.Reserve(context.Background(), r.Reservation); err != nil {
			t.Fatalf("reserving %s: %v", id, err)
		}
		rs = append(rs, r)
	}
	return rs
}

// settleAll settles rs at once with SettleAsync, as the gateway does after
// its answers, so that they share a batch, and waits for every outcome.
func settleAll(t *testing.T, s Store, rs []request, wait time.Duration) {
	t.Helper()
	errs := make(chan error, len(rs))
	for _, r := range rs {
		s.SettleAsync(r.ID, []Entry{{Channel: "c", TokensIn: 10, TokensOut: 5, Cost: r.cost}}, func(charged Micros, err error) {
			if err == nil && charged != r.cost {
				err = fmt.Errorf("charged %s, want %s", charged, r.cost)
			}
			if err != nil {
				err = fmt.Errorf("settling %s: %w", r.RequestID, err)
			}
			errs <- err
		})
	}
	deadline := time.After(wait)
	for range rs {
		select {
		case err := <-errs:
			if err != nil {
				t.Error(err)
			}
		case <-deadline:
			t.Fatalf("settlements still unwritten after %v", wait)
		}
	}
}

// chargedOnce checks that every request of rs has exactly one settlement
// row, charging its cost, that nothing stays reserved once the spare
// lease money is returned, and that the books agree.
func chargedOnce(t *testing.T, st Store, credit Micros, rs []request, accounts ...string) {
	t.Helper()
	s := st.(*sqlStore)
	ctx := context.Background()
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT request_id, kind, cost FROM ledger WHERE kind IN (?, ?)`), KindCharge, KindRelease)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		kind string
		cost int64
	}
	got := map[string][]row{}
	for rows.Next() {
		var (
			id string
			r  row
		)
		if err := rows.Scan(&id, &r.kind, &r.cost); err != nil {
			t.Fatal(err)
		}
		got[id] = append(got[id], r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	spent := map[string]Micros{}
	for _, r := range rs {
		g := got[r.RequestID]
		if len(g) != 1 || g[0].kind != KindCharge || Micros(g[0].cost) != r.cost {
			t.Errorf("request %s: settlement rows %+v, want one charge of %d", r.RequestID, g, r.cost)
		}
		spent[r.Account] += r.cost
	}
	if _, err := st.Sweep(ctx, time.Now()); err != nil { // returns the spare lease money
		t.Fatal(err)
	}
	for _, a := range accounts {
		if acct := getAccount(t, st, a); acct.Reserved != 0 || acct.Balance != credit-spent[a] {
			t.Errorf("account %s: %+v, want balance %s and nothing reserved", a, acct, credit-spent[a])
		}
	}
	audit, err := st.Audit(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range audit {
		if !r.Clean() {
			t.Errorf("audit: %+v", r)
		}
	}
}

// A proxy that drops the connection mid-batch: every answer charged once.
// The cut comes just before the settlement batch reaches the server (it
// never ran), just after (it committed and the answer was lost), or, for
// every connection, between two writes (the next write meets a dead
// connection).
func TestPostgresSettlementSurvivesALostConnection(t *testing.T) {
	const credit = 1_000_000
	for _, tc := range []struct {
		name  string
		fault func(s *sqlStore, p *faultproxy.Proxy, c *cutter)
	}{
		{"cut before the batch reaches the server", func(_ *sqlStore, _ *faultproxy.Proxy, c *cutter) { c.arm(settleBatchSQL, faultproxy.CutBefore) }},
		{"cut after the server ran the batch", func(_ *sqlStore, _ *faultproxy.Proxy, c *cutter) { c.arm(settleBatchSQL, faultproxy.CutAfter) }},
		{"every connection reset between two writes", func(_ *sqlStore, p *faultproxy.Proxy, _ *cutter) { p.Reset() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, proxy, c, _ := faultyPG(t, Options{})
			mustAccount(t, s, "a", credit)
			mustAccount(t, s, "b", credit)
			// A first batch, on the connection the next will use, so that
			// the fault hits the batch statement itself.
			var all []request
			warm := reserveAll(t, s, "warm", 2, "a", "b")
			settleAll(t, s, warm, 10*time.Second)
			all = append(all, warm...)

			rs := reserveAll(t, s, "batch", 8, "a", "b")
			tc.fault(s, proxy, c)
			settleAll(t, s, rs, 20*time.Second)
			all = append(all, rs...)
			if strings.HasPrefix(tc.name, "cut") && c.count() != 1 {
				t.Fatalf("%d cuts, want 1", c.count())
			}
			chargedOnce(t, s, credit, all, "a", "b")
		})
	}
}

// SQLite busy past its timeout (another process holding the write lock):
// the settlements wait for the lock, and every answer is charged once.
func TestSQLiteSettlementWaitsForALockedFile(t *testing.T) {
	const credit = 1_000_000
	path := filepath.Join(t.TempDir(), "wallet.db")
	st, err := OpenSQLite(path, Options{StatementTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	mustAccount(t, st, "a", credit)
	mustAccount(t, st, "b", credit)
	rs := reserveAll(t, st, "busy", 8, "a", "b")

	// Another process: its immediate transaction holds the write lock for
	// several of the store's busy timeouts.
	other, err := sqlitefile.Open(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	tx, err := other.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(700 * time.Millisecond)
		if err := tx.Rollback(); err != nil {
			t.Error(err)
		}
	}()
	settleAll(t, st, rs, 20*time.Second)
	<-released
	chargedOnce(t, st, credit, rs, "a", "b")
}
