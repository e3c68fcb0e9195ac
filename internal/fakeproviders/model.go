package fakeproviders

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"unicode/utf8"
)

// Model is what a fake's model says: one answer, continued the way real
// models continue a cut answer. Set on a fake with SetModel; without one,
// a fake answers its fixed greeting.
type Model struct {
	// Answer is the whole answer, streamed a few bytes per delta.
	Answer string
	// NoPrefill refuses a conversation ending with an assistant message
	// with the 400 Claude 4.6 and later models give (NoPrefillMessage).
	// Without it, such a message is a prefill the answer continues, as on
	// older Claude models.
	NoPrefill bool
	// PrefixIsContext treats a final assistant message as context, not as
	// a prefix, as the OpenAI API does: the model starts a new answer.
	PrefixIsContext bool
	// Repeat is how many bytes of the delivered text's tail a
	// continuation asked for in words repeats before going on, as models
	// sometimes do.
	Repeat int
	// Restart, when set, is what such a continuation says instead: the
	// answer started over.
	Restart string
}

// NoPrefillMessage is Anthropic's refusal of a prefill on Claude 4.6 and
// later models.
const NoPrefillMessage = "This model does not support assistant message prefill. The conversation must end with a user message."

// modelSlot holds a fake's Model.
type modelSlot struct{ m atomic.Pointer[Model] }

// SetModel makes the fake answer as m (nil: its fixed greeting).
func (s *modelSlot) SetModel(m *Model) { s.m.Store(m) }

// reply is what the fake's model answers a request body with (Messages
// or chat, whose messages look alike), or the refusal of a prefill; ok
// is false when no Model is set.
func (s *modelSlot) reply(body []byte) (text, refusal string, ok bool) {
	m := s.m.Load()
	if m == nil {
		return "", "", false
	}
	var req struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	_ = json.Unmarshal(body, &req)
	n := len(req.Messages)
	if n == 0 {
		return m.Answer, "", true
	}
	last := req.Messages[n-1]
	switch {
	case last.Role == "assistant" && m.NoPrefill:
		return "", NoPrefillMessage, true
	case last.Role == "assistant" && !m.PrefixIsContext:
		// A prefill: the answer goes on from it.
		return strings.TrimPrefix(m.Answer, strings.TrimRight(contentText(last.Content), " \t\r\n")), "", true
	case last.Role == "user" && n >= 2 && req.Messages[n-2].Role == "assistant" &&
		strings.Contains(strings.ToLower(contentText(last.Content)), "continue"):
		// Asked in words to continue its previous message.
		if m.Restart != "" {
			return m.Restart, "", true
		}
		delivered := contentText(req.Messages[n-2].Content)
		if !strings.HasPrefix(m.Answer, delivered) {
			return m.Answer, "", true
		}
		return m.Answer[max(0, len(delivered)-m.Repeat):], "", true
	}
	return m.Answer, "", true
}

// contentText is a message's text: a string, or its text blocks joined.
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var blocks []struct {
		Type, Text string
	}
	_ = json.Unmarshal(raw, &blocks)
	var b strings.Builder
	for _, bl := range blocks {
		if bl.Type == "text" {
			b.WriteString(bl.Text)
		}
	}
	return b.String()
}

// pieces splits text into deltas of about n bytes, on rune boundaries.
func pieces(text string, n int) []string {
	var out []string
	for len(text) > 0 {
		i := min(n, len(text))
		for i < len(text) && !utf8.RuneStart(text[i]) {
			i++
		}
		out = append(out, text[:i])
		text = text[i:]
	}
	return out
}

// modelEvents is text as a Claude stream's events, a few bytes per delta.
func modelEvents(model, text string) []string {
	evs := []string{
		`{"type":"message_start","message":{"id":"msg_fake","type":"message","role":"assistant","model":"` + model + `","content":[],"stop_reason":null,"usage":{"input_tokens":12,"output_tokens":1}}}`,
		`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
	}
	for _, p := range pieces(text, 6) {
		d, _ := json.Marshal(map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]string{"type": "text_delta", "text": p}})
		evs = append(evs, string(d))
	}
	return append(evs, `{"type":"content_block_stop","index":0}`,
		fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":%d}}`, len(text)/4+1),
		`{"type":"message_stop"}`)
}

// claudeEvents is what a Claude fake streams for body: its Model's reply,
// or its fixed greeting.
func (s *modelSlot) claudeEvents(model, greeting string, body []byte) (events []string, refusal string) {
	text, refusal, ok := s.reply(body)
	if !ok {
		return anthropicEvents(model, greeting), ""
	}
	if refusal != "" {
		return nil, refusal
	}
	return modelEvents(model, text), ""
}

