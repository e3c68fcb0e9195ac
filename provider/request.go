package provider

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/llmfailover/caddy-llm-failover/internal/jsonscan"
	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

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

// ParseRequest reads the top-level fields of a JSON request body of the
// API. Every API the gateway serves names its model and limits in the same
// top-level fields, so the API does not change the result today.
func (API) ParseRequest(body []byte) (Request, error) {
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

// AskUsage makes sure an attempt's answer reports the token usage billing
// needs. An OpenAI chat stream reports usage only when asked: when the
// client sent no stream_options, out asks for it and hide recognises the
// extra usage-only chunk, which the client did not ask for and must not
// see. Otherwise out is body and hide is nil. (Rewriting a client's own
// stream_options is not worth the risk.)
func (a API) AskUsage(body []byte, req Request) (out []byte, hide func(streamgate.Event) bool) {
	if a != OpenAIChat || !req.Stream || req.HasStreamOptions {
		return body, nil
	}
	return withIncludeUsage(body), isUsageOnlyChunk
}

// withIncludeUsage returns body with "stream_options":{"include_usage":true}
// added as the last top-level field.
func withIncludeUsage(body []byte) []byte {
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

// isUsageOnlyChunk reports whether an OpenAI chat stream event carries only
// usage (an empty or absent choices array), i.e. the extra chunk that
// stream_options.include_usage adds.
func isUsageOnlyChunk(ev streamgate.Event) bool {
	if !bytes.Contains(ev.Data, usageKey) {
		return false
	}
	var c struct {
		Choices []json.RawMessage `json:"choices"`
		Usage   json.RawMessage   `json:"usage"`
	}
	if json.Unmarshal(ev.Data, &c) != nil {
		return false
	}
	return len(c.Choices) == 0 && len(c.Usage) > 0 && !bytes.Equal(c.Usage, []byte("null"))
}
