package provider

import (
	"net/http"
	"strings"
)

// Headers cross the gateway by allowlist, both ways: only what an LLM API
// needs reaches an upstream, and only what a client needs comes back. The
// client's credentials, cookies, forwarding headers and anything unknown
// stay at the gateway; the upstream account's cookies, HSTS and CORS
// policies, Alt-Svc, organization and project identifiers and rate-limit
// state never reach a client. Accept-Encoding is not forwarded either, so
// that the transport negotiates and decodes compression itself and the
// stream gate reads plain text.

// requestHeaders are the client headers every API forwards.
var requestHeaders = map[string]bool{
	"Content-Type": true, "Accept": true, "Idempotency-Key": true,
}

// apiRequestHeaders are the client headers forwarded for one family of
// APIs only: Anthropic's version and beta flags, OpenAI's beta flags.
var (
	anthropicRequestHeaders = map[string]bool{"Anthropic-Version": true, "Anthropic-Beta": true}
	openAIRequestHeaders    = map[string]bool{"Openai-Beta": true}
)

// responseHeaders are the answer headers a client sees: how to read the
// body, the ids a client quotes to support, the processing times, and
// Retry-After and the SDKs' retry hint on the error answers passed back.
var responseHeaders = map[string]bool{
	"Content-Type": true, "Content-Encoding": true, "Cache-Control": true,
	"X-Request-Id": true, "Request-Id": true,
	"Openai-Processing-Ms": true, "Openai-Version": true, "X-Envoy-Upstream-Service-Time": true,
	"Retry-After": true, "Retry-After-Ms": true, "X-Should-Retry": true,
}

// rateLimitPrefixes name the upstream account's rate-limit headers, passed
// only when the operator asks (Extras.RateLimit): they describe the
// operator's account, not the client's.
var rateLimitPrefixes = []string{"X-Ratelimit-", "Anthropic-Ratelimit-"}

// Extras are the headers an operator lets through besides the allowlists,
// per channel.
type Extras struct {
	// Request names more client headers to forward.
	Request []string
	// Response names more answer headers to pass back.
	Response []string
	// RateLimit passes back the upstream's rate-limit headers.
	RateLimit bool
}

// CopyResponse copies the extra answer headers e names from src to dst.
func (e *Extras) CopyResponse(dst, src http.Header) {
	if e == nil {
		return
	}
	for _, k := range e.Response {
		if v, ok := src[http.CanonicalHeaderKey(k)]; ok {
			dst[http.CanonicalHeaderKey(k)] = v
		}
	}
	if !e.RateLimit {
		return
	}
	for k, v := range src {
		for _, p := range rateLimitPrefixes {
			if strings.HasPrefix(k, p) {
				dst[k] = v
			}
		}
	}
}

// forwarded reports whether the client header k (canonical) goes to an
// upstream for api.
func forwarded(api API, k string, extra []string) bool {
	switch {
	case requestHeaders[k]:
		return true
	case api.Anthropic():
		if anthropicRequestHeaders[k] {
			return true
		}
	case openAIRequestHeaders[k]:
		return true
	}
	for _, e := range extra {
		if http.CanonicalHeaderKey(e) == k {
			return true
		}
	}
	return false
}

// requestHeader returns the client headers an upstream may see for api,
// the operator's extras included, with the channel's own headers set on
// top.
func requestHeader(api API, client, channel http.Header, extra []string) http.Header {
	hdr := make(http.Header, len(channel)+4)
	for k, v := range client {
		if forwarded(api, k, extra) {
			hdr[k] = v
		}
	}
	// Keep Go from sending its own User-Agent: the gateway is nobody's
	// client software.
	hdr["User-Agent"] = []string{""}
	for k, v := range channel {
		hdr[k] = v
	}
	return hdr
}

// copyResponseHeader copies the allowlisted headers of an upstream's
// answer.
func copyResponseHeader(dst, src http.Header) {
	for k, v := range src {
		if responseHeaders[k] {
			dst[k] = v
		}
	}
}

func isEventStream(h http.Header) bool {
	return strings.HasPrefix(strings.ToLower(strings.TrimSpace(h.Get("Content-Type"))), "text/event-stream")
}

func isJSON(h http.Header) bool {
	return strings.Contains(strings.ToLower(h.Get("Content-Type")), "json")
}

// lineStreamTypes are streaming JSON formats: one JSON document per line
// (or record), sent as they come, never a single document to read whole.
var lineStreamTypes = []string{
	"application/x-ndjson", "application/ndjson", "application/jsonl", "application/x-jsonlines",
	"application/stream+json", "application/json-seq",
}

func isLineStream(h http.Header) bool {
	ct := strings.ToLower(strings.TrimSpace(h.Get("Content-Type")))
	for _, t := range lineStreamTypes {
		if strings.HasPrefix(ct, t) {
			return true
		}
	}
	return false
}

// LineStreamer is implemented by adapters whose answers may be streams of
// JSON documents (NDJSON and its kin), relayed as they arrive.
type LineStreamer interface {
	IsLineStream(h http.Header) bool
}

// IsLineStream reports whether a's answer with header h is a stream of
// JSON documents.
func IsLineStream(a Adapter, h http.Header) bool {
	ls, ok := a.(LineStreamer)
	return ok && ls.IsLineStream(h)
}
