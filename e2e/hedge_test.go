package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

var portsHedge = ports{19625, 19626}

// The measure, on the release binary: 1,000 billed streams at
// once, 2 % of first attempts stalling 10 s before their first token,
// sent once to a model without hedging and once to the same chain hedged
// after 2 s (budget 5 %: the stalls and some slow ones under this load). Hedged, the 99th percentile of the time to first
// token is at least 40 % lower, the losers' upstream cost is at most 5 %
// of what the hedged requests cost, the balance fell by exactly what the
// ledger charged, and the wallet's audit is clean.
func TestBinaryHedgeCutsTheTail(t *testing.T) {
	caddyBin(t)
	const total, stallEvery = 1000, 50
	stall := 10 * time.Second
	var n atomic.Int64
	a := fu.New(fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		if n.Add(1)%stallEvery == 0 {
			fu.SlowFirstToken(stall).Named("a").WithUsage(200, 100).Serve(w, r, 0)
			return
		}
		fu.OKNamed("a").WithUsage(200, 100).Serve(w, r, 0)
	}))
	defer a.Close()
	b := fu.New(fu.OKNamed("b").WithUsage(200, 100))
	defer b.Close()
	p := portsHedge
	in := newInstance(t, "hedge", p, withWallet(globalOptions(p), "\t\tstore sqlite {env.XDG_DATA_HOME}/w.db")+site(p, fmt.Sprintf(`
		channel a %s {
			header Authorization "Bearer upstream-key-a"
		}
		channel b %s {
			header Authorization "Bearer upstream-key-b"
		}
		model tail-plain {
			route a cost 1 1
			route b cost 1 1
			price 1 1
		}
		model tail-hedged {
			route a cost 1 1
			route b cost 1 1
			price 1 1
			hedge_after 2s
		}
		hedge {
			budget 5%%
		}
		wallet
`, a.URL, b.URL)))
	secret := in.newAccount("tail", "100")
	start := micros(t, in.account("tail").Balance)
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: total, MaxConnsPerHost: total}}
	defer client.CloseIdleConnections()
	run := func(model string) (p50, p99 time.Duration) {
		n.Store(0)
		body := []byte(`{"model":"` + model + `","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":200}`)
		ttft := make([]time.Duration, total)
		var wg sync.WaitGroup
		for i := range total {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest(http.MethodPost, in.gatewayURL()+"/v1/chat/completions", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+secret)
				began := time.Now()
				res, err := client.Do(req)
				if err != nil {
					t.Errorf("%s: %v", model, err)
					return
				}
				// The stream gate holds the headers until the first
				// content: their arrival is the time to first token.
				ttft[i] = time.Since(began)
				out, _ := io.ReadAll(res.Body)
				res.Body.Close()
				if res.StatusCode != 200 || !bytes.Contains(out, []byte("[DONE]")) {
					t.Errorf("%s: status %d: %.200s", model, res.StatusCode, out)
				}
			}()
		}
		wg.Wait()
		sort.Slice(ttft, func(i, j int) bool { return ttft[i] < ttft[j] })
		return ttft[total/2], ttft[total*99/100]
	}
	plain50, plain99 := run("tail-plain")
	hedged50, hedged99 := run("tail-hedged")
	if !waitFor(30*time.Second, func() bool { return micros(t, in.account("tail").Reserved) == 0 }) {
		t.Fatal("reservations still held 30 s after the last answer")
	}
	m := scrape(t, in)
	spend := m[`caddy_llm_failover_wallet_charged_micros_total{model="tail-hedged"}`]
	extra := m[`caddy_llm_failover_hedge_cost_micros_total{model="tail-hedged",paid_by="operator"}`]
	hedges := m[`caddy_llm_failover_hedges_total{model="tail-hedged",outcome="started"}`]
	t.Logf("time to first token, %d streams at once, %d%% of first attempts stalling %s: unhedged p50 %s p99 %s; hedged p50 %s p99 %s (%.0f hedges); hedged requests cost %s, their losers %s (%.3f%%)",
		total, 100/stallEvery, stall, plain50.Round(time.Millisecond), plain99.Round(time.Millisecond),
		hedged50.Round(time.Millisecond), hedged99.Round(time.Millisecond), hedges,
		wallet.Micros(spend), wallet.Micros(extra), 100*extra/spend)
	if hedges == 0 {
		t.Fatal("nothing was hedged: the test proves nothing")
	}
	if float64(hedged99) > 0.6*float64(plain99) {
		t.Errorf("hedged p99 %s is not 40%% below the unhedged %s", hedged99, plain99)
	}
	if spend == 0 || extra > 0.05*spend {
		t.Errorf("losers cost %v, over 5%% of the %v the hedged requests cost", extra, spend)
	}
	charged := m[`caddy_llm_failover_wallet_charged_micros_total{model="tail-plain"}`] + spend
	if fell := start - micros(t, in.account("tail").Balance); float64(fell) != charged {
		t.Errorf("the balance fell by %s; %s was charged", fell, wallet.Micros(charged))
	}
	fleetAudit(t, in)
}

// scrape reads the instance's Prometheus metrics (admin /metrics) into a
// map from series (name and labels, as exposed) to value.
func scrape(t *testing.T, in *instance) map[string]float64 {
	t.Helper()
	res, err := http.Get(in.adminURL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}
