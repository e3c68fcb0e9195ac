package integration_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	"github.com/llmfailover/caddy-llm-failover/internal/fakeproviders"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// gptChain is one GPT model on OpenAI, then Azure (its deployment named
// gpt4o-prod), with the Azure provider options given.
const gptChain = `
		channel openai-direct %s {
			header Authorization "Bearer sk-test"
		}
		channel azure-east %s {
			provider azure {
				%s
				api_key az-key
			}
		}
		model gpt-4o {
			route openai-direct cost 2.5 10 upstream_model gpt-4o-2024-08-06
			route azure-east cost 3 12 upstream_model gpt4o-prod
		}
`

func startGPTChain(t *testing.T, openai fu.Behavior, azureOptions string) (*fu.Server, *fakeproviders.Azure) {
	t.Helper()
	o := upstream(t, openai)
	az := fakeproviders.NewAzure("az-key", "gpt4o-prod")
	t.Cleanup(az.Close)
	gateway(t, gptChain, o.URL, az.URL, azureOptions)
	t.Cleanup(func() {
		for _, p := range az.Problems() {
			t.Errorf("fake Azure refused a request: %s", p)
		}
	})
	return o, az
}

// OpenAI down: Azure answers, on both of its path styles, streamed and
// not, and the client sees the model it asked for.
func TestGPTFailsOverFromOpenAIToAzure(t *testing.T) {
	for name, opts := range map[string]string{"v1 path": "", "deployments path": "api_version 2024-10-21"} {
		t.Run(name, func(t *testing.T) {
			o, az := startGPTChain(t, fu.Status(500, fu.OpenAIErrorBody("The server had an error", "server_error", "")), opts)
			res, body := post(t, "/v1/chat/completions", fu.ChatRequest("gpt-4o", false))
			if res.StatusCode != 200 || res.Header.Get("X-Served-By") != "azure-east" {
				t.Fatalf("status %d by %q: %s", res.StatusCode, res.Header.Get("X-Served-By"), body)
			}
			mustContain(t, body, "Hello from azure", `"model":"gpt-4o"`)
			mustNotContain(t, body, "2024-08-06", "az-key")

			s := streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("gpt-4o", true), "")
			okStream(t, s)
			if got := fu.StreamText(mustSSE(t, s.body)); got != "Hello from azure" {
				t.Fatalf("text %q:\n%s", got, s.body)
			}
			if n, m := bytes.Count(s.body, []byte(`"model":`)), bytes.Count(s.body, []byte(`"model":"gpt-4o"`)); n == 0 || n != m {
				t.Fatalf("%d of %d events name the client's model:\n%s", m, n, s.body)
			}
			hits(t, o, 2)
			if az.Hits() != 2 {
				t.Fatalf("azure hits %d, want 2", az.Hits())
			}
		})
	}
}

// Azure's retry-after-ms parks the channel like Retry-After: the request
// fails over, and the next ones do not ask Azure until it is over.
func TestAzureRetryAfterMsParks(t *testing.T) {
	o := upstream(t, fu.OKNamed("openai"))
	az := fakeproviders.NewAzure("az-key", "gpt4o-prod")
	t.Cleanup(az.Close)
	az.SetMode(fakeproviders.RateLimited)
	// Azure first this time.
	gateway(t, strings.Replace(gptChain, "cost 3 12", "cost 1 1", 1), o.URL, az.URL, "")
	for i := 0; i < 3; i++ {
		res, body := post(t, "/v1/chat/completions", fu.ChatRequest("gpt-4o", false))
		if res.StatusCode != 200 || res.Header.Get("X-Served-By") != "openai-direct" {
			t.Fatalf("request %d: status %d by %q: %s", i, res.StatusCode, res.Header.Get("X-Served-By"), body)
		}
	}
	if az.Hits() != 1 {
		t.Fatalf("azure asked %d times within its retry-after-ms, want once", az.Hits())
	}
	var chans []failoverapp.ChannelStateView
	if err := adminGet(t, "/llm_failover/channels", &chans); err != nil {
		t.Fatal(err)
	}
	for _, c := range chans {
		if c.Name == "azure-east" && (c.ParkedUntil.IsZero() || c.State != "parked") {
			t.Fatalf("azure channel not parked: %+v", c)
		}
	}
}

