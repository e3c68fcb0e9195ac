package provider

import (
	"encoding/json"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

func antEvent(name, data string) streamgate.Event {
	return streamgate.Event{Name: name, Data: []byte(data)}
}

func textDelta(i int, text string) streamgate.Event {
	b, _ := json.Marshal(map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]string{"type": "text_delta", "text": text}})
	return antEvent("content_block_delta", string(b))
}

const textStart = `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`

// The prefill leaves out trailing white space (Anthropic refuses it), and
// the continuation's repeat of it is taken off, so the joined text is
// exact; the open block is continued, not restarted.
func TestSpliceJoinsOpenBlockExactly(t *testing.T) {
	tr := AnthropicMessages.NewTranscript(1 << 10)
	tr.Event(antEvent("content_block_start", textStart))
	tr.Event(textDelta(0, "Hello"))
	tr.Event(textDelta(0, " wide "))
	body, s, err := tr.Continue([]byte(`{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"hi"}]}`), Prefill)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(body), `{"content":"Hello wide","role":"assistant"}`) {
		t.Fatalf("body %s", body)
	}
	var out []byte
	for _, ev := range []streamgate.Event{antEvent("message_start", `{}`), antEvent("ping", `{}`),
		antEvent("content_block_start", textStart), textDelta(0, " "), textDelta(0, "world"), antEvent("content_block_stop", `{"type":"content_block_stop","index":0}`)} {
		out = s.Rewrite(out, ev)
	}
	got := string(out)
	if strings.Contains(got, "message_start") || strings.Contains(got, "ping") || strings.Contains(got, "content_block_start") {
		t.Fatalf("second preamble kept:\n%s", got)
	}
	if !strings.Contains(got, `"text":"world"`) || strings.Count(got, "event: content_block_delta") != 1 {
		t.Fatalf("the repeated white space was not taken off:\n%s", got)
	}
}

// After a closed block the continuation's blocks are numbered after it.
func TestSpliceNumbersAfterClosedBlock(t *testing.T) {
	tr := AnthropicMessages.NewTranscript(1 << 10)
	tr.Event(antEvent("content_block_start", textStart))
	tr.Event(textDelta(0, "Hi"))
	tr.Event(antEvent("content_block_stop", `{"type":"content_block_stop","index":0}`))
	_, s, err := tr.Continue([]byte(`{"messages":[{"role":"user","content":"hi"}]}`), Prefill)
	if err != nil {
		t.Fatal(err)
	}
	out := string(s.Rewrite(nil, antEvent("content_block_start", textStart)))
	if !strings.Contains(out, `"index":1`) {
		t.Fatalf("%s", out)
	}
}

// Non-text content, text over the cap, or a request ending in its own
// prefill are never continued.
func TestTranscriptRefuses(t *testing.T) {
	req := []byte(`{"messages":[{"role":"user","content":"hi"}]}`)
	tool := AnthropicMessages.NewTranscript(1 << 10)
	tool.Event(antEvent("content_block_start", `{"index":0,"content_block":{"type":"tool_use","id":"x","name":"f","input":{}}}`))
	capped := AnthropicMessages.NewTranscript(3)
	capped.Event(antEvent("content_block_start", textStart))
	capped.Event(textDelta(0, "four"))
	prefilled := AnthropicMessages.NewTranscript(1 << 10)
	prefilled.Event(antEvent("content_block_start", textStart))
	prefilled.Event(textDelta(0, "ok"))
	for name, c := range map[string]struct {
		tr   *Transcript
		body []byte
	}{"tool_use": {tool, req}, "cap": {capped, req}, "prefill": {prefilled, []byte(`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"x"}]}`)},
		"output_format": {prefilled, []byte(`{"messages":[{"role":"user","content":"hi"}],"output_format":{"type":"json_schema","schema":{}}}`)},
		"output_config": {prefilled, []byte(`{"messages":[{"role":"user","content":"hi"}],"output_config":{"format":{"type":"json_schema","schema":{}}}}`)}} {
		if _, _, err := c.tr.Continue(c.body, Prefill); err == nil {
			t.Errorf("%s: continued", name)
		}
	}
	// Without structured output (output_config may say other things) it
	// continues.
	if _, _, err := prefilled.Continue([]byte(`{"messages":[{"role":"user","content":"hi"}],"output_config":{"effort":"low"},"output_format":null}`), Prefill); err != nil {
		t.Errorf("plain request not continued: %v", err)
	}
	// A Responses stream has no prefill: its Transcript refuses at once,
	// and says why.
	if _, _, err := OpenAIResponses.NewTranscript(10).Continue(req, Prefill); err == nil || !strings.Contains(err.Error(), "Responses API") {
		t.Errorf("Responses continued, or without a reason: %v", err)
	}
	if OpenAIEmbeddings.NewTranscript(10) != nil {
		t.Error("embeddings have no stream to continue")
	}
}

