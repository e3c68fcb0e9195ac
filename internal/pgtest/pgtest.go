// Package pgtest gives a test a PostgreSQL schema of its own on the
// server scripts/pg-test-server.sh starts (LLMF_TEST_POSTGRES_DSN), so
// that tests running at once never see each other's rows. Tests only.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// DSN is the test server's DSN. Without one the test is skipped, or
// fails under CI=true: a silent skip would make a broken setup look green.
func DSN(tb testing.TB) string {
	tb.Helper()
	dsn := os.Getenv("LLMF_TEST_POSTGRES_DSN")
	if dsn == "" {
		if os.Getenv("CI") == "true" {
			tb.Fatal("LLMF_TEST_POSTGRES_DSN is unset but CI=true: PostgreSQL tests must not be skipped in CI")
		}
		tb.Skip(`PostgreSQL tests skipped: LLMF_TEST_POSTGRES_DSN is unset (run eval "$(bash scripts/pg-test-server.sh start)")`)
	}
	return dsn
}

// Schema creates an empty schema on the server at dsn, dropped when the
// test ends, and returns dsn with its search_path set to it.
func Schema(tb testing.TB, dsn string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		tb.Fatalf("connecting to the test PostgreSQL: %v", err)
	}
	defer conn.Close(context.Background())
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	schema := "llmf_test_" + hex.EncodeToString(rnd[:])
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		tb.Fatalf("creating schema: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			tb.Errorf("connecting to drop schema %s: %v", schema, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			tb.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	u, err := url.Parse(dsn)
	if err != nil {
		tb.Fatalf("parsing the test DSN: %v", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// FreshDSN is Schema on the test server: a DSN for an empty schema.
func FreshDSN(tb testing.TB) string {
	tb.Helper()
	return Schema(tb, DSN(tb))
}
