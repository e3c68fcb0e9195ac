package integration_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/fakeproviders"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// chatResumeChannels: a plain OpenAI-compatible primary, and a backup
// whose provider continues a final assistant message the way the verb
// says; the request's model is m.
const chatResumeChannels = `
		channel a %s {
		}
		channel b %s {
			provider openai {
				continuation %s
			}
		}
		model m {
			route a cost 1 1
			route b cost 2 2
		}
		stream_resume continue
`

// chatBackup is a continuation served under another identity (id, model,
// created, fingerprint), with its own role chunk, finish, usage and
// [DONE], which the client must never see as such.
func chatBackup(pieces []string) fu.Behavior {
	chunk := func(delta, finish string) string {
		return fmt.Sprintf("data: {\"id\":\"chatcmpl-backup\",\"object\":\"chat.completion.chunk\",\"created\":99,\"model\":\"backup-model\",\"system_fingerprint\":\"fp_backup\",\"choices\":[{\"index\":0,\"delta\":%s,\"logprobs\":null,\"finish_reason\":%s}],\"usage\":null}\n\n", delta, finish)
	}
	steps := []any{chunk(`{"role":"assistant","content":"","refusal":null}`, "null")}
	for _, p := range pieces {
		d, _ := json.Marshal(map[string]string{"content": p})
		steps = append(steps, chunk(string(d), "null"))
	}
	steps = append(steps, chunk(`{}`, `"stop"`),
		"data: {\"id\":\"chatcmpl-backup\",\"object\":\"chat.completion.chunk\",\"created\":99,\"model\":\"backup-model\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":20,\"total_tokens\":29}}\n\n",
		"data: [DONE]\n\n")
	return sseScript(steps...)
}

func chatResumePost(t *testing.T, body []byte) streamed {
	return streamPost(t, nil, "/v1/chat/completions", body, "")
}

