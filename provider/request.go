package provider

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/llmfailover/caddy-llm-failover/internal/jsonscan"
	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

var (
	// ErrMalformed means the body is not a JSON object.
	ErrMalformed = errors.New("request body is not a valid JSON object")
	// ErrNoModel means the body has no string "model" field.
	ErrNoModel = errors.New(`request body has no "model" field`)
	// ErrAmbiguous means the body names a field the gateway routes or
	// bills by in a way JSON parsers read differently: a limit given
	// twice (most keep the last, the gateway would have to guess), or a
	// key that differs from one only in case (Go's encoding/json, behind
	// Ollama and LocalAI, matches keys regardless of case). The upstream
	// could then run another model, or write past the bound the wallet
	// reserved.
	ErrAmbiguous = errors.New("request body is ambiguous")
)

// guardedKeys are the top-level fields the gateway routes or bills by,
// which must mean the same to it and to any upstream.
var guardedKeys = [...]string{"model", "stream", "max_tokens", "max_completion_tokens", "max_output_tokens", "n", "best_of", "prompt"}

// caseVariant reports the guarded key that key differs from only in case,
// Unicode's simple folding included, as encoding/json matches it: "ſtream"
// (long s) and "max_to\u212aens" (Kelvin sign) are "stream" and "max_tokens"
// to a Go upstream, though their bytes are longer.
func caseVariant(key []byte) (string, bool) {
	for _, g := range guardedKeys {
		if string(key) != g && strings.EqualFold(string(key), g) {
			return g, true
		}
	}
	return "", false
}

// Request holds the top-level fields of a request body that routing and
// billing depend on. Everything else stays opaque.
type Request struct {
	Model  string
	Stream bool
	// MaxOutput is max_tokens, max_completion_tokens or max_output_tokens,
	// whichever the client set (0 when none).
	MaxOutput int64
	// N is the number of completions the upstream generates (1 when
	// absent): n, or legacy completions' best_of when larger (generated
	// server-side and all billed), times the prompts of a completions
	// batch (an array of strings or of token arrays).
	N int
	// IncludeUsage is stream_options.include_usage as the client sent it.
	IncludeUsage bool
	// HasStreamOptions reports whether the client sent stream_options at all.
	HasStreamOptions bool
	// Images counts image parts and the document parts named by id or URL
	// (an over-estimate: each may be counted more than once), because
	// they cost tokens their bytes do not show.
	Images int
	// ServerInput names the field through which the upstream adds input
	// of its own to the request's (a server-side tool's results: web
	// search, web fetch, file search, MCP), or is "". Like StoredContext,
	// such input is not in the body.
	ServerInput string
	// StoredContext names the field through which the request refers to
	// input kept by the upstream (previous_response_id, conversation, a
	// stored prompt), or is "" when it refers to none. Such input is not in
	// the body, so the body does not bound the request's input tokens.
	StoredContext string
	// Effects names the field through which the request has effects or
	// state upstream beyond its answer ("store", "background", a stored
	// context's field, "tools" naming a server-side tool, "mcp_servers",
	// "web_search_options"),
	// or is "" when it has none; StoreOff: it sent "store": false. Two
	// copies of such a request (a hedge) would do those things twice.
	Effects  string
	StoreOff bool
	// Background: it sent "background": true (Responses), asking the
	// upstream to run it after answering, for retrieval by id.
	Background bool

	modelStart, modelEnd int // byte span of the "model" value, quotes included
}

