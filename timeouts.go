package llmfailover

import (
	"strings"
	"time"
)

// DefaultStreamHeaderTimeout bounds the response headers of a streaming
// request: every real provider sends them at once.
const DefaultStreamHeaderTimeout = 30 * time.Second

// headerTimeout is how long an attempt of x waits for response headers.
// A streaming request gets the shorter stream_header_timeout: a provider
// that streams sends its headers before it generates anything, so a
// silent one is down, not busy. A non-streaming job (a video, a long
// image) may answer only when done and keeps header_timeout.
func (h *Handler) headerTimeout(x *exchange) time.Duration {
	d := time.Duration(h.HeaderTimeout)
	if streaming(x) && h.StreamHeaderTimeout > 0 {
		d = min(d, time.Duration(h.StreamHeaderTimeout))
	}
	return d
}

// streaming reports whether the client asked for a stream: with
// "stream": true in the body (OpenAI, Anthropic, Bedrock through the
// Anthropic path), or with a streaming method in the path (Gemini's
// :streamGenerateContent, Vertex's :streamRawPredict).
func streaming(x *exchange) bool {
	return x.req.Stream || strings.Contains(x.r.URL.Path, ":stream")
}
