package provider

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestErrorBodyOpenAI(t *testing.T) {
	tests := []struct {
		status   int
		typ      string
		code     string // "" means null
		override string
	}{
		{400, "invalid_request_error", "", ""},
		{401, "invalid_request_error", "invalid_api_key", ""},
		{402, "insufficient_quota", "insufficient_quota", ""},
		{404, "invalid_request_error", "model_not_found", ""},
		{413, "invalid_request_error", "request_too_large", ""},
		{429, "rate_limit_exceeded", "rate_limit_exceeded", ""},
		{500, "server_error", "", ""},
		{502, "server_error", "", ""},
		{503, "server_error", "", ""},
		{504, "server_error", "timeout", ""},
		{529, "server_error", "", ""},
		{422, "invalid_request_error", "", ""},
		// Code overrides the default code but not the type.
		{404, "invalid_request_error", "no_route", "no_route"},
		{400, "invalid_request_error", "context_length_exceeded", "context_length_exceeded"},
		{429, "rate_limit_exceeded", "insufficient_quota", "insufficient_quota"},
	}
	for _, api := range []API{OpenAIChat, OpenAIResponses, OpenAICompletions, OpenAIEmbeddings, OpenAIModels, Unknown} {
		for _, tt := range tests {
			msg := "something \"failed\" <here> & there"
			b := api.ErrorBody(Error{Status: tt.status, Message: msg, Code: tt.override})
			// Decode strictly into a generic map to check the exact shape.
			var top map[string]json.RawMessage
			if err := json.Unmarshal(b, &top); err != nil {
				t.Fatalf("%v %d: invalid JSON %s: %v", api, tt.status, b, err)
			}
			if len(top) != 1 || top["error"] == nil {
				t.Errorf("%v %d: top-level keys of %s, want only \"error\"", api, tt.status, b)
				continue
			}
			var detail map[string]any
			if err := json.Unmarshal(top["error"], &detail); err != nil {
				t.Fatalf("%v %d: %s: %v", api, tt.status, b, err)
			}
			if len(detail) != 4 {
				t.Errorf("%v %d: error has %d keys, want message/type/param/code: %s", api, tt.status, len(detail), b)
			}
			if detail["message"] != msg {
				t.Errorf("%v %d: message = %v, want %q", api, tt.status, detail["message"], msg)
			}
			if detail["type"] != tt.typ {
				t.Errorf("%v %d: type = %v, want %q", api, tt.status, detail["type"], tt.typ)
			}
			if p, ok := detail["param"]; !ok || p != nil {
				t.Errorf("%v %d: param = %v (present %v), want null", api, tt.status, p, ok)
			}
			c, ok := detail["code"]
			if !ok {
				t.Errorf("%v %d: code missing: %s", api, tt.status, b)
			} else if tt.code == "" && c != nil {
				t.Errorf("%v %d: code = %v, want null", api, tt.status, c)
			} else if tt.code != "" && c != tt.code {
				t.Errorf("%v %d: code = %v, want %q", api, tt.status, c, tt.code)
			}
		}
	}
}

func TestErrorBodyAnthropic(t *testing.T) {
	tests := []struct {
		status int
		typ    string
	}{
		{400, "invalid_request_error"},
		{401, "authentication_error"},
		{402, "billing_error"},
		{403, "permission_error"},
		{404, "not_found_error"},
		{413, "request_too_large"},
		{422, "invalid_request_error"},
		{429, "rate_limit_error"},
		{409, "invalid_request_error"},
		{500, "api_error"},
		{502, "api_error"},
		{503, "overloaded_error"},
		{504, "timeout_error"},
		{529, "overloaded_error"},
	}
	for _, api := range []API{AnthropicMessages, AnthropicCountTokens} {
		for _, tt := range tests {
			// Code is an OpenAI notion and must not leak into Anthropic bodies.
			b := api.ErrorBody(Error{Status: tt.status, Message: "nope", Code: "model_not_found"})
			var top map[string]json.RawMessage
			if err := json.Unmarshal(b, &top); err != nil {
				t.Fatalf("%v %d: invalid JSON %s: %v", api, tt.status, b, err)
			}
			if len(top) != 2 || string(top["type"]) != `"error"` {
				t.Errorf("%v %d: body %s, want {\"type\":\"error\",\"error\":{...}}", api, tt.status, b)
			}
			var detail map[string]any
			if err := json.Unmarshal(top["error"], &detail); err != nil {
				t.Fatalf("%v %d: %s: %v", api, tt.status, b, err)
			}
			want := map[string]any{"type": tt.typ, "message": "nope"}
			if len(detail) != len(want) || detail["type"] != want["type"] || detail["message"] != want["message"] {
				t.Errorf("%v %d: error = %v, want %v", api, tt.status, detail, want)
			}
			if bytes.Contains(b, []byte("model_not_found")) {
				t.Errorf("%v %d: Anthropic body carries the OpenAI code: %s", api, tt.status, b)
			}
		}
	}
}

