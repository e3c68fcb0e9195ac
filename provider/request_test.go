package provider

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
)

func TestAPIFromPath(t *testing.T) {
	tests := []struct {
		path string
		want API
	}{
		{"/v1/chat/completions", OpenAIChat},
		{"/openai/v1/chat/completions", OpenAIChat},
		{"/v1/chat/completions/", OpenAIChat},
		{"/api/v1/chat/completions", OpenAIChat},
		{"/v1/responses", OpenAIResponses},
		{"/openai/v1/responses/", OpenAIResponses},
		{"/v1/completions", OpenAICompletions},
		{"/openai/v1/completions/", OpenAICompletions},
		{"/v1/embeddings", OpenAIEmbeddings},
		{"/api/v1/embeddings/", OpenAIEmbeddings},
		{"/v1/models", OpenAIModels},
		{"/openai/v1/models/", OpenAIModels},
		{"/v1/messages", AnthropicMessages},
		{"/anthropic/v1/messages/", AnthropicMessages},
		{"/v1/messages/count_tokens", AnthropicCountTokens},
		{"/anthropic/v1/messages/count_tokens/", AnthropicCountTokens},
		{"/", Unknown},
		{"", Unknown},
		{"/v1/audio/speech", Unknown},
		{"/v1/chat", Unknown},
		{"/v1/models/gpt-4o", Unknown},
		{"/v1/messages/batches", Unknown},
	}
	for _, tt := range tests {
		if got := APIFromPath(tt.path); got != tt.want {
			t.Errorf("APIFromPath(%q) = %v, want %v", tt.path, got, tt.want)
		}
	}
}

func TestAPIStringAndAnthropic(t *testing.T) {
	names := map[API]string{
		Unknown: "unknown", OpenAIChat: "openai_chat", OpenAIResponses: "openai_responses",
		OpenAICompletions: "openai_completions", OpenAIEmbeddings: "openai_embeddings",
		OpenAIModels: "openai_models", AnthropicMessages: "anthropic_messages",
		AnthropicCountTokens: "anthropic_count_tokens", API(200): "unknown",
	}
	for a, want := range names {
		if got := a.String(); got != want {
			t.Errorf("API(%d).String() = %q, want %q", a, got, want)
		}
		wantAnthropic := a == AnthropicMessages || a == AnthropicCountTokens
		if got := a.Anthropic(); got != wantAnthropic {
			t.Errorf("API(%d).Anthropic() = %v, want %v", a, got, wantAnthropic)
		}
	}
}

