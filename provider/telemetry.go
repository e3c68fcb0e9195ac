package provider

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"

	"github.com/llmfailover/caddy-llm-failover/internal/jsonscan"
)

// What OpenTelemetry's GenAI semantic conventions call an operation and a
// provider, and what an answer says of itself (the model that produced
// it, why it finished), for the gateway's trace spans. It is read only
// when a request is traced: an untraced answer is not parsed for it.

// Operation is the API's gen_ai.operation.name: chat (chat completions,
// Responses, Messages), text_completion, embeddings; "" for the rest.
func (a API) Operation() string {
	switch a {
	case OpenAIChat, OpenAIResponses, AnthropicMessages:
		return "chat"
	case OpenAICompletions:
		return "text_completion"
	case OpenAIEmbeddings:
		return "embeddings"
	}
	return ""
}

// ProviderNamer is implemented by adapters whose provider has its own
// gen_ai.provider.name; the rest are "openai", whose format they speak.
type ProviderNamer interface {
	ProviderName() string
}

// ProviderName: anthropic.
func (Anthropic) ProviderName() string { return "anthropic" }

// ProviderName: azure.ai.openai.
func (*Azure) ProviderName() string { return "azure.ai.openai" }

// ProviderName: aws.bedrock.
func (*Bedrock) ProviderName() string { return "aws.bedrock" }

// ProviderName: gcp.vertex_ai.
func (*Vertex) ProviderName() string { return "gcp.vertex_ai" }

// ProviderName: gcp.gemini.
func (*Gemini) ProviderName() string { return "gcp.gemini" }

// ProviderNameOf is a's gen_ai.provider.name.
func ProviderNameOf(a Adapter) string {
	if n, ok := a.(ProviderNamer); ok {
		return n.ProviderName()
	}
	return "openai"
}

// Interface guards.
var (
	_ ProviderNamer = Anthropic{}
	_ ProviderNamer = (*Azure)(nil)
	_ ProviderNamer = (*Bedrock)(nil)
	_ ProviderNamer = (*Vertex)(nil)
	_ ProviderNamer = (*Gemini)(nil)
)

// Described is what an answer said of itself: the model that produced it
// and its finish reasons, in the provider's words (stop, length,
// end_turn, tool_use, …), one per choice.
type Described struct {
	Model         string
	FinishReasons []string
}

// Describe makes the meter read what each answer says of itself from
// now on (Described); without it nothing is parsed for it.
func (m *Meter) Describe() { m.describing = true }

// KeepText makes the meter keep the answer's text, its first max bytes
// (Text); without it the meter keeps no text.
func (m *Meter) KeepText(max int) {
	if max > 0 {
		m.content.keep = &textKeeper{max: max}
	}
}

// Text is the answer's text kept so far (KeepText), and whether it was
// cut at the bound.
func (m *Meter) Text() (text string, cut bool) {
	if m.content.keep == nil {
		return "", false
	}
	return m.content.keep.text()
}

// textKeeper keeps the text an estimator reads, as the raw contents of
// JSON strings (escapes and all), up to twice its bound (an escape takes
// more bytes than the character), decoded when read.
type textKeeper struct {
	raw []byte
	max int
	cut bool
}

func (k *textKeeper) add(raw []byte) {
	room := 2*k.max - len(k.raw)
	if len(raw) > room {
		raw, k.cut = raw[:max(room, 0)], true
	}
	k.raw = append(k.raw, raw...)
}

func (k *textKeeper) text() (string, bool) {
	s, cut := decodeJSONText(k.raw), k.cut
	if len(s) > k.max {
		s, cut = truncateUTF8(s, k.max), true
	}
	return s, cut
}

// decodeJSONText decodes the raw contents of JSON strings: its longest
// prefix that decodes, so a tail cut inside an escape is dropped, and so
// is everything from the first byte a JSON string may not hold (a control
// character, an invalid escape: the stream's walk does not check them).
// It decodes once: trying ever shorter prefixes cost a decode per byte.
func decodeJSONText(raw []byte) string {
	raw = raw[:jsonscan.ValidStringPrefix(raw)]
	if len(raw) == 0 {
		return ""
	}
	var s string
	quoted := make([]byte, 0, len(raw)+2)
	quoted = append(append(append(quoted, '"'), raw...), '"')
	if json.Unmarshal(quoted, &s) != nil {
		return ""
	}
	return s
}

