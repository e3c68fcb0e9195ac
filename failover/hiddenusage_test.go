package failover

import (
	"io"
	"net/http"
	"strings"
	"testing"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/provider"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// What providers bill today that a request's body does not show: reasoning
// an OpenAI chat stream reports only in its usage chunk, input a
// server-side tool adds (web search results), and documents the body
// names by URL or file id. Each must be charged as reported, not at an
// estimate of what was delivered nor at a bound the body alone gave.

// hiddenServe sends body to model "m" (oddPrice, set up further by model)
// on one channel whose upstream answers with answer, and returns the
// settled charge row and what the client got.
func hiddenServe(t *testing.T, adapter provider.Adapter, path, body string, model func(*Model), answer fu.BehaviorFunc) (wallet.Entry, string) {
	t.Helper()
	up := upstream(t, answer)
	name := uniqueName("hidden")
	e := testEngine(t, testPlan(t, Options{}, func(m *Model) {
		m.Price, m.Charge = oddPrice, map[string]ChargePrice{name: {Price: oddPrice}}
		if model != nil {
			model(m)
		}
	}, testChannel{name: name, url: up.URL, adapter: adapter}))
	return chargeRow(t, e, path, body)
}

// openAIReasoningStream answers a chat stream as OpenAI does for a
// reasoning model: the reasoning is never streamed, only counted, and the
// usage chunk comes only when the request asks for it with
// stream_options.include_usage true.
func openAIReasoningStream(w http.ResponseWriter, r *http.Request, _ int64) {
	body, _ := io.ReadAll(r.Body)
	req, _ := provider.OpenAIChat.ParseRequest(body)
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}

data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"Hello."},"finish_reason":null}]}

data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}

`)
	if req.IncludeUsage {
		_, _ = io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2000,"total_tokens":2012,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":1998,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}

`)
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

// A client that sends stream_options without include_usage (OpenAI's
// include_obfuscation, or include_usage false) must not get a reasoning
// model's hidden reasoning for free: the gateway asks for the usage it
// bills by, as it does when stream_options is absent, and hides it.
func TestUsageChatStreamOptionsWithoutUsageStillReported(t *testing.T) {
	for _, opts := range []string{`{"include_obfuscation":false}`, `{"include_usage":false}`, `{}`} {
		body := `{"model":"m","max_completion_tokens":4000,"stream":true,"stream_options":` + opts + `,"messages":[{"role":"user","content":"Say hello."}]}`
		row, got := hiddenServe(t, nil, "/v1/chat/completions", body, nil, openAIReasoningStream)
		if row.TokensOut != 2000 || row.Note != "" {
			t.Errorf("stream_options %s: charged %d out (%d micros), note %q; want the 2000 completion tokens OpenAI bills (1998 of them reasoning)",
				opts, row.TokensOut, int64(row.Cost), row.Note)
		}
		if strings.Contains(got, `"usage":{`) {
			t.Errorf("stream_options %s: the client, which did not ask for usage, got the usage chunk:\n%s", opts, got)
		}
	}
}

// anthropicJSON is a Messages answer with usage.
func anthropicJSON(usage string) fu.BehaviorFunc {
	return func(w http.ResponseWriter, _ *http.Request, _ int64) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"msg","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"Done."}],"stop_reason":"end_turn","stop_sequence":null,"usage":`+usage+`}`)
	}
}

// Web search results are input tokens (Anthropic: "Claude needs to pull
// search results into context"): a request with a server-side tool has
// input its body does not show, like one with stored context, and is
// bounded by the model's max_input_tokens, so that what the provider
// bills for it is charged.
func TestUsageServerToolInputCharged(t *testing.T) {
	body := `{"model":"m","max_tokens":1000,"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":3}],"messages":[{"role":"user","content":"What changed in Go 1.26?"}]}`
	row, _ := hiddenServe(t, new(provider.Anthropic), "/v1/messages", body, func(m *Model) { m.MaxInput = 200_000 },
		anthropicJSON(`{"input_tokens":25310,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":412,"server_tool_use":{"web_search_requests":2},"service_tier":"standard"}`))
	if row.TokensIn != 25310 || row.TokensOut != 412 || row.Note != "" {
		t.Errorf("charged %d in, %d out (%d micros), note %q; want the 25310 in, 412 out Anthropic bills", row.TokensIn, row.TokensOut, int64(row.Cost), row.Note)
	}
}

