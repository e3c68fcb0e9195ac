//go:build linux

package soak

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/fakeproviders"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// The soak's timings, shorter than the defaults so that a minute holds
// many breaker cycles, idle timeouts, sweeps and lease expiries. Each is
// what it is for a reason given next to it.
const (
	// leaseTTL and reservationTTL: the end of the run checks that nothing
	// is reserved once lease_ttl has passed; a short one keeps that wait
	// short, and the killed instance's leases expire during the run.
	leaseTTL       = 2 * time.Second
	reservationTTL = 3 * time.Second
	// reloadGrace is grace_period: how long an old server finishes its
	// streams after a reload. A stuck one is then cut, and a request on a
	// pooled connection it still holds may fail until then.
	reloadGrace = 5 * time.Second
	// idleTimeout is stream_idle_timeout; stallFor, the stall fault's
	// silence, must be longer so that the gateway notices the stall.
	idleTimeout = 2 * time.Second
	stallFor    = 4 * time.Second
	// pace is the delay between the frames a front relays: a stream lasts
	// a few hundred milliseconds, long enough for reloads, the kill and
	// the database faults to catch streams in flight.
	pace = 25 * time.Millisecond
)

// upstreams are the fakes, each behind a fault front.
type upstreams struct {
	oa, oa2, oa3, an, long *fu.Server
	az                     *fakeproviders.Azure
	gm                     *fakeproviders.Gemini
	vx                     *fakeproviders.Vertex
	br                     *fakeproviders.Bedrock
	saPath                 string
	// fronts, by channel name, in the order the fault schedule walks.
	fronts []*front
	byName map[string]*front
}

// longPieces is the slow client's answer: about 300 KB of SSE, far more
// than loopback socket buffers hold once the reader's window is small, so
// the gateway's writes wait for the reader.
var longPieces = func() []string {
	p := make([]string, 1200)
	for i := range p {
		p[i] = fmt.Sprintf(" piece %04d %s", i, strings.Repeat("x", 100))
	}
	return p
}()