// A 400 content_filter is about the prompt: the client gets Azure's answer
// as it is, and no other channel is asked.
func TestAzureContentFilterIsTheClients(t *testing.T) {
	o := upstream(t, fu.OKNamed("openai"))
	az := fakeproviders.NewAzure("az-key", "gpt4o-prod")
	t.Cleanup(az.Close)
	az.SetMode(fakeproviders.ContentFiltered)
	gateway(t, strings.Replace(gptChain, "cost 3 12", "cost 1 1", 1), o.URL, az.URL, "")
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("gpt-4o", false))
	if res.StatusCode != 400 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	if msg, _, code := openAIError(t, body); code != "content_filter" || !strings.Contains(msg, "content management policy") {
		t.Fatalf("error %q code %q, want Azure's content_filter", msg, code)
	}
	mustContain(t, body, "ResponsibleAIPolicyViolation")
	hits(t, o, 0)
}

// A stream Azure ends with finish_reason content_filter is a complete
// answer: it reaches the client as it is, [DONE] included.
func TestAzureContentFilterStreamPassesThrough(t *testing.T) {
	o := upstream(t, fu.OKNamed("openai"))
	az := fakeproviders.NewAzure("az-key", "gpt4o-prod")
	t.Cleanup(az.Close)
	az.SetMode(fakeproviders.ContentFilteredStream)
	gateway(t, strings.Replace(gptChain, "cost 3 12", "cost 1 1", 1), o.URL, az.URL, "api_version 2024-10-21")
	s := streamPost(t, nil, "/v1/chat/completions", fu.ChatRequest("gpt-4o", true), "")
	okStream(t, s)
	if got := s.res.Header.Get("X-Served-By"); got != "azure-east" {
		t.Fatalf("served by %q:\n%s", got, s.body)
	}
	mustContain(t, s.body, `"finish_reason":"content_filter"`, "data: [DONE]")
	mustNotContain(t, s.body, "event: error", "Hello from openai")
	hits(t, o, 0)
}

// Gemini's array-wrapped 429 fails over, and when no channel is left its
// message reaches the client in OpenAI's format.
func TestGeminiArrayWrapped429(t *testing.T) {
	g := fakeproviders.NewGemini("gm-key")
	t.Cleanup(g.Close)
	g.SetMode(fakeproviders.RateLimited)
	o := upstream(t, fu.OKNamed("backup"))
	gateway(t, `
		channel ai-studio %s {
			provider gemini {
				api_key gm-key
			}
		}
		channel backup %s
		model gemini-flash {
			route ai-studio cost 1 1 upstream_model gemini-2.5-flash
			route backup cost 2 2
		}
		model gemini-only {
			route ai-studio upstream_model gemini-2.5-flash
		}
	`, g.URL, o.URL)
	// The only channel's 429 goes back with Gemini's message.
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("gemini-only", false))
	if res.StatusCode != 429 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	if msg, _, _ := openAIError(t, body); !strings.Contains(msg, fakeproviders.GeminiQuotaMessage) {
		t.Fatalf("message %q does not carry Gemini's", msg)
	}
	// The 429 parked the channel (a rate limit is no outage): the next
	// request with a backup goes there without asking Gemini again, and
	// one without waits for the park to end.
	served := g.Hits()
	res, body = post(t, "/v1/chat/completions", fu.ChatRequest("gemini-flash", false))
	if res.StatusCode != 200 || res.Header.Get("X-Served-By") != "backup" {
		t.Fatalf("status %d by %q: %s", res.StatusCode, res.Header.Get("X-Served-By"), body)
	}
	res, body = post(t, "/v1/chat/completions", fu.ChatRequest("gemini-only", false))
	if res.StatusCode != 503 || res.Header.Get("Retry-After") == "" {
		t.Fatalf("parked: status %d Retry-After %q: %s", res.StatusCode, res.Header.Get("Retry-After"), body)
	}
	if g.Hits() != served {
		t.Errorf("Gemini was asked %d more times while parked", g.Hits()-served)
	}
}

