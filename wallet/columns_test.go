package wallet

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/llmfailover/caddy-llm-failover/internal/pgtest"
)

// A renamed model's upstream name reaches the ledger on both the charge
// and the failed attempt rows, and comes back from Usage; so do a
// charge's prompt-cache classes and both rows' trace IDs.
func TestUpstreamModelRecorded(t *testing.T) {
	forEachStore(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		mustAccount(t, s, "acme", 10_000_000)
		if err := s.RecordAttempt(ctx, Entry{Account: "acme", Model: "claude-sonnet-4-5", UpstreamModel: "claude-sonnet-4-5@20250929", Channel: "google-vertex", RequestID: "r1", Note: "upstream 429",
			TraceID: "4bf92f3577b34da6a3ce929d0e0e4736"}); err != nil {
			t.Fatal(err)
		}
		r := Reservation{ID: testReservationID(), Account: "acme", Model: "claude-sonnet-4-5", RequestID: "r1", Amount: 1_000_000}
		if err := s.Reserve(ctx, r); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Settle(ctx, r.ID, Entry{Channel: "aws-bedrock", UpstreamModel: "us.anthropic.claude-sonnet-4-5-20250929-v1:0", TokensIn: 10, TokensOut: 5, Cost: 100,
			TokensCacheRead: 7, TokensCacheWrite: 2, TokensCacheWrite1h: 1, TraceID: "4bf92f3577b34da6a3ce929d0e0e4737"}); err != nil {
			t.Fatal(err)
		}
		rows, err := s.Usage(ctx, "acme", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 3 {
			t.Fatalf("%d rows: %+v", len(rows), rows)
		}
		if e := rows[0]; e.Kind != KindCharge || e.Model != "claude-sonnet-4-5" || e.UpstreamModel != "us.anthropic.claude-sonnet-4-5-20250929-v1:0" ||
			e.TokensCacheRead != 7 || e.TokensCacheWrite != 2 || e.TokensCacheWrite1h != 1 || e.TraceID != "4bf92f3577b34da6a3ce929d0e0e4737" {
			t.Errorf("charge row = %+v", e)
		}
		if e := rows[1]; e.Kind != KindFailedAttempt || e.UpstreamModel != "claude-sonnet-4-5@20250929" || e.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Errorf("attempt row = %+v", e)
		}
		if e := rows[2]; e.Kind != KindCredit || e.UpstreamModel != "" || e.TraceID != "" {
			t.Errorf("credit row = %+v", e)
		}
	})
}

// A database made by a release without the added columns (upstream_model,
// the prompt-cache token classes, trace_id) gains them when a store opens
// it: its rows stay, with an empty upstream model, no cached tokens and no
// trace, and new rows carry theirs. Opening again changes nothing.
func TestMigrationAddsUpstreamModel(t *testing.T) {
	ctx := context.Background()
	for _, b := range []struct {
		name, driver string
		dsn          func(t *testing.T) string
		schema       []string
		open         func(t *testing.T, dsn string) Store
	}{
		{"sqlite", "sqlite", func(t *testing.T) string { return filepath.Join(t.TempDir(), "old.db") }, sqliteSchema,
			func(t *testing.T, dsn string) Store {
				s, err := OpenSQLite(dsn)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}},
		{"postgres", "pgx", func(t *testing.T) string { return pgtest.FreshDSN(t) }, postgresSchema,
			func(t *testing.T, dsn string) Store {
				s, err := OpenPostgres(ctx, dsn)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}},
	} {
		t.Run(b.name, func(t *testing.T) {
			dsn := b.dsn(t)
			old, err := sql.Open(b.driver, dsn)
			if err != nil {
				t.Fatal(err)
			}
			// The released CREATE TABLEs, without any added column.
			for _, stmt := range b.schema {
				if _, err := old.ExecContext(ctx, stmt); err != nil {
					t.Fatalf("old schema: %v", err)
				}
			}
			for _, stmt := range []string{
				`INSERT INTO accounts (id, balance, reserved, created_at) VALUES ('acme', 0, 0, 1)`,
				`INSERT INTO ledger (kind, account_id, model, channel, cost, note, created_at) VALUES ('failed_attempt', 'acme', 'gpt-4o', 'azure', 0, 'old row', 1)`,
			} {
				if _, err := old.ExecContext(ctx, stmt); err != nil {
					t.Fatalf("old row: %v", err)
				}
			}
			old.Close()

			for i := range 2 {
				s := b.open(t, dsn)
				if err := s.RecordAttempt(ctx, Entry{Account: "acme", Model: "gpt-4o", UpstreamModel: "gpt4o-prod", Channel: "azure",
					TraceID: "0af7651916cd43dd8448eb211c80319c"}); err != nil {
					t.Fatalf("open %d: %v", i+1, err)
				}
				rows, err := s.Usage(ctx, "acme", 0, 0)
				s.Close()
				if err != nil {
					t.Fatal(err)
				}
				if len(rows) != 2+i {
					t.Fatalf("open %d: %d rows: %+v", i+1, len(rows), rows)
				}
				if e := rows[len(rows)-1]; e.Note != "old row" || e.UpstreamModel != "" || e.Model != "gpt-4o" || e.TokensCacheRead != 0 || e.TraceID != "" {
					t.Errorf("old row = %+v", e)
				}
				if e := rows[0]; e.UpstreamModel != "gpt4o-prod" || e.TraceID != "0af7651916cd43dd8448eb211c80319c" {
					t.Errorf("new row = %+v", e)
				}
			}
		})
	}
}
