package provider

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/llmfailover/caddy-llm-failover/breaker"
)

// This file holds what the adapters of providers other than OpenAI's and
// Anthropic's own hosts share: body rewrites for upstreams that take the
// model in the URL, the provider's own path under a base URL, error
// bodies translated to the client's API, and the model name restored in
// answers of a renamed route.

// rewriteTop returns a new body: body's top-level object without the keys
// in drop, with the raw members in add ("key":value, already encoded)
// appended. body must be valid JSON (ParseRequest has checked it).
func rewriteTop(body []byte, drop []string, add ...string) []byte {
	out := make([]byte, 0, len(body)+64)
	out = append(out, '{')
	first := true
	sep := func() {
		if !first {
			out = append(out, ',')
		}
		first = false
	}
	_ = eachTopLevel(body, func(key []byte, start, end int) error {
		for _, d := range drop {
			if string(key) == d {
				return nil
			}
		}
		sep()
		k, _ := json.Marshal(string(key))
		out = append(append(append(out, k...), ':'), body[start:end]...)
		return nil
	})
	for _, a := range add {
		sep()
		out = append(out, a...)
	}
	return append(out, '}')
}

// apiTail is the part of a client path after its API version, the part a
// provider with its own versioned prefix appends: /v1/chat/completions
// gives /chat/completions.
func apiTail(p string) string {
	if i := strings.LastIndex(p, "/v1/"); i >= 0 {
		return p[i+3:]
	}
	return p
}

// withPrefix joins a provider's own path prefix to the base URL's path,
// unless the base already ends with it (so that both
// https://host and https://host/v1beta/openai work).
func withPrefix(base, prefix string) string {
	if strings.HasSuffix(base, prefix) {
		return base
	}
	return base + prefix
}

// upstreamURL is the base URL with path p (unescaped) and query q.
func upstreamURL(base *url.URL, p, rawPath, q string) *url.URL {
	return &url.URL{Scheme: base.Scheme, Host: base.Host, Path: p, RawPath: rawPath, RawQuery: q}
}

// modelOf is the model name an upstream knows the request's model by.
func modelOf(c Call) string {
	if c.UpstreamModel != "" {
		return c.UpstreamModel
	}
	return c.Request.Model
}

// RetryAfter reads how long an upstream asks to be left alone:
// retry-after-ms (OpenAI, Azure) when present, Retry-After otherwise.
func RetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	if ms, err := strconv.ParseInt(strings.TrimSpace(h.Get("Retry-After-Ms")), 10, 64); err == nil && ms >= 0 && ms < int64(1<<62)/int64(time.Millisecond) {
		return time.Duration(ms) * time.Millisecond, true
	}
	return breaker.ParseRetryAfter(h.Get("Retry-After"), now)
}

// rateLimitResets are the headers in which providers say when each of an
// account's limits resets, with the header saying how much of it is left:
// Anthropic's as RFC 3339 times, OpenAI's (and the hosts that copy it) as
// durations ("1s", "6m0s", "20ms").
var rateLimitResets = []struct {
	reset, remaining string
	rfc3339          bool
}{
	{"Anthropic-Ratelimit-Requests-Reset", "Anthropic-Ratelimit-Requests-Remaining", true},
	{"Anthropic-Ratelimit-Tokens-Reset", "Anthropic-Ratelimit-Tokens-Remaining", true},
	{"Anthropic-Ratelimit-Input-Tokens-Reset", "Anthropic-Ratelimit-Input-Tokens-Remaining", true},
	{"Anthropic-Ratelimit-Output-Tokens-Reset", "Anthropic-Ratelimit-Output-Tokens-Remaining", true},
	{"X-Ratelimit-Reset-Requests", "X-Ratelimit-Remaining-Requests", false},
	{"X-Ratelimit-Reset-Tokens", "X-Ratelimit-Remaining-Tokens", false},
}

// RateLimitReset reads, from a 429 that carries no Retry-After, when the
// exhausted limit resets: the latest reset among the limits whose
// remaining count is 0, or, when no header says which is exhausted, the
// soonest reset given. false when the answer names no reset.
func RateLimitReset(h http.Header, now time.Time) (time.Duration, bool) {
	var exhausted, soonest time.Duration
	var anyExhausted, any bool
	for _, r := range rateLimitResets {
		v := strings.TrimSpace(h.Get(r.reset))
		if v == "" {
			continue
		}
		var wait time.Duration
		if r.rfc3339 {
			at, err := time.Parse(time.RFC3339, v)
			if err != nil {
				continue
			}
			wait = max(at.Sub(now), 0)
		} else {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				continue
			}
			wait = d
		}
		if !any || wait < soonest {
			soonest = wait
		}
		any = true
		if strings.TrimSpace(h.Get(r.remaining)) == "0" {
			exhausted, anyExhausted = max(exhausted, wait), true
		}
	}
	if anyExhausted {
		return exhausted, true
	}
	return soonest, any
}

// maxErrorBody bounds how much of an upstream's error body is read to
// translate it.
const maxErrorBody = 64 << 10

// translateError returns, for a non-2xx answer in a provider's own error
// format (Google's, array-wrapped or not; Bedrock's {"message":...}), a
// body in the client API's format with the same status and message, so
// that official SDKs raise their usual typed errors. hint, when not nil,
// may add advice to the message. The response's length headers are
// dropped since the body changes. An answer without a recognisable
// message passes as it is.
func translateError(res *http.Response, api API, hint func(string) string) io.Reader {
	b, err := io.ReadAll(io.LimitReader(res.Body, maxErrorBody))
	msg := upstreamMessage(b)
	if msg == "" {
		if err != nil {
			return io.MultiReader(bytes.NewReader(b), errReader{err})
		}
		return io.MultiReader(bytes.NewReader(b), res.Body)
	}
	if hint != nil {
		msg = hint(msg)
	}
	out := api.ErrorBody(Error{Status: res.StatusCode, Message: msg})
	res.ContentLength = -1
	res.Header.Del("Content-Length")
	res.Header.Set("Content-Type", "application/json")
	return bytes.NewReader(out)
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
