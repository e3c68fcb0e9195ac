package integration_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// twoChannels is the config most tests use: model m served by a (cheap)
// then b, plus an Anthropic-path model.
const twoChannels = `
		channel a %s {
			header Authorization "Bearer upstream-key-a"
		}
		channel b %s {
			header Authorization "Bearer upstream-key-b"
		}
		model m {
			route a cost 1 1
			route b cost 2 2 upstream_model m-2024
		}
		model claude {
			route a cost 1 1
			route b cost 2 2
		}
		%s
`

func TestFailoverOn503AfterDelay(t *testing.T) {
	a := upstream(t, fu.Status(503, "").After(100*time.Millisecond))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, twoChannels, a.URL, b.URL, "")

	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false),
		"Authorization", "Bearer client-secret", "X-Api-Key", "client-secret-2", "Api-Key", "client-secret-3")
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	mustContain(t, body, "Hello from backup")
	hits(t, a, 1)
	hits(t, b, 1)
	if got := res.Header.Get("X-Served-By"); got != "b" {
		t.Errorf("X-Served-By = %q, want b", got)
	}
	if got := res.Header.Get("X-Attempts"); got != "2" {
		t.Errorf("X-Attempts = %q, want 2", got)
	}
	// Credentials: the channel's replace the client's, which never cross.
	last := b.LastRequest()
	if got := last.Header.Get("Authorization"); got != "Bearer upstream-key-b" {
		t.Errorf("upstream Authorization = %q", got)
	}
	for _, h := range []string{"X-Api-Key", "Api-Key"} {
		if v := last.Header.Get(h); v != "" {
			t.Errorf("client %s reached the upstream: %q", h, v)
		}
	}
	mustNotContain(t, body, "upstream-key")
	// upstream_model renames the model for that channel only.
	var sent struct{ Model string }
	_ = json.Unmarshal(last.Body, &sent)
	if sent.Model != "m-2024" {
		t.Errorf("backup was sent model %q, want m-2024", sent.Model)
	}
	_ = json.Unmarshal(a.LastRequest().Body, &sent)
	if sent.Model != "m" {
		t.Errorf("primary was sent model %q, want m", sent.Model)
	}
	if a.LastRequest().Path != "/v1/chat/completions" {
		t.Errorf("upstream path = %q", a.LastRequest().Path)
	}
}

func Test429WithRetryAfterMovesOnWithoutSleeping(t *testing.T) {
	a := upstream(t, fu.Status(429, "").WithHeader("Retry-After", "30"))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, twoChannels, a.URL, b.URL, "")

	start := time.Now()
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("took %s: the gateway slept on Retry-After", el)
	}
	hits(t, a, 1)
	hits(t, b, 1)
}

func TestClientErrorsGoStraightBack(t *testing.T) {
	for _, code := range []int{400, 401, 403, 404, 413, 422} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			upBody := fu.OpenAIErrorBody("bad thing", "invalid_request_error", "bad")
			a := upstream(t, fu.Status(code, upBody))
			b := upstream(t, fu.OKNamed("backup"))
			gateway(t, twoChannels, a.URL, b.URL, "")
			res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
			if res.StatusCode != code {
				t.Fatalf("status %d, want %d: %s", res.StatusCode, code, body)
			}
			if string(body) != upBody {
				t.Fatalf("body changed:\n got %s\nwant %s", body, upBody)
			}
			hits(t, a, 1)
			hits(t, b, 0)
		})
	}
}

func TestNetworkFailuresFailOver(t *testing.T) {
	cases := map[string]fu.Behavior{
		"reset before headers": fu.Reset(),
		"close before headers": fu.CloseNoResponse(),
		"200 with error body":  fu.JSONErrorWith200(),
		"truncated body":       fu.TruncatedJSON(),
	}
	for name, bad := range cases {
		t.Run(name, func(t *testing.T) {
			a := upstream(t, bad)
			b := upstream(t, fu.OKNamed("backup"))
			gateway(t, twoChannels, a.URL, b.URL, "")
			res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
			if res.StatusCode != 200 {
				t.Fatalf("status %d: %s", res.StatusCode, body)
			}
			mustContain(t, body, "Hello from backup")
			hits(t, a, 1)
		})
	}
	t.Run("dial refused", func(t *testing.T) {
		b := upstream(t, fu.OKNamed("backup"))
		gateway(t, twoChannels, "http://127.0.0.1:1", b.URL, "")
		res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
		if res.StatusCode != 200 {
			t.Fatalf("status %d: %s", res.StatusCode, body)
		}
		mustContain(t, body, "Hello from backup")
	})
}

