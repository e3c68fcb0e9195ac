package provider

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

// feedJoin runs continuation text deltas through a Joiner the way the
// stream gate would, and returns the kinds it reported.
func feedJoin(j *Joiner, evs ...streamgate.Event) []streamgate.Kind {
	classify := j.Classify(func(ev streamgate.Event) streamgate.Kind { return classifyAnthropic(ev.Name, ev.Data) })
	var kinds []streamgate.Kind
	for _, ev := range evs {
		kinds = append(kinds, classify(ev))
	}
	return kinds
}

// Where an instructed continuation joins: the repeat of the delivered
// tail or of the whole answer is trimmed, a fresh start after a shared
// first word is kept, and an answer that starts over and goes elsewhere
// is abandoned.
func TestJoinerDecides(t *testing.T) {
	long := "The quick brown fox jumps over the lazy dog, and then it runs into the woods to find its den before nightfall"
	for _, c := range []struct {
		name, delivered string
		deltas          []string
		drop            string // the continuation text taken off
		abandoned       bool
	}{
		{"goes on mid-word", "The quick bro", []string{"wn fox"}, "", false},
		{"repeats the partial word", "The quick bro", []string{"brown", " fox"}, "bro", false},
		{"repeats the last words", long, []string{"woods to find", " its den before nightfall. The end."}, "woods to find its den before nightfall", false},
		{"repeats the tail across deltas", long, []string{"before ", "night", "fall", ". Done"}, "before nightfall", false},
		{"no overlap, new sentence", long, []string{" It slept."}, "", false},
		{"a letter is no word's overlap", "I like cats", []string{"s and dogs"}, "", false},
		{"punctuation repeated", "It ended.", []string{". Then"}, ".", false},
		{"space after space", "Hello world. ", []string{" Next"}, " ", false},
		{"starts over, then goes on", "Once upon a time there was a king", []string{"Once upon a time", " there was a king", " who ruled."}, "Once upon a time there was a king", false},
		{"starts over differently", "Once upon a time there was a king", []string{"Once upon a time there", " lived a queen"}, "", true},
		{"shared first word is no restart", "The quick brown fox jumps over the lazy dog and runs", []string{"The", " end came soon."}, "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			j := newJoiner(AnthropicMessages, c.delivered)
			var evs []streamgate.Event
			for _, d := range c.deltas {
				evs = append(evs, textDelta(0, d))
			}
			kinds := feedJoin(j, evs...)
			if c.abandoned {
				if j.Abandoned() == "" || kinds[len(kinds)-1] != streamgate.ErrorFrame {
					t.Fatalf("not abandoned: %v %q", kinds, j.Abandoned())
				}
				return
			}
			if got := j.settle(); got != c.drop {
				t.Fatalf("dropped %q, want %q (kinds %v)", got, c.drop, kinds)
			}
			if kinds[len(kinds)-1] != streamgate.Content {
				t.Errorf("the last text is not content once decided: %v", kinds)
			}
		})
	}
}

// Undecided text is held as a preamble, so the gate commits nothing the
// Joiner may still trim or abandon; the end decides with what there is.
func TestJoinerHoldsUntilDecided(t *testing.T) {
	j := newJoiner(AnthropicMessages, "Once upon a time there was a king")
	kinds := feedJoin(j, textDelta(0, "Once upon"), textDelta(0, " a time there was"))
	for _, k := range kinds {
		if k != streamgate.Preamble {
			t.Fatalf("a possible restart was let through: %v", kinds)
		}
	}
	stop := antEvent("message_stop", `{"type":"message_stop"}`)
	if k := feedJoin(j, stop); k[0] != streamgate.ErrorFrame || !strings.Contains(j.Abandoned(), "stopped") {
		t.Fatalf("a restart that stopped was not abandoned: %v %q", k, j.Abandoned())
	}
}

