package integration_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	"github.com/llmfailover/caddy-llm-failover/internal/fakeproviders"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/provider"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// instructedMessages decodes the messages of a continuation's request.
func instructedMessages(t *testing.T, body []byte) (msgs []map[string]any, req map[string]any) {
	t.Helper()
	if err := json.Unmarshal(body, &req); err != nil {
		t.Fatalf("request %s: %v", body, err)
	}
	raw, _ := json.Marshal(req["messages"])
	_ = json.Unmarshal(raw, &msgs)
	return msgs, req
}

// checkInstructed checks an instructed continuation's request: the
// client's conversation, the delivered text as the assistant's turn, a
// user turn asking to go on, and the client's output limit less what
// was delivered.
func checkInstructed(t *testing.T, body []byte, delivered, limitKey string, limit int64) {
	t.Helper()
	msgs, req := instructedMessages(t, body)
	n := len(msgs)
	if n != 3 || msgs[1]["role"] != "assistant" || msgs[1]["content"] != delivered || msgs[2]["role"] != "user" ||
		!strings.Contains(msgs[2]["content"].(string), "Continue it from exactly where it stopped") {
		t.Fatalf("not an instructed continuation: %s", body)
	}
	if got, want := int64(req[limitKey].(float64)), limit-provider.EstimateTokens([]byte(delivered)); got != want {
		t.Errorf("%s %d, want the client's %d less the %d delivered", limitKey, got, limit, limit-want)
	}
}

