package provider

import (
	"fmt"
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
