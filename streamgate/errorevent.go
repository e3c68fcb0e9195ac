package streamgate

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Errors returned by CheckBody.
var (
	ErrErrorBody     = errors.New("streamgate: 2xx body is an error object")
	ErrMalformedBody = errors.New("streamgate: 2xx body is not valid JSON")
)

type openAIErrorEvent struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Code    *string `json:"code"`
	} `json:"error"`
}

type responsesErrorEvent struct {
	Type    string  `json:"type"`
	Code    *string `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
}

type anthropicErrorEvent struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// ErrorEvent renders one final error event in the client's dialect, in the
// shape the provider itself uses for in-stream errors so that client SDKs
// raise it as an API error. An empty code renders as null.
func ErrorEvent(d Dialect, code, message string) []byte {
	var c *string
	if code != "" {
		c = &code
	}
	var (
		prefix string
		v      any
	)
	switch d {
	case OpenAIResponses:
		prefix = "event: error\ndata: "
		v = responsesErrorEvent{Type: "error", Code: c, Message: message}
	case AnthropicMessages:
		prefix = "event: error\ndata: "
		e := anthropicErrorEvent{Type: "error"}
		e.Error.Type, e.Error.Message = "api_error", message
		v = e
	default:
		prefix = "data: "
		var e openAIErrorEvent
		e.Error.Message, e.Error.Type, e.Error.Code = message, "server_error", c
		v = e
	}
	body, err := json.Marshal(v)
	if err != nil {
		// Plain structs of strings cannot fail to marshal.
		panic(fmt.Sprintf("streamgate: marshal error event: %v", err))
	}
	out := make([]byte, 0, len(prefix)+len(body)+2)
	out = append(out, prefix...)
	out = append(out, body...)
	return append(out, '\n', '\n')
}

// CheckBody inspects a complete, non-streaming 2xx JSON body. It returns an
// error wrapping ErrErrorBody for an error object in disguise (a non-null
// top-level "error", or "type":"error" as Anthropic sends), one wrapping
// ErrMalformedBody for invalid or truncated JSON, and nil otherwise. Only
// the top level is walked, so large bodies cost one validation pass and one
// skim.
func CheckBody(body []byte) error {
	if !json.Valid(body) {
		return fmt.Errorf("%w (%d bytes)", ErrMalformedBody, len(body))
	}
	t := scanTop(body)
	if !t.ok {
		return nil // valid JSON but not an object: nothing to unmask
	}
	switch {
	case t.err:
		return fmt.Errorf("%w: top-level \"error\" member", ErrErrorBody)
	case string(t.typ) == "error":
		return fmt.Errorf("%w: \"type\":\"error\"", ErrErrorBody)
	}
	return nil
}
