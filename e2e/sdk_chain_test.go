package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/binarytest"
	"github.com/llmfailover/caddy-llm-failover/internal/fakeproviders"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// Ports of the real-provider chain tests.
var (
	portsSDKClaudeChain = ports{19091, 19030}
	portsSDKGPTChain    = ports{19092, 19031}
)

// sdkPhase is one state of a chain's fakes and what the official SDK must
// see in it, as the env contract of sdktest/chain-*.mjs says.
type sdkPhase struct {
	name string
	set  func()
	env  []string
}

// runSDKPhases runs one sdktest/chain-*.mjs file per phase, after setting
// the fakes for it. Node's exit code is the verdict.
func runSDKPhases(t *testing.T, in *instance, script string, phases []sdkPhase) {
	t.Helper()
	node, sdkDir := sdkPrerequisites(t)
	for _, ph := range phases {
		ph.set()
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec", script)
		cmd.Dir = sdkDir
		cmd.Env = append(os.Environ(), append([]string{"GATEWAY_URL=" + in.gatewayURL(), "NO_COLOR=1", "FORCE_COLOR=0"}, ph.env...)...)
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("phase %q: node --test %s failed (%v):\n%s", ph.name, script, err, out)
		}
		if testing.Verbose() {
			t.Logf("phase %q:\n%s", ph.name, out)
		}
	}
}

// sdkPrerequisites finds node and the installed official SDKs.
func sdkPrerequisites(t *testing.T) (node, sdkDir string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		binarytest.Prerequisite(t, "node is not on PATH; the official-SDK tests need Node >= 20")
	}
	sdkDir, err = filepath.Abs("../sdktest")
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range []string{"openai", "@anthropic-ai/sdk"} {
		if _, err := os.Stat(filepath.Join(sdkDir, "node_modules", pkg, "package.json")); err != nil {
			binarytest.Prerequisite(t, "sdktest/node_modules/%s is missing; run `make sdk-deps` (npm ci in sdktest/)", pkg)
		}
	}
	return node, sdkDir
}

// noProblems fails the test for every request a fake provider refused: a
// refusal means the gateway spoke the provider's wire format wrong.
func noProblems(t *testing.T, fakes ...interface{ Problems() []string }) {
	t.Helper()
	for _, f := range fakes {
		for _, p := range f.Problems() {
			t.Errorf("a fake provider refused a request: %s", p)
		}
	}
}

