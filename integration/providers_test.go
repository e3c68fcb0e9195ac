package integration_test

import (
	"encoding/binary"
	"encoding/json"
	"net/http"
	"runtime"
	"strings"
	"testing"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// A legacy /v1/completions stream has an end ([DONE] or a finish_reason)
// like chat: one cut cleanly between two events is incomplete, and the
// client is told so with OpenAI's error event instead of a clean end.
func TestCompletionsStreamCutBetweenEvents(t *testing.T) {
	chunk := func(text string) string {
		return `data: {"id":"cmpl-1","object":"text_completion","choices":[{"text":"` + text + `","index":0,"logprobs":null,"finish_reason":null}],"model":"from-a"}` + "\n\n"
	}
	a := upstream(t, sseScript(chunk("Hello"), chunk(" world")))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, gateChannels, a.URL, b.URL, "")
	body := []byte(`{"model":"m","prompt":"Say hello","stream":true}`)
	s := streamPost(t, nil, "/v1/completions", body, "")
	okStream(t, s)
	if got := s.res.Header.Get("X-Served-By"); got != "a" {
		t.Fatalf("X-Served-By = %q, want a", got)
	}
	fs := frames(s.body)
	if len(fs) != 3 {
		t.Fatalf("want the two chunks and an error event, got %d events:\n%s", len(fs), s.body)
	}
	last := fs[2]
	if !strings.HasPrefix(last, `data: {"error":`) || !strings.Contains(last, "stream_truncated") {
		t.Fatalf("last event is not OpenAI's truncation error: %q", last)
	}
	var ev struct {
		Error struct {
			Message, Type string
			Code          *string
		}
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(last, "data: ")), &ev); err != nil || ev.Error.Type != "server_error" || ev.Error.Code == nil {
		t.Fatalf("error event %q does not decode as OpenAI's error: %v", last, err)
	}
	hits(t, a, 1)
	hits(t, b, 0)
}

// An anthropic channel joins the client's path to its own base URL, sends
// the anthropic-version Anthropic requires when the client sent none, and
// keeps the client's own.
func TestAnthropicProviderRequest(t *testing.T) {
	a := upstream(t, fu.OKNamed("anthropic"))
	gateway(t, `
		channel claude-direct %s/anthropic {
			provider anthropic
			header X-Api-Key sk-ant-channel
		}
		model claude {
			route claude-direct
		}
	`, a.URL)

	s := streamPost(t, nil, "/v1/messages?beta=true", fu.MessagesRequest("claude", true), "", "X-Api-Key", "client-key")
	okStream(t, s)
	got := a.LastRequest()
	if got.Path != "/anthropic/v1/messages" || got.Query != "beta=true" {
		t.Errorf("upstream path %q query %q, want /anthropic/v1/messages beta=true", got.Path, got.Query)
	}
	if v := got.Header.Get("Anthropic-Version"); v != "2023-06-01" {
		t.Errorf("anthropic-version %q, want 2023-06-01 added", v)
	}
	if k := got.Header.Get("X-Api-Key"); k != "sk-ant-channel" {
		t.Errorf("x-api-key %q, want the channel's", k)
	}

	res, _ := post(t, "/v1/messages", fu.MessagesRequest("claude", false), "anthropic-version", "2024-01-01")
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	if v := a.LastRequest().Header.Get("Anthropic-Version"); v != "2024-01-01" {
		t.Errorf("anthropic-version %q, want the client's 2024-01-01", v)
	}
}

// A route to a channel whose provider does not serve the request's API is
// skipped for that request, without counting against the channel; a model
// none of whose channels serves the API gets a 400 in the API's format.
func TestRouteSkippedWhenProviderDoesNotServeAPI(t *testing.T) {
	claude := upstream(t, fu.OKNamed("anthropic"))
	compat := upstream(t, fu.OKNamed("compat"))
	gateway(t, `
		channel claude-direct %s {
			provider anthropic
		}
		channel compat %s
		model m {
			route claude-direct cost 1 1
			route compat cost 2 2
		}
		model claude-only {
			route claude-direct
		}
	`, claude.URL, compat.URL)

	s := streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("m", true), "")
	okStream(t, s)
	if got := s.res.Header.Get("X-Served-By"); got != "compat" {
		t.Fatalf("X-Served-By = %q, want compat", got)
	}
	if got := s.res.Header.Get("X-Attempts"); got != "1" {
		t.Errorf("X-Attempts = %q, want 1: the skipped route is no attempt", got)
	}
	hits(t, claude, 0)

	// The cheaper anthropic channel still serves the Anthropic API.
	res, body := post(t, "/v1/messages", fu.MessagesRequest("m", false), "anthropic-version", "2023-06-01")
	if res.StatusCode != 200 || res.Header.Get("X-Served-By") != "claude-direct" {
		t.Fatalf("messages: status %d served by %q: %s", res.StatusCode, res.Header.Get("X-Served-By"), body)
	}

	res, body = post(t, "/v1/chat/completions", fu.ChatRequest("claude-only", false))
	if res.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d, want 400: %s", res.StatusCode, body)
	}
	msg, typ, _ := openAIError(t, body)
	if typ != "invalid_request_error" || !strings.Contains(msg, `"claude-only"`) || !strings.Contains(msg, "openai_chat") {
		t.Errorf("error %q (%s) does not name the model and the API", msg, typ)
	}
	hits(t, claude, 1)
}

// A Bedrock stream whose frame claims 256 MiB is refused at its prelude:
// the request fails over to the next channel, and the gateway's heap does
// not grow by the frame (the decoder used to buffer it whole, max_held_bytes
// never seeing it: +767 MiB for one request).
func TestBedrockHugeFrameFailsOverWithBoundedMemory(t *testing.T) {
	hostile := upstream(t, fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		w.Header().Set("Content-Type", "application/vnd.amazon.eventstream")
		var prelude [4]byte
		binary.BigEndian.PutUint32(prelude[:], 256<<20)
		_, _ = w.Write(prelude[:])
		zeros := make([]byte, 64<<10)
		for sent := 0; sent < 256<<20 && r.Context().Err() == nil; sent += len(zeros) {
			if _, err := w.Write(zeros); err != nil {
				return
			}
		}
	}))
	backup := upstream(t, fu.OKNamed("backup"))
	gatewayWith(t, failoverOption("max_held_bytes 8MiB"), `
		channel aws %s {
			provider bedrock {
				region us-east-1
				api_key ABSK-test
			}
		}
		channel backup %s
		model claude {
			route aws cost 1 1 upstream_model anthropic.claude-sonnet-4-5-20250929-v1:0
			route backup cost 2 2
		}
		auth off
	`, hostile.URL, backup.URL)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := streamPost(t, nil, "/v1/messages", fu.MessagesRequest("claude", true), "", "anthropic-version", "2023-06-01")
	runtime.ReadMemStats(&after)
	if s.res.StatusCode != 200 || s.res.Header.Get("X-Served-By") != "backup" {
		t.Fatalf("status %d served by %q: %s", s.res.StatusCode, s.res.Header.Get("X-Served-By"), s.body)
	}
	mustContain(t, s.body, "event: message_stop")
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
		t.Fatalf("one request with a 256 MiB frame allocated %d MiB", grew>>20)
	}
	hits(t, hostile, 1)
}
