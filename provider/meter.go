package provider

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/llmfailover/caddy-llm-failover/internal/jsonscan"
	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

// Usage is the token usage of one attempt as the upstream reported it.
// Unreported counts are zero with their Known flag false.
//
// Input counts every input token the model processed; the cache classes
// say how many of them were read from the provider's prompt cache, or
// written to it (for 5 minutes, or for an hour), which providers bill at
// their own prices. Input less the three is plain input.
type Usage struct {
	Input, Output           int64
	InputKnown, OutputKnown bool

	CacheRead, CacheWrite, CacheWrite1h int64

	// Garbled: the answer carried a usage report that could not be read
	// (a count that is a fraction, a string or out of int64's range). It
	// is no report the gateway may estimate around: the caller charges
	// it as an implausible one.
	Garbled bool
}

// PlainInput is the input read neither from nor into a cache (never
// negative, whatever an upstream reported).
func (u Usage) PlainInput() int64 {
	return max(0, u.Input-u.CacheRead-u.CacheWrite-u.CacheWrite1h)
}

// Meter extracts token usage from one upstream attempt's response, streamed
// or not. It keeps only counters, never the payloads, so it can watch a
// stream of any length. It is not safe for concurrent use.
type Meter struct {
	// api says where its answers report usage (wire.usage) and how its
	// events are classified.
	api API
	// While lastSet, last is a copy of the data of the event Event last
	// walked for its kind too, and lastKind that kind (see Classify).
	last     []byte
	lastKind streamgate.Kind
	lastSet  bool
	u        Usage
	// content estimates the tokens of the content delivered so far.
	content TokenEstimator
	// describing: read what the answer says of itself (telemetry.go).
	describing bool
	described  Described
}

// NewMeter returns a Meter for answers of the API.
func (a API) NewMeter() *Meter { return &Meter{api: a} }

// GateOptions returns the stream gate options for the attempt the meter
// watches: the meter observes every event and classifies it, from one
// walk of the event where the API allows (see Classify), with the API's
// error event and end-of-stream rule.
func (m *Meter) GateOptions() streamgate.Options {
	return streamgate.Options{Observe: m.Event, Classify: m.Classify, ErrorEvent: m.api.ErrorEvent, EndsAtEOF: m.api.EndsAtEOF()}
}

// maxRemembered bounds the event data Event keeps for Classify: a larger
// event is classified afresh (its walk is the least of its cost).
const maxRemembered = 4 << 10

// Classify is the API's Classify. The gate calls it right after Observe
// (Event) with the same event; when Event walked that event for its kind
// too, the kind is taken from there. The event is recognised by its bytes,
// compared with a copy Event kept, never by where they are: the gate's
// parser reuses its buffer, so a pointer would not tell one event from the
// next. Any other event is classified afresh.
func (m *Meter) Classify(ev streamgate.Event) streamgate.Kind {
	if m.lastSet && plainEvent(ev) && bytes.Equal(m.last, ev.Data) {
		m.lastSet = false
		return m.lastKind
	}
	return m.api.Classify(ev)
}

// plainEvent is an event classify judges by its data alone (see classify):
// unnamed (or "message") and whole.
func plainEvent(ev streamgate.Event) bool {
	return (ev.Name == "" || ev.Name == "message") && !ev.Overflow
}

// usageFormat is where an API reports usage.
type usageFormat struct {
	// event reads usage from one event's name (possibly "") and data,
	// which is known to mention "usage".
	event func(u *Usage, name string, data []byte)
	// body reads usage from a whole JSON body known to mention "usage".
	body func(u *Usage, body []byte)
	// inputOnly: the API produces no output tokens, so the report is
	// complete once the input count is known (embeddings).
	inputOnly bool
	// content feeds the answer's text to the delivered-content estimate.
	content contentFormat
}

var (
	usageKey  = []byte(`"usage"`)
	doneEvent = []byte("[DONE]")
)

// Event feeds one server-sent event; streamgate.Options.Observe takes it.
func (m *Meter) Event(ev streamgate.Event) {
	m.lastSet = false
	if len(ev.Data) == 0 || bytes.Equal(bytes.TrimSpace(ev.Data), doneEvent) {
		return
	}
	m.feed(ev)
	// Only a chunk that mentions usage can carry it.
	if bytes.Contains(ev.Data, usageKey) {
		m.api.wire().usage.event(&m.u, ev.Name, ev.Data)
	}
	if m.describing {
		m.describe(ev.Data)
	}
}

