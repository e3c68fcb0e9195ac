package provider

import (
	"os"
	"path/filepath"
	"testing"
)

// trueTokens are the counts of cl100k_base and o200k_base for the samples
// in testdata/estimate, computed once with tiktoken (github.com/pkoukk/tiktoken-go
// with its offline loader), so the test needs no tokenizer.
var trueTokens = map[string][2]int64{
	"english.txt": {309, 307},
	"chat.txt":    {113, 106},
	"code_go.txt": {956, 936},
	"code_py.txt": {283, 281},
}

// estimateTolerance is the documented accuracy of TokenEstimator.
const estimateTolerance = 0.10

func TestTokenEstimator(t *testing.T) {
	for name, want := range trueTokens {
		text, err := os.ReadFile(filepath.Join("testdata", "estimate", name))
		if err != nil {
			t.Fatal(err)
		}
		got := EstimateTokens(text)
		for i, w := range want {
			if d := float64(got-w) / float64(w); d > estimateTolerance || d < -estimateTolerance {
				t.Errorf("%s: estimated %d tokens, tokenizer %d counted %d (%+.0f%%, tolerance ±%.0f%%)", name, got, i, w, 100*d, 100*estimateTolerance)
			}
		}
		t.Logf("%s: estimated %d, cl100k %d, o200k %d", name, got, want[0], want[1])

		// Split anywhere, a stream's deltas give the same estimate.
		var e TokenEstimator
		for i := 0; i < len(text); i += 7 {
			e.Write(text[i:min(i+7, len(text))])
		}
		if e.Tokens() != got {
			t.Errorf("%s: in pieces %d, whole %d", name, e.Tokens(), got)
		}
	}
}

func TestTokenEstimatorNonASCII(t *testing.T) {
	var e TokenEstimator
	s := []byte("日本語")
	e.Write(s[:4]) // splits the second character
	e.Write(s[4:])
	if e.Tokens() != 3 {
		t.Errorf("three CJK characters estimated as %d tokens", e.Tokens())
	}
	if n := EstimateTokens(nil); n != 0 {
		t.Errorf("empty text estimated as %d", n)
	}
}
