package provider

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/llmfailover/caddy-llm-failover/internal/shapes"
	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

// topLevelKeys returns the decoded top-level keys of a JSON object, in
// order, duplicates included; ok is false when body is not an object.
func topLevelKeys(body []byte) (keys []string, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return nil, false
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		k, isString := tok.(string)
		if !isString {
			return nil, false
		}
		keys = append(keys, k)
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil, false
		}
	}
	return keys, true
}

// ambiguousKeys is the oracle for ErrAmbiguous: a guarded key given
// twice, or a key that differs from one only in case.
func ambiguousKeys(keys []string) bool {
	count := map[string]int{}
	for _, k := range keys {
		count[k]++
		for _, g := range []string{"model", "stream", "max_tokens", "max_completion_tokens", "max_output_tokens", "n", "best_of", "prompt"} {
			if k != g && strings.EqualFold(k, g) {
				return true
			}
		}
	}
	for _, g := range []string{"model", "stream", "max_tokens", "max_completion_tokens", "max_output_tokens", "n", "best_of", "prompt"} {
		if count[g] > 1 {
			return true
		}
	}
	return false
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"claude-3-5-sonnet-latest","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}]}]}`,
		`{"mod\u0065l":"x","n":3,"stream_options":{"include_usage":true}}`,
		`{"model":"a","model":"b"}`,
		`[1,2,3]`,
		`{"model":""}`,
		` { "model" : "m" , "max_completion_tokens" : 9 } `,
		`{"model":"m","max_tokens":1e5,"n":8.0}`,
		`{"model":"m","max_tokens":"100"}`,
		`{"model":"m","maX_tokens":9}`,
		`{"model":"m","n":1,"n":2}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		orig := bytes.Clone(body)
		r, err := OpenAIChat.ParseRequest(body)
		if !bytes.Equal(body, orig) {
			t.Fatalf("ParseRequest modified its input")
		}
		valid := json.Valid(body)
		if !valid && !errors.Is(err, ErrMalformed) {
			t.Fatalf("invalid JSON %q: err = %v, want ErrMalformed", body, err)
		}
		var le *LimitError
		if err != nil && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrNoModel) && !errors.Is(err, ErrAmbiguous) && !errors.As(err, &le) {
			t.Fatalf("unexpected error %v", err)
		}

		if err == nil {
			if r.Model == "" {
				t.Fatalf("success with an empty model for %q", body)
			}
			if r.N < 1 || r.MaxOutput < 0 || r.Images < 0 {
				t.Fatalf("implausible fields %+v for %q", r, body)
			}
			for _, model := range []string{"x", "dépl\"oy<&>"} {
				out := r.WithModel(body, model)
				if !bytes.Equal(body, orig) {
					t.Fatalf("WithModel modified its input")
				}
				if !json.Valid(out) {
					t.Fatalf("WithModel(%q, %q) = %q: invalid JSON", body, model, out)
				}
				r2, err := OpenAIChat.ParseRequest(out)
				if err != nil {
					t.Fatalf("OpenAIChat.ParseRequest(WithModel(%q)) = %q: %v", body, out, err)
				}
				if r2.Model != model || r2.Stream != r.Stream || r2.MaxOutput != r.MaxOutput || r2.N != r.N ||
					r2.IncludeUsage != r.IncludeUsage || r2.HasStreamOptions != r.HasStreamOptions {
					t.Fatalf("re-parse of %q: %+v, want model %q and the fields of %+v", out, r2, model, r)
				}
			}
			if !r.HasStreamOptions {
				out := withIncludeUsage(body)
				r3, err := OpenAIChat.ParseRequest(out)
				if err != nil || !r3.HasStreamOptions || !r3.IncludeUsage || r3.Model != r.Model {
					t.Fatalf("withIncludeUsage(%q) = %q: %+v, %v", body, out, r3, err)
				}
			}
		}

		if !valid {
			return
		}
		keys, isObject := topLevelKeys(body)
		if !isObject {
			if err == nil {
				t.Fatalf("non-object %q parsed as %+v", body, r)
			}
			return
		}
		if errors.Is(err, ErrAmbiguous) {
			if !ambiguousKeys(keys) {
				t.Fatalf("%q refused as ambiguous (%v), but no guarded key is repeated or differs only in case", body, err)
			}
			return
		}
		seen := map[string]bool{}
		for _, k := range keys {
			if seen[k] {
				return // encoding/json keeps the last duplicate; skip.
			}
			seen[k] = true
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatalf("encoding/json rejects valid object %q: %v", body, err)
		}
		raw, hasModel := m["model"]
		var want string
		isString := hasModel && json.Unmarshal(raw, &want) == nil && len(raw) > 0 && raw[0] == '"'
		if !isString || want == "" {
			if !errors.Is(err, ErrNoModel) && !errors.As(err, &le) {
				t.Fatalf("%q: err = %v, want ErrNoModel", body, err)
			}
			return
		}
		if errors.As(err, &le) {
			return // a bad limit, which FuzzLimitValue checks
		}
		if err != nil {
			t.Fatalf("%q: err = %v, want model %q", body, err, want)
		}
		if r.Model != want {
			t.Fatalf("%q: Model = %q, encoding/json says %q", body, r.Model, want)
		}
	})
}

// FuzzLimitValue checks the exact integer reading of JSON numbers against
// math/big: every number with an integer value up to the maximum is
// accepted as that value, everything else is refused.
func FuzzLimitValue(f *testing.F) {
	for _, s := range []string{"0", "1e5", "100000.0", "1.5", "-1", "1e18", "12000e-2", "0.0e7", "1E+2", "18446744073709551616", "\"100\"", "null"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, set, err := limitValue("max_tokens", []byte(s), MaxTokenLimit)
		// ParseRequest hands over a value without surrounding whitespace.
		if !json.Valid([]byte(s)) || len(s) > 64 || strings.TrimSpace(s) != s {
			return
		}
		dec := json.NewDecoder(strings.NewReader(s))
		dec.UseNumber()
		var v any
		if dec.Decode(&v) != nil {
			return
		}
		num, isNumber := v.(json.Number)
		if !isNumber {
			if (v == nil) != (err == nil) || set {
				t.Fatalf("limitValue(%q) = %d, %v, %v for a non-number", s, n, set, err)
			}
			return
		}
		if i := strings.IndexAny(s, "eE"); i >= 0 {
			if e, err := strconv.Atoi(s[i+1:]); err != nil || e > 400 || e < -400 {
				return // too large an exponent for math/big to expand quickly
			}
		}
		r, ok := new(big.Rat).SetString(num.String())
		if !ok {
			t.Fatalf("math/big cannot read %q", s)
		}
		want := r.IsInt() && r.Sign() >= 0 && r.Cmp(new(big.Rat).SetInt64(MaxTokenLimit)) <= 0 && !strings.HasPrefix(s, "-")
		if want != (err == nil) {
			t.Fatalf("limitValue(%q) = %d, %v; want accepted=%v", s, n, err, want)
		}
		if want && (!set || r.Cmp(new(big.Rat).SetInt64(n)) != 0) {
			t.Fatalf("limitValue(%q) = %d, want %s", s, n, r.RatString())
		}
	})
}

// FuzzDeliveredContent: any event data, however malformed, is walked
// without a panic, the estimate never exceeds one token per byte, and
// text split anywhere estimates the same as whole.
func FuzzDeliveredContent(f *testing.F) {
	for _, s := range []string{
		`{"choices":[{"delta":{"content":"Hello, world"}}]}`,
		`{"type":"content_block_delta","delta":{"type":"text_delta","text":"a\nb\u00e9"}}`,
		`{"type":"response.output_text.delta","delta":"Hi"}`,
		`{"choices":[{"delta":{"content":"unterminated`,
		`[[[[[[[[[[{"text":"deep"}]]]]]]]]]]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, api := range []API{OpenAIChat, OpenAIResponses, AnthropicMessages, OpenAIEmbeddings} {
			m := api.NewMeter()
			m.Event(streamgate.Event{Data: data})
			m.Body(data)
			if n := m.DeliveredTokens(); n < 0 || n > 2*int64(len(data)) {
				t.Fatalf("%s: %d tokens from %d bytes", api, n, len(data))
			}
		}
		if n := EstimateInputTokens(data); n < 0 || n > int64(len(data)) {
			t.Fatalf("input estimate %d for %d bytes", n, len(data))
		}
		whole := EstimateTokens(data)
		if whole > int64(len(data)) {
			t.Fatalf("%d tokens for %d bytes", whole, len(data))
		}
		var e TokenEstimator
		for i := range data {
			e.Write(data[i : i+1])
		}
		if e.Tokens() != whole {
			t.Fatalf("byte by byte %d, whole %d", e.Tokens(), whole)
		}
	})
}

// FuzzChatEvent: the one walk of a chat chunk feeds the estimate exactly
// what the content walk does and classifies it exactly as classifyChat,
// whatever the bytes; and a meter fed an event classifies it as the API
// does, whether Classify follows its Event or not.
func FuzzChatEvent(f *testing.F) {
	for _, s := range []string{
		shapes.ChatRole, shapes.ChatRoleNull, shapes.ChatEmpty, shapes.ChatContent, shapes.ChatEscaped,
		shapes.ChatToolCall, shapes.ChatReasoning, shapes.ChatRefusal, shapes.ChatFinish, shapes.ChatUsage,
		shapes.ChatError, shapes.ChatORError, shapes.ChatErrorNull,
		`{"choices":[{"text":"completion","index":0,"finish_reason":null}]}`,
		`{"choices":[{"finish_reason":"stop"},5,{"delta":{"content":"late"}}]}`,
		`{"choices":"not a list","error":{"message":"m"}}`,
		`{"x":{"a" 1},"error":{"message":"lax skip, strict walk"}}`,
		`{"choices":[{"delta":{"content":"x"}}],"error":null} trailing`,
		`{"choices":[{"delta":{"tool_calls":[ ]}}]}`,
		`{"choices":[{"message":{"content":"whole"},"finish_reason":"length"}]}`,
		`{"choices":[{"delta":[{"content":"in a list"}]}]}`,
	} {
		f.Add([]byte(s), "")
	}
	f.Add([]byte(shapes.ChatContent), "message")
	f.Add([]byte(shapes.ChatError), "error")
	f.Fuzz(func(t *testing.T, data []byte, name string) {
		if d := trimWS(data); len(d) > 0 && string(d) != "[DONE]" {
			var one, two TokenEstimator
			k := chatEvent(&one, d)
			openAIContent.feed(&two, d)
			if want := classifyChat(d); k != want || one != two {
				t.Fatalf("%q: kind %v, want %v; estimate %+v, want %+v", d, k, want, one, two)
			}
		}
		ev := streamgate.Event{Name: name, Data: data}
		for _, api := range []API{OpenAIChat, OpenAICompletions, AnthropicMessages, Unknown} {
			m := api.NewMeter()
			m.Event(ev)
			if k, want := m.Classify(ev), api.Classify(ev); k != want {
				t.Fatalf("%s %q: the meter says %v, the API %v", api, data, k, want)
			}
			if k, want := m.Classify(ev), api.Classify(ev); k != want {
				t.Fatalf("%s %q classified again: %v, want %v", api, data, k, want)
			}
			// The next event's bytes in the same buffer (as the gate's
			// parser reuses it), classified without an Event: never the
			// remembered kind of the bytes that were there.
			buf := append([]byte(nil), data...)
			m.Event(streamgate.Event{Name: name, Data: buf})
			slices.Reverse(buf)
			if k, want := m.Classify(streamgate.Event{Name: name, Data: buf}), api.Classify(streamgate.Event{Name: name, Data: buf}); k != want {
				t.Fatalf("%s %q, then %q in its place: %v, want %v", api, data, buf, k, want)
			}
		}
	})
}

// FuzzOpenAIUsage: the one-walk usage read agrees with unmarshalling the
// whole document, wherever the two can agree (json.Unmarshal also matches
// keys case-insensitively and decodes escaped keys; the walk takes the
// literal key "usage" only, which is what every provider sends).
func FuzzOpenAIUsage(f *testing.F) {
	for _, s := range []string{
		`{"id":"x","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12}}`,
		`{"usage":null}`, `{"usage":{"prompt_tokens":1},"usage":{"completion_tokens":2}}`,
		`{"choices":[{"usage":{"prompt_tokens":1}}]}`, `{"usage":{"prompt_tokens":1}} x`,
		`{"usage":{"prompt_tokens":1.5}}`, `{"usage":7}`, `[{"usage":{}}]`, `{"a":tru,"usage":{"prompt_tokens":1}}`,
		// The usage object's own fast decode against json's rules.
		`{"usage":{"PROMPT_TOKENS":3,"Completion_Tokens":null,"completion_tokens":4,"details":{"a":[1,{"b":2}]}}}`,
		`{"usage":{"prompt_tokens":9223372036854775808}}`, `{"usage":{"prompt_tokens":-0,"completion_tokens":1e2}}`,
		`{"usage":{"prompt_toKens":5}}`, `{"usage":{"prompt_tokens":"5"}}`, `{"usage":{"prompt_tokens":01}}`,
		`{"usage":{"completion_tokens":2,"completion_tokens":null}}`, `{"usage":{"prompt_tokens":1,}}`,
		// prompt_tokens_details, as OpenAI sends it on every answer.
		`{"usage":{"prompt_tokens":12,"completion_tokens":38,"total_tokens":50,"prompt_tokens_details":{"cached_tokens":8,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0}}}`,
		`{"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":8},"prompt_tokens_details":{"audio_tokens":1}}}`,
		`{"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":8},"prompt_tokens_details":null}}`,
		`{"usage":{"prompt_tokens":12,"prompt_tokens_details":{"Cached_Tokens":8,"cached_tokens":null}}}`,
		`{"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":8.0}}}`,
		`{"usage":{"prompt_tokens":12,"prompt_tokens_details":[8]}}`, `{"usage":{"prompt_tokens_details":{"cached_tokens":3}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var got Usage
		openAIUsageBody(&got, data)
		// Outside the usage value the walk is structural only, so the
		// two are compared on valid documents.
		if bytes.IndexByte(data, '\\') >= 0 || !json.Valid(data) {
			return
		}
		if keys, ok := topLevelKeys(data); ok {
			for _, k := range keys {
				if strings.EqualFold(k, "usage") && k != "usage" {
					return
				}
			}
		}
		var want Usage
		var c struct {
			Usage *openAIUsage `json:"usage"`
		}
		err := json.Unmarshal(data, &c)
		if err == nil && c.Usage != nil {
			want.set(c.Usage.PromptTokens, c.Usage.CompletionTokens)
			if c.Usage.PromptTokens != nil {
				want.CacheRead = c.Usage.cached()
			}
		}
		// A report json cannot read (a count of the wrong type or out of
		// range) is garbled, not absent.
		var typeErr *json.UnmarshalTypeError
		want.Garbled = errors.As(err, &typeErr) && typeErr.Field != "" // not a document that is no object
		if got != want {
			t.Fatalf("walk %+v, unmarshal %+v for %q", got, want, data)
		}
	})
}

// FuzzServerTools: the walk over a tools array decides as unmarshalling it
// does, for every valid tools value.
func FuzzServerTools(f *testing.F) {
	for _, s := range []string{
		`null`, `[]`, `[null]`, `[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]`,
		`[{"type":"custom"},{"type":"web_search"}]`, `[{"TYPE":"web_search"}]`, `[{"type":"web_search","type":null}]`,
		`[{"type":null,"Type":"function"}]`, `[{"type":7}]`, `[7]`, `["function"]`, `{"type":"function"}`, `"x"`,
		`[{"typ\u0065":"web_search"}]`, `[{"type":"functio\u006e"}]`, `[{"type":"Function"}]`, `[{"\u00e9":1,"type":"custom"}]`,
		`[{"type":"function"},{}]`, `[[]]`, `[{"name":"no type"}]`, " null ", "\n[ {\"type\" : \"x\"} ]\t",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, val []byte) {
		if !json.Valid(val) {
			return // the request's body is validated before its tools are read
		}
		if got, want := serverTools(val), serverToolsJSON(val); got != want {
			t.Fatalf("serverTools(%q) = %v, json %v", val, got, want)
		}
	})
}

// FuzzCountImages: one pass counts what the three bytes.Count did.
func FuzzCountImages(f *testing.F) {
	for _, s := range []string{
		`{"type":"image_url","image_url":{"url":"x"}}`, `{"type":"input_image"}`, `{"type":"image","source":{}}`,
		`"image""image"`, `"input_image_url"`, `image"`, `"imageimage"`, `""image"`, `"input_"image"`, `"image_url"image"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		want := bytes.Count(body, []byte(`"image_url"`)) + bytes.Count(body, []byte(`"input_image"`)) + bytes.Count(body, []byte(`"image"`))
		if got := countImages(body); got != want {
			t.Fatalf("countImages(%q) = %d, want %d", body, got, want)
		}
	})
}
