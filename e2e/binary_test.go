package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// TestBinaryHasModules checks that xcaddy compiled the plugin in: both
// modules are registered, the CLI command exists, and the shipped example
// config adapts and validates with the real binary.
func TestBinaryHasModules(t *testing.T) {
	caddyBin(t)
	dir := t.TempDir()
	env := baseEnv(dir)

	out, err := runCaddy(t, env, "list-modules")
	if err != nil {
		t.Fatalf("caddy list-modules: %v\n%s", err, out)
	}
	mods := strings.Fields(out)
	for _, want := range []string{"http.handlers.llm_failover", "admin.api.llm_failover", "llm_wallet", "admin.api.llm_wallet", "llm_wallet.stores.sqlite", "llm_wallet.stores.postgres"} {
		if !slices.Contains(mods, want) {
			t.Errorf("caddy list-modules does not list %s:\n%s", want, out)
		}
	}

	out, err = runCaddy(t, env, "help", "llm-wallet")
	if err != nil {
		t.Fatalf("caddy help llm-wallet: %v\n%s", err, out)
	}
	for _, want := range []string{"llm-wallet", "create-account", "create-key", "revoke-key", "usage", "--address", "--wallet"} {
		if !strings.Contains(out, want) {
			t.Errorf("caddy help llm-wallet does not mention %q:\n%s", want, out)
		}
	}

	example, err := filepath.Abs("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	out, err = runCaddy(t, env, "adapt", "--config", example, "--adapter", "caddyfile")
	if err != nil {
		t.Fatalf("caddy adapt Caddyfile.example: %v\n%s", err, out)
	}
	// adapt prints the JSON on stdout and warnings (as log lines) on
	// stderr; the JSON is the line that starts with '{"'.
	var cfg map[string]any
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, `{"`) && !strings.Contains(line, `"level":`) {
			if err := json.Unmarshal([]byte(line), &cfg); err != nil {
				t.Fatalf("caddy adapt: output is not JSON: %v\n%s", err, out)
			}
		}
	}
	if cfg == nil {
		t.Fatalf("caddy adapt printed no JSON config:\n%s", out)
	}
	handlers := findHandlers(cfg, "llm_failover")
	if len(handlers) != 1 {
		t.Fatalf("adapted Caddyfile.example has %d llm_failover handlers, want 1:\n%s", len(handlers), out)
	}
	h := handlers[0]
	if ch, _ := h["channels"].([]any); len(ch) != 3 {
		t.Errorf("adapted handler has %d channels, want 3 (flaky, overloaded, backup): %v", len(ch), h["channels"])
	}
	if ms, _ := h["models"].([]any); len(ms) != 2 {
		t.Errorf("adapted handler has %d models, want 2: %v", len(ms), h["models"])
	}
	if w, _ := h["wallet"].(map[string]any); w == nil || w["on_store_error"] != "deny" {
		t.Errorf("adapted handler's wallet = %v, want on_store_error deny", h["wallet"])
	}
	apps, _ := cfg["apps"].(map[string]any)
	wallets, _ := apps["llm_wallet"].(map[string]any)
	if def, _ := wallets["wallets"].(map[string]any)["default"].(map[string]any); def == nil || def["store"].(map[string]any)["backend"] != "sqlite" {
		t.Errorf("adapted llm_wallet app = %v, want a default wallet on sqlite", apps["llm_wallet"])
	}

	// validate provisions every module: the {env.*} channel headers must
	// resolve, so without the keys it has to fail, and with them succeed.
	var noKeys []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "FLAKY_API_KEY=") && !strings.HasPrefix(kv, "OVERLOADED_API_KEY=") && !strings.HasPrefix(kv, "BACKUP_API_KEY=") {
			noKeys = append(noKeys, kv)
		}
	}
	out, err = runCaddy(t, noKeys, "validate", "--config", example, "--adapter", "caddyfile")
	if err == nil || !strings.Contains(out, "FLAKY_API_KEY") {
		t.Errorf("caddy validate without FLAKY_API_KEY & co. set: err %v; want a refusal naming the empty {env.FLAKY_API_KEY}:\n%s", err, out)
	}
	keys := append(noKeys, "FLAKY_API_KEY=k1", "OVERLOADED_API_KEY=k2", "BACKUP_API_KEY=k3")
	out, err = runCaddy(t, keys, "validate", "--config", example, "--adapter", "caddyfile")
	if err != nil {
		t.Fatalf("caddy validate Caddyfile.example: %v\n%s", err, out)
	}
	if !strings.Contains(out, "Valid configuration") {
		t.Errorf("caddy validate did not say \"Valid configuration\":\n%s", out)
	}
	// And without --adapter: the name "Caddyfile.example" is enough for
	// caddy to pick the Caddyfile adapter.
	out, err = runCaddy(t, keys, "validate", "--config", example)
	if err != nil {
		t.Errorf("caddy validate --config Caddyfile.example (adapter inferred): %v\n%s", err, out)
	}
}

