package wallet

import (
	"context"
	"database/sql"
	"fmt"
	"math/bits"
	"strings"
)

// Ledger rows on SQLite. About half of what the pure-Go driver spends on
// a row is binding its sixteen values (up to about 0.35 µs each: a C
// string copy, SQLite's mutex taken twice), so the rows of a batch that
// share everything but the request are written with those seven columns
// bound once: a client's settlements of one model on one channel in a
// gather window differ only in request ID, tokens, cost, time and trace.
// BenchmarkLedgerInsert: 9.3 µs a row each-row, 6.8 shared. PostgreSQL
// writes a batch as one statement of arrays instead (runSettlesInOne).

// ledgerColumns are the ledger's columns every insert names, and
// ledgerArgs their count: the arguments of one row. sharedColumns (and
// sharedArgs) are what a run of rows can share, ownColumns (ownArgs) the
// rest.
const (
	ledgerColumns = `kind, account_id, key_id, model, upstream_model, channel, request_id, tokens_in, tokens_out, cost, note, created_at, tokens_cache_read, tokens_cache_write, tokens_cache_write_1h, trace_id`
	ledgerArgs    = 16
	sharedColumns = `kind, account_id, key_id, model, upstream_model, channel, note`
	sharedArgs    = 7
	ownColumns    = `request_id, tokens_in, tokens_out, cost, created_at, tokens_cache_read, tokens_cache_write, tokens_cache_write_1h, trace_id`
	ownArgs       = 9
)

// maxInsertRows bounds the rows of one multi-row INSERT (ledgerArgs
// placeholders each, far below SQLite's limit), insertSizes the row
// counts of the INSERTs (1, 2, 4 ... maxInsertRows; see insertRows).
// minSharedRows is the fewest rows written with their shared columns
// bound once: an INSERT of its own costs about 5.5 µs (in a scratch
// benchmark, 13.1 µs a row in 1-row INSERTs against 7.6 in 128-row ones)
// and a row in the shared form saves about 2.5, so a smaller group gains
// little or loses.
const (
	maxInsertRows = 128
	insertSizes   = 8
	minSharedRows = 8
)

// The two forms of ledger INSERT: every column bound for every row, or
// the shared columns bound once for all of them.
const (
	eachRowForm = iota
	sharedForm
	insertForms
)

// shared is what a row can share with others of its batch.
type shared struct {
	kind, account, key, model, upstream, channel, note string
}

func sharedOf(e *Entry) shared {
	return shared{e.Kind, e.Account, e.KeyID, e.Model, e.UpstreamModel, e.Channel, e.Note}
}

// rowGroup is the rows of a batch that share cols, in job order.
type rowGroup struct {
	cols shared
	rows []*Entry
}

// insertRows writes the ledger rows of the jobs whose account was charged
// (a key of avail). The jobs whose rows all share their columns are
// grouped by them, and each group of at least minSharedRows rows is
// written in the shared form; the rest (small groups' rows, the tail of a
// group past its last power of two, jobs whose rows differ such as a
// resumed answer's two channels) in the each-row form after them. Every
// job's rows keep their order, so a request's rows read in the order they
// happened; rows of different jobs, settled concurrently, have none to
// keep.
//
// Each INSERT holds a power of two rows: 128 at a time, then the rest in
// falling powers of two (300 rows are 128, 128, 32, 8 and 4). SQLite
// keeps a prepared statement's program per connection, about 180 KB for
// 128 rows: one statement per row count from 1 to 128 grew the process by
// 11.6 MB for each connection that prepared them (the store's and the
// writer's), and each new count cost the writer a prepare of up to a
// millisecond. The powers of two take 0.7 MB a form.
func (s *sqlStore) insertRows(t *stx, jobs []*settleJob, avail map[string]Micros) error {
	s.inserts.mu.Lock()
	defer s.inserts.mu.Unlock()
	var (
		groups []rowGroup
		index  = map[shared]int{}
		each   []*Entry // rows for the each-row form, in order
	)
	for _, j := range jobs {
		if _, ok := avail[j.account]; !ok || len(j.rows) == 0 {
			continue // lost: its lease was swept
		}
		cols := sharedOf(&j.rows[0])
		alike := true
		for i := 1; i < len(j.rows) && alike; i++ {
			alike = sharedOf(&j.rows[i]) == cols
		}
		if !alike {
			for i := range j.rows {
				each = append(each, &j.rows[i])
			}
			continue
		}
		g, ok := index[cols]
		if !ok {
			g = len(groups)
			index[cols] = g
			groups = append(groups, rowGroup{cols: cols})
		}
		for i := range j.rows {
			groups[g].rows = append(groups[g].rows, &j.rows[i])
		}
	}
	for _, g := range groups {
		rows := g.rows
		for len(rows) >= minSharedRows {
			n := chunkRows(len(rows))
			if err := s.insertChunk(t, sharedForm, &g.cols, rows[:n]); err != nil {
				return err
			}
			rows = rows[n:]
		}
		each = append(each, rows...)
	}
	for len(each) > 0 {
		n := chunkRows(len(each))
		if err := s.insertChunk(t, eachRowForm, nil, each[:n]); err != nil {
			return err
		}
		each = each[n:]
	}
	return nil
}

