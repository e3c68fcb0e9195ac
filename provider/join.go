package provider

import (
	"encoding/json"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/llmfailover/caddy-llm-failover/internal/jsonscan"
	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

// An instructed continuation is a new answer asked to pick up where the
// delivered text stopped. Models mostly do, but some repeat the last
// words first ("…quick bro" + "brown fox"), and a few start the whole
// answer over. The Joiner reads the continuation's first text before the
// client sees any of it and decides how much of it repeats the delivered
// text: the Splice takes that off, so the joined text never says
// anything twice. An answer that starts over and then says something
// else cannot be joined: it is abandoned, and the resume moves on.

const (
	// overlapWindow bounds the delivered tail a continuation may repeat
	// and be trimmed: a model that repeats more has started over.
	overlapWindow = 256
	// restartMin is how much of the delivered beginning a continuation
	// must repeat to count as starting over (less is a coincidence, like
	// a shared first word).
	restartMin = 16
)

type joinState uint8

const (
	joinUndecided joinState = iota
	joinJoined
	joinAbandoned
)

// Joiner decides where an instructed continuation's text joins the
// delivered text. Its Classify holds the continuation's stream (text
// counts as a preamble) until it has decided; a Joiner is used by one
// stream.
type Joiner struct {
	api       API
	delivered string

	mu    sync.Mutex
	got   strings.Builder // the continuation's text while undecided
	state joinState
	drop  int    // bytes of the continuation's text that repeat the delivered
	why   string // why it was abandoned
}

func newJoiner(api API, delivered string) *Joiner {
	return &Joiner{api: api, delivered: delivered}
}

// Classify wraps a continuation's event classifier. Until the join is
// decided its text is a Preamble, so the stream gate holds it; an answer
// that started over is an ErrorFrame, so the gate fails it over before
// the client sees a word of it.
func (j *Joiner) Classify(inner func(streamgate.Event) streamgate.Kind) func(streamgate.Event) streamgate.Kind {
	return func(ev streamgate.Event) streamgate.Kind {
		k := inner(ev)
		j.mu.Lock()
		defer j.mu.Unlock()
		if j.state == joinUndecided {
			if text, ok := j.text(ev); ok {
				j.got.WriteString(text)
				j.decide(k == streamgate.Terminal)
			} else if k == streamgate.Terminal || k == streamgate.Content && !j.reasoning(ev) {
				// Content that is not text (a tool call), or the end:
				// what there is decides. Reasoning does not (thinking
				// and its signature, a chat reasoning delta): the text
				// after it is what must join the delivered text.
				j.decide(true)
			}
		}
		switch j.state {
		case joinAbandoned:
			return streamgate.ErrorFrame
		case joinUndecided:
			if k == streamgate.Content {
				return streamgate.Preamble
			}
		}
		return k
	}
}

// Abandoned reports why the continuation was abandoned, or "".
func (j *Joiner) Abandoned() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.why
}

// settle decides with what it has, if it has not yet (the gate committed
// the stream for another reason: its hold bound), and returns the
// continuation text that repeats the delivered text.
func (j *Joiner) settle() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.state == joinUndecided {
		j.decide(true)
	}
	if j.state != joinJoined {
		return ""
	}
	got := j.got.String()
	j.got = strings.Builder{}
	return got[:min(j.drop, len(got))]
}

// decide judges the continuation text so far; final says no more is
// coming before the decision must be made.
func (j *Joiner) decide(final bool) {
	c, d := j.got.String(), j.delivered
	p := commonPrefix(c, d)
	if p > 0 && p >= min(len(d), restartMin) {
		// It repeats the answer's beginning: it started over.
		switch {
		case p == len(d):
			j.join(p) // it repeated all of it; what follows is new
		case p < len(c):
			j.abandon("the continuation started the answer over and then said something else")
		case final:
			j.abandon("the continuation started the answer over and stopped")
		}
		return
	}
	if !final && p == len(c) && len(c) < min(len(d), restartMin) {
		return // too little to tell a restart from a shared first word
	}
	window := min(len(d), overlapWindow)
	if !final && len(c) <= window && strings.Contains(d[len(d)-window:], c) {
		return // it may still turn out to repeat a longer tail
	}
	j.join(overlap(d, c, window))
}

