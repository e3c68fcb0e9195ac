package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// TestBinarySigtermHonoursGracePeriod stops caddy with SIGTERM while a
// billed stream is stalled. The operator's grace_period bounds the stop:
// the wallet must not hold the process until the stream ends (a stop that
// outlives its grace period gets SIGKILLed by systemd or Kubernetes
// anyway). The reservation the cut stream leaves behind is released by the
// sweeper after the restart.
func TestBinarySigtermHonoursGracePeriod(t *testing.T) {
	stall := fu.New(fu.StallMidStream(60 * time.Second))
	defer stall.Close()
	p := portsSigterm
	in := newInstance(t, "sigterm", p, withWallet(globalOptionsGrace(p, "2s"), "\t\treservation_ttl 1s\n\t\tlease_ttl 1s")+site(p, fmt.Sprintf(`
		channel stall %s
		model gpt-stall {
			route stall cost 1 2
			max_output_tokens 1000
		}
		wallet
`, stall.URL)))
	secret := in.newAccount("acme", "5")
	st := openStream(t, in, "gpt-stall", secret)
	if a := in.account("acme"); micros(t, a.Reserved) <= 0 {
		t.Fatalf("no reservation during the stream: %+v", a)
	}

	start := time.Now()
	in.stop()
	took := time.Since(start)
	t.Logf("SIGTERM to exit: %v (grace_period 2s)", took.Round(time.Millisecond))
	// 2s of grace plus generous slack for a loaded machine; a wallet that
	// waits for the stream takes the full 60s stall (or its own bound).
	if took > 10*time.Second {
		t.Errorf("caddy took %v to exit on SIGTERM with grace_period 2s: something waits for the stalled stream", took)
	}
	st.wait(t, 10*time.Second)
	if st.err == nil {
		// The body must not look complete: the stream was cut.
		if text, _ := chatText(st.events); strings.HasSuffix(text, "upstream") {
			t.Errorf("the stream completed although the upstream was still stalled: %q", text)
		}
	}

	in.start()
	var a account
	if !waitFor(10*time.Second, func() bool { a = in.account("acme"); return micros(t, a.Reserved) == 0 }) {
		t.Fatalf("after restart the cut stream's reservation is still held: %+v", a)
	}
	if a.Balance != "5" {
		t.Errorf("after the sweep the balance is %s, want 5", a.Balance)
	}
}

