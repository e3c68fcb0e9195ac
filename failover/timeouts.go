package failover

import (
	"time"

	"github.com/llmfailover/caddy-llm-failover/provider"
)

// HeaderTimeoutFor is how long an attempt waits for response headers. A
// streaming request gets the shorter stream_header_timeout: a provider
// that streams sends its headers before it generates anything, so a
// silent one is down, not busy. A non-streaming job (a video, a long
// image) may answer only when done and keeps header_timeout.
func (o Options) HeaderTimeoutFor(streaming bool) time.Duration {
	d := o.HeaderTimeout
	if streaming && o.StreamHeaderTimeout > 0 {
		d = min(d, o.StreamHeaderTimeout)
	}
	return d
}

// streaming reports whether the client asked for a stream.
func streaming(x *exchange) bool {
	return provider.Streaming(x.r.URL.Path, x.req)
}
