package wallet

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"

	"github.com/dustin/go-humanize"
)

// Micros is an amount of money in millionths of a US dollar. Integers keep
// every balance, reservation and charge exact: a float would let rounding
// error accumulate across millions of tiny charges.
type Micros int64

// microsPerUnit is the number of Micros in one dollar, and also the number of
// tokens per priced unit ("per million tokens").
const microsPerUnit = 1_000_000

// ParseMicros parses a non-negative decimal dollar amount such as "0.15" or
// "3" exactly. It accepts at most six fractional digits (a micro-dollar is the
// smallest unit) and rejects signs, exponents, spaces, thousands separators
// and currency symbols, because a price or credit typed by an operator must
// either mean exactly what it says or fail loudly.
func ParseMicros(s string) (Micros, error) {
	intPart, frac, hasDot := strings.Cut(s, ".")
	if intPart == "" || (hasDot && frac == "") {
		return 0, fmt.Errorf("parsing amount %q: want digits with an optional fraction such as 0.15", s)
	}
	if len(frac) > 6 {
		return 0, fmt.Errorf("parsing amount %q: more than 6 decimal places (1 micro-dollar is the smallest unit)", s)
	}
	if !allDigits(intPart) || !allDigits(frac) {
		if strings.HasPrefix(s, "-") {
			return 0, fmt.Errorf("parsing amount %q: negative amounts are not allowed", s)
		}
		return 0, fmt.Errorf("parsing amount %q: only decimal digits and one '.' are allowed", s)
	}
	whole, err := strconv.ParseUint(intPart, 10, 64)
	if err != nil || whole > math.MaxInt64/microsPerUnit {
		return 0, fmt.Errorf("parsing amount %q: too large", s)
	}
	var f uint64
	if frac != "" {
		f, _ = strconv.ParseUint(frac+strings.Repeat("0", 6-len(frac)), 10, 64)
	}
	total := whole*microsPerUnit + f
	if total > math.MaxInt64 {
		return 0, fmt.Errorf("parsing amount %q: too large", s)
	}
	return Micros(total), nil
}

