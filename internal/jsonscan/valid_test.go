package jsonscan

import (
	"encoding/json"
	"strings"
	"testing"
)

var validCases = []string{
	`{}`, `[]`, ` { } `, `{"a":1}`, `{"a":[1,2,{"b":null}],"c":"d"}`, `"x"`, `0`, `-0`, `-0.5e+10`, `1E5`,
	`true`, `false`, `null`, `[true,false,null]`, "\t[ 1 , 2 ]\r\n", `"\u00e9\n\"\\\/\b\f\r\t"`, "\"\xff\xfe\"",
	// and what is not valid
	``, ` `, `{`, `}`, `[`, `{"a"}`, `{"a":}`, `{"a":1,}`, `[1,]`, `[,1]`, `{,}`, `{"a" 1}`, `{a:1}`, `{"a":1}}`,
	`[1]]`, `[}`, `{]`, `01`, `1.`, `.5`, `-`, `+1`, `1e`, `1e+`, `0x10`, `tru`, `truee`, `nul`, `"abc`, `"\x"`,
	`"\u12"`, `"\u12G4"`, "\"a\nb\"", "\"\x01\"", `1 2`, `{} {}`, `"a" x`, `NaN`, `Infinity`, `[1 2]`, `{"a":1 "b":2}`,
}

func TestValidAgreesWithJSON(t *testing.T) {
	for _, c := range validCases {
		if got, want := Valid([]byte(c)), json.Valid([]byte(c)); got != want {
			t.Errorf("Valid(%q) = %v, json.Valid %v", c, got, want)
		}
	}
	// encoding/json's nesting limit: 10,000 levels are valid, 10,001 not.
	for _, n := range []int{maxDepth, maxDepth + 1} {
		for _, open := range []string{"[", `{"a":`} {
			close := "]"
			if open != "[" {
				close = "}"
			}
			doc := []byte(strings.Repeat(open, n) + "1" + strings.Repeat(close, n))
			if got, want := Valid(doc), json.Valid(doc); got != want {
				t.Errorf("%d levels of %s: Valid %v, json.Valid %v", n, open, got, want)
			}
		}
	}
}

func FuzzValid(f *testing.F) {
	for _, c := range validCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := Valid(b), json.Valid(b); got != want {
			t.Fatalf("Valid(%q) = %v, json.Valid %v", b, got, want)
		}
	})
}

// An OpenAI chat answer, what the gateway validates on every
// non-streaming 200.
var answer = []byte(`{"id":"chatcmpl-bench0000000000000000000000001","object":"chat.completion","created":1767225600,"model":"m-2026-01-01","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! This is a fixed answer from the benchmark upstream, as long as a short reply.","refusal":null},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":38,"total_tokens":50,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"system_fingerprint":"fp_bench0001"}`)

func BenchmarkValid(b *testing.B) {
	for _, bc := range []struct {
		name  string
		valid func([]byte) bool
	}{{"jsonscan", Valid}, {"encoding-json", json.Valid}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(answer)))
			b.ReportAllocs()
			for b.Loop() {
				if !bc.valid(answer) {
					b.Fatal("invalid")
				}
			}
		})
	}
}
