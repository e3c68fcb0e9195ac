package integration_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/cputime"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/internal/pgtest"
)

// BenchmarkBilledRequest is what the wallet, and idempotency on top of
// it, add to a whole gateway request: the same non-streaming chat
// completion through the in-process Caddy, from 32 clients, with the
// wallet off, on (SQLite, PostgreSQL when LLMF_TEST_POSTGRES_DSN is set)
// and on with every request carrying a fresh Idempotency-Key (its claim,
// recording and kept answer). Client, gateway and upstream share the
// process, so cpu-ns/op (the process's CPU time per request) holds all
// three; the differences between the cases are the wallet's and
// idempotency's, which BenchmarkRequestPath (walletapp) leaves out. Run it
// on one core, as bench/run.sh runs Caddy, several times over (the cases
// run one after the other, so a busy moment of the machine lands on one
// of them: compare medians):
//
//	LLMF_TEST_PORT_OFFSET=300 go test -run '^$' -bench BilledRequest -benchmem -cpu 1 -benchtime 20000x .
func BenchmarkBilledRequest(b *testing.B) {
	up := fu.New(fu.OK())
	b.Cleanup(up.Close)
	body := fu.ChatRequest("m", false)
	for _, c := range []struct {
		name, store string
		idempotent  bool
	}{{"wallet-off", "", false}, {"wallet-on", "sqlite", false}, {"idempotent-sqlite", "sqlite", true},
		{"wallet-on-postgres", "postgres", false}, {"idempotent-postgres", "postgres", true}} {
		b.Run(c.name, func(b *testing.B) {
			globals, directive := "", ""
			switch c.store {
			case "sqlite":
				globals, directive = storeOption("sqlite "+filepath.Join(b.TempDir(), "w.db")), "wallet"
			case "postgres":
				if os.Getenv("LLMF_TEST_POSTGRES_DSN") == "" {
					b.Skip("LLMF_TEST_POSTGRES_DSN is not set")
				}
				globals, directive = storeOption("postgres "+pgtest.FreshDSN(b)), "wallet"
			}
			if c.idempotent {
				directive += "\n\t\t\t\tidempotency"
			}
			gatewayWith(b, globals, `
				channel a %s
				model m {
					route a cost 1 1
					price 2 8
				}
				`+directive, up.URL)
			hdr := http.Header{"Content-Type": {"application/json"}}
			if c.store != "" {
				secret, _ := newWalletAccount(b, "bench", "1000000000")
				hdr.Set("Authorization", "Bearer "+secret)
			}
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}
			b.Cleanup(client.CloseIdleConnections)
			url := gatewayURL + "/v1/chat/completions"
			var keys atomic.Int64
			do := func() error {
				req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
				if err != nil {
					return err
				}
				req.Header = hdr.Clone()
				if c.idempotent {
					req.Header.Set("Idempotency-Key", fmt.Sprintf("bench-%s-%d", b.Name(), keys.Add(1)))
				}
				res, err := client.Do(req)
				if err != nil {
					return err
				}
				_, err = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if err == nil && res.StatusCode != http.StatusOK {
					return fmt.Errorf("status %d", res.StatusCode)
				}
				return err
			}
			for i := 0; i < 64; i++ { // warm the pools and the key cache
				if err := do(); err != nil {
					b.Fatal(err)
				}
			}
			b.SetParallelism(32)
			cpu0 := cputime.Process()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := do(); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64((cputime.Process()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}