// One Claude model on Anthropic, Vertex (service-account token from the
// fake's token endpoint) and Bedrock (SigV4, event-stream), driven by the
// official Anthropic SDK through the built binary: each channel fails in
// turn, and the SDK sees one clean stream and one clean answer each time.
func TestSDKClaudeAcrossAnthropicVertexBedrock(t *testing.T) {
	caddyBin(t)
	sdkPrerequisites(t)
	anthropic := fu.New(fu.OKNamed("anthropic"))
	t.Cleanup(anthropic.Close)
	vertex := fakeproviders.NewVertex("proj-1", "us-east5", time.Hour)
	t.Cleanup(vertex.Close)
	bedrock := fakeproviders.NewBedrock("us-east-1", "AKIAFAKE", "fake-secret")
	t.Cleanup(bedrock.Close)
	sa, err := vertex.WriteServiceAccount(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(fakeproviders.ClaudeChain+`
		model claude-bedrock-first {
			route aws-bedrock cost 1 1 upstream_model us.anthropic.claude-sonnet-4-5-20250929-v1:0
			route google-vertex cost 2 2 upstream_model claude-sonnet-4-5@20250929
		}
`, anthropic.URL, vertex.URL, sa, bedrock.URL)
	p := portsSDKClaudeChain
	in := newInstance(t, "sdk-claude-chain", p, globalOptions(p)+site(p, body))
	t.Cleanup(func() { noProblems(t, vertex, bedrock) })

	served := func(model, expect, stream, json string) []string {
		text := map[string]string{"anthropic-direct": "Hello from anthropic", "google-vertex": "Hello from vertex", "aws-bedrock": "Hello from bedrock"}
		return []string{"CHAIN_MODEL=" + model, "CHAIN_EXPECT=" + expect,
			"STREAM_FROM=" + stream, "STREAM_TEXT=" + text[stream], "JSON_FROM=" + json, "JSON_TEXT=" + text[json]}
	}
	overloaded := fu.Status(529, fu.AnthropicErrorBody("overloaded_error", "Overloaded"))
	runSDKPhases(t, in, "chain-anthropic.mjs", []sdkPhase{
		{"anthropic serves", func() {}, served("claude-sonnet-4-5", "ok", "anthropic-direct", "anthropic-direct")},
		{"anthropic overloaded: vertex", func() { anthropic.Set(overloaded) }, served("claude-sonnet-4-5", "ok", "google-vertex", "google-vertex")},
		// The throttlingException is a rate limit: it parks Bedrock, so the
		// JSON request after the stream goes to Vertex without asking.
		{"bedrock throttled before content: vertex", func() { bedrock.SetMode(fakeproviders.ExceptionBeforeContent) },
			served("claude-bedrock-first", "ok", "google-vertex", "google-vertex")},
		{"vertex out of quota: bedrock", func() {
			vertex.SetMode(fakeproviders.RateLimited)
			bedrock.SetMode(fakeproviders.OK)
			in.admin(http.MethodPost, "/llm_failover/channels/aws-bedrock/reset", nil, http.StatusOK, nil)
		}, served("claude-sonnet-4-5", "ok", "aws-bedrock", "aws-bedrock")},
		{"bedrock validation: the client's 400", func() { bedrock.SetMode(fakeproviders.ValidationBeforeContent) },
			[]string{"CHAIN_MODEL=claude-sonnet-4-5", "CHAIN_EXPECT=invalid", "ERROR_TEXT=roles must alternate"}},
		{"bedrock exception after content: event error", func() { bedrock.SetMode(fakeproviders.ExceptionAfterContent) },
			[]string{"CHAIN_MODEL=claude-sonnet-4-5", "CHAIN_EXPECT=cut", "STREAM_TEXT=Hello from bedrock"}},
	})
	if vertex.TokensIssued() == 0 || bedrock.Hits() == 0 {
		t.Errorf("vertex issued %d tokens, bedrock got %d requests: the chain was not exercised", vertex.TokensIssued(), bedrock.Hits())
	}
	// Neither the client's key nor the Anthropic key crossed channels.
	if h := anthropic.LastRequest().Header; strings.Contains(h.Get("X-Api-Key")+h.Get("Authorization"), "sk-client-test") {
		t.Error("the client's key reached Anthropic")
	}
}

// One GPT model on OpenAI and two Azure OpenAI resources (the v1 path and
// the dated deployments path), driven by the official OpenAI SDK through
// the built binary: OpenAI down, then the first Azure rate-limited
// (retry-after-ms), then Azure's content filter, which is the client's.
func TestSDKGPTAcrossOpenAIAzure(t *testing.T) {
	caddyBin(t)
	sdkPrerequisites(t)
	openai := fu.New(fu.OKNamed("openai"))
	t.Cleanup(openai.Close)
	east := fakeproviders.NewAzure("az-east-key", "gpt4o-prod")
	t.Cleanup(east.Close)
	west := fakeproviders.NewAzure("az-west-key", "gpt4o-west")
	t.Cleanup(west.Close)
	body := fmt.Sprintf(`
		channel openai-direct %s {
			header Authorization "Bearer sk-openai-test"
		}
		channel azure-east %s {
			provider azure {
				api_key az-east-key
			}
		}
		channel azure-west %s {
			provider azure {
				api_version 2024-10-21
				api_key az-west-key
			}
		}
		breaker {
			failures 64
		}
		model gpt-4o {
			route openai-direct cost 2.5 10 upstream_model gpt-4o-2024-08-06
			route azure-east cost 3 12 upstream_model gpt4o-prod
			route azure-west cost 4 13 upstream_model gpt4o-west
		}
`, openai.URL, east.URL, west.URL)
	p := portsSDKGPTChain
	in := newInstance(t, "sdk-gpt-chain", p, globalOptions(p)+site(p, body))
	t.Cleanup(func() { noProblems(t, east, west) })

	served := func(expect, ch, text string) []string {
		return []string{"CHAIN_MODEL=gpt-4o", "CHAIN_EXPECT=" + expect,
			"STREAM_FROM=" + ch, "STREAM_TEXT=" + text, "JSON_FROM=" + ch, "JSON_TEXT=" + text}
	}
	runSDKPhases(t, in, "chain-openai.mjs", []sdkPhase{
		{"openai serves", func() {}, served("ok", "openai-direct", "Hello from openai")},
		{"openai down: azure v1 path", func() { openai.Set(fu.Status(503, "")) }, served("ok", "azure-east", "Hello from azure")},
		{"azure-east rate-limited: azure deployments path", func() { east.SetMode(fakeproviders.RateLimited) },
			served("ok", "azure-west", "Hello from azure")},
		{"azure content filter: the client's 400", func() { west.SetMode(fakeproviders.ContentFiltered) },
			[]string{"CHAIN_MODEL=gpt-4o", "CHAIN_EXPECT=invalid", "ERROR_CODE=content_filter"}},
		{"azure filters a stream: it passes", func() { west.SetMode(fakeproviders.ContentFilteredStream) },
			served("filtered", "azure-west", "Hello from")},
	})
	if east.Hits() == 0 || west.Hits() == 0 {
		t.Errorf("azure-east got %d requests, azure-west %d: the chain was not exercised", east.Hits(), west.Hits())
	}
}
