package wallet

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/sqlitefile"
)

// plan is the opcodes SQLite compiles query to on conn.
func plan(t *testing.T, ctx context.Context, conn interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, query string) string {
	t.Helper()
	rs, err := conn.QueryContext(ctx, "EXPLAIN "+query)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var ops []string
	for rs.Next() {
		var addr int
		var op string
		var p1, p2, p3, p4, p5, comment any
		if err := rs.Scan(&addr, &op, &p1, &p2, &p3, &p4, &p5, &comment); err != nil {
			t.Fatal(err)
		}
		ops = append(ops, op)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(ops, " ")
}

// poolCompilesKindCheck fails t unless every connection of db's pool
// compiles a ledger INSERT with kindCheck.
func poolCompilesKindCheck(t *testing.T, db *sql.DB) {
	t.Helper()
	ctx := context.Background()
	conns := make([]*sql.Conn, sqliteConns)
	for i := range conns {
		var err error
		if conns[i], err = db.Conn(ctx); err != nil {
			t.Fatal(err)
		}
		defer conns[i].Close()
		if p := plan(t, ctx, conns[i], `INSERT INTO ledger (kind, account_id, cost, created_at) VALUES ('charge', 'a', 1, 1)`); strings.Contains(p, "OpenEphemeral") || !strings.Contains(p, "Eq") {
			t.Errorf("connection %d of the store compiles the ledger INSERT as %s", i, p)
		}
	}
}

// A fresh wallet gets the released schema and then the same rewrite, so
// both end with one schema (see addedColumns).
func TestSQLiteFreshLedgerKindCheck(t *testing.T) {
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "fresh.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	poolCompilesKindCheck(t, s.(*sqlStore).db)
}

// A wallet of an earlier release, with rows in its ledger and another
// process's connection open on it, gets the cheaper kind CHECK when it
// opens: every connection compiles the ledger INSERT without the
// per-row ephemeral table, the rows are intact, an unknown kind is still
// refused, and opening it again changes nothing.
func TestSQLiteLedgerKindCheckRewritten(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	old, err := sqlitefile.Open(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	old.SetMaxOpenConns(1) // "another process": one connection with the old schema loaded
	for _, q := range append(append([]string{}, sqliteSchema...),
		`INSERT INTO accounts (id, balance, created_at) VALUES ('a', 100, 0)`,
		`INSERT INTO ledger (kind, account_id, cost, created_at) VALUES ('credit', 'a', 100, 0)`) {
		if _, err := old.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	insert := `INSERT INTO ledger (kind, account_id, cost, created_at) VALUES ('charge', 'a', 1, 1)`
	if p := plan(t, ctx, old, insert); !strings.Contains(p, "OpenEphemeral") {
		t.Fatalf("the released CHECK compiles without an ephemeral table (%s): this test no longer shows the rewrite's point", p)
	}

	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	db := s.(*sqlStore).db
	var stored string
	if err := db.QueryRowContext(ctx, `SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'ledger'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stored, kindCheck) || strings.Contains(stored, releasedKindCheck) {
		t.Fatalf("ledger schema after opening:\n%s", stored)
	}
	poolCompilesKindCheck(t, db)
	// EXPLAIN compiles without running: a statement that runs finds the
	// new schema_version and reloads the schema.
	if _, err := old.ExecContext(ctx, `SELECT COUNT(*) FROM ledger`); err != nil {
		t.Fatal(err)
	}
	if p := plan(t, ctx, old, insert); strings.Contains(p, "OpenEphemeral") {
		t.Errorf("a connection opened before the rewrite kept the released CHECK: %s", p)
	}

	var check string
	if err := db.QueryRowContext(ctx, `PRAGMA integrity_check`).Scan(&check); err != nil || check != "ok" {
		t.Fatalf("integrity_check: %q, %v", check, err)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM ledger WHERE kind = 'credit' AND cost = 100`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the released ledger's row: %d, %v", n, err)
	}
	for _, kind := range []string{"bogus", "Charge", ""} {
		_, err := db.ExecContext(ctx, `INSERT INTO ledger (kind, account_id, cost, created_at) VALUES (?, 'a', 0, 0)`, kind)
		if err == nil || !strings.Contains(err.Error(), "CHECK constraint failed") {
			t.Errorf("a ledger row of kind %q: %v, want a CHECK failure", kind, err)
		}
	}
	if _, err := old.ExecContext(ctx, `INSERT INTO ledger (kind, account_id, cost, created_at) VALUES ('bogus', 'a', 0, 0)`); err == nil {
		t.Error("the other process's connection accepts an unknown kind")
	}

	var version int64
	if err := db.QueryRowContext(ctx, `PRAGMA schema_version`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var again int64
	if err := s.(*sqlStore).db.QueryRowContext(ctx, `PRAGMA schema_version`).Scan(&again); err != nil {
		t.Fatal(err)
	}
	if again != version {
		t.Fatalf("reopening changed schema_version %d → %d: the rewrite ran twice", version, again)
	}
}

// The trial refuses a rewritten text that does not parse or whose CHECK
// no longer refuses an unknown kind, so neither ever reaches a wallet.
func TestTryLedgerSchema(t *testing.T) {
	ctx := context.Background()
	var released string
	for _, q := range sqliteSchema {
		if strings.Contains(q, releasedKindCheck) {
			released = strings.Replace(q, "CREATE TABLE IF NOT EXISTS", "CREATE TABLE", 1)
		}
	}
	if released == "" {
		t.Fatal("no ledger CREATE TABLE holds releasedKindCheck")
	}
	good := strings.Replace(released, releasedKindCheck, kindCheck, 1)
	if err := tryLedgerSchema(ctx, good); err != nil {
		t.Fatalf("the rewrite fails its trial: %v", err)
	}
	for name, text := range map[string]string{
		"no check":      strings.Replace(released, releasedKindCheck, "", 1),
		"a weaker one":  strings.Replace(released, releasedKindCheck, "CHECK (kind <> '')", 1),
		"a broken text": strings.Replace(released, releasedKindCheck, "CHECK (kind = 'charge' OR)", 1),
		"a stricter one": strings.Replace(released, releasedKindCheck,
			"CHECK (kind = 'charge' OR kind = 'release' OR kind = 'failed_attempt' OR kind = 'credit')", 1),
	} {
		if err := tryLedgerSchema(ctx, text); err == nil {
			t.Errorf("%s passes the trial", name)
		}
	}
}
