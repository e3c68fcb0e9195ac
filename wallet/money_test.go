package wallet

import (
	"math"
	"strings"
	"testing"
)

func TestParseMicros(t *testing.T) {
	good := []struct {
		in   string
		want Micros
	}{
		{"0", 0},
		{"0.15", 150_000},
		{"3", 3_000_000},
		{"12.000001", 12_000_001},
		{"0.000001", 1},
		{"1.5", 1_500_000},
		{"007.10", 7_100_000},
		{"9223372036854.775807", math.MaxInt64},
	}
	for _, c := range good {
		got, err := ParseMicros(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseMicros(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	bad := []string{
		"", "-1", "-0.5", "+1", "1e6", "1E-3", "0x10", "1.0000001", ".5", "5.", "1.2.3",
		" 1", "1 ", "1,000", "$1", "abc", "١", "NaN", "Inf", "9223372036854.775808", "99999999999999999999",
	}
	for _, in := range bad {
		if got, err := ParseMicros(in); err == nil {
			t.Errorf("ParseMicros(%q) = %d, want error", in, got)
		}
	}
	if _, err := ParseMicros("-2"); err == nil || !strings.Contains(err.Error(), "negative") {
		t.Errorf("negative amount error should say so, got %v", err)
	}
}

func TestMicrosString(t *testing.T) {
	cases := []struct {
		m    Micros
		want string
	}{
		{0, "0"},
		{150_000, "0.15"},
		{3_000_000, "3"},
		{12_000_001, "12.000001"},
		{1, "0.000001"},
		{-1_500_000, "-1.5"},
		{math.MaxInt64, "9223372036854.775807"},
		{math.MinInt64, "-9223372036854.775808"},
	}
	for _, c := range cases {
		if got := c.m.String(); got != c.want {
			t.Errorf("Micros(%d).String() = %q, want %q", int64(c.m), got, c.want)
		}
		if c.m >= 0 {
			back, err := ParseMicros(c.want)
			if err != nil || back != c.m {
				t.Errorf("round trip of %q = %d, %v", c.want, back, err)
			}
		}
	}
}

func TestMicrosHuman(t *testing.T) {
	cases := []struct {
		m    Micros
		want string
	}{
		{1_234_500_000, "$1,234.50"},
		{3_000_000, "$3.00"},
		{1_500, "$0.0015"},
		{0, "$0.00"},
		{12_000_001, "$12.000001"},
		{-2_500_000, "-$2.50"},
		{1_000_000_000_000, "$1,000,000.00"},
	}
	for _, c := range cases {
		if got := c.m.Human(); got != c.want {
			t.Errorf("Micros(%d).Human() = %q, want %q", int64(c.m), got, c.want)
		}
	}
}

func TestPriceCost(t *testing.T) {
	p := Price{Input: 150_000, Output: 600_000} // $0.15 / $0.60 per M
	cases := []struct {
		p       Price
		in, out int64
		want    Micros
	}{
		{p, 0, 0, 0},
		{p, 1_000_000, 0, 150_000},
		{p, 0, 1_000_000, 600_000},
		{p, 1, 0, 1},                            // 0.15 micro rounds up to 1
		{p, 10, 10, 8},                          // 1.5 + 6 = 7.5 → 8
		{p, 1000, 1000, 750},                    // exact
		{p, 1001, 0, 151},                       // 150.15 → 151
		{p, -5, -5, 0},                          // negative counts are zero
		{Price{Input: -1, Output: -1}, 9, 9, 0}, // negative prices are zero
		{Price{Input: 3_000_000, Output: 15_000_000}, 123_456, 7_890, 370_368 + 118_350},
		// 2^63-1 tokens at $1,000/M would overflow 64 bits: saturate.
		{Price{Input: 1_000_000_000, Output: 0}, math.MaxInt64, 0, math.MaxInt64},
		{Price{Input: math.MaxInt64, Output: math.MaxInt64}, math.MaxInt64, math.MaxInt64, math.MaxInt64},
		// Large but representable: exact 128-bit path.
		{Price{Input: 1_000_000, Output: 0}, math.MaxInt64, 0, math.MaxInt64},
		{Price{Input: 1, Output: 0}, math.MaxInt64, 0, Micros((math.MaxInt64 + 999_999) / 1_000_000)},
	}
	for _, c := range cases {
		if got := c.p.Cost(c.in, c.out); got != c.want {
			t.Errorf("%+v.Cost(%d, %d) = %d, want %d", c.p, c.in, c.out, got, c.want)
		}
	}
}

func TestPriceCostNeverUndercharges(t *testing.T) {
	// Cost×1e6 must be ≥ the exact price and < exact + 1e6 (one micro).
	for in := int64(0); in < 3000; in += 37 {
		for out := int64(0); out < 3000; out += 53 {
			p := Price{Input: Micros(in*7 + 1), Output: Micros(out*11 + 3)}
			exact := in*int64(p.Input) + out*int64(p.Output)
			got := int64(p.Cost(in, out)) * 1_000_000
			if got < exact || got >= exact+1_000_000 {
				t.Fatalf("Cost(%d,%d) at %+v = %d micros, exact %d/1e6", in, out, p, got/1_000_000, exact)
			}
		}
	}
}

func TestMaxCost(t *testing.T) {
	p := Price{Input: 3_000_000, Output: 15_000_000}
	cost, in := MaxCost(Estimate{BodyBytes: 10_000, Images: 2, MaxOutput: 1000, N: 3}, p)
	wantIn := int64(10_000 + 2*ImageTokenAllowance + RequestOverheadTokens)
	if in != wantIn {
		t.Errorf("input bound = %d, want %d", in, wantIn)
	}
	if want := p.Cost(wantIn, 3000); cost != want {
		t.Errorf("MaxCost = %s, want %s", cost, want)
	}
	// N < 1 means one choice; an explicit per-image allowance wins.
	cost, in = MaxCost(Estimate{BodyBytes: 100, Images: 1, ImageTokens: 1600, MaxOutput: 50}, p)
	if in != 100+1600+RequestOverheadTokens || cost != p.Cost(in, 50) {
		t.Errorf("MaxCost with override = %s, %d", cost, in)
	}
	// Absurd estimates saturate instead of wrapping to something affordable.
	cost, _ = MaxCost(Estimate{BodyBytes: math.MaxInt, Images: math.MaxInt, MaxOutput: math.MaxInt64, N: math.MaxInt}, p)
	if cost != math.MaxInt64 {
		t.Errorf("saturated MaxCost = %d, want MaxInt64", cost)
	}
	// The bound holds for a real request: the body's bytes exceed its tokens.
	body := `{"model":"gpt-4o","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hi"}],"max_tokens":16}`
	_, in = MaxCost(Estimate{BodyBytes: len(body), MaxOutput: 16}, p)
	if in < int64(len(body)) {
		t.Errorf("input bound %d below body length %d", in, len(body))
	}
}

func FuzzParseMicros(f *testing.F) {
	for _, s := range []string{"0", "0.15", "3", "12.000001", "-1", "1e3", "9223372036854.775807", "1.", ".1", "00.100000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMicros(s)
		if err != nil {
			return
		}
		if m < 0 {
			t.Fatalf("ParseMicros(%q) = %d, negative", s, m)
		}
		str := m.String()
		back, err := ParseMicros(str)
		if err != nil || back != m {
			t.Fatalf("ParseMicros(%q) = %d; String %q parses to %d, %v", s, m, str, back, err)
		}
		if back.String() != str {
			t.Fatalf("String not canonical: %q vs %q", back.String(), str)
		}
	})
}

// A request that may be continued once reserves its first attempt plus a
// continuation whose input carries the delivered output as a prefill.
func TestMaxCostWithContinuation(t *testing.T) {
	p := Price{Input: 3_000_000, Output: 15_000_000}
	e := Estimate{BodyBytes: 500, MaxOutput: 64}
	alone, in := MaxCost(e, p)
	e.Continuations = 1
	both, in2 := MaxCost(e, p)
	cin, cout := e.ContinuationBounds()
	if in2 != in || cin != in+64+ContinuationAskTokens || cout != 64 {
		t.Fatalf("bounds %d, continuation %d in %d out; want %d, %d, 64", in2, cin, cout, in, in+64+ContinuationAskTokens)
	}
	if both != alone+p.Cost(in+64+ContinuationAskTokens, 64) {
		t.Errorf("MaxCost with a continuation = %s, want %s + %s", both, alone, p.Cost(in+64+ContinuationAskTokens, 64))
	}
	e = Estimate{BodyBytes: math.MaxInt, MaxOutput: math.MaxInt64, Continuations: 1}
	if cost, _ := MaxCost(e, p); cost != math.MaxInt64 {
		t.Errorf("saturated MaxCost with a continuation = %d", cost)
	}
}

// Each class of input at its own price, rounded up once: a coding-agent
// turn that is mostly a cache read costs a fraction of plain input.
func TestCostOfCacheClasses(t *testing.T) {
	p := Price{Input: 3_000_000, Output: 15_000_000, CacheRead: 300_000, CacheWrite: 3_750_000, CacheWrite1h: 6_000_000}
	got := p.CostOf(Tokens{Input: 1_000, Output: 500, CacheRead: 90_000, CacheWrite: 4_000, CacheWrite1h: 2_000})
	// 3,000 + 7,500 + 27,000 + 15,000 + 12,000 micro-dollars.
	if got != 64_500 {
		t.Errorf("CostOf = %d, want 64500", got)
	}
	if plain := p.Cost(97_000, 500); plain <= got {
		t.Errorf("all as plain input %d, cached %d: caching saves nothing?", plain, got)
	}
	// Rounded once over the sum, not per class.
	q := Price{Input: 1, CacheRead: 1}
	if got := q.CostOf(Tokens{Input: 500_000, CacheRead: 500_000}); got != 1 {
		t.Errorf("sub-micro parts: %d, want 1", got)
	}
	// Saturates rather than wrapping.
	if got := (Price{CacheRead: math.MaxInt64}).CostOf(Tokens{CacheRead: math.MaxInt64, Input: math.MaxInt64}); got != math.MaxInt64 {
		t.Errorf("overflow: %d", got)
	}
}

// A request that writes the prompt cache is reserved at the dearest write
// price for all its input, so a write that costs more than plain input
// never exceeds its reservation; other requests are not.
func TestMaxCostWithCacheWrites(t *testing.T) {
	p := Price{Input: 3_000_000, Output: 15_000_000, CacheWrite: 3_750_000, CacheWrite1h: 6_000_000}
	e := Estimate{BodyBytes: 10_000, MaxOutput: 100}
	plain, in := MaxCost(e, p)
	e.WritesCache = true
	five, _ := MaxCost(e, p)
	e.WritesCache1h = true
	hour, _ := MaxCost(e, p)
	if plain != p.Cost(in, 100) || five != (Price{Input: 3_750_000, Output: 15_000_000}).Cost(in, 100) ||
		hour != (Price{Input: 6_000_000, Output: 15_000_000}).Cost(in, 100) {
		t.Errorf("plain %s, 5m %s, 1h %s", plain, five, hour)
	}
	// The dearest write the usage can report fits what was reserved.
	worst := p.CostOf(Tokens{CacheWrite1h: in, Output: 100})
	if worst > hour {
		t.Errorf("a 1h write of the whole input costs %s, reserved %s", worst, hour)
	}
}
