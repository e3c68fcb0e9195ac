package integration_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	"github.com/llmfailover/caddy-llm-failover/internal/faultproxy"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/internal/pgtest"
	"github.com/llmfailover/caddy-llm-failover/wallet"
	"github.com/llmfailover/caddy-llm-failover/walletapp"
)

// These tests drive the prepaid wallet the way an operator and a client
// would: accounts, keys and credit go in through the admin API, requests go
// through the gateway, and balances and the ledger are read back through
// the admin API.

// walletChannels serves model m (price 2 8) and claude (price 3 15) from a
// then b, billed to the default wallet (see storeOption).
const walletChannels = `
		channel a %s {
			header Authorization "Bearer upstream-key-a"
		}
		channel b %s {
			header Authorization "Bearer upstream-key-b"
		}
		model m {
			route a cost 1 1
			route b cost 2 2
			price 2 8
		}
		model claude {
			route a cost 1 1
			route b cost 2 2
			price 3 15
		}
		model pricey {
			route a
			price 1000 1000
			max_output_tokens 100000
		}
		wallet
`

var (
	priceM      = wallet.Price{Input: 2_000_000, Output: 8_000_000}
	priceClaude = wallet.Price{Input: 3_000_000, Output: 15_000_000}
)

// walletGateway loads walletChannels with a fresh SQLite wallet and returns
// the database path.
func walletGateway(t *testing.T, a, b *fu.Server) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "w.db")
	gatewayWith(t, storeOption("sqlite "+path), walletChannels, a.URL, b.URL)
	return path
}

// storeOption is the global llm_wallet option of the default wallet on
// store ("sqlite <path>" or "postgres <dsn>").
func storeOption(store string) string {
	return "\tllm_wallet {\n\t\tstore " + store + "\n\t}"
}

