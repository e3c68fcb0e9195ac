package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/faultproxy"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

var (
	portsIdemA = ports{19619, 19620}
	portsIdemB = ports{19621, 19622}
)

// idemSite is a billed model whose requests are idempotent, on the fleet's
// PostgreSQL wallet; a dead instance's claims are taken over after 2 s.
func idemSite(p ports, upstream string) string {
	return withWallet(globalOptions(p), fleetWallet) + site(p, oneDollarModel("idem", "gpt-idem", upstream)+`
		idempotency {
			lease 2s
		}
`)
}

// keyedPost posts body with the client's key and an Idempotency-Key.
func keyedPost(t *testing.T, url, secret, key string, body []byte) (int, http.Header, []byte) {
	t.Helper()
	return post(t, url+"/v1/chat/completions", body, "Authorization", "Bearer "+secret, "Idempotency-Key", key)
}

// Two instances on one PostgreSQL: duplicates sent to both at once run
// once and are charged once, and both get the same answer. Then the
// instance running a call is killed (-9) mid-run: its duplicate, sent to
// the survivor, waits for the dead instance's claim to lapse and runs the
// call once more; the dead run is never charged, so the account pays
// once per call.
func TestBinaryIdempotencyAcrossTheFleet(t *testing.T) {
	caddyBin(t)
	dsn := createDatabase(t, postgresDSN(t))
	up := fu.New(fu.SlowHeaders(700*time.Millisecond, fu.OKNamed("idem").WithUsage(11, 10)))
	defer up.Close()
	a := newInstance(t, "idem-a", portsIdemA, idemSite(portsIdemA, up.URL), "LLMF_E2E_DSN="+dsn)
	b := newInstance(t, "idem-b", portsIdemB, idemSite(portsIdemB, up.URL), "LLMF_E2E_DSN="+dsn)
	secret := a.newAccount("acme", "1000")
	body := []byte(`{"model":"gpt-idem","messages":[{"role":"user","content":"Say hello."}]}`)

	const calls = 20
	var wg sync.WaitGroup
	for i := range calls {
		key := fmt.Sprintf("call-%d", i)
		var got [2][]byte
		var status [2]int
		var pair sync.WaitGroup
		for j, in := range []*instance{a, b} {
			wg.Add(1)
			pair.Add(1)
			go func() {
				defer wg.Done()
				defer pair.Done()
				if j == 1 {
					time.Sleep(100 * time.Millisecond) // the first claims it
				}
				status[j], _, got[j] = keyedPost(t, in.gatewayURL(), secret, key, body)
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pair.Wait()
			if status[0] != 200 || status[1] != 200 || !bytes.Equal(got[0], got[1]) {
				t.Errorf("call %d: %d %q on a, %d %q on b", i, status[0], got[0], status[1], got[1])
			}
		}()
	}
	wg.Wait()
	if n := up.Hits(); n != calls {
		t.Errorf("%d upstream runs for %d calls across two instances", n, calls)
	}

	// Kill the instance running a call.
	before := up.Hits()
	go func() {
		// It dies with the instance (Go's client even retries it, an
		// Idempotency-Key making a POST retryable to net/http): ignored.
		req, _ := http.NewRequest(http.MethodPost, a.gatewayURL()+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Idempotency-Key", "killed")
		if res, err := gatewayClient.Do(req); err == nil {
			res.Body.Close()
		}
	}()
	if !waitFor(5*time.Second, func() bool { return up.Hits() > before }) {
		t.Fatal("the call never reached the upstream")
	}
	a.kill9()
	status, h, got := keyedPost(t, b.gatewayURL(), secret, "killed", body)
	if status != 200 || h.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the survivor's run of the dead instance's call: %d %v %s", status, h, got)
	}
	if n := up.Hits() - before; n != 2 {
		t.Errorf("%d upstream runs of the killed call, want 2 (the dead one and the survivor's)", n)
	}
	// The money: one charge per call; the dead run's hold comes back.
	var acct account
	if !waitFor(fleetHoldTTL+15*time.Second, func() bool { acct = b.account("acme"); return micros(t, acct.Reserved) == 0 }) {
		t.Fatalf("money still reserved: %+v", acct)
	}
	charges := 0
	for _, e := range b.ledger("acme") {
		if e.Kind == "charge" {
			charges++
		}
	}
	if charges != calls+1 || micros(t, acct.Balance) != micros(t, "1000")-micros(t, fmt.Sprint(calls+1)) {
		t.Errorf("%d charges, balance %s; want %d charges of $1", charges, acct.Balance, calls+1)
	}
}

var portsSDKIdem = ports{19623, 19624}

// The official SDKs' own retries are charged once: each SDK sends one
// call with an Idempotency-Key; while the call runs upstream the test
// resets the client's connection (a proxy between them), the SDK retries
// with the same key, and the gateway answers the retry from the first
// run. One upstream run and one charge per call.
func TestSDKRetriesAreChargedOnce(t *testing.T) {
	caddyBin(t)
	node, sdkDir := sdkPrerequisites(t)
	up := fu.New(fu.SlowHeaders(1500*time.Millisecond, fu.OKNamed("idem").WithUsage(11, 10)))
	defer up.Close()
	p := portsSDKIdem
	in := newInstance(t, "sdk-idem", p, withWallet(globalOptions(p), "\t\tstore sqlite {env.XDG_DATA_HOME}/w.db")+site(p, fmt.Sprintf(`
		channel a %s
		model gpt-idem {
			route a
			price 0 100000
			max_output_tokens 10
		}
		model claude-idem {
			route a
			price 0 100000
			max_output_tokens 64
		}
		wallet
		idempotency
`, up.URL)))
	secret := in.newAccount("sdk", "100")
	proxy, err := faultproxy.New(fmt.Sprintf("127.0.0.1:%d", p.HTTP))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "idempotency.mjs")
	cmd.Dir = sdkDir
	cmd.Env = append(os.Environ(), "GATEWAY_URL=http://"+proxy.Addr(), "WALLET_KEY="+secret, "NO_COLOR=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Each call: once it runs upstream, cut the client off.
	for call := int64(1); call <= 2; call++ {
		if !waitFor(20*time.Second, func() bool { return up.Hits() >= call }) {
			t.Fatalf("call %d never reached the upstream:\n%s", call, out.String())
		}
		time.Sleep(200 * time.Millisecond)
		proxy.Reset()
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("node idempotency.mjs: %v\n%s", err, out.String())
	}
	for _, sdk := range []string{"openai", "anthropic"} {
		if !strings.Contains(out.String(), `{"sdk":"`+sdk+`","text":"Hello from idem","replayed":"true"}`) {
			t.Errorf("%s: the retry was not answered from the first run:\n%s", sdk, out.String())
		}
	}
	if n := up.Hits(); n != 2 {
		t.Errorf("%d upstream runs for 2 calls", n)
	}
	var acct account
	if !waitFor(10*time.Second, func() bool { acct = in.account("sdk"); return micros(t, acct.Reserved) == 0 }) {
		t.Fatalf("money still reserved: %+v", acct)
	}
	charges := 0
	for _, e := range in.ledger("sdk") {
		if e.Kind == "charge" {
			charges++
		}
	}
	if charges != 2 || micros(t, acct.Balance) != micros(t, "98") {
		t.Errorf("%d charges, balance %s; want 2 charges of $1", charges, acct.Balance)
	}
}
