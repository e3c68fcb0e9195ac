package integration_test

import (
	"bytes"
	"encoding/base64"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	"golang.org/x/crypto/bcrypt"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// getModels lists the models with hdr (name, value pairs).
func getModels(t *testing.T, hdr ...string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, gatewayURL+"/v1/models", nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// Recipe 1, wallet keys: /v1/models asks for a key like every endpoint.
func TestAuthWalletKeysCoverModels(t *testing.T) {
	a := upstream(t, fu.OK())
	walletGateway(t, a, a)
	secret, _ := newWalletAccount(t, "models-acct", "1")
	if st := getModels(t); st != 401 {
		t.Errorf("no key: %d, want 401", st)
	}
	if st := getModels(t, "Authorization", "Bearer sk-wrong"); st != 401 {
		t.Errorf("bad key: %d, want 401", st)
	}
	if st := getModels(t, "X-Api-Key", secret); st != 200 {
		t.Errorf("good key: %d, want 200", st)
	}
	hits(t, a, 0)
}

// Recipe 2, keys without billing: a wallet whose models cost nothing
// authenticates keys of accounts with no balance.
func TestAuthKeysWithoutBilling(t *testing.T) {
	a := upstream(t, fu.OK())
	gatewayWith(t, storeOption("sqlite "+filepath.Join(t.TempDir(), "w.db")), `
		channel a %s
		model m {
			route a
			price 0 0
		}
		wallet`, a.URL)
	secret, _ := newWalletAccount(t, "free-acct", "")
	if res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false)); res.StatusCode != 401 {
		t.Fatalf("no key: %d %s", res.StatusCode, body)
	}
	if res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false), bearer(secret)...); res.StatusCode != 200 {
		t.Fatalf("free key: %d %s", res.StatusCode, body)
	}
	hits(t, a, 1)
}

// Recipe 3, Caddy's own authentication: basic_auth in front, the wallet
// bills the authenticated user's account.
func TestAuthAccountBehindBasicAuth(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	a := upstream(t, fu.OK())
	cfg := strings.Replace(gatewayConfigWith(storeOption("sqlite "+filepath.Join(t.TempDir(), "w.db")), `
		channel a %s
		model m {
			route a
		}
		wallet {
			account {http.auth.user.id}
		}`, a.URL), "\tllm_failover {", "\tbasic_auth {\n\t\talice "+string(hash)+"\n\t}\n\tllm_failover {", 1)
	caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort}).InitServer(cfg, "caddyfile")
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	mustWalletCall(t, http.MethodPost, "accounts", map[string]string{"id": "alice"}, nil)
	if res, _ := post(t, "/v1/chat/completions", fu.ChatRequest("m", false)); res.StatusCode != 401 {
		t.Fatalf("no credentials: %d", res.StatusCode)
	}
	if st := getModels(t); st != 401 {
		t.Errorf("models without credentials: %d", st)
	}
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("alice:s3cret"))
	if st := getModels(t, "Authorization", basic); st != 200 {
		t.Errorf("models as alice: %d", st)
	}
	hits(t, a, 0)
}

// Recipe 4, auth off, and the warning for a public server without any.
func TestAuthOffAndTheWarning(t *testing.T) {
	a := upstream(t, fu.OK())
	const warning = "without authentication"
	for _, tt := range []struct {
		name, body string
		warn       bool
	}{
		{"none", "", true},
		{"auth off", "auth off", false},
	} {
		pluginLog, _ := loggedGateway(t, `
		channel a %s
		model m {
			route a
		}
		`+tt.body, a.URL)
		if res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false)); res.StatusCode != 200 {
			t.Fatalf("%s: %d %s", tt.name, res.StatusCode, body)
		}
		var log []byte
		eventually(t, 5*time.Second, "the log file", func() bool {
			log, _ = os.ReadFile(pluginLog)
			return len(log) > 0
		})
		if got := strings.Contains(string(log), warning); got != tt.warn {
			t.Errorf("%s: warning logged %v, want %v", tt.name, got, tt.warn)
		}
	}
}

// A server that reads wallet keys and logs access warns when its access
// log would write a key in clear, and the warning tells the truth: the
// key is in the access log exactly when it warned. A filter keyed in
// the wrong case hides nothing and still warns.
func TestAccessLogKeyWarning(t *testing.T) {
	a := upstream(t, fu.OK())
	const warning = "access log writes the wallet keys"
	for _, tt := range []struct {
		name, filter string
		warn         bool
	}{
		{"no filter", "", true},
		{"documented filter", "\t\tformat filter {\n\t\t\trequest>headers>X-Api-Key delete\n\t\t\trequest>headers>Api-Key delete\n\t\t}", false},
		{"hash filter", "\t\tformat filter {\n\t\t\trequest>headers>X-Api-Key hash\n\t\t\trequest>headers>Api-Key replace REDACTED\n\t\t}", false},
		{"lower-case filter", "\t\tformat filter {\n\t\t\trequest>headers>x-api-key delete\n\t\t\trequest>headers>api-key delete\n\t\t}", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pluginLog, accessLog := loggedGatewayWith(t, tt.filter, `
		channel a %s
		model m {
			route a
		}
		wallet`, a.URL)
			const key = "llmf-not-a-real-key-73b1"
			res, _ := post(t, "/v1/chat/completions", fu.ChatRequest("m", false), "X-Api-Key", key)
			if res.StatusCode != 401 {
				t.Fatalf("unknown key: %d", res.StatusCode)
			}
			var plugin, access []byte
			eventually(t, 5*time.Second, "the access log", func() bool {
				access, _ = os.ReadFile(accessLog)
				plugin, _ = os.ReadFile(pluginLog)
				return bytes.Contains(access, []byte("/v1/chat/completions"))
			})
			if got := strings.Contains(string(plugin), warning); got != tt.warn {
				t.Errorf("warning logged %v, want %v\n%s", got, tt.warn, plugin)
			}
			if leaked := bytes.Contains(access, []byte(key)); leaked != tt.warn {
				t.Errorf("key in the access log %v, but warned %v", leaked, tt.warn)
			}
			if tt.warn && !strings.Contains(string(plugin), `"X-Api-Key"`) {
				t.Errorf("the warning does not name X-Api-Key:\n%s", plugin)
			}
		})
	}
}
