package integration_test

import (
	"bytes"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/fakeproviders"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// claudeChain is one Claude model on Anthropic, Vertex and Bedrock (see
// fakeproviders.ClaudeChain).
const claudeChain = fakeproviders.ClaudeChain

type claudeFakes struct {
	anthropic *fu.Server
	vertex    *fakeproviders.Vertex
	bedrock   *fakeproviders.Bedrock
}

// startClaudeChain starts the fakes and loads claudeChain, with the
// handler options in extra after it.
func startClaudeChain(t *testing.T, anthropic fu.Behavior, tokenTTL time.Duration, extra ...string) claudeFakes {
	t.Helper()
	f := claudeFakes{
		anthropic: upstream(t, anthropic),
		vertex:    fakeproviders.NewVertex("proj-1", "us-east5", tokenTTL),
		bedrock:   fakeproviders.NewBedrock("us-east-1", "AKIAFAKE", "fake-secret"),
	}
	t.Cleanup(f.vertex.Close)
	t.Cleanup(f.bedrock.Close)
	sa, err := f.vertex.WriteServiceAccount(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	gateway(t, claudeChain+strings.Join(extra, "\n"), f.anthropic.URL, f.vertex.URL, sa, f.bedrock.URL)
	t.Cleanup(func() {
		for _, p := range append(f.vertex.Problems(), f.bedrock.Problems()...) {
			t.Errorf("fake provider refused a request: %s", p)
		}
	})
	return f
}

// The chain Anthropic → Vertex → Bedrock for one Claude model: each
// channel's failure mode fails over to the next, and the client sees one
// clean Anthropic stream naming the model it asked for.
func TestClaudeAcrossAnthropicVertexBedrock(t *testing.T) {
	f := startClaudeChain(t, fu.Status(529, fu.AnthropicErrorBody("overloaded_error", "Overloaded")), time.Hour)
	ask := func() streamed {
		return streamPost(t, nil, "/v1/messages", fu.MessagesRequest("claude-sonnet-4-5", true), "",
			"anthropic-version", "2023-06-01", "anthropic-beta", "interleaved-thinking-2025-05-14,claude-code-20250219")
	}
	cleanClaude := func(s streamed, servedBy, text string) {
		t.Helper()
		okStream(t, s)
		if got := s.res.Header.Get("X-Served-By"); got != servedBy {
			t.Fatalf("served by %q, want %s:\n%s", got, servedBy, s.body)
		}
		if !bytes.Contains(s.body, []byte(text)) || !bytes.Contains(s.body, []byte("event: message_stop")) || bytes.Contains(s.body, []byte("event: error")) {
			t.Fatalf("not one clean stream:\n%s", s.body)
		}
		if !bytes.Contains(s.body, []byte(`"model":"claude-sonnet-4-5"`)) || bytes.Contains(s.body, []byte("20250929")) {
			t.Errorf("the stream does not name the client's model:\n%s", s.body)
		}
	}

	// Anthropic overloaded: Vertex answers.
	cleanClaude(ask(), "google-vertex", "Hello from vertex")

	// Vertex out of quota (array-wrapped RESOURCE_EXHAUSTED): Bedrock.
	f.vertex.SetMode(fakeproviders.RateLimited)
	cleanClaude(ask(), "aws-bedrock", "Hello from bedrock")

	// A throttlingException frame before content fails over too; with
	// every channel failed the client gets one Anthropic error.
	f.bedrock.SetMode(fakeproviders.ExceptionBeforeContent)
	res, body := post(t, "/v1/messages", fu.MessagesRequest("claude-sonnet-4-5", true), "anthropic-version", "2023-06-01")
	if res.StatusCode < 500 && res.StatusCode != 429 {
		t.Fatalf("status %d, want a retryable failure: %s", res.StatusCode, body)
	}
	if _, typ := anthropicError(t, body); typ == "" {
		t.Fatalf("not an Anthropic error: %s", body)
	}

	// The throttlingException parked Bedrock (a rate limit, not an
	// outage): nothing is sent to it until the park ends or an operator
	// resets it.
	hitsBefore := f.bedrock.Hits()
	_, _ = post(t, "/v1/messages", fu.MessagesRequest("claude-sonnet-4-5", false), "anthropic-version", "2023-06-01")
	if f.bedrock.Hits() != hitsBefore {
		t.Fatal("a parked Bedrock was asked")
	}
	if code, body := brkAdmin(t, http.MethodPost, "/llm_failover/channels/aws-bedrock/reset"); code != 200 {
		t.Fatalf("reset: %d %s", code, body)
	}

	// A validationException before content is the client's error: 400 in
	// Anthropic's format, not a failover.
	f.bedrock.SetMode(fakeproviders.ValidationBeforeContent)
	hitsBefore = f.bedrock.Hits()
	res, body = post(t, "/v1/messages", fu.MessagesRequest("claude-sonnet-4-5", true), "anthropic-version", "2023-06-01")
	if res.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d, want 400: %s", res.StatusCode, body)
	}
	if msg, typ := anthropicError(t, body); typ != "invalid_request_error" || !strings.Contains(msg, "roles must alternate") {
		t.Fatalf("error %q (%s), want Bedrock's validation message as invalid_request_error", msg, typ)
	}
	if f.bedrock.Hits() != hitsBefore+1 {
		t.Fatal("bedrock not asked exactly once")
	}

	// After content an exception is an Anthropic error event, never a
	// message_stop.
	f.bedrock.SetMode(fakeproviders.ExceptionAfterContent)
	s := ask()
	if s.res.StatusCode != 200 || !bytes.Contains(s.body, []byte("Hello from bedrock")) ||
		!bytes.Contains(s.body, []byte("event: error")) || bytes.Contains(s.body, []byte("message_stop")) {
		t.Fatalf("status %d, want content then an error event without message_stop:\n%s", s.res.StatusCode, s.body)
	}

	// Not streamed: Bedrock's JSON answer, renamed back.
	f.bedrock.SetMode(fakeproviders.OK)
	res, body = post(t, "/v1/messages", fu.MessagesRequest("claude-sonnet-4-5", false), "anthropic-version", "2023-06-01")
	if res.StatusCode != 200 || res.Header.Get("X-Served-By") != "aws-bedrock" || !bytes.Contains(body, []byte(`"model":"claude-sonnet-4-5"`)) {
		t.Fatalf("status %d by %q: %s", res.StatusCode, res.Header.Get("X-Served-By"), body)
	}
}

// Vertex tokens that live 2 s are refreshed in the background: requests
// spread over several lifetimes never meet an expired token.
func TestVertexTokenRefreshMidRun(t *testing.T) {
	f := startClaudeChain(t, fu.Status(503, fu.AnthropicErrorBody("api_error", "down")), 2*time.Second)
	deadline := time.Now().Add(5 * time.Second)
	var wg sync.WaitGroup
	for w := 0; w < 3; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				res, body := post(t, "/v1/messages", fu.MessagesRequest("claude-sonnet-4-5", false), "anthropic-version", "2023-06-01")
				if res.StatusCode != 200 || res.Header.Get("X-Served-By") != "google-vertex" {
					t.Errorf("status %d by %q: %s", res.StatusCode, res.Header.Get("X-Served-By"), body)
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	if n := f.vertex.TokensIssued(); n < 3 {
		t.Errorf("%d tokens issued over 5 s of 2 s tokens; want at least 3", n)
	}
}

// A Bedrock model id without an inference profile gets Bedrock's refusal
// in Anthropic's format, with what to do about it.
func TestBedrockOnDemandHint(t *testing.T) {
	b := fakeproviders.NewBedrock("us-east-1", "AKIAFAKE", "fake-secret")
	t.Cleanup(b.Close)
	gateway(t, `
		channel aws-bedrock %s {
			provider bedrock {
				region us-east-1
				access_key_id AKIAFAKE
				secret_access_key fake-secret
			}
		}
		model claude {
			route aws-bedrock upstream_model anthropic.claude-sonnet-4-5-20250929-v1:0
		}
	`, b.URL)
	res, body := post(t, "/v1/messages", fu.MessagesRequest("claude", false), "anthropic-version", "2023-06-01")
	if res.StatusCode != 400 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	if msg, typ := anthropicError(t, body); typ != "invalid_request_error" || !strings.Contains(msg, "inference profile id as upstream_model") {
		t.Fatalf("error %q (%s) gives no inference-profile hint", msg, typ)
	}
}