// The Splice takes the decided overlap off the continuation's text, in
// Messages and in chat, across deltas.
func TestInstructedSpliceTrims(t *testing.T) {
	tr := AnthropicMessages.NewTranscript(1 << 10)
	tr.Event(antEvent("content_block_start", textStart))
	tr.Event(textDelta(0, "The quick bro"))
	body, s, err := tr.Continue([]byte(`{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`), Instructed)
	if err != nil {
		t.Fatal(err)
	}
	var req struct {
		Messages []struct{ Role, Content string } `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil || len(req.Messages) != 3 || req.Messages[1].Role != "assistant" ||
		req.Messages[1].Content != "The quick bro" || req.Messages[2].Role != "user" || req.Messages[2].Content != continueInstruction {
		t.Fatalf("instructed body: %s", body)
	}
	evs := []streamgate.Event{antEvent("message_start", `{}`), antEvent("content_block_start", textStart),
		textDelta(0, "b"), textDelta(0, "rown"), textDelta(0, " fox")}
	feedJoin(s.Joiner(), evs...)
	var text strings.Builder
	for _, ev := range rewriteAll(t, s, evs...) {
		var e anthropicEvent
		if json.Unmarshal(ev.Data, &e) == nil && e.Delta != nil {
			text.WriteString(e.Delta.Text)
		}
	}
	if got := text.String(); got != "wn fox" {
		t.Fatalf("continuation text %q, want %q", got, "wn fox")
	}

	ch := OpenAIChat.NewTranscript(1 << 10)
	ch.Event(chatChunk("a", "gpt", `{"role":"assistant","content":""}`, "null"))
	ch.Event(chatText("a", "It was the best of times, it was"))
	body, s, err = ch.Continue([]byte(chatReq), Instructed)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(body), `{"role":"assistant","content":"It was the best of times, it was"},{"role":"user","content":`) {
		t.Fatalf("instructed chat body: %s", body)
	}
	cevs := []streamgate.Event{chatChunk("b", "gpt", `{"role":"assistant","content":""}`, "null"), chatText("b", "it was"), chatText("b", " the worst"), chatText("b", " of times.")}
	classify := s.Joiner().Classify(func(ev streamgate.Event) streamgate.Kind { return classifyChat(ev.Data) })
	for _, ev := range cevs {
		classify(ev)
	}
	text.Reset()
	for _, ev := range rewriteAll(t, s, cevs...) {
		var c struct {
			ID      string `json:"id"`
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(ev.Data, &c); err != nil || c.ID != "a" {
			t.Fatalf("chunk %s: %v", ev.Data, err)
		}
		text.WriteString(c.Choices[0].Delta.Content)
	}
	if got := text.String(); got != " the worst of times." {
		t.Fatalf("chat continuation text %q", got)
	}
}

// A continuation that reasons before it answers (Claude's adaptive
// thinking, a chat host's reasoning deltas) is judged by its first text,
// not by its reasoning: the repeated tail is still taken off, and an
// answer that starts over after thinking is still abandoned unseen.
// Deciding on the first thinking delta joined with nothing dropped: the
// client's message read "The quick bro" + "brown fox".
func TestJoinerLooksPastReasoning(t *testing.T) {
	thinking := []streamgate.Event{
		antEvent("message_start", `{"type":"message_start","message":{"id":"msg_2","type":"message","role":"assistant","content":[],"usage":{"input_tokens":9,"output_tokens":1}}}`),
		antEvent("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}`),
		antEvent("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"The user wants the rest of the sentence."}}`),
		antEvent("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"EqQBCkYIARgCKkBsig"}}`),
		antEvent("content_block_stop", `{"type":"content_block_stop","index":0}`),
		antEvent("content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`),
	}
	t.Run("messages tail", func(t *testing.T) {
		tr := AnthropicMessages.NewTranscript(1 << 10)
		tr.Event(antEvent("content_block_start", textStart))
		tr.Event(textDelta(0, "The quick bro"))
		_, s, err := tr.Continue([]byte(`{"model":"m","max_tokens":2000,"thinking":{"type":"adaptive"},"messages":[{"role":"user","content":"hi"}]}`), Instructed)
		if err != nil {
			t.Fatal(err)
		}
		evs := append(append([]streamgate.Event(nil), thinking...), textDelta(1, "bro"), textDelta(1, "wn fox"),
			antEvent("content_block_stop", `{"type":"content_block_stop","index":1}`))
		feedJoin(s.Joiner(), evs...)
		var text strings.Builder
		for _, ev := range rewriteAll(t, s, evs...) {
			var e anthropicEvent
			if json.Unmarshal(ev.Data, &e) == nil && e.Delta != nil && e.Delta.Type == "text_delta" {
				text.WriteString(e.Delta.Text)
			}
		}
		if got := text.String(); got != "wn fox" {
			t.Fatalf("continuation text %q after thinking, want %q", got, "wn fox")
		}
	})
	t.Run("messages restart", func(t *testing.T) {
		j := newJoiner(AnthropicMessages, "Once upon a time there was a king")
		evs := append(append([]streamgate.Event(nil), thinking...), textDelta(1, "Once upon a time there"), textDelta(1, " lived a queen"))
		kinds := feedJoin(j, evs...)
		if j.Abandoned() == "" || kinds[len(kinds)-1] != streamgate.ErrorFrame {
			t.Fatalf("a restart after thinking was not abandoned: %v", kinds)
		}
	})
	t.Run("chat tail", func(t *testing.T) {
		ch := OpenAIChat.NewTranscript(1 << 10)
		ch.Event(chatChunk("a", "gpt", `{"role":"assistant","content":""}`, "null"))
		ch.Event(chatText("a", "It was the best of times, it was"))
		_, s, err := ch.Continue([]byte(chatReq), Instructed)
		if err != nil {
			t.Fatal(err)
		}
		cevs := []streamgate.Event{chatChunk("b", "gpt", `{"role":"assistant","content":""}`, "null"),
			chatChunk("b", "gpt", `{"reasoning":"Continue the quote."}`, "null"),
			chatText("b", "it was"), chatText("b", " the worst"), chatText("b", " of times.")}
		classify := s.Joiner().Classify(func(ev streamgate.Event) streamgate.Kind { return classifyChat(ev.Data) })
		for _, ev := range cevs {
			classify(ev)
		}
		var text strings.Builder
		for _, ev := range rewriteAll(t, s, cevs...) {
			var c struct {
				Choices []struct {
					Delta struct{ Content string } `json:"delta"`
				} `json:"choices"`
			}
			if json.Unmarshal(ev.Data, &c) == nil && len(c.Choices) > 0 {
				text.WriteString(c.Choices[0].Delta.Content)
			}
		}
		if got := text.String(); got != " the worst of times." {
			t.Fatalf("chat continuation text %q after reasoning, want %q", got, " the worst of times.")
		}
	})
}
