package provider

import (
	"errors"
	"net/url"
	"strings"
)

// servedSuffixes are the client paths the adapters serve, after any
// prefix (/openai, /api) in front of them.
var servedSuffixes = [NumAPIs]string{
	OpenAIChat:           "/v1/chat/completions",
	OpenAIResponses:      "/v1/responses",
	OpenAICompletions:    "/v1/completions",
	OpenAIEmbeddings:     "/v1/embeddings",
	OpenAIModels:         "/v1/models",
	AnthropicMessages:    "/v1/messages",
	AnthropicCountTokens: "/v1/messages/count_tokens",
}

// Served reports whether p is one of the LLM endpoints the adapters
// serve. Every other path is not sent to any upstream with the operator's
// credentials unless the operator forwards it explicitly:
// /v1/fine_tuning/jobs or /v1/files/x/completions are not served.
func Served(p string) bool {
	api := APIFromPath(p)
	return api != Unknown && strings.HasSuffix(strings.TrimSuffix(p, "/"), servedSuffixes[api])
}

// ErrUnsafePath is returned by CheckPath.
var ErrUnsafePath = errors.New("the request path has dot segments or encoded separators")

// CheckPath refuses a request path that could climb out of a channel's
// base path on an upstream that normalises paths: dot segments, written
// plainly or percent-encoded, and encoded slashes and backslashes, which
// some servers decode into separators. escaped is the path as the client
// wrote it (url.URL.EscapedPath).
func CheckPath(escaped string) error {
	lower := strings.ToLower(escaped)
	if strings.Contains(lower, "%2f") || strings.Contains(lower, "%5c") || strings.Contains(escaped, "\\") {
		return ErrUnsafePath
	}
	for seg := range strings.SplitSeq(escaped, "/") {
		dec, err := url.PathUnescape(seg)
		if err != nil {
			return ErrUnsafePath
		}
		if dec == "." || dec == ".." {
			return ErrUnsafePath
		}
	}
	return nil
}

// Streaming reports whether a client asked for a stream: with
// "stream": true in the body (OpenAI, Anthropic, Bedrock through the
// Anthropic path), or with a streaming method in the path (Gemini's
// :streamGenerateContent, Vertex's :streamRawPredict).
func Streaming(path string, req Request) bool {
	return req.Stream || strings.Contains(path, ":stream")
}
