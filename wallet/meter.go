package wallet

import (
	"bytes"
	"encoding/json"
)

// Format is the API dialect of an upstream response, which decides where
// its token usage is reported.
type Format uint8

const (
	FormatOpenAIChat Format = iota + 1
	FormatOpenAIResponses
	FormatAnthropic
	FormatOpenAIEmbeddings
)

// Usage is the token usage of one attempt. Known is true only when the
// upstream reported both input and output counts (embeddings: input only).
type Usage struct {
	Input, Output int64
	Known         bool
}

// Meter extracts token usage from one upstream attempt's response, streamed
// or not. It keeps only counters, never the payloads, so it can watch a
// stream of any length. It is not safe for concurrent use.
type Meter struct {
	format        Format
	input, output int64
	inputKnown    bool
	outputKnown   bool
	delivered     int64
}

// NewMeter returns a Meter for responses in format f.
func NewMeter(f Format) *Meter {
	return &Meter{format: f}
}

var (
	usageKey  = []byte(`"usage"`)
	doneEvent = []byte("[DONE]")
)

type openAIUsage struct {
	PromptTokens     *int64 `json:"prompt_tokens"`
	CompletionTokens *int64 `json:"completion_tokens"`
}

type responsesUsage struct {
	InputTokens  *int64 `json:"input_tokens"`
	OutputTokens *int64 `json:"output_tokens"`
}

type anthropicUsage struct {
	InputTokens              *int64 `json:"input_tokens"`
	CacheCreationInputTokens int64  `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64  `json:"cache_read_input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
}

// input counts cached tokens as input: Anthropic reports them separately
// from input_tokens, yet the model processed them and the upstream bills them.
func (u *anthropicUsage) input() int64 {
	return *u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens
}

// Event feeds one server-sent event: its event name (empty when the stream
// has none, as in OpenAI chat) and its data.
func (m *Meter) Event(name string, data []byte) {
	// Most chunks are content deltas; skipping the ones that cannot carry
	// usage keeps the per-chunk cost to a byte search.
	if !bytes.Contains(data, usageKey) || bytes.Equal(bytes.TrimSpace(data), doneEvent) {
		return
	}
	switch m.format {
	case FormatOpenAIChat, FormatOpenAIEmbeddings:
		// With stream_options.include_usage every chunk carries
		// "usage":null and the last one the totals; some compatible
		// upstreams send running totals on every chunk. Last one wins.
		var c struct {
			Usage *openAIUsage `json:"usage"`
		}
		if json.Unmarshal(data, &c) == nil && c.Usage != nil {
			m.setOpenAI(c.Usage)
		}
	case FormatOpenAIResponses:
		// response.completed, and also response.incomplete and
		// response.failed, carry the final response with its usage.
		var c struct {
			Response *struct {
				Usage *responsesUsage `json:"usage"`
			} `json:"response"`
		}
		if json.Unmarshal(data, &c) == nil && c.Response != nil && c.Response.Usage != nil {
			m.setResponses(c.Response.Usage)
		}
	case FormatAnthropic:
		var c struct {
			Type    string `json:"type"`
			Message *struct {
				Usage *anthropicUsage `json:"usage"`
			} `json:"message"`
			Usage *anthropicUsage `json:"usage"`
		}
		if json.Unmarshal(data, &c) != nil {
			return
		}
		if name == "" {
			name = c.Type
		}
		switch name {
		case "message_start":
			if c.Message == nil || c.Message.Usage == nil {
				return
			}
			u := c.Message.Usage
			if u.InputTokens != nil {
				m.input, m.inputKnown = u.input(), true
			}
			// message_start's output_tokens is a placeholder (usually 1);
			// take it as a floor but wait for message_delta to know.
			if u.OutputTokens != nil && *u.OutputTokens > m.output {
				m.output = *u.OutputTokens
			}
		case "message_delta":
			if c.Usage == nil {
				return
			}
			u := c.Usage
			// output_tokens is cumulative: the last delta is the total.
			if u.OutputTokens != nil {
				m.output, m.outputKnown = *u.OutputTokens, true
			}
			// Newer API versions repeat (cumulative) input counts here,
			// e.g. after server-side tool use; they supersede the start's.
			if u.InputTokens != nil {
				m.input, m.inputKnown = u.input(), true
			}
		}
	}
}

