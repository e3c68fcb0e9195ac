// Package shapes holds the JSON of real LLM provider stream events and
// errors (ids shortened), shared by the tests of provider and streamgate so
// that both test against the same wire data. It is for tests only.
package shapes

// Event data, as copied from provider streams.
const (
	ChatRole      = `{"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_abc","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}]}`
	ChatRoleNull  = `{"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,"model":"deepseek-reasoner","choices":[{"index":0,"delta":{"role":"assistant","content":null,"reasoning_content":""},"logprobs":null,"finish_reason":null}]}`
	ChatEmpty     = `{"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":null}]}`
	ChatContent   = `{"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_abc","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]}`
	ChatEscaped   = `{"id":"c","choices":[{"index":0,"delta":{"content":"say \"hi\" \\"},"finish_reason":null}]}`
	ChatToolCall  = `{"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_DdmO9pD3xa9XTPNJ32zg2hcA","type":"function","function":{"name":"get_weather","arguments":""}}],"refusal":null},"logprobs":null,"finish_reason":null}]}`
	ChatReasoning = `{"id":"0193","object":"chat.completion.chunk","created":1738000000,"model":"deepseek-reasoner","system_fingerprint":"fp_7e73fd9a08","choices":[{"index":0,"delta":{"content":null,"reasoning_content":"Okay"},"logprobs":null,"finish_reason":null}]}`
	ChatRefusal   = `{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"refusal":"I can't help with that."},"finish_reason":null}]}`
	ChatFinish    = `{"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_abc","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}`
	ChatUsage     = `{"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_abc","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}`
	ChatError     = `{"error":{"message":"Rate limit","type":"rate_limit_error","code":"rate_limit_exceeded"}}`
	ChatORError   = `{"id":"gen-1","object":"chat.completion.chunk","created":1,"model":"x","error":{"code":502,"message":"Provider returned error"},"choices":[{"index":0,"delta":{"content":""},"finish_reason":"error"}]}`
	ChatErrorNull = `{"id":"c","error":null,"choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}`
	LegacyText    = `{"id":"cmpl-1","object":"text_completion","created":1,"choices":[{"text":" world","index":0,"logprobs":null,"finish_reason":null}],"model":"gpt-3.5-turbo-instruct"}`

	RespCreated    = `{"type":"response.created","sequence_number":0,"response":{"id":"resp_67c9","object":"response","created_at":1741290958,"status":"in_progress","error":null,"incomplete_details":null,"model":"gpt-4.1-2025-04-14","output":[],"usage":null}}`
	RespInProgress = `{"type":"response.in_progress","sequence_number":1,"response":{"id":"resp_67c9","object":"response","status":"in_progress","error":null,"output":[]}}`
	RespItemAdded  = `{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":"msg_67c9","type":"message","status":"in_progress","role":"assistant","content":[]}}`
	RespTextDelta  = `{"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_67c9","output_index":0,"content_index":0,"delta":"Hi"}`
	RespCompleted  = `{"type":"response.completed","sequence_number":9,"response":{"id":"resp_67c9","object":"response","status":"completed","error":null,"output":[{"id":"msg_67c9","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi there!","annotations":[]}]}],"usage":{"input_tokens":37,"output_tokens":11,"total_tokens":48}}}`
	RespFailed     = `{"type":"response.failed","sequence_number":3,"response":{"id":"resp_67c9","object":"response","status":"failed","error":{"code":"server_error","message":"The model failed to generate a response."},"output":[]}}`
	RespError      = `{"type":"error","sequence_number":1,"code":"ERR_SOMETHING","message":"Something went wrong","param":null}`
	RespIncomplete = `{"type":"response.incomplete","sequence_number":7,"response":{"id":"resp_1","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"}}}`

	AntStart      = `{"type":"message_start","message":{"id":"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5-20250929","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"output_tokens":1}}}`
	AntPing       = `{"type": "ping"}`
	AntBlockStart = `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`
	AntBlockDelta = `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`
	AntBlockStop  = `{"type":"content_block_stop","index":0}`
	AntMsgDelta   = `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}`
	AntMsgDeltaNo = `{"type":"message_delta","delta":{"stop_reason":null,"stop_sequence":null},"usage":{"output_tokens":1}}`
	AntMsgStop    = `{"type":"message_stop"}`
	AntError      = `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`
)
