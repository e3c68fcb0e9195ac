package streamgate

import (
	"strconv"

	"github.com/llmfailover/caddy-llm-failover/internal/jsonscan"
)

// Dialect is the wire format of the upstream's event stream.
type Dialect uint8

const (
	// Generic is an unknown SSE API: the first data event that is not an
	// error counts as content.
	Generic Dialect = iota
	// OpenAIChat is /v1/chat/completions (and legacy /v1/completions).
	OpenAIChat
	// OpenAIResponses is /v1/responses.
	OpenAIResponses
	// AnthropicMessages is /v1/messages.
	AnthropicMessages
)

func (d Dialect) String() string {
	switch d {
	case Generic:
		return "generic"
	case OpenAIChat:
		return "openai_chat"
	case OpenAIResponses:
		return "openai_responses"
	case AnthropicMessages:
		return "anthropic_messages"
	}
	return "dialect(" + strconv.Itoa(int(d)) + ")"
}

// Kind is what an event means for the commit decision.
type Kind uint8

const (
	// Preamble events (metadata, keep-alives, role-only deltas) say nothing
	// about whether the upstream will answer or fail.
	Preamble Kind = iota
	// Content is real output: the upstream is answering.
	Content
	// ErrorFrame is an in-stream error.
	ErrorFrame
	// Terminal is decisive like Content and also marks the stream's normal
	// end ([DONE], a finish_reason, response.completed, message_stop), so a
	// close after it is not a truncation.
	Terminal
)

