package provider

import (
	"github.com/llmfailover/caddy-llm-failover/internal/shapes"
	"github.com/llmfailover/caddy-llm-failover/streamgate"
	"strings"
	"testing"
)

// benchBody is a realistic ~2 KB OpenAI chat request: a system prompt, a
// short conversation, one image and a tool definition.
var benchBody = []byte(`{
  "model": "gpt-4o-2024-08-06",
  "stream": true,
  "stream_options": {"include_usage": true},
  "temperature": 0.2,
  "max_completion_tokens": 2048,
  "messages": [
    {"role": "system", "content": "You are a meticulous assistant for an e-commerce support team. Answer in the customer's language, cite order numbers exactly, never invent tracking codes, and escalate refunds above 500 EUR to a human agent. Keep answers under 120 words unless asked for detail."},
    {"role": "user", "content": "Hi, my order #A-99812 hasn't arrived yet. It was supposed to come last Tuesday. Can you check what's going on?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "lookup_order", "arguments": "{\"order_id\":\"A-99812\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"status\":\"in_transit\",\"carrier\":\"DHL\",\"eta\":\"2024-11-14\",\"last_scan\":\"Leipzig hub\"}"},
    {"role": "assistant", "content": "Your order #A-99812 is in transit with DHL. The last scan was at the Leipzig hub and the new estimated delivery date is 14 November."},
    {"role": "user", "content": [
      {"type": "text", "text": "The box that arrived for my other order looks like this, is it damaged enough for a return?"},
      {"type": "image_url", "image_url": {"url": "https://cdn.example.com/uploads/8f3a1c/photo.jpg", "detail": "low"}}
    ]}
  ],
  "tools": [
    {"type": "function", "function": {"name": "lookup_order", "description": "Look up the shipping status of an order by its id.", "parameters": {"type": "object", "properties": {"order_id": {"type": "string", "description": "Order id such as A-12345"}}, "required": ["order_id"]}}},
    {"type": "function", "function": {"name": "open_return", "description": "Open a return for an order with a reason and optional photo.", "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}, "reason": {"type": "string", "enum": ["damaged", "wrong_item", "not_needed"]}, "photo_url": {"type": "string"}}, "required": ["order_id", "reason"]}}}
  ],
  "tool_choice": "auto",
  "user": "customer-18842"
}`)

func TestBenchBody(t *testing.T) {
	if n := len(benchBody); n < 1800 || n > 2600 {
		t.Errorf("bench body is %d bytes, want about 2 KB", n)
	}
	r := mustParse(t, benchBody)
	want := Request{Model: "gpt-4o-2024-08-06", Stream: true, MaxOutput: 2048, N: 1, IncludeUsage: true, HasStreamOptions: true, Images: 2}
	r.modelStart, r.modelEnd = 0, 0
	if r != want {
		t.Errorf("got %+v, want %+v", r, want)
	}
	out := mustParse(t, benchBody).WithModel(benchBody, "gpt-4o")
	if strings.Count(string(out), `"gpt-4o"`) != 1 || len(out) != len(benchBody)-len("-2024-08-06") {
		t.Errorf("WithModel result unexpected: %d bytes", len(out))
	}
}

var sinkReq Request
var sinkBytes []byte

func BenchmarkParseRequest(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(benchBody)))
	for b.Loop() {
		r, err := OpenAIChat.ParseRequest(benchBody)
		if err != nil {
			b.Fatal(err)
		}
		sinkReq = r
	}
}

func BenchmarkWithModel(b *testing.B) {
	r := mustParse(b, benchBody)
	b.ReportAllocs()
	b.SetBytes(int64(len(benchBody)))
	for b.Loop() {
		sinkBytes = r.WithModel(benchBody, "gpt-4o")
	}
}

func BenchmarkClassify(b *testing.B) {
	for _, bc := range []struct {
		name string
		api  API
		ev   streamgate.Event
	}{
		{"chat/content", OpenAIChat, streamgate.Event{Data: []byte(shapes.ChatContent)}},
		{"chat/role", OpenAIChat, streamgate.Event{Data: []byte(shapes.ChatRole)}},
		{"chat/usage", OpenAIChat, streamgate.Event{Data: []byte(shapes.ChatUsage)}},
		{"responses/named", OpenAIResponses, streamgate.Event{Name: "response.output_text.delta", Data: []byte(shapes.RespTextDelta)}},
		{"responses/by-type", OpenAIResponses, streamgate.Event{Data: []byte(shapes.RespTextDelta)}},
		{"anthropic/delta", AnthropicMessages, streamgate.Event{Name: "content_block_delta", Data: []byte(shapes.AntBlockDelta)}},
		{"anthropic/message_delta", AnthropicMessages, streamgate.Event{Name: "message_delta", Data: []byte(shapes.AntMsgDelta)}},
		{"generic", Unknown, streamgate.Event{Data: []byte(shapes.ChatContent)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.ev.Data)))
			for b.Loop() {
				bc.api.Classify(bc.ev)
			}
		})
	}
}

// BenchmarkMeterBody is the usage read of every billed chat answer: a
// usage object of counts only, and OpenAI's of today, with its
// prompt_tokens_details and completion_tokens_details on every answer.
func BenchmarkMeterBody(b *testing.B) {
	answer := `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"` + strings.Repeat("Hello there. ", 30) + `"},"finish_reason":"stop"}],"usage":`
	for _, bc := range []struct{ name, usage string }{
		{"counts", `{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}`},
		{"details", `{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			body := []byte(answer + bc.usage + "}")
			b.ReportAllocs()
			for b.Loop() {
				m := OpenAIChat.NewMeter()
				m.Body(body)
				if !m.Usage().OutputKnown {
					b.Fatal("no usage")
				}
			}
		})
	}
}

// What the meter and the gate's classifier cost a chat chunk, as the gate
// calls them (Observe, then Classify): one walk of the chunk since the
// meter keeps the kind for Classify (before, 2026-12-06: Meter.Event then
// API.Classify, two walks; see bench/README.md).
//
//	go test -run '^$' -bench ChunkMeterAndClassify -count 6 ./provider/
func BenchmarkChunkMeterAndClassify(b *testing.B) {
	for _, chunk := range []struct{ name, data string }{
		{"content", shapes.ChatContent}, {"tool_call", shapes.ChatToolCall}, {"finish", shapes.ChatFinish},
	} {
		ev := streamgate.Event{Data: []byte(chunk.data)}
		b.Run(chunk.name, func(b *testing.B) {
			m := OpenAIChat.NewMeter()
			b.ReportAllocs()
			b.SetBytes(int64(len(ev.Data)))
			for b.Loop() {
				m.Event(ev)
				m.Classify(ev)
			}
		})
	}
}
