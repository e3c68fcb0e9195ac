package llmfailover

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/llmfailover/caddy-llm-failover/failover"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	d := caddyfile.NewTestDispenser(`llm_failover {
		channel a https://api.example.com {
			header Authorization "Bearer {env.KEY}"
			transport http {
				dial_timeout 2s
			}
		}
		channel b http://127.0.0.1:9000
		model gpt {
			policy weighted
			route b cost 0.30 1.20 upstream_model gpt-2024 weight 80
			route a cost 0.15 0.60 weight 100
			price 1 2
			max_output_tokens 4096
			max_input_tokens 128000
		}
		max_hops 2
		header_timeout 30s
		deadline 90s
		first_byte_timeout 500ms
		max_request_body 2MiB
		max_response_body 1MB
		retry_status 429 503
		stream_gate 5s failover
		stream_idle_timeout 20s
		breaker {
			window 1m
			failures 5
			cooldown 10s
			ratio 50 0.25
			max_park 2m
		}
		wallet billing {
			on_store_error allow
			account {http.auth.user.id}
		}
	}`)
	var h Handler
	if err := h.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	if len(h.Channels) != 2 || h.Channels[0].Headers["Authorization"] != "Bearer {env.KEY}" || h.Channels[0].TransportRaw == nil {
		t.Fatalf("channels: %+v", h.Channels[0])
	}
	var tr map[string]any
	if err := json.Unmarshal(h.Channels[0].TransportRaw, &tr); err != nil || tr["protocol"] != "http" || tr["dial_timeout"] != float64(2*time.Second) {
		t.Fatalf("transport: %s", h.Channels[0].TransportRaw)
	}
	m := h.Models[0]
	if m.Policy != "weighted" || len(m.Routes) != 2 || m.Routes[0].UpstreamModel != "gpt-2024" || m.Routes[0].Weight != 80 ||
		m.Routes[1].Cost.Input != "0.15" || m.Price.Output != "2" || m.MaxOutputTokens != 4096 || m.MaxInputTokens != 128000 {
		t.Fatalf("model: %+v routes %+v", m, m.Routes)
	}
	if h.MaxHops != 2 || h.HeaderTimeout != caddy.Duration(30*time.Second) || h.Deadline != caddy.Duration(90*time.Second) ||
		h.FirstByteTimeout != caddy.Duration(500*time.Millisecond) || h.MaxRequestBody != 2<<20 || h.MaxResponseBody != 1e6 ||
		len(h.RetryStatus) != 2 || h.StreamGate.Timeout != caddy.Duration(5*time.Second) || !h.StreamGate.Failover ||
		h.StreamIdleTimeout != caddy.Duration(20*time.Second) {
		t.Fatalf("options: %+v", h)
	}
	b := h.Breaker
	if b.Window != caddy.Duration(time.Minute) || b.Failures != 5 || b.Cooldown != caddy.Duration(10*time.Second) ||
		b.Ratio.MinCalls != 50 || b.Ratio.FailureRatio != 0.25 || b.MaxPark != caddy.Duration(2*time.Minute) {
		t.Fatalf("breaker: %+v", b)
	}
	w := h.Wallet
	if w.Name != "billing" || w.OnStoreError != "allow" || w.Account != "{http.auth.user.id}" {
		t.Fatalf("wallet: %+v", w)
	}
}

func TestUnmarshalCaddyfileErrors(t *testing.T) {
	cases := map[string]string{
		"argument on directive":     `llm_failover foo`,
		"unknown subdirective":      `llm_failover { bogus 1 }`,
		"channel without name":      `llm_failover { channel }`,
		"channel with extra arg":    `llm_failover { channel a http://x:1 http://y:2 }`,
		"provider without name":     `llm_failover { channel a { provider } }`,
		"provider twice":            "llm_failover { channel a {\nprovider openai\nprovider anthropic\n} }",
		"unknown provider":          `llm_failover { channel a { provider gemini } }`,
		"provider extra arg":        `llm_failover { channel a { provider anthropic 2023-06-01 } }`,
		"duplicate channel":         `llm_failover { channel a http://x:1 ; channel a http://y:1 }`,
		"unknown channel option":    `llm_failover { channel a http://x:1 { nope } }`,
		"header needs two args":     `llm_failover { channel a http://x:1 { header X } }`,
		"transport twice":           "llm_failover { channel a http://x:1 {\ntransport http\ntransport http\n} }",
		"unknown transport":         `llm_failover { channel a http://x:1 { transport carrier_pigeon } }`,
		"model without name":        `llm_failover { model }`,
		"model without routes":      `llm_failover { model m { policy cost } }`,
		"duplicate model":           "llm_failover {\nmodel m {\nroute a\n}\nmodel m {\nroute a\n}\n}",
		"unknown policy":            `llm_failover { model m { policy random } }`,
		"route twice":               "llm_failover { model m {\nroute a\nroute a\n} }",
		"unknown route option":      `llm_failover { model m { route a speed 3 } }`,
		"bad cost":                  `llm_failover { model m { route a cost 1.2.3 4 } }`,
		"cost missing output":       `llm_failover { model m { route a cost 1 } }`,
		"negative price":            `llm_failover { model m { route a ; price -1 2 } }`,
		"max_input_tokens zero":     `llm_failover { model m { route a ; max_input_tokens 0 } }`,
		"max_input_tokens two args": `llm_failover { model m { route a ; max_input_tokens 1 2 } }`,
		"bad weight":                `llm_failover { model m { route a weight zero } }`,
		"unknown model option":      `llm_failover { model m { route a ; fallback b } }`,
		"bad duration":              `llm_failover { header_timeout soon }`,
		"negative duration":         `llm_failover { deadline -5s }`,
		"duration extra arg":        `llm_failover { deadline 5s 6s }`,
		"max_hops zero":             `llm_failover { max_hops 0 }`,
		"max_hops twice":            "llm_failover {\nmax_hops 2\nmax_hops 3\n}",
		"bad size":                  `llm_failover { max_request_body lots }`,
		"bad retry status":          `llm_failover { retry_status 503 abc }`,
		"retry status out of range": `llm_failover { retry_status 99 }`,
		"retry status empty":        `llm_failover { retry_status }`,
		"stream_gate bad option":    `llm_failover { stream_gate 5s commit }`,
		"unknown breaker option":    `llm_failover { breaker { threshold 3 } }`,
		"breaker bad ratio":         `llm_failover { breaker { ratio 10 1.5 } }`,
		"breaker ratio missing":     `llm_failover { breaker { ratio 10 } }`,
		"old wallet sqlite form":    `llm_failover { wallet sqlite /tmp/w.db }`,
		"old wallet postgres form":  `llm_failover { wallet postgres {env.DATABASE_URL} }`,
		"wallet with two names":     `llm_failover { wallet a b }`,
		"reservation_ttl moved":     `llm_failover { wallet { reservation_ttl 5m } }`,
		"wallet option twice":       "llm_failover { wallet {\naccount a\naccount b\n} }",
		"bad on_store_error":        `llm_failover { wallet { on_store_error maybe } }`,
		"unknown wallet option":     `llm_failover { wallet { currency eur } }`,
		// 0 would silently mean the default (240 s), not "none".
		"header_timeout 0":        `llm_failover { header_timeout 0 }`,
		"stream_idle_timeout 0s":  `llm_failover { stream_idle_timeout 0s }`,
		"breaker cooldown 0":      `llm_failover { breaker { cooldown 0 } }`,
		"adaptive unknown":        `llm_failover { adaptive_deadlines { speed 3 } }`,
		"adaptive quantile 1":     `llm_failover { adaptive_deadlines { quantile 1 } }`,
		"adaptive quantile p100":  `llm_failover { adaptive_deadlines { quantile p100 } }`,
		"adaptive factor below 1": `llm_failover { adaptive_deadlines { factor 0.5 } }`,
		"adaptive argument":       `llm_failover { adaptive_deadlines on }`,
		"hedge budget no percent": `llm_failover { hedge { budget 5 } }`,
		"hedge budget over 100%":  "llm_failover {\nchannel a http://x:1\nchannel b http://y:1\nmodel m {\nroute a\nroute b\n}\nhedge {\nbudget 150%\n}\n}",
		"hedge charge unknown":    "llm_failover {\nchannel a http://x:1\nchannel b http://y:1\nmodel m {\nroute a\nroute b\n}\nhedge {\ncharge nobody\n}\n}",
		"hedge unknown option":    `llm_failover { hedge { max 3 } }`,
		"hedge_after one route":   "llm_failover {\nchannel a http://x:1\nmodel m {\nroute a\nhedge_after 1s\n}\n}",
		"hedge_after bad":         "llm_failover {\nchannel a http://x:1\nchannel b http://y:1\nmodel m {\nroute a\nroute b\nhedge_after soon\n}\n}",
		"hedge_after zero":        "llm_failover {\nchannel a http://x:1\nchannel b http://y:1\nmodel m {\nroute a\nroute b\nhedge_after 0s\n}\n}",
		"hedge_after p0":          "llm_failover {\nchannel a http://x:1\nchannel b http://y:1\nmodel m {\nroute a\nroute b\nhedge_after p0\n}\n}",
	}
	for name, input := range cases {
		t.Run(name, func(t *testing.T) {
			var h Handler
			// One directive per line, as in a real Caddyfile.
			input = strings.NewReplacer(" ; ", "\n", "{ ", "{\n", " }", "\n}").Replace(input)
			err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
			if err == nil {
				t.Fatalf("no error for %q", input)
			}
			if !strings.Contains(err.Error(), "Testfile:") {
				t.Errorf("error does not say where: %v", err)
			}
		})
	}
}

