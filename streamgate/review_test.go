package streamgate_test

import (
	"github.com/llmfailover/caddy-llm-failover/internal/shapes"
	"github.com/llmfailover/caddy-llm-failover/provider"
	. "github.com/llmfailover/caddy-llm-failover/streamgate"
	"strings"
	"testing"
)

// An upstream that sends its in-stream error without the closing blank line
// and then closes: Relay judges the stream ended by that error, so the
// client must be able to see it too. Per the SSE spec a client discards an
// unterminated event at end of stream, so forwarding the bytes as they came
// leaves the client with what looks like a clean end.
func TestRelayUnterminatedErrorAfterCommitReachesClient(t *testing.T) {
	for _, tc := range []struct {
		name    string
		dialect provider.API
		content string
		errEv   string
	}{
		{"openai chat", provider.OpenAIChat, sse(shapes.ChatContent), "data: " + shapes.ChatError + "\n"},
		{"openai chat no LF", provider.OpenAIChat, sse(shapes.ChatContent), "data: " + shapes.ChatError},
		{"openai chat CR", provider.OpenAIChat, sse(shapes.ChatContent), "data: " + shapes.ChatError + "\r"},
		{"anthropic", provider.AnthropicMessages, antEv("content_block_delta", shapes.AntBlockDelta), "event: error\ndata: " + shapes.AntError + "\n"},
		{"responses", provider.OpenAIResponses, antEv("response.output_text.delta", shapes.RespTextDelta), "event: error\ndata: " + shapes.RespError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := newFakeDown()
			res, u := relayWith(t, dst, gate(tc.dialect, Options{}), func(u *upstream) {
				u.send(tc.content)
				u.send(tc.errEv)
				u.close()
			})
			if res.Outcome != UpstreamError || !res.Committed {
				t.Fatalf("res %+v", res)
			}
			_, body := dst.snapshot()
			if !strings.HasPrefix(body, u.sentString()) || res.BytesSent != int64(len(u.sentString())) {
				t.Fatalf("body %q does not start with the upstream bytes", body)
			}
			var kinds []Kind
			var p Parser
			p.Feed([]byte(body), func(ev Event) { kinds = append(kinds, tc.dialect.Classify(ev)) })
			p.Finish(nil) // a client discards an unterminated event
			if len(kinds) == 0 || kinds[len(kinds)-1] != ErrorFrame {
				t.Fatalf("the client never sees the upstream's error; events %v, body %q", kinds, body)
			}
		})
	}
}
