package provider

import (
	"net/http"

	"github.com/llmfailover/caddy-llm-failover/internal/jsonscan"
	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

// This file holds the Anthropic family's wire format: Messages API events
// and error shapes.

// anthropicDialect is /v1/messages: typed events, usually named.
var anthropicDialect = dialect{
	overflow: func(name string) streamgate.Kind {
		if name == "message_stop" {
			return streamgate.Terminal
		}
		return streamgate.Content
	},
	data: classifyAnthropic,
}

var anthropicKinds = newKinds(map[string]streamgate.Kind{
	"message_start":       streamgate.Preamble,
	"content_block_start": streamgate.Preamble,
	"message_stop":        streamgate.Terminal,
	"error":               streamgate.ErrorFrame,
})

func classifyAnthropic(name string, data []byte) streamgate.Kind {
	var t top
	if name == "" {
		t = scanTop(data)
		switch {
		case !t.ok:
			return streamgate.Content
		case t.err:
			return streamgate.ErrorFrame
		}
		switch string(t.typ) {
		case "message_delta":
		case "content_block_delta":
			return blockDelta(t.delta)
		default:
			return anthropicKinds.ofType(t.typ)
		}
	} else if name == "content_block_delta" {
		return blockDelta(scanTop(data).delta)
	} else if name != "message_delta" {
		return anthropicKinds.of(name)
	}
	// A message_delta decides the stream only when it carries the stop
	// reason; a usage-only delta says nothing.
	if t.typ == nil {
		t = scanTop(data)
	}
	if !t.ok {
		return streamgate.Content
	}
	if d, ok := jsonscan.Object(t.delta); ok {
		for k, more := d.Next(); more; k, more = d.Next() {
			if string(k) == "stop_reason" && !jsonscan.IsNull(d.Value()) {
				return streamgate.Content
			}
		}
	}
	return streamgate.Preamble
}

// blockDelta classifies a content_block_delta by its delta: one whose
// text, thinking or partial_json is "" carries nothing (Claude opens each
// tool_use block's input with an empty partial_json), so it decides
// nothing, as an empty chat delta does not; any other delta is content.
func blockDelta(delta []byte) streamgate.Kind {
	d, ok := jsonscan.Object(delta)
	if !ok {
		return streamgate.Content
	}
	empty := false
	for k, more := d.Next(); more; k, more = d.Next() {
		switch string(k) {
		case "type":
			d.Value()
		case "text", "thinking", "partial_json":
			if string(d.Value()) != `""` {
				return streamgate.Content
			}
			empty = true
		default:
			d.Value()
			return streamgate.Content // a signature, a citation: content
		}
	}
	if empty && d.Finished() {
		return streamgate.Preamble
	}
	return streamgate.Content
}

// anthropicError is Anthropic's error object, as an HTTP body and as the
// data of an in-stream "error" event.
type anthropicError struct {
	Type  string          `json:"type"`
	Error anthropicDetail `json:"error"`
}

type anthropicDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

func anthropicErrorBody(e Error) []byte {
	return marshal(anthropicError{Type: "error", Error: anthropicDetail{Type: anthropicType(e.Status), Message: e.Message}})
}

func anthropicErrorEvent(_, message string) []byte {
	return sseEvent("error", anthropicError{Type: "error", Error: anthropicDetail{Type: "api_error", Message: message}})
}

// anthropicType follows Anthropic's documented error types per status.
func anthropicType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusPaymentRequired:
		return "billing_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusGatewayTimeout, http.StatusRequestTimeout:
		return "timeout_error"
	case http.StatusFailedDependency:
		// Bedrock's ModelErrorException: the model failed, not the
		// request (its stream form, modelStreamErrorException, is an
		// api_error too).
		return "api_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	}
	if status >= 400 && status < 500 {
		return "invalid_request_error"
	}
	return "api_error"
}