func (j *Joiner) join(drop int) {
	c, d := j.got.String(), j.delivered
	// The delivered text ended in white space and the continuation
	// starts with more: one is enough.
	if d != "" && isSpace(d[len(d)-1]) {
		for drop < len(c) && isSpace(c[drop]) {
			drop++
		}
	}
	j.state, j.drop = joinJoined, drop
}

func (j *Joiner) abandon(why string) { j.state, j.why = joinAbandoned, why }

// overlap is the length of the longest prefix of c, at most window bytes,
// that the delivered text d ends with, where that tail starts a word (or
// is 4 bytes or more, or starts with punctuation or space): "bro" of
// "…quick bro" repeated as "brown" is an overlap, the "s" of "…cats" before
// "so" is not.
func overlap(d, c string, window int) int {
	for n := min(len(c), window); n > 0; n-- {
		if !strings.HasSuffix(d, c[:n]) {
			continue
		}
		at := len(d) - n
		first, _ := utf8.DecodeRuneInString(d[at:])
		prev, _ := utf8.DecodeLastRuneInString(d[:at])
		if n >= 4 || at == 0 || !isWordRune(prev) || !isWordRune(first) {
			return n
		}
	}
	return 0
}

func isWordRune(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }

func isSpace(b byte) bool { return b == ' ' || b == '\t' || b == '\n' || b == '\r' }

// reasoning reports whether an event of the continuation is reasoning
// before its answer (or a block's end), which leaves the join undecided.
func (j *Joiner) reasoning(ev streamgate.Event) bool {
	if ev.Overflow {
		return false
	}
	switch j.api {
	case AnthropicMessages:
		switch ev.Name {
		case "content_block_stop":
			return true
		case "content_block_delta":
			var e anthropicEvent
			return json.Unmarshal(ev.Data, &e) == nil && e.Delta != nil &&
				(e.Delta.Type == "thinking_delta" || e.Delta.Type == "signature_delta")
		}
	case OpenAIChat:
		if ev.Name != "" || isDone(ev.Data) {
			return false
		}
		var c struct {
			Choices []struct {
				Delta        map[string]json.RawMessage `json:"delta"`
				FinishReason json.RawMessage            `json:"finish_reason"`
			} `json:"choices"`
		}
		if json.Unmarshal(ev.Data, &c) != nil || len(c.Choices) != 1 ||
			len(c.Choices[0].FinishReason) > 0 && !jsonscan.IsNull(c.Choices[0].FinishReason) {
			return false
		}
		seen := false
		for k, v := range c.Choices[0].Delta {
			switch {
			case k == "reasoning_content" || k == "reasoning" || k == "reasoning_details":
				seen = seen || !jsonscan.IsEmpty(v)
			case chatContentKey([]byte(k)) && !jsonscan.IsEmpty(v):
				return false
			}
		}
		return seen
	}
	return false
}

// text is the answer text an event of the continuation carries, and
// whether it is a text event at all.
func (j *Joiner) text(ev streamgate.Event) (string, bool) {
	if ev.Overflow {
		return "", false
	}
	switch j.api {
	case AnthropicMessages:
		if ev.Name != "content_block_delta" {
			return "", false
		}
		var e anthropicEvent
		if json.Unmarshal(ev.Data, &e) != nil || e.Delta == nil || e.Delta.Type != "text_delta" {
			return "", false
		}
		return e.Delta.Text, true
	case OpenAIChat:
		if ev.Name != "" || isDone(ev.Data) {
			return "", false
		}
		var c struct {
			Choices []struct {
				Delta struct {
					Content *string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal(ev.Data, &c) != nil || len(c.Choices) == 0 || c.Choices[0].Delta.Content == nil {
			return "", false
		}
		return *c.Choices[0].Delta.Content, true
	}
	return "", false
}
