package failover

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/provider"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// Odd usage reports from upstreams, each a billing defect an audit found:
// cache counts that are negative or more than the input, counts that
// cannot be read, and an Anthropic message_delta that repeats
// input_tokens without the cache fields. An implausible report is charged
// at the bound (wallet.md), never estimated, and never priced as cache
// reads that cannot have happened.

// 1 micro per plain input or output token, 0.5 per cache read.
var oddPrice = wallet.Price{Input: 1e6, Output: 1e6, CacheRead: 5e5, CacheWrite: 125e4, CacheWrite1h: 2e6}

const (
	oddChat   = `{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"Say hello."}]}`
	oddStream = `{"model":"m","max_tokens":100,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Say hello."}]}`
	oddMsgs   = `{"model":"m","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"Say hello."}]}`
)

// oddServe sends body to a model of one or two channels (resumable when
// two) whose upstreams answer raw, and returns the settled charge row.
func oddServe(t *testing.T, adapter provider.Adapter, path, body, raw string, channels int) wallet.Entry {
	t.Helper()
	var tcs []testChannel
	charge := map[string]ChargePrice{}
	for range channels {
		up := upstream(t, fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
			ct := "application/json"
			if strings.HasPrefix(raw, "data:") || strings.HasPrefix(raw, "event:") {
				ct = "text/event-stream"
			}
			w.Header().Set("Content-Type", ct)
			_, _ = w.Write([]byte(raw))
		}))
		name := uniqueName("odd")
		tcs = append(tcs, testChannel{name: name, url: up.URL, adapter: adapter})
		charge[name] = ChargePrice{Price: oddPrice}
	}
	e := testEngine(t, testPlan(t, Options{}, func(m *Model) {
		m.Price, m.Charge = oddPrice, charge
		if channels > 1 {
			m.Resume = ResumeContinue
		}
	}, tcs...))
	row, _ := chargeRow(t, e, path, body)
	return row
}

// chargeRow sends body to e with a funded wallet key and returns the
// answer's settled charge row and what the client got.
func chargeRow(t *testing.T, e *Engine, path, body string) (wallet.Entry, string) {
	t.Helper()
	ctx, st, secret := withTestWallet(t, e)
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+secret)
	w := httptest.NewRecorder()
	serveDirect(e, w, req)
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	var row wallet.Entry
	eventually(t, 5*time.Second, "the charge row", func() bool {
		rows, err := st.Usage(ctx, "acct", 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.Kind == wallet.KindCharge {
				row = r
				return true
			}
		}
		return false
	})
	return row, w.Body.String()
}

func chatJSON(usage string) string {
	return `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello."},"finish_reason":"stop"}],"usage":` + usage + `}`
}

func anthropicSSE(startUsage, deltaUsage string) string {
	return `event: message_start
data: {"type":"message_start","message":{"id":"msg","type":"message","role":"assistant","model":"m","content":[],"usage":` + startUsage + `}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello."}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":` + deltaUsage + `}

event: message_stop
data: {"type":"message_stop"}

`
}

const implausible = "implausible usage reported"

func TestOddUsageCachedAbovePrompt(t *testing.T) {
	row := oddServe(t, nil, "/v1/chat/completions", oddChat,
		chatJSON(`{"prompt_tokens":100,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":1000}}`), 1)
	if !strings.Contains(row.Note, implausible) || row.TokensCacheRead != 0 {
		t.Errorf("charged %d micros, tokens_in %d, tokens_cache_read %d, note %q", int64(row.Cost), row.TokensIn, row.TokensCacheRead, row.Note)
	}
}

func TestOddUsageNegativeCacheCount(t *testing.T) {
	for name, row := range map[string]func() wallet.Entry{
		"openai": func() wallet.Entry {
			return oddServe(t, nil, "/v1/chat/completions", oddChat,
				chatJSON(`{"prompt_tokens":100,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":-500}}`), 1)
		},
		"anthropic": func() wallet.Entry {
			return oddServe(t, new(provider.Anthropic), "/v1/messages", oddMsgs,
				anthropicSSE(`{"input_tokens":600,"cache_read_input_tokens":-500,"output_tokens":1}`, `{"output_tokens":50}`), 1)
		},
	} {
		if r := row(); !strings.Contains(r.Note, implausible) || r.TokensCacheRead < 0 {
			t.Errorf("%s: note %q, tokens_cache_read %d, %d micros; want charged at the bound, noted implausible", name, r.Note, r.TokensCacheRead, int64(r.Cost))
		}
	}
}

func TestOddUsageCacheAboveBoundResumable(t *testing.T) {
	raw := `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hello."},"finish_reason":"stop"}]}

data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":1000000000}}}

data: [DONE]

`
	row := oddServe(t, nil, "/v1/chat/completions", oddStream, raw, 2)
	in, out := wallet.Estimate{BodyBytes: len(oddStream), MaxOutput: 100}.Bounds()
	if bound := oddPrice.Cost(in, out); row.Cost > bound || !strings.Contains(row.Note, implausible) {
		t.Errorf("charged %s, note %q; want at most the bound's %s (%d in, %d out), noted implausible", row.Cost, row.Note, bound, in, out)
	}
}

func TestOddUsageOutOfRangeCount(t *testing.T) {
	for _, u := range []string{`{"prompt_tokens":100,"completion_tokens":1e30}`, `{"prompt_tokens":100,"completion_tokens":99999999999999999999}`} {
		row := oddServe(t, nil, "/v1/chat/completions", oddChat, chatJSON(u), 1)
		in, _ := wallet.Estimate{BodyBytes: len(oddChat), MaxOutput: 100}.Bounds()
		if !strings.Contains(row.Note, implausible) || row.TokensIn != in || row.TokensOut != 100 {
			t.Errorf("%s: row %d in, %d out, %d micros, note %q; want the bound (%d in, 100 out), noted implausible",
				u, row.TokensIn, row.TokensOut, int64(row.Cost), row.Note, in)
		}
	}
}

func TestOddUsageAnthropicDeltaKeepsCache(t *testing.T) {
	row := oddServe(t, new(provider.Anthropic), "/v1/messages", oddMsgs,
		anthropicSSE(`{"input_tokens":10,"cache_read_input_tokens":900,"output_tokens":1}`, `{"input_tokens":10,"output_tokens":50}`), 1)
	// 10 plain + 900 cache reads at 0.5 + 50 out = 510 micros.
	if row.TokensIn != 910 || row.TokensCacheRead != 900 || row.Cost != 510 {
		t.Errorf("row %d in (%d cache read), %d micros; want 910 in (900 cache read), 510 micros", row.TokensIn, row.TokensCacheRead, int64(row.Cost))
	}
}
