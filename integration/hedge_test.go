package integration_test

import (
	"bytes"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// Hedged requests (hedge_after): the next channel is sent the request too
// when the first has no content after the delay; the first to produce
// content is served, the other cancelled.

// hedgedChannels serves model <name> from a then b (a different account
// each), hedged after <delay>; the last %s is more handler options.
const hedgedChannels = `
		channel a %s {
			header Authorization "Bearer upstream-key-a"
		}
		channel b %s {
			header Authorization "Bearer upstream-key-b"
		}
		model %s {
			route a cost 1 1
			route b cost 1 1
			hedge_after %s
			price 1 1
		}
		%s
`

// decisionsOf lists the journal's decisions of model with reason.
func decisionsOf(t *testing.T, model, reason string) []failoverapp.DecisionView {
	t.Helper()
	var ans failoverapp.DecisionsAnswer
	if err := adminGet(t, "/llm_failover/decisions?model="+model+"&reason="+reason, &ans); err != nil {
		t.Fatal(err)
	}
	return ans.Decisions
}

func TestHedgeServesTheFirstToProduceContent(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stream bool
		slow   fu.Behavior
	}{
		{"stream", true, fu.SlowFirstToken(5 * time.Second).Named("a")},
		{"whole answer", false, fu.SlowHeaders(5*time.Second, fu.OKNamed("a"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			model := "hedge-first-" + strings.ReplaceAll(tc.name, " ", "-")
			a := upstream(t, tc.slow)
			b := upstream(t, fu.OKNamed("b"))
			gateway(t, hedgedChannels, a.URL, b.URL, model, "200ms", "hedge {\n\t\t\tbudget 100%\n\t\t}")
			began := time.Now()
			res, body := post(t, "/v1/chat/completions", fu.ChatRequest(model, tc.stream))
			took := time.Since(began)
			if res.StatusCode != 200 {
				t.Fatalf("status %d: %s", res.StatusCode, body)
			}
			if got := res.Header.Get("X-Served-By"); got != "b" {
				t.Errorf("served by %q, want b", got)
			}
			mustNotContain(t, body, `" a"`, "Hello from a")
			if took > 3*time.Second {
				t.Errorf("answered after %s: the hedge did not win", took)
			}
			if got := res.Header.Get("X-Fault-Upstream"); got != "" && got != "b" {
				t.Errorf("headers of %q reached the client", got)
			}
			// The first channel's request was cancelled when b won.
			fu.Eventually(t, 2*time.Second, "a's request cancelled", func() bool { return a.InFlight() == 0 })
			hits(t, a, 1)
			hits(t, b, 1)
			started := decisionsOf(t, model, "hedge")
			lost := decisionsOf(t, model, "hedge_lost")
			if len(started) != 1 || started[0].Channel != "a" || started[0].Next != "b" {
				t.Errorf("hedge decisions %+v, want one from a to b", started)
			}
			if len(lost) != 1 || lost[0].Channel != "a" || lost[0].Next != "b" {
				t.Errorf("hedge_lost decisions %+v, want a beaten by b", lost)
			}
			if got := decisionsOf(t, model, "failover"); len(got) != 0 {
				t.Errorf("a lost hedge is no failover: %+v", got)
			}
		})
	}
}

func TestHedgeNotSentWhenTheFirstAnswersInTime(t *testing.T) {
	a := upstream(t, fu.OKNamed("a"))
	b := upstream(t, fu.OKNamed("b"))
	gateway(t, hedgedChannels, a.URL, b.URL, "hedge-none", "2s", "hedge {\n\t\t\tbudget 100%\n\t\t}")
	for _, stream := range []bool{true, false} {
		res, body := post(t, "/v1/chat/completions", fu.ChatRequest("hedge-none", stream))
		if res.StatusCode != 200 {
			t.Fatalf("status %d: %s", res.StatusCode, body)
		}
		answeredBy(t, res, "a")
	}
	hits(t, b, 0)
}

// A hedge is never sent for a request with effects or state upstream, nor
// for one the operator marks; the slow first channel answers it.
func TestHedgeNeverForRequestsWithEffects(t *testing.T) {
	a := upstream(t, fu.SlowFirstToken(600*time.Millisecond).Named("a"))
	b := upstream(t, fu.OKNamed("b"))
	// The handler's block is closed early to mark requests with Caddy's
	// vars directive; the template's closing brace ends a handle block.
	gateway(t, hedgedChannels, a.URL, b.URL, "hedge-fx", "100ms", `hedge {
			budget 100%
		}
	}
	@nohedge header X-No-Hedge 1
	vars @nohedge llm_failover_no_hedge true
	handle /never {
		respond 404`)
	chat := func(extra string) []byte {
		return []byte(`{"model":"hedge-fx","messages":[{"role":"user","content":"hi"}],"stream":true` + extra + `}`)
	}
	for name, tc := range map[string]struct {
		path string
		body []byte
		hdr  []string
	}{
		"store true":             {"/v1/chat/completions", chat(`,"store":true`), nil},
		"server-side tool":       {"/v1/chat/completions", chat(`,"tools":[{"type":"web_search_preview"}]`), nil},
		"responses stored":       {"/v1/responses", []byte(`{"model":"hedge-fx","input":"hi","stream":true}`), nil},
		"responses continuation": {"/v1/responses", []byte(`{"model":"hedge-fx","input":"hi","stream":true,"store":false,"previous_response_id":"resp_1"}`), nil},
		"background":             {"/v1/responses", []byte(`{"model":"hedge-fx","input":"hi","stream":true,"store":false,"background":true}`), nil},
		"marked by the operator": {"/v1/chat/completions", chat(""), []string{"X-No-Hedge", "1"}},
	} {
		t.Run(name, func(t *testing.T) {
			b.ResetHits()
			res, body := post(t, tc.path, tc.body, tc.hdr...)
			if res.StatusCode != 200 {
				t.Fatalf("status %d: %s", res.StatusCode, body)
			}
			answeredBy(t, res, "a")
			hits(t, b, 0)
		})
	}
	// The same request unmarked and without effects is hedged.
	b.ResetHits()
	res, body := post(t, "/v1/chat/completions", chat(`,"store":false,"tools":[{"type":"function","function":{"name":"f"}}]`))
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	answeredBy(t, res, "b")
}

// Hedges stay within the budget's share of the model's requests: 30
// requests at once, all slow on a, with a 10 % budget, hedge exactly 3.
func TestHedgeBudgetIsNeverExceeded(t *testing.T) {
	a := upstream(t, fu.SlowFirstToken(time.Second).Named("a"))
	b := upstream(t, fu.OKNamed("b"))
	gateway(t, hedgedChannels, a.URL, b.URL, "hedge-budget", "300ms", "hedge {\n\t\t\tbudget 10%\n\t\t}")
	var wg sync.WaitGroup
	var fromB atomic.Int64
	for range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, body := post(t, "/v1/chat/completions", fu.ChatRequest("hedge-budget", true))
			if res.StatusCode != 200 {
				t.Errorf("status %d: %s", res.StatusCode, body)
			}
			if res.Header.Get("X-Served-By") == "b" {
				fromB.Add(1)
			}
		}()
	}
	wg.Wait()
	if b.Hits() != 3 || fromB.Load() != 3 {
		t.Errorf("b was sent %d hedges and served %d, want 3 of 30 requests at a 10%% budget", b.Hits(), fromB.Load())
	}
}