// ParseSignedMicros is ParseMicros with an optional leading minus, for
// corrections ("-0.50") and for amounts read back from String.
func ParseSignedMicros(s string) (Micros, error) {
	abs, neg := strings.CutPrefix(s, "-")
	m, err := ParseMicros(abs)
	if neg {
		m = -m
	}
	return m, err
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// String formats m as the shortest exact decimal ("0.15", "3", "-12.000001"),
// so that ParseMicros(m.String()) == m for every non-negative m.
func (m Micros) String() string {
	neg := m < 0
	// Work in uint64 so math.MinInt64 negates without overflow.
	u := uint64(m)
	if neg {
		u = -u
	}
	whole, frac := u/microsPerUnit, u%microsPerUnit
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	b.WriteString(strconv.FormatUint(whole, 10))
	if frac != 0 {
		fs := fmt.Sprintf("%06d", frac)
		b.WriteByte('.')
		b.WriteString(strings.TrimRight(fs, "0"))
	}
	return b.String()
}

// Human formats m for people: "$1,234.50", "$0.0015", "-$3.00". Cents are
// always shown; sub-cent digits only when present, so small per-request
// charges are not displayed as $0.00.
func (m Micros) Human() string {
	neg := m < 0
	u := uint64(m)
	if neg {
		u = -u
	}
	whole, frac := u/microsPerUnit, u%microsPerUnit
	fs := strings.TrimRight(fmt.Sprintf("%06d", frac), "0")
	for len(fs) < 2 {
		fs += "0"
	}
	sign := ""
	if neg {
		sign = "-"
	}
	// humanize.Comma takes int64; whole ≤ MaxInt64/1e6 always fits.
	return sign + "$" + humanize.Comma(int64(whole)) + "." + fs
}

// Price is what a model costs, per million tokens: plain input and
// output, and input read from the provider's prompt cache or written to
// it (for 5 minutes, or for an hour), which providers bill at their own
// prices.
type Price struct {
	Input, Output                       Micros
	CacheRead, CacheWrite, CacheWrite1h Micros
}

// Tokens is one answer's usage by the classes a Price prices: Input is
// the plain input, read neither from nor into a cache.
type Tokens struct {
	Input, Output                       int64
	CacheRead, CacheWrite, CacheWrite1h int64
}

// Cost returns the price of in input and out output tokens, rounded up to
// the next whole micro-dollar so that many small requests can never add up
// to less than their true price. Negative counts or prices count as zero.
// The arithmetic is 128-bit, and a result beyond int64 saturates at
// math.MaxInt64, which no balance can cover.
func (p Price) Cost(in, out int64) Micros {
	return p.CostOf(Tokens{Input: in, Output: out})
}

// CostOf is Cost for usage by class, each at its price, rounded up once.
func (p Price) CostOf(t Tokens) Micros {
	var hi, lo uint64
	for _, c := range [...]struct {
		n     int64
		price Micros
	}{{t.Input, p.Input}, {t.Output, p.Output}, {t.CacheRead, p.CacheRead}, {t.CacheWrite, p.CacheWrite}, {t.CacheWrite1h, p.CacheWrite1h}} {
		ph, pl := bits.Mul64(nonNeg(c.n), nonNeg(int64(c.price)))
		var carry, overflow uint64
		lo, carry = bits.Add64(lo, pl, 0)
		hi, overflow = bits.Add64(hi, ph, carry)
		if overflow != 0 {
			return math.MaxInt64
		}
	}
	if hi >= microsPerUnit {
		// The quotient would not fit in 64 bits (bits.Div64 panics then).
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, microsPerUnit)
	if r != 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return Micros(q)
}

func nonNeg(v int64) uint64 {
	if v < 0 {
		return 0
	}
	return uint64(v)
}

// ImageTokenAllowance is the number of input tokens reserved for each image
// (or other media) part of a request, because a part referenced by URL costs
// tokens that the request body's bytes don't show, and a tiny but tall image
// can cost far more tokens than its base64 bytes.
//
// It must cover the most expensive image any supported upstream bills. The
// outlier is gpt-4o-mini, which bills 2,833 + 5,667 tokens per 512px tile
// at detail=high: a 768×2048 image is 8 tiles = 48,169 tokens. For
// comparison GPT-4o bills at most 85 + 170×8 = 1,445, Claude about
// (width×height)/750 ≤ ~1,600 after its own downscaling, GPT-4.1-nano at most
// 1,536 patches × 2.46 ≈ 3,780. 48 Ki tokens covers all of these. Callers that
// know the model's real ceiling may set Estimate.ImageTokens instead, to
// avoid refusing a low balance for a bound it never needed.
const ImageTokenAllowance = 48 * 1024

// RequestOverheadTokens is added to every input bound. Byte-level BPE
// tokenizers emit at least one byte of text per token, and a request's JSON
// syntax usually outweighs the chat template's special tokens, but some
// upstreams inject prompts the client never sent (Anthropic adds a tool-use
// system prompt of a few hundred tokens). A fixed margin keeps the bound
// honest for tiny bodies where the JSON syntax alone would not cover that.
const RequestOverheadTokens = 1024

// Estimate is what the gateway knows about a request before sending it.
type Estimate struct {
	// BodyBytes is the decoded (not compressed) length of the request body.
	BodyBytes int
	// Images counts image, audio and file parts, whether inline or by URL.
	Images int
	// ImageTokens overrides ImageTokenAllowance per part when > 0.
	ImageTokens int64
	// MaxOutput is the request's max_tokens / max_completion_tokens /
	// max_output_tokens, or the model's output limit when the client set
	// none. It includes reasoning tokens, as upstreams count them there.
	MaxOutput int64
	// N is the number of choices requested; values below 1 mean 1.
	N int
	// StoredInputTokens, when > 0, is the most input a request that refers
	// to input stored upstream (a previous response, a conversation) can
	// have: the body shows only the new part of it.
	StoredInputTokens int64
	// Continuations is how many times a broken answer may be continued on
	// another channel (the gateway's stream_resume): each continuation is
	// sent the request plus what was delivered as a prefill, so it can
	// cost up to ContinuationBounds on top of the first attempt.
	Continuations int
	// WritesCache and WritesCache1h say the request asks the provider to
	// write its prompt cache (for 5 minutes, for an hour), which is
	// billed above plain input: its input is reserved at the dearer of
	// the prices.
	WritesCache, WritesCache1h bool
}

// MaxCost returns the reservation for a request: a cost that the request
// cannot exceed at price p, and the input-token bound it was computed from.
func MaxCost(e Estimate, p Price) (Micros, int64) {
	p = e.inputPrice(p)
	in, out := e.Bounds()
	cost := uint64(p.Cost(in, out))
	if e.Continuations > 0 {
		cin, cout := e.ContinuationBounds()
		cost = satAdd(cost, satMul(uint64(p.Cost(cin, cout)), uint64(e.Continuations)))
	}
	return Micros(cost), in
}

// inputPrice is p with its input price raised to the dearest cache write
// the request may cause: every input token could be written.
func (e Estimate) inputPrice(p Price) Price {
	if e.WritesCache {
		p.Input = max(p.Input, p.CacheWrite)
	}
	if e.WritesCache1h {
		p.Input = max(p.Input, p.CacheWrite1h)
	}
	return p
}

// ContinuationBounds returns the most input and output tokens one
// continuation can have: its input is the request's plus the delivered
// text, which is at most the output bound, plus, when it is asked in
// words rather than by a prefill, the turn asking it
// (ContinuationAskTokens); its output is at most the output bound.
func (e Estimate) ContinuationBounds() (in, out int64) {
	in, out = e.Bounds()
	return int64(satAdd(satAdd(uint64(in), uint64(out)), ContinuationAskTokens)), out
}

// ContinuationAskTokens bounds the user turn that asks a model with no
// prefill to continue (about 80 tokens, and its message framing).
const ContinuationAskTokens = 256

// Bounds returns the most input and output tokens the request can have.
// A usage report beyond them is implausible.
func (e Estimate) Bounds() (in, out int64) {
	perImage := e.ImageTokens
	if perImage <= 0 {
		perImage = ImageTokenAllowance
	}
	bound := satAdd(satAdd(nonNeg(int64(e.BodyBytes)), satMul(nonNeg(int64(e.Images)), nonNeg(perImage))), RequestOverheadTokens)
	bound = max(bound, nonNeg(e.StoredInputTokens))
	n := int64(e.N)
	if n < 1 {
		n = 1
	}
	return int64(bound), int64(satMul(nonNeg(e.MaxOutput), uint64(n)))
}

// satAdd and satMul saturate at math.MaxInt64 so absurd inputs give an
// unaffordable reservation instead of a wrapped-around small one.
func satAdd(a, b uint64) uint64 {
	s, c := bits.Add64(a, b, 0)
	if c != 0 || s > math.MaxInt64 {
		return math.MaxInt64
	}
	return s
}

func satMul(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return lo
}