func TestUpstreamMessage(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{"openai", `{"error":{"message":"Rate limit reached for gpt-4o","type":"requests","param":null,"code":"rate_limit_exceeded"}}`, "Rate limit reached for gpt-4o"},
		{"anthropic", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, "Overloaded"},
		{"error string", `{"error":"upstream connect error"}`, "upstream connect error"},
		{"message only", `{"message":"x"}`, "x"},
		{"nested message preferred", `{"error":{"message":"inner"},"message":"outer"}`, "inner"},
		{"empty nested message falls back", `{"error":{"message":""},"message":"outer"}`, "outer"},
		{"error number falls back", `{"error":500,"message":"outer"}`, "outer"},
		{"error null falls back", `{"error":null,"message":"outer"}`, "outer"},
		{"error empty string falls back", `{"error":"","message":"outer"}`, "outer"},
		{"escaped", `{"error":{"message":"a \"quoted\" \u00e9"}}`, `a "quoted" é`},
		{"garbage", `<html>502 Bad Gateway</html>`, ""},
		{"empty", ``, ""},
		{"array", `[{"message":"x"}]`, ""},
		{"message not a string", `{"message":{"text":"x"}}`, ""},
		{"unrelated object", `{"id":"chatcmpl-1","object":"chat.completion"}`, ""},
		{"truncated", `{"error":{"message":"cut`, ""},
	}
	for _, tt := range tests {
		if got := OpenAIChat.UpstreamMessage([]byte(tt.body)); got != tt.want {
			t.Errorf("%s: OpenAIChat.UpstreamMessage(%s) = %q, want %q", tt.name, tt.body, got, tt.want)
		}
	}
}

func TestUpstreamMessageIsCapped(t *testing.T) {
	long := strings.Repeat("é", 1000)
	huge := strings.Repeat("é", 1<<16)
	if got := OpenAIChat.UpstreamMessage([]byte(`{"error":{"message":"` + huge + `"}}`)); len(got) > maxUpstreamMessage+maxSecretSpan || !utf8.ValidString(got) {
		t.Fatalf("uncut for masking: len %d, valid %v", len(got), utf8.ValidString(got))
	}
	got := CutMessage(OpenAIChat.UpstreamMessage([]byte(`{"error":{"message":"` + long + `"}}`)))
	if len(got) > maxUpstreamMessage+len("…") || !strings.HasSuffix(got, "…") || !utf8.ValidString(got) {
		t.Fatalf("len %d, valid %v", len(got), utf8.ValidString(got))
	}
}

