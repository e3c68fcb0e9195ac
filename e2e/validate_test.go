package e2e

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// `caddy validate` provisions and cleans up, but never starts: it must
// leave no wallet database behind.
func TestBinaryValidateCreatesNoWallet(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "wallets", "w.db")
	cfg := filepath.Join(dir, "Caddyfile")
	config := "{\n\tadmin off\n\tllm_wallet {\n\t\tstore sqlite " + db + "\n\t}\n}\n" +
		"http://:1 {\n\tllm_failover {\n\t\tchannel a http://127.0.0.1:1\n\t\tmodel m {\n\t\t\troute a\n\t\t}\n\t\twallet\n\t}\n}\n"
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runCaddy(t, baseEnv(dir), "validate", "--config", cfg, "--adapter", "caddyfile")
	if err != nil {
		t.Fatalf("validate: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Dir(db)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("validate created %s (stat: %v)", filepath.Dir(db), err)
	}
}

// `caddy validate` refuses a heartbeat of a job no config could run,
// naming the jobs there are.
func TestBinaryValidateRefusesAMisspeltHeartbeatJob(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "Caddyfile")
	config := "{\n\tadmin off\n\tllm_wallet {\n\t\tstore sqlite " + filepath.Join(dir, "w.db") + "\n\t}\n" +
		"\tllm_failover {\n\t\theartbeat wallet_sweep.typo http://127.0.0.1:1/ping\n\t}\n}\n" +
		"http://:1 {\n\tllm_failover {\n\t\tchannel a http://127.0.0.1:1\n\t\tmodel m {\n\t\t\troute a\n\t\t}\n\t\twallet\n\t}\n}\n"
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runCaddy(t, baseEnv(dir), "validate", "--config", cfg, "--adapter", "caddyfile")
	if err == nil {
		t.Fatalf("validate accepted a heartbeat of wallet_sweep.typo:\n%s", out)
	}
	if !strings.Contains(out, `heartbeat \"wallet_sweep.typo\": no such job`) && !strings.Contains(out, `heartbeat "wallet_sweep.typo": no such job`) {
		t.Errorf("validate's refusal does not name the job:\n%s", out)
	}
	if !strings.Contains(out, "wallet_sweep.default") {
		t.Errorf("validate's refusal does not list the jobs there are:\n%s", out)
	}
}

// `caddy validate` warns when a site reads wallet keys and its access
// log would write them in clear, and is quiet once the documented filter
// is in place.
func TestBinaryValidateWarnsOfKeysInTheAccessLog(t *testing.T) {
	const warning = "access log writes the wallet keys"
	for _, tt := range []struct {
		name, log string
		warn      bool
	}{
		{"plain log", "\tlog\n", true},
		{"filtered log", "\tlog {\n\t\tformat filter {\n\t\t\trequest>headers>X-Api-Key delete\n\t\t\trequest>headers>Api-Key delete\n\t\t}\n\t}\n", false},
	} {
		dir := t.TempDir()
		cfg := filepath.Join(dir, "Caddyfile")
		config := "{\n\tadmin off\n\tllm_wallet {\n\t\tstore sqlite " + filepath.Join(dir, "w.db") + "\n\t}\n}\n" +
			"http://localhost:1 {\n" + tt.log + "\tllm_failover {\n\t\tchannel a http://127.0.0.1:1\n\t\tmodel m {\n\t\t\troute a\n\t\t}\n\t\twallet\n\t}\n}\n"
		if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := runCaddy(t, baseEnv(dir), "validate", "--config", cfg, "--adapter", "caddyfile")
		if err != nil {
			t.Fatalf("%s: validate: %v\n%s", tt.name, err, out)
		}
		if got := strings.Contains(out, warning); got != tt.warn {
			t.Errorf("%s: warned %v, want %v:\n%s", tt.name, got, tt.warn, out)
		}
	}
}
