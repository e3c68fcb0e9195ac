package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
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
