package integration_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/provider"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// resumeWalletChannels serves claude (price 3 15) from a then b, each
// under its own upstream model name, billed, with stream_resume on.
const resumeWalletChannels = `
		channel a %s {
		}
		channel b %s {
		}
		model claude {
			route a cost 1 1 upstream_model claude-a
			route b cost 2 2 upstream_model claude-b
			price 3 15
		}
		wallet
		stream_resume continue
`

// resumeBody is a streaming Messages request whose output bound (1000)
// is above anything the tests deliver, so no charge is capped at it.
func resumeBody(t *testing.T) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"model": "claude", "max_tokens": 1000, "stream": true,
		"messages": []map[string]string{{"role": "user", "content": "Count."}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// reservations returns what body reserves alone and with one continuation.
func reservations(body []byte) (alone, resumable wallet.Micros) {
	est := wallet.Estimate{BodyBytes: len(body), MaxOutput: 1000}
	alone, _ = wallet.MaxCost(est, priceClaude)
	est.Continuations = 1
	resumable, _ = wallet.MaxCost(est, priceClaude)
	return alone, resumable
}

func resumeBilledPost(t *testing.T, secret string, body []byte) streamed {
	t.Helper()
	s := streamPost(t, nil, "/v1/messages", body, "", "X-Api-Key", secret, "Anthropic-Version", "2023-06-01")
	waitUnreserved(t, "acct")
	return s
}

// A billed stream cut after 40 of 60 deltas and resumed on b is charged in
// two rows: a's for its input and the output it delivered (estimated by
// the meter: the cut came before a's usage report), b's for its input with
// the prefill and its own output, as b reported them.
func TestResumeBilledTwoRows(t *testing.T) {
	eachWalletStore(t, func(t *testing.T, s walletStore) {
		pieces := resumePieces()
		a := upstream(t, fu.OKNamed("primary").WithPieces(pieces...).WithCutAfter(40).WithUsage(200, 60))
		b := upstream(t, fu.OKNamed("backup").WithPieces(pieces[40:]...).WithUsage(260, 20))
		gatewayWith(t, walletOptions(s.option), resumeWalletChannels, a.URL, b.URL)
		secret, _ := newWalletAccount(t, "acct", "1")
		got := resumeBilledPost(t, secret, resumeBody(t))
		wantText(t, got, strings.Join(pieces, ""))

		rows := requestRows(t, "acct")
		if len(rows) != 2 {
			t.Fatalf("ledger rows %s, want a's and b's charges", kinds(rows))
		}
		first, cont := rows[0], rows[1]
		delivered := provider.EstimateTokens([]byte(strings.Join(pieces[:40], "")))
		if first.Kind != wallet.KindCharge || first.Channel != "a" || first.UpstreamModel != "claude-a" || first.TokensIn != 200 ||
			!strings.HasPrefix(first.Note, "estimated: ") || parseMoney(t, first.Cost) != priceClaude.Cost(first.TokensIn, first.TokensOut) {
			t.Errorf("the broken attempt's row %+v", first)
		}
		within(t, "the broken attempt", first.TokensOut, delivered, delivered)
		if cont.Kind != wallet.KindCharge || cont.Channel != "b" || cont.UpstreamModel != "claude-b" || cont.TokensIn != 260 ||
			cont.TokensOut != 20 || cont.Note != "" || parseMoney(t, cont.Cost) != priceClaude.Cost(260, 20) {
			t.Errorf("the continuation's row %+v", cont)
		}
		if first.RequestID == "" || first.RequestID != cont.RequestID {
			t.Errorf("request IDs %q and %q", first.RequestID, cont.RequestID)
		}
		sum := parseMoney(t, first.Cost) + parseMoney(t, cont.Cost)
		if bal, reserved := balanceOf(t, "acct"); bal != money(t, "1")-sum || reserved != 0 {
			t.Errorf("balance %s reserved %s, want %s charged", bal, reserved, sum)
		}
		auditClean(t)
	})
}

// With stream_resume on, a stream reserves for one continuation too: an
// account that covers one attempt but not a resume is refused with the
// usual 402, one that covers both is served. A non-streaming request is
// never resumed and reserves as before.
func TestResumeAdmissionBound(t *testing.T) {
	a := upstream(t, fu.OKNamed("a").WithUsage(10, 5))
	b := upstream(t, fu.OKNamed("b"))
	gatewayWith(t, walletOptions("sqlite "+t.TempDir()+"/w.db"), resumeWalletChannels, a.URL, b.URL)
	body := resumeBody(t)
	alone, resumable := reservations(body)
	if resumable <= alone {
		t.Fatalf("a resumable request reserves %s, alone %s", resumable, alone)
	}
	secret, _ := newWalletAccount(t, "acct", alone.String())
	res, got := post(t, "/v1/messages", body, "X-Api-Key", secret, "Anthropic-Version", "2023-06-01")
	if res.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("an account covering one attempt of a resumable stream: status %d: %s", res.StatusCode, got)
	}
	if msg, typ := anthropicError(t, got); typ != "billing_error" || !strings.Contains(msg, "may cost up to "+resumable.Human()) {
		t.Errorf("Anthropic error %q %q", msg, typ)
	}
	hits(t, a, 0)
	unary := []byte(strings.Replace(string(body), `,"stream":true`, "", 1))
	if res, got := postSettled(t, "acct", "/v1/messages", unary, "X-Api-Key", secret, "Anthropic-Version", "2023-06-01"); res.StatusCode != 200 {
		t.Fatalf("a non-streaming request reserves no continuation: status %d: %s", res.StatusCode, got)
	}
	mustWalletCall(t, http.MethodPost, "accounts/acct/credit", map[string]string{"amount": resumable.String(), "note": "test"}, nil)
	okStream(t, resumeBilledPost(t, secret, body))
	hits(t, a, 2)
	auditClean(t)
}