// chunkRows is how many of left rows the next INSERT takes: the largest
// power of two up to left and maxInsertRows.
func chunkRows(left int) int {
	return min(maxInsertRows, 1<<(bits.Len(uint(left))-1))
}

// insertChunk writes rows, a power of two of them, in form (with cols
// for the shared form). The arguments' slice is the store's, reused from
// chunk to chunk: at 128 rows it was a 24 KB allocation. inserts.mu is
// held.
func (s *sqlStore) insertChunk(t *stx, form int, cols *shared, rows []*Entry) error {
	st, err := s.insertStmt(t.ctx, form, len(rows))
	if err != nil {
		return err
	}
	args := s.inserts.args[:0]
	if form == sharedForm {
		args = append(args, cols.kind, cols.account, cols.key, cols.model, cols.upstream, cols.channel, cols.note)
		for _, e := range rows {
			args = append(args, e.RequestID, e.TokensIn, e.TokensOut, int64(e.Cost), toDB(e.Time), e.TokensCacheRead, e.TokensCacheWrite, e.TokensCacheWrite1h, e.TraceID)
		}
	} else {
		for _, e := range rows {
			args = append(args, e.Kind, e.Account, e.KeyID, e.Model, e.UpstreamModel, e.Channel, e.RequestID, e.TokensIn, e.TokensOut, int64(e.Cost), e.Note, toDB(e.Time),
				e.TokensCacheRead, e.TokensCacheWrite, e.TokensCacheWrite1h, e.TraceID)
		}
	}
	_, err = t.exec(st, args...)
	clear(args) // keep no row's strings alive
	s.inserts.args = args[:0]
	if err != nil {
		return fmt.Errorf("writing %d ledger rows: %w", len(rows), err)
	}
	return nil
}

// insertStmt returns the prepared INSERT of n ledger rows in form, n a
// power of two up to maxInsertRows; inserts.mu is held.
//
// The shared form binds the shared columns once, in a one-row table r,
// and joins each row's own columns to it: v CROSS JOIN r makes v the
// outer loop (SQLite keeps the left table of a CROSS JOIN outside), so
// the rows go in, and take their IDs, in the order they are bound.
func (s *sqlStore) insertStmt(ctx context.Context, form, n int) (*sql.Stmt, error) {
	i := bits.TrailingZeros(uint(n))
	if n != 1<<i || i >= insertSizes || form < 0 || form >= insertForms {
		return nil, fmt.Errorf("a %d-row ledger insert: %w: not a power of two up to %d", n, ErrInvalid, maxInsertRows)
	}
	if st := s.inserts.byRows[form][i]; st != nil {
		return st, nil
	}
	var query string
	if form == sharedForm {
		row := "(?" + strings.Repeat(", ?", ownArgs-1) + ")"
		query = `WITH r (` + sharedColumns + `) AS (VALUES (?` + strings.Repeat(", ?", sharedArgs-1) + `))
			INSERT INTO ledger (` + sharedColumns + `, ` + ownColumns + `)
			SELECT r.kind, r.account_id, r.key_id, r.model, r.upstream_model, r.channel, r.note,
				v.column1, v.column2, v.column3, v.column4, v.column5, v.column6, v.column7, v.column8, v.column9
			FROM (VALUES ` + row + strings.Repeat(", "+row, n-1) + `) AS v CROSS JOIN r`
	} else {
		row := "(?" + strings.Repeat(", ?", ledgerArgs-1) + ")"
		query = `INSERT INTO ledger (` + ledgerColumns + `) VALUES ` + row + strings.Repeat(", "+row, n-1)
	}
	st, err := s.db.PrepareContext(ctx, s.q(query))
	if err != nil {
		return nil, fmt.Errorf("preparing a %d-row ledger insert: %w", n, err)
	}
	s.inserts.byRows[form][i] = st
	return st, nil
}