// TestProvisionErrors covers JSON configs, which no Caddyfile parser has
// checked: Provision runs the same checks.
func TestProvisionErrors(t *testing.T) {
	cases := map[string]string{
		"route to unknown channel": `{"channels":[{"name":"a","base_url":"http://x:1"}],"models":[{"name":"m","routes":[{"channel":"b"}]}]}`,
		"relative base url":        `{"channels":[{"name":"a","base_url":"/v1"}],"models":[{"name":"m","routes":[{"channel":"a"}]}]}`,
		"ftp base url":             `{"channels":[{"name":"a","base_url":"ftp://x"}],"models":[{"name":"m","routes":[{"channel":"a"}]}]}`,
		"duplicate channel":        `{"channels":[{"name":"a","base_url":"http://x:1"},{"name":"a","base_url":"http://x:2"}],"models":[{"name":"m","routes":[{"channel":"a"}]}]}`,
		"bad retry status":         `{"retry_status":[700],"channels":[{"name":"a","base_url":"http://x:1"}],"models":[{"name":"m","routes":[{"channel":"a"}]}]}`,
		"bad breaker":              `{"breaker":{"failures":1000},"channels":[{"name":"a","base_url":"http://x:1"}],"models":[{"name":"m","routes":[{"channel":"a"}]}]}`,
		"unknown policy":           `{"channels":[{"name":"a","base_url":"http://x:1"}],"models":[{"name":"m","policy":"random","routes":[{"channel":"a"}]}]}`,
		"bad price":                `{"channels":[{"name":"a","base_url":"http://x:1"}],"models":[{"name":"m","price":{"input":"x","output":"1"},"routes":[{"channel":"a"}]}]}`,
		"unknown json field":       `{"chanels":[]}`,
		"negative deadline":        `{"deadline":-1,"channels":[{"name":"a","base_url":"http://x:1"}],"models":[{"name":"m","routes":[{"channel":"a"}]}]}`,
		"negative response cap":    `{"max_response_body":-5,"channels":[{"name":"a","base_url":"http://x:1"}],"models":[{"name":"m","routes":[{"channel":"a"}]}]}`,
		"negative weight":          `{"channels":[{"name":"a","base_url":"http://x:1"}],"models":[{"name":"m","routes":[{"channel":"a","weight":-1}]}]}`,
		"doubled /v1":              `{"channels":[{"name":"a","base_url":"http://x:1/v1"}],"models":[{"name":"m","routes":[{"channel":"a"}]}]}`,
		"model without routes":     `{"channels":[{"name":"a","base_url":"http://x:1"}],"models":[{"name":"m"}]}`,
		"openai without base url":  `{"channels":[{"name":"a"}],"models":[{"name":"m","routes":[{"channel":"a"}]}]}`,
		"unknown provider":         `{"channels":[{"name":"a","base_url":"http://x:1","provider":{"name":"no-such-provider"}}],"models":[{"name":"m","routes":[{"channel":"a"}]}]}`,
		"negative max_input":       `{"channels":[{"name":"a","base_url":"http://x:1"}],"models":[{"name":"m","max_input_tokens":-1,"routes":[{"channel":"a"}]}]}`,
		"huge max_input":           `{"channels":[{"name":"a","base_url":"http://x:1"}],"models":[{"name":"m","max_input_tokens":100000001,"routes":[{"channel":"a"}]}]}`,
		"bad cache_affinity":       `{"cache_affinity":"forever","channels":[{"name":"a","base_url":"http://x:1"}],"models":[{"name":"m","routes":[{"channel":"a"}]}]}`,
		"zero cache_affinity":      `{"cache_affinity":"0s","channels":[{"name":"a","base_url":"http://x:1"}],"models":[{"name":"m","routes":[{"channel":"a"}]}]}`,
		"bad cache price":          `{"channels":[{"name":"a","base_url":"http://x:1"}],"models":[{"name":"m","price":{"input":"1","output":"1","cache_read":"x"},"routes":[{"channel":"a"}]}]}`,
	}
	for name, cfg := range cases {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := provisionContext(t)
			defer cancel()
			_, err := ctx.LoadModuleByID("http.handlers.llm_failover", json.RawMessage(cfg))
			if err == nil {
				t.Fatalf("config loaded: %s", cfg)
			}
		})
	}
}