func startUpstreams(t *testing.T) *upstreams {
	t.Helper()
	u := &upstreams{byName: map[string]*front{}}
	// faultupstream stands in for OpenAI (every OpenAI API, and Anthropic
	// Messages through a pass-through channel) and for Anthropic. Their
	// own event delay paces them; the fronts add none.
	okAnswer := func(name string) fu.Answer {
		return fu.OKNamed(name).WithUsage(40, 12).WithEventDelay(pace)
	}
	u.oa, u.oa2, u.oa3 = fu.New(okAnswer("oa")), fu.New(okAnswer("oa2")), fu.New(okAnswer("oa3"))
	u.an = fu.New(okAnswer("an"))
	u.long = fu.New(fu.OKNamed("long").WithPieces(longPieces...).WithUsage(40, 1200))
	u.az = fakeproviders.NewAzure("az-key", "gpt4o-soak")
	u.gm = fakeproviders.NewGemini("gm-key")
	u.vx = fakeproviders.NewVertex("proj-1", "us-east5", time.Hour)
	u.br = fakeproviders.NewBedrock("us-east-1", "AKIAFAKE", "fake-secret")
	sa, err := u.vx.WriteServiceAccount(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	u.saPath = sa
	add := func(name string, d dialect, target string, p time.Duration) {
		f := newFront(name, d, target, p, stallFor)
		u.fronts = append(u.fronts, f)
		u.byName[name] = f
	}
	add("oa", dialectOpenAI, u.oa.URL, 0)
	add("oa2", dialectOpenAI, u.oa2.URL, 0)
	add("an", dialectAnthropic, u.an.URL, 0)
	add("az", dialectAzure, u.az.URL, pace)
	add("gm", dialectGoogle, u.gm.URL, pace)
	add("vx", dialectGoogle, u.vx.URL, pace)
	add("br", dialectBedrock, u.br.URL, pace)
	add("long", dialectOpenAI, u.long.URL, 0)
	add("oa3", dialectOpenAI, u.oa3.URL, 0)
	t.Cleanup(func() {
		for _, f := range u.fronts {
			f.close()
		}
		for _, s := range []*fu.Server{u.oa, u.oa2, u.oa3, u.an, u.long} {
			s.Close()
		}
		u.az.Close()
		u.gm.Close()
		u.vx.Close()
		u.br.Close()
	})
	return u
}

// problems are the requests the provider fakes refused: each is the
// gateway speaking a provider's wire format or authentication wrong.
func (u *upstreams) problems() []string {
	var out []string
	for name, f := range map[string]interface{ Problems() []string }{"azure": u.az, "gemini": u.gm, "vertex": u.vx, "bedrock": u.br} {
		for _, p := range f.Problems() {
			out = append(out, name+": "+p)
		}
	}
	return out
}

// Config variants. `caddy reload` alternates between them: variant B
// adds channel oa3 (a route of gpt-soak and gpt-resp2) and removes
// channel br (and its routes), drops the probes, and drops the history
// store and the probe leader, which variant A brings back.
const (
	variantA = 0
	variantB = 1
)

// models, by client API, that the clients ask for. Each provider's
// channel is the first route of some model (a cost-ordered chain sends
// everything to its first route while it is healthy), so every adapter
// serves traffic, and fails over to the others.
var (
	chatModels     = []string{"gpt-soak", "gpt-azure", "gemini-studio", "gemini-vertex"}
	respModels     = []string{"gpt-resp", "gpt-resp2"}
	messagesModels = []string{"claude-soak", "claude-vertex", "claude-bedrock"}
	longModel      = "gpt-long"
)

// channels is the channel blocks of a variant. Every channel closes its
// idle upstream connections after 1s (`keepalive 1s`, Caddy's default is
// 2m): the resource samples, taken with nothing in flight after 1.5s,
// then count the gateway's own goroutines and descriptors, not how many
// pooled connections the last burst left (up to 32 per upstream, 2
// goroutines and a descriptor each). Connections are still reused within
// a second, which at this load is most of them.
func (u *upstreams) channels(variant int) string {
	var b strings.Builder
	ch := func(name, body string) {
		fmt.Fprintf(&b, "\n\t\tchannel %s %s {\n\t\t\ttransport http {\n\t\t\t\tkeepalive 1s\n\t\t\t}\n%s\t\t}\n", name, u.byName[name].URL(), body)
	}
	ch("oa", "\t\t\theader Authorization \"Bearer sk-soak-oa\"\n")
	ch("oa2", "\t\t\theader Authorization \"Bearer sk-soak-oa2\"\n")
	ch("long", "\t\t\theader Authorization \"Bearer sk-soak-long\"\n")
	ch("an", "\t\t\tprovider anthropic\n\t\t\theader X-Api-Key sk-ant-soak\n")
	ch("az", "\t\t\tprovider azure {\n\t\t\t\tapi_key az-key\n\t\t\t}\n")
	ch("gm", "\t\t\tprovider gemini {\n\t\t\t\tapi_key gm-key\n\t\t\t}\n")
	ch("vx", fmt.Sprintf("\t\t\tprovider vertex {\n\t\t\t\tproject proj-1\n\t\t\t\tregion us-east5\n\t\t\t\tcredentials_file %s\n\t\t\t}\n", u.saPath))
	if variant == variantA {
		ch("br", "\t\t\tprovider bedrock {\n\t\t\t\tregion us-east-1\n\t\t\t\taccess_key_id AKIAFAKE\n\t\t\t\tsecret_access_key fake-secret\n\t\t\t}\n")
	} else {
		ch("oa3", "\t\t\theader Authorization \"Bearer sk-soak-oa3\"\n")
	}
	return b.String()
}

// handlerOptions are the same in both handlers: a channel two handlers
// declare shares its breaker, whose settings must agree.
var handlerOptions = fmt.Sprintf(`
		breaker {
			window   30s
			failures 3
			cooldown 2s
			max_park 3s
			park     1s
		}
		header_timeout        5s
		stream_header_timeout 3s
		deadline              15s
		stream_gate           3s
		stream_idle_timeout   %s
`, idleTimeout)

// models is the model blocks of a variant; probes only in the billed
// handler of variant A.
func models(variant int, probes bool) string {
	probe := ""
	if probes && variant == variantA {
		probe = "\n\t\t\tprobe {\n\t\t\t\tinterval 1s\n\t\t\t\tmax_tokens 8\n\t\t\t}"
	}
	claudeBedrock := `
			route br cost 3 15 upstream_model us.anthropic.claude-sonnet-4-5-20250929-v1:0`
	spare := ""
	if variant == variantB {
		claudeBedrock = ""
		spare = "\n\t\t\troute oa3 cost 3 4"
	}
	return fmt.Sprintf(`
		model gpt-soak {
			route oa cost 1 2
			route az cost 1.5 2.5 upstream_model gpt4o-soak
			route oa2 cost 2 3%[3]s
			price 1 2
			max_output_tokens 256%[1]s
		}
		model gpt-azure {
			route az cost 1 2 upstream_model gpt4o-soak
			route oa2 cost 1.5 2.5
			route oa cost 2 3
			price 1 2
			max_output_tokens 256
		}
		model gemini-studio {
			route gm cost 0.3 2.5 upstream_model gemini-2.5-flash
			route vx cost 0.4 2.6 upstream_model google/gemini-2.5-flash
			route oa cost 1 3
			price 1 3
			max_output_tokens 256%[1]s
		}
		model gemini-vertex {
			route vx cost 0.3 2.5 upstream_model google/gemini-2.5-flash
			route gm cost 0.4 2.6 upstream_model gemini-2.5-flash
			route oa2 cost 1 3
			price 1 3
			max_output_tokens 256
		}
		model gpt-resp {
			route oa cost 1 2
			route oa2 cost 2 3
			price 1 2
			max_output_tokens 256
		}
		model gpt-resp2 {
			route oa2 cost 1 2%[3]s
			route oa cost 4 5
			price 1 2
			max_output_tokens 256
		}
		model claude-soak {
			route an cost 3 15 upstream_model claude-sonnet-4-5-20250929
			route vx cost 3.1 15 upstream_model claude-sonnet-4-5@20250929%[2]s
			route oa cost 4 16
			price 4 16
			max_output_tokens 256
			stream_resume continue%[1]s
		}
		model claude-vertex {
			route vx cost 3 15 upstream_model claude-sonnet-4-5@20250929%[2]s
			route an cost 3.2 15 upstream_model claude-sonnet-4-5-20250929
			price 4 16
			max_output_tokens 256
			stream_resume continue
		}
		model claude-bedrock {%[2]s
			route an cost 3.1 15 upstream_model claude-sonnet-4-5-20250929
			route vx cost 3.2 15 upstream_model claude-sonnet-4-5@20250929
			price 4 16
			max_output_tokens 256
			stream_resume continue
		}
		model gpt-long {
			route long cost 1 2
			route oa cost 2 3
			price 1 2
			max_output_tokens 2000
		}
`, probe, claudeBedrock, spare)
}

// gatewayConfig is a whole Caddyfile of one instance: the wallet, history
// and probe leader on the soak's PostgreSQL (LLMF_SOAK_DSN in caddy's
// environment), a billed handler (wallet keys) on /v1/..., an unbilled
// one (auth off) on /free/v1/..., and a status page.
func gatewayConfig(p ports, variant int, u *upstreams) string {
	global := ""
	if variant == variantA {
		global = `
	llm_failover {
		history postgres {env.LLMF_SOAK_DSN}
		probe_leader postgres {env.LLMF_SOAK_DSN}
	}`
	}
	probeAccount := ""
	if variant == variantA {
		probeAccount = "\n\t\t\tprobe_account soak-probes"
	}
	return fmt.Sprintf(`{
	admin localhost:%[1]d
	auto_https off
	http_port %[2]d
	grace_period %[11]v
	persist_config off
	llm_wallet {
		store postgres {env.LLMF_SOAK_DSN}
		reservation_ttl %[3]s
		lease_ttl %[4]s
		admission_timeout 3s
		statement_timeout 3s
	}%[5]s
}
http://:%[2]d {
	bind 127.0.0.1
	header {
		defer
		X-Request-Id {http.request.uuid}
		X-Served-By {http.llm_failover.channel}
	}
	handle /status* {
		llm_status {
			title Soak
		}
	}
	handle_path /free/* {
		llm_failover {%[6]s%[7]s%[8]s
			auth off
		}
	}
	handle {
		llm_failover {%[6]s%[7]s%[9]s
			wallet%[10]s
		}
	}
}
`, p.Admin, p.HTTP, reservationTTL, leaseTTL, global, u.channels(variant), handlerOptions,
		models(variant, false), models(variant, true), probeAccount, reloadGrace)
}