// With a wallet both attempts are reserved; the loser's upstream cost is
// a ledger row of its own, the operator's by default and the client's
// with charge client; the balances and the audit stay exact.
func TestHedgeWalletReservesBothAndBillsTheLoserRightly(t *testing.T) {
	for _, tc := range []struct {
		name, charge string
		clientPays   bool
	}{
		{"operator pays", "", false},
		{"client pays", "\n\t\t\tcharge client", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			model := "hedge-w-" + strings.Fields(tc.name)[0]
			a := upstream(t, fu.SlowFirstToken(3*time.Second).Named("a").WithUsage(1000, 1000))
			b := upstream(t, fu.OKNamed("b").WithUsage(1000, 1000))
			gatewayWith(t, storeOption("sqlite "+filepath.Join(t.TempDir(), "w.db")), hedgedChannels, a.URL, b.URL, model, "200ms",
				"wallet\n\t\thedge {\n\t\t\tbudget 100%"+tc.charge+"\n\t\t}")
			secret, _ := newWalletAccount(t, "acct", "1")
			start, _ := balanceOf(t, "acct")
			res, body := postSettled(t, "acct", "/v1/chat/completions", fu.ChatRequest(model, true), bearer(secret)...)
			if res.StatusCode != 200 {
				t.Fatalf("status %d: %s", res.StatusCode, body)
			}
			answeredBy(t, res, "b")
			waitUnreserved(t, "acct")
			rows := requestRows(t, "acct")
			t.Logf("ledger: %s", kinds(rows))
			var charged wallet.Micros
			var lost *string
			for _, r := range rows {
				if r.Kind == wallet.KindCharge {
					charged += money(t, r.Cost)
				}
				if r.Kind == wallet.KindFailedAttempt && strings.Contains(r.Note, "hedge_lost") {
					n := r.Note
					lost = &n
				}
			}
			bal, _ := balanceOf(t, "acct")
			if start-bal != charged {
				t.Errorf("balance fell by %s, the ledger charges %s", start-bal, charged)
			}
			bCost := wallet.Micros(2000) // 1,000 in and 1,000 out at $1 per million
			switch {
			case tc.clientPays:
				if charged <= bCost || lost != nil {
					t.Errorf("charge client: charged %s (b's answer is %s), operator row %v", charged, bCost, lost)
				}
			default:
				if charged != bCost {
					t.Errorf("charged %s, want only b's answer, %s", charged, bCost)
				}
				if lost == nil || !strings.Contains(*lost, "borne by the operator") {
					t.Errorf("no operator row for the loser: %s", kinds(rows))
				}
			}
			if got := decisionsOf(t, model, "hedge_lost"); len(got) != 1 || got[0].CostMicros <= 0 {
				t.Errorf("hedge_lost decisions %+v, want one with its cost", got)
			}
			auditClean(t)
		})
	}
}