// An in-stream error event stands for the status its type or code names,
// in each API's shape; an event naming none stands for nothing.
func TestErrorFrameStatus(t *testing.T) {
	for _, tt := range []struct {
		data string
		want int
	}{
		{`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, 529},
		{`{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`, 429},
		{`{"type":"error","error":{"type":"invalid_request_error","message":"prefill"}}`, 400},
		{`{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`, 429},
		{`{"error":{"message":"The server had an error","type":"server_error","code":null}}`, 500},
		{`{"type":"error","code":"rate_limit_exceeded","message":"slow down","param":null}`, 429},
		{`{"type":"response.failed","response":{"id":"r","error":{"code":"server_error","message":"boom"}}}`, 500},
		{`{"error":{"message":"something","code":503}}`, 0},
		{`{"error":"a string"}`, 0},
		{`{"error":{"message":"rate of something"}}`, 0},
		{`not json`, 0},
	} {
		if got := OpenAIChat.ErrorFrameStatus([]byte(tt.data)); got != tt.want {
			t.Errorf("ErrorFrameStatus(%s) = %d, want %d", tt.data, got, tt.want)
		}
	}
	// Only an Anthropic API's refusals are the client's answer, and only
	// client errors that are not about time or rate.
	for _, tt := range []struct {
		api  API
		data string
		want int
	}{
		{AnthropicMessages, `{"type":"error","error":{"type":"invalid_request_error","message":"x"}}`, 400},
		{AnthropicMessages, `{"type":"error","error":{"type":"rate_limit_error","message":"x"}}`, 0},
		{AnthropicMessages, `{"type":"error","error":{"type":"overloaded_error","message":"x"}}`, 0},
		{OpenAIChat, `{"type":"error","error":{"type":"invalid_request_error","message":"x"}}`, 0},
	} {
		if got := tt.api.ErrorFrameRefusal([]byte(tt.data)); got != tt.want {
			t.Errorf("%s.ErrorFrameRefusal(%s) = %d, want %d", tt.api, tt.data, got, tt.want)
		}
	}
}

// upstreamMessageReference is how upstreamMessage read messages with
// encoding/json, before it walked them with jsonscan: the reference
// FuzzUpstreamMessage compares with.
func upstreamMessageReference(body []byte) string {
	// Google wraps its error objects in an array:
	// [{"error":{"code":429,"message":"...","status":"RESOURCE_EXHAUSTED"}}].
	if b := trimWS(body); len(b) > 0 && b[0] == '[' {
		var arr []struct {
			Error json.RawMessage `json:"error"`
		}
		if json.Unmarshal(b, &arr) != nil || len(arr) == 0 || len(arr[0].Error) == 0 {
			return ""
		}
		body = append(append([]byte(`{"error":`), arr[0].Error...), '}')
	}
	var v struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
	}
	if json.Unmarshal(body, &v) != nil {
		return ""
	}
	if len(v.Error) > 0 {
		var d struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(v.Error, &d) == nil && d.Message != "" {
			return d.Message
		}
		var s string
		if json.Unmarshal(v.Error, &s) == nil && s != "" {
			return s
		}
	}
	return v.Message
}

// FuzzUpstreamMessage: on any valid JSON the walker finds the message
// encoding/json found.
func FuzzUpstreamMessage(f *testing.F) {
	for _, s := range []string{`{"error":{"message":"Rate limit reached","type":"requests"}}`, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`,
		`{"error":"upstream connect error"}`, `{"error":{"message":""},"message":"outer"}`, `{"error":500,"message":"outer"}`, `{"message":{"text":"x"}}`,
		`[{"error":{"code":429,"message":"Quota","status":"RESOURCE_EXHAUSTED"}}]`, `{"error":{"message":"a \"quoted\" \u00e9"}}`, `{"MESSAGE":"upper","Error":null}`,
		`{"message":"first","message":"second"}`, `[{"message":"x"}]`, `{"error":{"message":"\ud800"}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if !json.Valid(body) {
			return
		}
		if got, want := upstreamMessage(body), upstreamMessageReference(body); got != want {
			t.Fatalf("upstreamMessage(%s) = %q, encoding/json read %q", body, got, want)
		}
	})
}

// A 429 without Retry-After still says when its limit resets, in the
// provider's own headers: the exhausted limit's reset wins.
func TestRateLimitReset(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name string
		h    http.Header
		want time.Duration
		ok   bool
	}{
		{"none", http.Header{}, 0, false},
		{"openai tokens exhausted", http.Header{"X-Ratelimit-Reset-Requests": {"1s"}, "X-Ratelimit-Remaining-Requests": {"59"},
			"X-Ratelimit-Reset-Tokens": {"6m0s"}, "X-Ratelimit-Remaining-Tokens": {"0"}}, 6 * time.Minute, true},
		{"openai none exhausted: the soonest", http.Header{"X-Ratelimit-Reset-Requests": {"20ms"}, "X-Ratelimit-Reset-Tokens": {"2.5s"}}, 20 * time.Millisecond, true},
		{"anthropic output tokens exhausted", http.Header{
			"Anthropic-Ratelimit-Requests-Reset": {"2026-12-06T12:00:01Z"}, "Anthropic-Ratelimit-Requests-Remaining": {"49"},
			"Anthropic-Ratelimit-Output-Tokens-Reset": {"2026-12-06T12:00:30Z"}, "Anthropic-Ratelimit-Output-Tokens-Remaining": {"0"}}, 30 * time.Second, true},
		{"reset in the past", http.Header{"Anthropic-Ratelimit-Tokens-Reset": {"2026-12-06T11:59:00Z"}}, 0, true},
		{"unparsable", http.Header{"X-Ratelimit-Reset-Tokens": {"soon"}, "Anthropic-Ratelimit-Tokens-Reset": {"tomorrow"}}, 0, false},
		{"negative", http.Header{"X-Ratelimit-Reset-Tokens": {"-1s"}}, 0, false},
	} {
		got, ok := RateLimitReset(tt.h, now)
		if got != tt.want || ok != tt.ok {
			t.Errorf("%s: RateLimitReset = %s, %v; want %s, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}

func TestStoredContextMissing(t *testing.T) {
	for _, tt := range []struct {
		status int
		body   string
		want   bool
	}{
		{400, `{"error":{"message":"Previous response with id 'resp_1' not found.","type":"invalid_request_error","param":"previous_response_id","code":"previous_response_not_found"}}`, true},
		{404, `{"error":{"message":"Conversation with id 'conv_1' not found.","type":"invalid_request_error","param":null,"code":null}}`, true},
		{400, `{"error":{"message":"Prompt with id 'pmpt_1' not found.","type":"invalid_request_error","param":"prompt.id","code":null}}`, true},
		{404, `{"error":{"message":"The model 'x' does not exist","type":"invalid_request_error","param":null,"code":"model_not_found"}}`, false},
		{400, `{"error":{"message":"Invalid value for 'temperature'.","type":"invalid_request_error","param":"temperature","code":"invalid_value"}}`, false},
		{400, `{"error":{"message":"Item 'x' not found.","type":"invalid_request_error","param":"input","code":null}}`, false},
		{500, `{"error":{"message":"Previous response not found","code":"previous_response_not_found"}}`, false},
		{404, `not json`, false},
	} {
		if got := StoredContextMissing(tt.status, []byte(tt.body)); got != tt.want {
			t.Errorf("StoredContextMissing(%d, %s) = %v", tt.status, tt.body, got)
		}
	}
}

// A refusal about the channel's own account or key fails over; one about
// the request (too long, filtered, malformed) is the client's answer from
// every channel, and is not one.
func TestChannelRefusal(t *testing.T) {
	quota := http.Header{"X-Amzn-Errortype": {"ServiceQuotaExceededException:http://internal.amazon.com/coral/com.amazon.bedrock/"}}
	validation := http.Header{"X-Amzn-Errortype": {"ValidationException:http://internal.amazon.com/coral/com.amazon.bedrock/"}}
	tests := []struct {
		name   string
		status int
		h      http.Header
		body   string
		want   bool
	}{
		{"bedrock quota", 400, quota, `{"type":"error","error":{"type":"invalid_request_error","message":"Your request exceeds the service quota for your account."}}`, true},
		{"anthropic credit", 400, nil, `{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}}`, true},
		{"anthropic billing", 402, nil, `{"type":"error","error":{"type":"billing_error","message":"billing"}}`, true},
		{"google key, translated", 400, nil, `{"error":{"message":"API key not valid. Please pass a valid API key.","type":"invalid_request_error","param":null,"code":null}}`, true},
		{"google key, raw", 400, nil, `[{"error":{"code":400,"message":"API Key not found. Please pass a valid API key.","status":"INVALID_ARGUMENT","details":[{"reason":"API_KEY_INVALID"}]}}]`, true},
		{"bedrock validation", 400, validation, `{"message":"messages: roles must alternate"}`, false},
		{"context too long", 400, nil, `{"error":{"message":"This model's maximum context length is 128000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`, false},
		{"prompt too long", 400, nil, `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}`, false},
		{"azure content filter", 400, nil, `{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy.","type":null,"param":"prompt","code":"content_filter","status":400}}`, false},
		{"unauthorized (retry_status decides)", 401, nil, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`, false},
	}
	for _, tt := range tests {
		if got := ChannelRefusal(tt.status, tt.h, []byte(tt.body)); got != tt.want {
			t.Errorf("%s: ChannelRefusal = %v, want %v", tt.name, got, tt.want)
		}
	}
}
