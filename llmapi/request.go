// Package llmapi knows the shape of OpenAI- and Anthropic-style API requests
// just well enough to route them: which API a path belongs to, the few
// top-level fields the gateway needs, and each API's own error format.
// It never re-encodes a request: the body that reaches an upstream is the
// client's, byte for byte, except for the value of "model" when a route
// renames it.
package llmapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"

	"github.com/llmfailover/caddy-llm-failover/internal/jsonscan"
)

// API identifies the upstream API a request path belongs to.
type API uint8

const (
	Unknown API = iota
	OpenAIChat
	OpenAIResponses
	OpenAICompletions
	OpenAIEmbeddings
	OpenAIModels
	AnthropicMessages
	AnthropicCountTokens
)

var apiNames = [...]string{"unknown", "openai_chat", "openai_responses", "openai_completions", "openai_embeddings", "openai_models", "anthropic_messages", "anthropic_count_tokens"}

func (a API) String() string {
	if int(a) < len(apiNames) {
		return apiNames[a]
	}
	return "unknown"
}

// Anthropic reports whether errors on this API use Anthropic's format.
func (a API) Anthropic() bool { return a == AnthropicMessages || a == AnthropicCountTokens }

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

var (
	// ErrMalformed means the body is not a JSON object.
	ErrMalformed = errors.New("request body is not a valid JSON object")
	// ErrNoModel means the body has no string "model" field.
	ErrNoModel = errors.New(`request body has no "model" field`)
)

// Request holds the top-level fields of a request body that routing and
// billing depend on. Everything else stays opaque.
type Request struct {
	Model  string
	Stream bool
	// MaxOutput is max_tokens, max_completion_tokens or max_output_tokens,
	// whichever the client set (0 when none).
	MaxOutput int64
	// N is the number of choices asked for (1 when absent).
	N int
	// IncludeUsage is stream_options.include_usage as the client sent it.
	IncludeUsage bool
	// HasStreamOptions reports whether the client sent stream_options at all.
	HasStreamOptions bool
	// Images counts image parts (an over-estimate: each may be counted more
	// than once), because images cost tokens their bytes do not show.
	Images int

	modelStart, modelEnd int // byte span of the "model" value, quotes included
}

// ParseRequest reads the top-level fields of a JSON request body.
func ParseRequest(body []byte) (Request, error) {
	req := Request{N: 1}
	if !json.Valid(body) {
		return req, ErrMalformed
	}
	foundModel := false
	err := eachTopLevel(body, func(key []byte, start, end int) error {
		val := body[start:end]
		switch string(key) {
		case "model":
			if val[0] != '"' {
				return ErrNoModel
			}
			if err := json.Unmarshal(val, &req.Model); err != nil {
				return ErrNoModel
			}
			req.modelStart, req.modelEnd = start, end
			foundModel = true
		case "stream":
			req.Stream = string(val) == "true"
		case "max_tokens", "max_completion_tokens", "max_output_tokens":
			if n, err := strconv.ParseInt(string(val), 10, 64); err == nil && n > req.MaxOutput {
				req.MaxOutput = n
			}
		case "n":
			if n, err := strconv.Atoi(string(val)); err == nil && n > 1 {
				req.N = n
			}
		case "stream_options":
			req.HasStreamOptions = val[0] == '{'
			var so struct {
				IncludeUsage bool `json:"include_usage"`
			}
			if req.HasStreamOptions && json.Unmarshal(val, &so) == nil {
				req.IncludeUsage = so.IncludeUsage
			}
		}
		return nil
	})
	if err != nil {
		return req, err
	}
	if !foundModel || req.Model == "" {
		return req, ErrNoModel
	}
	req.Images = bytes.Count(body, []byte(`"image_url"`)) + bytes.Count(body, []byte(`"input_image"`)) + bytes.Count(body, []byte(`"image"`))
	return req, nil
}

// WithModel returns body with the value of its top-level "model" replaced.
// The result is a new slice; body is left untouched so that it can still be
// replayed to other channels.
func (r Request) WithModel(body []byte, model string) []byte {
	if r.modelEnd == 0 || model == r.Model {
		return body
	}
	quoted, _ := json.Marshal(model)
	out := make([]byte, 0, len(body)-(r.modelEnd-r.modelStart)+len(quoted))
	out = append(out, body[:r.modelStart]...)
	out = append(out, quoted...)
	return append(out, body[r.modelEnd:]...)
}

// WithIncludeUsage returns body with "stream_options":{"include_usage":true}
// added as the last top-level field, so that an OpenAI chat stream reports
// the usage billing needs. Callers use it only when the client sent no
// stream_options (rewriting a client's own object is not worth the risk).
func WithIncludeUsage(body []byte) []byte {
	end := bytes.LastIndexByte(body, '}')
	if end < 0 {
		return body
	}
	const field = `"stream_options":{"include_usage":true}`
	out := make([]byte, 0, len(body)+len(field)+1)
	out = append(out, body[:end]...)
	// An empty object gets no separator.
	if head := bytes.TrimSpace(body[:end]); len(head) > 0 && head[len(head)-1] != '{' {
		out = append(out, ',')
	}
	out = append(out, field...)
	return append(out, body[end:]...)
}

// eachTopLevel calls fn with every key of the top-level object in body and
// the byte span of its value. body must be valid JSON (json.Valid).
func eachTopLevel(body []byte, fn func(key []byte, start, end int) error) error {
	it, ok := jsonscan.Object(body)
	if !ok {
		return ErrMalformed
	}
	for key, ok := it.Next(); ok; key, ok = it.Next() {
		if bytes.IndexByte(key, '\\') >= 0 {
			var s string
			// Rare: a key written with escapes ("mod\u0065l").
			quoted := append(append([]byte{'"'}, key...), '"')
			if json.Unmarshal(quoted, &s) == nil {
				key = []byte(s)
			}
		}
		start := it.Pos()
		v := it.Value()
		if v == nil {
			return ErrMalformed
		}
		if err := fn(key, start, start+len(v)); err != nil {
			return err
		}
	}
	if !it.Finished() {
		return ErrMalformed
	}
	return nil
}
