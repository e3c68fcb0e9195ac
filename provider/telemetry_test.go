package provider

import (
	"fmt"
	"strings"
	"testing"

	"github.com/llmfailover/caddy-llm-failover/internal/shapes"
	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

// What an answer says of itself, in every API's stream and body, is read
// only when the meter is asked to (a traced request).
func TestMeterDescribes(t *testing.T) {
	for _, tt := range []struct {
		name   string
		api    API
		events []string
		body   string
		model  string
		reason string
	}{
		{"chat stream", OpenAIChat, []string{shapes.ChatRole, shapes.ChatContent, shapes.ChatFinish, shapes.ChatUsage}, "", "gpt-4o-2024-08-06", "[stop]"},
		{"chat body", OpenAIChat, nil, `{"id":"c","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`, "gpt-4o-mini", "[length]"},
		{"messages stream", AnthropicMessages, []string{shapes.AntStart, shapes.AntBlockStart, shapes.AntBlockDelta, shapes.AntBlockStop, shapes.AntMsgDelta, shapes.AntMsgStop}, "", "claude-sonnet-4-5-20250929", "[end_turn]"},
		{"messages body", AnthropicMessages, nil, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-haiku-4-5","content":[{"type":"text","text":"hi"}],"stop_reason":"tool_use","usage":{"input_tokens":3,"output_tokens":2}}`, "claude-haiku-4-5", "[tool_use]"},
		{"responses stream", OpenAIResponses, []string{shapes.RespCreated, shapes.RespInProgress, shapes.RespItemAdded, shapes.RespTextDelta, shapes.RespCompleted}, "", "gpt-4.1-2025-04-14", "[stop]"},
		{"responses incomplete", OpenAIResponses, []string{shapes.RespIncomplete}, "", "", "[max_output_tokens]"},
		{"responses body", OpenAIResponses, nil, `{"id":"resp_1","object":"response","status":"completed","model":"gpt-5","output":[],"usage":{"input_tokens":1,"output_tokens":1}}`, "gpt-5", "[stop]"},
	} {
		m := tt.api.NewMeter()
		feed := func() {
			for _, e := range tt.events {
				m.Event(streamgate.Event{Data: []byte(e)})
			}
			if tt.body != "" {
				m.Body([]byte(tt.body))
			}
		}
		feed()
		if d := m.Described(); d.Model != "" || d.FinishReasons != nil {
			t.Errorf("%s: described %+v without being asked", tt.name, d)
		}
		m = tt.api.NewMeter()
		m.Describe()
		feed()
		d := m.Described()
		if d.Model != tt.model || fmt.Sprint(d.FinishReasons) != tt.reason {
			t.Errorf("%s: described %+v, want model %q and reasons %s", tt.name, d, tt.model, tt.reason)
		}
	}
}

func TestOperationAndProviderNames(t *testing.T) {
	for api, want := range map[API]string{OpenAIChat: "chat", OpenAIResponses: "chat", AnthropicMessages: "chat",
		OpenAICompletions: "text_completion", OpenAIEmbeddings: "embeddings", OpenAIModels: "", AnthropicCountTokens: ""} {
		if got := api.Operation(); got != want {
			t.Errorf("%s: operation %q, want %q", api, got, want)
		}
	}
	for _, tt := range []struct {
		a    Adapter
		want string
	}{{OpenAI{}, "openai"}, {Anthropic{}, "anthropic"}, {new(Azure), "azure.ai.openai"}, {new(Bedrock), "aws.bedrock"},
		{new(Vertex), "gcp.vertex_ai"}, {new(Gemini), "gcp.gemini"}} {
		if got := ProviderNameOf(tt.a); got != tt.want {
			t.Errorf("%T: provider %q, want %q", tt.a, got, tt.want)
		}
	}
}

// The prompt and the answer's text are kept only when asked, and cut at
// the bound on a character boundary.
func TestPromptAndTextAreBounded(t *testing.T) {
	body := []byte(`{"model":"m","temperature":0.2,"system":"Be brief.","messages":[{"role":"user","content":"Grüße"}],"max_tokens":9}`)
	if p, cut := Prompt(body, 1000); p != `{"system":"Be brief.","messages":[{"role":"user","content":"Grüße"}]}` || cut {
		t.Errorf("Prompt = %s, %v", p, cut)
	}
	if p, cut := Prompt(body, 62); p != `{"system":"Be brief.","messages":[{"role":"user","content":"Gr` || !cut {
		t.Errorf("Prompt cut = %q, %v (a cut inside ü keeps no half of it)", p, cut)
	}

	m := AnthropicMessages.NewMeter()
	for _, e := range []string{shapes.AntStart, shapes.AntBlockDelta, `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":", \"wörld\"\n"}}`} {
		m.Event(streamgate.Event{Data: []byte(e)})
	}
	if text, cut := m.Text(); text != "" || cut {
		t.Errorf("text kept without KeepText: %q", text)
	}
	for _, tt := range []struct {
		max  int
		want string
		cut  bool
	}{{100, "Hello, \"wörld\"\n", false}, {10, "Hello, \"w", true}, {11, "Hello, \"wö", true}} {
		m := AnthropicMessages.NewMeter()
		m.KeepText(tt.max)
		for _, e := range []string{shapes.AntStart, shapes.AntBlockDelta, `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":", \"wörld\"\n"}}`} {
			m.Event(streamgate.Event{Data: []byte(e)})
		}
		if text, cut := m.Text(); text != tt.want || cut != tt.cut {
			t.Errorf("KeepText(%d): %q, %v; want %q, %v", tt.max, text, cut, tt.want, tt.cut)
		}
	}
}

// What a traced answer says of itself is kept within a bound, however
// long the stream: an upstream repeating a finish reason on every chunk
// (or sending a huge one) must not grow the meter with the stream.
func TestDescribedReasonsAreBounded(t *testing.T) {
	m := OpenAIChat.NewMeter()
	m.Describe()
	ev := []byte(`{"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}`)
	for range 100_000 {
		m.Event(streamgate.Event{Data: ev})
	}
	huge := []byte(`{"choices":[{"index":0,"delta":{},"finish_reason":"` + strings.Repeat("r", 256<<10) + `"}]}`)
	for range 64 {
		m.Event(streamgate.Event{Data: huge})
	}
	d := m.Described()
	size := 0
	for _, r := range d.FinishReasons {
		size += len(r)
	}
	if len(d.FinishReasons) > 128 || size > 64<<10 {
		t.Fatalf("the meter kept %d finish reasons of %d bytes in all after a long stream", len(d.FinishReasons), size)
	}
	if len(d.FinishReasons) == 0 || d.FinishReasons[0] != "stop" {
		t.Fatalf("finish reasons %v, want stop first", d.FinishReasons[:min(3, len(d.FinishReasons))])
	}
}

// The kept text is decoded in one pass, whatever it holds: content with an
// invalid escape or a control character (which the stream's walk does not
// check) keeps the text before it, without decoding the rest once per
// byte.
func TestKeptTextDecodesInOnePass(t *testing.T) {
	for _, bad := range []string{`\q`, "\x01", `\u12G4`} {
		m := OpenAIChat.NewMeter()
		m.KeepText(8 << 10)
		m.Event(streamgate.Event{Data: []byte(`{"choices":[{"index":0,"delta":{"content":"ok ` + bad + strings.Repeat("a", 32<<10) + `"}}]}`)})
		var text string
		allocs := testing.AllocsPerRun(1, func() { text, _ = m.Text() })
		if text != "ok " {
			t.Errorf("%q: kept text %.20q, want the text before it", bad, text)
		}
		if allocs > 50 {
			t.Errorf("%q: reading the kept text took %.0f allocations (one decode per byte)", bad, allocs)
		}
	}
	m := OpenAIChat.NewMeter()
	m.KeepText(100)
	m.Event(streamgate.Event{Data: []byte(`{"choices":[{"index":0,"delta":{"content":"a\"b\u00e9\ud83d\ude00c\\"}}]}`)})
	if text, cut := m.Text(); text != "a\"bé😀c\\" || cut {
		t.Errorf("kept text %q, %v", text, cut)
	}
}
