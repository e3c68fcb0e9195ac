package streamgate

import (
	"errors"
	"testing"
)

// Event shapes below are copied from real provider streams (ids shortened).
const (
	chatRole      = `{"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_abc","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}]}`
	chatRoleNull  = `{"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,"model":"deepseek-reasoner","choices":[{"index":0,"delta":{"role":"assistant","content":null,"reasoning_content":""},"logprobs":null,"finish_reason":null}]}`
	chatEmpty     = `{"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":null}]}`
	chatContent   = `{"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_abc","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]}`
	chatEscaped   = `{"id":"c","choices":[{"index":0,"delta":{"content":"say \"hi\" \\"},"finish_reason":null}]}`
	chatToolCall  = `{"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_DdmO9pD3xa9XTPNJ32zg2hcA","type":"function","function":{"name":"get_weather","arguments":""}}],"refusal":null},"logprobs":null,"finish_reason":null}]}`
	chatReasoning = `{"id":"0193","object":"chat.completion.chunk","created":1738000000,"model":"deepseek-reasoner","system_fingerprint":"fp_7e73fd9a08","choices":[{"index":0,"delta":{"content":null,"reasoning_content":"Okay"},"logprobs":null,"finish_reason":null}]}`
	chatRefusal   = `{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"refusal":"I can't help with that."},"finish_reason":null}]}`
	chatFinish    = `{"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_abc","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}`
	chatUsage     = `{"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_abc","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}`
	chatError     = `{"error":{"message":"Rate limit","type":"rate_limit_error","code":"rate_limit_exceeded"}}`
	chatORError   = `{"id":"gen-1","object":"chat.completion.chunk","created":1,"model":"x","error":{"code":502,"message":"Provider returned error"},"choices":[{"index":0,"delta":{"content":""},"finish_reason":"error"}]}`
	chatErrorNull = `{"id":"c","error":null,"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}`
	legacyText    = `{"id":"cmpl-1","object":"text_completion","created":1,"choices":[{"text":" world","index":0,"logprobs":null,"finish_reason":null}],"model":"gpt-3.5-turbo-instruct"}`

	respCreated    = `{"type":"response.created","sequence_number":0,"response":{"id":"resp_67c9","object":"response","created_at":1741290958,"status":"in_progress","error":null,"incomplete_details":null,"model":"gpt-4.1-2025-04-14","output":[],"usage":null}}`
	respInProgress = `{"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_67c9","object":"response","status":"in_progress","error":null,"output":[]}}`
	respItemAdded  = `{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_67c9","type":"message","status":"in_progress","role":"assistant","content":[]}}`
	respTextDelta  = `{"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_67c9","output_index":0,"content_index":0,"delta":"Hi"}`
	respCompleted  = `{"type":"response.completed","sequence_number":9,"response":{"id":"resp_67c9","object":"response","status":"completed","error":null,"output":[{"id":"msg_67c9","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi there!","annotations":[]}]}],"usage":{"input_tokens":37,"output_tokens":11,"total_tokens":48}}}`
	respFailed     = `{"type":"response.failed","sequence_number":3,"response":{"id":"resp_67c9","object":"response","status":"failed","error":{"code":"server_error","message":"The model failed to generate a response."},"output":[]}}`
	respError      = `{"type":"error","sequence_number":1,"code":"ERR_SOMETHING","message":"Something went wrong","param":null}`
	respIncomplete = `{"type":"response.incomplete","sequence_number":7,"response":{"id":"resp_1","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"}}}`

	antStart      = `{"type":"message_start","message":{"id":"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5-20250929","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"output_tokens":1}}}`
	antPing       = `{"type": "ping"}`
	antBlockStart = `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`
	antBlockDelta = `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`
	antBlockStop  = `{"type":"content_block_stop","index":0}`
	antMsgDelta   = `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}`
	antMsgDeltaNo = `{"type":"message_delta","delta":{"stop_reason":null,"stop_sequence":null},"usage":{"output_tokens":1}}`
	antMsgStop    = `{"type":"message_stop"}`
	antError      = `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`
)

