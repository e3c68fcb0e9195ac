package integration_test

import (
	"fmt"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/probe"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// testRun numbers the channel names of tests whose state is process-wide
// (probe records, breakers, history), so that -count=N runs each on names
// of its own.
var testRun atomic.Int64

func uniqueName(base string) string { return fmt.Sprintf("%s%d", base, testRun.Add(1)) }

// A 400 to the probe is the probe's own parameters (a max_tokens below
// the provider's minimum, say): reported as a probe configuration error,
// neither passed nor failed, and the channel stays closed and is not
// shown down.
func TestProbeBadRequestIsConfigError(t *testing.T) {
	up := fu.New(fu.Status(400, fu.OpenAIErrorBody("max_tokens is too small", "invalid_request_error", "")))
	defer up.Close()
	prefix := uniqueName("prCfg")
	probeGateway(t, prefix, "http://"+up.Addr(), "interval 100ms\n\t\t\t\tmax_tokens 1")

	waitFor(t, 2*time.Second, "three probes", func() bool { return up.Hits() >= 3 })
	var p map[string]any
	waitFor(t, 2*time.Second, "the probe shown as a config error", func() bool {
		_, p = probedChannel(t, prefix+"A")
		return p["last_result"] == string(probe.ConfigError)
	})
	if st, _ := probedChannel(t, prefix+"A"); st != "closed" {
		t.Errorf("a probe's own 400 changed the breaker: state %s", st)
	}
	w, _ := p["windows"].(map[string]any)["5m"].(map[string]any)
	if w["down"] != 0.0 || w["successes"] != 0.0 || w["client"].(float64) < 1 {
		t.Errorf("probe history 5m = %v; want client only", w)
	}
	v := fetchStatus(t, adminURL+"/llm_failover/status")
	for _, m := range v.Models {
		for _, c := range m.Channels {
			if c.Name == prefix+"A" && (c.Status == "down" || c.Windows["5m"].Attempts != 0) {
				t.Errorf("channel %s: status %s, real traffic %+v; a probe's mistake must not show", c.Name, c.Status, c.Windows["5m"])
			}
		}
	}
}

// With a wallet, probes are charged to the probe_account: charge rows on
// that system account, its balance falls, and client accounts are
// untouched.
func TestProbeChargedToProbeAccount(t *testing.T) {
	up := fu.New(fu.OK())
	defer up.Close()
	ch := uniqueName("prPay")
	path := filepath.Join(t.TempDir(), "w.db")
	gatewayWith(t, storeOption("sqlite "+path), `
		channel %s %s
		model %sm {
			route %s cost 1 1
			price 2 8
			probe {
				interval 150ms
			}
		}
		wallet
		probe_account system-probes
`, ch, up.URL, ch, ch)
	// Probes before the account exists are refused without being sent.
	newWalletAccount(t, "client", "1")
	mustWalletCall(t, http.MethodPost, "accounts", map[string]string{"id": "system-probes"}, nil)
	mustWalletCall(t, http.MethodPost, "accounts/system-probes/credit", map[string]string{"amount": "1", "note": "probes"}, nil)

	perProbe := wallet.Price{Input: 2_000_000, Output: 8_000_000}.Cost(fu.DefaultPromptTokens, fu.DefaultCompletionTokens)
	var charges []string
	defer func() {
		if t.Failed() {
			_, p := probedChannelAt(t, adminURL+"/llm_failover/status", ch)
			t.Logf("the channel's probes: %v; hits %d", p, up.Hits())
		}
	}()
	eventually(t, 15*time.Second, "two probe charges on the probe account", func() bool {
		charges = charges[:0]
		for _, e := range requestRows(t, "system-probes") {
			if e.Kind == wallet.KindCharge && e.Channel == ch {
				if c := money(t, e.Cost); c != perProbe {
					t.Fatalf("probe charged %s, want %s", c, perProbe)
				}
				charges = append(charges, e.RequestID)
			}
		}
		return len(charges) >= 2
	})
	// The balance first: charges only add up while the probes go on.
	bal, _ := balanceOf(t, "system-probes")
	n := wallet.Micros(0)
	for _, e := range requestRows(t, "system-probes") {
		if e.Kind == wallet.KindCharge {
			n++
		}
	}
	if one := money(t, "1"); bal > one-2*perProbe || bal < one-n*perProbe {
		t.Errorf("probe account balance %s after %d charges of %s", bal, n, perProbe)
	}
	if bal, res := balanceOf(t, "client"); bal != money(t, "1") || res != 0 {
		t.Errorf("client account: balance %s, reserved %s; probes must not touch it", bal, res)
	}
	if rows := requestRows(t, "client"); len(rows) != 0 {
		t.Errorf("client account has ledger rows %s", kinds(rows))
	}
	if _, p := probedChannelAt(t, adminURL+"/llm_failover/status", ch); p == nil || p["spent_today"] == "0" {
		t.Errorf("probe spend not shown: %v", p)
	}
}
