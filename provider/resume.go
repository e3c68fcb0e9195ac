package provider

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

// ContinuationForm is how a channel is asked to continue an answer
// another channel broke off.
type ContinuationForm uint8

const (
	// CannotContinue: the channel is skipped for a resume.
	CannotContinue ContinuationForm = iota
	// Prefill sends the delivered text as the final assistant message,
	// which the upstream continues (older Claude models; hosts with a
	// prefix option, which the adapter sets).
	Prefill
	// Instructed sends the delivered text as an assistant turn and then a
	// user turn asking to continue it exactly where it stopped, for
	// upstreams with no prefill (the OpenAI API, Azure, Gemini, Claude
	// 4.6 and later). The answer's overlap with the delivered text is
	// trimmed, and an answer that starts over is trimmed or abandoned
	// (Joiner).
	Instructed
)

// String is the form's name, as logs, the seam and the docs say it.
func (f ContinuationForm) String() string {
	switch f {
	case Prefill:
		return "prefill"
	case Instructed:
		return "instructed"
	}
	return "none"
}

// Continuer is implemented by adapters whose upstream can be asked to go
// on with an answer another channel broke off. A channel whose adapter is
// no Continuer, or says CannotContinue, is skipped for a resume.
type Continuer interface {
	ContinuationForm(api API) ContinuationForm
}

// ContinuationForm: Messages takes a prefill, until a model refuses it
// (Claude 4.6 and later answer 400 "does not support assistant message
// prefill"; the caller then learns the instructed form for that model).
func (Anthropic) ContinuationForm(api API) ContinuationForm { return messagesForm(api) }

// ContinuationForm: Claude on Vertex as on Anthropic (the body goes
// through the same rewrite); other models through Vertex's OpenAI
// endpoint, which has no prefill, are instructed.
func (*Vertex) ContinuationForm(api API) ContinuationForm {
	if api == OpenAIChat {
		return Instructed
	}
	return messagesForm(api)
}

// ContinuationForm: Claude on Bedrock as on Anthropic; its event stream
// is decoded to SSE before the Splice reads it.
func (*Bedrock) ContinuationForm(api API) ContinuationForm { return messagesForm(api) }

// ContinuationForm: Azure OpenAI chat has no prefill.
func (*Azure) ContinuationForm(api API) ContinuationForm { return chatInstructed(api) }

// ContinuationForm: Gemini's OpenAI-compatible chat has no prefill.
func (*Gemini) ContinuationForm(api API) ContinuationForm { return chatInstructed(api) }

func messagesForm(api API) ContinuationForm {
	if api == AnthropicMessages {
		return Prefill
	}
	return CannotContinue
}

func chatInstructed(api API) ContinuationForm {
	if api == OpenAIChat {
		return Instructed
	}
	return CannotContinue
}

// PrefillRefused reports whether an upstream's error answer is the one a
// model that takes no prefill gives a continuation ("This model does not
// support assistant message prefill. The conversation must end with a
// user message."): the channel is fine, the form is wrong.
func PrefillRefused(status int, message string) bool {
	return status == 400 && strings.Contains(strings.ToLower(message), "prefill")
}

// Interface guards.
var (
	_ Continuer = Anthropic{}
	_ Continuer = OpenAI{}
	_ Continuer = (*Vertex)(nil)
	_ Continuer = (*Bedrock)(nil)
	_ Continuer = (*Azure)(nil)
	_ Continuer = (*Gemini)(nil)
)

// Transcript collects the text a committed stream delivered, so that
// another channel can be asked to continue it. It only vouches for plain
// text: anything a join could corrupt (tool calls, thinking, several
// choices, log probabilities, more text than its cap) makes it refuse,
// and it says why.
type Transcript struct {
	api       API
	text      strings.Builder
	cap       int
	why       string // set once refused: why the stream cannot be continued
	delivered bool   // some text was delivered

	// Messages: the last block started, and whether it is still open.
	index int
	open  bool

	// Chat: the first attempt's identity, which the continuation takes.
	chat chatIdentity
}

// Resumable reports whether a stream of a can be continued at all: its
// format carries text a continuation can be asked to go on from.
func (a API) Resumable() bool { return a == AnthropicMessages || a == OpenAIChat }

