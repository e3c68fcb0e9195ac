package integration_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// cachingChannel is an OpenAI-style upstream with a prompt cache of its
// own, as a real provider's serving pool has: a conversation's prompt
// (named by its system message) is cached where it was served, and the
// next turn's prompt, which starts with it, reads it back as
// cached_tokens. It counts what it served and can fail on demand.
type cachingChannel struct {
	mu      sync.Mutex
	cached  map[string]int64 // conversation → prompt tokens cached here
	served  atomic.Int64
	failing atomic.Bool
}

func newCachingChannel() *cachingChannel { return &cachingChannel{cached: map[string]int64{}} }

func (c *cachingChannel) Serve(w http.ResponseWriter, r *http.Request, _ int64) {
	if c.failing.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	body, _ := io.ReadAll(r.Body)
	var req struct {
		Messages []struct{ Role, Content string } `json:"messages"`
	}
	if json.Unmarshal(body, &req) != nil || len(req.Messages) == 0 {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	conv := req.Messages[0].Content
	prompt := int64(len(body) / 4)
	c.mu.Lock()
	hit := min(c.cached[conv], prompt)
	c.cached[conv] = prompt
	c.mu.Unlock()
	c.served.Add(1)
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":10,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`, prompt, prompt+10, hit)
}

// conversationTurns runs conversations of turns each (a long system
// prompt per conversation, named by label and its number, a short
// message added per turn), calling
// before ahead of each turn, and returns the cache-read share: cached
// input tokens over all input tokens after each conversation's first
// turn, as the upstreams reported them; the input's bill per
// conversation, every turn included, at $3 a million plain tokens and
// the OpenAI default of half that for cached ones; and the cached and
// all input tokens of every turn.
func conversationTurns(t *testing.T, label string, conversations, turns int, before func(turn int)) (share float64, bill wallet.Micros, allCached, allInput int64) {
	t.Helper()
	var cached, input int64
	price := wallet.Price{Input: 3_000_000, CacheRead: 1_500_000}
	for c := range conversations {
		system := fmt.Sprintf("%s conversation %d. ", label, c) + strings.Repeat("You are a meticulous coding assistant with a long system prompt. ", 120)
		msgs := []map[string]string{{"role": "system", "content": system}}
		for turn := range turns {
			before(turn)
			msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("Turn %d: go on.", turn)})
			body, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
			res, got := post(t, "/v1/chat/completions", body)
			if res.StatusCode != 200 {
				t.Fatalf("conversation %d turn %d: %d %s", c, turn, res.StatusCode, got)
			}
			var a struct {
				Usage struct {
					PromptTokens        int64 `json:"prompt_tokens"`
					PromptTokensDetails struct {
						CachedTokens int64 `json:"cached_tokens"`
					} `json:"prompt_tokens_details"`
				} `json:"usage"`
			}
			if err := json.Unmarshal(got, &a); err != nil {
				t.Fatal(err)
			}
			hit := a.Usage.PromptTokensDetails.CachedTokens
			bill += price.CostOf(wallet.Tokens{Input: a.Usage.PromptTokens - hit, CacheRead: hit})
			allCached, allInput = allCached+hit, allInput+a.Usage.PromptTokens
			if turn > 0 {
				cached += hit
				input += a.Usage.PromptTokens
			}
			msgs = append(msgs, map[string]string{"role": "assistant", "content": "ok"})
		}
	}
	return float64(cached) / float64(input), bill / wallet.Micros(conversations), allCached, allInput
}

// affinityChannels: one model on two equally weighted channels; the
// breaker never opens, so a failed request fails over and the next one
// goes back to the first channel, as after a short blip.
const affinityChannels = `
		channel a %s {
		}
		channel b %s {
		}
		model m {
			policy weighted
			route a
			route b
		}
		breaker {
			failures 64
		}
`

// Twenty conversations of eight turns through two equally weighted
// channels, each with a prompt cache of its own. The weighted policy
// explores: about one request in twenty goes to the other channel, whose
// cache is cold for it. With cache affinity a conversation stays where
// its cache is warm, exploration included, and the cache-read share is
// at least 95%; without it (measured, for comparison) every explored turn
// starts cold.
func TestCacheAffinityKeepsConversationsWarm(t *testing.T) {
	shares := map[string]float64{}
	for _, tt := range []struct {
		name, option string
		min          float64
	}{
		{"affinity", "", 0.95},
		{"off", "cache_affinity off", 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, b := newCachingChannel(), newCachingChannel()
			gateway(t, affinityChannels+tt.option, upstream(t, a).URL, upstream(t, b).URL)
			before := inputByClass(t)
			share, bill, cached, input := conversationTurns(t, uniqueName("warm "+tt.name), 20, 8, func(int) {})
			after := inputByClass(t)
			shares[tt.name] = share
			t.Logf("cache affinity %s: cache-read share %.1f%%, input bill %s a conversation (a served %d, b served %d)",
				tt.name, 100*share, bill, a.served.Load(), b.served.Load())
			if share < tt.min {
				t.Errorf("cache-read share %.1f%%, want at least %.0f%%", 100*share, 100*tt.min)
			}
			// The metric counts what the upstreams reported, every turn.
			read, plain := after["cache_read"]-before["cache_read"], after["plain"]-before["plain"]
			if read != float64(cached) || read+plain != float64(input) {
				t.Errorf("input_tokens_total: %v read, %v plain; the answers reported %d cached of %d", read, plain, cached, input)
			}
		})
	}
	if shares["affinity"] < shares["off"] {
		t.Errorf("affinity %.3f is worse than none %.3f", shares["affinity"], shares["off"])
	}
}