// A stream that can no longer be continued (here: more text than the
// cap) needs none of its text, yet went on holding it, up to the cap
// (16 MiB), for as long as the stream lasts: an endless stream of small
// deltas kept 24 MiB of heap for its whole life. A refused Transcript
// lets its text go.
func TestRefusedTranscriptLetsItsTextGo(t *testing.T) {
	const streams, capBytes = 16, 1 << 20
	delta := textDelta(0, strings.Repeat("a", 1000))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	trs := make([]*Transcript, streams)
	for i := range trs {
		trs[i] = AnthropicMessages.NewTranscript(capBytes)
		trs[i].Event(antEvent("content_block_start", textStart))
		for range capBytes/1000 + 10 { // past the cap: refused
			trs[i].Event(delta)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	for _, tr := range trs {
		if _, _, err := tr.Continue([]byte(`{"messages":[{"role":"user","content":"hi"}]}`), Prefill); err == nil {
			t.Fatal("a transcript past its cap was continued")
		}
	}
	if grown := int64(after.HeapInuse) - int64(before.HeapInuse); grown > 2<<20 {
		t.Fatalf("%d refused transcripts still hold %d KiB", streams, grown>>10)
	}
	runtime.KeepAlive(trs)
}

// FuzzTranscript: no event sequence panics, and whatever Continue accepts
// is a valid JSON request.
func FuzzTranscript(f *testing.F) {
	f.Add("content_block_start", textStart, `{"index":0,"delta":{"type":"text_delta","text":"a "}}`)
	f.Fuzz(func(t *testing.T, name, d1, d2 string) {
		tr := AnthropicMessages.NewTranscript(64)
		tr.Event(antEvent(name, d1))
		tr.Event(antEvent("content_block_delta", d2))
		body, s, err := tr.Continue([]byte(`{"messages":[{"role":"user","content":"hi"}]}`), Prefill)
		if err != nil {
			return
		}
		if !json.Valid(body) {
			t.Fatalf("invalid body %s", body)
		}
		_ = s.Rewrite(nil, antEvent(name, d1))
		_ = s.Rewrite(nil, antEvent("content_block_delta", d2))
	})
}

// A Messages stream that sent its stop_reason has finished, whatever
// broke after it: continuing it gave the client a second message_delta,
// more text, and a second charge.
func TestFinishedMessagesAnswerIsNotContinued(t *testing.T) {
	tr := AnthropicMessages.NewTranscript(1 << 10)
	tr.Event(antEvent("content_block_start", textStart))
	tr.Event(textDelta(0, "Hello there."))
	tr.Event(antEvent("content_block_stop", `{"type":"content_block_stop","index":0}`))
	tr.Event(antEvent("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":3}}`))
	_, _, err := tr.Continue([]byte(`{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`), Prefill)
	if !errors.Is(err, ErrNotContinuable) || !strings.Contains(err.Error(), "finished") {
		t.Fatalf("Continue after a stop_reason: %v", err)
	}
}

// A continuation asks for what is left of the client's output limit, not
// the whole of it again: 100 allowed and about 80 delivered leaves about
// 20 (Messages and chat); a limit the delivered text used up is not
// continued.
func TestContinuationAsksForWhatIsLeftOfTheLimit(t *testing.T) {
	delivered := strings.Repeat("word ", 80)
	used := EstimateTokens([]byte(delivered))
	if used < 40 || used > 99 {
		t.Fatalf("the estimate of the delivered text is %d tokens; the test wants between 40 and 99", used)
	}
	tr := AnthropicMessages.NewTranscript(1 << 12)
	tr.Event(antEvent("content_block_start", textStart))
	tr.Event(textDelta(0, delivered))
	body, _, err := tr.Continue([]byte(`{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`), Prefill)
	var req struct {
		MaxTokens int64 `json:"max_tokens"`
	}
	if err != nil || json.Unmarshal(body, &req) != nil || req.MaxTokens != 100-used {
		t.Fatalf("Messages continuation: max_tokens %d, want %d (err %v): %s", req.MaxTokens, 100-used, err, body)
	}
	if _, _, err := tr.Continue([]byte(`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`), Prefill); !errors.Is(err, ErrNotContinuable) {
		t.Errorf("a limit the delivered text used up was continued: %v", err)
	}

	ch := OpenAIChat.NewTranscript(1 << 12)
	ch.Event(streamgate.Event{Data: []byte(`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt","choices":[{"index":0,"delta":{"role":"assistant","content":` + strconv.Quote(delivered) + `},"finish_reason":null}]}`)})
	body, _, err = ch.Continue([]byte(`{"model":"gpt","max_completion_tokens":100,"stream":true,"messages":[{"role":"user","content":"hi"}]}`), Prefill)
	var creq struct {
		MaxCompletionTokens int64 `json:"max_completion_tokens"`
	}
	if err != nil || json.Unmarshal(body, &creq) != nil || creq.MaxCompletionTokens != 100-used {
		t.Fatalf("chat continuation: max_completion_tokens %d, want %d (err %v): %s", creq.MaxCompletionTokens, 100-used, err, body)
	}
}

// A continuation that opens with a tool_use while the client's text block
// is still open closes that block and numbers the tool_use after it, so
// the client's message holds the text and the tool call.
func TestSpliceKeepsAToolUseThatOpensTheContinuation(t *testing.T) {
	tr := AnthropicMessages.NewTranscript(1 << 10)
	tr.Event(antEvent("content_block_start", textStart))
	tr.Event(textDelta(0, "I'll check the weather."))
	_, s, err := tr.Continue([]byte(`{"model":"m","max_tokens":500,"tools":[{"name":"weather","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"weather?"}]}`), Prefill)
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	for _, ev := range []streamgate.Event{
		antEvent("message_start", `{}`),
		antEvent("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"weather","input":{}}}`),
		antEvent("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"city\":\"Paris\"}"}}`),
		antEvent("content_block_stop", `{"type":"content_block_stop","index":0}`),
		antEvent("message_delta", `{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":9}}`),
	} {
		out = s.Rewrite(out, ev)
	}
	got := string(out)
	want := []string{
		`event: content_block_stop` + "\n" + `data: {"index":0,"type":"content_block_stop"}`,
		`"content_block":{"type":"tool_use","id":"toolu_1","name":"weather","input":{}},"index":1`,
		`"delta":{"type":"input_json_delta","partial_json":"{\"city\":\"Paris\"}"},"index":1`,
		`event: content_block_stop` + "\n" + `data: {"index":1,"type":"content_block_stop"}`,
	}
	last := -1
	for _, w := range want {
		i := strings.Index(got, w)
		if i <= last {
			t.Fatalf("the spliced stream lacks, or misorders, %s:\n%s", w, got)
		}
		last = i
	}
}
