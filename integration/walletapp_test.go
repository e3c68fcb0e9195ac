package integration_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/walletapp"
)

// A request still uploading its body when the config is reloaded belongs
// to the old config, wallet included: it is refused without a key, never
// served, nothing reaches an upstream.
func TestWalletReloadDuringUploadStillChecksKey(t *testing.T) {
	a := upstream(t, fu.OKNamed("a"))
	b := upstream(t, fu.OKNamed("b"))
	path := walletGateway(t, a, b)

	body := fu.ChatRequest("m", false)
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, gatewayURL+"/v1/chat/completions", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.ContentLength = int64(len(body))
	type answer struct {
		status int
		body   []byte
		err    error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			done <- answer{err: err}
			return
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		done <- answer{status: res.StatusCode, body: b}
	}()
	if _, err := pw.Write(body[:10]); err != nil {
		t.Fatal(err)
	}
	// The request has entered the handler and waits for its body; reload.
	time.Sleep(200 * time.Millisecond)
	gatewayWith(t, storeOption("sqlite "+path), walletChannels+"\t\tmax_hops 2\n", a.URL, b.URL)
	if _, err := pw.Write(body[10:]); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	ans := <-done
	if ans.err != nil {
		t.Fatal(ans.err)
	}
	if ans.status != http.StatusUnauthorized {
		t.Fatalf("request with no key across a reload: status %d: %s", ans.status, ans.body)
	}
	hits(t, a, 0)
	hits(t, b, 0)
}

// twoWallets declares wallets "one" and "two"; the handler bills "two".
func twoWallets(t *testing.T) string {
	dir := t.TempDir()
	return fmt.Sprintf("\tllm_wallet one {\n\t\tstore sqlite %s\n\t}\n\tllm_wallet two {\n\t\tstore sqlite %s\n\t}",
		filepath.Join(dir, "one.db"), filepath.Join(dir, "two.db"))
}

// Two named wallets: the admin API and the CLI address each by name, and
// a call that names none is refused instead of landing in either.
func TestNamedWalletsAdminAndCLI(t *testing.T) {
	a := upstream(t, fu.OKNamed("a"))
	b := upstream(t, fu.OKNamed("b"))
	gatewayWith(t, twoWallets(t), strings.Replace(walletChannels, "wallet\n", "wallet two\n", 1), a.URL, b.URL)

	mustWalletCall(t, http.MethodPost, "one/accounts", map[string]string{"id": "acme"}, nil)
	if st := walletCall(t, http.MethodGet, "two/accounts/acme", nil, nil); st != http.StatusNotFound {
		t.Fatalf("acme was created in wallet one, but wallet two answers %d", st)
	}
	if st := walletCall(t, http.MethodGet, "one/accounts/acme", nil, nil); st != http.StatusOK {
		t.Fatalf("wallet one: %d", st)
	}
	res, err := http.Get(adminURL + "/llm_wallet/accounts")
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest || !bytes.Contains(msg, []byte("several wallets exist (one, two): name one")) {
		t.Fatalf("unnamed call with two wallets: %d %s", res.StatusCode, msg)
	}
	if st := walletCall(t, http.MethodGet, "three/status", nil, nil); st != http.StatusNotFound {
		t.Fatalf("unknown wallet: %d", st)
	}

	admin := fmt.Sprintf("localhost:%d", adminPort)
	var out bytes.Buffer
	if err := walletapp.RunCommand(&out, admin, "two", []string{"create-account", "beta"}); err != nil {
		t.Fatal(err)
	}
	if err := walletapp.RunCommand(&out, admin, "two", []string{"credit", "beta", "1"}); err != nil {
		t.Fatal(err)
	}
	if err := walletapp.RunCommand(&out, admin, "one", []string{"balance", "beta"}); err == nil {
		t.Fatal("beta was created in wallet two, but wallet one knows it")
	}
	err = walletapp.RunCommand(&out, admin, "", []string{"balance", "beta"})
	if err == nil || !strings.Contains(err.Error(), "several wallets exist") {
		t.Fatalf("llm-wallet with no --wallet and two wallets: %v", err)
	}

	// The handler bills wallet two.
	var k struct{ Key string }
	mustWalletCall(t, http.MethodPost, "two/accounts/beta/keys", map[string]string{"label": "t"}, &k)
	res2, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false), bearer(k.Key)...)
	if res2.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", res2.StatusCode, body)
	}
	eventually(t, 10*time.Second, "the charge to settle in wallet two", func() bool {
		var acct walletapp.AccountView
		return walletCall(t, http.MethodGet, "two/accounts/beta", nil, &acct) == 200 && acct.Reserved == "0" && acct.Balance != "1"
	})

	// A handler that names no wallet when there are two is a config error.
	if st, msg := tryLoadWith(t, twoWallets(t), walletChannels, a.URL, b.URL); st == http.StatusOK || !strings.Contains(msg, "several wallets exist") {
		t.Fatalf("unnamed handler wallet with two wallets: %d %s", st, msg)
	}
}