// A billed stream whose resume fails (b refuses the request) is charged
// as a cut stream: one row for what a delivered, a zero row for b's
// attempt, nothing left reserved.
func TestResumeBilledFailedResumeReleases(t *testing.T) {
	eachWalletStore(t, func(t *testing.T, s walletStore) {
		pieces := resumePieces()
		a := upstream(t, fu.OKNamed("primary").WithPieces(pieces...).WithCutAfter(40).WithUsage(200, 60))
		b := upstream(t, fu.Status(400, `{"type":"error","error":{"type":"invalid_request_error","message":"messages: roles must alternate"}}`))
		gatewayWith(t, walletOptions(s.option), resumeWalletChannels, a.URL, b.URL)
		secret, _ := newWalletAccount(t, "acct", "1")
		got := resumeBilledPost(t, secret, resumeBody(t))
		okStream(t, got)
		mustContain(t, got.body, "event: error")
		rows := attemptsFirst(t, "acct", 2)
		if rows[0].Kind != wallet.KindFailedAttempt || rows[0].Channel != "b" || rows[0].Cost != "0" {
			t.Errorf("b's attempt row %+v", rows[0])
		}
		charge := rows[1]
		if charge.Kind != wallet.KindCharge || charge.Channel != "a" || charge.TokensIn != 200 || !strings.HasPrefix(charge.Note, "estimated: ") {
			t.Errorf("a's row %+v", charge)
		}
		if sum := settledOnce(t, rows); sum != parseMoney(t, charge.Cost) {
			t.Errorf("charged %s", sum)
		}
		if bal, reserved := balanceOf(t, "acct"); bal != money(t, "1")-parseMoney(t, charge.Cost) || reserved != 0 {
			t.Errorf("balance %s reserved %s", bal, reserved)
		}
		auditClean(t)
	})
}

// A model with no second channel to continue on holds no money for a
// continuation: stream_resume cannot resume it, so an account covering
// one attempt is served.
func TestResumeHoldOnlyWhereAResumeCanHappen(t *testing.T) {
	a := upstream(t, fu.OKNamed("a").WithUsage(10, 5))
	gatewayWith(t, walletOptions("sqlite "+t.TempDir()+"/w.db"), `
		channel a %s {
		}
		model claude {
			route a cost 1 1 upstream_model claude-a
			price 3 15
		}
		wallet
		stream_resume continue
`, a.URL)
	body := resumeBody(t)
	alone, _ := reservations(body)
	secret, _ := newWalletAccount(t, "acct", alone.String())
	okStream(t, resumeBilledPost(t, secret, body))
	hits(t, a, 1)
	auditClean(t)
}
