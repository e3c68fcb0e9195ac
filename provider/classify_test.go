package provider

import (
	"errors"
	"github.com/llmfailover/caddy-llm-failover/internal/shapes"
	"testing"

	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		api  API
		ev   string // event name
		data string
		want streamgate.Kind
	}{
		{"chat role-only", OpenAIChat, "", shapes.ChatRole, streamgate.Preamble},
		{"chat role null content", OpenAIChat, "", shapes.ChatRoleNull, streamgate.Preamble},
		{"chat empty delta", OpenAIChat, "", shapes.ChatEmpty, streamgate.Preamble},
		{"chat usage-only", OpenAIChat, "", shapes.ChatUsage, streamgate.Preamble},
		{"chat content", OpenAIChat, "", shapes.ChatContent, streamgate.Content},
		{"chat escaped content", OpenAIChat, "", shapes.ChatEscaped, streamgate.Content},
		{"chat tool call", OpenAIChat, "", shapes.ChatToolCall, streamgate.Content},
		{"chat reasoning_content", OpenAIChat, "", shapes.ChatReasoning, streamgate.Content},
		{"chat refusal", OpenAIChat, "", shapes.ChatRefusal, streamgate.Content},
		{"chat finish_reason", OpenAIChat, "", shapes.ChatFinish, streamgate.Terminal},
		{"chat error", OpenAIChat, "", shapes.ChatError, streamgate.ErrorFrame},
		{"chat openrouter error", OpenAIChat, "", shapes.ChatORError, streamgate.ErrorFrame},
		{"chat error null", OpenAIChat, "", shapes.ChatErrorNull, streamgate.Preamble},
		{"chat legacy text", OpenAIChat, "", shapes.LegacyText, streamgate.Content},
		{"completions text", OpenAICompletions, "", shapes.LegacyText, streamgate.Content},
		{"completions finish", OpenAICompletions, "", `{"choices":[{"text":"","index":0,"finish_reason":"stop"}]}`, streamgate.Terminal},
		{"chat done", OpenAIChat, "", "[DONE]", streamgate.Terminal},
		{"chat malformed", OpenAIChat, "", `{"choices":[{"delta":{"content":"x"`, streamgate.Content},
		{"chat plain text", OpenAIChat, "", `hello`, streamgate.Content},
		{"chat empty data", OpenAIChat, "", ``, streamgate.Preamble},
		{"chat event error", OpenAIChat, "error", `{"message":"x"}`, streamgate.ErrorFrame},
		{"chat message name", OpenAIChat, "message", shapes.ChatContent, streamgate.Content},

		{"resp created", OpenAIResponses, "response.created", shapes.RespCreated, streamgate.Preamble},
		{"resp in_progress", OpenAIResponses, "response.in_progress", shapes.RespInProgress, streamgate.Preamble},
		{"resp item added", OpenAIResponses, "response.output_item.added", shapes.RespItemAdded, streamgate.Preamble},
		{"resp item added by type", OpenAIResponses, "", shapes.RespItemAdded, streamgate.Preamble},
		{"resp part added", OpenAIResponses, "response.content_part.added", `{"type":"response.content_part.added","item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}`, streamgate.Preamble},
		{"resp summary part added", OpenAIResponses, "response.reasoning_summary_part.added", `{"type":"response.reasoning_summary_part.added","item_id":"rs_1","output_index":0,"summary_index":0,"part":{"type":"summary_text","text":""}}`, streamgate.Preamble},
		{"resp reasoning summary delta", OpenAIResponses, "response.reasoning_summary_text.delta", `{"type":"response.reasoning_summary_text.delta","item_id":"rs_1","output_index":0,"summary_index":0,"delta":"Thinking"}`, streamgate.Content},
		{"resp function args delta", OpenAIResponses, "response.function_call_arguments.delta", `{"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":0,"delta":"{\"a\""}`, streamgate.Content},
		{"resp refusal delta", OpenAIResponses, "response.refusal.delta", `{"type":"response.refusal.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"I can't"}`, streamgate.Content},
		{"resp item done", OpenAIResponses, "response.output_item.done", `{"type":"response.output_item.done","output_index":0,"item":{"id":"ws_1","type":"web_search_call","status":"completed"}}`, streamgate.Content},
		{"resp text delta", OpenAIResponses, "response.output_text.delta", shapes.RespTextDelta, streamgate.Content},
		{"resp other delta", OpenAIResponses, "response.custom_tool_call_input.delta", `{"type":"response.custom_tool_call_input.delta","delta":"x"}`, streamgate.Content},
		{"resp completed", OpenAIResponses, "response.completed", shapes.RespCompleted, streamgate.Terminal},
		{"resp incomplete", OpenAIResponses, "response.incomplete", shapes.RespIncomplete, streamgate.Terminal},
		{"resp failed", OpenAIResponses, "response.failed", shapes.RespFailed, streamgate.ErrorFrame},
		{"resp error", OpenAIResponses, "error", shapes.RespError, streamgate.ErrorFrame},
		{"resp created by type", OpenAIResponses, "", shapes.RespCreated, streamgate.Preamble},
		{"resp delta by type", OpenAIResponses, "", shapes.RespTextDelta, streamgate.Content},
		{"resp failed by type", OpenAIResponses, "", shapes.RespFailed, streamgate.ErrorFrame},
		{"resp error by type", OpenAIResponses, "", shapes.RespError, streamgate.ErrorFrame},
		{"resp completed by type", OpenAIResponses, "", shapes.RespCompleted, streamgate.Terminal},
		{"resp top-level error", OpenAIResponses, "", shapes.ChatError, streamgate.ErrorFrame},
		{"resp malformed", OpenAIResponses, "", `{"type":"response.created"`, streamgate.Content},

		{"ant message_start", AnthropicMessages, "message_start", shapes.AntStart, streamgate.Preamble},
		{"ant ping", AnthropicMessages, "ping", shapes.AntPing, streamgate.Preamble},
		{"ant block start", AnthropicMessages, "content_block_start", shapes.AntBlockStart, streamgate.Preamble},
		{"ant block delta", AnthropicMessages, "content_block_delta", shapes.AntBlockDelta, streamgate.Content},
		{"ant block stop", AnthropicMessages, "content_block_stop", shapes.AntBlockStop, streamgate.Content},
		// A delta that carries nothing says nothing, as an empty chat
		// delta does: Claude opens every tool_use block's input with an
		// empty partial_json, and an error after it must still fail over.
		{"ant empty tool input delta", AnthropicMessages, "content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}`, streamgate.Preamble},
		{"ant empty text delta", AnthropicMessages, "content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":""}}`, streamgate.Preamble},
		{"ant empty thinking delta", AnthropicMessages, "content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":""}}`, streamgate.Preamble},
		{"ant thinking delta", AnthropicMessages, "content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me"}}`, streamgate.Content},
		{"ant signature delta", AnthropicMessages, "content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQB"}}`, streamgate.Content},
		{"ant tool input delta", AnthropicMessages, "content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"a\""}}`, streamgate.Content},
		{"ant empty tool input delta by type", AnthropicMessages, "", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}`, streamgate.Preamble},
		{"ant message_delta stop", AnthropicMessages, "message_delta", shapes.AntMsgDelta, streamgate.Content},
		{"ant message_delta no stop", AnthropicMessages, "message_delta", shapes.AntMsgDeltaNo, streamgate.Preamble},
		{"ant message_stop", AnthropicMessages, "message_stop", shapes.AntMsgStop, streamgate.Terminal},
		{"ant error", AnthropicMessages, "error", shapes.AntError, streamgate.ErrorFrame},
		{"ant start by type", AnthropicMessages, "", shapes.AntStart, streamgate.Preamble},
		{"ant ping by type", AnthropicMessages, "", shapes.AntPing, streamgate.Preamble},
		{"ant delta by type", AnthropicMessages, "", shapes.AntBlockDelta, streamgate.Content},
		{"ant message_delta by type", AnthropicMessages, "", shapes.AntMsgDelta, streamgate.Content},
		{"ant stop by type", AnthropicMessages, "", shapes.AntMsgStop, streamgate.Terminal},
		{"ant error by type", AnthropicMessages, "", shapes.AntError, streamgate.ErrorFrame},

		{"generic content", Unknown, "", `{"text":"hi"}`, streamgate.Content},
		{"generic plain", Unknown, "", `hi`, streamgate.Content},
		{"generic error key", Unknown, "", shapes.ChatError, streamgate.ErrorFrame},
		{"generic error type", Unknown, "", shapes.AntError, streamgate.ErrorFrame},
		{"generic error event", Unknown, "error", `oops`, streamgate.ErrorFrame},
		{"generic done", Unknown, "", `[DONE]`, streamgate.Terminal},
		{"generic blank", Unknown, "", " \n ", streamgate.Preamble},
		{"generic keepalive", Unknown, "keepalive", `{}`, streamgate.Preamble},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.api.Classify(streamgate.Event{Name: tt.ev, Data: []byte(tt.data)})
			if got != tt.want {
				t.Errorf("Classify(%v, %q, %s) = %v, want %v", tt.api, tt.ev, tt.data, got, tt.want)
			}
		})
	}
}