// A PDF named by URL or Files API id costs input tokens (1,500 to 3,000 a
// page) its few bytes in the body do not show. The reservation counts
// such parts like images (wallet.Estimate: "image, audio and file
// parts, whether inline or by URL"), so that a report of them is
// charged, not taken for implausible and cut to the body's bound.
func TestUsageReferencedDocumentCharged(t *testing.T) {
	for name, tt := range map[string]struct {
		path, body string
		answer     fu.BehaviorFunc
	}{
		"anthropic document url": {"/v1/messages",
			`{"model":"m","max_tokens":1000,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"url","url":"https://example.com/report.pdf"}},{"type":"text","text":"Summarise it."}]}]}`,
			anthropicJSON(`{"input_tokens":30120,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":300}`)},
		"anthropic document file_id": {"/v1/messages",
			`{"model":"m","max_tokens":1000,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"file","file_id":"file_011CNha8iCJcU1wXNR6q4V8w"}},{"type":"text","text":"Summarise it."}]}]}`,
			anthropicJSON(`{"input_tokens":30120,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":300}`)},
		"openai chat file": {"/v1/chat/completions",
			`{"model":"m","max_completion_tokens":1000,"messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"file-6F2ksmvXxt4VdoqmHRw6kL"}},{"type":"text","text":"Summarise it."}]}]}`,
			func(w http.ResponseWriter, _ *http.Request, _ int64) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, chatJSON(`{"prompt_tokens":30120,"completion_tokens":300,"total_tokens":30420}`))
			}},
	} {
		var adapter provider.Adapter
		if strings.HasSuffix(tt.path, "/messages") {
			adapter = new(provider.Anthropic)
		}
		row, _ := hiddenServe(t, adapter, tt.path, tt.body, nil, tt.answer)
		if row.TokensIn != 30120 || row.TokensOut != 300 || row.Note != "" {
			t.Errorf("%s: charged %d in, %d out (%d micros), note %q; want the 30120 in, 300 out the provider bills",
				name, row.TokensIn, row.TokensOut, int64(row.Cost), row.Note)
		}
	}
}

// An Anthropic stream that ends without its message_delta (the client
// pressed Esc, the upstream cut it) has its input reported whole in
// message_start, cache reads among it. Only the output is estimated: the
// input the upstream reported is priced by class, as it bills it, not
// every cache read at the plain input price (10 times Claude's read
// price).
func TestUsageCutStreamKeepsReportedCacheClasses(t *testing.T) {
	body := `{"model":"m","max_tokens":100,"stream":true,"system":"` + strings.Repeat("You are a careful assistant. ", 400) + `","messages":[{"role":"user","content":"Say hello."}]}`
	row, _ := hiddenServe(t, new(provider.Anthropic), "/v1/messages", body, nil, func(w http.ResponseWriter, _ *http.Request, _ int64) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, `event: message_start
data: {"type":"message_start","message":{"id":"msg","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"cache_creation_input_tokens":0,"cache_read_input_tokens":3000,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello."}}

`)
	})
	// 10 plain + 3000 cache reads at 0.5 + the estimated output.
	if row.TokensIn != 3010 || row.TokensCacheRead != 3000 || int64(row.Cost) > 10+1500+row.TokensOut {
		t.Errorf("charged %d micros for %d in (%d cache read), %d out, note %q; want the 3000 cache reads at their price: at most %d micros",
			int64(row.Cost), row.TokensIn, row.TokensCacheRead, row.TokensOut, row.Note, 10+1500+row.TokensOut)
	}
}
