package provider

import (
	"bytes"
	"encoding/json"
)

// What OpenTelemetry's GenAI semantic conventions call an operation and a
// provider, and what an answer says of itself (the model that produced
// it, why it finished), for the gateway's trace spans. It is read only
// when a request is traced: an untraced answer is not parsed for it.

// Operation is the API's gen_ai.operation.name: chat (chat completions,
// Responses, Messages), text_completion, embeddings; "" for the rest.
func (a API) Operation() string {
	switch a {
	case OpenAIChat, OpenAIResponses, AnthropicMessages:
		return "chat"
	case OpenAICompletions:
		return "text_completion"
	case OpenAIEmbeddings:
		return "embeddings"
	}
	return ""
}

// ProviderNamer is implemented by adapters whose provider has its own
// gen_ai.provider.name; the rest are "openai", whose format they speak.
type ProviderNamer interface {
	ProviderName() string
}

// ProviderName: anthropic.
func (Anthropic) ProviderName() string { return "anthropic" }

// ProviderName: azure.ai.openai.
func (*Azure) ProviderName() string { return "azure.ai.openai" }

// ProviderName: aws.bedrock.
func (*Bedrock) ProviderName() string { return "aws.bedrock" }

// ProviderName: gcp.vertex_ai.
func (*Vertex) ProviderName() string { return "gcp.vertex_ai" }

// ProviderName: gcp.gemini.
func (*Gemini) ProviderName() string { return "gcp.gemini" }

// ProviderNameOf is a's gen_ai.provider.name.
func ProviderNameOf(a Adapter) string {
	if n, ok := a.(ProviderNamer); ok {
		return n.ProviderName()
	}
	return "openai"
}

// Interface guards.
var (
	_ ProviderNamer = Anthropic{}
	_ ProviderNamer = (*Azure)(nil)
	_ ProviderNamer = (*Bedrock)(nil)
	_ ProviderNamer = (*Vertex)(nil)
	_ ProviderNamer = (*Gemini)(nil)
)

// Described is what an answer said of itself: the model that produced it
// and its finish reasons, in the provider's words (stop, length,
// end_turn, tool_use, …), one per choice.
type Described struct {
	Model         string
	FinishReasons []string
}

// Describe makes the meter read what each answer says of itself from
// now on (Described); without it nothing is parsed for it.
func (m *Meter) Describe() { m.describing = true }

// Described is what the answer said of itself so far.
func (m *Meter) Described() Described { return m.described }

var (
	// modelKey (rename.go) names the model.
	finishKey = []byte(`_reason"`) // finish_reason, stop_reason
	statusKey = []byte(`"status"`)
)

// describedFields are the fields, in every API's answers and events, that
// say which model answered and why it finished.
type describedFields struct {
	Model   string `json:"model"`
	Choices []struct {
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	// Anthropic: a message's stop_reason, in the body or message_delta's
	// delta; the model in message_start's message.
	StopReason *string `json:"stop_reason"`
	Delta      struct {
		StopReason *string `json:"stop_reason"`
	} `json:"delta"`
	Message struct {
		Model string `json:"model"`
	} `json:"message"`
	// Responses: the response object, whole or in response.* events.
	Status            string `json:"status"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	Response *struct {
		Model             string `json:"model"`
		Status            string `json:"status"`
		IncompleteDetails *struct {
			Reason string `json:"reason"`
		} `json:"incomplete_details"`
	} `json:"response"`
}

// describe reads one event's data or a whole body, when it can say
// anything: only data naming a model, a reason or a status is parsed.
func (m *Meter) describe(data []byte) {
	if !bytes.Contains(data, modelKey) && !bytes.Contains(data, finishKey) && !bytes.Contains(data, statusKey) {
		return
	}
	var f describedFields
	if json.Unmarshal(data, &f) != nil {
		return
	}
	d := &m.described
	for _, model := range []string{f.Model, f.Message.Model} {
		if d.Model == "" && model != "" {
			d.Model = model
		}
	}
	for _, c := range f.Choices {
		if c.FinishReason != nil && *c.FinishReason != "" {
			d.FinishReasons = append(d.FinishReasons, *c.FinishReason)
		}
	}
	for _, r := range []*string{f.StopReason, f.Delta.StopReason} {
		if r != nil && *r != "" {
			d.FinishReasons = append(d.FinishReasons, *r)
		}
	}
	status, incomplete := f.Status, f.IncompleteDetails
	if f.Response != nil {
		if d.Model == "" {
			d.Model = f.Response.Model
		}
		status, incomplete = f.Response.Status, f.Response.IncompleteDetails
	}
	switch {
	case status == "completed":
		d.FinishReasons = append(d.FinishReasons, "stop")
	case status == "incomplete" && incomplete != nil && incomplete.Reason != "":
		d.FinishReasons = append(d.FinishReasons, incomplete.Reason)
	case status == "failed" || status == "cancelled":
		d.FinishReasons = append(d.FinishReasons, status)
	}
}