func TestParseRequestFields(t *testing.T) {
	tests := []struct {
		name string
		body string
		want Request // only the exported fields are compared
	}{
		{"minimal", `{"model":"gpt-4o"}`, Request{Model: "gpt-4o", N: 1}},
		{"stream true", `{"model":"m","stream":true}`, Request{Model: "m", Stream: true, N: 1}},
		{"stream false", `{"model":"m","stream":false}`, Request{Model: "m", N: 1}},
		{"stream string is not true", `{"model":"m","stream":"true"}`, Request{Model: "m", N: 1}},
		{"max_tokens", `{"model":"m","max_tokens":1024}`, Request{Model: "m", MaxOutput: 1024, N: 1}},
		{"max_completion_tokens", `{"max_completion_tokens":300,"model":"m"}`, Request{Model: "m", MaxOutput: 300, N: 1}},
		{"max_output_tokens", `{"model":"m","max_output_tokens":77}`, Request{Model: "m", MaxOutput: 77, N: 1}},
		{"largest max wins", `{"model":"m","max_tokens":10,"max_completion_tokens":500,"max_output_tokens":20}`, Request{Model: "m", MaxOutput: 500, N: 1}},
		{"max_tokens null", `{"model":"m","max_tokens":null}`, Request{Model: "m", N: 1}},
		{"max_tokens exponent", `{"model":"m","max_tokens":1e5}`, Request{Model: "m", MaxOutput: 100000, N: 1}},
		{"max_tokens decimal", `{"model":"m","max_tokens":100000.0}`, Request{Model: "m", MaxOutput: 100000, N: 1}},
		{"max_tokens fraction exponent", `{"model":"m","max_tokens":1.5E3}`, Request{Model: "m", MaxOutput: 1500, N: 1}},
		{"max_tokens negative exponent", `{"model":"m","max_tokens":12000e-2}`, Request{Model: "m", MaxOutput: 120, N: 1}},
		{"max_tokens at the maximum", `{"model":"m","max_tokens":1e8}`, Request{Model: "m", MaxOutput: MaxTokenLimit, N: 1}},
		{"n decimal", `{"model":"m","n":8.0}`, Request{Model: "m", N: 8}},
		{"previous_response_id", `{"model":"m","previous_response_id":"resp_1"}`, Request{Model: "m", N: 1, StoredContext: "previous_response_id", Effects: "previous_response_id"}},
		{"conversation", `{"model":"m","conversation":{"id":"conv_1"}}`, Request{Model: "m", N: 1, StoredContext: "conversation", Effects: "conversation"}},
		{"stored prompt", `{"model":"m","prompt":{"id":"pmpt_1"}}`, Request{Model: "m", N: 1, StoredContext: "prompt", Effects: "prompt"}},
		{"previous_response_id null", `{"model":"m","previous_response_id":null}`, Request{Model: "m", N: 1}},
		{"n", `{"model":"m","n":4}`, Request{Model: "m", N: 4}},
		{"n zero stays 1", `{"model":"m","n":0}`, Request{Model: "m", N: 1}},
		{"n zero decimal stays 1", `{"model":"m","n":0.0e7}`, Request{Model: "m", N: 1}},
		{"n null stays 1", `{"model":"m","n":null}`, Request{Model: "m", N: 1}},
		{"stream_options include_usage", `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`,
			Request{Model: "m", Stream: true, N: 1, IncludeUsage: true, HasStreamOptions: true}},
		{"stream_options without include_usage", `{"model":"m","stream_options":{}}`,
			Request{Model: "m", N: 1, HasStreamOptions: true}},
		{"stream_options include_usage not a bool", `{"model":"m","stream_options":{"include_usage":"true"}}`,
			Request{Model: "m", N: 1, HasStreamOptions: true}},
		{"stream_options include_usage repeated", `{"model":"m","stream_options":{"include_usage":false,"x":[1],"include_usage":true}}`,
			Request{Model: "m", N: 1, IncludeUsage: true, HasStreamOptions: true}},
		{"stream_options include_usage in another case", `{"model":"m","stream_options":{"Include_Usage":true}}`,
			Request{Model: "m", N: 1, HasStreamOptions: true}},
		{"stream_options include_usage false", `{"model":"m","stream_options":{"include_usage":false}}`,
			Request{Model: "m", N: 1, HasStreamOptions: true}},
		{"stream_options null", `{"model":"m","stream_options":null}`, Request{Model: "m", N: 1}},
		{"images openai chat", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:,"}}]}]}`,
			// "image_url" appears twice: as a type value and as a key.
			Request{Model: "m", N: 1, Images: 2}},
		{"images responses", `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"https://x/y.png"}]}]}`,
			Request{Model: "m", N: 1, Images: 2}},
		{"images anthropic", `{"model":"m","max_tokens":100,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}},{"type":"text","text":"what?"}]}]}`,
			Request{Model: "m", MaxOutput: 100, N: 1, Images: 1}},
		{"no images", `{"model":"m","messages":[{"role":"user","content":"an image of a cat"}]}`, Request{Model: "m", N: 1}},
		// Documents named by URL or file id: their pages are input the
		// body does not show, reserved like images.
		{"document anthropic url", `{"model":"m","max_tokens":100,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"url","url":"https://x/r.pdf"}}]}]}`,
			Request{Model: "m", MaxOutput: 100, N: 1, Images: 1}},
		{"file openai chat", `{"model":"m","messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"file-1"}}]}]}`,
			Request{Model: "m", N: 1, Images: 1}},
		{"file responses url", `{"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_url":"https://x/r.pdf"}]}]}`,
			Request{Model: "m", N: 1, Images: 1}},
		{"escaped key", `{"mod\u0065l":"gpt-4o-mini","str\u0065am":true}`, Request{Model: "gpt-4o-mini", Stream: true, N: 1}},
		{"escaped value", `{"model":"a\"b\\c\u00e9"}`, Request{Model: "a\"b\\c\u00e9", N: 1}},
		// As encoding/json decodes it: a byte that is not UTF-8 becomes U+FFFD.
		{"model not UTF-8", "{\"model\":\"a\xffb\"}", Request{Model: "a\ufffdb", N: 1}},
		{"whitespace everywhere", " \n\t{ \r\n \"model\" \t:\n \"claude-3\" ,\n \"stream\"\t:\ttrue , \"max_tokens\" : 42 ,\"n\" :\n3 } \n",
			Request{Model: "claude-3", Stream: true, MaxOutput: 42, N: 3}},
		{"nested model keys ignored before", `{"messages":[{"model":"inner","content":"x"}],"metadata":{"model":"meta"},"model":"outer"}`,
			Request{Model: "outer", N: 1}},
		{"nested model keys ignored after", `{"model":"outer","tools":[{"function":{"name":"f","parameters":{"model":{"type":"string"}}}}],"x":{"stream":true,"n":9}}`,
			Request{Model: "outer", N: 1}},
		{"string values containing braces", `{"system":"}{\"model\":\"evil\"}][","model":"good","stop":["}","]"]}`,
			Request{Model: "good", N: 1}},
		{"two limit fields: the larger bounds", `{"model":"m","max_tokens":10,"max_completion_tokens":20}`, Request{Model: "m", MaxOutput: 20, N: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := OpenAIChat.ParseRequest([]byte(tt.body))
			if err != nil {
				t.Fatalf("OpenAIChat.ParseRequest(%s): %v", tt.body, err)
			}
			got.modelStart, got.modelEnd = 0, 0
			if got != tt.want {
				t.Errorf("OpenAIChat.ParseRequest(%s)\n got %+v\nwant %+v", tt.body, got, tt.want)
			}
		})
	}
}