// TestBinaryReloadSwitchesWalletStore reloads onto another wallet database
// while a billed stream on the old one is open. The reload must not wait
// for the stream, the new store must be live at once, and the old store
// must stay open until the stream has settled there.
func TestBinaryReloadSwitchesWalletStore(t *testing.T) {
	stall := fu.New(fu.StallMidStream(6 * time.Second))
	defer stall.Close()
	p := portsSwitch
	config := func(db string) string {
		return withWallet(globalOptions(p), "\t\tstore sqlite "+db) + site(p, fmt.Sprintf(`
		channel stall %s
		model gpt-stall {
			route stall cost 1 2
			max_output_tokens 1000
		}
		wallet
`, stall.URL))
	}
	dir := t.TempDir()
	oldDB, newDB := filepath.Join(dir, "one.db"), filepath.Join(dir, "two.db")
	in := newInstance(t, "switch", p, config(oldDB))
	secret := in.newAccount("acme", "5")
	st := openStream(t, in, "gpt-stall", secret)

	in.writeConfig(config(newDB))
	start := time.Now()
	out, err := runCaddy(t, in.env, "reload", "--config", in.cfgPath, "--adapter", "caddyfile", "--address", in.adminAddr())
	took := time.Since(start)
	if err != nil {
		t.Fatalf("caddy reload: %v\n%s", err, out)
	}
	t.Logf("reload onto a new wallet store took %v while a 6s stall was open", took.Round(time.Millisecond))
	// The new store is live: it has no accounts yet.
	in.admin(http.MethodGet, "/llm_wallet/accounts/acme", nil, 404, nil)
	if took > 4*time.Second {
		t.Errorf("caddy reload took %v: it waited for the open stream", took)
	}

	st.wait(t, 20*time.Second)
	if st.err != nil {
		t.Fatalf("the stream on the old store broke: %v", st.err)
	}
	if text, sawErr := chatText(st.events); text != "Hello from upstream" || sawErr {
		t.Errorf("stream text %q (error: %v), want the whole answer", text, sawErr)
	}
	// Let the settlement land, then read the old database directly (caddy
	// is stopped first so nothing else holds it).
	time.Sleep(300 * time.Millisecond)
	in.stop()
	store, err := wallet.OpenSQLite(oldDB)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	acct, err := store.Account(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	// 11 input tokens at $1/M and 7 output tokens at $2/M.
	want := micros(t, "5") - micros(t, "0.000025")
	if acct.Reserved != 0 || acct.Balance != want {
		t.Errorf("old store after the stream: balance %s reserved %s, want balance %s and nothing reserved (settled on the old store)", acct.Balance, acct.Reserved, want)
	}
	rows, err := store.Usage(ctx, "acme", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	charged := false
	for _, e := range rows {
		charged = charged || e.Kind == "charge" && e.Cost == micros(t, "0.000025")
	}
	if !charged {
		t.Errorf("old store's ledger has no charge for the stream: %+v", rows)
	}
}

// TestBinarySigtermChargesEveryAnswer stops caddy with SIGTERM under a
// steady billed load. Settlements run after the handlers return and are
// written in batches a few milliseconds apart, so the stop must write the
// ones already decided before the process exits (that wait itself is
// TestReleaseWaitsForSettlements in walletapp: here the server's own
// shutdown usually gives them time). Every answer the clients got in full
// is charged exactly once, the books balance, and the stop returned its
// lease's spare money at once (fails when the store closes in the
// background, as it did: the money waited for lease_ttl).
func TestBinarySigtermChargesEveryAnswer(t *testing.T) {
	up := fu.New(fu.OKNamed("paid").WithUsage(10, 5))
	defer up.Close()
	p := portsSigtermLoad
	cfg := withWallet(globalOptionsGrace(p, "5s"), "") + site(p, fmt.Sprintf(`
		channel paid %s
		model gpt-paid {
			route paid cost 1 2
			max_output_tokens 100
		}
		wallet
`, up.URL))
	cfg = strings.Replace(cfg, "\t\tdefer\n", "\t\tdefer\n\t\tX-Request-Id {http.request.uuid}\n", 1)
	in := newInstance(t, "sigterm-load", p, cfg)
	secret := in.newAccount("acme", "1000")

	var (
		mu       sync.Mutex
		answered []string // X-Request-Id of every 200 read in full
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
			body := fu.ChatRequest("gpt-paid", false)
			for {
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest(http.MethodPost, in.gatewayURL()+"/v1/chat/completions", bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+secret)
				req.Header.Set("Content-Type", "application/json")
				res, err := client.Do(req)
				if err != nil {
					select {
					case <-stop:
						return
					case <-time.After(10 * time.Millisecond): // stopping: refused connections
						continue
					}
				}
				_, rerr := io.ReadAll(res.Body)
				res.Body.Close()
				if rerr == nil && res.StatusCode == http.StatusOK {
					mu.Lock()
					answered = append(answered, res.Header.Get("X-Request-Id"))
					mu.Unlock()
				}
				time.Sleep(5 * time.Millisecond) // the ledger read below takes 1,000 rows
			}
		}()
	}
	time.Sleep(700 * time.Millisecond) // a steady load
	in.stop()
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(answered) < 20 {
		t.Fatalf("only %d answers before the stop", len(answered))
	}

	in.start()
	charges := map[string]int{}
	var charged wallet.Micros
	for _, e := range in.ledger("acme") {
		if e.Kind == wallet.KindCharge {
			charges[e.RequestID]++
			charged += micros(t, e.Cost)
		}
	}
	lost := 0
	for _, id := range answered {
		switch n := charges[id]; {
		case id == "":
			t.Fatal("an answer without X-Request-Id")
		case n == 0:
			lost++
		case n > 1:
			t.Errorf("answer %s charged %d times", id, n)
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d answers given before SIGTERM were never charged", lost, len(answered))
	}
	if len(charges) != len(answered) {
		t.Errorf("%d requests charged, %d answered in full", len(charges), len(answered))
	}
	// A clean stop returned its lease: nothing waits for lease_ttl (30s).
	a := in.account("acme")
	if micros(t, a.Reserved) != 0 {
		t.Errorf("after a clean stop money is still reserved: %+v", a)
	}
	if micros(t, a.Balance) != micros(t, "1000")-charged {
		t.Errorf("balance %s, want 1000 minus the charges %s", a.Balance, charged)
	}
	t.Logf("%d answers before SIGTERM, every one charged once", len(answered))
}