// truncateUTF8 cuts s to at most n bytes, at a character boundary.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Prompt is what a request body asks: its system, instructions,
// messages, input and prompt members as sent (JSON), in one object, cut
// at max bytes; cut says whether it was.
func Prompt(body []byte, max int) (prompt string, cut bool) {
	var b []byte
	_ = eachTopLevel(body, func(key []byte, start, end int) error {
		switch string(key) {
		case "system", "instructions", "messages", "input", "prompt":
			if len(b) == 0 {
				b = append(b, '{')
			} else {
				b = append(b, ',')
			}
			b = append(append(append(b, '"'), key...), '"', ':')
			b = append(b, body[start:end]...)
		}
		return nil
	})
	if len(b) > 0 {
		b = append(b, '}')
	}
	if len(b) > max {
		return truncateUTF8(string(b), max), true
	}
	return string(b), false
}

// Described is what the answer said of itself so far.
func (m *Meter) Described() Described { return m.described }

var (
	// modelKey (rename.go) names the model.
	finishKey = []byte(`_reason"`) // finish_reason, stop_reason
	statusKey = []byte(`"status"`)
)

// describedFields are the fields, in every API's answers and events, that
// say which model answered and why it finished.
type describedFields struct {
	Model   string `json:"model"`
	Choices []struct {
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	// Anthropic: a message's stop_reason, in the body or message_delta's
	// delta; the model in message_start's message.
	StopReason *string `json:"stop_reason"`
	Delta      struct {
		StopReason *string `json:"stop_reason"`
	} `json:"delta"`
	Message struct {
		Model string `json:"model"`
	} `json:"message"`
	// Responses: the response object, whole or in response.* events.
	Status            string `json:"status"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	Response *struct {
		Model             string `json:"model"`
		Status            string `json:"status"`
		IncompleteDetails *struct {
			Reason string `json:"reason"`
		} `json:"incomplete_details"`
	} `json:"response"`
}

// describe reads one event's data or a whole body, when it can say
// anything new: data naming a reason or a status, or a model while none
// is known (every chat chunk names it; one parse is enough).
func (m *Meter) describe(data []byte) {
	if (m.described.Model != "" || !bytes.Contains(data, modelKey)) && !bytes.Contains(data, finishKey) && !bytes.Contains(data, statusKey) {
		return
	}
	var f describedFields
	if json.Unmarshal(data, &f) != nil {
		return
	}
	d := &m.described
	for _, model := range []string{f.Model, f.Message.Model} {
		if d.Model == "" && model != "" {
			d.Model = model
		}
	}
	for _, c := range f.Choices {
		if c.FinishReason != nil {
			d.addReason(*c.FinishReason)
		}
	}
	for _, r := range []*string{f.StopReason, f.Delta.StopReason} {
		if r != nil {
			d.addReason(*r)
		}
	}
	status, incomplete := f.Status, f.IncompleteDetails
	if f.Response != nil {
		if d.Model == "" {
			d.Model = f.Response.Model
		}
		status, incomplete = f.Response.Status, f.Response.IncompleteDetails
	}
	switch {
	case status == "completed":
		d.addReason("stop")
	case status == "incomplete" && incomplete != nil:
		d.addReason(incomplete.Reason)
	case status == "failed" || status == "cancelled":
		d.addReason(status)
	}
}

// Bounds of what an answer's finish reasons keep of a stream: one per
// choice (at most MaxChoices), each a word. A stream that names one on
// every chunk, or a reason longer than any word, must not grow the meter
// with the stream; an over-long reason is left out rather than cut, so
// that a credential in it is never kept in part, past the masking.
const (
	maxFinishReasons   = MaxChoices
	maxFinishReasonLen = 256
)

// addReason keeps one finish reason within those bounds.
func (d *Described) addReason(r string) {
	if r == "" || len(r) > maxFinishReasonLen || len(d.FinishReasons) >= maxFinishReasons {
		return
	}
	d.FinishReasons = append(d.FinishReasons, r)
}
