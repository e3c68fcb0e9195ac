package integration_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/wallet"
	"github.com/llmfailover/caddy-llm-failover/walletapp"
)

// cachedPrompt is a request whose system prompt is long enough to hold
// the 10,100 input tokens the upstreams below report (a cached prefix is
// in the request like any other input).
func cachedPrompt(t *testing.T, model string, stream bool) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"model": model, "max_tokens": 1000, "stream": stream,
		"system":   strings.Repeat("You are a careful assistant. ", 500),
		"messages": []map[string]string{{"role": "user", "content": "Go on."}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// claudeCachedUsage streams a Claude answer whose usage has 100 plain
// input tokens, 9,000 read from the cache, 400 written for 5 minutes and
// 600 for an hour, and 50 output tokens, as Anthropic reports them.
var claudeCachedUsage = fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
	w.Header().Set("Content-Type", "text/event-stream")
	for _, ev := range []string{
		`{"type":"message_start","message":{"id":"msg_c","type":"message","role":"assistant","model":"claude","content":[],"usage":{"input_tokens":100,"cache_read_input_tokens":9000,"cache_creation_input_tokens":1000,"cache_creation":{"ephemeral_5m_input_tokens":400,"ephemeral_1h_input_tokens":600},"output_tokens":1}}}`,
		`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Going on."}}`,
		`{"type":"content_block_stop","index":0}`,
		`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":50}}`,
		`{"type":"message_stop"}`,
	} {
		var e struct{ Type string }
		_ = json.Unmarshal([]byte(ev), &e)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", e.Type, ev)
	}
})

// openAICachedUsage answers a chat completion whose 10,100 prompt tokens
// include 9,000 cached ones, as OpenAI reports them.
var openAICachedUsage = fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"id":"chatcmpl-c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Going on."},"finish_reason":"stop"}],"usage":{"prompt_tokens":10100,"completion_tokens":50,"total_tokens":10150,"prompt_tokens_details":{"cached_tokens":9000}}}`)
})

// responsesCachedUsage answers a Responses request whose 10,100 input
// tokens include 9,000 cached ones.
var responsesCachedUsage = fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"id":"resp_c","object":"response","status":"completed","model":"m","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Going on."}]}],"usage":{"input_tokens":10100,"input_tokens_details":{"cached_tokens":9000},"output_tokens":50,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":10150}}`)
})

// Cached input is charged at its class's price, not as plain input: the
// provider's default rates when the price names none (Claude: reads 0.1x,
// writes 1.25x and 2x; OpenAI: reads 0.5x), the operator's when it does.
// The ledger's tokens_in is still every input token.
func TestWalletChargesCacheClasses(t *testing.T) {
	for _, tt := range []struct {
		name, provider, price, path string
		upstream                    fu.Behavior
		stream                      bool
		want                        wallet.Micros
	}{
		// 100×3 + 50×15 + 9,000×0.3 + 400×3.75 + 600×6 micro-dollars.
		{"claude defaults", "provider anthropic", "price 3 15", "/v1/messages", claudeCachedUsage, true, 300 + 750 + 2700 + 1500 + 3600},
		{"claude priced", "provider anthropic", "price 3 15 cache_read 0.5 cache_write 4 cache_write_1h 7", "/v1/messages", claudeCachedUsage, true, 300 + 750 + 4500 + 1600 + 4200},
		// 1,100×3 + 9,000×1.5 + 50×15.
		{"openai defaults", "", "price 3 15", "/v1/chat/completions", openAICachedUsage, false, 3300 + 13500 + 750},
		{"responses defaults", "", "price 3 15", "/v1/responses", responsesCachedUsage, false, 3300 + 13500 + 750},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := upstream(t, tt.upstream)
			gateway(t, `
		channel a %s {
			`+tt.provider+`
		}
		model m {
			route a
			`+tt.price+`
		}
		wallet
`, a.URL)
			account := "acct-cache-" + strings.ReplaceAll(tt.name, " ", "-")
			secret, _ := newWalletAccount(t, account, "1")
			body := cachedPrompt(t, "m", tt.stream)
			if tt.path == "/v1/responses" {
				var m map[string]any
				_ = json.Unmarshal(body, &m)
				body, _ = json.Marshal(map[string]any{"model": "m", "instructions": m["system"], "input": "Go on.", "max_output_tokens": 1000})
			}
			if tt.path == "/v1/chat/completions" {
				var m map[string]any
				_ = json.Unmarshal(body, &m)
				sys := m["system"]
				delete(m, "system")
				m["messages"] = []map[string]any{{"role": "system", "content": sys}, {"role": "user", "content": "Go on."}}
				body, _ = json.Marshal(m)
			}
			res, got := postSettled(t, account, tt.path, body, "Authorization", "Bearer "+secret, "Anthropic-Version", "2023-06-01")
			if res.StatusCode != 200 {
				t.Fatalf("status %d: %s", res.StatusCode, got)
			}
			rows := requestRows(t, account)
			if len(rows) != 1 || rows[0].Kind != wallet.KindCharge {
				t.Fatalf("ledger %s", kinds(rows))
			}
			if cost := parseMoney(t, rows[0].Cost); cost != tt.want {
				t.Errorf("charged %d micro-dollars, want %d (row %+v)", cost, tt.want, rows[0])
			}
			if rows[0].TokensIn != 10100 || rows[0].TokensOut != 50 || rows[0].Note != "" || rows[0].TokensCacheRead != 9000 {
				t.Errorf("row %+v", rows[0])
			}
			if tt.provider != "" && (rows[0].TokensCacheWrite != 400 || rows[0].TokensCacheWrite1h != 600) {
				t.Errorf("row %+v: the cache writes are not recorded by class", rows[0])
			}
			var out bytes.Buffer
			if err := walletapp.RunCommand(&out, fmt.Sprintf("localhost:%d", adminPort), "", []string{"usage", account}); err != nil || !strings.Contains(out.String(), "read=9000") {
				t.Errorf("caddy llm-wallet usage does not show the cache read: %v\n%s", err, out.String())
			}
			auditClean(t)
		})
	}
}

