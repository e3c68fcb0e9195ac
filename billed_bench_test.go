package llmfailover

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// BenchmarkBilledRequest is what the wallet adds to a whole gateway
// request: the same non-streaming chat completion through the in-process
// Caddy, from 32 clients, with the wallet off and on (SQLite). Client,
// gateway and upstream share the process, so cpu-ns/op (the process's CPU
// time per request) holds all three; the difference between the two is
// the wallet's, admission to settlement, Caddy's request UUID and the
// meter included, which BenchmarkRequestPath (walletapp) leaves out. Run
// it on one core, as bench/run.sh runs Caddy, several times over (the two
// run one after the other, so a busy moment of the machine lands on one
// of them: compare medians):
//
//	LLMF_TEST_PORT_OFFSET=300 go test -run '^$' -bench BilledRequest -benchmem -cpu 1 -benchtime 20000x .
func BenchmarkBilledRequest(b *testing.B) {
	up := fu.New(fu.OK())
	b.Cleanup(up.Close)
	body := fu.ChatRequest("m", false)
	for _, c := range []struct {
		name   string
		wallet bool
	}{{"wallet-off", false}, {"wallet-on", true}} {
		b.Run(c.name, func(b *testing.B) {
			globals, directive := "", ""
			if c.wallet {
				globals, directive = storeOption("sqlite "+filepath.Join(b.TempDir(), "w.db")), "wallet"
			}
			gatewayWith(b, globals, `
				channel a %s
				model m {
					route a cost 1 1
					price 2 8
				}
				`+directive, up.URL)
			hdr := http.Header{"Content-Type": {"application/json"}}
			if c.wallet {
				hdr.Set("Authorization", "Bearer "+benchAccount(b))
			}
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}
			b.Cleanup(client.CloseIdleConnections)
			url := gatewayURL + "/v1/chat/completions"
			do := func() error {
				req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
				if err != nil {
					return err
				}
				req.Header = hdr.Clone()
				res, err := client.Do(req)
				if err != nil {
					return err
				}
				_, err = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if err == nil && res.StatusCode != http.StatusOK {
					return &statusError{res.StatusCode}
				}
				return err
			}
			for i := 0; i < 64; i++ { // warm the pools and the key cache
				if err := do(); err != nil {
					b.Fatal(err)
				}
			}
			b.SetParallelism(32)
			cpu0 := benchCPU(b)
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
			b.ReportMetric(float64((benchCPU(b)-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}

type statusError struct{ status int }

func (e *statusError) Error() string { return http.StatusText(e.status) }

// benchAccount creates a funded account with a key through the admin API
// and returns the key.
func benchAccount(b *testing.B) string {
	b.Helper()
	call := func(path string, in any, out any) {
		raw, _ := json.Marshal(in)
		res, err := adminClient.Post(adminURL+"/llm_wallet/"+path, "application/json", bytes.NewReader(raw))
		if err != nil {
			b.Fatal(err)
		}
		defer res.Body.Close()
		got, _ := io.ReadAll(res.Body)
		if res.StatusCode/100 != 2 {
			b.Fatalf("admin %s: %d %s", path, res.StatusCode, got)
		}
		if out != nil {
			if err := json.Unmarshal(got, out); err != nil {
				b.Fatal(err)
			}
		}
	}
	call("accounts", map[string]string{"id": "bench"}, nil)
	call("accounts/bench/credit", map[string]string{"amount": "1000000000"}, nil)
	var k struct {
		Key string `json:"key"`
	}
	call("accounts/bench/keys", map[string]string{"label": "bench"}, &k)
	if !strings.HasPrefix(k.Key, wallet.KeyPrefix) {
		b.Fatalf("create key answered %q", k.Key)
	}
	return k.Key
}

// benchCPU is the CPU time this process has used.
func benchCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