// TestCaddyfileMistakesNameTheLine: a mistake found when the Caddyfile is
// parsed names the option the user wrote and the line they wrote it on.
func TestCaddyfileMistakesNameTheLine(t *testing.T) {
	const good = `
		channel a http://127.0.0.1:9000
		model m {
			route a
		}`
	cases := []struct{ name, body, want string }{
		{"route to unknown channel", `
		channel a http://127.0.0.1:9000
		model m {
			route a
			route nosuch cost 1 2
		}`, `model "m": route to unknown channel "nosuch", at Testfile:5`},
		{"model without routes", `
		channel a http://127.0.0.1:9000
		model m {
			price 1 2
		}`, `model "m" has no routes, at Testfile:3`},
		{"channel routed twice", `
		channel a http://127.0.0.1:9000
		model m {
			route a
			route a cost 1 2
		}`, `model "m" routes channel "a" twice, at Testfile:5`},
		{"unknown openai continuation", `
		channel a http://127.0.0.1:9000 {
			provider openai {
				continuation on
			}
		}
		model m {
			route a
		}`, `channel "a": provider: openai: continuation "on": want one of instructed, prefix, continue_final_message, prefill, off, at Testfile:2`},
		{"misspelt provider", `
		channel a http://127.0.0.1:9000 {
			provider vertx
		}
		model m {
			route a
		}`, `channel "a": unknown provider "vertx": the providers are anthropic, azure, bedrock, gemini, openai, vertex, at Testfile:3`},
		{"misspelt transport", `
		channel a http://127.0.0.1:9000 {
			transport htpp
		}
		model m {
			route a
		}`, `channel "a": unknown transport "htpp": the transports are fastcgi, http, at Testfile:3`},
		{"channel defined twice", good + `
		channel a http://127.0.0.1:9001`, `channel "a" is defined twice, at Testfile:6`},
		{"repeated breaker option", good + `
		breaker {
			failures 3
			failures 4
		}`, `breaker: failures specified more than once (first at Testfile:7), at Testfile:8`},
		{"repeated wallet option", good + `
		wallet {
			account {http.auth.user.id}
			account {http.auth.user.id}
		}`, `wallet: account specified more than once (first at Testfile:7), at Testfile:8`},
		{"repeated hedge option", good + `
		hedge {
			budget 5%
			budget 50%
		}`, `hedge: budget specified more than once (first at Testfile:7), at Testfile:8`},
		{"repeated adaptive_deadlines option", good + `
		adaptive_deadlines {
			floor 5s
			floor 1s
		}`, `adaptive_deadlines: floor specified more than once (first at Testfile:7), at Testfile:8`},
		{"repeated idempotency option", good + `
		idempotency {
			retention 5m
			retention 1m
		}`, `idempotency: retention specified more than once (first at Testfile:7), at Testfile:8`},
		{"repeated model option", `
		channel a http://127.0.0.1:9000
		model m {
			route a
			price 1 2
			price 1 3
		}`, `model "m": price specified more than once (first at Testfile:5), at Testfile:6`},
		{"cost names itself", `
		channel a http://127.0.0.1:9000
		model m {
			route a cost 0.15
		}`, `cost needs <input_per_mtok> <output_per_mtok>, at Testfile:4`},
		{"bad cost names the route", `
		channel a http://127.0.0.1:9000
		model m {
			route a cost 0.15 x
		}`, `model "m": route a: cost: output price`},
		{"base URL doubling /v1", `
		channel a http://127.0.0.1:9000/api/v1
		model m {
			route a
		}`, `channel "a": base URL "http://127.0.0.1:9000/api/v1": its path ends in /v1, which client paths such as /v1/chat/completions already begin with: drop the /v1, at Testfile:2`},
		{"negative duration", good + `
		deadline -5s`, `deadline`},
		{"bad retry status", good + `
		retry_status 429 700`, `retry_status: 700 is not an HTTP status code, at Testfile:6`},
		{"bad on_store_error", good + `
		wallet {
			on_store_error maybe
		}`, `wallet: on_store_error: want deny or allow, got "maybe", at Testfile:6`},
		{"unknown policy", `
		channel a http://127.0.0.1:9000
		model m {
			policy random
			route a
		}`, `unknown policy "random"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := caddyfile.NewTestDispenser("llm_failover {" + tc.body + "\n}")
			err := new(Handler).UnmarshalCaddyfile(d)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want error containing %q, got %v", tc.want, err)
			}
		})
	}
}

// TestCaddyfileAdapt compares `caddy adapt` output with golden files: the
// Caddyfile above the ---------- line, the JSON (or an error substring)
// below it.
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob("testdata/caddyfile_adapt/*.caddyfiletest")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			parts := strings.SplitN(string(data), "----------", 2)
			input, expected := strings.TrimSpace(parts[0])+"\n", strings.TrimSpace(parts[1])
			if strings.HasPrefix(expected, "{") {
				if !caddytest.CompareAdapt(t, f, input, "caddyfile", expected) {
					t.Fatal("adapted JSON differs")
				}
				return
			}
			_, _, err = caddyconfig.GetAdapter("caddyfile").Adapt([]byte(input), nil)
			if err == nil || !strings.Contains(err.Error(), expected) {
				t.Fatalf("want error containing %q, got %v", expected, err)
			}
		})
	}
}

// TestExampleAdapts keeps Caddyfile.example valid.
func TestExampleAdapts(t *testing.T) {
	data, err := os.ReadFile("Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(data, map[string]any{"filename": "Caddyfile.example"})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range warnings {
		t.Errorf("warning: %s", w)
	}
	if !strings.Contains(string(out), `"handler":"llm_failover"`) {
		t.Fatalf("no llm_failover handler in %s", out)
	}
}

func TestRetrySameCaddyfile(t *testing.T) {
	parse := func(opt string) (*Handler, error) {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("llm_failover {\n channel a http://127.0.0.1:1\n model m {\n route a\n }\n " + opt + "\n}"))
		return &h, err
	}
	h, err := parse("retry_same 500 502 429 max_wait 2s")
	if err != nil {
		t.Fatal(err)
	}
	if r := h.RetrySame; r == nil || len(r.Statuses) != 3 || time.Duration(r.MaxWait) != 2*time.Second {
		t.Fatalf("parsed %+v", h.RetrySame)
	}
	for opt, want := range map[string]string{
		"retry_same":                     "at least one status",
		"retry_same soon":                "not an HTTP status code",
		"retry_same 429":                 "429 needs max_wait",
		"retry_same 404":                 "not a retry_status",
		"retry_same 500 max_wait":        "wrong argument count",
		"retry_same 500 max_wait 1s 502": "wrong argument count",
	} {
		if _, err := parse(opt); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", opt, err, want)
		}
	}
}

func TestStreamHeaderTimeoutDefaultsAndNeverExceedsHeaderTimeout(t *testing.T) {
	for _, c := range []struct {
		name, cfg, path string
		stream          bool
		want            time.Duration
	}{
		{"stream default", "", "/v1/chat/completions", true, failover.DefaultStreamHeaderTimeout},
		{"non-stream default", "", "/v1/chat/completions", false, failover.DefaultHeaderTimeout},
		{"gemini stream path", "", "/v1beta/models/g:streamGenerateContent", false, failover.DefaultStreamHeaderTimeout},
		{"stream set", "stream_header_timeout 5s", "/v1/messages", true, 5 * time.Second},
		{"header shorter", "header_timeout 2s", "/v1/messages", true, 2 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := caddyfile.NewTestDispenser("llm_failover {\n channel a http://127.0.0.1:1\n model m {\n route a\n }\n " + c.cfg + "\n}")
			var h Handler
			if err := h.UnmarshalCaddyfile(d); err != nil {
				t.Fatal(err)
			}
			plan, err := compile(&h)
			if err != nil {
				t.Fatal(err)
			}
			streaming := provider.Streaming(c.path, provider.Request{Stream: c.stream})
			if got := plan.Options.HeaderTimeoutFor(streaming); got != c.want {
				t.Errorf("header timeout = %s, want %s", got, c.want)
			}
		})
	}
}

// provisionContext is a caddy.Context for loading a handler outside a
// running Caddy: it has a config, which handlers need to get the
// llm_failover app (a bare caddy.NewContext has none).
func provisionContext(t testing.TB) (caddy.Context, context.CancelFunc) {
	t.Helper()
	base, err := caddy.ProvisionContext(&caddy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return caddy.NewContext(base)
}

// A price, and a route's cost, take the prompt-cache classes after the
// two plain prices; a route's other options still follow its cost.
func TestPriceCacheClassesCaddyfile(t *testing.T) {
	var h Handler
	err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(`llm_failover {
		channel a http://127.0.0.1:1
		model m {
			policy weighted
			route a cost 1 2 cache_read 0.1 upstream_model m-1 weight 2
			price 3 15 cache_read 0.3 cache_write 3.75 cache_write_1h 6
		}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	m := h.Models[0]
	if got := *m.Price; got != (Price{Input: "3", Output: "15", CacheRead: "0.3", CacheWrite: "3.75", CacheWrite1h: "6"}) {
		t.Errorf("price %+v", got)
	}
	r := m.Routes[0]
	if *r.Cost != (Price{Input: "1", Output: "2", CacheRead: "0.1"}) || r.UpstreamModel != "m-1" || r.Weight != 2 {
		t.Errorf("route %+v cost %+v", r, *r.Cost)
	}
}

// adaptive_deadlines, hedge and hedge_after reach the engine's plan with
// their defaults filled.
func TestAdaptiveAndHedgeCompile(t *testing.T) {
	input := `llm_failover {
		channel a http://x:1
		channel b http://y:1
		model m {
			route a
			route b
			hedge_after p95
		}
		model n {
			route a
			route b
			hedge_after 800ms
		}
		adaptive_deadlines {
			quantile p99.9
			factor 4
			floor 2s
			min_samples 20
		}
		hedge {
			budget 2.5%
			charge client
		}
	}`
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input)); err != nil {
		t.Fatal(err)
	}
	p, err := compile(&h)
	if err != nil {
		t.Fatal(err)
	}
	a := p.Options.Adaptive
	if a == nil || math.Abs(a.Quantile-0.999) > 1e-9 || a.Factor != 4 || a.Floor != 2*time.Second || a.MinSamples != 20 ||
		a.StallFloor != 20*time.Second || a.Window != 30*time.Minute {
		t.Errorf("adaptive %+v", a)
	}
	if o := p.Options.Hedge; o.Budget != 0.025 || !o.ChargeClient {
		t.Errorf("hedge %+v", o)
	}
	if m := p.Models[0].Hedge; m == nil || m.Quantile != 0.95 || m.After != 0 {
		t.Errorf("model m hedge %+v", m)
	}
	if m := p.Models[1].Hedge; m == nil || m.After != 800*time.Millisecond {
		t.Errorf("model n hedge %+v", m)
	}
	// Off unless asked for.
	var plain Handler
	if err := plain.UnmarshalCaddyfile(caddyfile.NewTestDispenser("llm_failover {\nchannel a http://x:1\nmodel m {\nroute a\n}\n}")); err != nil {
		t.Fatal(err)
	}
	if p, _ := compile(&plain); p.Options.Adaptive != nil || p.Models[0].Hedge != nil || p.Options.Hedge.Budget != 0.05 {
		t.Errorf("defaults: adaptive %+v, hedge %+v, budget %v", p.Options.Adaptive, p.Models[0].Hedge, p.Options.Hedge.Budget)
	}
}

// TestSilentSettingsRefused: a setting the gateway would silently ignore
// (or turn into another) is a config error naming its line, in the
// Caddyfile and, where JSON can say it, in JSON.
func TestSilentSettingsRefused(t *testing.T) {
	const two = `
		channel a http://127.0.0.1:9000
		channel b http://127.0.0.1:9001`
	cases := []struct{ name, body, want string }{
		// 0% parses to 0, which the JSON reads as "the default": 5%.
		{"hedge budget 0%", two + `
		model m {
			route a
			route b
			hedge_after 1s
		}
		hedge {
			budget 0%
		}`, "Testfile:"},
		// A hedge is the model's second candidate; with max_hops 1 there is none.
		{"hedge_after with max_hops 1", two + `
		model m {
			route a
			route b
			hedge_after 1s
		}
		max_hops 1`, "Testfile:"},
		// Probes are charged to probe_account only with a wallet.
		{"probe_account without a wallet", two + `
		model m {
			route a
			probe
		}
		probe_account ops`, "Testfile:8"},
		// weight orders nothing under policy cost.
		{"weight under policy cost", two + `
		model m {
			route a weight 80
			route b weight 20
		}`, "Testfile:5"},
		// The request's URL is built from the base's scheme, host and
		// path: a userinfo would never be sent.
		{"base URL with userinfo", `
		channel a http://user:secret@127.0.0.1:9000
		model m {
			route a
		}`, "Testfile:2"},
		// Azure builds its own query: the base's would never be sent.
		{"azure base URL with a query", `
		channel a https://r.openai.azure.com?api-version=2024-10-21 {
			provider azure
		}
		model m {
			route a
		}`, "Testfile:2"},
		{"channel header repeated", `
		channel a http://127.0.0.1:9000 {
			header Authorization "Bearer one"
			header authorization "Bearer two"
		}
		model m {
			route a
		}`, "Testfile:4"},
		{"route option repeated", `
		channel a http://127.0.0.1:9000
		model m {
			route a upstream_model m-2024 upstream_model m-2025
		}`, "Testfile:4"},
		{"provider option repeated", `
		channel a https://r.openai.azure.com {
			provider azure {
				api_key one
				api_key two
			}
		}
		model m {
			route a
		}`, "Testfile:5"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := caddyfile.NewTestDispenser("llm_failover {" + tc.body + "\n}")
			err := new(Handler).UnmarshalCaddyfile(d)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want an error naming %q, got %v", tc.want, err)
			}
		})
	}
}

