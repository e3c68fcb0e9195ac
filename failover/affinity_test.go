package failover

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// A conversation key the client chose is its own: two clients sending
// the same session header name two conversations once the gateway knows
// who they are (the wallet's account, else Caddy's authenticated user).
// A long prompt's own hash is shared: both clients' turns read the same
// provider cache.
func TestConversationKeyIsScopedToTheClient(t *testing.T) {
	key := func(user, account, body string) string {
		r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body))
		r.Header.Set("Session-Id", "session-1")
		x := newExchange(httptest.NewRecorder(), r, 0, modeChain)
		x.body = []byte(body)
		x.repl = caddy.NewReplacer()
		if user != "" {
			x.repl.Set("http.auth.user.id", user)
		}
		if account != "" {
			x.bill = &bill{res: wallet.Reservation{Account: account}}
		}
		return conversationKey(x)
	}
	short := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	anonymous := key("", "", short)
	if anonymous != "hdr:session-1" {
		t.Fatalf("an anonymous client's key is %q", anonymous)
	}
	alice, bob := key("alice", "", short), key("bob", "", short)
	if alice == bob || alice == anonymous || !strings.HasSuffix(alice, "/hdr:session-1") {
		t.Errorf("users' keys: alice %q, bob %q, anonymous %q", alice, bob, anonymous)
	}
	if acme := key("alice", "acme", short); acme == alice || acme == key("", "other", short) {
		t.Errorf("the wallet's account does not scope the key: %q", acme)
	}
	if strings.Contains(alice, "alice") {
		t.Errorf("the key %q names the user", alice)
	}

	long := `{"model":"m","system":"` + strings.Repeat("A long and stable system prompt. ", 200) + `","messages":[{"role":"user","content":"hi"}]}`
	noHeader := func(user string) string {
		r := httptest.NewRequest("POST", "/v1/messages", strings.NewReader(long))
		x := newExchange(httptest.NewRecorder(), r, 0, modeChain)
		x.body, x.repl = []byte(long), caddy.NewReplacer()
		x.repl.Set("http.auth.user.id", user)
		return conversationKey(x)
	}
	if a, b := noHeader("alice"), noHeader("bob"); a != b || !strings.HasPrefix(a, "pfx:") {
		t.Errorf("a prompt's hash differs by user: %q, %q", a, b)
	}
}

// Under the cost policy the warm channel goes first only when its cached
// prompt, read at its cache price, makes it no dearer than the chain's
// first choice reading nothing (and writing the prompt again when the
// request asks for caching).
func TestWarmIsCheaper(t *testing.T) {
	warm, cold := &chain.Route{Name: "warm"}, &chain.Route{Name: "cold"}
	prompt := strings.Repeat("word ", 8000)
	plain := []byte(`{"model":"m","messages":[{"role":"user","content":"` + prompt + `"}]}`)
	caching := []byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"` + prompt + `","cache_control":{"type":"ephemeral"}}]}]}`)
	price := func(in wallet.Micros) wallet.Price {
		return wallet.Price{Input: in, Output: 5 * in, CacheRead: in / 10, CacheWrite: in * 5 / 4}
	}
	for _, tt := range []struct {
		name       string
		warm, cold wallet.Price
		cached     int64
		body       []byte
		want       bool
	}{
		{"same prices", price(3_000_000), price(3_000_000), 7000, plain, true},
		{"no costs configured", wallet.Price{}, wallet.Price{}, 7000, plain, true},
		{"warm at 1.5x, cached", price(4_500_000), price(3_000_000), 7000, plain, true},
		{"warm at 1.5x, nothing cached", price(4_500_000), price(3_000_000), 0, plain, false},
		{"warm at 2x", price(6_000_000), price(3_000_000), 7000, plain, false},
		{"warm at 1.6x, cold writes the cache again", price(4_800_000), price(3_000_000), 7000, caching, true},
		{"warm at 1.6x, cold writes nothing", price(4_800_000), price(3_000_000), 7000, plain, false},
	} {
		m := &Model{Cost: map[string]wallet.Price{"warm": tt.warm, "cold": tt.cold}}
		pin := failoverapp.Pin{Channel: "warm", Cached: tt.cached, Output: 2000}
		if got := m.warmIsCheaper(tt.body, pin, warm, cold); got != tt.want {
			t.Errorf("%s: warmIsCheaper = %v, want %v", tt.name, got, tt.want)
		}
	}
}