func TestClassifyOverflow(t *testing.T) {
	if k := OpenAIResponses.Classify(streamgate.Event{Name: "response.completed", Overflow: true}); k != streamgate.Terminal {
		t.Errorf("overflow response.completed = %v", k)
	}
	if k := OpenAIChat.Classify(streamgate.Event{Overflow: true}); k != streamgate.Content {
		t.Errorf("overflow chat = %v", k)
	}
}

func TestClassifyNoAllocs(t *testing.T) {
	cases := []struct {
		api  API
		name string
		data string
	}{
		{OpenAIChat, "", shapes.ChatContent},
		{OpenAIChat, "", shapes.ChatRole},
		{OpenAIResponses, "response.output_text.delta", shapes.RespTextDelta},
		{OpenAIResponses, "", shapes.RespTextDelta},
		{AnthropicMessages, "content_block_delta", shapes.AntBlockDelta},
		{AnthropicMessages, "message_delta", shapes.AntMsgDelta},
		{Unknown, "", shapes.ChatContent},
	}
	for _, c := range cases {
		ev := streamgate.Event{Name: c.name, Data: []byte(c.data)}
		if n := testing.AllocsPerRun(100, func() { c.api.Classify(ev) }); n != 0 {
			t.Errorf("Classify(%v, %q) allocates %v times", c.api, c.name, n)
		}
	}
}

