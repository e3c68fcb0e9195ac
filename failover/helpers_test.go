package failover

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/llmfailover/caddy-llm-failover/chain"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/provider"
	"github.com/llmfailover/caddy-llm-failover/wallet"
	"github.com/llmfailover/caddy-llm-failover/walletapp"
)

// testChannel is a channel of a test engine.
type testChannel struct {
	name, url string
	adapter   provider.Adapter // nil: OpenAI-compatible
}

// testPlan is the plan of an engine whose one model "m" routes to every
// channel, in order (cost), with opts (defaults applied).
func testPlan(t testing.TB, opts Options, model func(*Model), channels ...testChannel) Plan {
	t.Helper()
	p := Plan{Options: opts.WithDefaults(), Owner: "the test handler"}
	var routes []chain.Route
	for i, c := range channels {
		base, err := url.Parse(c.url)
		if err != nil {
			t.Fatal(err)
		}
		adapter := c.adapter
		if adapter == nil {
			adapter = new(provider.OpenAI)
		}
		p.Channels = append(p.Channels, &Channel{Name: c.name, Base: base, Header: http.Header{}, Adapter: adapter,
			Transport: http.DefaultTransport, Extras: &provider.Extras{}})
		routes = append(routes, chain.Route{Channel: i, Name: c.name, InputCost: int64(i), OutputCost: int64(i)})
	}
	m := addTestModel(t, &p, "m", routes)
	if model != nil {
		model(m)
	}
	return p
}

// addTestModel adds to p a model name routed to routes (cost order),
// with a chain per API its channels serve.
func addTestModel(t testing.TB, p *Plan, name string, routes []chain.Route) *Model {
	t.Helper()
	m := &Model{Name: name, MaxOutput: DefaultMaxOutputTokens, Resume: ResumeOff}
	var err error
	if m.Chain, err = chain.New(name, chain.Cost, p.Options.MaxHops, routes); err != nil {
		t.Fatal(err)
	}
	for api := range m.ByAPI {
		var serving []chain.Route
		for _, r := range routes {
			if p.Channels[r.Channel].Adapter.Serves(provider.API(api)) {
				serving = append(serving, r)
			}
		}
		if len(serving) > 0 {
			m.ByAPI[api], _ = chain.New(name, chain.Cost, p.Options.MaxHops, serving)
		}
	}
	p.Models = append(p.Models, m)
	return m
}

// testEngine readies p's engine outside a running Caddy.
func testEngine(t testing.TB, p Plan) *Engine {
	t.Helper()
	e, err := New(testContext(t), p)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// serveDirect runs one request through e, as Caddy would.
func serveDirect(e *Engine, w http.ResponseWriter, r *http.Request) {
	r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, &caddyhttp.Server{})
	_ = e.ServeHTTP(w, r)
}

func upstream(t *testing.T, b fu.Behavior) *fu.Server { return fu.Start(t, b) }

func hits(t *testing.T, s *fu.Server, want int64) { t.Helper(); s.WantHits(t, want) }

// eventually polls cond for up to d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	fu.Eventually(t, d, what, cond)
}

// testRun numbers channel names: channel health is process-wide, keyed
// by name, so each test's channels get names of their own.
var testRun atomic.Int64

func uniqueName(base string) string { return fmt.Sprintf("%s%d", base, testRun.Add(1)) }

// background is a context for calls that need one.
var background = context.Background()

// withTestWallet gives e a wallet of its own, on an SQLite file of the
// test's, with account "acct" credited $1 and a key, and returns the
// store, its context and the key's secret.
func withTestWallet(t *testing.T, e *Engine) (context.Context, wallet.Store, string) {
	t.Helper()
	ctx := testContext(t)
	app := &walletapp.App{Wallets: map[string]*walletapp.Config{"default": {
		StoreRaw: json.RawMessage(fmt.Sprintf(`{"backend":"sqlite","path":%q}`, filepath.Join(t.TempDir(), "w.db")))}}}
	if err := app.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = app.Cleanup() })
	wal, err := app.Wallet("")
	if err != nil {
		t.Fatal(err)
	}
	e.useWallet(newWalletRuntime(wal, e.logger, "", false))
	st, err := wal.Store()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreateAccount(ctx, "acct"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Credit(ctx, "acct", 1_000_000, "test"); err != nil {
		t.Fatal(err)
	}
	secret, _, err := st.CreateKey(ctx, "acct", "t")
	if err != nil {
		t.Fatal(err)
	}
	return ctx, st, secret
}

// testContext is a Caddy context outside a running Caddy, cancelled when
// the test ends.
func testContext(t testing.TB) caddy.Context {
	t.Helper()
	base, err := caddy.ProvisionContext(&caddy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(base)
	t.Cleanup(cancel)
	return ctx
}
