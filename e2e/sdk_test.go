package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/fakeproviders"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// TestSDKs runs the official OpenAI and Anthropic Node SDKs (sdktest/)
// against the real binary configured as sdktest/README.md's contract table
// says. Node's exit code is the verdict.
func TestSDKs(t *testing.T) {
	caddyBin(t)
	node, sdkDir := sdkPrerequisites(t)

	// One set of upstreams per model, so that no breaker state is shared
	// between rows of the contract table.
	servers := map[string]*fu.Server{}
	up := func(name string, b fu.Behavior) string {
		s := fu.New(b)
		t.Cleanup(s.Close)
		servers[name] = s
		return fmt.Sprintf("\t\tchannel %s %s\n", name, s.URL)
	}
	var channels strings.Builder
	channels.WriteString(up("gf1", fu.Status(503, "")))
	channels.WriteString(up("gf2", fu.OKNamed("backup")))
	channels.WriteString(up("gbad", fu.Status(400, badRequestBody)))
	channels.WriteString(up("gdown1", fu.Status(503, "")))
	channels.WriteString(up("gdown2", fu.Status(503, "")))
	channels.WriteString(up("gcut", fu.CutMidStream()))
	channels.WriteString(up("gr1", fu.ResponsesFailed()))
	channels.WriteString(up("gr2", fu.OKNamed("backup")))
	channels.WriteString(up("cf1", fu.AnthropicErrorAfterPreamble()))
	channels.WriteString(up("cf2", fu.OKNamed("backup")))
	channels.WriteString(up("cdown1", fu.Status(503, "")))
	channels.WriteString(up("cdown2", fu.Status(503, "")))
	channels.WriteString(up("ccut", fu.CutMidStream()))
	// claude-resume: 60 text deltas " t00".." t59", cut after 40 and
	// finished by the second channel (stream_resume continue).
	resumePieces := make([]string, 60)
	for i := range resumePieces {
		resumePieces[i] = fmt.Sprintf(" t%02d", i)
	}
	channels.WriteString(up("cres1", fu.OK().WithPieces(resumePieces...).WithCutAfter(40)))
	channels.WriteString(up("cres2", fu.OK().WithPieces(resumePieces[40:]...)))
	// claude-resume-tool: a text block cut while open, continued by an
	// answer that opens with a tool_use.
	channels.WriteString(up("crt1", fu.OK().WithPieces(" I'll", " check", " the weather.", " more").WithCutAfter(3)))
	channels.WriteString(up("crt2", toolUseStream))
	// gpt-resume: the same for OpenAI chat, continued on a channel whose
	// host takes a "prefix": true final assistant message.
	channels.WriteString(up("gres1", fu.OK().WithPieces(resumePieces...).WithCutAfter(40)))
	channels.WriteString(strings.TrimSuffix(up("gres2", fu.OK().WithPieces(resumePieces[40:]...)), "\n") +
		" {\n\t\t\tprovider openai {\n\t\t\t\tcontinuation prefix\n\t\t\t}\n\t\t}\n")
	// claude-resume-46 and gpt-resume-instructed: the same cut, continued
	// by models with no prefill, asked in words (a Claude 4.6 that refuses
	// the prefill first, the OpenAI API), each repeating the delivered
	// tail before going on.
	answer := strings.Join(resumePieces, "")
	claude46 := fakeproviders.NewAnthropic("sk-ant-sdk")
	t.Cleanup(claude46.Close)
	claude46.SetModel(&fakeproviders.Model{Answer: answer, NoPrefill: true, Repeat: 7})
	gpt := fakeproviders.NewOpenAI("sk-openai-sdk")
	t.Cleanup(gpt.Close)
	gpt.SetModel(&fakeproviders.Model{Answer: answer, PrefixIsContext: true, Repeat: 9})
	channels.WriteString(up("c46a", fu.OK().WithPieces(resumePieces...).WithCutAfter(40)))
	channels.WriteString("\t\tchannel c46b " + claude46.URL + " {\n\t\t\tprovider anthropic\n\t\t\theader X-Api-Key sk-ant-sdk\n\t\t}\n")
	channels.WriteString(up("ginsa", fu.OK().WithPieces(resumePieces...).WithCutAfter(40)))
	channels.WriteString("\t\tchannel ginsb " + gpt.URL + " {\n\t\t\theader Authorization \"Bearer sk-openai-sdk\"\n\t\t}\n")

	models := `
		model gpt-failover {
			route gf1 cost 1 1
			route gf2 cost 2 2
		}
		model gpt-bad-request {
			route gbad
		}
		model gpt-down {
			route gdown1 cost 1 1
			route gdown2 cost 2 2
		}
		model gpt-cut {
			route gcut
		}
		model gpt-responses {
			route gr1 cost 1 1
			route gr2 cost 2 2
		}
		model claude-failover {
			route cf1 cost 1 1
			route cf2 cost 2 2
		}
		model claude-down {
			route cdown1 cost 1 1
			route cdown2 cost 2 2
		}
		model claude-cut {
			route ccut
		}
		model claude-resume {
			route cres1 cost 1 1
			route cres2 cost 2 2
			stream_resume continue
		}
		model claude-resume-tool {
			route crt1 cost 1 1
			route crt2 cost 2 2
			stream_resume continue
		}
		model gpt-resume {
			route gres1 cost 1 1
			route gres2 cost 2 2
			stream_resume continue
		}
		model claude-resume-46 {
			route c46a cost 1 1
			route c46b cost 2 2 upstream_model claude-opus-4-6
			stream_resume continue
		}
		model gpt-resume-instructed {
			route ginsa cost 1 1
			route ginsb cost 2 2 upstream_model gpt-5
			stream_resume continue
		}
		stream_idle_timeout 10s
`
	p := portsSDK
	in := newInstance(t, "sdk", p, globalOptions(p)+site(p, channels.String()+models))

	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec")
	cmd.Dir = sdkDir
	cmd.Env = append(os.Environ(), "GATEWAY_URL="+in.gatewayURL(), "NO_COLOR=1", "FORCE_COLOR=0")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	elapsed := time.Since(start).Round(time.Millisecond)
	if err != nil || ctx.Err() != nil {
		t.Fatalf("node --test in sdktest/ failed after %v (%v):\n%s", elapsed, err, out)
	}
	t.Logf("node --test passed in %v", elapsed)
	if testing.Verbose() {
		t.Logf("node output:\n%s", out)
	}

	// The client's key never reaches an upstream.
	for name, s := range servers {
		if s.Hits() == 0 {
			continue
		}
		h := s.LastRequest().Header
		for _, f := range []string{"Authorization", "X-Api-Key"} {
			if strings.Contains(h.Get(f), "sk-client-test") {
				t.Errorf("upstream %s received the client's key in %s", name, f)
			}
		}
	}
	// The chat continuation asked the backup for a prefix completion.
	if b := servers["gres2"]; b.Hits() > 0 && !strings.Contains(string(b.LastRequest().Body), `"prefix":true`) {
		t.Errorf("gres2 was not asked to continue a prefix: %s", b.LastRequest().Body)
	}
	// Every row of the table was exercised.
	for _, name := range []string{"gf1", "gf2", "gbad", "gdown1", "gdown2", "gcut", "gr1", "gr2", "cf1", "cf2", "cdown1", "cdown2", "ccut", "cres1", "cres2", "gres1", "gres2"} {
		if servers[name].Hits() == 0 {
			t.Errorf("upstream %s was never called; the SDK tests did not exercise it", name)
		}
	}
}

// toolUseStream answers a Messages stream that is one tool_use block (a
// continuation that goes on with a tool call).
var toolUseStream = fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	for _, ev := range [][2]string{
		{"message_start", `{"type":"message_start","message":{"id":"msg_tool","type":"message","role":"assistant","model":"claude-resume-tool","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":20,"output_tokens":1}}}`},
		{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_01","name":"weather","input":{}}}`},
		{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"city\": \"Paris\"}"}}`},
		{"content_block_stop", `{"type":"content_block_stop","index":0}`},
		{"message_delta", `{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":12}}`},
		{"message_stop", `{"type":"message_stop"}`},
	} {
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev[0], ev[1])
	}
})
