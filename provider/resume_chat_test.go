package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

func chatChunk(id, model string, delta, finish string) streamgate.Event {
	return streamgate.Event{Data: fmt.Appendf(nil,
		`{"id":%q,"object":"chat.completion.chunk","created":%d,"model":%q,"system_fingerprint":"fp_%s","choices":[{"index":0,"delta":%s,"logprobs":null,"finish_reason":%s}]}`,
		id, len(id), model, id, delta, finish)}
}

func chatText(id, text string) streamgate.Event {
	d, _ := json.Marshal(map[string]string{"content": text})
	return chatChunk(id, "gpt", string(d), "null")
}

const chatReq = `{"model":"gpt","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`

// rewriteAll runs a continuation's events through the Splice and parses
// what the client gets.
func rewriteAll(t *testing.T, s *Splice, evs ...streamgate.Event) []streamgate.Event {
	t.Helper()
	var out []byte
	for _, ev := range evs {
		out = s.Rewrite(out, ev)
	}
	var got []streamgate.Event
	var p streamgate.Parser
	p.Feed(out, func(ev streamgate.Event) {
		ev.Data = append([]byte(nil), ev.Data...)
		got = append(got, ev)
	})
	return got
}

// The continuation's chunks become the first attempt's: its id, model,
// created and fingerprint, no second role chunk, and the text joins
// exactly (no white space is trimmed from an OpenAI prefill).
func TestChatSpliceOneAnswer(t *testing.T) {
	tr := OpenAIChat.NewTranscript(1 << 10)
	tr.Event(chatChunk("first", "gpt", `{"role":"assistant","content":"","refusal":null}`, "null"))
	tr.Event(chatText("first", "Hello \"wide\" "))
	body, s, err := tr.Continue([]byte(chatReq), Prefill)
	if err != nil {
		t.Fatal(err)
	}
	var req struct {
		Messages []map[string]any `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil || len(req.Messages) != 2 {
		t.Fatalf("body %s: %v", body, err)
	}
	if last := req.Messages[1]; last["role"] != "assistant" || last["content"] != `Hello "wide" ` || len(last) != 2 {
		t.Fatalf("final message %v", last)
	}
	usage := streamgate.Event{Data: []byte(`{"id":"second","object":"chat.completion.chunk","created":2,"model":"other","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`)}
	got := rewriteAll(t, s,
		chatChunk("second", "other", `{"role":"assistant","content":""}`, "null"),
		chatChunk("second", "other", `{"role":"assistant","content":"world"}`, "null"),
		chatText("second", "!"),
		chatChunk("second", "other", `{}`, `"stop"`),
		usage,
		streamgate.Event{Data: []byte("[DONE]")})
	if len(got) != 5 {
		t.Fatalf("%d events, want 5 (role chunk dropped): %+v", len(got), got)
	}
	var text strings.Builder
	for _, ev := range got[:4] {
		var c struct {
			SystemFingerprint string `json:"system_fingerprint"`
			Choices           []struct {
				Index int
				Delta map[string]any
			}
		}
		if err := json.Unmarshal(ev.Data, &c); err != nil {
			t.Fatalf("%s: %v", ev.Data, err)
		}
		if !bytes.Contains(ev.Data, []byte(`"id":"first"`)) || !bytes.Contains(ev.Data, []byte(`"model":"gpt"`)) ||
			!bytes.Contains(ev.Data, []byte(`"created":5`)) || c.SystemFingerprint != "fp_first" && len(c.Choices) > 0 {
			t.Errorf("not the first attempt's identity: %s", ev.Data)
		}
		if ev.Name == "" && len(c.Choices) == 1 {
			if _, ok := c.Choices[0].Delta["role"]; ok {
				t.Errorf("a second role: %s", ev.Data)
			}
			text.WriteString(fmt.Sprint(c.Choices[0].Delta["content"]))
		}
	}
	if got := text.String(); got != "world!<nil>" {
		t.Errorf("continued text %q", got)
	}
	if !bytes.Contains(got[3].Data, []byte(`"usage":{"prompt_tokens":3`)) || string(got[4].Data) != "[DONE]" {
		t.Errorf("usage and [DONE] not passed: %+v", got[3:])
	}
}

// Nothing a join could corrupt is continued: tool calls, several
// choices, log probabilities, a finished answer, structured output, a
// request ending with its own assistant message.
func TestChatTranscriptRefuses(t *testing.T) {
	text := chatText("a", "some text")
	for name, c := range map[string]struct {
		ev   streamgate.Event
		body string
		why  string
	}{
		"tool call":       {chatChunk("a", "gpt", `{"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":""}}]}`, "null"), chatReq, "tool_calls"},
		"function call":   {chatChunk("a", "gpt", `{"function_call":{"name":"f"}}`, "null"), chatReq, "function_call"},
		"reasoning":       {chatChunk("a", "gpt", `{"reasoning_content":"hmm"}`, "null"), chatReq, "reasoning_content"},
		"second choice":   {streamgate.Event{Data: []byte(`{"choices":[{"index":1,"delta":{"content":"x"}}]}`)}, chatReq, "n > 1"},
		"logprobs":        {streamgate.Event{Data: []byte(`{"choices":[{"index":0,"delta":{"content":"x"},"logprobs":{"content":[]}}]}`)}, chatReq, "log probabilities"},
		"finished":        {chatChunk("a", "gpt", `{}`, `"stop"`), chatReq, "finished"},
		"array content":   {chatChunk("a", "gpt", `{"content":[{"type":"text"}]}`, "null"), chatReq, "not text"},
		"n":               {text, `{"model":"gpt","n":2,"messages":[{"role":"user","content":"hi"}]}`, "n > 1"},
		"logprobs asked":  {text, `{"model":"gpt","logprobs":true,"messages":[{"role":"user","content":"hi"}]}`, "log probabilities"},
		"json object":     {text, `{"model":"gpt","response_format":{"type":"json_object"},"messages":[{"role":"user","content":"hi"}]}`, "json_object"},
		"json schema":     {text, `{"model":"gpt","response_format":{"type":"json_schema","json_schema":{}},"messages":[{"role":"user","content":"hi"}]}`, "json_schema"},
		"own prefill":     {text, `{"model":"gpt","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"x"}]}`, "assistant message"},
		"no messages":     {text, `{"model":"gpt","messages":[]}`, "no messages"},
		"nothing yet":     {chatChunk("a", "gpt", `{"role":"assistant","content":""}`, "null"), chatReq, "no text"},
		"over the cap":    {chatText("a", strings.Repeat("x", 65)), chatReq, "cap"},
		"malformed chunk": {streamgate.Event{Data: []byte(`{"choices":[`)}, chatReq, "malformed"},
	} {
		tr := OpenAIChat.NewTranscript(64)
		if name != "nothing yet" {
			tr.Event(text)
		}
		tr.Event(c.ev)
		_, _, err := tr.Continue([]byte(c.body), Prefill)
		if err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%s: %v, want a refusal saying %q", name, err, c.why)
		}
	}
	// Text still continues when the request allows it.
	tr := OpenAIChat.NewTranscript(64)
	tr.Event(text)
	if _, _, err := tr.Continue([]byte(`{"model":"gpt","n":1,"logprobs":false,"response_format":{"type":"text"},"messages":[{"role":"user","content":"hi"}]}`), Prefill); err != nil {
		t.Errorf("plain text request refused: %v", err)
	}
}

// Each continuation option marks the body the way its hosts document;
// without Call.Continuation the body is the client's, untouched.
func TestOpenAIContinuationBody(t *testing.T) {
	tr := OpenAIChat.NewTranscript(64)
	tr.Event(chatText("a", "so far"))
	body, _, err := tr.Continue([]byte(`{"model":"gpt", "messages":[ {"role":"user","content":"hi"} ],"stream":true}`), Prefill)
	if err != nil {
		t.Fatal(err)
	}
	req, err := OpenAIChat.ParseRequest(body)
	if err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	base, _ := url.Parse("http://up.example")
	client := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	send := func(o OpenAI, continuation ContinuationForm) map[string]any {
		t.Helper()
		out, err := o.NewRequest(context.Background(), Call{API: OpenAIChat, Base: base, Client: client, Body: body, Request: req,
			UpstreamModel: "renamed", Continuation: continuation})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(out.Body)
		var v map[string]any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if v["model"] != "renamed" {
			t.Errorf("model not renamed: %s", b)
		}
		return v
	}
	last := func(v map[string]any) map[string]any {
		msgs := v["messages"].([]any)
		return msgs[len(msgs)-1].(map[string]any)
	}
	if m := last(send(OpenAI{Continuation: ContinuePrefix}, Prefill)); m["prefix"] != true || m["content"] != "so far" || m["role"] != "assistant" {
		t.Errorf("prefix: %v", m)
	}
	if v := send(OpenAI{Continuation: ContinueFinalMessage}, Prefill); v["continue_final_message"] != true || v["add_generation_prompt"] != false || last(v)["prefix"] != nil {
		t.Errorf("continue_final_message: %v", v)
	}
	if v := send(OpenAI{Continuation: ContinuePrefill}, Prefill); len(last(v)) != 2 || v["continue_final_message"] != nil {
		t.Errorf("prefill: %v", v)
	}
	if v := send(OpenAI{Continuation: ContinuePrefix}, CannotContinue); last(v)["prefix"] != nil {
		t.Errorf("a first attempt was marked: %v", v)
	}
}

// Which channels continue what, and how the option is configured.
func TestOpenAIContinuationConfig(t *testing.T) {
	for _, c := range []struct {
		name string
		c    Continuer
		api  API
		want ContinuationForm
	}{
		{"openai chat by default", OpenAI{}, OpenAIChat, Instructed},
		{"openai chat instructed", OpenAI{Continuation: ContinueInstructed}, OpenAIChat, Instructed},
		{"openai chat prefill", OpenAI{Continuation: ContinuePrefill}, OpenAIChat, Prefill},
		{"openai chat prefix", OpenAI{Continuation: ContinuePrefix}, OpenAIChat, Prefill},
		{"openai chat off", OpenAI{Continuation: ContinueOff}, OpenAIChat, CannotContinue},
		{"openai responses", OpenAI{Continuation: ContinuePrefill}, OpenAIResponses, CannotContinue},
		{"openai messages", OpenAI{}, AnthropicMessages, Prefill},
		{"anthropic", Anthropic{}, AnthropicMessages, Prefill},
		{"vertex claude", &Vertex{}, AnthropicMessages, Prefill},
		{"vertex chat", &Vertex{}, OpenAIChat, Instructed},
		{"bedrock", &Bedrock{}, AnthropicMessages, Prefill},
		{"azure chat", &Azure{}, OpenAIChat, Instructed},
		{"azure responses", &Azure{}, OpenAIResponses, CannotContinue},
		{"gemini chat", &Gemini{}, OpenAIChat, Instructed},
	} {
		if got := c.c.ContinuationForm(c.api); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
	base, _ := url.Parse("http://up.example")
	for in, want := range map[string]string{
		"openai {\n\tcontinuation prefix\n}":                 "",
		"openai {\n\tcontinuation continue_final_message\n}": "",
		"openai {\n\tcontinuation prefill\n}":                "",
		"openai":                                             "",
		"openai {\n\tcontinuation\n}":                        "wrong argument count",
		"openai {\n\tcontinuation on\n}":                     `continuation "on": want one of instructed, prefix, continue_final_message, prefill, off`,
		"openai {\n\tresume prefix\n}":                       "unrecognized provider option",
	} {
		var o OpenAI
		err := o.UnmarshalCaddyfile(caddyfile.NewTestDispenser(in))
		if err == nil {
			err = o.Validate()
		}
		if err == nil {
			err = o.CheckBaseURL(base)
		}
		if (err == nil) != (want == "") || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}

// FuzzChatResume: no chunk panics the Transcript or the Splice; whatever
// Continue accepts is a valid request ending with the assistant's text,
// and a well-formed chunk stays well-formed JSON through the Splice.
func FuzzChatResume(f *testing.F) {
	f.Add(`{"id":"a","choices":[{"index":0,"delta":{"content":"x\u00e9"}}]}`, `{"id":"b","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"y"},"finish_reason":null}],"usage":null}`)
	f.Add(`{"choices":[{"index":0,"delta":{"content":"x"}}]}`, `{"choices":[],"usage":{"total_tokens":1}}`)
	f.Add(`{"choices":[{"delta":{"content":"a"}}]}`, `{"choices":null,"id":1}`)
	f.Fuzz(func(t *testing.T, first, next string) {
		tr := OpenAIChat.NewTranscript(64)
		tr.Event(streamgate.Event{Data: []byte(first)})
		body, s, err := tr.Continue([]byte(chatReq), Prefill)
		if err != nil {
			return
		}
		var req struct {
			Messages []struct{ Role, Content string }
		}
		if json.Unmarshal(body, &req) != nil || len(req.Messages) != 2 || req.Messages[1].Content != tr.Text() {
			t.Fatalf("bad continuation %s", body)
		}
		out := s.Rewrite(nil, streamgate.Event{Data: []byte(next)})
		if json.Valid([]byte(next)) && !strings.Contains(next, "\n") && len(out) > 0 && bytes.HasPrefix(out, []byte("data: {")) {
			data := bytes.TrimSuffix(bytes.TrimPrefix(out, []byte("data: ")), []byte("\n\n"))
			if !json.Valid(data) {
				t.Fatalf("%s became %s", next, out)
			}
		}
	})
}

// BenchmarkChatSplice: the cost of one continued chunk, which every chunk
// of a resumed stream pays.
func BenchmarkChatSplice(b *testing.B) {
	tr := OpenAIChat.NewTranscript(1 << 10)
	tr.Event(chatText("first", "so far"))
	_, s, err := tr.Continue([]byte(chatReq), Prefill)
	if err != nil {
		b.Fatal(err)
	}
	ev := chatText("second", " and on")
	var dst []byte
	b.ReportAllocs()
	for b.Loop() {
		dst = s.Rewrite(dst[:0], ev)
	}
}

// BenchmarkChatTranscript: the cost of recording one delivered chunk,
// which every chunk of a stream with stream_resume on pays.
func BenchmarkChatTranscript(b *testing.B) {
	ev := chatText("first", " t01")
	tr := Transcript{api: OpenAIChat, cap: 1 << 30}
	b.ReportAllocs()
	for b.Loop() {
		tr.Event(ev)
	}
}

// Azure's first chunk of a stream is its prompt filter report, with an
// empty id, model and object and created 0; the answer's identity comes
// with the chunks after it. A continuation's chunks carry the identity
// the client's answer has, not the filter chunk's blanks.
func TestChatSpliceIdentityPastAzureFilterChunk(t *testing.T) {
	tr := OpenAIChat.NewTranscript(1 << 10)
	tr.Event(streamgate.Event{Data: []byte(`{"choices":[],"created":0,"id":"","model":"","object":"","prompt_filter_results":[{"prompt_index":0,"content_filter_results":{"hate":{"filtered":false,"severity":"safe"}}}]}`)})
	tr.Event(chatChunk("chatcmpl-first", "gpt-4o", `{"role":"assistant","content":""}`, "null"))
	tr.Event(chatText("chatcmpl-first", "Hello"))
	_, s, err := tr.Continue([]byte(chatReq), Prefill)
	if err != nil {
		t.Fatal(err)
	}
	got := rewriteAll(t, s, chatChunk("second", "other", `{"content":" world"}`, "null"))
	if len(got) != 1 {
		t.Fatalf("%d events: %+v", len(got), got)
	}
	var c struct {
		ID      string `json:"id"`
		Model   string `json:"model"`
		Created int64  `json:"created"`
	}
	if err := json.Unmarshal(got[0].Data, &c); err != nil {
		t.Fatal(err)
	}
	if c.ID != "chatcmpl-first" || c.Model != "gpt-4o" || c.Created != int64(len("chatcmpl-first")) {
		t.Fatalf("continuation chunk has the filter chunk's blank identity: %s", got[0].Data)
	}
}
