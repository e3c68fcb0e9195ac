package provider

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
)

// probeAPIs are the APIs a synthetic check can speak, most common first:
// a channel is probed over the first one its adapter serves.
var probeAPIs = [...]API{OpenAIChat, AnthropicMessages}

// modelAPIs is implemented by an adapter whose upstream serves each model
// over one API only, chosen by the model's name (Vertex: Claude over
// Anthropic's Messages, the rest over its OpenAI-compatible endpoint).
type modelAPIs interface {
	ModelAPI(model string) API
}

// ProbeAPI returns the API a synthetic check of model (the name the
// channel knows it by) on a channel served by a speaks, and false when a
// serves none a probe can be written in.
func ProbeAPI(a Adapter, model string) (API, bool) {
	if m, ok := a.(modelAPIs); ok {
		api := m.ModelAPI(model)
		return api, api == OpenAIChat || api == AnthropicMessages
	}
	for _, api := range probeAPIs {
		if a.Serves(api) {
			return api, true
		}
	}
	return Unknown, false
}

// ProbeRequest writes the path and body of a synthetic check in api (a
// probe's, or the doctor's): one user message with at most maxTokens of
// output, streamed or not. Reasoning is kept to what the API does by
// default with no reasoning parameter: none on Anthropic (thinking is
// opt-in), the model's own default on OpenAI-style hosts, whose
// non-reasoning models refuse reasoning_effort. On OpenAI chat the limit
// is max_tokens, which every host knows, or max_completion_tokens when
// completionTokens is set: OpenAI's and Azure's reasoning models (o-series,
// GPT-5) refuse max_tokens (WantsCompletionTokens). header holds what a
// client would send.
func ProbeRequest(api API, model, prompt string, maxTokens int, stream, completionTokens bool) (path string, header http.Header, body []byte, err error) {
	header = http.Header{"Content-Type": {"application/json"}}
	msgs := []map[string]string{{"role": "user", "content": prompt}}
	var v any
	switch api {
	case OpenAIChat:
		path = "/v1/chat/completions"
		var opts map[string]bool
		if stream {
			opts = map[string]bool{"include_usage": true}
		}
		// One limit field or the other, never both (omitempty); a check
		// always has a limit (maxTokens > 0).
		mt, mct := maxTokens, 0
		if completionTokens {
			mt, mct = 0, maxTokens
		}
		v = struct {
			Model               string              `json:"model"`
			Messages            []map[string]string `json:"messages"`
			MaxTokens           int                 `json:"max_tokens,omitempty"`
			MaxCompletionTokens int                 `json:"max_completion_tokens,omitempty"`
			Stream              bool                `json:"stream,omitempty"`
			StreamOptions       map[string]bool     `json:"stream_options,omitempty"`
		}{model, msgs, mt, mct, stream, opts}
	case AnthropicMessages:
		path = "/v1/messages"
		header.Set("Anthropic-Version", anthropicVersion)
		v = struct {
			Model     string              `json:"model"`
			Messages  []map[string]string `json:"messages"`
			MaxTokens int                 `json:"max_tokens"`
			Stream    bool                `json:"stream,omitempty"`
		}{model, msgs, maxTokens, stream}
	default:
		return "", nil, nil, fmt.Errorf("no synthetic check is written in the %s API", api)
	}
	body, err = json.Marshal(v)
	return path, header, body, err
}

// WantsCompletionTokens reports whether an upstream's answer to a check
// (its status and the start of its body) refuses max_tokens for
// max_completion_tokens, as OpenAI and Azure answer for their reasoning
// models: "Unsupported parameter: 'max_tokens' is not supported with this
// model. Use 'max_completion_tokens' instead."
func WantsCompletionTokens(status int, body []byte) bool {
	return status == http.StatusBadRequest && bytes.Contains(body, []byte("max_completion_tokens")) && bytes.Contains(body, []byte("max_tokens"))
}
