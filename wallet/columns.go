package wallet

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

// addedColumn is a column added to a table after its first release. The
// CREATE TABLE statements stay as they were released; every store adds its
// missing columns when it migrates, so a fresh database and an upgraded
// one take the same path and end with the same schema.
type addedColumn struct {
	table, column, definition string
}

// addedColumns, oldest first. A definition must have a constant default:
// adding it then rewrites no row, so the append-only ledger's triggers
// never fire and a large ledger migrates at once. BIGINT in a definition
// is the dialect's 64-bit integer (INTEGER in SQLite's strict tables).
var addedColumns = []addedColumn{
	// The name the serving channel knows the model by (a route's
	// upstream_model), next to the client's in model.
	{"ledger", "upstream_model", "TEXT NOT NULL DEFAULT ''"},
	// The part of tokens_in read from the provider's prompt cache, and
	// written to it for 5 minutes and for an hour, each charged at its
	// own price.
	{"ledger", "tokens_cache_read", "BIGINT NOT NULL DEFAULT 0"},
	{"ledger", "tokens_cache_write", "BIGINT NOT NULL DEFAULT 0"},
	{"ledger", "tokens_cache_write_1h", "BIGINT NOT NULL DEFAULT 0"},
	// The OpenTelemetry trace ID of the request, when it was traced.
	{"ledger", "trace_id", "TEXT NOT NULL DEFAULT ''"},
}

// addColumns adds the columns of addedColumns a database lacks, inside
// the migration transaction.
func (s *sqlStore) addColumns(ctx context.Context, tx *sql.Tx) error {
	for _, c := range addedColumns {
		var n int
		if err := tx.QueryRowContext(ctx, s.q(s.d.columnExists), c.table, c.column).Scan(&n); err != nil {
			return fmt.Errorf("looking for column %s.%s: %w", c.table, c.column, err)
		}
		if n > 0 {
			continue
		}
		def := c.definition
		if s.d.name == "sqlite" {
			def = strings.Replace(def, "BIGINT", "INTEGER", 1)
		}
		if _, err := tx.ExecContext(ctx, "ALTER TABLE "+c.table+" ADD COLUMN "+c.column+" "+def); err != nil {
			return fmt.Errorf("adding column %s.%s: %w", c.table, c.column, err)
		}
	}
	return nil
}
