package provider

import (
	"net/http"

	"github.com/llmfailover/caddy-llm-failover/internal/jsonscan"
	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

// This file holds the OpenAI family's wire format: chat and legacy
// completions chunks, Responses API events, error shapes and usage.

// chatDialect is /v1/chat/completions and legacy /v1/completions: nameless
// events whose choices carry deltas (or text) and a finish_reason.
var chatDialect = dialect{
	overflow: overflowIsContent,
	data:     func(_ string, data []byte) streamgate.Kind { return classifyChat(data) },
}

// responsesDialect is /v1/responses: typed events, named or not.
var responsesDialect = dialect{
	overflow: func(name string) streamgate.Kind {
		if name != "" {
			return responsesKinds.of(name)
		}
		return streamgate.Content
	},
	data: func(name string, data []byte) streamgate.Kind {
		if name != "" {
			return responsesKinds.of(name)
		}
		t := scanTop(data)
		switch {
		case !t.ok:
			return streamgate.Content
		case t.err:
			return streamgate.ErrorFrame
		}
		return responsesKinds.ofType(t.typ)
	},
}

var responsesKinds = newKinds(map[string]streamgate.Kind{
	"response.created":     streamgate.Preamble,
	"response.in_progress": streamgate.Preamble,
	"response.queued":      streamgate.Preamble,
	// An item or part announced, still empty (a message whose content is
	// [], a reasoning item whose summary is [], a function call whose
	// arguments are ""), as Anthropic's content_block_start: no content
	// yet, so a response.failed after it still fails over. Its deltas,
	// or its .done event for an item that has none, are content.
	"response.output_item.added":            streamgate.Preamble,
	"response.content_part.added":           streamgate.Preamble,
	"response.reasoning_summary_part.added": streamgate.Preamble,
	"error":                                 streamgate.ErrorFrame,
	"response.failed":                       streamgate.ErrorFrame,
	"response.completed":                    streamgate.Terminal,
	"response.incomplete":                   streamgate.Terminal,
})

// kinds maps the event names (or "type" values) of a typed dialect to
// their kind; keep-alive names are Preamble and unknown names Content.
type kinds map[string]streamgate.Kind

func newKinds(m map[string]streamgate.Kind) kinds {
	for name := range keepalives {
		m[name] = streamgate.Preamble
	}
	return m
}

func (k kinds) of(name string) streamgate.Kind {
	if kind, ok := k[name]; ok {
		return kind
	}
	return streamgate.Content
}

// ofType is of for a "type" value still in the event's bytes; indexing a
// map with string(b) does not allocate.
func (k kinds) ofType(typ []byte) streamgate.Kind {
	if kind, ok := k[string(typ)]; ok {
		return kind
	}
	return streamgate.Content
}

func classifyChat(data []byte) streamgate.Kind {
	it, ok := jsonscan.Object(data)
	if !ok {
		return streamgate.Content
	}
	kind := streamgate.Preamble
	for k, more := it.Next(); more; k, more = it.Next() {
		switch string(k) {
		case "error":
			if !jsonscan.IsNull(it.Value()) {
				return streamgate.ErrorFrame
			}
		case "choices":
			arr, ok := it.Enter('[', ']')
			if !ok {
				return streamgate.Content
			}
			kind = max(kind, chatChoices(&arr))
			it.Leave(&arr)
		}
	}
	if !it.Finished() {
		return streamgate.Content
	}
	return kind
}

// chatChoices ranks Preamble < Content < Terminal; ErrorFrame never comes
// from here, so max() over Kind values is the right combination. Malformed
// input is left for the caller to notice through bad.
func chatChoices(arr *jsonscan.Iter) streamgate.Kind {
	kind := streamgate.Preamble
	for _, more := arr.Next(); more; _, more = arr.Next() {
		obj, ok := arr.Enter('{', '}')
		if !ok {
			return streamgate.Content
		}
		for k, more := obj.Next(); more; k, more = obj.Next() {
			switch string(k) {
			case "finish_reason":
				if !jsonscan.IsNull(obj.Value()) {
					kind = streamgate.Terminal
				}
			case "delta", "message":
				kind = max(kind, chatDelta(&obj))
			case "text":
				if !jsonscan.IsEmpty(obj.Value()) {
					kind = max(kind, streamgate.Content)
				}
			}
		}
		arr.Leave(&obj)
	}
	return kind
}

// chatDelta classifies the delta value the iterator is positioned at.
func chatDelta(parent *jsonscan.Iter) streamgate.Kind {
	obj, ok := parent.Enter('{', '}')
	if !ok {
		return streamgate.Preamble // null; anything else is caught as malformed or ignored
	}
	kind := streamgate.Preamble
	for k, more := obj.Next(); more; k, more = obj.Next() {
		if chatContentKey(k) && !jsonscan.IsEmpty(obj.Value()) {
			kind = streamgate.Content
		}
	}
	parent.Leave(&obj)
	return kind
}

// chatContentKey reports whether a delta's (or message's) member k is
// content when not empty: text, reasoning, a refusal, a tool call, audio.
func chatContentKey(k []byte) bool {
	switch string(k) {
	case "content", "reasoning_content", "reasoning", "reasoning_details",
		"refusal", "tool_calls", "function_call", "audio":
		return true
	}
	return false
}

// chatEvent reads one chat or completions chunk for the meter and the
// stream gate in one walk: it feeds the chunk's content text to e exactly
// as openAIContent.feed does, and returns the kind classifyChat returns
// (FuzzChatEvent holds both). data is trimmed, non-empty and not [DONE].
// Walking each chunk once instead of twice is most of what the meter and
// the classifier cost a stream.
//
// The walk descends into every value, where classifyChat skips most, and
// skipping is laxer about malformed input than descending: a chunk the
// walk finds malformed is classified by classifyChat itself. Upstreams
// send well-formed chunks; the second walk is for the odd one.
func chatEvent(e *TokenEstimator, data []byte) streamgate.Kind {
	it, ok := jsonscan.Object(data)
	if !ok {
		return streamgate.Content
	}
	f := openAIContent
	kind := streamgate.Preamble
	decided := false // classifyChat would have returned kind by now
	for key, more := it.Next(); more; key, more = it.Next() {
		switch {
		case decided:
			f.value(e, &it, key, 0)
		case string(key) == "error":
			if _, null := f.value(e, &it, key, 0); !null {
				kind, decided = streamgate.ErrorFrame, true
			}
		case string(key) == "choices" && it.Peek() == '[':
			arr, _ := it.Enter('[', ']')
			arr, k := chatChoicesFed(e, arr)
			it.Leave(&arr)
			kind = max(kind, k)
		case string(key) == "choices":
			f.value(e, &it, key, 0)
			kind, decided = streamgate.Content, true
		default:
			f.value(e, &it, key, 0)
		}
	}
	if !decided && !it.Finished() {
		return classifyChat(data)
	}
	return kind
}

// chatChoicesFed is chatChoices over the choices array arr (at depth 1 of
// the chunk), feeding the content of every element as it goes.
func chatChoicesFed(e *TokenEstimator, arr jsonscan.Iter) (jsonscan.Iter, streamgate.Kind) {
	f := openAIContent
	kind := streamgate.Preamble
	classifying := true
	for key, more := arr.Next(); more; key, more = arr.Next() {
		if !classifying || arr.Peek() != '{' {
			if classifying {
				// chatChoices stops at an element that is no object.
				kind, classifying = streamgate.Content, false
			}
			f.value(e, &arr, key, 1)
			continue
		}
		obj, _ := arr.Enter('{', '}')
		for k, more := obj.Next(); more; k, more = obj.Next() {
			switch string(k) {
			case "finish_reason":
				if _, null := f.value(e, &obj, k, 2); !null {
					kind = streamgate.Terminal
				}
			case "delta", "message":
				if obj.Peek() != '{' {
					f.value(e, &obj, k, 2)
					continue
				}
				d, _ := obj.Enter('{', '}')
				for dk, more := d.Next(); more; dk, more = d.Next() {
					if empty, _ := f.value(e, &d, dk, 3); !empty && chatContentKey(dk) {
						kind = max(kind, streamgate.Content)
					}
				}
				obj.Leave(&d)
			case "text":
				if empty, _ := f.value(e, &obj, k, 2); !empty {
					kind = max(kind, streamgate.Content)
				}
			default:
				f.value(e, &obj, k, 2)
			}
		}
		arr.Leave(&obj)
	}
	return arr, kind
}

// openAIError is OpenAI's error object, as an HTTP body and as the data of
// an in-stream error event of chat and completions streams.
type openAIError struct {
	Error openAIDetail `json:"error"`
}

type openAIDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func openAIErrorBody(e Error) []byte {
	typ, code := openAIType(e.Status)
	if e.Code != "" {
		code = e.Code
	}
	return marshal(openAIError{Error: openAIDetail{Message: e.Message, Type: typ, Code: nullable(code)}})
}

func openAIErrorEvent(code, message string) []byte {
	return sseEvent("", openAIError{Error: openAIDetail{Message: message, Type: "server_error", Code: nullable(code)}})
}

// responsesError is the Responses API's in-stream "error" event.
type responsesError struct {
	Type    string  `json:"type"`
	Code    *string `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
}

func responsesErrorEvent(code, message string) []byte {
	return sseEvent("error", responsesError{Type: "error", Code: nullable(code), Message: message})
}

// openAIType follows the types and codes OpenAI's API answers with.
func openAIType(status int) (typ, code string) {
	switch status {
	case http.StatusUnauthorized:
		return "invalid_request_error", "invalid_api_key"
	case http.StatusPaymentRequired:
		return "insufficient_quota", "insufficient_quota"
	case http.StatusNotFound:
		return "invalid_request_error", "model_not_found"
	case http.StatusRequestEntityTooLarge:
		return "invalid_request_error", "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_exceeded", "rate_limit_exceeded"
	case http.StatusGatewayTimeout:
		return "server_error", "timeout"
	}
	if status >= 400 && status < 500 {
		return "invalid_request_error", ""
	}
	return "server_error", ""
}
