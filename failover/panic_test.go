package failover

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// panicWriter panics on the first body write, standing in for any bug
// that blows up a request after its reservation was made.
type panicWriter struct{ *httptest.ResponseRecorder }

func (p panicWriter) Write([]byte) (int, error) { panic("boom") }

// serveToPanickingWriter serves a chat request whose writer panics on
// its first write, and checks that the panic reached the caller.
func serveToPanickingWriter(t *testing.T, e *Engine, secret string, stream bool) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(string(fu.ChatRequest("m", stream))))
	req.Header.Set("Authorization", "Bearer "+secret)
	w := panicWriter{httptest.NewRecorder()}
	req = caddyhttp.PrepareRequest(req, caddy.NewReplacer(), w, &caddyhttp.Server{})
	defer func() {
		if recover() == nil {
			t.Fatal("the writer did not panic")
		}
	}()
	_ = e.ServeHTTP(w, req)
}

// A panic mid-request must still release the reservation exactly once:
// the settlement is deferred, and deferred calls run while panicking.
func TestWalletPanicReleasesReservation(t *testing.T) {
	up := upstream(t, fu.OKNamed("a").WithUsage(10, 5))
	e := testEngine(t, testPlan(t, Options{}, func(m *Model) {
		m.Price = wallet.Price{Input: 1_000_000, Output: 1_000_000}
	}, testChannel{name: uniqueName("panic"), url: up.URL}))
	ctx, st, secret := withTestWallet(t, e)

	serveToPanickingWriter(t, e, secret, false)

	// The settled reservation's money goes back to the store's credit
	// lease at once, and from the lease to the account once it is idle
	// (about a second, see package wallet).
	var acct wallet.Account
	eventually(t, 5*time.Second, "the lease's money back in the account", func() bool {
		var err error
		if acct, err = st.Account(ctx, "acct"); err != nil {
			t.Fatal(err)
		}
		return acct.Reserved == 0
	})
	if acct.Reserved != 0 {
		t.Fatalf("reservation leaked: reserved %s", acct.Reserved)
	}
	rows, err := st.Usage(ctx, "acct", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	settled := 0
	for _, r := range rows {
		if r.Kind == wallet.KindCharge || r.Kind == wallet.KindRelease {
			settled++
		}
	}
	if settled != 1 {
		t.Fatalf("settled %d times: %+v", settled, rows)
	}
}

// A hedged request holds two reservations; a panic in either raced
// attempt must release both, as it does for an unhedged request. The
// hedge's reservation is kept alive while it is open, so one left open
// is held until the store closes.
func TestWalletPanicInHedgedRaceReleasesBothReservations(t *testing.T) {
	a := upstream(t, fu.SlowFirstToken(2*time.Second).Named("a").WithUsage(10, 5))
	b := upstream(t, fu.OKNamed("b").WithUsage(10, 5))
	e := testEngine(t, testPlan(t, Options{Hedge: HedgeOptions{Budget: 1}}, func(m *Model) {
		m.Price = wallet.Price{Input: 1_000_000, Output: 1_000_000}
		m.MaxOutput = 1000
		m.Hedge = &HedgeRule{After: 50 * time.Millisecond}
	}, testChannel{name: uniqueName("hpanic-a"), url: a.URL}, testChannel{name: uniqueName("hpanic-b"), url: b.URL}))
	ctx, st, secret := withTestWallet(t, e)

	serveToPanickingWriter(t, e, secret, true)
	hits(t, b, 1) // the hedge was sent, and its answer hit the writer

	var acct wallet.Account
	eventually(t, 5*time.Second, "both reservations' money back in the account", func() bool {
		var err error
		if acct, err = st.Account(ctx, "acct"); err != nil {
			t.Fatal(err)
		}
		return acct.Reserved == 0
	})
	if acct.Reserved != 0 {
		t.Fatalf("reservation leaked: reserved %s", acct.Reserved)
	}
}

// A panic mid-request must give back the bytes it counted against the
// memory budget too: an answer read whole, and what the stream gate held
// before commit. The budget is the process's and outlives the request:
// bytes never given back shrink it for good, until every attempt is
// refused 503 as if the gateway held max_held_bytes.
func TestPanicReleasesHeldBytes(t *testing.T) {
	up := upstream(t, fu.OKNamed("a"))
	e := testEngine(t, testPlan(t, Options{}, nil, testChannel{name: uniqueName("hpanic"), url: up.URL}))
	for _, stream := range []bool{false, true} {
		before := failoverapp.HeldBytes()
		serveToPanickingWriter(t, e, "unused", stream)
		if held := failoverapp.HeldBytes() - before; held != 0 {
			t.Errorf("stream %v: %d bytes still counted as held after the request panicked", stream, held)
		}
	}
}
