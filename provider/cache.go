package provider

import (
	"bytes"

	"github.com/llmfailover/caddy-llm-failover/internal/jsonscan"
)

// Providers bill input read from their prompt cache, and input written to
// it, at their own prices. An operator names them in a model's price;
// these are the defaults when it names none, per provider, as fractions
// of the plain input price. They err on the operator's side: a read is
// never charged less than the provider's dearest cache read costs.

// CacheRates are default prompt-cache prices in thousandths of the plain
// input price: Read for cache reads, Write and Write1h for writes kept 5
// minutes and an hour. Implicit: the provider caches every long prompt
// unasked (OpenAI, Gemini), so a served prompt is cached for the next
// turn; Claude caches only what a cache_control marker names.
type CacheRates struct {
	Read, Write, Write1h int64
	Implicit             bool
}

// CachePricer is implemented by adapters whose provider discounts cached
// input; upstreamModel matters where one provider hosts several families.
type CachePricer interface {
	CacheRates(upstreamModel string) CacheRates
}

var (
	// Claude (Anthropic, Vertex, Bedrock): reads 0.1x, writes 1.25x for
	// 5 minutes and 2x for an hour.
	claudeCacheRates = CacheRates{Read: 100, Write: 1250, Write1h: 2000}
	// OpenAI-style hosts: cached_tokens at the smallest discount of
	// OpenAI's models (0.5x; newer ones bill 0.25x or 0.1x); hosts that
	// report Anthropic-style writes bill them like Anthropic.
	openAICacheRates = CacheRates{Read: 500, Write: 1250, Write1h: 2000, Implicit: true}
	// Gemini: implicit cache hits at 0.25x (2.0 models; 2.5 and later
	// bill less).
	geminiCacheRates = CacheRates{Read: 250, Write: 1250, Write1h: 2000, Implicit: true}
)

// CacheRates: Claude's.
func (Anthropic) CacheRates(string) CacheRates { return claudeCacheRates }

// CacheRates: Claude's.
func (*Bedrock) CacheRates(string) CacheRates { return claudeCacheRates }

// CacheRates: Claude's for Claude, Gemini's for the models of Vertex's
// OpenAI endpoint.
func (v *Vertex) CacheRates(model string) CacheRates {
	if v.ModelAPI(model) == AnthropicMessages {
		return claudeCacheRates
	}
	return geminiCacheRates
}

// CacheRates: OpenAI's.
func (OpenAI) CacheRates(string) CacheRates { return openAICacheRates }

// CacheRates: OpenAI's.
func (*Azure) CacheRates(string) CacheRates { return openAICacheRates }

// CacheRates: Gemini's.
func (*Gemini) CacheRates(string) CacheRates { return geminiCacheRates }

// DefaultCacheRates are a's rates for upstreamModel; an adapter that
// names none gets OpenAI's, never the full input price for a read.
func DefaultCacheRates(a Adapter, upstreamModel string) CacheRates {
	if p, ok := a.(CachePricer); ok {
		return p.CacheRates(upstreamModel)
	}
	return openAICacheRates
}

// Interface guards.
var (
	_ CachePricer = Anthropic{}
	_ CachePricer = (*Bedrock)(nil)
	_ CachePricer = (*Vertex)(nil)
	_ CachePricer = OpenAI{}
	_ CachePricer = (*Azure)(nil)
	_ CachePricer = (*Gemini)(nil)
)

var (
	cacheControlKey = []byte(`"cache_control"`)
	ttlKey          = []byte(`"ttl"`)
)

// CacheWrites reports whether a request body asks the provider to write
// its prompt cache (a cache_control marker, Anthropic's form, which
// Vertex, Bedrock and compatible hosts share) and whether for an hour
// (a "ttl": "1h"). OpenAI-style hosts cache implicitly and bill no
// writes. A marker that is only text in a message is escaped in JSON, so
// it is never taken for one; a false positive would only reserve more.
func CacheWrites(body []byte) (write, write1h bool) {
	if !bytes.Contains(body, cacheControlKey) {
		return false, false
	}
	for rest := body; ; {
		i := bytes.Index(rest, ttlKey)
		if i < 0 {
			return true, false
		}
		rest = rest[i+len(ttlKey):]
		j := jsonscan.SkipWS(rest, 0)
		if j < len(rest) && rest[j] == ':' {
			j = jsonscan.SkipWS(rest, j+1)
			if bytes.HasPrefix(rest[j:], []byte(`"1h"`)) {
				return true, true
			}
		}
	}
}