// writeSSE writes Messages events as SSE.
func writeSSE(w http.ResponseWriter, events []string) {
	w.Header().Set("Content-Type", "text/event-stream")
	for _, ev := range events {
		var t struct{ Type string }
		_ = json.Unmarshal([]byte(ev), &t)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", t.Type, ev)
	}
}

// Anthropic is a fake of Anthropic's first-party Messages API: it checks
// x-api-key and anthropic-version and streams its Model's answer, or
// refuses a prefill in Anthropic's error format.
type Anthropic struct {
	state
	modelSlot
	*httptest.Server
	APIKey string
}

// NewAnthropic starts a fake Anthropic API that takes apiKey.
func NewAnthropic(apiKey string) *Anthropic {
	a := &Anthropic{APIKey: apiKey}
	a.Server = httptest.NewServer(http.HandlerFunc(a.serve))
	return a
}

func (a *Anthropic) serve(w http.ResponseWriter, r *http.Request) {
	a.hits.Add(1)
	if r.URL.Path != "/v1/messages" {
		a.refuse(w, http.StatusNotFound, "unexpected path %s", r.URL.Path)
		return
	}
	if r.Header.Get("X-Api-Key") != a.APIKey {
		writeJSON(w, http.StatusUnauthorized, `{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}`)
		return
	}
	if r.Header.Get("Anthropic-Version") == "" {
		a.refuse(w, http.StatusBadRequest, "anthropic-version: header is required")
		return
	}
	body := readBody(r)
	a.received(body)
	var req struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	if err := json.Unmarshal(body, &req); err != nil || req.Model == "" || !req.Stream {
		a.refuse(w, http.StatusBadRequest, "want a streamed request naming its model")
		return
	}
	events, refusal := a.claudeEvents(req.Model, "Hello from anthropic", body)
	if refusal != "" {
		writeJSON(w, http.StatusBadRequest, anthropicError("invalid_request_error", refusal))
		return
	}
	writeSSE(w, events)
}

// anthropicError is Anthropic's error body.
func anthropicError(typ, message string) string {
	b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": message}, "request_id": "req_fake"})
	return string(b)
}

// OpenAI is a fake of the OpenAI API's chat completions: Bearer auth, its
// Model's answer as chunks; a final assistant message is context, as on
// the real API, unless the Model says otherwise.
type OpenAI struct {
	state
	modelSlot
	*httptest.Server
	APIKey string
}

// NewOpenAI starts a fake OpenAI API that takes apiKey.
func NewOpenAI(apiKey string) *OpenAI {
	o := &OpenAI{APIKey: apiKey}
	o.Server = httptest.NewServer(http.HandlerFunc(o.serve))
	return o
}

func (o *OpenAI) serve(w http.ResponseWriter, r *http.Request) {
	o.hits.Add(1)
	if r.URL.Path != "/v1/chat/completions" {
		o.refuse(w, http.StatusNotFound, "unexpected path %s", r.URL.Path)
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+o.APIKey {
		writeJSON(w, http.StatusUnauthorized, `{"error":{"message":"Incorrect API key provided.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`)
		return
	}
	body := readBody(r)
	o.received(body)
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil || req.Model == "" || !req.Stream {
		o.refuse(w, http.StatusBadRequest, "want a streamed request naming its model")
		return
	}
	if !o.streamModel(w, req.Model, body) {
		writeChatStream(w, req.Model, "Hello from openai", "stop")
	}
}

// streamModel streams the fake Model's reply to a chat request body as
// chunks a few bytes each, with usage and [DONE]; it reports false, and
// writes nothing, when no Model is set.
func (s *modelSlot) streamModel(w http.ResponseWriter, model string, body []byte) bool {
	text, _, ok := s.reply(body)
	if !ok {
		return false
	}
	w.Header().Set("Content-Type", "text/event-stream")
	chunk := func(delta, finish string) {
		fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-fake\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[{\"index\":0,\"delta\":%s,\"finish_reason\":%s}]}\n\n", model, delta, finish)
	}
	chunk(`{"role":"assistant","content":""}`, "null")
	for _, p := range pieces(text, 6) {
		d, _ := json.Marshal(map[string]string{"content": p})
		chunk(string(d), "null")
	}
	chunk(`{}`, `"stop"`)
	fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-fake\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", model, len(text)/4+1, 20+len(text)/4+1)
	fmt.Fprint(w, "data: [DONE]\n\n")
	return true
}

// readBody reads a request's body (a fake's requests are small).
func readBody(r *http.Request) []byte {
	b, _ := io.ReadAll(io.LimitReader(r.Body, 8<<20))
	return b
}