// walletCall calls the wallet admin API and decodes the answer into out
// (when non-nil and the status is 2xx). It returns the status.
func walletCall(t testing.TB, method, path string, in, out any) int {
	t.Helper()
	var rd io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, adminURL+"/llm_wallet/"+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := adminClient.Do(req)
	if err != nil {
		t.Fatalf("admin %s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if out != nil && res.StatusCode/100 == 2 {
		if err := json.Unmarshal(body, out); err != nil {
			t.Fatalf("admin %s %s: decoding %s: %v", method, path, body, err)
		}
	}
	return res.StatusCode
}

func mustWalletCall(t testing.TB, method, path string, in, out any) {
	t.Helper()
	if st := walletCall(t, method, path, in, out); st/100 != 2 {
		t.Fatalf("admin %s %s: status %d", method, path, st)
	}
}

// newWalletAccount creates an account, credits it and creates a key,
// returning the key's secret and ID.
func newWalletAccount(t testing.TB, id, credit string) (secret, keyID string) {
	t.Helper()
	mustWalletCall(t, http.MethodPost, "accounts", map[string]string{"id": id}, nil)
	if credit != "" {
		mustWalletCall(t, http.MethodPost, "accounts/"+id+"/credit", map[string]string{"amount": credit, "note": "test"}, nil)
	}
	var k struct {
		Key string `json:"key"`
		ID  string `json:"id"`
	}
	mustWalletCall(t, http.MethodPost, "accounts/"+id+"/keys", map[string]string{"label": "test"}, &k)
	if !strings.HasPrefix(k.Key, wallet.KeyPrefix) || k.ID == "" {
		t.Fatalf("create key answered %+v", k)
	}
	return k.Key, k.ID
}

func parseMoney(t *testing.T, s string) wallet.Micros {
	t.Helper()
	neg := strings.HasPrefix(s, "-")
	m, err := wallet.ParseMicros(strings.TrimPrefix(s, "-"))
	if err != nil {
		t.Fatalf("amount %q: %v", s, err)
	}
	if neg {
		m = -m
	}
	return m
}

func money(t *testing.T, s string) wallet.Micros { t.Helper(); return parseMoney(t, s) }

// balanceOf reads an account through the admin API.
func balanceOf(t *testing.T, id string) (balance, reserved wallet.Micros) {
	t.Helper()
	var a walletapp.AccountView
	mustWalletCall(t, http.MethodGet, "accounts/"+id, nil, &a)
	return parseMoney(t, a.Balance), parseMoney(t, a.Reserved)
}

// ledger reads an account's whole ledger through the admin API, paging,
// oldest first.
func ledger(t *testing.T, id string) []walletapp.EntryView {
	t.Helper()
	var all []walletapp.EntryView
	before := int64(0)
	for {
		var page struct {
			Entries []walletapp.EntryView `json:"entries"`
			Next    int64                 `json:"next_before"`
		}
		mustWalletCall(t, http.MethodGet, fmt.Sprintf("accounts/%s/usage?limit=1000&before=%d", id, before), nil, &page)
		all = append(all, page.Entries...)
		if page.Next == 0 {
			break
		}
		before = page.Next
	}
	sort.Slice(all, func(i, j int) bool { return all[i].ID < all[j].ID })
	return all
}

// requestRows is the ledger without credit rows.
func requestRows(t *testing.T, id string) []walletapp.EntryView {
	t.Helper()
	var out []walletapp.EntryView
	for _, e := range ledger(t, id) {
		if e.Kind != wallet.KindCredit {
			out = append(out, e)
		}
	}
	return out
}

func kinds(rows []walletapp.EntryView) string {
	var s []string
	for _, e := range rows {
		s = append(s, e.Kind+"/"+e.Channel)
	}
	return strings.Join(s, ",")
}

// settledOnce checks that every request ID in rows has exactly one
// settlement (charge or release) row, and returns the sum charged.
func settledOnce(t *testing.T, rows []walletapp.EntryView) wallet.Micros {
	t.Helper()
	settles := map[string]int{}
	var sum wallet.Micros
	for _, e := range rows {
		switch e.Kind {
		case wallet.KindCharge, wallet.KindRelease:
			settles[e.RequestID]++
			sum += parseMoney(t, e.Cost)
		case wallet.KindFailedAttempt:
			if _, ok := settles[e.RequestID]; !ok {
				settles[e.RequestID] = 0
			}
			if c := parseMoney(t, e.Cost); c != 0 {
				t.Errorf("failed_attempt row with cost %s", c)
			}
		}
	}
	for id, n := range settles {
		if n != 1 {
			t.Errorf("request %q settled %d times: %s", id, n, kinds(rows))
		}
	}
	return sum
}

func waitUnreserved(t *testing.T, account string) {
	t.Helper()
	eventually(t, 10*time.Second, "the reservation to be settled", func() bool {
		_, r := balanceOf(t, account)
		return r == 0
	})
}

// postSettled is post for a request that was admitted to the wallet: the
// reservation is settled after the answer has gone out (deferred), so it
// waits for the account to have nothing reserved before returning.
func postSettled(t *testing.T, account, path string, body []byte, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	res, b := post(t, path, body, hdr...)
	waitUnreserved(t, account)
	return res, b
}

func bearer(secret string) []string { return []string{"Authorization", "Bearer " + secret} }

// noSecretUpstream checks that nothing the upstream received carries the
// client's key.
func noSecretUpstream(t *testing.T, s *fu.Server, secret string) {
	t.Helper()
	last := s.LastRequest()
	for k, vs := range last.Header {
		for _, v := range vs {
			if strings.Contains(v, secret) {
				t.Errorf("upstream received the client key in %s", k)
			}
		}
	}
	if bytes.Contains(last.Body, []byte(secret)) {
		t.Errorf("upstream received the client key in the body")
	}
}

func TestWalletHappyPathNonStream(t *testing.T) {
	a := upstream(t, fu.OKNamed("a").WithUsage(1000, 500))
	b := upstream(t, fu.OKNamed("b"))
	walletGateway(t, a, b)
	secret, keyID := newWalletAccount(t, "acct", "1")
	tokensBefore := channelWindow(t, fetchStatus(t, adminURL+"/llm_failover/status"), "a", "5m").OutputTokens

	res, body := postSettled(t, "acct", "/v1/chat/completions", fu.ChatRequest("m", false), bearer(secret)...)
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	mustContain(t, body, "Hello from a")
	// The status history records the output tokens the meter saw.
	if got := channelWindow(t, fetchStatus(t, adminURL+"/llm_failover/status"), "a", "5m").OutputTokens - tokensBefore; got != 500 {
		t.Errorf("history recorded %d output tokens, want 500", got)
	}
	hits(t, a, 1)
	hits(t, b, 0)
	noSecretUpstream(t, a, secret)
	if got := a.LastRequest().Header.Get("Authorization"); got != "Bearer upstream-key-a" {
		t.Errorf("upstream Authorization = %q", got)
	}

	want := priceM.Cost(1000, 500) // $0.006
	if want != 6000 {
		t.Fatalf("price arithmetic changed: %s", want)
	}
	bal, reserved := balanceOf(t, "acct")
	if bal != money(t, "1")-want || reserved != 0 {
		t.Fatalf("balance %s reserved %s, want %s and 0", bal, reserved, money(t, "1")-want)
	}
	rows := requestRows(t, "acct")
	if len(rows) != 1 || rows[0].Kind != wallet.KindCharge {
		t.Fatalf("ledger rows: %s", kinds(rows))
	}
	e := rows[0]
	if e.Model != "m" || e.Channel != "a" || e.TokensIn != 1000 || e.TokensOut != 500 || parseMoney(t, e.Cost) != want || e.KeyID != keyID || e.RequestID == "" {
		t.Fatalf("charge row %+v", e)
	}
}

func TestWalletFailoverChargesOnce(t *testing.T) {
	a := upstream(t, fu.Status(503, ""))
	b := upstream(t, fu.OKNamed("b").WithUsage(100, 20))
	walletGateway(t, a, b)
	secret, _ := newWalletAccount(t, "acct", "1")

	res, body := postSettled(t, "acct", "/v1/chat/completions", fu.ChatRequest("m", false), bearer(secret)...)
	if res.StatusCode != 200 || res.Header.Get("X-Served-By") != "b" {
		t.Fatalf("status %d served by %q: %s", res.StatusCode, res.Header.Get("X-Served-By"), body)
	}
	noSecretUpstream(t, a, secret)
	noSecretUpstream(t, b, secret)
	rows := attemptsFirst(t, "acct", 2)
	if len(rows) != 2 || rows[0].Kind != wallet.KindFailedAttempt || rows[0].Channel != "a" ||
		rows[1].Kind != wallet.KindCharge || rows[1].Channel != "b" {
		t.Fatalf("ledger rows: %s", kinds(rows))
	}
	if rows[0].RequestID != rows[1].RequestID || rows[0].Cost != "0" || rows[0].Note == "" {
		t.Errorf("failed attempt row %+v vs charge %+v", rows[0], rows[1])
	}
	want := priceM.Cost(100, 20)
	if got := settledOnce(t, rows); got != want {
		t.Errorf("charged %s, want %s", got, want)
	}
	bal, reserved := balanceOf(t, "acct")
	if bal != money(t, "1")-want || reserved != 0 {
		t.Fatalf("balance %s reserved %s", bal, reserved)
	}
}

// chatStreamBody is a streaming chat request, with or without the client's
// own stream_options.
func chatStreamBody(includeUsage bool) []byte {
	body := map[string]any{"model": "m", "stream": true, "messages": []any{map[string]any{"role": "user", "content": "Say hello."}}}
	if includeUsage {
		body["stream_options"] = map[string]any{"include_usage": true}
	}
	b, _ := json.Marshal(body)
	return b
}

func TestWalletOpenAIStreamUsage(t *testing.T) {
	a := upstream(t, fu.OKNamed("a").WithUsage(300, 40))
	b := upstream(t, fu.OKNamed("b"))
	walletGateway(t, a, b)
	secret, _ := newWalletAccount(t, "acct", "1")
	want := priceM.Cost(300, 40)

	// The client did not ask for usage: the gateway asks for it, bills
	// from it, and hides the usage-only chunk.
	res, body := postSettled(t, "acct", "/v1/chat/completions", chatStreamBody(false), bearer(secret)...)
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	mustContain(t, body, "Hello", "[DONE]")
	mustNotContain(t, body, `"choices":[]`, `"prompt_tokens"`)
	if !bytes.Contains(a.LastRequest().Body, []byte(`"stream_options":{"include_usage":true}`)) {
		t.Fatalf("upstream was not asked for usage: %s", a.LastRequest().Body)
	}
	noSecretUpstream(t, a, secret)
	rows := requestRows(t, "acct")
	if len(rows) != 1 || rows[0].Kind != wallet.KindCharge || rows[0].TokensIn != 300 || rows[0].TokensOut != 40 || parseMoney(t, rows[0].Cost) != want {
		t.Fatalf("ledger rows %+v, want one charge of %s", rows, want)
	}

	// The client asked itself: the chunk is delivered, and its
	// stream_options reach the upstream unchanged.
	res, body = postSettled(t, "acct", "/v1/chat/completions", chatStreamBody(true), bearer(secret)...)
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	mustContain(t, body, `"choices":[]`, `"prompt_tokens":300`, "[DONE]")
	if n := bytes.Count(a.LastRequest().Body, []byte("stream_options")); n != 1 {
		t.Fatalf("upstream body has stream_options %d times: %s", n, a.LastRequest().Body)
	}
	rows = requestRows(t, "acct")
	if len(rows) != 2 || rows[1].Kind != wallet.KindCharge || parseMoney(t, rows[1].Cost) != want {
		t.Fatalf("ledger rows: %+v", rows)
	}
	bal, reserved := balanceOf(t, "acct")
	if bal != money(t, "1")-2*want || reserved != 0 {
		t.Fatalf("balance %s reserved %s", bal, reserved)
	}
}

func TestWalletAnthropicStream(t *testing.T) {
	a := upstream(t, fu.OKNamed("a").WithUsage(200, 30))
	b := upstream(t, fu.OKNamed("b"))
	walletGateway(t, a, b)
	secret, _ := newWalletAccount(t, "acct", "1")

	res, body := postSettled(t, "acct", "/v1/messages", fu.MessagesRequest("claude", true),
		"X-Api-Key", secret, "Anthropic-Version", "2023-06-01")
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	mustContain(t, body, "message_start", "message_stop")
	noSecretUpstream(t, a, secret)
	// message_start says input 200 and a placeholder output of 1;
	// message_delta says the output total, 30.
	want := priceClaude.Cost(200, 30)
	rows := requestRows(t, "acct")
	if len(rows) != 1 || rows[0].Kind != wallet.KindCharge || rows[0].Model != "claude" || rows[0].TokensIn != 200 || rows[0].TokensOut != 30 || parseMoney(t, rows[0].Cost) != want {
		t.Fatalf("ledger rows %+v, want one charge of %s", rows, want)
	}
	bal, reserved := balanceOf(t, "acct")
	if bal != money(t, "1")-want || reserved != 0 {
		t.Fatalf("balance %s reserved %s", bal, reserved)
	}
}

func TestWalletInsufficientBalance402(t *testing.T) {
	a := upstream(t, fu.OKNamed("a"))
	b := upstream(t, fu.OKNamed("b"))
	walletGateway(t, a, b)
	secret, _ := newWalletAccount(t, "acct", "0.5")

	// pricey reserves (input bound + 100000 output tokens) at $1000/Mtok:
	// over $100.
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("pricey", false), bearer(secret)...)
	if res.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	msg, typ, code := openAIError(t, body)
	if code != "insufficient_quota" || typ != "insufficient_quota" || !strings.Contains(msg, "insufficient balance") {
		t.Errorf("OpenAI error %q %q %q", msg, typ, code)
	}
	// It says what the account has and what the client can change.
	if !strings.Contains(msg, "available balance is $0.50") || !strings.Contains(msg, "lower max_tokens") {
		t.Errorf("the 402 does not say the balance and the way out: %q", msg)
	}

	// /v1/messages: max_tokens 64, so (bytes + 1024 + 64) tokens at
	// $1000/Mtok is over $1; the account has $0.50.
	res, body = post(t, "/v1/messages", fu.MessagesRequest("pricey", false), "X-Api-Key", secret)
	if res.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	if msg, typ := anthropicError(t, body); typ != "billing_error" || !strings.Contains(msg, "insufficient balance") {
		t.Errorf("Anthropic error %q %q", msg, typ)
	}

	hits(t, a, 0)
	hits(t, b, 0)
	bal, reserved := balanceOf(t, "acct")
	if bal != money(t, "0.5") || reserved != 0 {
		t.Fatalf("balance %s reserved %s", bal, reserved)
	}
	if rows := requestRows(t, "acct"); len(rows) != 0 {
		t.Fatalf("a refused request wrote ledger rows: %s", kinds(rows))
	}
}

