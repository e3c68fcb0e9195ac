package provider

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/llmfailover/caddy-llm-failover/internal/jsonscan"
	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

// This file continues OpenAI chat completions streams: the Transcript of
// chat chunks, the continuation request, and the Splice that rewrites the
// continuation's chunks into the first attempt's. The JSON is edited in
// place with jsonscan rather than decoded: every chunk of a resumed
// stream passes through here.

// chatIdentity is what the client's chunks are known by: the first
// attempt's raw JSON values, nil when it sent none.
type chatIdentity struct {
	id, model, created, fingerprint []byte
}

// keepFirst returns have, or a copy of v when have is still unset (the
// event's bytes are reused after the call). jsonscan checks structure
// only: a value the Splice will write must be valid JSON. A blank ("" or
// 0) is no identity: Azure's first chunk, its prompt filter report, has
// an empty id and model and created 0, and the answer's come after it.
func keepFirst(have, v []byte) []byte {
	if have != nil || v == nil || jsonscan.IsNull(v) || string(v) == `""` || string(v) == "0" || !jsonscan.Valid(v) {
		return have
	}
	return append([]byte(nil), v...)
}

// chatEvent records one chunk of a chat stream.
func (t *Transcript) chatEvent(ev streamgate.Event) {
	if ev.Name != "" || isDone(ev.Data) {
		return
	}
	if ev.Overflow {
		t.refuse("a chunk over the event size bound")
		return
	}
	it, ok := jsonscan.Object(ev.Data)
	if !ok {
		t.refuse("a chunk that is not a JSON object")
		return
	}
	for k, more := it.Next(); more; k, more = it.Next() {
		switch string(k) {
		case "id":
			t.chat.id = keepFirst(t.chat.id, it.Value())
		case "model":
			t.chat.model = keepFirst(t.chat.model, it.Value())
		case "created":
			t.chat.created = keepFirst(t.chat.created, it.Value())
		case "system_fingerprint":
			t.chat.fingerprint = keepFirst(t.chat.fingerprint, it.Value())
		case "choices":
			if arr, ok := it.Enter('[', ']'); ok {
				t.chatChoices(&arr)
				it.Leave(&arr)
			}
		}
	}
	if !it.Finished() {
		t.refuse("a malformed chunk")
	}
}

// chatChoices records the choices of one chunk: only choice 0's plain
// text deltas, before any finish_reason, can be continued.
func (t *Transcript) chatChoices(arr *jsonscan.Iter) {
	for _, more := arr.Next(); more; _, more = arr.Next() {
		obj, ok := arr.Enter('{', '}')
		if !ok {
			t.refuse("a choice that is not an object")
			return
		}
		for k, more := obj.Next(); more; k, more = obj.Next() {
			switch string(k) {
			case "index":
				if string(obj.Value()) != "0" {
					t.refuse("more than one choice (n > 1)")
				}
			case "finish_reason":
				if !jsonscan.IsNull(obj.Value()) {
					t.refuse("the answer had finished")
				}
			case "logprobs":
				if !jsonscan.IsEmpty(obj.Value()) {
					t.refuse("log probabilities")
				}
			case "delta":
				if d, ok := obj.Enter('{', '}'); ok {
					t.chatDelta(&d)
					obj.Leave(&d)
				}
			}
		}
		arr.Leave(&obj)
	}
}

// chatDelta records one delta: its text, or a refusal for anything else
// a model said (tool and function calls, audio, reasoning, a refusal).
func (t *Transcript) chatDelta(d *jsonscan.Iter) {
	for k, more := d.Next(); more; k, more = d.Next() {
		v := d.Value()
		switch string(k) {
		case "content":
			if jsonscan.IsNull(v) {
				continue
			}
			raw := jsonscan.StringValue(v)
			if raw == nil {
				t.refuse("content that is not text")
				return
			}
			t.appendText(v, raw)
		case "refusal", "tool_calls", "function_call", "audio", "reasoning_content", "reasoning", "reasoning_details":
			if !jsonscan.IsEmpty(v) {
				t.refuse("a " + string(k) + " delta")
				return
			}
		}
	}
}

// appendText adds a JSON string's text (quoted is the value, raw its
// contents): unescaped only when it has escapes.
func (t *Transcript) appendText(quoted, raw []byte) {
	text := raw
	if bytes.IndexByte(raw, '\\') >= 0 {
		var s string
		if json.Unmarshal(quoted, &s) != nil {
			t.refuse("a malformed content string")
			return
		}
		text = []byte(s)
	} else if !utf8.Valid(raw) {
		// The prefill would carry U+FFFD for it, not what was delivered.
		t.refuse("content that is not UTF-8")
		return
	}
	if t.text.Len()+len(text) > t.cap {
		t.refuse("more text than the resume cap")
		return
	}
	t.text.Write(text)
	t.delivered = t.delivered || len(text) > 0
}

