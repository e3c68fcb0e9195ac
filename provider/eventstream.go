package provider

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
)

// This file turns Bedrock's binary event stream into the Anthropic SSE a
// Messages client expects.

// bedrockExceptions maps Bedrock's exception frames to the Anthropic error
// type of the same status: throttling 429, service unavailable 503,
// internal 500, model stream error 424, model timeout 408, validation 400.
// The stream gate fails over on every one but validation before content;
// after content the client gets the error event.
var bedrockExceptions = map[string]string{
	"throttlingException":         "rate_limit_error",
	"serviceUnavailableException": "overloaded_error",
	"internalServerException":     "api_error",
	"modelStreamErrorException":   "api_error",
	"modelTimeoutException":       "timeout_error",
	"validationException":         "invalid_request_error",
}

// eventStreamSSE reads AWS event-stream frames and yields one SSE event
// per frame. An exception ends the stream after its error event.
type eventStreamSSE struct {
	src     io.Reader
	dec     *eventstream.Decoder
	payload []byte
	pending []byte
	done    error
}

func newEventStreamSSE(src io.Reader) *eventStreamSSE {
	return &eventStreamSSE{src: src, dec: eventstream.NewDecoder()}
}

func (e *eventStreamSSE) Read(p []byte) (int, error) {
	for len(e.pending) == 0 {
		if e.done != nil {
			return 0, e.done
		}
		e.pending, e.done = e.next()
	}
	n := copy(p, e.pending)
	e.pending = e.pending[n:]
	return n, nil
}

// next decodes one frame into SSE bytes; a non-nil error ends the stream
// once the bytes are read.
func (e *eventStreamSSE) next() ([]byte, error) {
	msg, err := e.dec.Decode(e.src, e.payload[:0])
	if err != nil {
		if errors.Is(err, io.EOF) { // at a frame boundary; a cut frame is an error
			return nil, io.EOF
		}
		return nil, fmt.Errorf("bedrock event stream: %w", err)
	}
	e.payload = msg.Payload
	switch header(msg, ":message-type") {
	case "event":
		if header(msg, ":event-type") != "chunk" {
			return nil, nil // initial-response and the like carry nothing
		}
		var chunk struct {
			Bytes []byte `json:"bytes"` // base64 in the JSON
		}
		if err := json.Unmarshal(msg.Payload, &chunk); err != nil || len(chunk.Bytes) == 0 {
			return nil, fmt.Errorf("bedrock event stream: malformed chunk")
		}
		t := scanTop(chunk.Bytes)
		out := make([]byte, 0, len(chunk.Bytes)+len(t.typ)+16)
		if len(t.typ) > 0 {
			out = append(append(append(out, "event: "...), t.typ...), '\n')
		}
		out = append(append(out, "data: "...), chunk.Bytes...)
		return append(out, '\n', '\n'), nil
	case "exception":
		typ := header(msg, ":exception-type")
		var m struct {
			Message string `json:"message"`
		}
		_ = json.Unmarshal(msg.Payload, &m)
		return bedrockErrorEvent(typ, typ+": "+bedrockHint(m.Message)), io.EOF
	default: // "error"
		code := header(msg, ":error-code")
		return bedrockErrorEvent(code, code+": "+header(msg, ":error-message")), io.EOF
	}
}

func bedrockErrorEvent(exception, message string) []byte {
	typ, ok := bedrockExceptions[exception]
	if !ok {
		typ = "api_error"
	}
	return sseEvent("error", anthropicError{Type: "error", Error: anthropicDetail{Type: typ, Message: message}})
}

func header(m eventstream.Message, name string) string {
	if v := m.Headers.Get(name); v != nil {
		return v.String()
	}
	return ""
}