func TestParseRequestErrors(t *testing.T) {
	tests := []struct {
		name string
		body string
		want error
	}{
		{"empty", ``, ErrMalformed},
		{"truncated", `{"model":"gpt-4o"`, ErrMalformed},
		{"trailing comma", `{"model":"gpt-4o",}`, ErrMalformed},
		{"two values", `{"model":"a"}{"model":"b"}`, ErrMalformed},
		{"single quotes", `{'model':'a'}`, ErrMalformed},
		{"array", `[{"model":"gpt-4o"}]`, ErrMalformed},
		{"string", `"model"`, ErrMalformed},
		{"number", `42`, ErrMalformed},
		{"null", `null`, ErrMalformed},
		{"empty object", `{}`, ErrNoModel},
		{"no model", `{"messages":[]}`, ErrNoModel},
		{"only nested model", `{"messages":[{"model":"x"}]}`, ErrNoModel},
		{"model number", `{"model":4}`, ErrNoModel},
		{"model null", `{"model":null}`, ErrNoModel},
		{"model object", `{"model":{"name":"x"}}`, ErrNoModel},
		{"model array", `{"model":["x"]}`, ErrNoModel},
		{"model bool", `{"model":true}`, ErrNoModel},
		{"model empty", `{"model":""}`, ErrNoModel},
		// Go's encoding/json (Ollama, LocalAI) reads a key regardless of
		// case, and most parsers keep the last of a repeated key: what the
		// gateway routes or bills by must mean the same upstream.
		{"Model capitalised", `{"Model":"gpt-4o"}`, ErrAmbiguous},
		{"model and MODEL", `{"model":"m","MODEL":"expensive"}`, ErrAmbiguous},
		{"max_tokens twice", `{"model":"m","max_tokens":16,"max_tokens":null}`, ErrAmbiguous},
		{"MAX_TOKENS", `{"model":"m","max_tokens":16,"MAX_TOKENS":100000}`, ErrAmbiguous},
		{"n twice", `{"model":"m","n":1,"n":8}`, ErrAmbiguous},
		{"model twice", `{"model":"cheap","model":"expensive"}`, ErrAmbiguous},
		{"stream twice", `{"model":"m","stream":false,"stream":true}`, ErrAmbiguous},
		{"Stream", `{"model":"m","Stream":true}`, ErrAmbiguous},
		{"long s in stream", `{"model":"m","\u017ftream":true}`, ErrAmbiguous},
		{"Kelvin sign in max_tokens", `{"model":"m","max_tokens":16,"max_to\u212aens":100000}`, ErrAmbiguous},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := OpenAIChat.ParseRequest([]byte(tt.body))
			if !errors.Is(err, tt.want) {
				t.Errorf("OpenAIChat.ParseRequest(%s) error = %v, want %v", tt.body, err, tt.want)
			}
		})
	}
}