// Body feeds a complete non-streaming JSON response body.
func (m *Meter) Body(body []byte) {
	if !bytes.Contains(body, usageKey) {
		return
	}
	switch m.format {
	case FormatOpenAIChat, FormatOpenAIEmbeddings:
		var c struct {
			Usage *openAIUsage `json:"usage"`
		}
		if json.Unmarshal(body, &c) == nil && c.Usage != nil {
			m.setOpenAI(c.Usage)
		}
	case FormatOpenAIResponses:
		var c struct {
			Usage *responsesUsage `json:"usage"`
		}
		if json.Unmarshal(body, &c) == nil && c.Usage != nil {
			m.setResponses(c.Usage)
		}
	case FormatAnthropic:
		var c struct {
			Usage *anthropicUsage `json:"usage"`
		}
		if json.Unmarshal(body, &c) == nil && c.Usage != nil {
			u := c.Usage
			if u.InputTokens != nil {
				m.input, m.inputKnown = u.input(), true
			}
			if u.OutputTokens != nil {
				m.output, m.outputKnown = *u.OutputTokens, true
			}
		}
	}
}

func (m *Meter) setOpenAI(u *openAIUsage) {
	if u.PromptTokens != nil {
		m.input, m.inputKnown = *u.PromptTokens, true
	}
	if u.CompletionTokens != nil {
		m.output, m.outputKnown = *u.CompletionTokens, true
	}
}

func (m *Meter) setResponses(u *responsesUsage) {
	if u.InputTokens != nil {
		m.input, m.inputKnown = *u.InputTokens, true
	}
	if u.OutputTokens != nil {
		m.output, m.outputKnown = *u.OutputTokens, true
	}
}

// DeliveredText records n bytes of generated text delivered to the client.
// It only matters when the upstream never reports usage (the client went
// away mid-stream and the gateway stopped reading); see Billable.
func (m *Meter) DeliveredText(n int) {
	if n > 0 {
		m.delivered += int64(n)
	}
}

// Usage returns what the upstream reported so far. Unreported counts are
// zero and Known is false until the report is complete.
func (m *Meter) Usage() Usage {
	known := m.inputKnown && m.outputKnown
	if m.format == FormatOpenAIEmbeddings {
		known = m.inputKnown
	}
	return Usage{Input: m.input, Output: m.output, Known: known}
}

// Billable returns the usage to charge for the attempt. When the upstream
// reported usage it is that. Otherwise each missing count is replaced by a
// stand-in: input by inputBound (the bound MaxCost returned, which the real
// count cannot exceed), output by the larger of any partial report and the
// bytes of text delivered. Byte-level BPE emits at least one byte per token,
// so delivered bytes bound the visible output tokens from above; they cannot
// see hidden reasoning tokens, so for reasoning models this can undercharge
// what the upstream billed. Either way Settle caps the charge at the
// reservation, so the fallback can never overdraw.
func (m *Meter) Billable(inputBound int64) Usage {
	u := m.Usage()
	if u.Known {
		return u
	}
	if !m.inputKnown {
		u.Input = inputBound
	}
	if !m.outputKnown && m.delivered > u.Output {
		u.Output = m.delivered
	}
	return u
}

// IsUsageOnlyChunk reports whether an OpenAI chat stream chunk carries only
// usage (an empty or absent choices array), i.e. the extra chunk that
// stream_options.include_usage adds. The gateway may request usage on every
// stream for metering and hide this chunk from clients that did not ask.
func IsUsageOnlyChunk(data []byte) bool {
	if !bytes.Contains(data, usageKey) {
		return false
	}
	var c struct {
		Choices []json.RawMessage `json:"choices"`
		Usage   json.RawMessage   `json:"usage"`
	}
	if json.Unmarshal(data, &c) != nil {
		return false
	}
	return len(c.Choices) == 0 && len(c.Usage) > 0 && !bytes.Equal(c.Usage, []byte("null"))
}