func isDone(data []byte) bool { return string(bytes.TrimSpace(data)) == "[DONE]" }

// chatContinue is Continue for a chat stream: the request's messages
// with the delivered text appended as a final assistant message. How the
// upstream is told to continue it rather than answer after it is the
// channel's own option, which its adapter adds (Call.Continuation).
// Requests whose answer a join could corrupt are refused: several choices,
// log probabilities, JSON or schema output.
func (t *Transcript) chatContinue(body []byte, form ContinuationForm) ([]byte, *Splice, error) {
	msgEnd := -1
	var why string // the first reason found
	refuse := func(r string) {
		if why == "" {
			why = r
		}
	}
	err := eachTopLevel(body, func(key []byte, start, end int) error {
		v := body[start:end]
		switch string(key) {
		case "messages":
			msgEnd = end
			if r := lastRoleRefusal(v); r != "" {
				refuse(r)
			}
		case "n":
			if s := string(v); s != "null" && s != "1" && s != "0" {
				refuse("more than one choice (n > 1)")
			}
		case "logprobs":
			if string(v) == "true" {
				refuse("log probabilities")
			}
		case "response_format":
			var rf struct {
				Type string `json:"type"`
			}
			if json.Unmarshal(v, &rf) == nil && (rf.Type == "json_object" || rf.Type == "json_schema") {
				refuse("structured output (" + rf.Type + ")")
			}
		}
		return nil
	})
	switch {
	case err != nil:
		return nil, nil, fmt.Errorf("request: %w", err)
	case msgEnd < 0:
		return nil, nil, fmt.Errorf("request has no messages: %w", ErrNotContinuable)
	case why != "":
		return nil, nil, fmt.Errorf("%s: %w", why, ErrNotContinuable)
	}
	text, _ := json.Marshal(t.text.String())
	out := make([]byte, 0, len(body)+len(text)+len(continueInstruction)+64)
	out = append(out, body[:msgEnd-1]...) // up to the array's ']'
	out = append(out, `,{"role":"assistant","content":`...)
	out = append(append(out, text...), '}')
	if form == Instructed {
		ask, _ := json.Marshal(continueInstruction)
		out = append(out, `,{"role":"user","content":`...)
		out = append(append(out, ask...), '}')
	}
	out = append(out, body[msgEnd-1:]...)
	var req map[string]json.RawMessage
	if err := json.Unmarshal(out, &req); err != nil {
		return nil, nil, fmt.Errorf("request: %w", err)
	}
	_, hasMax := req["max_tokens"]
	_, hasCompletion := req["max_completion_tokens"]
	if hasMax || hasCompletion {
		for _, key := range []string{"max_tokens", "max_completion_tokens"} {
			if err := lessDelivered(req, key, t.text.String()); err != nil {
				return nil, nil, err
			}
		}
		if out, err = json.Marshal(req); err != nil {
			return nil, nil, fmt.Errorf("request: %w", err)
		}
	}
	splice := &Splice{r: &chatSplice{first: t.chat}}
	if form == Instructed {
		splice.join = newJoiner(t.api, t.text.String())
	}
	return out, splice, nil
}

// lastRoleRefusal says why a messages array cannot be continued (empty,
// or already ending with an assistant message), or "".
func lastRoleRefusal(msgs []byte) string {
	arr, ok := jsonscan.Array(msgs)
	if !ok {
		return "messages is not an array"
	}
	var last []byte
	for _, more := arr.Next(); more; _, more = arr.Next() {
		last = arr.Value()
	}
	var m struct {
		Role string `json:"role"`
	}
	switch {
	case last == nil:
		return "no messages"
	case json.Unmarshal(last, &m) != nil:
		return "a malformed message"
	case m.Role == "assistant":
		return "the request ends with an assistant message"
	}
	return ""
}

// chatSplice rewrites a continuation's chat chunks into the client's
// stream: the first attempt's id, model, created and system_fingerprint,
// choice index 0, no second role chunk (a chunk carrying nothing is
// dropped, a role beside content taken off). The finish chunk, the usage
// chunk and [DONE] are the continuation's: the first attempt sent none.
type chatSplice struct {
	first chatIdentity
	buf   []byte // the chunk being rewritten, reused
	// trim is continuation text still to take off the front of its
	// content (the overlap with what was delivered).
	trim string
}

func (s *chatSplice) trimStart(trim string) { s.trim = trim }