func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		d    Dialect
		ev   string // event name
		data string
		want Kind
	}{
		{"chat role-only", OpenAIChat, "", chatRole, Preamble},
		{"chat role null content", OpenAIChat, "", chatRoleNull, Preamble},
		{"chat empty delta", OpenAIChat, "", chatEmpty, Preamble},
		{"chat usage-only", OpenAIChat, "", chatUsage, Preamble},
		{"chat content", OpenAIChat, "", chatContent, Content},
		{"chat escaped content", OpenAIChat, "", chatEscaped, Content},
		{"chat tool call", OpenAIChat, "", chatToolCall, Content},
		{"chat reasoning_content", OpenAIChat, "", chatReasoning, Content},
		{"chat refusal", OpenAIChat, "", chatRefusal, Content},
		{"chat finish_reason", OpenAIChat, "", chatFinish, Terminal},
		{"chat error", OpenAIChat, "", chatError, ErrorFrame},
		{"chat openrouter error", OpenAIChat, "", chatORError, ErrorFrame},
		{"chat error null", OpenAIChat, "", chatErrorNull, Preamble},
		{"chat legacy text", OpenAIChat, "", legacyText, Content},
		{"chat done", OpenAIChat, "", "[DONE]", Terminal},
		{"chat malformed", OpenAIChat, "", `{"choices":[{"delta":{"content":"x"`, Content},
		{"chat plain text", OpenAIChat, "", `hello`, Content},
		{"chat empty data", OpenAIChat, "", ``, Preamble},
		{"chat event error", OpenAIChat, "error", `{"message":"x"}`, ErrorFrame},
		{"chat message name", OpenAIChat, "message", chatContent, Content},

		{"resp created", OpenAIResponses, "response.created", respCreated, Preamble},
		{"resp in_progress", OpenAIResponses, "response.in_progress", respInProgress, Preamble},
		{"resp item added", OpenAIResponses, "response.output_item.added", respItemAdded, Content},
		{"resp text delta", OpenAIResponses, "response.output_text.delta", respTextDelta, Content},
		{"resp other delta", OpenAIResponses, "response.custom_tool_call_input.delta", `{"type":"response.custom_tool_call_input.delta","delta":"x"}`, Content},
		{"resp completed", OpenAIResponses, "response.completed", respCompleted, Terminal},
		{"resp incomplete", OpenAIResponses, "response.incomplete", respIncomplete, Terminal},
		{"resp failed", OpenAIResponses, "response.failed", respFailed, ErrorFrame},
		{"resp error", OpenAIResponses, "error", respError, ErrorFrame},
		{"resp created by type", OpenAIResponses, "", respCreated, Preamble},
		{"resp delta by type", OpenAIResponses, "", respTextDelta, Content},
		{"resp failed by type", OpenAIResponses, "", respFailed, ErrorFrame},
		{"resp error by type", OpenAIResponses, "", respError, ErrorFrame},
		{"resp completed by type", OpenAIResponses, "", respCompleted, Terminal},
		{"resp top-level error", OpenAIResponses, "", chatError, ErrorFrame},
		{"resp malformed", OpenAIResponses, "", `{"type":"response.created"`, Content},

		{"ant message_start", AnthropicMessages, "message_start", antStart, Preamble},
		{"ant ping", AnthropicMessages, "ping", antPing, Preamble},
		{"ant block start", AnthropicMessages, "content_block_start", antBlockStart, Preamble},
		{"ant block delta", AnthropicMessages, "content_block_delta", antBlockDelta, Content},
		{"ant block stop", AnthropicMessages, "content_block_stop", antBlockStop, Content},
		{"ant message_delta stop", AnthropicMessages, "message_delta", antMsgDelta, Content},
		{"ant message_delta no stop", AnthropicMessages, "message_delta", antMsgDeltaNo, Preamble},
		{"ant message_stop", AnthropicMessages, "message_stop", antMsgStop, Terminal},
		{"ant error", AnthropicMessages, "error", antError, ErrorFrame},
		{"ant start by type", AnthropicMessages, "", antStart, Preamble},
		{"ant ping by type", AnthropicMessages, "", antPing, Preamble},
		{"ant delta by type", AnthropicMessages, "", antBlockDelta, Content},
		{"ant message_delta by type", AnthropicMessages, "", antMsgDelta, Content},
		{"ant stop by type", AnthropicMessages, "", antMsgStop, Terminal},
		{"ant error by type", AnthropicMessages, "", antError, ErrorFrame},

		{"generic content", Generic, "", `{"text":"hi"}`, Content},
		{"generic plain", Generic, "", `hi`, Content},
		{"generic error key", Generic, "", chatError, ErrorFrame},
		{"generic error type", Generic, "", antError, ErrorFrame},
		{"generic error event", Generic, "error", `oops`, ErrorFrame},
		{"generic done", Generic, "", `[DONE]`, Terminal},
		{"generic blank", Generic, "", " \n ", Preamble},
		{"generic keepalive", Generic, "keepalive", `{}`, Preamble},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Classify(tt.d, Event{Name: tt.ev, Data: []byte(tt.data)})
			if got != tt.want {
				t.Errorf("Classify(%v, %q, %s) = %v, want %v", tt.d, tt.ev, tt.data, got, tt.want)
			}
		})
	}
}