// feed adds ev's content text to the delivered estimate. Where the API
// has one walk for content and kind (wire.metered) and classify would
// judge ev by its data (plain, not blank; Event has already left out
// [DONE]), that walk does it, and its kind is kept for Classify.
func (m *Meter) feed(ev streamgate.Event) {
	walk := m.api.wire().metered
	data := trimWS(ev.Data)
	if walk == nil || !plainEvent(ev) || len(data) == 0 {
		m.api.wire().usage.content.feed(&m.content, ev.Data)
		return
	}
	m.lastKind = walk(&m.content, data)
	if len(ev.Data) <= maxRemembered {
		m.last, m.lastSet = append(m.last[:0], ev.Data...), true
	}
}

// Body feeds a complete non-streaming JSON response body.
//
// The delivered-content estimate is only read when the output count is
// unknown (see DeliveredTokens), and a whole body is fed once: a body
// whose report is complete skips it.
func (m *Meter) Body(body []byte) {
	if bytes.Contains(body, usageKey) {
		m.api.wire().usage.body(&m.u, body)
	}
	if !m.Usage().OutputKnown {
		m.api.wire().usage.content.feed(&m.content, body)
	}
	if m.describing {
		m.describe(body)
	}
}

// DeliveredTokens estimates the output tokens of the content seen so far
// (see TokenEstimator), for when the upstream reported no output count;
// after a Body whose report was complete it is 0.
func (m *Meter) DeliveredTokens() int64 { return m.content.Tokens() }

// Usage returns what the upstream reported so far.
func (m *Meter) Usage() Usage {
	u := m.u
	if m.api.wire().usage.inputOnly && u.InputKnown {
		u.OutputKnown = true
	}
	return u
}

// set takes the counts an upstream reported; nil means not reported.
func (u *Usage) set(input, output *int64) {
	if input != nil {
		u.Input, u.InputKnown = *input, true
	}
	if output != nil {
		u.Output, u.OutputKnown = *output, true
	}
}

// OpenAI chat, completions and embeddings.

type openAIUsage struct {
	PromptTokens        *int64        `json:"prompt_tokens"`
	CompletionTokens    *int64        `json:"completion_tokens"`
	PromptTokensDetails *cacheDetails `json:"prompt_tokens_details"`
}

// cacheDetails is OpenAI's prompt_tokens_details.
type cacheDetails struct {
	// CachedTokens is the part of prompt_tokens read from the prompt
	// cache (OpenAI, Azure, Gemini's compatible endpoint).
	CachedTokens int64 `json:"cached_tokens"`
}

// cached is the cache-read part of the prompt, 0 when not reported.
func (c *openAIUsage) cached() int64 {
	if c.PromptTokensDetails == nil {
		return 0
	}
	return c.PromptTokensDetails.CachedTokens
}

// openAIUsageBody reads a chat chunk or a whole body alike: with
// stream_options.include_usage every chunk carries "usage":null and the
// last one the totals; some compatible upstreams send running totals on
// every chunk. Last one wins.
//
// It runs on every billed answer and every chunk of a billed stream, so it
// walks the object once (jsonscan) and decodes only the usage value:
// unmarshalling the whole answer cost about a tenth of a billed request.
// The walk checks the document's structure, not every literal outside
// the usage value, which is decoded strictly: a report from an answer
// broken elsewhere counts like any upstream report (the wallet bounds
// every report by the reservation).
func openAIUsageBody(u *Usage, data []byte) {
	it, ok := jsonscan.Object(data)
	if !ok {
		return
	}
	// Repeated keys decode as json.Unmarshal does: into the same value,
	// in order, a null starting it over. Each is decoded as the walk
	// reaches it, so that a body repeating the key costs no memory per
	// repetition; the result counts only once the walk found the whole
	// object well formed.
	var c *openAIUsage
	found, garbled := false, false
	for key, ok := it.Next(); ok; key, ok = it.Next() {
		if string(key) != "usage" {
			continue
		}
		v := it.Value()
		found = true
		switch {
		case garbled:
		case jsonscan.IsNull(v):
			c = nil
		default:
			if c == nil {
				c = new(openAIUsage)
			}
			garbled = !c.decode(v) && json.Unmarshal(v, c) != nil
		}
	}
	if !it.Finished() || !found {
		return
	}
	if garbled {
		u.Garbled = true
		return
	}
	if c != nil {
		u.set(c.PromptTokens, c.CompletionTokens)
		if c.PromptTokens != nil {
			u.CacheRead = c.cached()
		}
	}
}