// Gemini on AI Studio, then Gemini on Vertex's OpenAI-compatible endpoint
// (OAuth tokens, the publisher-prefixed model id): AI Studio's quota error
// fails over to Vertex, streamed and not, and the client sees the model
// it asked for.
func TestGeminiFailsOverFromAIStudioToVertex(t *testing.T) {
	g := fakeproviders.NewGemini("gm-key")
	t.Cleanup(g.Close)
	g.SetMode(fakeproviders.RateLimited)
	v := fakeproviders.NewVertex("proj-1", "us-central1", time.Hour)
	t.Cleanup(v.Close)
	sa, err := v.WriteServiceAccount(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	gateway(t, `
		channel ai-studio %s {
			provider gemini {
				api_key gm-key
			}
		}
		channel vertex-gemini %s {
			provider vertex {
				project proj-1
				region us-central1
				credentials_file %s
			}
		}
		model gemini-2.5-flash {
			route ai-studio cost 0.3 2.5
			route vertex-gemini cost 0.3 2.6 upstream_model google/gemini-2.5-flash
		}
	`, g.URL, v.URL, sa)
	for _, stream := range []bool{false, true} {
		res, body := post(t, "/v1/chat/completions", fu.ChatRequest("gemini-2.5-flash", stream))
		if res.StatusCode != 200 || res.Header.Get("X-Served-By") != "vertex-gemini" || !bytes.Contains(body, []byte("Hello from vertex gemini")) {
			t.Fatalf("stream=%v: status %d by %q: %s", stream, res.StatusCode, res.Header.Get("X-Served-By"), body)
		}
		if bytes.Contains(body, []byte("google/")) {
			t.Fatalf("stream=%v: the upstream's model id reached the client: %s", stream, body)
		}
	}
	for _, p := range v.Problems() {
		t.Errorf("fake Vertex refused a request: %s", p)
	}
}

// A probe of a Claude route on a Vertex channel speaks Anthropic's
// Messages (publishers/anthropic …:streamRawPredict), and of a Gemini
// route on the same channel Vertex's OpenAI-compatible endpoint: the
// soak found Claude probes sent to the OpenAI endpoint, which Vertex
// refuses, so the prober reported a working channel as misconfigured.
func TestVertexProbesSpeakEachModelsAPI(t *testing.T) {
	v := fakeproviders.NewVertex("proj-1", "us-east5", time.Hour)
	t.Cleanup(v.Close)
	sa, err := v.WriteServiceAccount(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ch := uniqueName("vxprobe")
	gateway(t, `
		channel %s %s {
			provider vertex {
				project proj-1
				region us-east5
				credentials_file %s
			}
		}
		model claude-sonnet-4-5 {
			route %[1]s cost 3 15 upstream_model claude-sonnet-4-5@20250929
			probe {
				interval 200ms
			}
		}
		model gemini-2.5-flash {
			route %[1]s cost 0.3 2.5 upstream_model google/gemini-2.5-flash
			probe {
				interval 200ms
			}
		}
	`, ch, v.URL, sa)
	waitFor(t, 5*time.Second, "a probe of each model", func() bool { return v.Hits() >= 2 })
	time.Sleep(300 * time.Millisecond) // a round more
	for _, p := range v.Problems() {
		t.Errorf("fake Vertex refused a probe: %s", p)
	}
}