func TestParseRequestLimitErrors(t *testing.T) {
	for _, body := range []string{
		`{"model":"m","max_tokens":1.5}`,
		`{"model":"m","max_tokens":100.000001}`,
		`{"model":"m","max_tokens":1e-1}`,
		`{"model":"m","max_tokens":-5}`,
		`{"model":"m","max_tokens":-0}`,
		`{"model":"m","max_tokens":"100"}`,
		`{"model":"m","max_tokens":true}`,
		`{"model":"m","max_tokens":[100]}`,
		`{"model":"m","max_completion_tokens":100000001}`,
		`{"model":"m","max_output_tokens":1e18}`,
		`{"model":"m","max_tokens":9223372036854775808}`,
		`{"model":"m","max_tokens":1e99999999999}`,
		`{"model":"m","max_tokens":5e-99999999999}`,
		`{"model":"m","n":1e9}`,
		`{"model":"m","n":129}`,
		`{"model":"m","n":-1}`,
		`{"model":"m","n":2.5}`,
		`{"model":"m","n":"2"}`,
	} {
		_, err := OpenAIChat.ParseRequest([]byte(body))
		var le *LimitError
		if !errors.As(err, &le) {
			t.Errorf("OpenAIChat.ParseRequest(%s) error = %v, want a *LimitError", body, err)
		}
	}
}

func mustParse(t testing.TB, body []byte) Request {
	t.Helper()
	r, err := OpenAIChat.ParseRequest(body)
	if err != nil {
		t.Fatalf("OpenAIChat.ParseRequest(%s): %v", body, err)
	}
	return r
}