func TestHeaderTimeoutFailsOver(t *testing.T) {
	a := upstream(t, fu.NoHeaders())
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, twoChannels, a.URL, b.URL, "header_timeout 300ms")
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	mustContain(t, body, "Hello from backup")
	// The silent upstream's request was cancelled, not left hanging.
	eventually(t, 5*time.Second, "the hung upstream request to end", func() bool { return a.InFlight() == 0 })
}

func TestSlowHeadersWithinTimeoutAreServed(t *testing.T) {
	a := upstream(t, fu.SlowHeaders(300*time.Millisecond, fu.OKNamed("primary")))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, twoChannels, a.URL, b.URL, "header_timeout 5s")
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	mustContain(t, body, "Hello from primary")
	hits(t, b, 0)
}

func TestDeadlineIsSplitIntoCandidateBudgets(t *testing.T) {
	a := upstream(t, fu.NoHeaders())
	b := upstream(t, fu.NoHeaders())
	c := upstream(t, fu.OKNamed("third"))
	gateway(t, `
		channel a %s
		channel b %s
		channel c %s
		model m {
			route a cost 1 1
			route b cost 2 2
			route c cost 3 3
		}
		deadline 1500ms
	`, a.URL, b.URL, c.URL)
	start := time.Now()
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
	took := time.Since(start)
	if res.StatusCode != 200 {
		t.Fatalf("status %d after %s: %s", res.StatusCode, took, body)
	}
	// Each silent channel got a third of what was left, so the third
	// channel still had time to answer within the deadline.
	mustContain(t, body, "Hello from third")
	if took > 3*time.Second {
		t.Fatalf("took %s", took)
	}
}

func TestAllChannelsFail(t *testing.T) {
	a := upstream(t, fu.Status(503, fu.OpenAIErrorBody("upstream a is down", "server_error", "")))
	b := upstream(t, fu.Status(503, fu.OpenAIErrorBody("upstream b is down", "server_error", "")).WithHeader("Retry-After", "7"))
	gateway(t, twoChannels, a.URL, b.URL, "")

	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
	if res.StatusCode != 503 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	msg, typ, _ := openAIError(t, body)
	if !strings.Contains(msg, `"m"`) || !strings.Contains(msg, "2 channel") || !strings.Contains(msg, "upstream b is down") {
		t.Errorf("message does not name the model, the channel count and the last error: %q", msg)
	}
	if typ != "server_error" {
		t.Errorf("type %q", typ)
	}
	if got := res.Header.Get("Retry-After"); got != "7" {
		t.Errorf("Retry-After = %q, want 7", got)
	}
	// The chain was walked: the SDKs must not walk it again on top.
	if got := res.Header.Get("X-Should-Retry"); got != "false" {
		t.Errorf("X-Should-Retry = %q, want false", got)
	}

	res, body = post(t, "/v1/messages", fu.MessagesRequest("claude", false), "anthropic-version", "2023-06-01")
	if res.StatusCode != 503 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	if _, typ := anthropicError(t, body); typ != "overloaded_error" {
		t.Errorf("anthropic error type %q", typ)
	}
}

func TestAllTimeoutsGive504(t *testing.T) {
	a := upstream(t, fu.NoHeaders())
	b := upstream(t, fu.NoHeaders())
	gateway(t, twoChannels, a.URL, b.URL, "header_timeout 200ms")
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
	if res.StatusCode != 504 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
}

func TestBadInput(t *testing.T) {
	a := upstream(t, fu.OK())
	b := upstream(t, fu.OK())
	gateway(t, twoChannels, a.URL, b.URL, "max_request_body 1KiB")

	cases := []struct {
		name, path string
		body       string
		status     int
		code       string
	}{
		{"malformed json", "/v1/chat/completions", `{"model":`, 400, ""},
		{"no model", "/v1/chat/completions", `{"messages":[]}`, 400, ""},
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-nope","messages":[]}`, 404, "model_not_found"},
		{"too large", "/v1/chat/completions", `{"model":"m","x":"` + strings.Repeat("a", 2000) + `"}`, 413, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, body := post(t, c.path, []byte(c.body))
			if res.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", res.StatusCode, c.status, body)
			}
			_, _, code := openAIError(t, body)
			if c.code != "" && code != c.code {
				t.Errorf("code %q, want %q", code, c.code)
			}
			// The Anthropic path answers in Anthropic's format.
			res, body = post(t, "/v1/messages", []byte(c.body))
			if res.StatusCode != c.status {
				t.Fatalf("anthropic: status %d, want %d: %s", res.StatusCode, c.status, body)
			}
			anthropicError(t, body)
		})
	}
	hits(t, a, 0)
	hits(t, b, 0)
}