func (s *chatSplice) rewrite(dst []byte, ev streamgate.Event) []byte {
	if ev.Name != "" || ev.Overflow || isDone(ev.Data) {
		return streamgate.AppendEvent(dst, ev.Name, ev.Data)
	}
	data := ev.Data
	if s.trim != "" {
		data = s.trimContent(data)
	}
	out, usage, ok := s.chunk(s.buf[:0], data)
	s.buf = out
	if !ok {
		return streamgate.AppendEvent(dst, ev.Name, ev.Data)
	}
	if !usage && classifyChat(data) == streamgate.Preamble {
		return dst // the role chunk, or one as empty: the client had its own
	}
	return streamgate.AppendEvent(dst, "", out)
}

// trimContent takes what is left of s.trim off the front of a chunk's
// content. It decodes the chunk: only the first chunks of an instructed
// continuation get here, until the overlap is gone.
func (s *chatSplice) trimContent(data []byte) []byte {
	var chunk map[string]json.RawMessage
	var choices []map[string]json.RawMessage
	if json.Unmarshal(data, &chunk) != nil || json.Unmarshal(chunk["choices"], &choices) != nil || len(choices) == 0 {
		return data
	}
	var delta map[string]json.RawMessage
	var content *string
	if json.Unmarshal(choices[0]["delta"], &delta) != nil || json.Unmarshal(delta["content"], &content) != nil || content == nil {
		return data
	}
	n := commonPrefix(*content, s.trim)
	text := (*content)[n:]
	s.trim = s.trim[n:]
	if n < len(*content) {
		s.trim = "" // the model went on differently: keep what it said
	}
	delta["content"], _ = json.Marshal(text)
	choices[0]["delta"], _ = json.Marshal(delta)
	chunk["choices"], _ = json.Marshal(choices)
	out, err := json.Marshal(chunk)
	if err != nil {
		return data
	}
	return out
}

// chunk appends the rewritten chunk to dst and reports whether it carries
// usage; ok is false for a chunk that is not a well-formed object.
func (s *chatSplice) chunk(dst, data []byte) (out []byte, usage, ok bool) {
	it, ok := jsonscan.Object(data)
	if !ok {
		return dst, false, false
	}
	dst = append(dst, '{')
	n := 0
	for k, more := it.Next(); more; k, more = it.Next() {
		dst = appendKey(dst, k, n)
		n++
		var first []byte
		switch string(k) {
		case "id":
			first = s.first.id
		case "model":
			first = s.first.model
		case "created":
			first = s.first.created
		case "system_fingerprint":
			first = s.first.fingerprint
		case "usage":
			v := it.Value()
			usage = !jsonscan.IsNull(v)
			dst = append(dst, v...)
			continue
		case "choices":
			if it.Peek() == '[' {
				arr, _ := it.Enter('[', ']')
				dst = appendChoices(dst, &arr)
				it.Leave(&arr)
				continue
			}
		}
		v := it.Value()
		if first != nil {
			v = first
		}
		dst = append(dst, v...)
	}
	if !it.Finished() {
		return dst, false, false
	}
	return append(dst, '}'), usage, true
}

// appendKey appends an object member's key (raw, as it was written) and
// its colon, after a comma unless it is the first member.
func appendKey(dst, key []byte, n int) []byte {
	if n > 0 {
		dst = append(dst, ',')
	}
	dst = append(append(append(dst, '"'), key...), '"')
	return append(dst, ':')
}

// appendChoices appends the choices array with every index 0 and no
// role in any delta.
func appendChoices(dst []byte, arr *jsonscan.Iter) []byte {
	dst = append(dst, '[')
	i := 0
	for _, more := arr.Next(); more; _, more = arr.Next() {
		if i > 0 {
			dst = append(dst, ',')
		}
		i++
		obj, ok := arr.Enter('{', '}')
		if !ok {
			dst = append(dst, "null"...) // not a choice; the chunk is malformed
			continue
		}
		dst = append(dst, '{')
		n := 0
		for k, more := obj.Next(); more; k, more = obj.Next() {
			dst = appendKey(dst, k, n)
			n++
			switch string(k) {
			case "index":
				obj.Value()
				dst = append(dst, '0')
			case "delta":
				if obj.Peek() == '{' {
					d, _ := obj.Enter('{', '}')
					dst = appendWithout(dst, &d, "role")
					obj.Leave(&d)
				} else {
					dst = append(dst, obj.Value()...)
				}
			default:
				dst = append(dst, obj.Value()...)
			}
		}
		arr.Leave(&obj)
		dst = append(dst, '}')
	}
	return append(dst, ']')
}

// appendWithout appends the object the iterator walks without the member
// named drop.
func appendWithout(dst []byte, obj *jsonscan.Iter, drop string) []byte {
	dst = append(dst, '{')
	n := 0
	for k, more := obj.Next(); more; k, more = obj.Next() {
		if string(k) == drop {
			obj.Value()
			continue
		}
		dst = appendKey(dst, k, n)
		n++
		dst = append(dst, obj.Value()...)
	}
	return append(dst, '}')
}
