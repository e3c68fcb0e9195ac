package provider

import (
	"encoding/json"
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
	body, s, err := tr.Continue([]byte(`{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"hi"}]}`))
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
	_, s, err := tr.Continue([]byte(`{"messages":[{"role":"user","content":"hi"}]}`))
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
		if _, _, err := c.tr.Continue(c.body); err == nil {
			t.Errorf("%s: continued", name)
		}
	}
	// Without structured output (output_config may say other things) it
	// continues.
	if _, _, err := prefilled.Continue([]byte(`{"messages":[{"role":"user","content":"hi"}],"output_config":{"effort":"low"},"output_format":null}`)); err != nil {
		t.Errorf("plain request not continued: %v", err)
	}
	// A Responses stream has no prefill: its Transcript refuses at once,
	// and says why.
	if _, _, err := OpenAIResponses.NewTranscript(10).Continue(req); err == nil || !strings.Contains(err.Error(), "Responses API") {
		t.Errorf("Responses continued, or without a reason: %v", err)
	}
	if OpenAIEmbeddings.NewTranscript(10) != nil {
		t.Error("embeddings have no stream to continue")
	}
}

// FuzzTranscript: no event sequence panics, and whatever Continue accepts
// is a valid JSON request.
func FuzzTranscript(f *testing.F) {
	f.Add("content_block_start", textStart, `{"index":0,"delta":{"type":"text_delta","text":"a "}}`)
	f.Fuzz(func(t *testing.T, name, d1, d2 string) {
		tr := AnthropicMessages.NewTranscript(64)
		tr.Event(antEvent(name, d1))
		tr.Event(antEvent("content_block_delta", d2))
		body, s, err := tr.Continue([]byte(`{"messages":[{"role":"user","content":"hi"}]}`))
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