func TestWithModel(t *testing.T) {
	tests := []struct {
		name, body, model, want string
	}{
		{"simple", `{"model":"gpt-4o","stream":true}`, "gpt-4o-2024-08-06",
			`{"model":"gpt-4o-2024-08-06","stream":true}`},
		{"last field", `{"stream":true,"model":"a"}`, "bbb", `{"stream":true,"model":"bbb"}`},
		{"shorter", `{"model":"claude-3-5-sonnet-latest","max_tokens":5}`, "c", `{"model":"c","max_tokens":5}`},
		{"whitespace kept", "{ \"model\" :  \"a\"  ,\n\"n\":2 }\n", "b", "{ \"model\" :  \"b\"  ,\n\"n\":2 }\n"},
		{"nested untouched", `{"messages":[{"model":"a"}],"model":"a","metadata":{"model":"a"}}`, "z",
			`{"messages":[{"model":"a"}],"model":"z","metadata":{"model":"a"}}`},
		{"escaped key", `{"mod\u0065l":"a","x":1}`, "b", `{"mod\u0065l":"b","x":1}`},
		{"escaped old value", `{"model":"a\"b","x":1}`, "c", `{"model":"c","x":1}`},
		{"new name needs escaping", `{"model":"a"}`, "dep\"loy\\ment\n1", `{"model":"dep\"loy\\ment\n1"}`},
		{"unicode name", `{"model":"a"}`, "模型-é", `{"model":"模型-é"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := []byte(tt.body)
			orig := bytes.Clone(body)
			r := mustParse(t, body)
			out := r.WithModel(body, tt.model)
			if string(out) != tt.want {
				t.Errorf("WithModel = %s, want %s", out, tt.want)
			}
			if !bytes.Equal(body, orig) {
				t.Errorf("body modified: %s, was %s", body, orig)
			}
			if !json.Valid(out) {
				t.Fatalf("WithModel produced invalid JSON: %s", out)
			}
			r2 := mustParse(t, out)
			if r2.Model != tt.model {
				t.Errorf("re-parsed model = %q, want %q", r2.Model, tt.model)
			}
			if r2.Stream != r.Stream || r2.N != r.N || r2.MaxOutput != r.MaxOutput {
				t.Errorf("re-parsed fields changed: %+v vs %+v", r2, r)
			}
		})
	}
}

func TestWithModelHTMLCharacters(t *testing.T) {
	// encoding/json escapes <, > and & as \u003c etc.; the result must
	// still decode to the exact name.
	body := []byte(`{"model":"a"}`)
	out := mustParse(t, body).WithModel(body, "a<b>&c")
	if got := mustParse(t, out).Model; got != "a<b>&c" {
		t.Errorf("model = %q, want %q (body %s)", got, "a<b>&c", out)
	}
}

func TestWithModelDoesNotAliasBody(t *testing.T) {
	// A body with spare capacity must not be written into by appends.
	buf := make([]byte, 0, 256)
	buf = append(buf, `{"model":"a","x":1}`...)
	r := mustParse(t, buf)
	out := r.WithModel(buf, "b")
	out2 := r.WithModel(buf, "cc")
	if string(out) != `{"model":"b","x":1}` || string(out2) != `{"model":"cc","x":1}` {
		t.Errorf("got %s and %s", out, out2)
	}
	if string(buf) != `{"model":"a","x":1}` {
		t.Errorf("body modified: %s", buf)
	}
	out[10] = 'Z'
	if string(buf) != `{"model":"a","x":1}` {
		t.Errorf("result aliases body: %s", buf)
	}
}

func TestWithModelUnchanged(t *testing.T) {
	body := []byte(`{"model":"same","stream":true}`)
	out := mustParse(t, body).WithModel(body, "same")
	if &out[0] != &body[0] || len(out) != len(body) {
		t.Errorf("WithModel with equal model did not return body itself: %s", out)
	}
	// A Request that was not parsed from a body has no span to replace.
	var zero Request
	out = zero.WithModel(body, "other")
	if string(out) != string(body) {
		t.Errorf("zero Request WithModel = %s, want body unchanged", out)
	}
}

func TestWithIncludeUsage(t *testing.T) {
	tests := []struct {
		body, want string
	}{
		{`{}`, `{"stream_options":{"include_usage":true}}`},
		{`{ }`, `{ "stream_options":{"include_usage":true}}`},
		{"{\n}\n", "{\n\"stream_options\":{\"include_usage\":true}}\n"},
		{`{"a":1}`, `{"a":1,"stream_options":{"include_usage":true}}`},
		{`{"a":1} `, `{"a":1,"stream_options":{"include_usage":true}} `},
		{"{\"a\":1}\n", "{\"a\":1,\"stream_options\":{\"include_usage\":true}}\n"},
		{"{\"a\":1 \n}\r\n", "{\"a\":1 \n,\"stream_options\":{\"include_usage\":true}}\r\n"},
		{`{"model":"m","stream":true,"messages":[{"role":"user","content":"}"}]}`,
			`{"model":"m","stream":true,"messages":[{"role":"user","content":"}"}],"stream_options":{"include_usage":true}}`},
		{`{"a":{}}`, `{"a":{},"stream_options":{"include_usage":true}}`},
	}
	for _, tt := range tests {
		orig := tt.body
		body := []byte(tt.body)
		out := withIncludeUsage(body)
		if string(out) != tt.want {
			t.Errorf("withIncludeUsage(%q) = %q, want %q", tt.body, out, tt.want)
		}
		if string(body) != orig {
			t.Errorf("WithIncludeUsage modified its input: %q", body)
		}
		if !json.Valid(out) {
			t.Errorf("withIncludeUsage(%q) is not valid JSON: %q", tt.body, out)
			continue
		}
		var v struct {
			StreamOptions *struct {
				IncludeUsage *bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatal(err)
		}
		if v.StreamOptions == nil || v.StreamOptions.IncludeUsage == nil || !*v.StreamOptions.IncludeUsage {
			t.Errorf("withIncludeUsage(%q): stream_options.include_usage not true in %s", tt.body, out)
		}
		// ParseRequest must see it too when the body has a model.
		if strings.Contains(tt.body, `"model"`) {
			r := mustParse(t, out)
			if !r.HasStreamOptions || !r.IncludeUsage {
				t.Errorf("ParseRequest of %s: HasStreamOptions=%v IncludeUsage=%v", out, r.HasStreamOptions, r.IncludeUsage)
			}
		}
	}
}

// A client's own stream_options is kept, with include_usage made true:
// the gateway bills from the usage chunk.
func TestWithIncludeUsageIn(t *testing.T) {
	for body, want := range map[string]string{
		`{"model":"m","stream":true,"stream_options":{"include_usage":false}}`:                `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","stream_options":{"include_obfuscation":false},"stream":true}`:          `{"model":"m","stream_options":{"include_usage":true,"include_obfuscation":false},"stream":true}`,
		`{"model":"m","stream_options": { } ,"stream":true}`:                                  `{"model":"m","stream_options": {"include_usage":true } ,"stream":true}`,
		`{"model":"m","stream_options":{"include_usage" : null,"x":{"include_usage":false}}}`: `{"model":"m","stream_options":{"include_usage" : true,"x":{"include_usage":false}}}`,
		`{"model":"m","stream_options":{"include_usage":false,"include_usage":false}}`:        `{"model":"m","stream_options":{"include_usage":true,"include_usage":true}}`,
		`{"model":"m","stream_options":{"x":1},"stream_options":{"include_usage":false}}`:     `{"model":"m","stream_options":{"x":1},"stream_options":{"include_usage":true}}`,
		`{"model":"m","stream_options":{"include_usage":false},"stream_options":null}`:        `{"model":"m","stream_options":{"include_usage":false},"stream_options":null,"stream_options":{"include_usage":true}}`,
		`{"model":"m","str\u0065am_options":{"include\u005fusage":false}}`:                    `{"model":"m","str\u0065am_options":{"include\u005fusage":true}}`,
	} {
		out := withIncludeUsageIn([]byte(body))
		if string(out) != want {
			t.Errorf("withIncludeUsageIn(%s)\n = %s\nwant %s", body, out, want)
		}
		if r := mustParse(t, out); !r.IncludeUsage {
			t.Errorf("withIncludeUsageIn(%s) = %s does not ask for usage", body, out)
		}
	}
}

func TestWithIncludeUsageNotAnObject(t *testing.T) {
	body := []byte(`[1,2]`)
	if out := withIncludeUsage(body); string(out) != `[1,2]` {
		t.Errorf("withIncludeUsage([1,2]) = %s, want unchanged", out)
	}
}

func TestModelList(t *testing.T) {
	openai, err := ModelList(http.Header{}, []string{"a", "b"})
	if err != nil || string(openai) != `{"object":"list","data":[{"id":"a","object":"model","created":0,"owned_by":"llm_failover"},{"id":"b","object":"model","created":0,"owned_by":"llm_failover"}]}` {
		t.Errorf("OpenAI list: %s %v", openai, err)
	}
	anthropic, err := ModelList(http.Header{"Anthropic-Version": {"2023-06-01"}}, []string{"a", "b"})
	if err != nil || string(anthropic) != `{"data":[{"type":"model","id":"a","display_name":"a","created_at":"1970-01-01T00:00:00Z"},{"type":"model","id":"b","display_name":"b","created_at":"1970-01-01T00:00:00Z"}],"has_more":false,"first_id":"a","last_id":"b"}` {
		t.Errorf("Anthropic list: %s %v", anthropic, err)
	}
	empty, _ := ModelList(http.Header{"Anthropic-Version": {"2023-06-01"}}, nil)
	if string(empty) != `{"data":[],"has_more":false,"first_id":null,"last_id":null}` {
		t.Errorf("empty Anthropic list: %s", empty)
	}
}

// A request with effects or state upstream is told apart, so that it is
// never sent twice at once (a hedge).
func TestParseRequestEffects(t *testing.T) {
	for body, want := range map[string]string{
		`{"model":"m"}`:                                                     "",
		`{"model":"m","store":false}`:                                       "",
		`{"model":"m","store":true}`:                                        "store",
		`{"model":"m","background":true}`:                                   "background",
		`{"model":"m","background":false}`:                                  "",
		`{"model":"m","previous_response_id":"resp_1"}`:                     "previous_response_id",
		`{"model":"m","conversation":"conv_1"}`:                             "conversation",
		`{"model":"m","tools":[{"type":"function","name":"f"}]}`:            "",
		`{"model":"m","tools":[{"name":"f","input_schema":{}}]}`:            "",
		`{"model":"m","tools":[{"type":"web_search_preview"}]}`:             "tools",
		`{"model":"m","tools":[{"type":"web_search_20250305"}]}`:            "tools",
		`{"model":"m","tools":"nonsense"}`:                                  "tools",
		`{"model":"m","tools":null}`:                                        "",
		`{"model":"m","mcp_servers":[{"url":"https://x"}]}`:                 "mcp_servers",
		`{"model":"m","mcp_servers":[]}`:                                    "",
		`{"model":"m","store":true,"tools":[{"type":"mcp"}]}`:               "store",
		`{"model":"m","tools":[{"type":"custom","name":"x"}]}`:              "",
		`{"model":"m","tools":[{"type":"code_interpreter"}],"store":false}`: "tools",
	} {
		req, err := OpenAIChat.ParseRequest([]byte(body))
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if req.Effects != want {
			t.Errorf("%s: effects %q, want %q", body, req.Effects, want)
		}
	}
	req, _ := OpenAIResponses.ParseRequest([]byte(`{"model":"m","store":false}`))
	if !req.StoreOff {
		t.Error("store false not seen")
	}
}

// A server-side tool's results are input the upstream adds and bills
// (web search results, fetched pages, MCP tool results): the request
// names the field that asks for them, whatever field with effects came
// first.
func TestParseRequestServerInput(t *testing.T) {
	for body, want := range map[string]string{
		`{"model":"m"}`: "",
		`{"model":"m","tools":[{"type":"function","name":"f"}]}`:                     "",
		`{"model":"m","tools":[{"type":"web_search_20250305","name":"web_search"}]}`: "tools",
		`{"model":"m","store":true,"tools":[{"type":"web_search"}]}`:                 "tools",
		`{"model":"m","web_search_options":{}}`:                                      "web_search_options",
		`{"model":"m","mcp_servers":[{"type":"url","url":"https://x"}]}`:             "mcp_servers",
		`{"model":"m","store":true}`:                                                 "",
	} {
		req, err := OpenAIChat.ParseRequest([]byte(body))
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if req.ServerInput != want {
			t.Errorf("%s: server input %q, want %q", body, req.ServerInput, want)
		}
	}
}

// Chat Completions' web search is no tools entry but a field of its own
// (web_search_options; an empty object turns it on): the upstream runs
// the search, so such a request has effects upstream and is never sent
// twice at once (a hedge).
func TestParseRequestEffectsWebSearchOptions(t *testing.T) {
	for body, want := range map[string]string{
		`{"model":"gpt-4o-search-preview","web_search_options":{}}`:                            "web_search_options",
		`{"model":"gpt-4o-search-preview","web_search_options":{"search_context_size":"low"}}`: "web_search_options",
		`{"model":"m","web_search_options":null}`:                                              "",
	} {
		req, err := OpenAIChat.ParseRequest([]byte(body))
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if req.Effects != want {
			t.Errorf("%s: effects %q, want %q", body, req.Effects, want)
		}
	}
}

// Legacy completions (/v1/completions) send their prompt in "prompt": a
// string, an array of strings or of token ids, all in the body. Only the
// Responses API's stored prompt, an object naming its id, is input the
// upstream keeps; a plain prompt must not make a completions request one
// that refers to stored context (refused by the wallet without
// max_input_tokens, reserved at the model's whole input bound).
func TestParseRequestCompletionsPromptIsNotStored(t *testing.T) {
	for _, body := range []string{
		`{"model":"m","prompt":"Say hello"}`,
		`{"model":"m","prompt":["Say hello","Say bye"]}`,
		`{"model":"m","prompt":[1212,318]}`,
	} {
		req, err := OpenAICompletions.ParseRequest([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if req.StoredContext != "" || req.Effects != "" {
			t.Errorf("%s: StoredContext %q, Effects %q: a prompt in the body is no stored context", body, req.StoredContext, req.Effects)
		}
	}
}

// Legacy completions generate max_tokens for each of best_of candidates
// (server-side, all billed) and for each prompt of a batch (an array of
// strings or of token arrays): the request's choices, which the wallet
// reserves for, multiply as n's do.
func TestParseRequestCompletionsChoices(t *testing.T) {
	for body, want := range map[string]int{
		`{"model":"m","prompt":"x","best_of":5}`:       5,
		`{"model":"m","prompt":"x","n":2,"best_of":5}`: 5,
		`{"model":"m","prompt":"x","best_of":null}`:    1,
		`{"model":"m","prompt":["a","b","c"]}`:         3,
		`{"model":"m","prompt":["a","b"],"n":3}`:       6,
		`{"model":"m","prompt":["a","b"],"best_of":4}`: 8,
		`{"model":"m","prompt":[1212,318]}`:            1,
		`{"model":"m","prompt":[[1212],[318],[1,2]]}`:  3,
		`{"model":"m","prompt":[]}`:                    1,
		`{"model":"m","prompt":{"id":"pmpt_1"},"n":2}`: 2,
	} {
		req, err := OpenAICompletions.ParseRequest([]byte(body))
		if err != nil {
			t.Errorf("%s: %v", body, err)
			continue
		}
		if req.N != want {
			t.Errorf("%s: N = %d, want %d", body, req.N, want)
		}
	}
	for _, body := range []string{
		`{"model":"m","prompt":"x","best_of":"5"}`,
		`{"model":"m","prompt":"x","best_of":5,"best_of":1}`,
		`{"model":"m","prompt":"x","best_of":1e9}`,
	} {
		if _, err := OpenAICompletions.ParseRequest([]byte(body)); err == nil {
			t.Errorf("%s: accepted", body)
		}
	}
}