func TestStrings(t *testing.T) {
	if OpenAIResponses.String() != "openai_responses" || streamgate.Terminal.String() != "terminal" {
		t.Error("String methods")
	}
}

func TestCheckBody(t *testing.T) {
	tests := []struct {
		body string
		want error
	}{
		{`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`, nil},
		{`{"id":"resp_1","object":"response","status":"completed","error":null,"output":[]}`, nil},
		{`{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hi"}]}`, nil},
		{shapes.ChatError, ErrErrorBody},
		{shapes.AntError, ErrErrorBody},
		{`{"id":"resp_1","status":"failed","error":{"code":"server_error","message":"x"}}`, ErrErrorBody},
		{`{"id":"chatcmpl-1","choices":[`, ErrMalformedBody},
		{``, ErrMalformedBody},
		{`[1,2]`, nil},
		// Google's array-wrapped error, sent with a 200 too.
		{` [{"error":{"code":429,"message":"Resource has been exhausted","status":"RESOURCE_EXHAUSTED"}}]`, ErrErrorBody},
		{`[{"error":null,"data":1}]`, nil},
		{`[[0.1,0.2]]`, nil},
	}
	for _, tt := range tests {
		err := OpenAIChat.CheckBody([]byte(tt.body))
		if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
			t.Errorf("CheckBody(%s) = %v, want %v", tt.body, err, tt.want)
		}
	}
}

func TestErrorEvent(t *testing.T) {
	tests := []struct {
		api  API
		want string
	}{
		{OpenAIChat, "data: {\"error\":{\"message\":\"a \\\"b\\\"\",\"type\":\"server_error\",\"param\":null,\"code\":\"c\"}}\n\n"},
		{Unknown, "data: {\"error\":{\"message\":\"a \\\"b\\\"\",\"type\":\"server_error\",\"param\":null,\"code\":\"c\"}}\n\n"},
		{OpenAIResponses, "event: error\ndata: {\"type\":\"error\",\"code\":\"c\",\"message\":\"a \\\"b\\\"\",\"param\":null}\n\n"},
		{AnthropicMessages, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"a \\\"b\\\"\"}}\n\n"},
	}
	for _, tt := range tests {
		got := string(tt.api.ErrorEvent("c", `a "b"`))
		if got != tt.want {
			t.Errorf("ErrorEvent(%v) =\n%q\nwant\n%q", tt.api, got, tt.want)
		}
		// The rendered event must itself classify as an error.
		var kinds []streamgate.Kind
		var p streamgate.Parser
		p.Feed([]byte(got), func(ev streamgate.Event) { kinds = append(kinds, tt.api.Classify(ev)) })
		if len(kinds) != 1 || kinds[0] != streamgate.ErrorFrame {
			t.Errorf("ErrorEvent(%v) classifies as %v", tt.api, kinds)
		}
	}
}