// findHandlers returns every JSON object with "handler": name, anywhere in v.
func findHandlers(v any, name string) []map[string]any {
	var out []map[string]any
	switch v := v.(type) {
	case map[string]any:
		if v["handler"] == name {
			out = append(out, v)
		}
		for _, c := range v {
			out = append(out, findHandlers(c, name)...)
		}
	case []any:
		for _, c := range v {
			out = append(out, findHandlers(c, name)...)
		}
	}
	return out
}

const badRequestBody = `{"error":{"message":"bad thing","type":"invalid_request_error","code":"bad"}}`

// TestBinaryFailover is the basic promise through the real binary: a 503
// from the cheap channel fails over to the backup, for plain and streamed
// answers; a 400 is the client's problem and is passed through untouched;
// an unknown model is an OpenAI-shaped 404; /v1/models and the admin views
// answer.
func TestBinaryFailover(t *testing.T) {
	down := fu.New(fu.Status(503, ""))
	defer down.Close()
	backup := fu.New(fu.OKNamed("backup"))
	defer backup.Close()
	bad := fu.New(fu.Status(400, badRequestBody))
	defer bad.Close()
	never := fu.New(fu.OKNamed("never"))
	defer never.Close()

	p := portsFailover
	cfg := globalOptions(p) + site(p, fmt.Sprintf(`
		channel a %s {
			header Authorization "Bearer {env.LLMF_E2E_UPSTREAM_KEY}"
		}
		channel b %s {
			header Authorization "Bearer {env.LLMF_E2E_UPSTREAM_KEY}"
		}
		channel bad %s
		channel never %s
		model gpt-e2e {
			route a cost 0.10 0.40
			route b cost 0.20 0.80
		}
		model gpt-bad-request {
			route bad   cost 0.10 0.40
			route never cost 0.20 0.80
		}
`, down.URL, backup.URL, bad.URL, never.URL))
	in := newInstance(t, "failover", p, cfg, "LLMF_E2E_UPSTREAM_KEY=upstream-secret")
	gw := in.gatewayURL()
	client := []string{"Authorization", "Bearer sk-client-secret"}

	t.Run("non-stream fails over", func(t *testing.T) {
		status, hdr, body := post(t, gw+"/v1/chat/completions", fu.ChatRequest("gpt-e2e", false), client...)
		if status != 200 {
			t.Fatalf("status %d, want 200; body %s", status, body)
		}
		var resp struct {
			Model   string `json:"model"`
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(body, &resp); err != nil || len(resp.Choices) != 1 {
			t.Fatalf("not a chat completion (%v): %s", err, body)
		}
		if !strings.Contains(resp.Choices[0].Message.Content, "backup") {
			t.Errorf("content %q does not come from the backup channel", resp.Choices[0].Message.Content)
		}
		if got := hdr.Get("X-Served-By"); got != "b" {
			t.Errorf("X-Served-By = %q, want b", got)
		}
		if down.Hits() != 1 || backup.Hits() != 1 {
			t.Errorf("hits: a=%d b=%d, want 1 and 1", down.Hits(), backup.Hits())
		}
		// The channel's key replaced the client's.
		if got := backup.LastRequest().Header.Get("Authorization"); got != "Bearer upstream-secret" {
			t.Errorf("upstream saw Authorization %q, want the channel's key from {env.LLMF_E2E_UPSTREAM_KEY}", got)
		}
	})

	t.Run("stream fails over", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPost, gw+"/v1/chat/completions", strings.NewReader(string(fu.ChatRequest("gpt-e2e", true))))
		req.Header.Set("Authorization", "Bearer sk-client-secret")
		resp, err := gatewayClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("status %d, content type %q, want a 200 SSE stream; body %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
		events, err := readSSE(resp.Body, time.Now(), nil)
		if err != nil {
			t.Fatalf("stream broke: %v (events %v)", err, events)
		}
		text, sawErr := chatText(events)
		if !strings.Contains(text, "backup") || sawErr {
			t.Errorf("streamed text %q (error event: %v), want text from backup and no error", text, sawErr)
		}
		if len(events) == 0 || events[len(events)-1].Data != "[DONE]" {
			t.Errorf("stream does not end with data: [DONE]: %v", events)
		}
	})

	t.Run("400 passes through", func(t *testing.T) {
		status, _, body := post(t, gw+"/v1/chat/completions", fu.ChatRequest("gpt-bad-request", false), client...)
		if status != 400 {
			t.Fatalf("status %d, want 400; body %s", status, body)
		}
		var got, want any
		_ = json.Unmarshal(body, &got)
		_ = json.Unmarshal([]byte(badRequestBody), &want)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("body %s, want the upstream's own %s", body, badRequestBody)
		}
		if never.Hits() != 0 {
			t.Errorf("a 400 failed over to the next channel (%d hits); it must not", never.Hits())
		}
	})

	t.Run("unknown model", func(t *testing.T) {
		status, _, body := post(t, gw+"/v1/chat/completions", fu.ChatRequest("no-such-model", false), client...)
		var e struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if status != 404 || json.Unmarshal(body, &e) != nil || e.Error.Code != "model_not_found" {
			t.Fatalf("status %d body %s, want 404 with error.code model_not_found", status, body)
		}
		if !strings.Contains(e.Error.Message, "no-such-model") {
			t.Errorf("message %q does not name the model", e.Error.Message)
		}
	})

	t.Run("models list", func(t *testing.T) {
		resp, err := gatewayClient.Get(gw + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var list struct {
			Object string `json:"object"`
			Data   []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || json.Unmarshal(b, &list) != nil || list.Object != "list" {
			t.Fatalf("GET /v1/models: status %d body %s", resp.StatusCode, b)
		}
		var ids []string
		for _, m := range list.Data {
			ids = append(ids, m.ID)
		}
		slices.Sort(ids)
		if !slices.Equal(ids, []string{"gpt-bad-request", "gpt-e2e"}) {
			t.Errorf("models %v, want [gpt-bad-request gpt-e2e]", ids)
		}
	})

	t.Run("admin views", func(t *testing.T) {
		var chains []struct {
			Model    string `json:"model"`
			Channels []struct {
				Channel string `json:"channel"`
				State   string `json:"state"`
			} `json:"channels"`
		}
		in.admin(http.MethodGet, "/llm_failover/chains", nil, 200, &chains)
		order := map[string][]string{}
		for _, c := range chains {
			for _, ch := range c.Channels {
				order[c.Model] = append(order[c.Model], ch.Channel)
			}
		}
		if !slices.Equal(order["gpt-e2e"], []string{"a", "b"}) || !slices.Equal(order["gpt-bad-request"], []string{"bad", "never"}) {
			t.Errorf("chains %+v, want gpt-e2e: a,b and gpt-bad-request: bad,never", chains)
		}
		var channels []struct {
			Name     string `json:"name"`
			BaseURL  string `json:"base_url"`
			State    string `json:"state"`
			Failures int    `json:"failures_in_window"`
		}
		in.admin(http.MethodGet, "/llm_failover/channels", nil, 200, &channels)
		byName := map[string]int{}
		for i, c := range channels {
			byName[c.Name] = i
		}
		if len(channels) != 4 {
			t.Fatalf("channels %+v, want a, b, bad, never", channels)
		}
		a := channels[byName["a"]]
		if a.BaseURL != down.URL || a.Failures != 2 || a.State != "closed" {
			t.Errorf("channel a = %+v, want base %s, 2 failures in window, closed", a, down.URL)
		}
		if b := channels[byName["b"]]; b.Failures != 0 || b.State != "closed" {
			t.Errorf("channel b = %+v, want no failures, closed", b)
		}
		// An unknown admin path is a 404, not a crash.
		in.admin(http.MethodGet, "/llm_failover/nope", nil, 404, nil)
	})
}
