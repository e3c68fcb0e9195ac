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

// Bedrock answers an account over its service quota with HTTP 400 and
// x-amzn-ErrorType ServiceQuotaExceededException ("You can resubmit your
// request later", AWS's InvokeModel reference): the account's limit, not
// the request's fault. Another channel (an Anthropic key, another AWS
// account or region) serves the same request, so it must walk the chain
// rather than reach the client as a 400 that says its request is wrong.
func TestBedrockServiceQuotaExceededFailsOver(t *testing.T) {
	quota := fu.Status(http.StatusBadRequest, `{"message":"Your request exceeds the service quota for your account. You can view your quotas at Viewing service quotas. You can resubmit your request later."}`).
		WithHeader("X-Amzn-Errortype", "ServiceQuotaExceededException:http://internal.amazon.com/coral/com.amazon.bedrock/").
		WithHeader("X-Amzn-Requestid", "6f6a1c9e-0000-4000-8000-000000000000")
	a := upstream(t, quota)
	b := upstream(t, fu.OKNamed("backup"))
	e := testEngine(t, testPlan(t, Options{}, nil,
		testChannel{name: uniqueName("bedrock"), url: a.URL, adapter: bedrockAdapter(t)},
		testChannel{name: uniqueName("anthropic"), url: b.URL, adapter: new(provider.Anthropic)}))
	w, ok := send(e, "/v1/messages", fu.MessagesRequest("m", false))
	if !ok {
		t.Fatal("no answer")
	}
	if w.Code != http.StatusOK {
		t.Fatalf("Bedrock's quota refusal reached the client: status %d: %s", w.Code, w.Body)
	}
	hits(t, a, 1)
	hits(t, b, 1)
}

// Anthropic answers an organisation out of prepaid credit with 400
// invalid_request_error "Your credit balance is too low to access the
// Anthropic API" (the body Claude Code users quote in anthropics/claude-code
// #66314 and many more). Clients never send their own Anthropic key
// through the gateway: the balance is the channel's account's, and the
// Bedrock or Vertex channel behind it serves the same request. Passed
// back, it takes the whole model down until someone tops the account up,
// with the backups idle.
func TestAnthropicCreditBalanceTooLowFailsOver(t *testing.T) {
	const credit = `{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."},"request_id":"req_011CbrFTcXhtiMzr3s6EocF7"}`
	a := upstream(t, fu.Status(http.StatusBadRequest, credit))
	b := upstream(t, fu.OKNamed("backup"))
	e := testEngine(t, testPlan(t, Options{}, nil,
		testChannel{name: uniqueName("anthropic"), url: a.URL, adapter: new(provider.Anthropic)},
		testChannel{name: uniqueName("backup"), url: b.URL, adapter: new(provider.Anthropic)}))
	w, ok := send(e, "/v1/messages", fu.MessagesRequest("m", true))
	if !ok {
		t.Fatal("no answer")
	}
	if w.Code != http.StatusOK {
		t.Fatalf("the channel's empty account reached the client: status %d: %s", w.Code, w.Body)
	}
	hits(t, b, 1)
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

// Google AI Studio refuses a wrong, deleted or restricted key with 400
// INVALID_ARGUMENT, reason API_KEY_INVALID, array-wrapped (not 401: the
// retry_status workaround for 401 and 403 does not reach it). The key is
// the channel's; the next channel, with its own credentials, serves the
// request.
func TestGeminiInvalidKeyFailsOver(t *testing.T) {
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
	a := upstream(t, fu.Status(http.StatusBadRequest, invalid))
	b := upstream(t, fu.OKNamed("backup"))
	e := testEngine(t, testPlan(t, Options{}, nil,
		testChannel{name: uniqueName("studio"), url: a.URL, adapter: &provider.Gemini{APIKey: "AIza-revoked"}},
		testChannel{name: uniqueName("backup"), url: b.URL}))
	w, ok := send(e, "/v1/chat/completions", fu.ChatRequest("m", false))
	if !ok {
		t.Fatal("no answer")
	}
	if w.Code != http.StatusOK {
		t.Fatalf("the channel's refused key reached the client: status %d: %s", w.Code, w.Body)
	}
	hits(t, a, 1)
	hits(t, b, 1)
}

// A 402 is the upstream asking the channel's account to pay (OpenRouter's
// "Insufficient credits", Anthropic's billing_error): the client pays the
// gateway, never the upstream, and a 402 from the gateway means the
// client's own wallet cannot cover the request (errors.md: "never retry:
// top up the account"). The next channel serves it.
func TestUpstreamPaymentRequiredFailsOver(t *testing.T) {
	const credits = `{"error":{"code":402,"message":"Insufficient credits. Add more using https://openrouter.ai/settings/credits"}}`
	a := upstream(t, fu.Status(http.StatusPaymentRequired, credits))
	b := upstream(t, fu.OKNamed("backup"))
	e := testEngine(t, testPlan(t, Options{}, nil,
		testChannel{name: uniqueName("router"), url: a.URL}, testChannel{name: uniqueName("backup"), url: b.URL}))
	w, ok := send(e, "/v1/chat/completions", fu.ChatRequest("m", true))
	if !ok {
		t.Fatal("no answer")
	}
	if w.Code != http.StatusOK {
		t.Fatalf("the channel's unpaid account reached the client: status %d: %s", w.Code, w.Body)
	}
	hits(t, b, 1)
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
