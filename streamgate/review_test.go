package streamgate

import (
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
		dialect Dialect
		content string
		errEv   string
	}{
		{"openai chat", OpenAIChat, sse(chatContent), "data: " + chatError + "\n"},
		{"openai chat no LF", OpenAIChat, sse(chatContent), "data: " + chatError},
		{"openai chat CR", OpenAIChat, sse(chatContent), "data: " + chatError + "\r"},
		{"anthropic", AnthropicMessages, antEv("content_block_delta", antBlockDelta), "event: error\ndata: " + antError + "\n"},
		{"responses", OpenAIResponses, antEv("response.output_text.delta", respTextDelta), "event: error\ndata: " + respError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := newFakeDown()
			res, u := relayWith(t, dst, Options{Dialect: tc.dialect}, func(u *upstream) {
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
			p.Feed([]byte(body), func(ev Event) { kinds = append(kinds, Classify(tc.dialect, ev)) })
			p.Finish(nil) // a client discards an unterminated event
			if len(kinds) == 0 || kinds[len(kinds)-1] != ErrorFrame {
				t.Fatalf("the client never sees the upstream's error; events %v, body %q", kinds, body)
			}
		})
	}
}
