package provider

import (
	"runtime"
	"strings"
	"testing"

	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

// sse feeds a raw text/event-stream to m the way the gateway's SSE reader
// would: event name plus joined data lines per event.
func sse(m *Meter, stream string) {
	for _, block := range strings.Split(strings.TrimSpace(stream), "\n\n") {
		var name string
		var data []string
		for _, line := range strings.Split(block, "\n") {
			switch {
			case strings.HasPrefix(line, "event: "):
				name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				data = append(data, strings.TrimPrefix(line, "data: "))
			}
		}
		buf := []byte(strings.Join(data, "\n"))
		m.Event(streamgate.Event{Name: name, Data: buf})
		// The meter must not keep the data: the reader reuses its buffer.
		for i := range buf {
			buf[i] = 'x'
		}
	}
}

const openAIChatStream = `data: {"id":"chatcmpl-B9","object":"chat.completion.chunk","created":1727000000,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-B9","object":"chat.completion.chunk","created":1727000000,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"content":"Hello! The word \"usage\" appears here."},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-B9","object":"chat.completion.chunk","created":1727000000,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}

data: {"id":"chatcmpl-B9","object":"chat.completion.chunk","created":1727000000,"model":"gpt-4o-mini-2024-07-18","system_fingerprint":"fp_1","choices":[],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}

data: [DONE]`

const responsesStream = `event: response.created
data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_67c","object":"response","created_at":1741290958,"status":"in_progress","model":"gpt-4.1-2025-04-14","output":[],"usage":null}}

event: response.output_text.delta
data: {"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_67c","output_index":0,"content_index":0,"delta":"Hi there"}

event: response.completed
data: {"type":"response.completed","sequence_number":9,"response":{"id":"resp_67c","object":"response","created_at":1741290958,"status":"completed","model":"gpt-4.1-2025-04-14","output":[{"id":"msg_67c","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi there","annotations":[]}]}],"usage":{"input_tokens":37,"input_tokens_details":{"cached_tokens":0},"output_tokens":11,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":48}}}`

const anthropicStream = `event: message_start
data: {"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-20250514","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"output_tokens":1,"service_tier":"standard"}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":7}}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}

event: message_stop
data: {"type":"message_stop"}`

func TestMeterStreams(t *testing.T) {
	cases := []struct {
		name   string
		api    API
		stream string
		want   Usage
	}{
		{"openai chat", OpenAIChat, openAIChatStream, Usage{Input: 19, Output: 10, InputKnown: true, OutputKnown: true}},
		{"responses", OpenAIResponses, responsesStream, Usage{Input: 37, Output: 11, InputKnown: true, OutputKnown: true}},
		{"anthropic", AnthropicMessages, anthropicStream, Usage{Input: 25 + 100 + 2000, Output: 15, InputKnown: true, OutputKnown: true, CacheRead: 2000, CacheWrite: 100}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := c.api.NewMeter()
			sse(m, c.stream)
			if got := m.Usage(); got != c.want {
				t.Errorf("Usage() = %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestMeterAnthropicNamelessEvents(t *testing.T) {
	// Some proxies drop the event: lines; the type field still identifies them.
	m := AnthropicMessages.NewMeter()
	m.Event(streamgate.Event{Name: "", Data: []byte(`{"type":"message_start","message":{"usage":{"input_tokens":12,"output_tokens":1}}}`)})
	m.Event(streamgate.Event{Name: "", Data: []byte(`{"type":"message_delta","delta":{},"usage":{"output_tokens":4}}`)})
	if got := m.Usage(); got != (Usage{Input: 12, Output: 4, InputKnown: true, OutputKnown: true}) {
		t.Errorf("Usage() = %+v", got)
	}
}

func TestMeterAnthropicDeltaWithInput(t *testing.T) {
	// With server tools, message_delta repeats cumulative input counts.
	m := AnthropicMessages.NewMeter()
	m.Event(streamgate.Event{Name: "message_start", Data: []byte(`{"type":"message_start","message":{"usage":{"input_tokens":10,"output_tokens":1}}}`)})
	m.Event(streamgate.Event{Name: "message_delta", Data: []byte(`{"type":"message_delta","delta":{},"usage":{"input_tokens":500,"cache_read_input_tokens":20,"output_tokens":40,"server_tool_use":{"web_search_requests":1}}}`)})
	if got := m.Usage(); got != (Usage{Input: 520, Output: 40, InputKnown: true, OutputKnown: true, CacheRead: 20}) {
		t.Errorf("Usage() = %+v", got)
	}
}

func TestMeterBodies(t *testing.T) {
	cases := []struct {
		name string
		api  API
		body string
		want Usage
	}{
		{"openai chat", OpenAIChat, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21,"completion_tokens_details":{"reasoning_tokens":0}}}`, Usage{Input: 9, Output: 12, InputKnown: true, OutputKnown: true}},
		{"responses", OpenAIResponses, `{"id":"resp_1","object":"response","status":"completed","model":"o4-mini","output":[{"type":"reasoning","summary":[]},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"4"}]}],"usage":{"input_tokens":14,"input_tokens_details":{"cached_tokens":0},"output_tokens":210,"output_tokens_details":{"reasoning_tokens":192},"total_tokens":224}}`, Usage{Input: 14, Output: 210, InputKnown: true, OutputKnown: true}},
		{"anthropic", AnthropicMessages, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-3-5-haiku-20241022","content":[{"type":"text","text":"Hi!"}],"stop_reason":"end_turn","usage":{"input_tokens":13,"cache_creation_input_tokens":0,"cache_read_input_tokens":50,"output_tokens":5}}`, Usage{Input: 63, Output: 5, InputKnown: true, OutputKnown: true, CacheRead: 50}},
		{"embeddings", OpenAIEmbeddings, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.0023,-0.0093]}],"model":"text-embedding-3-small","usage":{"prompt_tokens":8,"total_tokens":8}}`, Usage{Input: 8, Output: 0, InputKnown: true, OutputKnown: true}},
		{"error body", OpenAIChat, `{"error":{"message":"Rate limit","type":"requests","code":"rate_limit_exceeded"}}`, Usage{Input: 0, Output: 0, InputKnown: false, OutputKnown: false}},
		{"garbage", AnthropicMessages, `{"usage": oops`, Usage{Input: 0, Output: 0, InputKnown: false, OutputKnown: false}},
		{"null usage", OpenAIChat, `{"choices":[],"usage":null}`, Usage{Input: 0, Output: 0, InputKnown: false, OutputKnown: false}},
		{"usage nested only", OpenAIChat, `{"choices":[{"usage":{"prompt_tokens":1}}]}`, Usage{Input: 0, Output: 0, InputKnown: false, OutputKnown: false}},
		{"last usage wins", OpenAIChat, `{"usage":{"prompt_tokens":1,"completion_tokens":2},"usage":{"prompt_tokens":3,"completion_tokens":4}}`, Usage{Input: 3, Output: 4, InputKnown: true, OutputKnown: true}},
		{"repeated usage merges", OpenAIChat, `{"usage":{"prompt_tokens":1},"usage":{"completion_tokens":2}}`, Usage{Input: 1, Output: 2, InputKnown: true, OutputKnown: true}},
		{"broken after usage", OpenAIChat, `{"usage":{"prompt_tokens":1,"completion_tokens":2},"x":}`, Usage{Input: 0, Output: 0, InputKnown: false, OutputKnown: false}},
		{"trailing garbage", OpenAIChat, `{"usage":{"prompt_tokens":1,"completion_tokens":2}} x`, Usage{Input: 0, Output: 0, InputKnown: false, OutputKnown: false}},
		{"usage not an object", OpenAIChat, `{"usage":7}`, Usage{Garbled: true}},
		{"a count out of range", OpenAIChat, `{"usage":{"prompt_tokens":100,"completion_tokens":1e30}}`, Usage{Garbled: true}},
		{"a count as a string", OpenAIResponses, `{"usage":{"input_tokens":"100","output_tokens":5}}`, Usage{Garbled: true}},
		{"a fractional count", AnthropicMessages, `{"usage":{"input_tokens":10.5,"output_tokens":5}}`, Usage{Garbled: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := c.api.NewMeter()
			m.Body([]byte(c.body))
			if got := m.Usage(); got != c.want {
				t.Errorf("Usage() = %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestMeterPartialReports(t *testing.T) {
	// Client hung up after some text: no usage chunk ever arrived.
	m := OpenAIChat.NewMeter()
	m.Event(streamgate.Event{Data: []byte(`{"choices":[{"index":0,"delta":{"content":"Hello"}}],"usage":null}`)})
	if got := m.Usage(); got != (Usage{}) {
		t.Errorf("Usage() = %+v, want nothing known", got)
	}

	// Anthropic stream cut after message_start: input is known, output is
	// only the placeholder floor.
	m = AnthropicMessages.NewMeter()
	m.Event(streamgate.Event{Name: "message_start", Data: []byte(`{"type":"message_start","message":{"usage":{"input_tokens":30,"output_tokens":1}}}`)})
	if got := m.Usage(); got != (Usage{Input: 30, Output: 1, InputKnown: true}) {
		t.Errorf("Usage() = %+v", got)
	}

	// Embeddings have no output: the input count completes the report.
	m = OpenAIEmbeddings.NewMeter()
	m.Body([]byte(`{"usage":{"prompt_tokens":8,"total_tokens":8}}`))
	if got := m.Usage(); got != (Usage{Input: 8, InputKnown: true, OutputKnown: true}) {
		t.Errorf("embeddings Usage() = %+v", got)
	}
}

func TestIsUsageOnlyChunk(t *testing.T) {
	cases := []struct {
		data string
		want bool
	}{
		{`{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`, true},
		{`{"id":"c","object":"chat.completion.chunk","usage":{"prompt_tokens":1,"completion_tokens":2}}`, true},
		{`{"id":"c","choices":[{"index":0,"delta":{"content":"x"}}],"usage":null}`, false},
		{`{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`, false},
		{`{"id":"c","choices":[],"usage":null}`, false},
		{`{"id":"c","choices":[{"index":0,"delta":{"content":"\"usage\""}}]}`, false},
		{`[DONE]`, false},
		{`{"usage":`, false},
	}
	for _, c := range cases {
		if got := isUsageOnlyChunk(streamgate.Event{Data: []byte(c.data)}); got != c.want {
			t.Errorf("isUsageOnlyChunk(%s) = %v, want %v", c.data, got, c.want)
		}
	}
}

func BenchmarkMeterOpenAIChunk(b *testing.B) {
	chunk := []byte(`{"id":"chatcmpl-B9","object":"chat.completion.chunk","created":1727000000,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}`)
	m := OpenAIChat.NewMeter()
	b.ReportAllocs()
	for b.Loop() {
		m.Event(streamgate.Event{Data: chunk})
	}
}

// TestMeterDeliveredTokens: the delivered estimate counts the decoded
// content text only, never the JSON or SSE around it, and never a
// completed event's repeat of the whole answer.
func TestMeterDeliveredTokens(t *testing.T) {
	for _, tt := range []struct {
		api    API
		stream string
		text   string
	}{
		{OpenAIChat, openAIChatStream, `Hello! The word "usage" appears here.`},
		{OpenAIResponses, responsesStream, "Hi there"},
		{AnthropicMessages, anthropicStream, "Hello"},
		{OpenAICompletions, `data: {"choices":[{"text":"def f(x):\n    return x","index":0}]}`, "def f(x):\n    return x"},
		{OpenAIChat, `data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":\"Paris\"}"}}]}}]}`, `{"city":"Paris"}`},
		{AnthropicMessages, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Let me think step by step\"}}", "Let me think step by step"},
	} {
		m := tt.api.NewMeter()
		sse(m, tt.stream)
		if got, want := m.DeliveredTokens(), EstimateTokens([]byte(tt.text)); got != want || want == 0 {
			t.Errorf("%s: delivered %d tokens, the text alone is %d", tt.api, got, want)
		}
	}
	for _, tt := range []struct {
		api  API
		body string
		text string
	}{
		{OpenAIChat, `{"choices":[{"message":{"role":"assistant","content":"Four score and seven years ago"}}]}`, "Four score and seven years ago"},
		{OpenAIResponses, `{"output":[{"type":"message","content":[{"type":"output_text","text":"Hi there"}]}]}`, "Hi there"},
		{AnthropicMessages, `{"content":[{"type":"text","text":"Hello, world"}]}`, "Hello, world"},
	} {
		m := tt.api.NewMeter()
		m.Body([]byte(tt.body))
		if got, want := m.DeliveredTokens(), EstimateTokens([]byte(tt.text)); got != want || want == 0 {
			t.Errorf("%s body: delivered %d tokens, the text alone is %d", tt.api, got, want)
		}
	}
}

// Every provider's usage shape with prompt-cache fields: the meter
// reports all input as Input and says which part of it each cache class
// is, so that each is billed at its own price.
func TestMeterCacheClasses(t *testing.T) {
	for _, tt := range []struct {
		name   string
		api    API
		body   string
		events []string
		want   Usage
	}{
		{name: "openai chat (and azure, gemini) cached prompt", api: OpenAIChat,
			body: `{"id":"c","object":"chat.completion","choices":[],"usage":{"prompt_tokens":2006,"completion_tokens":300,"total_tokens":2306,"prompt_tokens_details":{"cached_tokens":1920,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}`,
			want: Usage{Input: 2006, Output: 300, InputKnown: true, OutputKnown: true, CacheRead: 1920}},
		{name: "openai chat stream usage chunk", api: OpenAIChat,
			events: []string{`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}],"usage":null}`,
				`{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":1200,"completion_tokens":7,"total_tokens":1207,"prompt_tokens_details":{"cached_tokens":1024}}}`},
			want: Usage{Input: 1200, Output: 7, InputKnown: true, OutputKnown: true, CacheRead: 1024}},
		{name: "openai details without cached tokens", api: OpenAIChat,
			body: `{"usage":{"prompt_tokens":9,"completion_tokens":1,"prompt_tokens_details":{"audio_tokens":0}}}`,
			want: Usage{Input: 9, Output: 1, InputKnown: true, OutputKnown: true}},
		{name: "responses cached input", api: OpenAIResponses,
			body: `{"id":"resp_1","object":"response","status":"completed","output":[],"usage":{"input_tokens":5000,"input_tokens_details":{"cached_tokens":4864},"output_tokens":20,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":5020}}`,
			want: Usage{Input: 5000, Output: 20, InputKnown: true, OutputKnown: true, CacheRead: 4864}},
		{name: "anthropic (and vertex, bedrock) 5m and 1h writes", api: AnthropicMessages,
			body: `{"id":"msg_1","type":"message","content":[],"usage":{"input_tokens":40,"cache_creation_input_tokens":3000,"cache_read_input_tokens":10000,"cache_creation":{"ephemeral_5m_input_tokens":1000,"ephemeral_1h_input_tokens":2000},"output_tokens":90}}`,
			want: Usage{Input: 13040, Output: 90, InputKnown: true, OutputKnown: true, CacheRead: 10000, CacheWrite: 1000, CacheWrite1h: 2000}},
		{name: "anthropic stream, writes not split", api: AnthropicMessages,
			events: []string{`{"type":"message_start","message":{"usage":{"input_tokens":4,"cache_creation_input_tokens":1500,"cache_read_input_tokens":0,"output_tokens":1}}}`,
				`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":12}}`},
			want: Usage{Input: 1504, Output: 12, InputKnown: true, OutputKnown: true, CacheWrite: 1500}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := tt.api.NewMeter()
			if tt.body != "" {
				m.Body([]byte(tt.body))
			}
			for _, ev := range tt.events {
				m.Event(streamgate.Event{Data: []byte(ev)})
			}
			got := m.Usage()
			if got != tt.want {
				t.Fatalf("Usage() = %+v, want %+v", got, tt.want)
			}
			if want := tt.want.Input - tt.want.CacheRead - tt.want.CacheWrite - tt.want.CacheWrite1h; got.PlainInput() != want {
				t.Errorf("PlainInput() = %d, want %d", got.PlainInput(), want)
			}
		})
	}
	// A report whose cache classes exceed its input has no negative plain input.
	if p := (Usage{Input: 10, CacheRead: 40}).PlainInput(); p != 0 {
		t.Errorf("PlainInput of an inconsistent report = %d", p)
	}
}