// An account that can cover one reservation but not a second is served
// unhedged: no hedge may be sent that the wallet cannot cover.
func TestHedgeNeedsASecondReservation(t *testing.T) {
	a := upstream(t, fu.SlowFirstToken(600*time.Millisecond).Named("a").WithUsage(10, 10))
	b := upstream(t, fu.OKNamed("b"))
	gatewayWith(t, storeOption("sqlite "+filepath.Join(t.TempDir(), "w.db")), hedgedChannels, a.URL, b.URL, "hedge-poor", "100ms",
		"wallet\n\t\thedge {\n\t\t\tbudget 100%\n\t\t}")
	// With max_tokens 1000 one reservation is about $0.0021 at $1 per
	// million tokens: the balance covers one, not two.
	secret, _ := newWalletAccount(t, "poor", "0.003")
	body := []byte(`{"model":"hedge-poor","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":1000}`)
	res, out := postSettled(t, "poor", "/v1/chat/completions", body, bearer(secret)...)
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, out)
	}
	answeredBy(t, res, "a")
	hits(t, b, 0)
	waitUnreserved(t, "poor")
	auditClean(t)
}

// Hedging under load, in process and with the race detector: 200 billed
// streams at once, 2 % of first attempts stalling 10 s before their first
// token. Every stalled request is hedged and answered long before the
// stall ends, the losers cost at most 5 % of what was spent, and the
// wallet's audit stays clean. (The tail's figures are measured on the
// release binary, with 1,000: e2e/TestBinaryHedgeCutsTheTail.)
func TestHedgeUnderLoad(t *testing.T) {
	const total, stallEvery = 200, 50 // 2 %
	stall := 10 * time.Second
	var n atomic.Int64
	a := upstream(t, fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		if n.Add(1)%stallEvery == 0 {
			fu.SlowFirstToken(stall).Named("a").WithUsage(200, 100).Serve(w, r, 0)
			return
		}
		fu.OKNamed("a").WithUsage(200, 100).Serve(w, r, 0)
	}))
	b := upstream(t, fu.OKNamed("b").WithUsage(200, 100))
	gatewayWith(t, storeOption("sqlite "+filepath.Join(t.TempDir(), "w.db")), hedgedChannels, a.URL, b.URL, "load-hedged", "1s", `wallet
		hedge {
			budget 100%
		}`)
	secret, _ := newWalletAccount(t, "load", "100")
	start, _ := balanceOf(t, "load")
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: total}}
	defer client.CloseIdleConnections()
	body := []byte(`{"model":"load-hedged","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":200}`)
	var wg sync.WaitGroup
	var slowest atomic.Int64
	for range total {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPost, gatewayURL+"/v1/chat/completions", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+secret)
			began := time.Now()
			res, err := client.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			out, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if took := int64(time.Since(began)); took > slowest.Load() {
				slowest.Store(took)
			}
			if res.StatusCode != 200 || !bytes.Contains(out, []byte("[DONE]")) {
				t.Errorf("status %d: %.200s", res.StatusCode, out)
			}
		}()
	}
	wg.Wait()
	waitUnreserved(t, "load")
	started, lost := decisionsOf(t, "load-hedged", "hedge"), decisionsOf(t, "load-hedged", "hedge_lost")
	var spend, extra, charged wallet.Micros
	for _, r := range requestRows(t, "load") {
		switch {
		case r.Kind == wallet.KindCharge:
			spend += money(t, r.Cost)
			charged += money(t, r.Cost)
		case r.Kind == wallet.KindFailedAttempt && strings.Contains(r.Note, "hedge_lost"):
			extra += operatorCost(t, r.Note)
		}
	}
	t.Logf("%d streams at once, %d%% of first attempts stalling %s: slowest answer %s, %d hedges, %d losers; spend %s, losers %s",
		total, 100/stallEvery, stall, time.Duration(slowest.Load()).Round(time.Millisecond), len(started), len(lost), spend, extra)
	if stalls := total / stallEvery; len(started) < stalls || len(lost) < stalls {
		t.Errorf("%d hedges and %d losers for %d stalled first attempts", len(started), len(lost), stalls)
	}
	if time.Duration(slowest.Load()) >= stall {
		t.Errorf("an answer took %s: a stalled attempt was waited for", time.Duration(slowest.Load()))
	}
	if float64(extra) > 0.05*float64(spend) {
		t.Errorf("losers cost %s, over 5%% of the %s spent", extra, spend)
	}
	if bal, _ := balanceOf(t, "load"); start-bal != charged {
		t.Errorf("balance fell by %s, the ledger charges %s", start-bal, charged)
	}
	auditClean(t)
}