// A stream cut on one channel is finished by a Claude 4.6 model that
// refuses a prefill, through Anthropic's own API, Vertex and Bedrock: the
// refusal is learned at once and the same channel asked again in the
// instructed form; its repeat of the delivered tail is trimmed, so the
// client's text is exact; the ledger has the two parts; the next resume
// goes straight to the instructed form.
func TestResumeInstructedOnClaude46(t *testing.T) {
	pieces := resumePieces()
	answer := strings.Join(pieces, "")
	delivered := strings.Join(pieces[:40], "")
	for _, tt := range []struct {
		name, channel, upstreamModel string
	}{
		{"anthropic", "provider anthropic\n\t\t\theader X-Api-Key sk-ant-test", "claude-opus-4-6"},
		{"vertex", "provider vertex {\n\t\t\t\tproject proj-1\n\t\t\t\tregion us-east5\n\t\t\t\tcredentials_file %s\n\t\t\t}", "claude-opus-4-6@default"},
		{"bedrock", "provider bedrock {\n\t\t\t\tregion us-east-1\n\t\t\t\taccess_key_id AKIAFAKE\n\t\t\t\tsecret_access_key fake-secret\n\t\t\t}", "us.anthropic.claude-opus-4-6-v1:0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			model := &fakeproviders.Model{Answer: answer, NoPrefill: true, Repeat: 7}
			var url string
			var bodies func() []byte
			var hitsOf func() int
			args := []any{}
			switch tt.name {
			case "anthropic":
				f := fakeproviders.NewAnthropic("sk-ant-test")
				t.Cleanup(f.Close)
				f.SetModel(model)
				url, bodies, hitsOf = f.URL, f.LastBody, f.Hits
			case "vertex":
				f := fakeproviders.NewVertex("proj-1", "us-east5", 3600e9)
				t.Cleanup(f.Close)
				f.SetModel(model)
				sa, err := f.WriteServiceAccount(t.TempDir())
				if err != nil {
					t.Fatal(err)
				}
				url, bodies, hitsOf = f.URL, f.LastBody, f.Hits
				args = append(args, sa)
			case "bedrock":
				f := fakeproviders.NewBedrock("us-east-1", "AKIAFAKE", "fake-secret")
				t.Cleanup(f.Close)
				f.SetModel(model)
				url, bodies, hitsOf = f.URL, f.LastBody, f.Hits
			}
			a := upstream(t, fu.OKNamed("primary").WithPieces(pieces...).WithCutAfter(40))
			cfg := `
		channel a %s {
		}
		channel b %s {
			` + tt.channel + `
		}
		model claude {
			route a cost 1 1
			route b cost 2 2 upstream_model ` + tt.upstreamModel + `
			price 3 15
		}
		wallet
		stream_resume continue
`
			gateway(t, cfg, append([]any{a.URL, url}, args...)...)
			secret, _ := newWalletAccount(t, "acct-"+tt.name, "1")
			post := func() streamed {
				s := streamPost(t, nil, "/v1/messages", resumeBody(t), "", "X-Api-Key", secret, "Anthropic-Version", "2023-06-01")
				waitUnreserved(t, "acct-"+tt.name)
				return s
			}
			s := post()
			wantText(t, s, answer)
			mustContain(t, s.body, ": llm-failover resumed from a on b (instructed)")
			for sub, n := range map[string]int{"event: message_start": 1, "event: message_delta": 1, "event: message_stop": 1, "event: error": 0} {
				if got := count(s.body, sub); got != n {
					t.Errorf("%d × %q, want %d:\n%s", got, sub, n, s.body)
				}
			}
			if got := hitsOf(); got != 2 {
				t.Fatalf("backup asked %d times, want the refused prefill and the instructed form", got)
			}
			checkInstructed(t, bodies(), delivered, "max_tokens", 1000)
			// The refused prefill cost nothing: a zero failed_attempt row.
			var charges []string
			for _, r := range requestRows(t, "acct-"+tt.name) {
				switch {
				case r.Kind == wallet.KindCharge:
					charges = append(charges, r.Channel)
				case r.Kind != wallet.KindFailedAttempt || parseMoney(t, r.Cost) != 0:
					t.Errorf("ledger row %+v", r)
				}
			}
			if strings.Join(charges, ",") != "a,b" {
				t.Fatalf("charges %v, want a's and b's", charges)
			}
			var journaled failoverapp.DecisionsAnswer
			if err := adminGet(t, "/llm_failover/decisions?reason=prefill_refused", &journaled); err != nil || journaled.Total == 0 {
				t.Errorf("no prefill_refused decision journaled (%v)", err)
			}
			if err := adminGet(t, "/llm_failover/decisions?reason=resumed", &journaled); err != nil || journaled.Total == 0 || journaled.Decisions[0].Form != "instructed" {
				t.Errorf("the resumed decision does not say the form: %+v (%v)", journaled, err)
			}
			if f := *brkState(t, "b").Failures; f != 0 {
				t.Errorf("the refused prefill counted against b's breaker: %d failures", f)
			}

			var chans []failoverapp.ChannelStateView
			if err := adminGet(t, "/llm_failover/channels", &chans); err != nil {
				t.Fatal(err)
			}
			for _, c := range chans {
				if c.Name == "b" && strings.Join(c.NoPrefillModels, ",") != tt.upstreamModel {
					t.Errorf("channel b's no_prefill_models %v, want [%s]", c.NoPrefillModels, tt.upstreamModel)
				}
			}

			// Learned, and kept across a reload: the next resume asks in
			// the instructed form at once.
			gateway(t, cfg, append([]any{a.URL, url}, args...)...)
			s = post()
			wantText(t, s, answer)
			if got := hitsOf(); got != 3 {
				t.Fatalf("backup asked %d times in all, want one more", got)
			}
		})
	}
}