func TestWalletUnauthorized401(t *testing.T) {
	a := upstream(t, fu.OKNamed("a"))
	b := upstream(t, fu.OKNamed("b"))
	walletGateway(t, a, b)
	secret, keyID := newWalletAccount(t, "acct", "1")
	// A well-formed key that was never issued.
	unknown := wallet.KeyPrefix + strings.Repeat("A", 40)

	mustWalletCall(t, http.MethodPost, "keys/"+keyID+"/revoke", map[string]string{}, nil)
	if st := walletCall(t, http.MethodPost, "keys/"+keyID+"/revoke", map[string]string{}, nil); st != http.StatusConflict {
		t.Errorf("revoking twice: status %d, want 409", st)
	}

	cases := []struct {
		name string
		hdr  []string
		want string
	}{
		{"no key", nil, "missing API key"},
		{"garbage key", bearer("not-a-key"), "invalid API key"},
		{"unknown key", bearer(unknown), "invalid API key"},
		{"revoked key", bearer(secret), "revoked"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false), c.hdr...)
			if res.StatusCode != http.StatusUnauthorized {
				t.Fatalf("status %d: %s", res.StatusCode, body)
			}
			msg, _, code := openAIError(t, body)
			if code != "invalid_api_key" || !strings.Contains(msg, c.want) {
				t.Errorf("OpenAI error %q code %q", msg, code)
			}
			// The same key on the Anthropic path, in its header.
			hdr := []string{"Anthropic-Version", "2023-06-01"}
			if c.hdr != nil {
				hdr = append(hdr, "X-Api-Key", strings.TrimPrefix(c.hdr[1], "Bearer "))
			}
			res, body = post(t, "/v1/messages", fu.MessagesRequest("claude", false), hdr...)
			if res.StatusCode != http.StatusUnauthorized {
				t.Fatalf("messages: status %d: %s", res.StatusCode, body)
			}
			if msg, typ := anthropicError(t, body); typ != "authentication_error" || !strings.Contains(msg, c.want) {
				t.Errorf("Anthropic error %q %q", msg, typ)
			}
		})
	}
	hits(t, a, 0)
	hits(t, b, 0)
	bal, reserved := balanceOf(t, "acct")
	if bal != money(t, "1") || reserved != 0 {
		t.Fatalf("balance %s reserved %s", bal, reserved)
	}
}

func TestWalletAllChannelsFailNoCharge(t *testing.T) {
	a := upstream(t, fu.Status(503, ""))
	b := upstream(t, fu.Status(500, ""))
	walletGateway(t, a, b)
	secret, _ := newWalletAccount(t, "acct", "1")

	res, body := postSettled(t, "acct", "/v1/chat/completions", fu.ChatRequest("m", false), bearer(secret)...)
	if res.StatusCode < 500 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	hits(t, a, 1)
	hits(t, b, 1)
	rows := attemptsFirst(t, "acct", 3)
	if len(rows) != 3 || rows[0].Kind != wallet.KindFailedAttempt || rows[1].Kind != wallet.KindFailedAttempt || rows[2].Kind != wallet.KindRelease {
		t.Fatalf("ledger rows: %s", kinds(rows))
	}
	if got := settledOnce(t, rows); got != 0 {
		t.Fatalf("charged %s for a request nobody served", got)
	}
	bal, reserved := balanceOf(t, "acct")
	if bal != money(t, "1") || reserved != 0 {
		t.Fatalf("balance %s reserved %s", bal, reserved)
	}
}