// A price option the parser does not know is a mistake at load, not a
// price silently ignored.
func TestPriceCacheOptionsChecked(t *testing.T) {
	for _, bad := range []string{"price 3 15 cache_read", "price 3 15 cache_reads 1", "price 3 15 cache_write x"} {
		if code, body := tryLoad(t, `channel a http://127.0.0.1:9 {
		}
		model m {
			route a
			%s
		}`, bad); code == 200 {
			t.Errorf("%q accepted: %s", bad, body)
		}
	}
}

// A request that asks for an hour's cache write is reserved at the write
// price (Claude's default, 2x input): an account that covers the same
// request without the marker gets 402 with it, and one that covers it is
// charged the whole write, never capped at a plain-input reservation.
func TestWalletReservesForCacheWrites(t *testing.T) {
	a := upstream(t, claudeCachedUsage)
	gateway(t, `
		channel a %s {
			provider anthropic
		}
		model m {
			route a
			price 3 15
		}
		wallet
`, a.URL)
	plainBody := cachedPrompt(t, "m", true)
	var m map[string]any
	_ = json.Unmarshal(plainBody, &m)
	m["system"] = []map[string]any{{"type": "text", "text": m["system"], "cache_control": map[string]string{"type": "ephemeral", "ttl": "1h"}}}
	writeBody, _ := json.Marshal(m)
	price := wallet.Price{Input: 3_000_000, Output: 15_000_000}
	plain, _ := wallet.MaxCost(wallet.Estimate{BodyBytes: len(writeBody), MaxOutput: 1000}, price)
	hour, _ := wallet.MaxCost(wallet.Estimate{BodyBytes: len(writeBody), MaxOutput: 1000, WritesCache: true, WritesCache1h: true},
		wallet.Price{Input: 3_000_000, Output: 15_000_000, CacheWrite: 3_750_000, CacheWrite1h: 6_000_000})
	if hour <= plain {
		t.Fatalf("reservations %s and %s", plain, hour)
	}
	secret, _ := newWalletAccount(t, "acct-cache-write", (plain + 1000).String())
	hdr := []string{"Authorization", "Bearer " + secret, "Anthropic-Version", "2023-06-01"}
	if res, body := postSettled(t, "acct-cache-write", "/v1/messages", writeBody, hdr...); res.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("a cache write the balance cannot cover: %d %s", res.StatusCode, body)
	}
	hits(t, a, 0)
	if res, body := postSettled(t, "acct-cache-write", "/v1/messages", plainBody, hdr...); res.StatusCode != 200 {
		t.Fatalf("the same request without a cache write: %d %s", res.StatusCode, body)
	}
	mustWalletCall(t, http.MethodPost, "accounts/acct-cache-write/credit", map[string]string{"amount": hour.String(), "note": "test"}, nil)
	if res, body := postSettled(t, "acct-cache-write", "/v1/messages", writeBody, hdr...); res.StatusCode != 200 {
		t.Fatalf("a covered cache write: %d %s", res.StatusCode, body)
	}
	rows := requestRows(t, "acct-cache-write")
	if last := rows[len(rows)-1]; parseMoney(t, last.Cost) != 300+750+2700+1500+3600 {
		t.Errorf("the cache write's row %+v", last)
	}
	auditClean(t)
}
