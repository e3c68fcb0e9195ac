// Package fakeproviders runs local stand-ins for the cloud providers'
// LLM endpoints, speaking their real wire formats, for tests: a Vertex AI
// with its own OAuth token endpoint (a service-account JSON whose
// token_uri points at it), a Bedrock that verifies SigV4 signatures
// and streams AWS event-stream frames, an Azure OpenAI (api-key, both path
// styles, retry-after-ms, content filtering) and Google AI Studio's
// OpenAI-compatible endpoint (array-wrapped errors). Each checks what a real provider
// would refuse (a missing or expired token, a bad signature, a model in
// the body) and answers the Mode it is set to.
//
// It must not know the gateway: it is driven only over HTTP.
package fakeproviders

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
)

// Mode is how a fake answers its next requests.
type Mode int

// The modes. Not every fake has every mode; an unsupported one answers
// as OK.
const (
	OK Mode = iota
	// RateLimited answers 429 (Vertex: array-wrapped RESOURCE_EXHAUSTED).
	RateLimited
	// ExceptionBeforeContent streams a throttlingException frame first.
	ExceptionBeforeContent
	// ValidationBeforeContent streams a validationException frame first.
	ValidationBeforeContent
	// ExceptionAfterContent streams some content, then an
	// internalServerException frame.
	ExceptionAfterContent
	// ContentFiltered answers Azure's 400 content_filter.
	ContentFiltered
	// ContentFilteredStream streams some content that ends with
	// finish_reason content_filter.
	ContentFilteredStream
	// QuotaZero answers Vertex's 429 of a new project's zero quota.
	QuotaZero
	// ModelNotEnabled answers Vertex's FAILED_PRECONDITION of a model not
	// enabled in Model Garden.
	ModelNotEnabled
	// TokenRefused makes the token endpoint refuse the service account
	// (its key deleted or disabled).
	TokenRefused
)

// state is what every fake shares: its mode, its hit count, and the
// problems it found in requests.
type state struct {
	mode   atomic.Int64
	hits   atomic.Int64
	mu     sync.Mutex
	errors []string
	last   []byte // the last model request's body
}

// SetMode sets how the fake answers from now on.
func (s *state) SetMode(m Mode) { s.mode.Store(int64(m)) }

// Hits counts the model requests the fake received.
func (s *state) Hits() int { return int(s.hits.Load()) }

// LastBody is the body of the last model request received.
func (s *state) LastBody() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

func (s *state) received(body []byte) {
	s.mu.Lock()
	s.last = body
	s.mu.Unlock()
}

// Problems lists what was wrong with the requests received (bad tokens,
// signatures, URLs or bodies).
func (s *state) Problems() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.errors...)
}

func (s *state) refuse(w http.ResponseWriter, status int, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.mu.Lock()
	s.errors = append(s.errors, msg)
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"message": msg})
}

// anthropicEvents are a short Claude answer as Messages API events,
// naming model, each one JSON object.
func anthropicEvents(model, text string) []string {
	return []string{
		`{"type":"message_start","message":{"id":"msg_fake","type":"message","role":"assistant","model":"` + model + `","content":[],"stop_reason":null,"usage":{"input_tokens":12,"output_tokens":1}}}`,
		`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"` + text + `"}}`,
		`{"type":"content_block_stop","index":0}`,
		`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":5}}`,
		`{"type":"message_stop"}`,
	}
}

// anthropicMessage is the same answer as one JSON body.
func anthropicMessage(model, text string) string {
	return `{"id":"msg_fake","type":"message","role":"assistant","model":"` + model + `","content":[{"type":"text","text":"` + text + `"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":5}}`
}

// checkClaudeBody checks a Claude body as the cloud providers want it:
// no model (it is in the URL), their anthropic_version, and, like
// Anthropic's, a final assistant message (a prefill) that does not end in
// white space.
func checkClaudeBody(body []byte, version string) (stream bool, problem string) {
	var b map[string]json.RawMessage
	if err := json.Unmarshal(body, &b); err != nil {
		return false, "body is not a JSON object: " + err.Error()
	}
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	_ = json.Unmarshal(b["messages"], &msgs)
	if n := len(msgs); n > 0 && msgs[n-1].Role == "assistant" {
		var text string
		if json.Unmarshal(msgs[n-1].Content, &text) == nil && strings.TrimRight(text, " \t\r\n") != text {
			return false, "messages: final assistant content cannot end with trailing whitespace"
		}
	}
	if _, ok := b["model"]; ok {
		return false, `body has "model"`
	}
	if v := string(b["anthropic_version"]); v != `"`+version+`"` {
		return false, "anthropic_version is " + v + ", want " + version
	}
	return string(b["stream"]) == "true", ""
}