// OpenAI's usage object, details and all, is read by the one-walk decode,
// not handed to json.Unmarshal: the answer every OpenAI request gets
// (FuzzOpenAIUsage holds the two to the same result).
func TestOpenAIUsageFastPath(t *testing.T) {
	var c openAIUsage
	v := []byte(`{"prompt_tokens":12,"completion_tokens":38,"total_tokens":50,"prompt_tokens_details":{"cached_tokens":8,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0}}`)
	if !c.decode(v) {
		t.Fatal("the fast decode refused OpenAI's usage object")
	}
	if c.PromptTokens == nil || *c.PromptTokens != 12 || c.CompletionTokens == nil || *c.CompletionTokens != 38 || c.cached() != 8 {
		t.Fatalf("decoded %+v", c)
	}
	// A refusal changes nothing, details included.
	before := *c.PromptTokensDetails
	if c.decode([]byte(`{"prompt_tokens_details":{"cached_tokens":9},"prompt_tokens":"x"}`)) {
		t.Fatal("a string count accepted")
	}
	if *c.PromptTokensDetails != before || *c.PromptTokens != 12 {
		t.Fatalf("a refused decode changed %+v", c)
	}
}

// A body repeating "usage" (valid JSON: keys may repeat) is read as
// json.Unmarshal would, last one wins, without the meter holding a value
// per repetition: an upstream's answer must not make the gateway allocate
// more than the answer itself.
func TestUsageBodyRepeatedKeysAllocateNothing(t *testing.T) {
	const reps = 100_000
	body := []byte("{" + strings.Repeat(`"usage":null,`, reps) + `"usage":{"prompt_tokens":3},"usage":{"completion_tokens":4}}`)
	m := OpenAIChat.NewMeter()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	m.Body(body)
	runtime.ReadMemStats(&after)
	u := m.Usage()
	if !u.InputKnown || u.Input != 3 || !u.OutputKnown || u.Output != 4 {
		t.Fatalf("usage %+v, want 3 in and 4 out", u)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<10 {
		t.Fatalf("reading the usage of a %d KiB body allocated %d KiB", len(body)>>10, grew>>10)
	}
	// The same in an event, and a body broken after its usage reports
	// nothing (as before).
	m = OpenAIChat.NewMeter()
	m.Body([]byte(`{"usage":{"prompt_tokens":3,"completion_tokens":4},`))
	if u := m.Usage(); u.InputKnown || u.OutputKnown {
		t.Fatalf("a broken body reported %+v", u)
	}
	m = OpenAIChat.NewMeter()
	m.Body([]byte(`{"usage":{"prompt_tokens":3},"usage":{"prompt_tokens":1.5},"usage":null}`))
	if u := m.Usage(); !u.Garbled {
		t.Fatalf("a garbled report before a null: %+v, want garbled (json.Unmarshal stops at it)", u)
	}
}

// Anthropic's message_delta repeats the cumulative input counts
// (input_tokens, cache_creation_input_tokens, cache_read_input_tokens)
// but, unlike message_start's usage, has no cache_creation object
// splitting the writes by lifetime. The hour's writes message_start
// reported stay hour's writes, billed at their price, not the 5-minute one.
func TestMeterAnthropicDeltaKeepsHourWrites(t *testing.T) {
	m := AnthropicMessages.NewMeter()
	for _, ev := range []string{
		`{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"usage":{"input_tokens":40,"cache_creation_input_tokens":3000,"cache_read_input_tokens":10000,"cache_creation":{"ephemeral_5m_input_tokens":1000,"ephemeral_1h_input_tokens":2000},"output_tokens":1}}}`,
		`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":40,"cache_creation_input_tokens":3000,"cache_read_input_tokens":10000,"output_tokens":90}}`,
	} {
		m.Event(streamgate.Event{Data: []byte(ev)})
	}
	want := Usage{Input: 13040, Output: 90, InputKnown: true, OutputKnown: true, CacheRead: 10000, CacheWrite: 1000, CacheWrite1h: 2000}
	if got := m.Usage(); got != want {
		t.Fatalf("Usage() = %+v, want %+v", got, want)
	}
}
