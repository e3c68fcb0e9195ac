package provider

import "github.com/llmfailover/caddy-llm-failover/internal/jsonscan"

// Delivered content: the text of an answer as the client reads it, for
// estimating output tokens when an upstream never reported usage (a cut
// stream, a client that left). Only the decoded text of the fields below
// counts, never the JSON or SSE around it. The walk allocates nothing, as
// it runs on every chunk, and the Meter keeps only the estimator's
// counters, never the text.

// contentFormat says which string fields of an API's events and bodies
// are answer text.
type contentFormat struct {
	// text reports whether a string under key is content.
	text func(key []byte) bool
	// skip reports whether the value under key holds no delivered text,
	// or text counted elsewhere (a final event repeating the answer).
	skip func(key []byte) bool
}

// feed adds the content text of one event or body to e.
func (f contentFormat) feed(e *TokenEstimator, data []byte) {
	if f.text == nil {
		return
	}
	if it, ok := jsonscan.Object(data); ok {
		_, _ = f.walk(e, it, 0)
	}
}

// maxContentDepth bounds the walk; answer text sits a few levels deep.
const maxContentDepth = 8

// walk reads the members or elements of it and returns it consumed. It
// passes iterators by value, as a pointer would make every level's escape
// to the heap, and descends into a value in place (Enter/Leave) rather
// than scanning it once to skip and again to read.
func (f contentFormat) walk(e *TokenEstimator, it jsonscan.Iter, depth int) (_ jsonscan.Iter, members int) {
	for key, ok := it.Next(); ok; key, ok = it.Next() {
		f.value(e, &it, key, depth)
		members++
	}
	return it, members
}

// value reads the value it is at, under key (empty in an array), at
// depth, as walk does, and says what a classifier asks of it: whether it
// is empty (jsonscan.IsEmpty) and whether it is null. chatEvent walks the
// members it classifies through it, so that its content is walk's.
func (f contentFormat) value(e *TokenEstimator, it *jsonscan.Iter, key []byte, depth int) (empty, null bool) {
	v := it.Peek()
	switch {
	case v == '"':
		s := it.Value()
		if f.text(key) {
			e.writeJSONString(jsonscan.StringValue(s))
		}
		return len(s) == 2, false
	case (v == '{' || v == '[') && depth < maxContentDepth && !f.skip(key):
		closer := byte('}')
		if v == '[' {
			closer = ']'
		}
		child, _ := it.Enter(v, closer)
		child, n := f.walk(e, child, depth+1)
		it.Leave(&child)
		// A malformed value stops the whole walk, which its caller
		// notices: only a well-formed one's emptiness matters.
		return n == 0, false
	default:
		raw := it.Value()
		return jsonscan.IsEmpty(raw), jsonscan.IsNull(raw)
	}
}

// oneOf reports whether key is one of names. The conversion in the
// comparison does not allocate.
func oneOf(key []byte, names ...string) bool {
	for _, n := range names {
		if string(key) == n {
			return true
		}
	}
	return false
}

var (
	// Chat and completions: the delta or message text, refusals,
	// reasoning and tool arguments, which the upstream bills as output.
	openAIContent = contentFormat{
		text: func(k []byte) bool { return oneOf(k, "content", "text", "refusal", "reasoning_content", "arguments") },
		skip: func(k []byte) bool { return oneOf(k, "usage", "logprobs") },
	}
	// Responses streams carry text in *.delta events; the done and
	// completed events repeat it whole, so only "delta" counts there, and
	// a whole body's output items.
	responsesContent = contentFormat{
		text: func(k []byte) bool { return oneOf(k, "delta", "text", "arguments") },
		skip: func(k []byte) bool { return oneOf(k, "response", "usage", "part", "item") },
	}
	// Messages: text, thinking and tool input deltas, and a body's blocks.
	anthropicContent = contentFormat{
		text: func(k []byte) bool { return oneOf(k, "text", "thinking", "partial_json") },
		skip: func(k []byte) bool { return oneOf(k, "usage") },
	}
	// A request's text: every string value but images, audio and files,
	// which wallet.Estimate bounds by their count, not their bytes.
	inputContent = contentFormat{
		text: func(k []byte) bool { return !oneOf(k, "image_url", "data", "file_data", "url") },
		skip: func(k []byte) bool { return oneOf(k, "image_url", "source", "input_audio", "file") },
	}
	// Embeddings and model lists are no text.
	noContent = contentFormat{}
)

// EstimateInputTokens estimates the input tokens of a request body from
// its text (see TokenEstimator), for when an upstream reported none.
func EstimateInputTokens(body []byte) int64 {
	var e TokenEstimator
	inputContent.feed(&e, body)
	return e.Tokens()
}
