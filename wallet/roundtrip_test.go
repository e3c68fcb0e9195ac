package wallet

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/llmfailover/caddy-llm-failover/internal/pgtest"
)

// roundTrips counts the messages pgx sends PostgreSQL that each wait for an
// answer: a statement (BEGIN and COMMIT included), a prepare, or a whole
// pipelined batch.
type roundTrips struct{ n atomic.Int64 }

var (
	_ pgx.QueryTracer   = (*roundTrips)(nil)
	_ pgx.BatchTracer   = (*roundTrips)(nil)
	_ pgx.PrepareTracer = (*roundTrips)(nil)
)

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	if !inBatch(ctx) {
		r.n.Add(1)
	}
	return ctx
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	return context.WithValue(ctx, batchKey{}, true)
}
func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (r *roundTrips) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

type batchKey struct{}

func inBatch(ctx context.Context) bool { v, _ := ctx.Value(batchKey{}).(bool); return v }

// BenchmarkRoundTripsPerRequest counts the PostgreSQL round trips of one
// request's hot path (Reserve, then Settle) with pgx's tracer, alone and
// with 16 requests in flight (group commit shares BEGIN and COMMIT).
//
//	go test -run '^$' -bench RoundTrips -benchtime 2000x ./wallet/
func BenchmarkRoundTripsPerRequest(b *testing.B) {
	for _, conc := range []int{1, 16} {
		b.Run(map[int]string{1: "alone", 16: "16-in-flight"}[conc], func(b *testing.B) {
			rt := &roundTrips{}
			s, err := OpenPostgres(context.Background(), pgtest.FreshDSN(b), Options{tracer: rt})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			mustAccount(b, s, "rt", 1<<60)
			cycle := func() {
				id := testReservationID()
				if err := s.Reserve(ctx, Reservation{ID: id, Account: "rt", Model: "m", Amount: 1000}); err != nil {
					b.Error(err)
					return
				}
				if _, err := s.Settle(ctx, id, Entry{Cost: 400, TokensIn: 5, TokensOut: 5}); err != nil {
					b.Error(err)
				}
			}
			for range 20 { // warm: every connection prepared
				cycle()
			}
			before := rt.n.Load()
			b.ResetTimer()
			var next atomic.Int64
			var wg sync.WaitGroup
			for range conc {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= int64(b.N) {
						cycle()
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(rt.n.Load()-before)/float64(b.N), "roundtrips/request")
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "requests/s")
		})
	}
}