// TestSilentSettingsRefusedJSON: the same mistakes in a JSON config,
// which no Caddyfile parser checked.
func TestSilentSettingsRefusedJSON(t *testing.T) {
	const two = `"channels":[{"name":"a","base_url":"http://x:1"},{"name":"b","base_url":"http://y:1"}]`
	cases := map[string]string{
		"hedge_after with max_hops 1":    `{"max_hops":1,` + two + `,"models":[{"name":"m","hedge_after":"1s","routes":[{"channel":"a"},{"channel":"b"}]}]}`,
		"weight under policy cost":       `{` + two + `,"models":[{"name":"m","routes":[{"channel":"a","weight":80},{"channel":"b","weight":20}]}]}`,
		"probe_account without a wallet": `{"probe_account":"ops",` + two + `,"models":[{"name":"m","probe":{},"routes":[{"channel":"a"}]}]}`,
		"base URL with userinfo":         `{"channels":[{"name":"a","base_url":"http://u:p@x:1"}],"models":[{"name":"m","routes":[{"channel":"a"}]}]}`,
		"azure base URL with a query":    `{"channels":[{"name":"a","base_url":"https://r.openai.azure.com?api-version=2024-10-21","provider":{"name":"azure"}}],"models":[{"name":"m","routes":[{"channel":"a"}]}]}`,
		"headers differing in case":      `{"channels":[{"name":"a","base_url":"http://x:1","headers":{"Authorization":"one","authorization":"two"}}],"models":[{"name":"m","routes":[{"channel":"a"}]}]}`,
	}
	for name, cfg := range cases {
		t.Run(name, func(t *testing.T) {
			var h Handler
			if err := json.Unmarshal([]byte(cfg), &h); err != nil {
				t.Fatal(err)
			}
			if _, err := compile(&h); err == nil {
				t.Fatalf("config compiled: %s", cfg)
			}
		})
	}
}