// A 4xx the upstream answered is passed through untouched, and it cost the
// upstream account nothing, so it costs the client nothing either.
func TestWalletClientErrorPassthroughNotCharged(t *testing.T) {
	for _, api := range []struct {
		path string
		body []byte
		hdr  func(string) []string
		want string // the client's body, when not the upstream's
	}{
		{"/v1/chat/completions", fu.ChatRequest("m", false), bearer, ""},
		{"/v1/chat/completions", chatStreamBody(false), bearer, ""},
		// The upstream's OpenAI-shaped refusal reaches an Anthropic client
		// in Anthropic's shape, its message and status kept.
		{"/v1/messages", fu.MessagesRequest("claude", true), func(s string) []string { return []string{"X-Api-Key", s} },
			`{"type":"error","error":{"type":"invalid_request_error","message":"bad thing"}}`},
	} {
		t.Run(api.path, func(t *testing.T) {
			upBody := fu.OpenAIErrorBody("bad thing", "invalid_request_error", "bad")
			want := cmp.Or(api.want, upBody)
			a := upstream(t, fu.Status(400, upBody))
			b := upstream(t, fu.OKNamed("b"))
			walletGateway(t, a, b)
			secret, _ := newWalletAccount(t, "acct", "1")
			res, body := postSettled(t, "acct", api.path, api.body, api.hdr(secret)...)
			if res.StatusCode != 400 || string(body) != want {
				t.Fatalf("status %d: %s", res.StatusCode, body)
			}
			hits(t, b, 0)
			rows := requestRows(t, "acct")
			if got := settledOnce(t, rows); got != 0 {
				t.Errorf("a 400 from the upstream was charged %s: %+v", got, rows)
			}
			if len(rows) != 1 || rows[0].Kind != wallet.KindRelease {
				t.Errorf("ledger rows: %s", kinds(rows))
			}
			bal, reserved := balanceOf(t, "acct")
			if bal != money(t, "1") || reserved != 0 {
				t.Fatalf("balance %s reserved %s", bal, reserved)
			}
		})
	}
}

// streamUntil posts a streaming request and reads until the body contains
// marker, then hangs up.
func streamUntil(t *testing.T, path string, body []byte, marker string, hdr ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gatewayURL+path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("status %d: %s", res.StatusCode, b)
	}
	var seen bytes.Buffer
	rd := bufio.NewReader(res.Body)
	for !strings.Contains(seen.String(), marker) {
		line, err := rd.ReadString('\n')
		seen.WriteString(line)
		if err != nil {
			t.Fatalf("stream ended before %q: %v\n%s", marker, err, seen.String())
		}
	}
	cancel()
}

func TestWalletClientGoneMidStream(t *testing.T) {
	for name, behavior := range map[string]fu.Behavior{
		"client cancels a stalled stream": fu.StallMidStream(time.Minute),
		"upstream cuts the stream":        fu.CutMidStream(),
	} {
		t.Run(name, func(t *testing.T) {
			a := upstream(t, behavior)
			b := upstream(t, fu.OKNamed("b"))
			walletGateway(t, a, b)
			secret, _ := newWalletAccount(t, "acct", "1")
			if strings.HasPrefix(name, "client") {
				streamUntil(t, "/v1/chat/completions", chatStreamBody(false), `" from"`, bearer(secret)...)
			} else {
				res, body := post(t, "/v1/chat/completions", chatStreamBody(false), bearer(secret)...)
				if res.StatusCode != 200 {
					t.Fatalf("status %d: %s", res.StatusCode, body)
				}
				mustContain(t, body, "Hello", `"error"`)
			}
			waitUnreserved(t, "acct")
			eventually(t, 5*time.Second, "the upstream request to end", func() bool { return a.InFlight() == 0 })
			hits(t, b, 0) // committed: never failed over
			rows := requestRows(t, "acct")
			charged := settledOnce(t, rows)
			if len(rows) != 1 || rows[0].Channel != "a" {
				t.Fatalf("ledger rows: %s", kinds(rows))
			}
			// No usage report arrived: the fallback bills the input bound
			// and the delivered bytes, capped by the reservation.
			if charged <= 0 || rows[0].TokensIn <= 0 || rows[0].TokensOut <= 0 {
				t.Errorf("a partly delivered stream was charged %s (%+v)", charged, rows[0])
			}
			bal, reserved := balanceOf(t, "acct")
			if bal != money(t, "1")-charged || reserved != 0 {
				t.Fatalf("balance %s reserved %s, charged %s", bal, reserved, charged)
			}
			// The settlement stays single: nothing settles it again later.
			time.Sleep(200 * time.Millisecond)
			if rows2 := requestRows(t, "acct"); len(rows2) != len(rows) {
				t.Fatalf("ledger grew after settlement: %s", kinds(rows2))
			}
		})
	}
}

// invariantGateway is one model whose every request reserves exactly
// $0.001 (input is free; max_output_tokens 1000 at $1/Mtok) and, with the
// upstream reporting 1000 output tokens, is charged exactly that.
const invariantConfig = `
		channel a %s
		model inv {
			route a
			price 0 1
			max_output_tokens 1000
		}
		wallet
`

func runInvariant(t *testing.T, store string) {
	a := upstream(t, fu.SlowFirstToken(200*time.Millisecond).WithUsage(5, 1000))
	gatewayWith(t, storeOption(store), invariantConfig, a.URL)
	const perRequest = wallet.Micros(1000)
	secret, _ := newWalletAccount(t, "acct", (10 * perRequest).String())
	start, _ := balanceOf(t, "acct")

	const total, workers = 1000, 100
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConns: workers, MaxIdleConnsPerHost: workers}}
	defer client.CloseIdleConnections()
	body := fu.ChatRequest("inv", false)
	var ok, refused atomic.Int64
	var mu sync.Mutex
	other := map[string]int{}
	var refusal atomic.Value
	jobs := make(chan int)
	var wg sync.WaitGroup
	// Sample how many admitted requests the upstream holds at once, to
	// show that the reservations really overlapped.
	var peak atomic.Int64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if n := a.InFlight(); n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-stopSampling:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	began := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				req, _ := http.NewRequest(http.MethodPost, gatewayURL+"/v1/chat/completions", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+secret)
				res, err := client.Do(req)
				if err != nil {
					mu.Lock()
					other[err.Error()]++
					mu.Unlock()
					continue
				}
				b, _ := io.ReadAll(res.Body)
				res.Body.Close()
				switch res.StatusCode {
				case 200:
					ok.Add(1)
				case 402:
					refused.Add(1)
					refusal.Store(string(b))
				default:
					mu.Lock()
					other[fmt.Sprintf("%d %s", res.StatusCode, b)]++
					mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < total; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	took := time.Since(began)
	close(stopSampling)
	<-sampled
	waitUnreserved(t, "acct")
	t.Logf("%s: %d requests in %s: %d served, %d refused with 402, upstream hits %d, at most %d at once upstream",
		store[:strings.IndexByte(store+" ", ' ')], total, took.Round(time.Millisecond), ok.Load(), refused.Load(), a.Hits(), peak.Load())
	if peak.Load() < 2 {
		t.Errorf("the admitted requests never overlapped (peak %d in flight): the test proves nothing", peak.Load())
	}
	if r, _ := refusal.Load().(string); !strings.Contains(r, "may cost up to $0.001 ") {
		t.Errorf("the reservation is not the expected $0.001: %s", r)
	}
	if len(other) > 0 {
		t.Errorf("unexpected answers: %v", other)
	}
	if ok.Load() > 10 {
		t.Fatalf("%d requests served on a balance that covers 10", ok.Load())
	}
	// Each charge equals its reservation, so the balance buys exactly 10.
	if ok.Load() != 10 || refused.Load() != total-10 {
		t.Errorf("%d served and %d refused, want 10 and %d", ok.Load(), refused.Load(), total-10)
	}
	if a.Hits() != ok.Load() {
		t.Errorf("upstream hits %d, served %d", a.Hits(), ok.Load())
	}
	bal, reserved := balanceOf(t, "acct")
	if bal < 0 || reserved != 0 {
		t.Fatalf("balance %s reserved %s", bal, reserved)
	}
	rows := requestRows(t, "acct")
	charged := settledOnce(t, rows)
	if charged != start-bal {
		t.Fatalf("ledger charges %s, balance change %s", charged, start-bal)
	}
	if charged != wallet.Micros(ok.Load())*perRequest {
		t.Errorf("charged %s for %d requests", charged, ok.Load())
	}
	auditClean(t)
}

