package failover

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// Failures as the providers send them today, each one's class checked
// against the rule: what another channel could serve walks the chain,
// what every channel would refuse goes back to the client in its API's
// format.

// bedrockAdapter is a Bedrock adapter with a Bedrock API key, provisioned.
func bedrockAdapter(t *testing.T) *provider.Bedrock {
	t.Helper()
	b := &provider.Bedrock{Region: "us-east-1", APIKey: "ABSK-test"}
	if err := b.Provision(testContext(t)); err != nil {
		t.Fatal(err)
	}
	return b
}

// A refusal about the channel's own provider account, not the request,
// walks the chain: another channel, with its own account, serves the
// same request. Each as its provider sends it today:
//   - Bedrock: HTTP 400, x-amzn-ErrorType ServiceQuotaExceededException
//     ("You can resubmit your request later", AWS's InvokeModel
//     reference): the account's quota.
//   - Anthropic: 400 invalid_request_error "Your credit balance is too
//     low" (the body Claude Code users quote in anthropics/claude-code
//     #66314 and many more): the organisation's prepaid balance. Clients
//     never send their own Anthropic key through the gateway.
//   - Google AI Studio: 400 INVALID_ARGUMENT, reason API_KEY_INVALID,
//     array-wrapped (not 401: retry_status 401 403 does not reach it).
//   - Any 402 (OpenRouter's "Insufficient credits", Anthropic's
//     billing_error): the client pays the gateway, never the upstream, and
//     the gateway's own 402 means the client's wallet cannot cover it.
//
// Passed back, each took the whole model down with the backups idle, and
// told the client its request or its wallet was at fault.
func TestAccountRefusalsFailOver(t *testing.T) {
	const credit = `{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."},"request_id":"req_011CbrFTcXhtiMzr3s6EocF7"}`
	const credits = `{"error":{"code":402,"message":"Insufficient credits. Add more using https://openrouter.ai/settings/credits"}}`
	const invalid = `[{
  "error": {
    "code": 400,
    "message": "API key not valid. Please pass a valid API key.",
    "status": "INVALID_ARGUMENT",
    "details": [
      {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID", "domain": "googleapis.com",
       "metadata": {"service": "generativelanguage.googleapis.com"}},
      {"@type": "type.googleapis.com/google.rpc.LocalizedMessage", "locale": "en-US", "message": "API key not valid. Please pass a valid API key."}
    ]
  }
}
]`

	for _, tt := range []struct {
		name             string
		refusal          fu.Behavior
		refusing, backup func() provider.Adapter
		path             string
		body             []byte
	}{
		{"bedrock quota", fu.Status(http.StatusBadRequest, `{"message":"Your request exceeds the service quota for your account. You can view your quotas at Viewing service quotas. You can resubmit your request later."}`).
			WithHeader("X-Amzn-Errortype", "ServiceQuotaExceededException:http://internal.amazon.com/coral/com.amazon.bedrock/").
			WithHeader("X-Amzn-Requestid", "6f6a1c9e-0000-4000-8000-000000000000"),
			func() provider.Adapter { return bedrockAdapter(t) }, func() provider.Adapter { return new(provider.Anthropic) },
			"/v1/messages", fu.MessagesRequest("m", false)},
		{"anthropic credit", fu.Status(http.StatusBadRequest, credit),
			func() provider.Adapter { return new(provider.Anthropic) }, func() provider.Adapter { return new(provider.Anthropic) },
			"/v1/messages", fu.MessagesRequest("m", true)},
		{"google key", fu.Status(http.StatusBadRequest, invalid),
			func() provider.Adapter { return &provider.Gemini{APIKey: "AIza-revoked"} }, func() provider.Adapter { return nil },
			"/v1/chat/completions", fu.ChatRequest("m", false)},
		{"402", fu.Status(http.StatusPaymentRequired, credits),
			func() provider.Adapter { return nil }, func() provider.Adapter { return nil },
			"/v1/chat/completions", fu.ChatRequest("m", true)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := upstream(t, tt.refusal)
			b := upstream(t, fu.OKNamed("backup"))
			e := testEngine(t, testPlan(t, Options{}, nil,
				testChannel{name: uniqueName("refusing"), url: a.URL, adapter: tt.refusing()},
				testChannel{name: uniqueName("backup"), url: b.URL, adapter: tt.backup()}))
			w, ok := send(e, tt.path, tt.body)
			if !ok {
				t.Fatal("no answer")
			}
			if w.Code != http.StatusOK {
				t.Fatalf("the channel's account refusal reached the client: status %d: %s", w.Code, w.Body)
			}
			hits(t, a, 1)
			hits(t, b, 1)
		})
	}
}

// An OpenAI-compatible host serving /v1/messages (the openai adapter
// sends it every API) may refuse in OpenAI's shape, as UpstreamMessage
// allows for. The Anthropic SDK the client runs reads
// {"type":"error","error":{"type":...,"message":...}}: the refusal passed
// back must be in that shape, the upstream's message quoted, its status
// kept.
func TestOpenAIShapedRefusalReachesAnthropicClientInItsFormat(t *testing.T) {
	const tooLong = `{"error":{"message":"This model's maximum context length is 8192 tokens. However, you requested 9000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`
	a := upstream(t, fu.Status(http.StatusBadRequest, tooLong))
	e := testEngine(t, testPlan(t, Options{}, nil, testChannel{name: uniqueName("compat"), url: a.URL}))
	w, ok := send(e, "/v1/messages", fu.MessagesRequest("m", false))
	if !ok {
		t.Fatal("no answer")
	}
	if w.Code != http.StatusBadRequest {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	var got struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, w.Body)
	}
	if got.Type != "error" || got.Error.Type != "invalid_request_error" || !strings.Contains(got.Error.Message, "maximum context length") {
		t.Errorf("not an Anthropic error quoting the upstream: %s", w.Body)
	}
}

// When the channel whose account refused is the last (or only) one, the
// client's error says channels failed, and is not a 402 (the gateway's
// own "your wallet cannot cover this") nor a 400 (your request is wrong).
func TestChannelRefusalAloneIsNotTheClientsFault(t *testing.T) {
	for _, tt := range []struct {
		status int
		body   string
	}{
		{http.StatusPaymentRequired, `{"error":{"code":402,"message":"Insufficient credits. Add more using https://openrouter.ai/settings/credits"}}`},
		{http.StatusBadRequest, `{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}}`},
	} {
		a := upstream(t, fu.Status(tt.status, tt.body))
		e := testEngine(t, testPlan(t, Options{}, nil, testChannel{name: uniqueName("only"), url: a.URL, adapter: new(provider.Anthropic)}))
		w, ok := send(e, "/v1/messages", fu.MessagesRequest("m", false))
		if !ok {
			t.Fatal("no answer")
		}
		if w.Code != http.StatusBadGateway || !strings.Contains(w.Body.String(), "channel(s) tried") || !strings.Contains(w.Body.String(), "redit") {
			t.Errorf("upstream %d: status %d: %s", tt.status, w.Code, w.Body)
		}
	}
}