// TestNotANumberRefused: strconv.ParseFloat reads "NaN" (and "Inf"),
// which every "< 0" or ">= 1" range check lets through; a NaN quantile,
// factor or budget would make every learned deadline or hedge budget
// meaningless.
func TestNotANumberRefused(t *testing.T) {
	const two = "channel a http://x:1\nchannel b http://y:1\n"
	for name, input := range map[string]string{
		"adaptive quantile NaN":  "adaptive_deadlines {\nquantile NaN\n}",
		"adaptive quantile pNaN": "adaptive_deadlines {\nquantile pNaN\n}",
		"adaptive factor NaN":    "adaptive_deadlines {\nfactor NaN\n}",
		"adaptive factor Inf":    "adaptive_deadlines {\nfactor Inf\n}",
		"hedge budget NaN%":      "hedge {\nbudget NaN%\n}",
		"hedge_after pNaN":       "",
	} {
		t.Run(name, func(t *testing.T) {
			model := "model m {\nroute a\nroute b\n}\n"
			if input == "" {
				model = "model m {\nroute a\nroute b\nhedge_after pNaN\n}\n"
			}
			var h Handler
			err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("llm_failover {\n" + two + model + input + "\n}"))
			if err == nil || !strings.Contains(err.Error(), "Testfile:") {
				t.Fatalf("want an error naming the line, got %v", err)
			}
		})
	}
	// JSON cannot carry NaN, but an adaptive factor of 1e308 overflows
	// every deadline it multiplies just the same.
}