func TestWalletInvariantSQLite(t *testing.T) {
	runInvariant(t, "sqlite "+filepath.Join(t.TempDir(), "w.db"))
}

func TestWalletInvariantPostgres(t *testing.T) {
	dsn := pgtest.FreshDSN(t)
	// The DSN reaches the config as an env placeholder, resolved at load.
	t.Setenv("LLMF_IT_WALLET_DSN", dsn)
	runInvariant(t, "postgres {env.LLMF_IT_WALLET_DSN}")
	var st map[string]any
	mustWalletCall(t, http.MethodGet, "status", nil, &st)
	if st["store"] != "postgres" || st["reachable"] != true {
		t.Errorf("status %v", st)
	}
}

const storeErrorConfig = `
		channel a %s
		model m {
			route a
			price 2 8
		}
		wallet {
			on_store_error %s
		}
`

// pgProxy puts a fault proxy in front of the PostgreSQL server of dsn and
// returns it with dsn rewritten to go through it.
func pgProxy(t *testing.T, dsn string) (*faultproxy.Proxy, string) {
	t.Helper()
	p, via, err := faultproxy.Postgres(dsn)
	if err != nil {
		t.Fatalf("proxying %s: %v", dsn, err)
	}
	t.Cleanup(func() { p.Close() })
	return p, via
}

// walletAccountIn creates an account with credit and a key directly in
// the wallet database at dsn, for tests whose gateway cannot reach it.
func walletAccountIn(t *testing.T, dsn, id string, credit wallet.Micros) (secret string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := wallet.OpenPostgres(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.CreateAccount(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Credit(ctx, id, credit, "test"); err != nil {
		t.Fatal(err)
	}
	secret, _, err = st.CreateKey(ctx, id, "test")
	if err != nil {
		t.Fatal(err)
	}
	return secret
}

// A database that is down when the config loads does not refuse it (a
// restart during an outage would take every site of the server down):
// billed requests follow on_store_error, allow serving no key this
// instance never verified, and the wallet connects in the background and
// bills as soon as the database answers, with no reload. A DSN that can
// never work is still refused at load, without showing its password.
func TestWalletStoreDownAtStart(t *testing.T) {
	a := upstream(t, fu.OKNamed("a"))
	dsn := pgtest.FreshDSN(t)
	secret := walletAccountIn(t, dsn, "acct", money(t, "1"))
	proxy, viaProxy := pgProxy(t, dsn)
	proxy.Refuse(true)

	for _, mode := range []string{"allow", "deny"} {
		began := time.Now()
		gatewayWith(t, storeOption("postgres "+viaProxy), storeErrorConfig, a.URL, mode)
		if took := time.Since(began); took > 5*time.Second {
			t.Errorf("%s: loading took %v with the database down", mode, took)
		}
		res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false), bearer(secret)...)
		msg, _, _ := openAIError(t, body)
		if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(msg, "billing is temporarily unavailable") {
			t.Fatalf("%s with the store down since start: %d %s", mode, res.StatusCode, body)
		}
		if mode == "allow" && !strings.Contains(msg, "not verified recently") {
			t.Errorf("allow refuses a key it never verified, but says %q", msg)
		}
	}
	hits(t, a, 0)
	var status map[string]any
	if code := walletCall(t, http.MethodGet, "status", nil, &status); code != 200 || status["reachable"] != false || status["error"] == nil {
		t.Errorf("wallet status with the store down since start: %d %v", code, status)
	}

	proxy.Refuse(false)
	began := time.Now()
	eventually(t, 15*time.Second, "billed requests to be served once the database answers", func() bool {
		res, _ := post(t, "/v1/chat/completions", fu.ChatRequest("m", false), bearer(secret)...)
		return res.StatusCode == 200
	})
	t.Logf("served %v after the database came back", time.Since(began).Round(100*time.Millisecond))
	waitUnreserved(t, "acct")
	if bal, _ := balanceOf(t, "acct"); bal != money(t, "1")-priceM.Cost(fu.DefaultPromptTokens, fu.DefaultCompletionTokens) {
		t.Errorf("balance %s: the request served after recovery was not billed once", bal)
	}

	st, msg := tryLoadWith(t, storeOption("postgres postgres://u:hunter2@db.example:notaport/w"), storeErrorConfig, a.URL, "deny")
	if st == 200 || !strings.Contains(msg, "does not parse") || strings.Contains(msg, "hunter2") {
		t.Errorf("a DSN that cannot parse: load answered %d %s", st, msg)
	}
}

