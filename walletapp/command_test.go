package walletapp

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
)

// docs/wallet.md: "Every subcommand prints a table; --json (before the
// subcommand) prints the admin API's answer instead." A script that runs
// `caddy llm-wallet --json revoke-key <id>` parses what it prints.
func TestJSONFlagPrintsTheAdminAnswerForEverySubcommand(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/llm_wallet/keys/key_abc/revoke" {
			http.Error(w, `{"error":"unexpected"}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"key_abc","status":"revoked"}`))
	}))
	defer srv.Close()
	var out bytes.Buffer
	if err := runCommand(&out, strings.TrimPrefix(srv.URL, "http://"), "", []string{"revoke-key", "key_abc"}, true); err != nil {
		t.Fatal(err)
	}
	var ans map[string]string
	if err := json.Unmarshal(out.Bytes(), &ans); err != nil || ans["id"] != "key_abc" || ans["status"] != "revoked" {
		t.Fatalf("llm-wallet --json revoke-key printed %q (%v); want the admin API's JSON answer", out.String(), err)
	}
}

// fakeAdmin answers the wallet's admin API from answers (by method and
// path, query included) and records every call it gets.
func fakeAdmin(t *testing.T, answers map[string]string) (admin string, calls func(reset bool) []string) {
	t.Helper()
	var (
		mu  sync.Mutex
		got []string
	)
	calls = func(reset bool) []string {
		mu.Lock()
		defer mu.Unlock()
		out := slices.Clone(got)
		if reset {
			got = nil
		}
		return out
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		call := r.Method + " " + r.URL.RequestURI()
		mu.Lock()
		got = append(got, call+" "+string(b))
		mu.Unlock()
		ans, ok := answers[call]
		if !ok {
			http.Error(w, `{"error":"unexpected"}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(ans))
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://"), calls
}

// docs/wallet.md: --json "prints the admin API's answer", and the admin
// API pages usage with next_before. A script that exports the ledger with
// `caddy llm-wallet --json usage acme 1000` needs the cursor to ask for
// the next page; the command must not drop it.
func TestJSONUsageKeepsTheNextPageCursor(t *testing.T) {
	admin, _ := fakeAdmin(t, map[string]string{
		"GET /llm_wallet/accounts/acme/usage?limit=1": `{"entries":[{"id":42,"kind":"credit","tokens_in":0,"tokens_out":0,"cost":"5","time":"2026-12-07T14:00:00Z"}],"next_before":42}`,
	})
	var out bytes.Buffer
	if err := runCommand(&out, admin, "", []string{"usage", "acme", "1"}, true); err != nil {
		t.Fatal(err)
	}
	var ans map[string]any
	if err := json.Unmarshal(out.Bytes(), &ans); err != nil {
		t.Fatalf("llm-wallet --json usage printed %q: %v", out.String(), err)
	}
	if ans["next_before"] != float64(42) {
		t.Fatalf("llm-wallet --json usage printed %s; want the admin API's next_before (42), without which a script cannot page", out.String())
	}
}

// Arguments the command does not use must not be dropped in silence:
// `revoke-key key_a key_b` (two leaked keys) answering "revoked key_a"
// and exiting 0 leaves key_b live; `credit acme 25 refund for outage`
// writes an immutable ledger row whose note is "refund".
func TestExtraArgumentsAreNotDropped(t *testing.T) {
	admin, calls := fakeAdmin(t, map[string]string{
		"POST /llm_wallet/keys/key_a/revoke":    `{"id":"key_a","status":"revoked"}`,
		"POST /llm_wallet/keys/key_b/revoke":    `{"id":"key_b","status":"revoked"}`,
		"POST /llm_wallet/accounts/acme/credit": `{"id":"acme","balance":"25","reserved":"0","available":"25"}`,
	})
	err := runCommand(io.Discard, admin, "", []string{"revoke-key", "key_a", "key_b"}, false)
	got := calls(true)
	revokedB := slices.ContainsFunc(got, func(c string) bool { return strings.HasPrefix(c, "POST /llm_wallet/keys/key_b/revoke") })
	if err == nil && !revokedB {
		t.Errorf("revoke-key key_a key_b succeeded but revoked only key_a: %q", got)
	}
	if err != nil && len(got) != 0 {
		t.Errorf("revoke-key key_a key_b failed (%v) after revoking some: %q", err, got)
	}

	err = runCommand(io.Discard, admin, "", []string{"credit", "acme", "25", "refund", "for", "outage"}, false)
	got = calls(true)
	if err == nil {
		if len(got) != 1 || !strings.Contains(got[0], `"note":"refund for outage"`) {
			t.Errorf("credit acme 25 refund for outage sent %q; want the whole note, or an error and nothing written", got)
		}
	} else if len(got) != 0 {
		t.Errorf("credit with an unquoted note failed (%v) after writing: %q", err, got)
	}
}

// `caddy llm-wallet status` is what a script or a health check runs to
// learn whether billing works: a store that does not answer must make it
// exit non-zero (as audit does on a difference), not only print
// reachable=false.
func TestStatusFailsWhenTheStoreIsUnreachable(t *testing.T) {
	admin, _ := fakeAdmin(t, map[string]string{
		"GET /llm_wallet/status": `{"wallet":"default","store":"postgres","reachable":false,"error":"pinging postgres wallet store: connection refused","sweep_every":"1m0s"}`,
	})
	for _, asJSON := range []bool{false, true} {
		var out bytes.Buffer
		if err := runCommand(&out, admin, "", []string{"status"}, asJSON); err == nil {
			t.Errorf("llm-wallet status (json %v) with the store unreachable exited 0; printed %q", asJSON, out.String())
		}
	}
}
