package walletapp

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
)

func parseAll(t *testing.T, blocks ...string) (*App, error) {
	t.Helper()
	var v any
	for _, b := range blocks {
		var err error
		if v, err = parseGlobalOption(caddyfile.NewTestDispenser(b), v); err != nil {
			return nil, err
		}
	}
	app := new(App)
	if err := json.Unmarshal(v.(httpcaddyfile.App).Value, app); err != nil {
		t.Fatal(err)
	}
	return app, nil
}

func TestGlobalOptionMergesNamedWallets(t *testing.T) {
	app, err := parseAll(t, "llm_wallet {\nstore sqlite /tmp/a.db\nreservation_ttl 5m\n}",
		"llm_wallet shared {\nstore postgres {env.DSN}\nadmission_timeout 1s\nstatement_timeout 3s\n}")
	if err != nil {
		t.Fatal(err)
	}
	if len(app.Wallets) != 2 || app.Wallets["default"] == nil || app.Wallets["shared"] == nil {
		t.Fatalf("wallets: %+v", app.Wallets)
	}
	if s := string(app.Wallets["shared"].StoreRaw); !strings.Contains(s, `"backend":"postgres"`) || !strings.Contains(s, `{env.DSN}`) {
		t.Fatalf("shared store: %s", s)
	}
}

func TestGlobalOptionErrors(t *testing.T) {
	for name, blocks := range map[string][]string{
		"repeated option":   {"llm_wallet {\nreservation_ttl 5m\nreservation_ttl 6m\n}"},
		"negative duration": {"llm_wallet {\nadmission_timeout -1s\n}"},
		"unknown store":     {"llm_wallet {\nstore redis\n}"},
		"postgres no dsn":   {"llm_wallet {\nstore postgres\n}"},
		"unknown option":    {"llm_wallet {\ncurrency eur\n}"},
		"name twice":        {"llm_wallet a {\n}", "llm_wallet a {\n}"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseAll(t, blocks...)
			if err == nil || !strings.Contains(err.Error(), "Testfile:") {
				t.Fatalf("err %v, want one naming the line", err)
			}
		})
	}
}