// decode is json.Unmarshal(v, c) for the usage objects upstreams send:
// ASCII keys without escapes, the counts integers or null, the
// prompt_tokens_details object (OpenAI sends it on every answer) read for
// its cached_tokens, every other member skipped. It reports false, having
// changed nothing, for anything else (escaped or non-ASCII keys, which
// json matches by Unicode case folding; a count that is a float, a string
// or out of range, which json refuses), so that the caller can leave it
// to json.Unmarshal. v is a value the caller's walk delimited; as there,
// members it skips are checked for structure only.
func (c *openAIUsage) decode(v []byte) bool {
	it, ok := jsonscan.Object(v)
	if !ok {
		return false
	}
	in, out, details := c.PromptTokens, c.CompletionTokens, c.PromptTokensDetails
	if details != nil {
		// json decodes a repeated object into the struct it already
		// has: a copy, so that a false return changes nothing.
		d := *details
		details = &d
	}
	for key, ok := it.Next(); ok; key, ok = it.Next() {
		var dst **int64
		switch {
		case !plainKey(key):
			return false
		case asciiEqualFold(key, "prompt_tokens"):
			dst = &in
		case asciiEqualFold(key, "completion_tokens"):
			dst = &out
		case asciiEqualFold(key, "prompt_tokens_details"):
			dv := it.Value()
			if jsonscan.IsNull(dv) {
				details = nil
				continue
			}
			if details == nil {
				details = new(cacheDetails)
			}
			if !details.decode(dv) {
				return false
			}
			continue
		default:
			continue // Next skips the value
		}
		n, null, ok := jsonInt64(it.Value())
		switch {
		case !ok:
			return false
		case null:
			*dst = nil
		default:
			*dst = &n
		}
	}
	if !it.Finished() {
		return false
	}
	c.PromptTokens, c.CompletionTokens, c.PromptTokensDetails = in, out, details
	return true
}

// decode is json.Unmarshal(v, d) under decode's rules: cached_tokens an
// integer (null leaves it as it was, as json does for a number), every
// other member skipped; false for anything else.
func (d *cacheDetails) decode(v []byte) bool {
	it, ok := jsonscan.Object(v)
	if !ok {
		return false
	}
	cached := d.CachedTokens
	for key, ok := it.Next(); ok; key, ok = it.Next() {
		switch {
		case !plainKey(key):
			return false
		case asciiEqualFold(key, "cached_tokens"):
			n, null, ok := jsonInt64(it.Value())
			if !ok {
				return false
			}
			if !null {
				cached = n
			}
		}
	}
	if !it.Finished() {
		return false
	}
	d.CachedTokens = cached
	return true
}

// plainKey: every byte printable ASCII, no escape.
func plainKey(k []byte) bool {
	for _, b := range k {
		if b < 0x20 || b >= 0x80 || b == '\\' {
			return false
		}
	}
	return true
}

// asciiEqualFold compares an ASCII key with a lower-case name as json
// matches field names: exactly, or ignoring ASCII case.
func asciiEqualFold(k []byte, name string) bool {
	if len(k) != len(name) {
		return false
	}
	for i, b := range k {
		if 'A' <= b && b <= 'Z' {
			b += 'a' - 'A'
		}
		if b != name[i] {
			return false
		}
	}
	return true
}