// TestProvisionNullElements: a JSON config with a null channel or model
// (a generator's hole, a stray comma fixed by hand) is refused with an
// error, not a nil-pointer panic that takes the config load (or caddy
// run) down with it.
func TestProvisionNullElements(t *testing.T) {
	for name, cfg := range map[string]string{
		"null channel": `{"channels":[null,{"name":"a","base_url":"http://x:1"}],"models":[{"name":"m","routes":[{"channel":"a"}]}]}`,
		"null model":   `{"channels":[{"name":"a","base_url":"http://x:1"}],"models":[null,{"name":"m","routes":[{"channel":"a"}]}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := provisionContext(t)
			defer cancel()
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("panic: %v", p)
					}
				}()
				_, err = ctx.LoadModuleByID("http.handlers.llm_failover", json.RawMessage(cfg))
			}()
			if err == nil {
				t.Fatalf("config loaded: %s", cfg)
			}
		})
	}
}

// TestChannelHeaderChecked: a header field name or value Go's HTTP client
// refuses to send makes every request to the channel fail (and its
// breaker open) at run time; the config is refused when it loads instead.
// A value's {env.*} is checked once resolved: a key read with its
// trailing newline is the usual way in.
func TestChannelHeaderChecked(t *testing.T) {
	err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser("llm_failover {\nchannel a http://127.0.0.1:9000 {\nheader \"X Api Key\" secret\n}\nmodel m {\nroute a\n}\n}"))
	if err == nil || !strings.Contains(err.Error(), "Testfile:") {
		t.Errorf("a field name with spaces: %v", err)
	}
	t.Setenv("LLMF_TEST_KEY_WITH_NEWLINE", "sk-123\n")
	for name, cfg := range map[string]string{
		"field name": `{"channels":[{"name":"a","base_url":"http://x:1","headers":{"X Api Key":"secret"}}],"models":[{"name":"m","routes":[{"channel":"a"}]}]}`,
		"value":      `{"channels":[{"name":"a","base_url":"http://x:1","headers":{"Authorization":"Bearer {env.LLMF_TEST_KEY_WITH_NEWLINE}"}}],"models":[{"name":"m","routes":[{"channel":"a"}]}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := provisionContext(t)
			defer cancel()
			if _, err := ctx.LoadModuleByID("http.handlers.llm_failover", json.RawMessage(cfg)); err == nil {
				t.Fatalf("config loaded: %s", cfg)
			} else if strings.Contains(err.Error(), "sk-123") {
				t.Fatalf("the error shows the key: %v", err)
			}
		})
	}
}

