package wallet

import (
	"context"
	"testing"
)

// benchReserveSettle measures one request's wallet round trip: a Reserve
// before the upstream call and a Settle after it.
func benchReserveSettle(b *testing.B, s Store) {
	ctx := context.Background()
	mustAccount(b, s, "bench", 1<<60)
	price := Price{Input: 3_000_000, Output: 15_000_000}
	amount, _ := MaxCost(Estimate{BodyBytes: 2000, MaxOutput: 1000}, price)
	cycle := func() {
		id := NewReservationID()
		if err := s.Reserve(ctx, Reservation{ID: id, Account: "bench", KeyID: "key_x", Model: "m", RequestID: id, Amount: amount}); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Settle(ctx, id, Entry{Channel: "c", TokensIn: 500, TokensOut: 200, Cost: price.Cost(500, 200)}); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("sequential", func(b *testing.B) {
		for b.Loop() {
			cycle()
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	})
	b.Run("parallel", func(b *testing.B) {
		b.SetParallelism(8) // gateway requests are I/O bound; more than GOMAXPROCS are in flight
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				cycle()
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