// A database that goes away under a running gateway: deny answers 503
// without calling an upstream; allow serves unbilled the keys this
// instance verified recently, and refuses every other key; the store is
// used again as soon as it answers.
func TestWalletOnStoreError(t *testing.T) {
	a := upstream(t, fu.OKNamed("a"))
	proxy, viaProxy := pgProxy(t, pgtest.FreshDSN(t))

	gatewayWith(t, storeOption("postgres "+viaProxy), storeErrorConfig, a.URL, "deny")
	secret, _ := newWalletAccount(t, "acct", "1")
	// A key that exists but this instance never saw.
	unseen, _ := newWalletAccount(t, "other", "1")
	res, body := postSettled(t, "acct", "/v1/chat/completions", fu.ChatRequest("m", false), bearer(secret)...)
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	want := priceM.Cost(fu.DefaultPromptTokens, fu.DefaultCompletionTokens)

	proxy.Refuse(true)
	res, body = post(t, "/v1/chat/completions", fu.ChatRequest("m", false), bearer(secret)...)
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("deny with the store down: status %d: %s", res.StatusCode, body)
	}
	if msg, _, _ := openAIError(t, body); !strings.Contains(msg, "billing is temporarily unavailable") {
		t.Errorf("deny message %q", msg)
	}
	hits(t, a, 1)
	var status map[string]any
	mustWalletCall(t, http.MethodGet, "status", nil, &status)
	if status["reachable"] != false {
		t.Errorf("status with the store down: %v", status)
	}

	// Same database, on_store_error allow: the reload shares the open
	// store, and what it verified.
	gatewayWith(t, storeOption("postgres "+viaProxy), storeErrorConfig, a.URL, "allow")
	// Past the Authenticate cache: the database must be asked again.
	time.Sleep(wallet.DefaultAuthCacheTTL)
	res, body = post(t, "/v1/chat/completions", fu.ChatRequest("m", false), bearer(secret)...)
	if res.StatusCode != 200 {
		t.Fatalf("allow, a key verified before the outage: status %d: %s", res.StatusCode, body)
	}
	hits(t, a, 2)
	made := wallet.KeyPrefix + strings.Repeat("x", 40)
	for name, key := range map[string]string{"made-up": made, "never seen": unseen} {
		res, body = post(t, "/v1/chat/completions", fu.ChatRequest("m", false), bearer(key)...)
		if res.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("allow, a %s key during the outage: status %d: %s", name, res.StatusCode, body)
		}
	}
	hits(t, a, 2)

	proxy.Refuse(false)
	eventually(t, 10*time.Second, "the store to be reachable again", func() bool {
		var s map[string]any
		return walletCall(t, http.MethodGet, "status", nil, &s) == 200 && s["reachable"] == true
	})
	bal, reserved := balanceOf(t, "acct")
	if bal != money(t, "1")-want || reserved != 0 {
		t.Fatalf("balance %s reserved %s: only the first request is billed", bal, reserved)
	}
	// Billing resumes with the store, from the first request.
	res, body = postSettled(t, "acct", "/v1/chat/completions", fu.ChatRequest("m", false), bearer(secret)...)
	if res.StatusCode != 200 {
		t.Fatalf("the first request once the store is back: status %d: %s", res.StatusCode, body)
	}
	if bal, reserved := balanceOf(t, "acct"); bal != money(t, "1")-2*want || reserved != 0 {
		t.Fatalf("balance %s reserved %s: the first request once the store is back was not billed once", bal, reserved)
	}
	if res, body := postSettled(t, "other", "/v1/chat/completions", fu.ChatRequest("m", false), bearer(unseen)...); res.StatusCode != 200 {
		t.Errorf("the other key once the store is back: %d %s", res.StatusCode, body)
	}
}

func TestWalletAdminAndCLI(t *testing.T) {
	a := upstream(t, fu.OKNamed("a").WithUsage(1000, 500))
	b := upstream(t, fu.OKNamed("b"))
	walletGateway(t, a, b)
	admin := fmt.Sprintf("localhost:%d", adminPort)
	run := func(args ...string) string {
		t.Helper()
		var buf bytes.Buffer
		if err := walletapp.RunCommand(&buf, admin, "", args); err != nil {
			t.Fatalf("llm-wallet %v: %v", args, err)
		}
		return buf.String()
	}
	expect := func(out string, want ...string) {
		t.Helper()
		mustContain(t, []byte(out), want...)
	}

	expect(run("create-account", "acme"), "account", "acme", "$0.00")
	expect(run("credit", "acme", "1234.5", "first top-up"), "balance", "$1,234.50")
	expect(run("credit", "acme", "-0.25"), "$1,234.25")
	expect(run("balance", "acme"), "balance", "$1,234.25", "reserved", "$0.00", "available", "$1,234.25")

	out := run("create-key", "acme", "laptop")
	secret := ""
	for _, f := range strings.Fields(out) {
		if strings.HasPrefix(f, wallet.KeyPrefix) {
			secret = f
		}
	}
	if secret == "" {
		t.Fatalf("create-key printed no key:\n%s", out)
	}
	expect(out, "cannot be shown again")

	keys := run("keys", "acme")
	expect(keys, "laptop", secret[:len(wallet.KeyPrefix)+6], "KEY ID")
	if strings.Contains(keys, secret) {
		t.Fatalf("keys lists the secret:\n%s", keys)
	}

	res, body := postSettled(t, "acme", "/v1/chat/completions", fu.ChatRequest("m", false), bearer(secret)...)
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	expect(run("balance", "acme"), "$1,234.244") // 1234.25 - 0.006
	usage := run("usage", "acme")
	expect(usage, "charge", "m", "1000", "500", "$0.006", "credit", "first top-up", "$1,234.50", "-$0.25")
	if i, j := strings.Index(usage, "charge"), strings.Index(usage, "first top-up"); i < 0 || j < 0 || i > j {
		t.Errorf("usage is not newest first:\n%s", usage)
	}
	expect(run("usage", "acme", "1"), "charge")
	if strings.Contains(run("usage", "acme", "1"), "credit") {
		t.Errorf("usage limit 1 shows more than one row")
	}
	expect(run("accounts"), "ACCOUNT", "acme", "$1,234.244")
	// A table, like every subcommand (--json prints the JSON: e2e).
	if out := run("status"); !regexp.MustCompile(`(?m)^store\s+sqlite$`).MatchString(out) || !regexp.MustCompile(`(?m)^reachable\s+true$`).MatchString(out) {
		t.Errorf("llm-wallet status:\n%s", out)
	}

	var ks []wallet.Key
	mustWalletCall(t, http.MethodGet, "accounts/acme/keys", nil, &ks)
	if len(ks) != 1 {
		t.Fatalf("keys: %+v", ks)
	}
	expect(run("revoke-key", ks[0].ID), "revoked", ks[0].ID)
	if !strings.Contains(run("keys", "acme"), time.Now().UTC().Format("2006-01-02")) {
		t.Errorf("revoked key shows no revocation date")
	}
	res, body = post(t, "/v1/chat/completions", fu.ChatRequest("m", false), bearer(secret)...)
	if res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("revoked key: status %d: %s", res.StatusCode, body)
	}

	// Errors reach the operator.
	var buf bytes.Buffer
	for _, args := range [][]string{
		{"balance", "nobody"}, {"create-account", "acme"}, {"credit", "acme", "1.0000001"},
		{"credit", "acme", "-5000"}, {"revoke-key", "key_nope"}, {"balance"}, {"frobnicate"},
	} {
		if err := walletapp.RunCommand(&buf, admin, "", args); err == nil {
			t.Errorf("llm-wallet %v succeeded:\n%s", args, buf.String())
		}
	}
	// Admin API status codes.
	for _, c := range []struct {
		method, path string
		body         any
		want         int
	}{
		{http.MethodGet, "accounts/nobody", nil, 404},
		{http.MethodPost, "accounts", map[string]string{"id": "acme"}, 409},
		{http.MethodPost, "accounts", map[string]string{"id": "has space"}, 400},
		{http.MethodPost, "accounts/acme/credit", map[string]string{"amount": "x"}, 400},
		{http.MethodPost, "accounts/acme/credit", map[string]string{"amount": "-99999"}, 400},
		{http.MethodPost, "accounts", map[string]string{"bogus": "1"}, 400},
		{http.MethodDelete, "accounts/acme", nil, 405},
		{http.MethodGet, "nope", nil, 404},
	} {
		if st := walletCall(t, c.method, c.path, c.body, nil); st != c.want {
			t.Errorf("%s %s: status %d, want %d", c.method, c.path, st, c.want)
		}
	}
}