// A conversation pinned to a channel that fails moves at once. Under the
// cost policy it then stays on the channel that served it after the first
// one recovers as long as its cache makes it the cheaper for the turn
// (b at 1.5 times a's price, its cached prompt read at half that), and
// goes back once it does not (b at 10 times); each turn sent to b ahead
// of the chain's choice is journaled.
func TestCacheAffinityMovesWithFailover(t *testing.T) {
	for _, tt := range []struct {
		name, bCost string
		// aTurns are the turns a serves of six; the third fails on a.
		aTurns, bTurns, journaled int64
	}{
		{"warm b is cheaper", "1.5 1.5", 2, 4, 3},
		{"cold a is cheaper", "10 10", 5, 1, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, b := newCachingChannel(), newCachingChannel()
			gateway(t, strings.Replace(affinityChannels, "policy weighted\n\t\t\troute a\n\t\t\troute b", "route a cost 1 1\n\t\t\troute b cost "+tt.bCost, 1),
				upstream(t, a).URL, upstream(t, b).URL)
			journaled := affinityToB(t)
			turn := 0
			conversationTurns(t, uniqueName("moving "+tt.name), 1, 6, func(int) {
				turn++
				a.failing.Store(turn == 3) // a fails once: the third turn goes to b
			})
			if a.served.Load() != tt.aTurns || b.served.Load() != tt.bTurns {
				t.Fatalf("a served %d, b served %d; want %d and %d", a.served.Load(), b.served.Load(), tt.aTurns, tt.bTurns)
			}
			if got := affinityToB(t) - journaled; got != int(tt.journaled) {
				t.Errorf("%d cache_affinity decisions sent a turn to b ahead of a, want %d", got, tt.journaled)
			}
		})
	}
}

// affinityToB counts the journal's cache_affinity decisions that sent a
// turn of model m to b ahead of a.
func affinityToB(t *testing.T) int {
	t.Helper()
	var journaled failoverapp.DecisionsAnswer
	if err := adminGet(t, "/llm_failover/decisions?reason=cache_affinity", &journaled); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range journaled.Decisions {
		if d.Channel == "b" && d.Next == "a" && d.Model == "m" {
			n++
		}
	}
	return n
}

// inputByClass sums caddy_llm_failover_input_tokens_total of model m over
// its two channels, by class.
func inputByClass(t *testing.T) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, class := range []string{"plain", "cache_read"} {
		for _, ch := range []string{"a", "b"} {
			v, _ := brkMetric(t, fmt.Sprintf(`caddy_llm_failover_input_tokens_total{channel=%q,class=%q,model="m"}`, ch, class))
			out[class] += v
		}
	}
	return out
}

// A cache_affinity decision is made before the walk, with the request's
// whole deadline ahead of it: the journal's remaining budget says so,
// never a duration of minus 292 years.
func TestCacheAffinityDecisionRemainingBudget(t *testing.T) {
	a, b := newCachingChannel(), newCachingChannel()
	gateway(t, strings.Replace(affinityChannels, "policy weighted\n\t\t\troute a\n\t\t\troute b", "route a cost 1 1\n\t\t\troute b cost 1.5 1.5", 1),
		upstream(t, a).URL, upstream(t, b).URL)
	turn := 0
	conversationTurns(t, uniqueName("remaining"), 1, 4, func(int) {
		turn++
		a.failing.Store(turn == 2)
	})
	var journaled failoverapp.DecisionsAnswer
	if err := adminGet(t, "/llm_failover/decisions?reason=cache_affinity", &journaled); err != nil {
		t.Fatal(err)
	}
	if journaled.Total == 0 {
		t.Fatal("no cache_affinity decision journaled")
	}
	for _, d := range journaled.Decisions {
		if d.Remaining <= 0 || d.Remaining > 10*time.Minute {
			t.Errorf("cache_affinity decision at %s: remaining budget %s", d.At, d.Remaining)
		}
	}
}

// A channel whose base URL changes in a reload is a new channel
// (docs/configuration.md: identity is the name, the base URL and the
// credentials): the prompt cache its old upstream held is not at the new
// one, so a conversation pinned to the old channel must not be steered to
// the new one by its name. Here b (1.5 times a's price) served turns 3
// and 4 with its cache warm; the reload points b at another upstream,
// cold for this conversation, and the fifth turn must go to the chain's
// choice, a, rather than to the new b priced as if its cache were warm.
func TestCacheAffinityForgetsAChannelWhoseIdentityChanged(t *testing.T) {
	a, b, b2 := newCachingChannel(), newCachingChannel(), newCachingChannel()
	config := strings.Replace(affinityChannels, "policy weighted\n\t\t\troute a\n\t\t\troute b", "route a cost 1 1\n\t\t\troute b cost 1.5 1.5", 1)
	aURL, b2URL := upstream(t, a).URL, upstream(t, b2).URL
	gateway(t, config, aURL, upstream(t, b).URL)
	turn := 0
	conversationTurns(t, uniqueName("identity"), 1, 5, func(int) {
		turn++
		a.failing.Store(turn == 3) // the third turn goes to b, which keeps the next
		if turn == 5 {
			gateway(t, config, aURL, b2URL)
		}
	})
	if a.served.Load() != 3 || b.served.Load() != 2 || b2.served.Load() != 0 {
		t.Fatalf("a served %d, b (old URL) %d, b (new URL, cold cache) %d; want 3, 2 and 0: "+
			"the pin of the old b was applied to the new channel of the same name",
			a.served.Load(), b.served.Load(), b2.served.Load())
	}
}