// operatorCost reads the cost a hedge_lost ledger row's note names.
func operatorCost(t *testing.T, note string) wallet.Micros {
	t.Helper()
	_, rest, ok := strings.Cut(note, "upstream cost ")
	if !ok {
		t.Fatalf("no cost in %q", note)
	}
	// "upstream cost 0.0003 (estimated), borne by the operator", or,
	// when the loser reported its usage before it was cancelled (which
	// depends on timing), "upstream cost 0.0003, borne by ...".
	return money(t, strings.TrimSuffix(strings.Fields(rest)[0], ","))
}

// answeredBy checks which channel served an answer (the site's X-Served-By).
func answeredBy(t *testing.T, res *http.Response, want string) {
	t.Helper()
	if got := res.Header.Get("X-Served-By"); got != want {
		t.Errorf("served by %q, want %q", got, want)
	}
}

// hedge_after p<NN> hedges after the first channel's own quantile of time
// to first content, once it has answered enough requests of that size
// (min_samples, 50 by default): no hedge before, however slow the first
// channel, then one as soon as it is slower than its quantile.
func TestHedgeAfterAQuantileOfTheChannelsOwnLatency(t *testing.T) {
	a := upstream(t, fu.SlowFirstToken(300*time.Millisecond).Named("a"))
	b := upstream(t, fu.OKNamed("b"))
	gateway(t, hedgedChannels, a.URL, b.URL, "hedge-q", "p99", "hedge {\n\t\t\tbudget 100%\n\t\t}")
	before := len(decisionsOf(t, "hedge-q", "hedge")) // the journal outlives a config
	// Answers 1 to 50 of a: too few to know its p99 when each was sent,
	// so none is hedged, the slow first one included.
	res, _ := post(t, "/v1/chat/completions", fu.ChatRequest("hedge-q", true))
	answeredBy(t, res, "a")
	a.Set(fu.OKNamed("a"))
	for range 49 {
		if res, body := post(t, "/v1/chat/completions", fu.ChatRequest("hedge-q", true)); res.StatusCode != 200 {
			t.Fatalf("status %d: %s", res.StatusCode, body)
		}
	}
	hits(t, b, 0)
	// Now a's p99 is known (its slowest, 300 ms): a 3 s answer is hedged.
	a.Set(fu.SlowFirstToken(3 * time.Second).Named("a"))
	res, _ = post(t, "/v1/chat/completions", fu.ChatRequest("hedge-q", true))
	answeredBy(t, res, "b")
	if got := len(decisionsOf(t, "hedge-q", "hedge")) - before; got != 1 {
		t.Errorf("%d hedge decisions, want one", got)
	}
}