// NewTranscript returns a Transcript for a stream of api holding at most
// maxBytes of text, or nil when streams of api carry nothing to continue.
// A Responses stream gets a Transcript that refuses from the start, so
// that a break says why it was not resumed.
func (a API) NewTranscript(maxBytes int) *Transcript {
	switch {
	case a.Resumable():
		return &Transcript{api: a, cap: maxBytes}
	case a == OpenAIResponses:
		return &Transcript{api: a, why: "the Responses API has no assistant prefill to continue from"}
	}
	return nil
}

// refuse marks the stream as not continuable; the first reason stays.
// The text goes: a stream that is never continued needs none of it, and
// a long one would keep it (up to the cap) for the rest of its life.
func (t *Transcript) refuse(why string) {
	if t.why == "" {
		t.why = why
	}
	t.text = strings.Builder{}
}

// Event records one event the client was sent.
func (t *Transcript) Event(ev streamgate.Event) {
	if t.why != "" {
		return
	}
	switch t.api {
	case AnthropicMessages:
		t.messagesEvent(ev)
	case OpenAIChat:
		t.chatEvent(ev)
	}
}

// Text is the text delivered so far.
func (t *Transcript) Text() string { return t.text.String() }

// ErrNotContinuable says a stream or a request cannot be continued.
var ErrNotContinuable = errors.New("not continuable")

// Continue returns the request body that asks another channel, in form,
// to go on from the delivered text, and the Splice that fits its answer
// into the client's stream. A request that ends with its own assistant
// message is not continued (the delivered text would have to be merged
// into it).
func (t *Transcript) Continue(body []byte, form ContinuationForm) ([]byte, *Splice, error) {
	if t.why != "" {
		return nil, nil, fmt.Errorf("%s: %w", t.why, ErrNotContinuable)
	}
	if !t.delivered {
		return nil, nil, fmt.Errorf("no text delivered: %w", ErrNotContinuable)
	}
	if form != Prefill && form != Instructed {
		return nil, nil, fmt.Errorf("no continuation form: %w", ErrNotContinuable)
	}
	if t.api == OpenAIChat {
		return t.chatContinue(body, form)
	}
	return t.messagesContinue(body, form)
}

// continueInstruction is the user turn of an instructed continuation.
// It asks for the rest only, from the next character: the Joiner trims
// what a model repeats anyway.
const continueInstruction = "Your previous message was cut off mid-answer by a network failure. " +
	"Continue it from exactly where it stopped: output only the text that comes next, starting with the very next character " +
	"(even mid-word or mid-sentence), without repeating anything already written, without restarting, " +
	"and without any introduction or comment about the interruption."

// Splice rewrites a continuation's stream into the client's stream, as
// one answer.
type Splice struct {
	r rewriter
	// join is the instructed form's overlap check; nil for a prefill.
	join *Joiner
}

// rewriter is one API's Splice.
type rewriter interface {
	rewrite(dst []byte, ev streamgate.Event) []byte
	// trimStart sets the continuation text to take off the front of its
	// first text (the overlap with what was delivered).
	trimStart(s string)
}

// Rewrite appends to dst what the client gets for one event of the
// continuation.
func (s *Splice) Rewrite(dst []byte, ev streamgate.Event) []byte {
	if s.join != nil {
		s.r.trimStart(s.join.settle())
		s.join = nil
	}
	return s.r.rewrite(dst, ev)
}

// Joiner returns the overlap check an instructed continuation's stream
// must pass before it is committed, or nil for a prefill.
func (s *Splice) Joiner() *Joiner { return s.join }

