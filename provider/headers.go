package provider

import (
	"net/http"
	"strings"
)

// droppedRequestHeaders never reach an upstream: hop-by-hop headers, the
// client's credentials (each channel brings its own), headers that would
// tell an upstream about the client, and Accept-Encoding, so that the
// transport negotiates and decodes compression itself and the stream gate
// reads plain text.
var droppedRequestHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Authorization": true, "Proxy-Authorization": true, "X-Api-Key": true, "Api-Key": true,
	"Cookie": true, "Openai-Organization": true, "Openai-Project": true,
	"Forwarded": true, "X-Forwarded-For": true, "X-Forwarded-Host": true, "X-Forwarded-Proto": true, "X-Real-Ip": true,
	"Accept-Encoding": true, "Content-Length": true,
}

// hopResponseHeaders are the hop-by-hop headers of an upstream's answer,
// and Content-Length, which the gateway sets itself.
var hopResponseHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length"}

// requestHeader returns the client's headers an upstream may see, with the
// channel's own headers set on top.
func requestHeader(client, channel http.Header) http.Header {
	hdr := make(http.Header, len(client)+len(channel))
	for k, v := range client {
		if !droppedRequestHeaders[k] {
			hdr[k] = v
		}
	}
	deleteConnectionTokens(hdr, client)
	if _, ok := hdr["User-Agent"]; !ok {
		// Keep Go from sending its own User-Agent for a client that sent none.
		hdr["User-Agent"] = []string{""}
	}
	for k, v := range channel {
		hdr[k] = v
	}
	return hdr
}

// copyResponseHeader copies an upstream's answer headers but its hop-by-hop
// ones.
func copyResponseHeader(dst, src http.Header) {
	for k, v := range src {
		dst[k] = v
	}
	deleteConnectionTokens(dst, src)
	for _, k := range hopResponseHeaders {
		delete(dst, k)
	}
}

// deleteConnectionTokens deletes from dst the headers src's Connection
// header names as hop-by-hop.
func deleteConnectionTokens(dst, src http.Header) {
	for _, c := range src["Connection"] {
		for _, f := range strings.Split(c, ",") {
			dst.Del(strings.TrimSpace(f))
		}
	}
}

func isEventStream(h http.Header) bool {
	return strings.HasPrefix(strings.ToLower(strings.TrimSpace(h.Get("Content-Type"))), "text/event-stream")
}

func isJSON(h http.Header) bool {
	return strings.Contains(strings.ToLower(h.Get("Content-Type")), "json")
}