// ParseRequest reads the top-level fields of a JSON request body of the
// API. Every API the gateway serves names its model and limits in the same
// top-level fields, so the API does not change the result today.
func (API) ParseRequest(body []byte) (Request, error) {
	req := Request{N: 1}
	if !jsonscan.Valid(body) {
		return req, ErrMalformed
	}
	foundModel := false
	bestOf, prompts := 1, 1
	var seen [len(guardedKeys)]bool
	err := eachTopLevel(body, func(key []byte, start, end int) error {
		val := body[start:end]
		if i := slices.Index(guardedKeys[:], string(key)); i >= 0 {
			// Upstreams differ on which of two keeps (most the last,
			// some the first, some refuse): routed or billed by one and
			// run by the other, the answer would not be what was paid for.
			if seen[i] {
				return fmt.Errorf("%w: %q is given twice", ErrAmbiguous, key)
			}
			seen[i] = true
		}
		switch string(key) {
		case "model":
			if val[0] != '"' {
				return ErrNoModel
			}
			m, ok := jsonString(val)
			if !ok {
				return ErrNoModel
			}
			req.Model = m
			req.modelStart, req.modelEnd = start, end
			foundModel = true
		case "stream":
			req.Stream = string(val) == "true"
		case "max_tokens", "max_completion_tokens", "max_output_tokens":
			n, set, err := limitValue(string(key), val, MaxTokenLimit)
			if err != nil {
				return err
			}
			if set && n > req.MaxOutput {
				req.MaxOutput = n
			}
		case "n":
			n, set, err := limitValue("n", val, MaxChoices)
			if err != nil {
				return err
			}
			// n of 0 asks for nothing more than the default of 1.
			if set && n > 1 {
				req.N = int(n)
			}
		case "best_of":
			// Legacy completions: best_of candidates are generated (and
			// billed) server-side, n of them returned.
			n, set, err := limitValue("best_of", val, MaxChoices)
			if err != nil {
				return err
			}
			if set && n > 1 {
				bestOf = int(n)
			}
		case "previous_response_id", "conversation", "prompt":
			if string(key) == "prompt" {
				prompts = promptCount(val)
			}
			// State the upstream keeps and the body does not show: its
			// tokens are input the body's size cannot bound. A stored
			// prompt is an object naming its id; legacy completions'
			// prompt (a string, an array of strings or token ids) is
			// all in the body.
			if !jsonscan.IsEmpty(val) && (string(key) != "prompt" || val[0] == '{') {
				req.StoredContext = string(key)
				req.effect(req.StoredContext)
			}
		case "store":
			req.StoreOff = string(val) == "false"
			if string(val) == "true" {
				req.effect("store")
			}
		case "background":
			req.Background = string(val) == "true"
			if req.Background {
				req.effect("background")
			}
		case "mcp_servers":
			if !jsonscan.IsEmpty(val) && !jsonscan.IsNull(val) {
				req.effect("mcp_servers")
				req.serverInput("mcp_servers")
			}
		case "web_search_options":
			// Chat Completions' web search, run by the upstream: an
			// empty object turns it on.
			if !jsonscan.IsNull(val) {
				req.effect("web_search_options")
				req.serverInput("web_search_options")
			}
		case "tools":
			if serverTools(val) {
				req.effect("tools")
				req.serverInput("tools")
			}
		case "stream_options":
			req.HasStreamOptions = val[0] == '{'
			req.IncludeUsage = req.HasStreamOptions && includeUsage(val)
		default:
			if g, ok := caseVariant(key); ok {
				return fmt.Errorf("%w: %q differs from %q only in case, and some upstreams read it as %q", ErrAmbiguous, key, g, g)
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
	req.N = max(req.N, bestOf) * prompts
	req.Images = countImages(body) + countDocuments(body)
	return req, nil
}

// promptCount is how many prompts a legacy completions "prompt" holds,
// each answered with its own choices: the elements of an array of
// strings or of token arrays; 1 for a string, an array of token ids, an
// empty array or anything else.
func promptCount(val []byte) int {
	arr, ok := jsonscan.Array(val)
	if !ok {
		return 1
	}
	n := 0
	for _, more := arr.Next(); more; _, more = arr.Next() {
		if c := arr.Peek(); c == '-' || c >= '0' && c <= '9' {
			return 1 // token ids: one prompt
		}
		n++
	}
	return max(n, 1)
}

// countDocuments counts the document parts a body names without carrying
// their content: a file by Files API id ("file_id": OpenAI chat's file
// part, Responses' input_file, Anthropic's file source) or by URL
// (Responses' "file_url"), and Anthropic's "document" blocks (a PDF by
// URL among them). The provider bills their pages as input tokens
// (Claude: 1,500 to 3,000 a page) that the body's bytes do not show. As
// with images, a part counted twice only reserves more.
func countDocuments(body []byte) int {
	n := 0
	if bytes.Contains(body, []byte(`file_`)) {
		n += bytes.Count(body, []byte(`"file_id"`)) + bytes.Count(body, []byte(`"file_url"`))
	}
	return n + bytes.Count(body, []byte(`"document"`))
}

// countImages counts the image parts a body may carry: "image_url"
// (OpenAI chat), "input_image" (Responses), "image" (Anthropic), in one
// pass over the body instead of one a name (a third of parsing a request
// went to three bytes.Count). Each name counts as bytes.Count counts it:
// an occurrence overlapping the last one counted of the same name does
// not count (`"image"image"` holds one).
func countImages(body []byte) int {
	n := 0
	var endURL, endInput, endImage int // where the last counted of each ended
	for i := 0; ; {
		j := bytes.Index(body[i:], []byte(`image`))
		if j < 0 {
			return n
		}
		p := i + j // body[p:] starts with image
		rest := body[p+len(`image`):]
		quoted := p > 0 && body[p-1] == '"'
		input := p - len(`"input_`) // where "input_image" would start
		switch {
		case quoted && p-1 >= endURL && bytes.HasPrefix(rest, []byte(`_url"`)):
			n, endURL = n+1, p+len(`image_url"`)
		case quoted && p-1 >= endImage && bytes.HasPrefix(rest, []byte(`"`)):
			n, endImage = n+1, p+len(`image"`)
		case input >= endInput && input >= 0 && string(body[input:p]) == `"input_` && bytes.HasPrefix(rest, []byte(`"`)):
			n, endInput = n+1, p+len(`image"`)
		}
		i = p + len(`image`)
	}
}

// serverInput records the first field through which the upstream adds
// input of its own.
func (r *Request) serverInput(field string) {
	if r.ServerInput == "" {
		r.ServerInput = field
	}
}

// effect records the first field found with effects upstream.
func (r *Request) effect(field string) {
	if r.Effects == "" {
		r.Effects = field
	}
}

// serverTools reports whether a tools array names a tool the upstream
// runs itself (web search, code execution, file search, MCP, ...): every
// typed tool but a function or custom one, as a client-run tool of either
// API is. A tools value that is not an array of objects counts too: what
// cannot be read is not known to be harmless.
//
// It runs on every request that has tools, and a tools array is mostly
// function schemas: it walks the array once (the body is already valid
// JSON) and reads each tool's "type" only, leaving to json.Unmarshal
// (serverToolsJSON) the keys or type strings with escapes or non-ASCII
// bytes, which json matches by Unicode case folding. Unmarshalling the
// whole array cost about a third of parsing a request with tools.
func serverTools(val []byte) bool {
	val = bytes.TrimSpace(val) // the value's span, whoever cut it
	if jsonscan.IsNull(val) {
		return false
	}
	arr, ok := jsonscan.Array(val)
	if !ok {
		return true
	}
	for _, more := arr.Next(); more; _, more = arr.Next() {
		el := arr.Value()
		if jsonscan.IsNull(el) {
			continue // json leaves the element's zero value: no type
		}
		tool, ok := jsonscan.Object(el)
		if !ok {
			return true
		}
		var typ []byte // the last "type", as json keeps it
		for key, more := tool.Next(); more; key, more = tool.Next() {
			if !plainKey(key) {
				return serverToolsJSON(val)
			}
			if asciiEqualFold(key, "type") {
				typ = tool.Value()
			}
		}
		if !tool.Finished() {
			return true
		}
		if typ == nil || jsonscan.IsNull(typ) {
			continue
		}
		name := jsonscan.StringValue(typ)
		switch {
		case name == nil:
			return true // a type that is not a string: json refuses it
		case !plainKey(name):
			return serverToolsJSON(val)
		case string(name) != "function" && string(name) != "custom":
			return true
		}
	}
	return !arr.Finished()
}

// serverToolsJSON is serverTools by json.Unmarshal: its rules, and the
// fallback for what the walk leaves to them.
func serverToolsJSON(val []byte) bool {
	if jsonscan.IsNull(val) {
		return false
	}
	var tools []struct {
		Type *string `json:"type"`
	}
	if json.Unmarshal(val, &tools) != nil {
		return true
	}
	for _, t := range tools {
		if t.Type != nil && *t.Type != "function" && *t.Type != "custom" {
			return true
		}
	}
	return false
}

// The largest limits a request may set. They keep every bound the wallet
// computes (tokens × choices × price) far inside int64 micro-dollars, and
// lie above what any current model accepts (OpenAI caps n at 128).
const (
	MaxTokenLimit = 100_000_000
	MaxChoices    = 128
)

// LimitError is a token or choice limit that is not an integer the gateway
// can bound: a fraction, a negative, a string, a non-number or a value
// above the field's maximum. It is the client's mistake (400).
type LimitError struct {
	Field, Value, Reason string
}

func (e *LimitError) Error() string {
	v := e.Value
	if len(v) > 40 {
		v = v[:40] + "..."
	}
	return fmt.Sprintf("invalid %q: %s %s", e.Field, v, e.Reason)
}

// limitValue reads a limit that JSON may write as any number with an
// integer value (100000, 1e5, 100000.0). null means not set. Anything
// else is a *LimitError: a lenient upstream could honour a value the
// gateway ignored, and the wallet's bound would no longer hold.
func limitValue(field string, val []byte, maxValue uint64) (n int64, set bool, err error) {
	if jsonscan.IsNull(val) {
		return 0, false, nil
	}
	bad := func(reason string) (int64, bool, error) {
		return 0, false, &LimitError{Field: field, Value: string(val), Reason: reason}
	}
	if len(val) == 0 || (val[0] != '-' && (val[0] < '0' || val[0] > '9')) {
		return bad("must be a JSON number")
	}
	if val[0] == '-' {
		return bad("must not be negative")
	}
	u, ok, tooBig := integerValue(string(val))
	switch {
	case tooBig || (ok && u > maxValue):
		return bad(fmt.Sprintf("exceeds the maximum of %d", maxValue))
	case !ok:
		return bad("must be an integer")
	}
	return int64(u), true, nil
}

// integerValue evaluates a non-negative JSON number exactly, without
// floating point: ok is false for a fraction, tooBig is true above
// math.MaxUint64.
func integerValue(num string) (u uint64, ok, tooBig bool) {
	mant, exp := num, ""
	if i := strings.IndexAny(num, "eE"); i >= 0 {
		mant, exp = num[:i], num[i+1:]
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(intPart+frac, "0")
	// The value is digits × 10^shift.
	shift := -len(frac)
	for len(digits) > 0 && digits[len(digits)-1] == '0' {
		digits = digits[:len(digits)-1]
		shift++
	}
	if digits == "" {
		return 0, true, false
	}
	if exp != "" {
		e, err := strconv.ParseInt(exp, 10, 32)
		if err != nil {
			// An exponent beyond ±2^31 on a non-zero mantissa: a
			// fraction when negative, too big otherwise.
			negative := strings.HasPrefix(exp, "-")
			return 0, !negative, !negative
		}
		shift += int(e)
	}
	if shift < 0 {
		return 0, false, false
	}
	if len(digits)+shift > 20 {
		return 0, true, true
	}
	v, err := strconv.ParseUint(digits+strings.Repeat("0", shift), 10, 64)
	if err != nil {
		return 0, true, true
	}
	return v, true, false
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
// client did not ask (no stream_options, or stream_options without
// include_usage true, such as {"include_obfuscation":false}), out asks
// for it and hide recognises the extra usage-only chunk, which the client
// did not ask for and must not see. Otherwise out is body and hide is
// nil. Without the report a reasoning model's reasoning, which a chat
// stream never shows, would go unbilled: the estimate counts only the
// content delivered.
func (a API) AskUsage(body []byte, req Request) (out []byte, hide func(streamgate.Event) bool) {
	if a != OpenAIChat || !req.Stream || req.IncludeUsage {
		return body, nil
	}
	if req.HasStreamOptions {
		return withIncludeUsageIn(body), isUsageOnlyChunk
	}
	return withIncludeUsage(body), isUsageOnlyChunk
}

// withIncludeUsageIn returns body with its own stream_options object (the
// last one, as upstreams read it) asking for usage: every include_usage
// in it set to true, or one added first. The rest of the object is kept.
func withIncludeUsageIn(body []byte) []byte {
	start, end := -1, -1
	_ = eachTopLevel(body, func(key []byte, s, e int) error {
		if string(key) == "stream_options" {
			start, end = s, e
		}
		return nil
	})
	if start < 0 || body[start] != '{' {
		return withIncludeUsage(body)
	}
	opts := body[start:end]
	var spans [][2]int
	_ = eachTopLevel(opts, func(key []byte, s, e int) error {
		if string(key) == "include_usage" {
			spans = append(spans, [2]int{start + s, start + e})
		}
		return nil
	})
	out := make([]byte, 0, len(body)+len(`"include_usage":true,`))
	if len(spans) == 0 {
		out = append(out, body[:start+1]...)
		out = append(out, `"include_usage":true`...)
		if len(bytes.TrimSpace(opts[1:len(opts)-1])) > 0 {
			out = append(out, ',')
		}
		return append(out, body[start+1:]...)
	}
	prev := 0
	for _, sp := range spans {
		out = append(out, body[prev:sp[0]]...)
		out = append(out, "true"...)
		prev = sp[1]
	}
	return append(out, body[prev:]...)
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

// includeUsage reads include_usage from a stream_options object: true
// only for a literal true under that exact key (the last, if repeated),
// as the upstream reads it.
func includeUsage(opts []byte) bool {
	on := false
	_ = eachTopLevel(opts, func(key []byte, start, end int) error {
		if string(key) == "include_usage" {
			on = string(opts[start:end]) == "true"
		}
		return nil
	})
	return on
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