func (k Kind) String() string {
	switch k {
	case Preamble:
		return "preamble"
	case Content:
		return "content"
	case ErrorFrame:
		return "error"
	case Terminal:
		return "terminal"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Classify tells what ev means in dialect d. It is a pure function and does
// not allocate.
//
// Choices beyond the obvious:
//   - An event with empty or all-whitespace data is Preamble in every
//     dialect: it carries nothing.
//   - Data that is not a JSON object (malformed, truncated, plain text) and
//     not [DONE] is Content in every dialect: the upstream is sending
//     something other than a recognisable error, and holding it back would
//     only delay the client until the gate timer fires.
//   - "data: [DONE]" is Terminal in every dialect, as is an event named
//     "error" an ErrorFrame; names like "ping"/"keepalive" are Preamble.
//   - Unknown event names in the typed dialects are Content, as in Generic.
func Classify(d Dialect, ev Event) Kind {
	name := ev.Name
	if name == "message" {
		name = ""
	}
	switch name {
	case "error":
		return ErrorFrame
	case "ping", "keepalive", "keep-alive", "heartbeat":
		return Preamble
	}
	if ev.Overflow {
		// Only the name survived; anything that large is output.
		switch d {
		case OpenAIResponses:
			if name != "" {
				return responsesKind(name)
			}
		case AnthropicMessages:
			if name == "message_stop" {
				return Terminal
			}
		}
		return Content
	}
	data := trimWS(ev.Data)
	if len(data) == 0 {
		return Preamble
	}
	if string(data) == "[DONE]" {
		return Terminal
	}
	switch d {
	case OpenAIChat:
		return classifyChat(data)
	case OpenAIResponses:
		if name != "" {
			return responsesKind(name)
		}
		t := scanTop(data)
		switch {
		case !t.ok:
			return Content
		case t.err:
			return ErrorFrame
		}
		return responsesKind(knownName(t.typ))
	case AnthropicMessages:
		return classifyAnthropic(name, data)
	}
	t := scanTop(data)
	if t.ok && (t.err || string(t.typ) == "error") {
		return ErrorFrame
	}
	return Content
}

func trimWS(b []byte) []byte {
	i, j := 0, len(b)
	for i < j && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	for j > i && (b[j-1] == ' ' || b[j-1] == '\t' || b[j-1] == '\n' || b[j-1] == '\r') {
		j--
	}
	return b[i:j]
}

func responsesKind(name string) Kind {
	switch name {
	case "response.created", "response.in_progress", "response.queued",
		"ping", "keepalive", "keep-alive", "heartbeat":
		return Preamble
	case "error", "response.failed":
		return ErrorFrame
	case "response.completed", "response.incomplete":
		return Terminal
	}
	return Content
}

func classifyAnthropic(name string, data []byte) Kind {
	var t top
	if name == "" {
		t = scanTop(data)
		switch {
		case !t.ok:
			return Content
		case t.err:
			return ErrorFrame
		}
		name = knownName(t.typ)
		if name == "" && len(t.typ) > 0 {
			return Content
		}
	}
	switch name {
	case "message_start", "content_block_start", "ping", "keepalive", "keep-alive", "heartbeat":
		return Preamble
	case "message_stop":
		return Terminal
	case "error":
		return ErrorFrame
	case "message_delta":
		if t.typ == nil {
			t = scanTop(data)
		}
		if !t.ok {
			return Content
		}
		if d, ok := jsonscan.Object(t.delta); ok {
			for k, more := d.Next(); more; k, more = d.Next() {
				if string(k) == "stop_reason" && !jsonscan.IsNull(d.Value()) {
					return Content
				}
			}
		}
		return Preamble
	}
	return Content
}

// top holds the top-level keys Classify cares about.
type top struct {
	typ   []byte // contents of the "type" string
	delta []byte // raw "delta" value
	err   bool   // a non-null top-level "error"
	ok    bool   // data is a well-formed JSON object
}

func scanTop(data []byte) (t top) {
	it, ok := jsonscan.Object(data)
	if !ok {
		return t
	}
	for k, more := it.Next(); more; k, more = it.Next() {
		switch string(k) {
		case "type":
			if s := jsonscan.StringValue(it.Value()); s != nil {
				t.typ = s
			}
		case "error":
			if !jsonscan.IsNull(it.Value()) {
				t.err = true
			}
		case "delta":
			t.delta = it.Value()
		}
	}
	t.ok = it.Finished()
	return t
}

func classifyChat(data []byte) Kind {
	it, ok := jsonscan.Object(data)
	if !ok {
		return Content
	}
	kind := Preamble
	for k, more := it.Next(); more; k, more = it.Next() {
		switch string(k) {
		case "error":
			if !jsonscan.IsNull(it.Value()) {
				return ErrorFrame
			}
		case "choices":
			arr, ok := it.Enter('[', ']')
			if !ok {
				return Content
			}
			kind = max(kind, chatChoices(&arr))
			it.Leave(&arr)
		}
	}
	if !it.Finished() {
		return Content
	}
	return kind
}

// chatChoices ranks Preamble < Content < Terminal; ErrorFrame never comes
// from here, so max() over Kind values is the right combination. Malformed
// input is left for the caller to notice through bad.
func chatChoices(arr *jsonscan.Iter) Kind {
	kind := Preamble
	for _, more := arr.Next(); more; _, more = arr.Next() {
		obj, ok := arr.Enter('{', '}')
		if !ok {
			return Content
		}
		for k, more := obj.Next(); more; k, more = obj.Next() {
			switch string(k) {
			case "finish_reason":
				if !jsonscan.IsNull(obj.Value()) {
					kind = Terminal
				}
			case "delta", "message":
				kind = max(kind, chatDelta(&obj))
			case "text":
				if !jsonscan.IsEmpty(obj.Value()) {
					kind = max(kind, Content)
				}
			}
		}
		arr.Leave(&obj)
	}
	return kind
}

// chatDelta classifies the delta value the iterator is positioned at.
func chatDelta(parent *jsonscan.Iter) Kind {
	obj, ok := parent.Enter('{', '}')
	if !ok {
		return Preamble // null; anything else is caught as malformed or ignored
	}
	kind := Preamble
	for k, more := obj.Next(); more; k, more = obj.Next() {
		switch string(k) {
		case "content", "reasoning_content", "reasoning", "reasoning_details",
			"refusal", "tool_calls", "function_call", "audio":
			if !jsonscan.IsEmpty(obj.Value()) {
				kind = Content
			}
		}
	}
	parent.Leave(&obj)
	return kind
}
