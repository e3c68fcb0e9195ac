package provider

import (
	"fmt"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/llmfailover/caddy-llm-failover/internal/jsonscan"
)

// This file holds how an OpenAI-compatible upstream is asked to continue
// a final assistant message (stream_resume). The OpenAI API itself has
// no such option, and the hosts that have one document different ones,
// so the operator names the channel's.

// The values of the openai provider's continuation option.
const (
	// ContinuePrefix marks the final assistant message "prefix": true
	// (DeepSeek's chat prefix completion, on its /beta base URL; Mistral).
	ContinuePrefix = "prefix"
	// ContinueFinalMessage sets "continue_final_message": true and
	// "add_generation_prompt": false (vLLM, and servers built on its chat
	// template handling).
	ContinueFinalMessage = "continue_final_message"
	// ContinuePrefill sends the final assistant message as it is, for
	// servers that continue a trailing assistant message (llama.cpp's
	// llama-server).
	ContinuePrefill = "prefill"
	// ContinueInstructed asks in a user turn to continue the delivered
	// text (the default: the OpenAI API and most hosts have no prefill).
	ContinueInstructed = "instructed"
	// ContinueOff never asks the host to continue a chat answer.
	ContinueOff = "off"
)

// continuations are the option's values, as the error message lists them.
var continuations = []string{ContinueInstructed, ContinuePrefix, ContinueFinalMessage, ContinuePrefill, ContinueOff}

// ContinuationForm: a pass-through channel speaking Messages forwards the
// prefill unchanged (learning, like Anthropic's, when its model refuses
// one); chat is continued in the form the operator named, instructed by
// default.
func (o OpenAI) ContinuationForm(api API) ContinuationForm {
	switch {
	case api == AnthropicMessages:
		return Prefill
	case api != OpenAIChat || o.Continuation == ContinueOff:
		return CannotContinue
	case o.Continuation == "" || o.Continuation == ContinueInstructed:
		return Instructed
	}
	return Prefill
}

// Validate refuses an unknown continuation option (Caddy calls it when it
// loads the module; the configuration check, for the Caddyfile's line).
func (o OpenAI) Validate() error {
	if o.Continuation != "" && !slices.Contains(continuations, o.Continuation) {
		return fmt.Errorf("continuation %q: want one of %s", o.Continuation, strings.Join(continuations, ", "))
	}
	return nil
}

var _ caddy.Validator = OpenAI{}

// UnmarshalCaddyfile sets up the adapter from `provider openai { ... }`.
func (o *OpenAI) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return unmarshalOptions(d, map[string]*string{"continuation": &o.Continuation})
}

// continueBody marks a chat continuation's body (its final message is
// the assistant's text so far) the way the channel's host documents it.
func (o OpenAI) continueBody(body []byte) []byte {
	switch o.Continuation {
	case ContinuePrefix:
		return markLastMessage(body, `"prefix":true`)
	case ContinueFinalMessage:
		return rewriteTop(body, []string{"continue_final_message", "add_generation_prompt"},
			`"continue_final_message":true`, `"add_generation_prompt":false`)
	}
	return body
}

// markLastMessage returns body with member (already encoded) added first
// in the last element of its top-level messages array, or body unchanged
// when it has none.
func markLastMessage(body []byte, member string) []byte {
	at := -1
	_ = eachTopLevel(body, func(key []byte, start, end int) error {
		if string(key) != "messages" {
			return nil
		}
		arr, ok := jsonscan.Array(body[start:end])
		if !ok {
			return nil
		}
		for _, more := arr.Next(); more; _, more = arr.Next() {
			if arr.Peek() == '{' {
				at = start + arr.Pos() + 1
			} else {
				at = -1
			}
		}
		return nil
	})
	if at < 0 {
		return body
	}
	out := make([]byte, 0, len(body)+len(member)+1)
	out = append(append(out, body[:at]...), member...)
	if i := jsonscan.SkipWS(body, at); i < len(body) && body[i] != '}' {
		out = append(out, ',')
	}
	return append(out, body[at:]...)
}