func TestListModels(t *testing.T) {
	a := upstream(t, fu.OK())
	gateway(t, twoChannels, a.URL, a.URL+"/b", "")
	res, err := http.Get(gatewayURL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var list struct {
		Object string
		Data   []struct{ ID, Object string }
	}
	if err := json.NewDecoder(res.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	if list.Object != "list" || len(list.Data) != 2 || list.Data[0].ID != "m" || list.Data[1].ID != "claude" {
		t.Fatalf("models: %+v", list)
	}
	hits(t, a, 0)
}

func TestClientGoneCancelsUpstream(t *testing.T) {
	a := upstream(t, fu.NoHeaders())
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, twoChannels, a.URL, b.URL, "")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gatewayURL+"/v1/chat/completions", strings.NewReader(string(fu.ChatRequest("m", false))))
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Fatal("expected the client's timeout")
	}
	eventually(t, 5*time.Second, "the upstream request to be cancelled", func() bool { return a.InFlight() == 0 && a.Hits() == 1 })
	// The loop stopped: the backup was never tried for a client that left.
	time.Sleep(100 * time.Millisecond)
	hits(t, b, 0)
}

func TestStreamingPassesThrough(t *testing.T) {
	a := upstream(t, fu.Status(502, ""))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, twoChannels, a.URL, b.URL, "")
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", true))
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d %s: %s", res.StatusCode, res.Header.Get("Content-Type"), body)
	}
	mustContain(t, body, "backup", "data: [DONE]")
}

// Local failure details (dial errors, addresses) go to logs, not clients.
func TestNetworkErrorsDoNotLeakAddresses(t *testing.T) {
	gateway(t, twoChannels, "http://127.0.0.1:1", "http://127.0.0.1:2", "")
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("m", false))
	if res.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	msg, _, _ := openAIError(t, body)
	if !strings.Contains(msg, "dial_error") {
		t.Errorf("message does not give the reason: %q", msg)
	}
	mustNotContain(t, body, "127.0.0.1", "dial tcp")
}

// Every API the issue names fails over, streaming and not.
func TestEveryAPIFailsOver(t *testing.T) {
	a := upstream(t, fu.Status(503, ""))
	b := upstream(t, fu.OKNamed("backup"))
	gateway(t, twoChannels, a.URL, b.URL, "")
	cases := []struct {
		name, path string
		body       []byte
		want       string
	}{
		{"chat", "/v1/chat/completions", fu.ChatRequest("m", false), `"object":"chat.completion"`},
		{"chat stream", "/v1/chat/completions", fu.ChatRequest("m", true), "data: [DONE]"},
		{"responses", "/v1/responses", fu.ResponsesRequest("m", false), `"object":"response"`},
		{"responses stream", "/v1/responses", fu.ResponsesRequest("m", true), "event: response.completed"},
		{"embeddings", "/v1/embeddings", fu.EmbeddingsRequest("m", "hello"), `"object":"embedding"`},
		{"messages", "/v1/messages", fu.MessagesRequest("claude", false), `"type":"message"`},
		{"messages stream", "/v1/messages", fu.MessagesRequest("claude", true), "event: message_stop"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := b.Hits()
			res, body := post(t, c.path, c.body)
			if res.StatusCode != 200 || res.Header.Get("X-Served-By") != "b" {
				t.Fatalf("status %d served by %q: %s", res.StatusCode, res.Header.Get("X-Served-By"), body)
			}
			mustContain(t, body, c.want)
			if b.Hits() != before+1 {
				t.Fatalf("backup hits %d, want %d", b.Hits(), before+1)
			}
			if got := b.LastRequest().Path; got != c.path {
				t.Fatalf("upstream path %q", got)
			}
		})
	}
}

// Each models list names the models a client of its API can use: the
// Anthropic list (anthropic-version sent) leaves out a model only
// OpenAI-style channels serve (Gemini here; a generic OpenAI-compatible
// channel passes every API through, so its models are in both), and the
// OpenAI list one only an Anthropic channel serves.
func TestListModelsPerAPI(t *testing.T) {
	a := upstream(t, fu.OK())
	gateway(t, `
		channel oai %s {
			provider gemini {
				api_key gm-key
			}
		}
		channel ant %s {
			provider anthropic
		}
		model gpt-only {
			route oai
		}
		model claude-only {
			route ant
		}
	`, a.URL, a.URL)
	list := func(hdr ...string) []string {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, gatewayURL+"/v1/models", nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var l struct{ Data []struct{ ID string } }
		if err := json.NewDecoder(res.Body).Decode(&l); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range l.Data {
			ids = append(ids, m.ID)
		}
		return ids
	}
	if got := list(); strings.Join(got, ",") != "gpt-only" {
		t.Errorf("OpenAI list %v, want [gpt-only]", got)
	}
	if got := list("Anthropic-Version", "2023-06-01"); strings.Join(got, ",") != "claude-only" {
		t.Errorf("Anthropic list %v, want [claude-only]", got)
	}
}
