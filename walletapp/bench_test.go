package walletapp

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/llmfailover/caddy-llm-failover/internal/cputime"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// BenchmarkRequestPath is the wallet's share of one gateway request, as
// the handler spends it: enter, authenticate the client's key, reserve,
// keep alive, settle after the answer (SettleAsync) and exit. Each client
// waits for its settlement before its next request, so ns/op includes
// the batch writer and nothing queues without bound; with 256 clients
// the batches are full (128 settlements; bench/run.sh's gateway, at about
// 5,000 requests/s and a 20 ms gather, writes about 100). cpu-ns/op is
// the process's CPU time per request, which leaves out what a busy
// machine gives other processes. Run it on one core, as bench/run.sh
// runs Caddy (figures in bench/README.md):
//
//	go test -run '^$' -bench RequestPath -benchmem -cpu 1 -benchtime 3s ./walletapp/
func BenchmarkRequestPath(b *testing.B) {
	a, w := sqliteApp(b, filepath.Join(b.TempDir(), "w.db"))
	if err := a.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = a.Cleanup() })
	st := fundedAccount(b, w, "bench", 1<<60)
	ctx := context.Background()
	secret, _, err := st.CreateKey(ctx, "bench", "")
	if err != nil {
		b.Fatal(err)
	}
	price := wallet.Price{Input: 3_000_000, Output: 15_000_000}
	amount, _ := wallet.MaxCost(wallet.Estimate{BodyBytes: 200, MaxOutput: 1000}, price)
	b.SetParallelism(256)
	cpu0 := cputime.Process()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		settled := make(chan error, 1)
		for pb.Next() {
			exit := w.Enter()
			actx, cancel := w.AdmissionContext(ctx)
			k, err := w.Authenticate(actx, secret)
			if err != nil {
				b.Error(err)
				return
			}
			id := uuid.NewString()
			r := wallet.Reservation{ID: id, Account: k.Account, KeyID: k.ID, Model: "m", RequestID: id,
				Amount: amount, ExpiresAt: time.Now().Add(w.ReservationTTL())}
			if err := w.Reserve(actx, r); err != nil {
				b.Error(err)
				return
			}
			cancel()
			live := w.KeepAlive(id)
			e := wallet.Entry{Account: k.Account, KeyID: k.ID, Model: "m", UpstreamModel: "m", Channel: "c",
				RequestID: id, TokensIn: 50, TokensOut: 20, Cost: price.Cost(50, 20)}
			w.SettleAsync(id, []wallet.Entry{e}, func(_ wallet.Micros, err error) {
				live()
				settled <- err
			})
			exit()
			if err := <-settled; err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64((cputime.Process()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
}
