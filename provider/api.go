// Package provider owns everything the gateway knows about upstream LLM
// APIs: which client-facing API a path belongs to, the request fields
// routing and billing need, how each API's event stream begins, ends and
// fails, its error formats, where it reports token usage, and, through
// Adapter, how a request is sent to one kind of upstream (URL, headers,
// response framing).
//
// It must not know breakers, chains, money or the handler's configuration:
// the only Caddy configuration it owns is its own adapter modules, in the
// namespace http.handlers.llm_failover.providers.
//
// It never re-encodes a request: the body that reaches an upstream is the
// client's, byte for byte, except for the value of "model" when a route
// renames it and the stream_options field AskUsage adds.
package provider

import (
	"strings"

	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

// API identifies the client-facing API a request belongs to. Its methods
// own that API's wire format.
type API uint8

// The APIs the gateway recognises.
const (
	Unknown API = iota
	OpenAIChat
	OpenAIResponses
	OpenAICompletions
	OpenAIEmbeddings
	OpenAIModels
	AnthropicMessages
	AnthropicCountTokens
	// NumAPIs counts the API values, for tables indexed by API.
	NumAPIs
)

// wire is one API's format. Every per-API difference lives in the apis
// table below, so that adding an API is one row, not a hunt for switches.
type wire struct {
	name string
	// anthropic selects Anthropic's error formats; OpenAI's otherwise.
	anthropic bool
	// stream classifies the API's server-sent events.
	stream dialect
	// endsAtEOF: the API has no end marker, so a clean EOF at an event
	// boundary is a normal end.
	endsAtEOF bool
	// inStreamError renders the final error event of a broken stream.
	inStreamError func(code, message string) []byte
	// usage reads token usage from the API's events and bodies.
	usage usageFormat
	// metered, when set, classifies a plain event's data as stream.data
	// does while feeding its content as usage.content does, in one walk
	// (the Meter's Classify takes the kind from it).
	metered func(e *TokenEstimator, data []byte) streamgate.Kind
}

var apis = [NumAPIs]wire{
	Unknown:              {name: "unknown", stream: genericDialect, endsAtEOF: true, inStreamError: openAIErrorEvent, usage: openAIUsageFormat},
	OpenAIChat:           {name: "openai_chat", stream: chatDialect, inStreamError: openAIErrorEvent, usage: openAIUsageFormat, metered: chatEvent},
	OpenAIResponses:      {name: "openai_responses", stream: responsesDialect, inStreamError: responsesErrorEvent, usage: responsesUsageFormat},
	OpenAICompletions:    {name: "openai_completions", stream: chatDialect, inStreamError: openAIErrorEvent, usage: openAIUsageFormat, metered: chatEvent},
	OpenAIEmbeddings:     {name: "openai_embeddings", stream: chatDialect, inStreamError: openAIErrorEvent, usage: embeddingsUsageFormat},
	OpenAIModels:         {name: "openai_models", stream: chatDialect, inStreamError: openAIErrorEvent, usage: openAIUsageFormat},
	AnthropicMessages:    {name: "anthropic_messages", anthropic: true, stream: anthropicDialect, inStreamError: anthropicErrorEvent, usage: anthropicUsageFormat},
	AnthropicCountTokens: {name: "anthropic_count_tokens", anthropic: true, stream: anthropicDialect, inStreamError: anthropicErrorEvent, usage: anthropicUsageFormat},
}

func (a API) wire() *wire {
	if a < NumAPIs {
		return &apis[a]
	}
	return &apis[Unknown]
}

func (a API) String() string { return a.wire().name }

// Anthropic reports whether the API is one of Anthropic's (its errors use
// Anthropic's format).
func (a API) Anthropic() bool { return a.wire().anthropic }

// APIFromPath recognises an API by the end of the path, so that prefixes
// such as /openai/v1 or /api/v1 in front of the usual paths still work.
func APIFromPath(p string) API {
	p = strings.TrimSuffix(p, "/")
	switch {
	case strings.HasSuffix(p, "/chat/completions"):
		return OpenAIChat
	case strings.HasSuffix(p, "/responses"):
		return OpenAIResponses
	case strings.HasSuffix(p, "/completions"):
		return OpenAICompletions
	case strings.HasSuffix(p, "/embeddings"):
		return OpenAIEmbeddings
	case strings.HasSuffix(p, "/messages/count_tokens"):
		return AnthropicCountTokens
	case strings.HasSuffix(p, "/messages"):
		return AnthropicMessages
	case strings.HasSuffix(p, "/models"):
		return OpenAIModels
	}
	return Unknown
}

// Classify tells what ev means for the stream gate. It is a pure function
// and does not allocate; streamgate.Options.Classify takes it.
func (a API) Classify(ev streamgate.Event) streamgate.Kind { return classify(a.wire().stream, ev) }

// EndsAtEOF reports whether a clean EOF at an event boundary is a normal
// end of the API's stream. Only an unknown API has no end marker to wait
// for; for the others such an EOF is a truncation.
func (a API) EndsAtEOF() bool { return a.wire().endsAtEOF }

// ErrorEvent renders one final error event, in the shape the API itself
// uses for in-stream errors so that client SDKs raise it as an API error.
// An empty code renders as null.
func (a API) ErrorEvent(code, message string) []byte { return a.wire().inStreamError(code, message) }