func TestClassifyOverflow(t *testing.T) {
	if k := Classify(OpenAIResponses, Event{Name: "response.completed", Overflow: true}); k != Terminal {
		t.Errorf("overflow response.completed = %v", k)
	}
	if k := Classify(OpenAIChat, Event{Overflow: true}); k != Content {
		t.Errorf("overflow chat = %v", k)
	}
}

func TestClassifyNoAllocs(t *testing.T) {
	cases := []struct {
		d    Dialect
		name string
		data string
	}{
		{OpenAIChat, "", chatContent},
		{OpenAIChat, "", chatRole},
		{OpenAIResponses, "response.output_text.delta", respTextDelta},
		{OpenAIResponses, "", respTextDelta},
		{AnthropicMessages, "content_block_delta", antBlockDelta},
		{AnthropicMessages, "message_delta", antMsgDelta},
		{Generic, "", chatContent},
	}
	for _, c := range cases {
		ev := Event{Name: c.name, Data: []byte(c.data)}
		if n := testing.AllocsPerRun(100, func() { Classify(c.d, ev) }); n != 0 {
			t.Errorf("Classify(%v, %q) allocates %v times", c.d, c.name, n)
		}
	}
}

func TestStrings(t *testing.T) {
	want := []string{"complete", "upstream_error", "closed_early", "gate_timeout", "truncated", "stalled", "client_gone"}
	for i, w := range want {
		if got := Outcome(i).String(); got != w {
			t.Errorf("Outcome(%d) = %q, want %q", i, got, w)
		}
	}
	if OpenAIResponses.String() != "openai_responses" || Terminal.String() != "terminal" {
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
		{chatError, ErrErrorBody},
		{antError, ErrErrorBody},
		{`{"id":"resp_1","status":"failed","error":{"code":"server_error","message":"x"}}`, ErrErrorBody},
		{`{"id":"chatcmpl-1","choices":[`, ErrMalformedBody},
		{``, ErrMalformedBody},
		{`[1,2]`, nil},
	}
	for _, tt := range tests {
		err := CheckBody([]byte(tt.body))
		if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
			t.Errorf("CheckBody(%s) = %v, want %v", tt.body, err, tt.want)
		}
	}
}

func TestErrorEvent(t *testing.T) {
	tests := []struct {
		d    Dialect
		want string
	}{
		{OpenAIChat, "data: {\"error\":{\"message\":\"a \\\"b\\\"\",\"type\":\"server_error\",\"code\":\"c\"}}\n\n"},
		{Generic, "data: {\"error\":{\"message\":\"a \\\"b\\\"\",\"type\":\"server_error\",\"code\":\"c\"}}\n\n"},
		{OpenAIResponses, "event: error\ndata: {\"type\":\"error\",\"code\":\"c\",\"message\":\"a \\\"b\\\"\",\"param\":null}\n\n"},
		{AnthropicMessages, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"a \\\"b\\\"\"}}\n\n"},
	}
	for _, tt := range tests {
		got := string(ErrorEvent(tt.d, "c", `a "b"`))
		if got != tt.want {
			t.Errorf("ErrorEvent(%v) =\n%q\nwant\n%q", tt.d, got, tt.want)
		}
		// The rendered event must itself classify as an error.
		var kinds []Kind
		var p Parser
		p.Feed([]byte(got), func(ev Event) { kinds = append(kinds, Classify(tt.d, ev)) })
		if len(kinds) != 1 || kinds[0] != ErrorFrame {
			t.Errorf("ErrorEvent(%v) classifies as %v", tt.d, kinds)
		}
	}
}