// A base URL's query may hold a key (Gemini's keys are commonly written
// ?key=..., and providers that build their own query refuse one for that
// reason), and its userinfo is a credential: the errors refusing such a
// base URL, which `caddy validate`, the load error and CI logs print,
// never quote either, from the Caddyfile or from JSON.
func TestBaseURLErrorsQuoteNoCredential(t *testing.T) {
	const secret = "AIzaSyQuerySecret0123456789abcdefghij"
	cases := map[string]struct{ caddyfile, json string }{
		"gemini base URL with a key": {
			"channel a https://generativelanguage.googleapis.com?key=" + secret + " {\nprovider gemini {\napi_key k\n}\n}",
			`{"channels":[{"name":"a","base_url":"https://generativelanguage.googleapis.com?key=` + secret + `","provider":{"name":"gemini","api_key":"k"}}],"models":[{"name":"m","routes":[{"channel":"a"}]}]}`,
		},
		"azure base URL with a key": {
			"channel a https://r.openai.azure.com?api-key=" + secret + " {\nprovider azure\n}",
			`{"channels":[{"name":"a","base_url":"https://r.openai.azure.com?api-key=` + secret + `","provider":{"name":"azure"}}],"models":[{"name":"m","routes":[{"channel":"a"}]}]}`,
		},
		"openai base URL ending in /v1 with a key": {
			"channel a https://llm.example/v1?key=" + secret,
			`{"channels":[{"name":"a","base_url":"https://llm.example/v1?key=` + secret + `"}],"models":[{"name":"m","routes":[{"channel":"a"}]}]}`,
		},
		"userinfo on a scheme that is not http": {
			"channel a ftp://user:" + secret + "@llm.example",
			`{"channels":[{"name":"a","base_url":"ftp://user:` + secret + `@llm.example"}],"models":[{"name":"m","routes":[{"channel":"a"}]}]}`,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser("llm_failover {\n" + tc.caddyfile + "\nmodel m {\nroute a\n}\n}"))
			if err == nil {
				t.Fatal("Caddyfile: the base URL was accepted")
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("Caddyfile error quotes the credential: %v", err)
			}
			var h Handler
			if err := json.Unmarshal([]byte(tc.json), &h); err != nil {
				t.Fatal(err)
			}
			_, err = compile(&h)
			if err == nil {
				t.Fatal("JSON: the base URL was accepted")
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("JSON config error quotes the credential: %v", err)
			}
		})
	}
}