// reloadMidStream starts a slow stream, runs reload once the stream is
// committed, and checks that the stream finishes whole and is charged.
// ledgerAfter reads the account's ledger after the stream ended. overlap
// requires the reload to return while the stream is still running.
func reloadMidStream(t *testing.T, a *fu.Server, secret string, overlap bool, reload func(), ledgerAfter func() []walletapp.EntryView) {
	t.Helper()
	type result struct {
		status int
		body   string
		err    error
	}
	done := make(chan result, 1)
	started := make(chan struct{})
	go func() {
		req, _ := http.NewRequest(http.MethodPost, gatewayURL+"/v1/chat/completions", bytes.NewReader(chatStreamBody(false)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+secret)
		res, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			close(started)
			done <- result{err: err}
			return
		}
		defer res.Body.Close()
		close(started) // headers are out: the stream is committed
		b, err := io.ReadAll(res.Body)
		done <- result{status: res.StatusCode, body: string(b), err: err}
	}()
	<-started
	began := time.Now()
	reload()
	if overlap && (len(done) != 0 || a.InFlight() != 1) {
		t.Fatalf("the stream ended before the reload was done; make it slower")
	}
	t.Logf("reload took %s", time.Since(began).Round(time.Millisecond))
	// Keep-alive connections to the old server die with it; a POST on one
	// is not retried.
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	var r result
	select {
	case r = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("stream did not finish")
	}
	if r.err != nil || r.status != 200 {
		t.Fatalf("stream across the reload: status %d err %v: %s", r.status, r.err, r.body)
	}
	if !strings.Contains(r.body, "[DONE]") {
		t.Errorf("stream was cut by the reload:\n%s", r.body)
	}
	want := priceM.Cost(400, 60)
	var rows []walletapp.EntryView
	eventually(t, 10*time.Second, "the stream's settlement", func() bool {
		rows = ledgerAfter()
		return len(rows) > 0
	})
	if len(rows) != 1 || rows[0].Kind != wallet.KindCharge || parseMoney(t, rows[0].Cost) != want || rows[0].TokensOut != 60 {
		t.Fatalf("ledger rows %+v, want one charge of %s", rows, want)
	}
}

func slowStreamUpstream(t *testing.T) *fu.Server {
	return upstream(t, fu.OKNamed("a").WithUsage(400, 60).WithEventDelay(300*time.Millisecond))
}

// A reload that keeps the same wallet shares the open store: the stream of
// the old config settles into it, and the new config goes on billing.
func TestWalletReloadSettlesInFlight(t *testing.T) {
	a := slowStreamUpstream(t)
	b := upstream(t, fu.OKNamed("b"))
	path := walletGateway(t, a, b)
	secret, _ := newWalletAccount(t, "acct", "1")

	reloadMidStream(t, a, secret, true, func() {
		// A change, so that it is a real reload.
		gatewayWith(t, storeOption("sqlite "+path), walletChannels+"\t\tstream_idle_timeout 30s\n", a.URL, b.URL)
	}, func() []walletapp.EntryView { return requestRows(t, "acct") })
	want := priceM.Cost(400, 60)
	// What the credit lease still holds goes back once it is idle.
	var bal, reserved wallet.Micros
	eventually(t, 5*time.Second, "the lease's money back in the account", func() bool {
		bal, reserved = balanceOf(t, "acct")
		return reserved == 0
	})
	if bal != money(t, "1")-want || reserved != 0 {
		t.Fatalf("balance %s reserved %s", bal, reserved)
	}
	// The store is still open and serving under the new config.
	a.Set(fu.OKNamed("a"))
	res, body := postSettled(t, "acct", "/v1/chat/completions", fu.ChatRequest("m", false), bearer(secret)...)
	if res.StatusCode != 200 {
		t.Fatalf("after reload: status %d: %s", res.StatusCode, body)
	}
	if rows := requestRows(t, "acct"); len(rows) != 2 || rows[1].Kind != wallet.KindCharge {
		t.Fatalf("ledger after reload: %s", kinds(rows))
	}
}

// A reload onto another wallet releases the old store, which must wait for
// the old config's stream to settle before it closes.
func TestWalletReloadToOtherStoreSettlesInFlight(t *testing.T) {
	a := slowStreamUpstream(t)
	b := upstream(t, fu.OKNamed("b"))
	path := walletGateway(t, a, b)
	secret, _ := newWalletAccount(t, "acct", "1")
	other := filepath.Join(t.TempDir(), "other.db")

	// The reload itself may wait for the stream: the old store's Destruct
	// waits (bounded) for its requests in flight before closing.
	reloadMidStream(t, a, secret, false, func() {
		gatewayWith(t, storeOption("sqlite "+other), walletChannels, a.URL, b.URL)
	}, func() []walletapp.EntryView {
		// The admin API now shows the other wallet; read the first one's
		// file directly once the old store has closed it.
		return sqliteEntries(t, path)
	})
	// Back on the first wallet: its balance reflects the charge.
	gatewayWith(t, storeOption("sqlite "+path), walletChannels, a.URL, b.URL)
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	bal, reserved := balanceOf(t, "acct")
	if bal != money(t, "1")-priceM.Cost(400, 60) || reserved != 0 {
		t.Fatalf("balance %s reserved %s", bal, reserved)
	}
}

// Operators who authenticate clients in Caddy bill the account a
// placeholder names instead of the wallet's own keys.
func TestWalletAccountPlaceholder(t *testing.T) {
	a := upstream(t, fu.OKNamed("a").WithUsage(1000, 500))
	b := upstream(t, fu.OKNamed("b"))
	path := filepath.Join(t.TempDir(), "w.db")
	byHeader := strings.Replace(walletChannels, "wallet\n", "wallet {\n\t\t\taccount {http.request.header.X-Account}\n\t\t}\n", 1)
	gatewayWith(t, storeOption("sqlite "+path), byHeader, a.URL, b.URL)
	newWalletAccount(t, "acme", "1")

	res, body := postSettled(t, "acme", "/v1/chat/completions", fu.ChatRequest("m", false), "X-Account", "acme", "Authorization", "Bearer whatever-the-client-uses")
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	if bal, reserved := balanceOf(t, "acme"); bal != money(t, "1")-priceM.Cost(1000, 500) || reserved != 0 {
		t.Fatalf("balance %s reserved %s", bal, reserved)
	}
	if rows := requestRows(t, "acme"); len(rows) != 1 || rows[0].Kind != wallet.KindCharge || rows[0].KeyID != "" {
		t.Fatalf("ledger rows: %+v", rows)
	}

	// No account named: 401; an account the wallet does not know: 401.
	for _, hdr := range [][]string{nil, {"X-Account", "nobody"}} {
		res, body = post(t, "/v1/chat/completions", fu.ChatRequest("m", false), hdr...)
		if res.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%v: status %d: %s", hdr, res.StatusCode, body)
		}
		openAIError(t, body)
	}
	hits(t, a, 1)
}