// jsonInt64 reads a JSON null or an integer literal that fits int64 (what
// json.Unmarshal puts in an *int64 without error); ok is false for
// anything else.
func jsonInt64(v []byte) (n int64, null, ok bool) {
	if string(v) == "null" {
		return 0, true, true
	}
	d := v
	if len(d) > 0 && d[0] == '-' {
		d = d[1:]
	}
	if len(d) == 0 || len(d) > 1 && d[0] == '0' {
		return 0, false, false
	}
	for _, b := range d {
		if b < '0' || b > '9' {
			return 0, false, false
		}
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	return n, false, err == nil
}

var (
	openAIUsageFormat = usageFormat{
		event:   func(u *Usage, _ string, data []byte) { openAIUsageBody(u, data) },
		body:    openAIUsageBody,
		content: openAIContent,
	}
	embeddingsUsageFormat = usageFormat{event: openAIUsageFormat.event, body: openAIUsageBody, inputOnly: true, content: noContent}
)

// OpenAI Responses.

type responsesUsage struct {
	InputTokens        *int64 `json:"input_tokens"`
	OutputTokens       *int64 `json:"output_tokens"`
	InputTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
}

// setOn takes the report, cached input included.
func (r *responsesUsage) setOn(u *Usage) {
	u.set(r.InputTokens, r.OutputTokens)
	if r.InputTokens != nil && r.InputTokensDetails != nil {
		u.CacheRead = r.InputTokensDetails.CachedTokens
	}
}

var responsesUsageFormat = usageFormat{
	content: responsesContent,
	// response.completed, and also response.incomplete and
	// response.failed, carry the final response with its usage.
	event: func(u *Usage, _ string, data []byte) {
		var c struct {
			Response *struct {
				Usage *responsesUsage `json:"usage"`
			} `json:"response"`
		}
		if err := json.Unmarshal(data, &c); err != nil {
			u.Garbled = u.Garbled || garbledReport(err, data)
		} else if c.Response != nil && c.Response.Usage != nil {
			c.Response.Usage.setOn(u)
		}
	},
	body: func(u *Usage, body []byte) {
		var c struct {
			Usage *responsesUsage `json:"usage"`
		}
		if err := json.Unmarshal(body, &c); err != nil {
			u.Garbled = u.Garbled || garbledReport(err, body)
		} else if c.Usage != nil {
			c.Usage.setOn(u)
		}
	},
}

// Anthropic Messages.

type anthropicUsage struct {
	InputTokens              *int64 `json:"input_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	// CacheCreation splits cache_creation_input_tokens by lifetime.
	CacheCreation *struct {
		Ephemeral5m int64 `json:"ephemeral_5m_input_tokens"`
		Ephemeral1h int64 `json:"ephemeral_1h_input_tokens"`
	} `json:"cache_creation"`
}

// setInput counts cached tokens as input: Anthropic reports them separately
// from input_tokens, yet the model processed them and the upstream bills
// them, each class at its own price. Writes the report does not split by
// lifetime are 5-minute ones, the default, but for the hour's writes an
// earlier report of the same answer split off. A cache count the report
// leaves out is the one an earlier report gave: message_delta may repeat
// input_tokens without the cache fields message_start had.
func (a *anthropicUsage) setInput(u *Usage) {
	if a.InputTokens == nil {
		return
	}
	if a.CacheReadInputTokens != nil {
		u.CacheRead = *a.CacheReadInputTokens
	}
	if w := a.CacheCreationInputTokens; w != nil {
		// A report without the split (message_delta's, which repeats
		// the cumulative total but never has cache_creation) keeps the
		// hour's part an earlier report gave.
		hour := u.CacheWrite1h
		if c := a.CacheCreation; c != nil {
			hour = c.Ephemeral1h
		}
		u.CacheWrite1h = min(max(hour, 0), *w)
		u.CacheWrite = *w - u.CacheWrite1h
	}
	u.Input, u.InputKnown = *a.InputTokens+u.CacheRead+u.CacheWrite+u.CacheWrite1h, true
}

var anthropicUsageFormat = usageFormat{
	content: anthropicContent,
	event: func(u *Usage, name string, data []byte) {
		var c struct {
			Type    string `json:"type"`
			Message *struct {
				Usage *anthropicUsage `json:"usage"`
			} `json:"message"`
			Usage *anthropicUsage `json:"usage"`
		}
		if err := json.Unmarshal(data, &c); err != nil {
			u.Garbled = u.Garbled || garbledReport(err, data)
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
			a := c.Message.Usage
			a.setInput(u)
			// message_start's output_tokens is a placeholder (usually 1);
			// take it as a floor but wait for message_delta to know.
			if a.OutputTokens != nil && *a.OutputTokens > u.Output {
				u.Output = *a.OutputTokens
			}
		case "message_delta":
			if c.Usage == nil {
				return
			}
			// output_tokens is cumulative: the last delta is the total.
			// Newer API versions repeat (cumulative) input counts here,
			// e.g. after server-side tool use; they supersede the start's.
			c.Usage.setInput(u)
			u.set(nil, c.Usage.OutputTokens)
		}
	},
	body: func(u *Usage, body []byte) {
		var c struct {
			Usage *anthropicUsage `json:"usage"`
		}
		if err := json.Unmarshal(body, &c); err != nil {
			u.Garbled = u.Garbled || garbledReport(err, body)
		} else if c.Usage != nil {
			c.Usage.setInput(u)
			u.set(nil, c.Usage.OutputTokens)
		}
	},
}

// garbledReport tells a usage report json could not read (a count of the
// wrong type or out of range: *json.UnmarshalTypeError) from data that
// is no JSON object at all, which reports nothing.
func garbledReport(err error, data []byte) bool {
	var typeErr *json.UnmarshalTypeError
	return errors.As(err, &typeErr) && bytes.Contains(data, []byte(`"usage"`))
}