// lastMessage is the final message of the request a backup received.
func lastMessage(t *testing.T, body []byte) map[string]any {
	t.Helper()
	var req struct {
		Messages []map[string]any `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil || len(req.Messages) == 0 {
		t.Fatalf("backup request %s: %v", body, err)
	}
	return req.Messages[len(req.Messages)-1]
}

// An OpenAI chat stream cut after 40 of 60 chunks is finished by a
// backup that continues a prefix, as one answer: the exact 60-token
// text, one role chunk, one finish, one usage, one [DONE], the first
// attempt's id and model throughout.
func TestResumeChatCutDeliveredWhole(t *testing.T) {
	pieces := resumePieces()
	a := upstream(t, fu.OKNamed("primary").WithPieces(pieces...).WithCutAfter(40))
	b := upstream(t, chatBackup(pieces[40:]))
	gateway(t, chatResumeChannels, a.URL, b.URL, "prefix")
	resumed := resumes(t, "m", "resumed")
	s := chatResumePost(t, fu.ChatRequest("m", true))
	wantText(t, s, strings.Join(pieces, ""))
	if got := resumes(t, "m", "resumed") - resumed; got != 1 {
		t.Errorf("resumes_total{outcome=resumed} grew by %v, want 1", got)
	}
	t.Logf("resume took %s from the 40th chunk to the first continued one", s.at(`" t40"`)-s.at(`" t39"`))
	for sub, n := range map[string]int{`"role":"assistant"`: 1, "data: [DONE]": 1, `"finish_reason":"stop"`: 1,
		`"usage":{"prompt_tokens":9`: 1, ": llm-failover resumed from a on b (prefill)\n": 1,
		"chatcmpl-backup": 0, "backup-model": 0, "fp_backup": 0, `"created":99`: 0, `"error"`: 0} {
		if got := count(s.body, sub); got != n {
			t.Errorf("%d × %q, want %d:\n%s", got, sub, n, s.body)
		}
	}
	for _, f := range frames(s.body) {
		if strings.HasPrefix(f, "data: {") && (!strings.Contains(f, `"id":"chatcmpl-fault1"`) || !strings.Contains(f, `"model":"m"`)) {
			t.Fatalf("a chunk not under the first attempt's id and model: %s", f)
		}
	}
	if fs := frames(s.body); fs[len(fs)-1] != "data: [DONE]" {
		t.Fatalf("does not end with [DONE]:\n%s", s.body)
	}
	// DeepSeek and Mistral document the prefix as "prefix": true on the
	// final assistant message.
	last := lastMessage(t, b.LastRequest().Body)
	if last["role"] != "assistant" || last["content"] != strings.Join(pieces[:40], "") || last["prefix"] != true {
		t.Fatalf("backup's final message %v", last)
	}
	hits(t, a, 1)
	hits(t, b, 1)
}

// vLLM continues with continue_final_message and no generation prompt.
func TestResumeChatContinueFinalMessage(t *testing.T) {
	pieces := resumePieces()
	a := upstream(t, fu.OKNamed("primary").WithPieces(pieces...).WithCutAfter(40))
	b := upstream(t, chatBackup(pieces[40:]))
	gateway(t, chatResumeChannels, a.URL, b.URL, "continue_final_message")
	wantText(t, chatResumePost(t, fu.ChatRequest("m", true)), strings.Join(pieces, ""))
	var req map[string]any
	if err := json.Unmarshal(b.LastRequest().Body, &req); err != nil || req["continue_final_message"] != true || req["add_generation_prompt"] != false {
		t.Fatalf("backup request %s: %v", b.LastRequest().Body, err)
	}
	if last := lastMessage(t, b.LastRequest().Body); last["prefix"] != nil || last["content"] != strings.Join(pieces[:40], "") {
		t.Fatalf("backup's final message %v", last)
	}
}

// endsWithError checks a stream that was not resumed: the text the
// primary delivered, then its error event, and the backup never asked.
func endsWithError(t *testing.T, s streamed, b *fu.Server) {
	t.Helper()
	okStream(t, s)
	fs := frames(s.body)
	if last := fs[len(fs)-1]; !strings.Contains(last, "error") {
		t.Fatalf("last event is not an error: %q\n%s", last, s.body)
	}
	mustNotContain(t, s.body, "llm-failover resumed")
	hits(t, b, 0)
}

// Streams a join could corrupt are not resumed: tool calls, JSON
// output; nor is a chat stream whose backups may not continue.
func TestResumeChatNotResumed(t *testing.T) {
	pieces := resumePieces()
	t.Run("tool call", func(t *testing.T) {
		a := upstream(t, sseScript(
			"data: {\"id\":\"c1\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null},\"finish_reason\":null}]}\n\n",
			"data: {\"id\":\"c1\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}\n\n",
			"data: {\"id\":\"c1\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"a\\\"\"}}]},\"finish_reason\":null}]}\n\n"))
		b := upstream(t, chatBackup(pieces[40:]))
		gateway(t, chatResumeChannels, a.URL, b.URL, "prefix")
		endsWithError(t, chatResumePost(t, fu.ChatRequest("m", true)), b)
	})
	t.Run("json output", func(t *testing.T) {
		a := upstream(t, fu.OKNamed("primary").WithPieces(pieces...).WithCutAfter(40))
		b := upstream(t, chatBackup(pieces[40:]))
		gateway(t, chatResumeChannels, a.URL, b.URL, "prefix")
		body := `{"model":"m","stream":true,"response_format":{"type":"json_object"},"messages":[{"role":"user","content":"Say hello in JSON."}]}`
		endsWithError(t, chatResumePost(t, []byte(body)), b)
	})
	t.Run("continuation off", func(t *testing.T) {
		a := upstream(t, fu.OKNamed("primary").WithPieces(pieces...).WithCutAfter(40))
		b := upstream(t, chatBackup(pieces[40:]))
		pluginLog, _ := loggedGateway(t, chatResumeChannels, a.URL, b.URL, "off")
		endsWithError(t, chatResumePost(t, fu.ChatRequest("m", true)), b)
		// Every refusal is logged, this one too.
		eventually(t, 5*time.Second, "the log line saying why", func() bool {
			log, _ := os.ReadFile(pluginLog)
			return bytes.Contains(log, []byte(`"msg":"broken stream not resumed"`)) &&
				bytes.Contains(log, []byte("no channel after it can continue"))
		})
	})
}

// A Responses stream has no prefill: it ends with its error event, and
// the log says why it was not resumed.
func TestResumeResponsesNotResumed(t *testing.T) {
	pieces := resumePieces()
	a := upstream(t, fu.OKNamed("primary").WithPieces(pieces...).WithCutAfter(40))
	b := upstream(t, fu.OKNamed("backup"))
	pluginLog, _ := loggedGateway(t, chatResumeChannels, a.URL, b.URL, "prefix")
	s := streamPost(t, nil, "/v1/responses", fu.ResponsesRequest("m", true), "")
	endsWithError(t, s, b)
	if got := fu.StreamText(mustSSE(t, s.body)); got != strings.Join(pieces[:40], "") {
		t.Fatalf("text %q", got)
	}
	eventually(t, 5*time.Second, "the log line saying why", func() bool {
		log, _ := os.ReadFile(pluginLog)
		return bytes.Contains(log, []byte(`"msg":"broken stream not resumed"`)) &&
			bytes.Contains(log, []byte("the Responses API has no assistant prefill"))
	})
}

// A Messages stream cut on Anthropic is continued on Claude on Vertex, or,
// when Vertex refuses, on Bedrock (whose event stream is decoded before
// the splice); the fakes check their own auth, the model in the URL and
// anthropic_version in the body, and refuse a prefill ending in white
// space as Anthropic does (startClaudeChain fails the test on any
// refusal).
func TestResumeOnVertexAndBedrock(t *testing.T) {
	pieces := resumePieces()
	for _, tt := range []struct {
		name, text string
		vertexDown bool
	}{{"vertex", "Hello from vertex", false}, {"bedrock", "Hello from bedrock", true}} {
		t.Run(tt.name, func(t *testing.T) {
			f := startClaudeChain(t, fu.OKNamed("primary").WithPieces(pieces...).WithCutAfter(40), time.Hour, "stream_resume continue")
			if tt.vertexDown {
				f.vertex.SetMode(fakeproviders.RateLimited)
			}
			s := streamPost(t, nil, "/v1/messages", resumeRequest("claude-sonnet-4-5"), "", "anthropic-version", "2023-06-01")
			wantText(t, s, strings.Join(pieces[:40], "")+tt.text)
			for sub, n := range map[string]int{"event: message_start": 1, "event: content_block_start": 1, "event: message_stop": 1, "event: error": 0} {
				if got := count(s.body, sub); got != n {
					t.Errorf("%d × %q, want %d:\n%s", got, sub, n, s.body)
				}
			}
			got := f.vertex.LastBody()
			if tt.vertexDown {
				got = f.bedrock.LastBody()
			}
			if last := lastMessage(t, got); last["role"] != "assistant" || last["content"] != strings.Join(pieces[:40], "") {
				t.Fatalf("%s got no prefill: %v", tt.name, last)
			}
		})
	}
}

// A backup that refuses the prefix with a 400 leaves the chat client with
// the original failure's error event, never the 400, and no [DONE].
func TestResumeChatPrefixRejectedKeepsOriginalError(t *testing.T) {
	pieces := resumePieces()
	a := upstream(t, fu.OKNamed("primary").WithPieces(pieces...).WithCutAfter(40))
	b := upstream(t, fu.Status(400, fu.OpenAIErrorBody("prefix is not supported", "invalid_request_error", "")))
	gateway(t, chatResumeChannels, a.URL, b.URL, "prefix")
	s := chatResumePost(t, fu.ChatRequest("m", true))
	okStream(t, s)
	if got := fu.StreamText(mustSSE(t, s.body)); got != strings.Join(pieces[:40], "") {
		t.Fatalf("text %q", got)
	}
	fs := frames(s.body)
	if last := fs[len(fs)-1]; !strings.HasPrefix(last, `data: {"error"`) || !strings.Contains(last, "incomplete") {
		t.Fatalf("last event is not the original truncation error: %q\n%s", last, s.body)
	}
	mustNotContain(t, s.body, "prefix is not supported", "[DONE]", "llm-failover resumed")
	hits(t, b, 1)
}

// A chat stream that stalls after 20 chunks is resumed once
// stream_idle_timeout passes.
func TestResumeChatStalledStream(t *testing.T) {
	pieces := resumePieces()
	steps := []any{"data: {\"id\":\"chatcmpl-stall\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n"}
	for _, p := range pieces[:20] {
		steps = append(steps, fmt.Sprintf("data: {\"id\":\"chatcmpl-stall\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":null}]}\n\n", p))
	}
	a := upstream(t, sseScript(append(steps, 10*time.Second)...))
	b := upstream(t, chatBackup(pieces[20:]))
	gateway(t, chatResumeChannels+"\nstream_idle_timeout 300ms", a.URL, b.URL, "prefix")
	s := chatResumePost(t, fu.ChatRequest("m", true))
	wantText(t, s, strings.Join(pieces, ""))
	if s.endAt < 250*time.Millisecond || s.endAt > 5*time.Second {
		t.Fatalf("ended after %s; the idle timeout is 300ms", s.endAt)
	}
	mustNotContain(t, s.body, "chatcmpl-backup")
	mustContain(t, s.body, ": llm-failover resumed from a on b", `"id":"chatcmpl-stall"`)
}