// The OpenAI API, Azure OpenAI and Gemini have no prefill (a final
// assistant message is context: the model starts a new answer), so a
// chat stream is continued on them in the instructed form by default:
// the continuation's repeat of the delivered tail is trimmed, the
// client's limit is lowered by what it has, and the ledger has the two
// parts.
func TestResumeInstructedOnOpenAIAzureGemini(t *testing.T) {
	pieces := resumePieces()
	answer := strings.Join(pieces, "")
	delivered := strings.Join(pieces[:40], "")
	model := &fakeproviders.Model{Answer: answer, PrefixIsContext: true, Repeat: 9}
	for _, tt := range []struct {
		name, channel, upstreamModel string
	}{
		{"openai", `header Authorization "Bearer sk-openai-test"`, "gpt-5"},
		{"azure", "provider azure {\n\t\t\t\tapi_key az-key\n\t\t\t}", "gpt5-prod"},
		{"gemini", "provider gemini {\n\t\t\t\tapi_key gm-key\n\t\t\t}", "gemini-2.5-flash"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var url string
			var lastBody func() []byte
			var hitsOf func() int
			var problems func() []string
			switch tt.name {
			case "openai":
				f := fakeproviders.NewOpenAI("sk-openai-test")
				t.Cleanup(f.Close)
				f.SetModel(model)
				url, lastBody, hitsOf, problems = f.URL, f.LastBody, f.Hits, f.Problems
			case "azure":
				f := fakeproviders.NewAzure("az-key", "gpt5-prod")
				t.Cleanup(f.Close)
				f.SetModel(model)
				url, lastBody, hitsOf, problems = f.URL, f.LastBody, f.Hits, f.Problems
			case "gemini":
				f := fakeproviders.NewGemini("gm-key")
				t.Cleanup(f.Close)
				f.SetModel(model)
				url, lastBody, hitsOf, problems = f.URL, f.LastBody, f.Hits, f.Problems
			}
			a := upstream(t, fu.OKNamed("primary").WithPieces(pieces...).WithCutAfter(40))
			gateway(t, `
		channel a %s {
		}
		channel b %s {
			`+tt.channel+`
		}
		model m {
			route a cost 1 1
			route b cost 2 2 upstream_model `+tt.upstreamModel+`
			price 3 15
		}
		wallet
		stream_resume continue
`, a.URL, url)
			account := "acct-chat-" + tt.name
			secret, _ := newWalletAccount(t, account, "1")
			body := []byte(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":1000,"messages":[{"role":"user","content":"Count."}]}`)
			s := streamPost(t, nil, "/v1/chat/completions", body, "", "Authorization", "Bearer "+secret)
			waitUnreserved(t, account)
			wantText(t, s, answer)
			mustContain(t, s.body, ": llm-failover resumed from a on b (instructed)")
			if got := s.res.Trailer.Get("X-Llm-Failover-Resumed"); got != "a -> b (instructed)" {
				t.Errorf("trailer %q", got)
			}
			for sub, n := range map[string]int{`"finish_reason":"stop"`: 1, "data: [DONE]": 1, "chatcmpl-fake": 0, `"error"`: 0} {
				if got := count(s.body, sub); got != n {
					t.Errorf("%d × %q, want %d:\n%s", got, sub, n, s.body)
				}
			}
			checkInstructed(t, lastBody(), delivered, "max_completion_tokens", 1000)
			if hitsOf() != 1 {
				t.Errorf("backup asked %d times", hitsOf())
			}
			if p := problems(); len(p) > 0 {
				t.Errorf("fake refused: %v", p)
			}
			var charges []string
			for _, r := range requestRows(t, account) {
				if r.Kind == wallet.KindCharge {
					charges = append(charges, r.Channel)
				}
			}
			if strings.Join(charges, ",") != "a,b" {
				t.Fatalf("charges %v, want a's and b's", charges)
			}
		})
	}
}

// A continuation that starts the answer over is trimmed when it repeats
// all of it, and abandoned unseen when it then says something else: the
// client gets the original failure, never two beginnings.
func TestResumeInstructedRestart(t *testing.T) {
	pieces := resumePieces()
	answer := strings.Join(pieces, "")
	for _, tt := range []struct {
		name, restart string
		resumed       bool
	}{
		{"repeats all, then goes on", answer, true},
		{"starts over differently", strings.Join(pieces[:10], "") + " and then something else entirely.", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := fakeproviders.NewOpenAI("sk-openai-test")
			t.Cleanup(o.Close)
			o.SetModel(&fakeproviders.Model{Answer: answer, Restart: tt.restart})
			a := upstream(t, fu.OKNamed("primary").WithPieces(pieces...).WithCutAfter(40))
			gateway(t, `
		channel a %s {
		}
		channel b %s {
			header Authorization "Bearer sk-openai-test"
		}
		model m {
			route a cost 1 1
			route b cost 2 2
		}
		stream_resume continue
`, a.URL, o.URL)
			s := chatResumePost(t, fu.ChatRequest("m", true))
			if tt.resumed {
				wantText(t, s, answer)
				return
			}
			okStream(t, s)
			if got := fu.StreamText(mustSSE(t, s.body)); got != strings.Join(pieces[:40], "") {
				t.Fatalf("the client saw the restart: %q", got)
			}
			mustNotContain(t, s.body, "something else", "llm-failover resumed", "[DONE]")
			var journaled failoverapp.DecisionsAnswer
			if err := adminGet(t, "/llm_failover/decisions?reason=continuation_restarted", &journaled); err != nil || journaled.Total == 0 {
				t.Errorf("no continuation_restarted decision journaled (%v)", err)
			}
			if f := *brkState(t, "b").Failures; f != 0 {
				t.Errorf("the restart counted against b's breaker: %d failures", f)
			}
		})
	}
}

