package walletapp

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
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
