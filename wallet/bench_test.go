package wallet

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/cputime"
)

// benchReserveSettle measures one request's wallet round trip: a Reserve
// before the upstream call and a Settle after it.
//
// Reserve+Settle cycles per second on the 2-core test machine
// (go test -run '^$' -bench 'ReserveSettle|Authenticate' -benchtime 2s
// ./wallet/, PostgreSQL from scripts/pg-test-server.sh on the same host,
// shared with other jobs, so ±20 %), before → after group commit, prepared
// statements and the Authenticate cache:
//
//	sqlite   sequential               5,270 →  6,990
//	sqlite   parallel                 5,470 → 22,630
//	sqlite   parallel-16-accounts     4,690 → 19,290
//	postgres sequential               1,110 →  1,130
//	postgres parallel                 1,650 →  1,920
//	postgres parallel-16-accounts     3,190 →  3,550
//	Authenticate (parallel) sqlite 152k → 4.4M/s, postgres 29k → 4.2M/s (cached)
//
// With credit leases (lease.go; GOMAXPROCS=1, a noisier box): sqlite
// parallel 28,600-32,700 ops/s (31-35 µs/op), postgres parallel 3,900-4,950,
// postgres parallel-16-accounts 8,400-9,900.
//
// See bench/README.md ("Wallet on vs off", "credit leases") for the whole
// request path.
func benchReserveSettle(b *testing.B, s Store) {
	ctx := context.Background()
	const accounts = 16
	mustAccount(b, s, "bench", 1<<60)
	for i := 0; i < accounts; i++ {
		mustAccount(b, s, fmt.Sprint("bench-", i), 1<<60)
	}
	price := Price{Input: 3_000_000, Output: 15_000_000}
	amount, _ := MaxCost(Estimate{BodyBytes: 2000, MaxOutput: 1000}, price)
	cycle := func(account string) {
		id := testReservationID()
		if err := s.Reserve(ctx, Reservation{ID: id, Account: account, KeyID: "key_x", Model: "m", RequestID: id, Amount: amount}); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Settle(ctx, id, Entry{Channel: "c", TokensIn: 500, TokensOut: 200, Cost: price.Cost(500, 200)}); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("sequential", func(b *testing.B) {
		for b.Loop() {
			cycle("bench")
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	})
	b.Run("parallel", func(b *testing.B) {
		b.SetParallelism(8) // gateway requests are I/O bound; more than GOMAXPROCS are in flight
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				cycle("bench")
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	})
	// Many accounts: on PostgreSQL, transactions of different accounts do
	// not wait on one row lock.
	b.Run("parallel-16-accounts", func(b *testing.B) {
		b.SetParallelism(8)
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			account := fmt.Sprint("bench-", next.Add(1)%accounts)
			for pb.Next() {
				cycle(account)
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	})
}

func BenchmarkReserveSettle(b *testing.B) {
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) { benchReserveSettle(b, be.open(b)) })
	}
}

func BenchmarkAuthenticate(b *testing.B) {
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			s := be.open(b)
			ctx := context.Background()
			mustAccount(b, s, "bench", 0)
			plain, _, err := s.CreateKey(ctx, "bench", "")
			if err != nil {
				b.Fatal(err)
			}
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := s.Authenticate(ctx, plain); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
		})
	}
}

// BenchmarkLedgerInsert is the SQLite writer's cost of a ledger row in
// each form of insertRows: 128-row INSERTs of rows that share their
// columns but the request's (shared form) and of rows that differ in
// channel (each-row form), one transaction each. cpu-ns/row is the
// process's CPU time per row:
//
//	go test -run '^$' -bench LedgerInsert -cpu 1 ./wallet/
func BenchmarkLedgerInsert(b *testing.B) {
	for _, form := range []string{"each-row", "shared"} {
		b.Run(form, func(b *testing.B) {
			s := openSQLiteT(b).(*sqlStore)
			mustAccount(b, s, "bench", 1<<60)
			jobs := make([]*settleJob, maxInsertRows)
			now := time.Now()
			for i := range jobs {
				e := Entry{Kind: KindCharge, Account: "bench", KeyID: "key_4bXk2vQ9", Model: "gpt-4o-mini", UpstreamModel: "gpt-4o-mini",
					Channel: "openai", RequestID: "0b6a2c5e-4f7e-4a8e-9d8f-3a2b1c0d9e8f", TokensIn: 50, TokensOut: 20, Cost: 450, Time: now}
				if form == "each-row" {
					e.Channel = fmt.Sprint("channel-", i)
				}
				jobs[i] = &settleJob{account: "bench", rows: []Entry{e}}
			}
			avail := map[string]Micros{"bench": 1}
			ctx := context.Background()
			cpu0 := cputime.Process()
			for b.Loop() {
				if err := s.write(ctx, "inserting ledger rows", "bench", func(t *stx) error { return s.insertRows(t, jobs, avail) }); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((cputime.Process()-cpu0).Nanoseconds())/float64(b.N*maxInsertRows), "cpu-ns/row")
		})
	}
}