// anthropicEvent is the part of a Messages stream event a Transcript and
// a Splice read.
type anthropicEvent struct {
	Index        *int `json:"index"`
	ContentBlock *struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content_block"`
	Delta *struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"delta"`
}

// messagesEvent records one event of a Messages stream.
func (t *Transcript) messagesEvent(ev streamgate.Event) {
	var e anthropicEvent
	switch ev.Name {
	case "message_delta":
		// A stop_reason is the answer's end, whatever comes after it: a
		// continuation would add a second message_delta, more text and
		// a second charge to an answer the client already has whole.
		var d struct {
			Delta struct {
				StopReason *string `json:"stop_reason"`
			} `json:"delta"`
		}
		if ev.Overflow || json.Unmarshal(ev.Data, &d) != nil || d.Delta.StopReason != nil {
			t.refuse("the answer had finished")
		}
		return
	case "content_block_start", "content_block_delta", "content_block_stop":
		if ev.Overflow || json.Unmarshal(ev.Data, &e) != nil || e.Index == nil {
			t.refuse("a malformed content block event")
			return
		}
	default:
		return
	}
	switch ev.Name {
	case "content_block_start":
		if t.open || t.delivered || e.ContentBlock == nil || e.ContentBlock.Type != "text" || e.ContentBlock.Text != "" {
			t.refuse("a content block that is not the one text block")
			return
		}
		t.index, t.open = *e.Index, true
	case "content_block_delta":
		if !t.open || *e.Index != t.index || e.Delta == nil || e.Delta.Type != "text_delta" {
			t.refuse("a delta that is not text")
			return
		}
		if t.text.Len()+len(e.Delta.Text) > t.cap {
			t.refuse("more text than the resume cap")
			return
		}
		t.text.WriteString(e.Delta.Text)
		t.delivered = t.delivered || e.Delta.Text != ""
	case "content_block_stop":
		t.open = false
	}
}

// messagesContinue is Continue for a Messages stream.
func (t *Transcript) messagesContinue(body []byte, form ContinuationForm) ([]byte, *Splice, error) {
	var req map[string]json.RawMessage
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, nil, fmt.Errorf("request: %w", err)
	}
	var msgs []struct {
		Role string `json:"role"`
	}
	if err := json.Unmarshal(req["messages"], &msgs); err != nil || len(msgs) == 0 {
		return nil, nil, fmt.Errorf("request messages: %w", ErrNotContinuable)
	}
	if msgs[len(msgs)-1].Role == "assistant" {
		return nil, nil, fmt.Errorf("request ends with an assistant prefill: %w", ErrNotContinuable)
	}
	// Structured output (output_format, or output_config's format) is one
	// JSON document: a join could break it, and Anthropic does not take a
	// prefill with it.
	var config struct {
		Format json.RawMessage `json:"format"`
	}
	_ = json.Unmarshal(req["output_config"], &config)
	if len(req["output_format"]) > 0 && string(req["output_format"]) != "null" || len(config.Format) > 0 && string(config.Format) != "null" {
		return nil, nil, fmt.Errorf("request asks for structured output: %w", ErrNotContinuable)
	}
	// Anthropic refuses a final assistant message that ends in white
	// space; the continuation is expected to start with it again, and the
	// Splice takes it off.
	text := t.text.String()
	prefill := strings.TrimRight(text, " \t\r\n")
	if prefill == "" {
		return nil, nil, fmt.Errorf("only white space delivered: %w", ErrNotContinuable)
	}
	if err := lessDelivered(req, "max_tokens", text); err != nil {
		return nil, nil, err
	}
	var all []json.RawMessage
	_ = json.Unmarshal(req["messages"], &all)
	s := &messagesSplice{joinOpen: t.open, first: -1, text: -1}
	splice := &Splice{r: s}
	if form == Prefill {
		msg, _ := json.Marshal(map[string]string{"role": "assistant", "content": prefill})
		all = append(all, msg)
		s.trim = text[len(prefill):]
	} else {
		// Not the final message, so it may end in white space: it is the
		// text exactly as the client has it.
		msg, _ := json.Marshal(map[string]string{"role": "assistant", "content": text})
		ask, _ := json.Marshal(map[string]string{"role": "user", "content": continueInstruction})
		all = append(all, msg, ask)
		splice.join = newJoiner(t.api, text)
	}
	req["messages"], _ = json.Marshal(all)
	out, err := json.Marshal(req)
	if err != nil {
		return nil, nil, fmt.Errorf("request: %w", err)
	}
	s.base = t.index + 1
	if t.open {
		s.base = t.index
	}
	return out, splice, nil
}

// messagesSplice rewrites a continuation's Messages stream into the
// client's stream: it drops the second message_start and its pings, joins the
// continuation's first text block to the block still open (or numbers it
// after the last one), keeps block indices continuous, and takes off the
// white space the prefill could not end with. message_delta (the one final
// usage) and message_stop pass unchanged.
type messagesSplice struct {
	trim     string // white space delivered but left out of the prefill
	joinOpen bool   // the first attempt's text block is still open
	base     int    // index the continuation's block 0 gets
	first    int    // the continuation's first block index, -1 before it
	text     int    // the continuation's first text block index, -1 before it
}

func (s *messagesSplice) trimStart(trim string) { s.trim = trim }

func (s *messagesSplice) rewrite(dst []byte, ev streamgate.Event) []byte {
	switch ev.Name {
	case "message_start", "ping":
		return dst
	case "content_block_start", "content_block_delta", "content_block_stop":
	default:
		return streamgate.AppendEvent(dst, ev.Name, ev.Data)
	}
	var fields map[string]json.RawMessage
	var e anthropicEvent
	if json.Unmarshal(ev.Data, &fields) != nil || json.Unmarshal(ev.Data, &e) != nil || e.Index == nil {
		return streamgate.AppendEvent(dst, ev.Name, ev.Data)
	}
	if s.first < 0 {
		s.first = *e.Index
	}
	if ev.Name == "content_block_start" && s.text < 0 && e.ContentBlock != nil && e.ContentBlock.Type == "text" {
		s.text = *e.Index
	}
	if ev.Name == "content_block_start" && s.joinOpen && *e.Index == s.first {
		if e.ContentBlock != nil && e.ContentBlock.Type == "text" {
			return dst // the client's block is still open: this one continues it
		}
		// The continuation opens with another kind of block (a tool_use
		// after "I'll check the weather."): the client's text block ends
		// here and this one is numbered after it. Joined, its start was
		// dropped and its input_json_delta events landed on the text
		// block: an SDK's message had the stop_reason tool_use and no
		// tool_use block.
		stop, _ := json.Marshal(map[string]any{"type": "content_block_stop", "index": s.base})
		dst = streamgate.AppendEvent(dst, "content_block_stop", stop)
		s.base++
		s.joinOpen = false
		if t := e.ContentBlock; t == nil || t.Type != "thinking" && t.Type != "redacted_thinking" {
			s.trim = ""
		} // after thinking, the repeat is taken off the text block that follows it
	}
	firstText := *e.Index == s.text || s.text < 0 && *e.Index == s.first
	if ev.Name == "content_block_delta" && firstText && s.trim != "" && e.Delta != nil && e.Delta.Type == "text_delta" {
		text := e.Delta.Text
		n := commonPrefix(text, s.trim)
		text, s.trim = text[n:], s.trim[n:]
		if n < len(e.Delta.Text) {
			s.trim = "" // the model went on differently: keep what it said
		}
		if text == "" {
			return dst
		}
		fields["delta"], _ = json.Marshal(map[string]string{"type": "text_delta", "text": text})
	}
	fields["index"], _ = json.Marshal(s.base + *e.Index - s.first)
	data, err := json.Marshal(fields)
	if err != nil {
		return streamgate.AppendEvent(dst, ev.Name, ev.Data)
	}
	return streamgate.AppendEvent(dst, ev.Name, data)
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// lessDelivered lowers the output limit named key of a continuation's
// request by the tokens already delivered (estimated, as an answer with
// no usage is billed), so that the answer as a whole stays within the
// client's limit: the continuation was sent the client's whole limit,
// and a resumed answer could be twice what it allowed, all of it billed.
// A limit the delivered text used up leaves nothing to continue.
func lessDelivered(req map[string]json.RawMessage, key, delivered string) error {
	raw, ok := req[key]
	var limit int64
	if !ok || json.Unmarshal(raw, &limit) != nil || limit <= 0 {
		return nil // none set (or not a count the upstream would take)
	}
	left := limit - EstimateTokens([]byte(delivered))
	if left < 1 {
		return fmt.Errorf("the client's %s was used by what was delivered: %w", key, ErrNotContinuable)
	}
	req[key], _ = json.Marshal(left)
	return nil
}