// The sweeper's job reports the period it keeps: a third of a short
// reservation_ttl, not the one-minute default it used to claim while
// running every second.
func TestWalletSweeperReportsItsSchedule(t *testing.T) {
	a := upstream(t, fu.OKNamed("a"))
	b := upstream(t, fu.OKNamed("b"))
	gatewayWith(t, walletOptions("sqlite "+filepath.Join(t.TempDir(), "w.db"), "\t\treservation_ttl 3s"), walletChannels, a.URL, b.URL)
	var status map[string]any
	mustWalletCall(t, http.MethodGet, "status", nil, &status)
	if status["sweep_every"] != "1s" {
		t.Errorf("wallet status sweep_every = %v, want 1s", status["sweep_every"])
	}
	eventually(t, 5*time.Second, "the jobs view to show the sweeper every 1s", func() bool {
		var jobs []failoverapp.JobView
		if err := adminGet(t, "/llm_failover/jobs", &jobs); err != nil {
			t.Fatal(err)
		}
		for _, j := range jobs {
			if j.Job == walletapp.SweepJobPrefix+"default" {
				return j.Every == "1s"
			}
		}
		return false
	})
}

// A stream that started under one config is billed at that config's
// prices, whatever a reload during it sets: the client was quoted, and
// reserved against, the prices of the config that admitted it.
func TestWalletReloadChangingPricesBillsTheOldPrices(t *testing.T) {
	a := slowStreamUpstream(t)
	b := upstream(t, fu.OKNamed("b"))
	path := walletGateway(t, a, b)
	secret, _ := newWalletAccount(t, "acct", "1")
	reloadMidStream(t, a, secret, true, func() {
		gatewayWith(t, storeOption("sqlite "+path), strings.Replace(walletChannels, "price 2 8", "price 20 80", 1), a.URL, b.URL)
	}, func() []walletapp.EntryView { return requestRows(t, "acct") })
}

// A reload from the SQLite wallet onto PostgreSQL while a stream is in
// flight: the stream of the old config settles into the SQLite file it
// reserved in, and the PostgreSQL store bills the new config's requests.
func TestWalletReloadFromSQLiteToPostgresSettlesInFlight(t *testing.T) {
	a := slowStreamUpstream(t)
	b := upstream(t, fu.OKNamed("b"))
	path := walletGateway(t, a, b)
	secret, _ := newWalletAccount(t, "acct", "1")
	dsn := pgtest.FreshDSN(t)
	t.Setenv("LLMF_IT_WALLET_DSN", dsn)
	reloadMidStream(t, a, secret, false, func() {
		gatewayWith(t, storeOption("postgres {env.LLMF_IT_WALLET_DSN}"), walletChannels, a.URL, b.URL)
	}, func() []walletapp.EntryView { return sqliteEntries(t, path) })
	// The old file's balance is the credit less the charge, nothing held
	// once the old store, released by the reload, has closed (returning
	// its credit lease) after its last request left.
	var acct wallet.Account
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := wallet.OpenSQLite(path)
		if err != nil {
			t.Fatal(err)
		}
		acct, err = st.Account(context.Background(), "acct")
		st.Close()
		if err != nil {
			t.Fatal(err)
		}
		if acct.Reserved == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if acct.Balance != money(t, "1")-priceM.Cost(400, 60) || acct.Reserved != 0 {
		t.Fatalf("SQLite account after the reload: balance %s reserved %s", acct.Balance, acct.Reserved)
	}
	// The new config bills the PostgreSQL wallet.
	secret2, _ := newWalletAccount(t, "acct2", "1")
	a.Set(fu.OKNamed("a"))
	res, body := postSettled(t, "acct2", "/v1/chat/completions", fu.ChatRequest("m", false), bearer(secret2)...)
	if res.StatusCode != 200 {
		t.Fatalf("after the reload onto PostgreSQL: %d %s", res.StatusCode, body)
	}
}

// A reload that changes the wallet's lease_ttl on the same database
// applies it: the store the two configs share renews this instance's
// credit leases to the new TTL, so that after a crash they are released
// as the running config says (here within 2s, not the 30s of the config
// before the reload).
func TestWalletReloadAppliesANewLeaseTTL(t *testing.T) {
	a := upstream(t, fu.OKNamed("a").WithUsage(10, 5))
	b := upstream(t, fu.OKNamed("b"))
	path := filepath.Join(t.TempDir(), "w.db")
	gatewayWith(t, storeOption("sqlite "+path+"\n\t\tlease_ttl 30s"), walletChannels, a.URL, b.URL)
	secret, _ := newWalletAccount(t, "lease", "1")
	if res, body := postSettled(t, "lease", "/v1/chat/completions", fu.ChatRequest("m", false), bearer(secret)...); res.StatusCode != 200 {
		t.Fatalf("%d %s", res.StatusCode, body)
	}
	gatewayWith(t, storeOption("sqlite "+path+"\n\t\tlease_ttl 2s"), walletChannels, a.URL, b.URL)
	if res, body := postSettled(t, "lease", "/v1/chat/completions", fu.ChatRequest("m", false), bearer(secret)...); res.StatusCode != 200 {
		t.Fatalf("after the reload: %d %s", res.StatusCode, body)
	}
	time.Sleep(2 * time.Second) // renewals under the new TTL
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var expires sql.NullInt64
	if err := db.QueryRow(`SELECT MAX(expires_at) FROM leases WHERE account_id = 'lease'`).Scan(&expires); err != nil {
		t.Fatal(err)
	}
	if !expires.Valid {
		t.Fatal("no credit lease of the account")
	}
	if left := time.Until(time.UnixMicro(expires.Int64)); left > 3*time.Second {
		t.Fatalf("the instance's credit lease expires in %s after a reload set lease_ttl 2s: "+
			"the store shared across the reload kept the old config's TTL", left.Round(time.Second))
	}
}

// sqliteEntries reads the ledger rows of account "acct" but its credits
// from the SQLite wallet at path, as the admin API would show them.
func sqliteEntries(t *testing.T, path string) []walletapp.EntryView {
	t.Helper()
	st, err := wallet.OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	entries, err := st.Usage(context.Background(), "acct", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var out []walletapp.EntryView
	for _, e := range entries {
		if e.Kind != wallet.KindCredit {
			out = append(out, walletapp.EntryView{Kind: e.Kind, Cost: e.Cost.String(), TokensOut: e.TokensOut, Channel: e.Channel})
		}
	}
	return out
}