// A stream that will be resumed and keeps pinging after its content
// stopped is a break once the content has been silent for the stall
// floor (here stream_idle_timeout, 1 s, below the 20 s default): the
// pings never trip the byte idle timeout, and without the content check
// the client would wait for ever.
func TestResumeContentStallWhilePinging(t *testing.T) {
	pieces := resumePieces()
	steps := anthropicSteps(pieces[:20])
	for range 200 {
		steps = append(steps, 50*time.Millisecond, "event: ping\ndata: {\"type\":\"ping\"}\n\n")
	}
	a := upstream(t, sseScript(steps...))
	b := upstream(t, fu.OKNamed("backup").WithPieces(pieces[20:]...))
	gateway(t, gateChannels, a.URL, b.URL, "stream_resume continue\nstream_idle_timeout 1s")
	s := resumePost(t)
	wantText(t, s, strings.Join(pieces, ""))
	if s.endAt < 900*time.Millisecond || s.endAt > 6*time.Second {
		t.Fatalf("ended after %s; the content stall floor is 1s and the pings went on for 10s", s.endAt)
	}
	mustContain(t, s.body, ": llm-failover resumed from a on b (prefill)")
	t.Logf("a content stall resumed: stream ended %s after the request", s.endAt)
}

// With the default settings, a stream that will be resumed and goes
// silent for 90 s after content (pings only, every 5 s, as Anthropic's
// keep the connection busy) is continued within 45 s of the stall: the
// content stall floor is 20 s, the backup's first token follows at once.
func TestResumeNinetySecondStall(t *testing.T) {
	if testing.Short() {
		t.Skip("takes 20 s")
	}
	pieces := resumePieces()
	steps := anthropicSteps(pieces[:20])
	for range 18 {
		steps = append(steps, 5*time.Second, "event: ping\ndata: {\"type\":\"ping\"}\n\n")
	}
	a := upstream(t, sseScript(steps...))
	b := upstream(t, fu.OKNamed("backup").WithPieces(pieces[20:]...))
	gateway(t, gateChannels, a.URL, b.URL, "stream_resume continue")
	s := resumePost(t)
	wantText(t, s, strings.Join(pieces, ""))
	stall := s.at(" t20") - s.at(" t19")
	if stall < 19*time.Second || stall > 45*time.Second {
		t.Fatalf("the first continued token came %s after the stall began, want 20 s to 45 s", stall)
	}
	t.Logf("90 s stall: the first continued token %s after the last delivered one", stall)
}

// Each continuation attempt judges its own answer: a backup that began
// by repeating the answer's start and then failed before anything was
// committed leaves nothing behind for the next backup's join (sharing
// the first one's reading, the second was judged a restart and dropped).
func TestResumeInstructedFreshJoinPerAttempt(t *testing.T) {
	pieces := resumePieces()
	answer := strings.Join(pieces, "")
	chunk := func(delta string) string {
		return "data: {\"id\":\"chatcmpl-b\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":" + delta + ",\"finish_reason\":null}]}\n\n"
	}
	start, _ := json.Marshal(map[string]string{"content": answer[:20]})
	b := upstream(t, sseScript(chunk(`{"role":"assistant","content":""}`), chunk(string(start)),
		"data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n"))
	c := fakeproviders.NewOpenAI("sk-openai-test")
	t.Cleanup(c.Close)
	c.SetModel(&fakeproviders.Model{Answer: answer, PrefixIsContext: true, Repeat: 4})
	a := upstream(t, fu.OKNamed("primary").WithPieces(pieces...).WithCutAfter(40))
	gateway(t, `
		channel a %s {
		}
		channel b %s {
		}
		channel c %s {
			header Authorization "Bearer sk-openai-test"
		}
		model m {
			route a cost 1 1
			route b cost 2 2
			route c cost 3 3
		}
		stream_resume continue
`, a.URL, b.URL, c.URL)
	s := chatResumePost(t, fu.ChatRequest("m", true))
	wantText(t, s, answer)
	mustContain(t, s.body, ": llm-failover resumed from a on c (instructed)")
	hits(t, b, 1)
}
