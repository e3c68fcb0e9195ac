package provider

import (
	"bytes"
	"context"
	"encoding/binary"
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

// maxFrame bounds one event-stream frame: a frame is read whole before it
// is decoded, and its length prefix would let an upstream make the
// gateway hold up to 4 GiB. A real one carries a chunk of a few tokens;
// none comes near this.
const maxFrame = 1 << 20

// minFrame is the length of a frame with no headers and no payload: the
// prelude (total length, headers length, prelude checksum) and the
// message checksum, 4 bytes each.
const minFrame = 16

// eventStreamSSE reads AWS event-stream frames and yields one SSE event
// per frame. An exception ends the stream after its error event.
type eventStreamSSE struct {
	src     io.Reader
	hold    Holder
	dec     *eventstream.Decoder
	frame   []byte
	payload []byte
	pending []byte
	done    error
}

func newEventStreamSSE(ctx context.Context, src io.Reader) *eventStreamSSE {
	return &eventStreamSSE{src: src, hold: holderFrom(ctx), dec: eventstream.NewDecoder()}
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
// once the bytes are read. The frame is read whole, at most maxFrame of
// it, and counted against the memory budget while it is.
func (e *eventStreamSSE) next() ([]byte, error) {
	var prelude [4]byte
	if _, err := io.ReadFull(e.src, prelude[:]); err != nil {
		if errors.Is(err, io.EOF) { // at a frame boundary; a cut frame is an error
			return nil, io.EOF
		}
		return nil, fmt.Errorf("bedrock event stream: %w", err)
	}
	n := binary.BigEndian.Uint32(prelude[:])
	if n > maxFrame {
		return nil, fmt.Errorf("bedrock event stream: a frame of %d bytes, over the %d a frame may have", n, maxFrame)
	}
	if n < minFrame {
		// Shorter than its own prelude and checksum: no frame at all.
		return nil, fmt.Errorf("bedrock event stream: a frame of %d bytes, under the %d of an empty one", n, minFrame)
	}
	if e.hold.Hold(int64(n)) {
		e.hold.Release(int64(n))
		return nil, fmt.Errorf("bedrock event stream: %w", ErrMemoryBudget)
	}
	defer e.hold.Release(int64(n))
	// The budget counts a frame only while it is read: a large one's
	// buffers go with it, not with the stream (which may last long).
	defer e.shrink()
	if cap(e.frame) < int(n) {
		e.frame = make([]byte, n)
	}
	frame := e.frame[:n]
	copy(frame, prelude[:])
	if _, err := io.ReadFull(e.src, frame[4:]); err != nil {
		return nil, fmt.Errorf("bedrock event stream: %w", err)
	}
	msg, err := e.dec.Decode(bytes.NewReader(frame), e.payload[:0])
	if err != nil {
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
		if bytes.ContainsAny(chunk.Bytes, "\r\n") {
			// An SSE data line ends at a line break: the event's JSON must
			// be on one line, whatever whitespace the upstream put in it.
			var flat bytes.Buffer
			if json.Compact(&flat, chunk.Bytes) != nil {
				return nil, fmt.Errorf("bedrock event stream: malformed chunk")
			}
			chunk.Bytes = flat.Bytes()
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

// keptFrameBuffer is the largest frame and payload buffer a stream keeps
// for its next frame; real frames carry a few tokens and fit.
const keptFrameBuffer = 64 << 10

// shrink lets go of buffers a large frame grew.
func (e *eventStreamSSE) shrink() {
	if cap(e.frame) > keptFrameBuffer {
		e.frame = nil
	}
	if cap(e.payload) > keptFrameBuffer {
		e.payload = nil
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