// A hedge never goes to a channel of the first one's provider account
// (its rate limits and outages are the same), nor to one that is parked.
func TestHedgeNeverToTheSameAccountOrAParkedChannel(t *testing.T) {
	t.Run("same account", func(t *testing.T) {
		a := upstream(t, fu.SlowFirstToken(600*time.Millisecond).Named("a"))
		b := upstream(t, fu.OKNamed("b"))
		gateway(t, `
		channel a %s {
			header Authorization "Bearer one-account-key"
		}
		channel b %s {
			header Authorization "Bearer one-account-key"
		}
		model hedge-acct {
			route a cost 1 1
			route b cost 2 2
			hedge_after 100ms
		}
		hedge {
			budget 100%%
		}`, a.URL, b.URL)
		res, _ := post(t, "/v1/chat/completions", fu.ChatRequest("hedge-acct", true))
		answeredBy(t, res, "a")
		hits(t, b, 0)
	})
	t.Run("parked", func(t *testing.T) {
		a := upstream(t, fu.OKNamed("a"))
		b := upstream(t, fu.Status(429, "").WithHeader("Retry-After", "60"))
		gateway(t, hedgedChannels, a.URL, b.URL, "hedge-park", "100ms", "hedge {\n\t\t\tbudget 100%\n\t\t}")
		// A slow first answer hedges to b, which parks itself for a minute.
		a.Set(fu.SlowFirstToken(600 * time.Millisecond).Named("a"))
		res, _ := post(t, "/v1/chat/completions", fu.ChatRequest("hedge-park", true))
		answeredBy(t, res, "a")
		hits(t, b, 1)
		// b is parked: the next slow answer is not hedged to it.
		res, _ = post(t, "/v1/chat/completions", fu.ChatRequest("hedge-park", true))
		answeredBy(t, res, "a")
		hits(t, b, 1)
	})
}
