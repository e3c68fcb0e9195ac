package integration_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/walletapp"
)

// What the admin API and its commands do with input an operator's
// script gets wrong. Found by an audit of hostile admin input: each of
// these was accepted, or misread, before.

// rawWallet calls the wallet's admin API with a body as written.
func rawWallet(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, adminURL+"/llm_wallet/"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := adminClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// An account ID is one segment of the admin API's paths: one with a
// slash, or a dot segment, could be created and never reached again.
func TestWalletAccountIDIsOnePathSegment(t *testing.T) {
	walletGateway(t, upstream(t, fu.OKNamed("a")), upstream(t, fu.OKNamed("b")))
	for _, id := range []string{"team/a", "..", "."} {
		if st, body := rawWallet(t, http.MethodPost, "accounts", fmt.Sprintf(`{"id":%q}`, id)); st != http.StatusBadRequest {
			t.Errorf("account %q: %d, want 400: %s", id, st, body)
		}
	}
	// What can be created can be used, from the command too.
	mustWalletCall(t, http.MethodPost, "accounts", map[string]string{"id": "team#a?b"}, nil)
	if err := walletapp.RunCommand(io.Discard, fmt.Sprintf("localhost:%d", adminPort), "", []string{"credit", "team#a?b", "5"}); err != nil {
		t.Fatal(err)
	}
}

// A usage cursor or limit that does not read is refused, not answered
// with the first page (a script would page over it forever); a limit
// past the store's cap gets the cap, not the default.
func TestUsageParameters(t *testing.T) {
	walletGateway(t, upstream(t, fu.OKNamed("a")), upstream(t, fu.OKNamed("b")))
	mustWalletCall(t, http.MethodPost, "accounts", map[string]string{"id": "acme"}, nil)
	for range 120 {
		mustWalletCall(t, http.MethodPost, "accounts/acme/credit", map[string]string{"amount": "0.01"}, nil)
	}
	for _, q := range []string{"before=abc", "before=-1", "limit=abc", "limit=-5", "limit=0", "limit=99999999999999999999"} {
		if st, body := rawWallet(t, http.MethodGet, "accounts/acme/usage?"+q, ""); st != http.StatusBadRequest {
			t.Errorf("usage?%s: %d, want 400: %.200s", q, st, body)
		}
	}
	var page struct {
		Entries []walletapp.EntryView `json:"entries"`
	}
	mustWalletCall(t, http.MethodGet, "accounts/acme/usage?limit=5000", nil, &page)
	if len(page.Entries) != 120 {
		t.Errorf("limit=5000 gave %d of 120 rows", len(page.Entries))
	}
	// An unknown account is a 404, as its keys are, not an empty page.
	if st, body := rawWallet(t, http.MethodGet, "accounts/nobody/usage", ""); st != http.StatusNotFound {
		t.Errorf("usage of an unknown account: %d, want 404: %s", st, body)
	}
}

// A credit body is one JSON object: a second one, or garbage after it,
// moves no money.
func TestCreditBodyIsOneObject(t *testing.T) {
	walletGateway(t, upstream(t, fu.OKNamed("a")), upstream(t, fu.OKNamed("b")))
	mustWalletCall(t, http.MethodPost, "accounts", map[string]string{"id": "acme"}, nil)
	for _, body := range []string{`{"amount":"5"} {"amount":"7"}`, `{"amount":"5"}garbage`} {
		if st, ans := rawWallet(t, http.MethodPost, "accounts/acme/credit", body); st != http.StatusBadRequest {
			t.Errorf("credit with body %s: %d, want 400: %s", body, st, ans)
		}
	}
	// Past the admin API's 1 MiB a body is too large, not malformed.
	if st, _ := rawWallet(t, http.MethodPost, "accounts/acme/credit", `{"amount":"5","note":"`+strings.Repeat("x", 1<<20)+`"}`); st != http.StatusRequestEntityTooLarge {
		t.Errorf("a 1 MiB credit body: %d, want 413", st)
	}
	var v walletapp.AccountView
	mustWalletCall(t, http.MethodGet, "accounts/acme", nil, &v)
	if v.Balance != "0" {
		t.Errorf("balance %s after refused credits, want 0", v.Balance)
	}
}

// The key listing names its fields as the rest of the API does (and as
// the key's creation answers), so a script reads .id from both.
func TestKeyListingNames(t *testing.T) {
	walletGateway(t, upstream(t, fu.OKNamed("a")), upstream(t, fu.OKNamed("b")))
	_, id := newWalletAccount(t, "acme", "")
	var keys []map[string]any
	mustWalletCall(t, http.MethodGet, "accounts/acme/keys", nil, &keys)
	if len(keys) != 1 || keys[0]["id"] != id || keys[0]["account"] != "acme" || keys[0]["created_at"] == nil {
		b, _ := json.Marshal(keys)
		t.Fatalf("keys %s; want one with id %q, account and created_at", b, id)
	}
}

// The wallet command refuses its own flags written after the subcommand,
// and only those: a note or an account may start with a dash.
func TestWalletCommandFlagsAfterTheSubcommand(t *testing.T) {
	walletGateway(t, upstream(t, fu.OKNamed("a")), upstream(t, fu.OKNamed("b")))
	mustWalletCall(t, http.MethodPost, "accounts", map[string]string{"id": "acme"}, nil)
	run := func(args ...string) error {
		c := &cobra.Command{Use: "llm-wallet"}
		caddycmd.Commands()["llm-wallet"].CobraFunc(c)
		c.SetOut(io.Discard)
		c.SetErr(io.Discard)
		c.SetArgs(append([]string{"--address", fmt.Sprintf("localhost:%d", adminPort)}, args...))
		return c.Execute()
	}
	if err := run("credit", "acme", "5", "-refund for outage 123"); err != nil {
		t.Errorf("a note starting with a dash: %v", err)
	}
	if err := run("credit", "acme", "-0.50"); err != nil {
		t.Errorf("a negative amount: %v", err)
	}
	for _, misplaced := range []string{"--json", "--wallet=w", "-a"} {
		if err := run("balance", "acme", misplaced); err == nil || !strings.Contains(err.Error(), "flags go before the subcommand") {
			t.Errorf("%s after the subcommand: %v", misplaced, err)
		}
	}
	var v walletapp.AccountView
	mustWalletCall(t, http.MethodGet, "accounts/acme", nil, &v)
	if v.Balance != "4.5" {
		t.Errorf("balance %s, want 4.5", v.Balance)
	}
}

// caddy llm-failover doctor checks channels whose names need escaping in
// a path.
func TestDoctorEscapesChannelNames(t *testing.T) {
	gateway(t, `
		channel "eu#1" %s
		channel "x?y" %s
		model m {
			route "eu#1"
			route "x?y"
		}
		auth off
`, upstream(t, fu.OKNamed("a")).URL, upstream(t, fu.OKNamed("b")).URL)
	var out strings.Builder
	if err := failoverapp.Command(&out, fmt.Sprintf("localhost:%d", adminPort), "doctor"); err != nil {
		t.Fatalf("doctor on two healthy channels: %v\n%s", err, out.String())
	}
}
