package failover

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/provider"
	"github.com/llmfailover/caddy-llm-failover/streamgate"
	"github.com/llmfailover/caddy-llm-failover/wallet"
	"github.com/llmfailover/caddy-llm-failover/walletapp"
)

// walletRuntime is a provisioned WalletConfig.
type walletRuntime struct {
	w       *walletapp.Wallet
	allow   bool
	account string
	logger  *zap.Logger
	// reservedOK and settledOK are the every-request series of
	// wallet_operations_total, looked up once.
	reservedOK, settledOK prometheus.Counter
}

// provisionWallet gets the config's wallet from the llm_wallet app.
func provisionWallet(ctx caddy.Context, c WalletConfig, logger *zap.Logger) (*walletRuntime, error) {
	app, err := ctx.App("llm_wallet")
	if err != nil {
		return nil, err
	}
	w, err := app.(*walletapp.App).Wallet(c.Name)
	if err != nil {
		return nil, err
	}
	return newWalletRuntime(w, logger, c.Account, c.Allow), nil
}

func newWalletRuntime(w *walletapp.Wallet, logger *zap.Logger, account string, allow bool) *walletRuntime {
	return &walletRuntime{w: w, account: account, allow: allow, logger: logger,
		reservedOK: walletTotal.WithLabelValues("reserve", "ok"), settledOK: walletTotal.WithLabelValues("settle", "ok")}
}

// useWallet makes the handler's requests prepaid, billed through rt.
func (e *Engine) useWallet(rt *walletRuntime) {
	e.wallet = rt
	for name, pm := range e.models {
		pm.charged = walletCharged.WithLabelValues(name)
	}
}

// bill is one request's reservation, from admission to settlement.
type bill struct {
	rt        *walletRuntime
	x         *exchange
	res       wallet.Reservation
	price     wallet.Price
	meter     *provider.Meter
	hideUsage func(streamgate.Event) bool
	channel   string
	closed    bool
	// charge is what close charged (at most the reservation), for the
	// request's trace.
	charge wallet.Micros
	// upstreamModel is what channel knows the model by.
	upstreamModel string
	// inputBound and outputBound are the most tokens the request can have
	// (what the reservation covers); a report beyond them is implausible.
	inputBound, outputBound int64
	// resumable: the reservation also covers one continuation of a broken
	// stream (stream_resume), of at most these bounds.
	resumable                 bool
	contInBound, contOutBound int64
	// broken is the first attempt of a resumed answer, billed in a row of
	// its own for what it delivered; nil unless a continuation was sought.
	broken *billedAnswer
	// free: the call costs nothing (count_tokens), so nothing is reserved
	// and nothing settled.
	free bool
	// live ends the reservation's keep-alive.
	live func()
}

// chargeNothingFor makes a hedge's reservation the second of x's race:
// it charges for no answer of its own (the answer served is x.bill's), so
// closing it releases it, unless hedgeDecided charges it for the loser.
func (b *bill) chargeNothingFor(x *exchange) {
	b.x = x
	b.channel, b.upstreamModel, b.meter = "", "", nil
}

// billedAnswer is one upstream answer a ledger row charges, with what its
// usage is judged against.
type billedAnswer struct {
	channel, upstreamModel  string
	meter                   *provider.Meter
	body                    []byte // the request it answered
	inputBound, outputBound int64
}

// admit finds the account and reserves the largest cost the request can
// have, with one continuation when resumable (stream_resume may continue
// it). A refusal is never a failover case: no channel can refill a wallet.
func (rt *walletRuntime) admit(x *exchange, resumable bool) (*bill, *provider.Error) {
	ctx, cancel := rt.w.AdmissionContext(x.r.Context())
	defer cancel()
	account, keyID, refusal := rt.authenticate(ctx, x)
	if refusal != nil || account == "" {
		return nil, refusal
	}

	m := x.model
	if x.api == provider.AnthropicCountTokens {
		// Counting tokens generates none and the upstream does not bill
		// it: the key is checked, nothing is reserved or charged.
		return &bill{rt: rt, x: x, free: true}, nil
	}
	maxOut := x.req.MaxOutput
	if maxOut == 0 {
		maxOut = m.MaxOutput
	}
	est := wallet.Estimate{BodyBytes: len(x.body), Images: x.req.Images, MaxOutput: maxOut, N: x.req.N}
	if x.req.StoredContext != "" {
		// The upstream adds input the body does not show; only the
		// operator knows how much there can be.
		if m.MaxInput == 0 {
			return nil, &provider.Error{Status: http.StatusBadRequest, Message: fmt.Sprintf(
				"%q refers to input stored upstream, which this gateway cannot bound for billing; the operator can allow it by setting max_input_tokens on model %q",
				x.req.StoredContext, x.req.Model)}
		}
		est.StoredInputTokens = m.MaxInput
	} else if x.req.ServerInput != "" && m.MaxInput > 0 {
		// A server-side tool (web search, fetch, MCP) adds its results
		// to the input the upstream bills: bounded, like stored context,
		// by the model's max_input_tokens when the operator set it.
		est.StoredInputTokens = m.MaxInput
	}
	if resumable {
		est.Continuations = 1
	}
	est.WritesCache, est.WritesCache1h = provider.CacheWrites(x.body)
	amount, _ := wallet.MaxCost(est, m.Price)
	inputBound, outputBound := est.Bounds()
	b := &bill{rt: rt, x: x, price: m.Price, inputBound: inputBound, outputBound: outputBound, resumable: resumable}
	b.contInBound, b.contOutBound = est.ContinuationBounds()
	b.res = wallet.Reservation{
		ID: requestID(x), Account: account, KeyID: keyID, Model: x.req.Model,
		Amount: amount, ExpiresAt: time.Now().Add(rt.w.ReservationTTL()),
	}
	b.res.RequestID = b.res.ID
	err := rt.w.Reserve(ctx, b.res)
	switch {
	case errors.Is(err, wallet.ErrInsufficientFunds):
		walletTotal.WithLabelValues("reserve", "insufficient").Inc()
		return nil, &provider.Error{Status: http.StatusPaymentRequired, Code: "insufficient_quota",
			Message: rt.insufficient(ctx, account, amount, maxOut)}
	case errors.Is(err, wallet.ErrUnknownAccount):
		walletTotal.WithLabelValues("reserve", "unknown_account").Inc()
		return nil, &provider.Error{Status: http.StatusUnauthorized, Message: fmt.Sprintf("unknown account %q", account)}
	case err != nil:
		// The client is known: its key was just authenticated (or the
		// account comes from Caddy's own authentication).
		return rt.storeError(x, "reserve", err, account)
	}
	rt.reservedOK.Inc()
	// While the request runs, its reservation is kept from expiring; only
	// a crashed instance's reservations are left for the sweeper.
	b.live = rt.w.KeepAlive(b.res.ID)
	return b, nil
}

// insufficient is a 402's message: what the request may cost, what the
// account has, and that the output cap is what the client can lower (it
// is most of the hold). The balance is read again for the message (a
// refusal is rare); a store that cannot say leaves it out.
func (rt *walletRuntime) insufficient(ctx context.Context, account string, amount wallet.Micros, maxOut int64) string {
	msg := fmt.Sprintf("insufficient balance: this request may cost up to %s", amount.Human())
	if st, err := rt.w.Store(); err == nil {
		if a, err := st.Account(ctx, account); err == nil {
			msg += fmt.Sprintf(" and the account's available balance is %s", max(a.Available(), 0).Human())
		}
	}
	return msg + fmt.Sprintf("; the hold is mostly the output cap (%d tokens): a lower max_tokens reserves less", maxOut)
}

// authenticate finds the account a request bills: the account
// placeholder's value, or the owner of the client's wallet key. An empty
// account with no refusal is a store error served unbilled
// (on_store_error allow).
func (rt *walletRuntime) authenticate(ctx context.Context, x *exchange) (account, keyID string, refusal *provider.Error) {
	if x.client.account != "" {
		return x.client.account, x.client.keyID, nil // authenticated already (idempotency.go)
	}
	if rt.account != "" {
		if x.repl != nil {
			account = x.repl.ReplaceAll(rt.account, "")
		}
		if account == "" {
			return "", "", &provider.Error{Status: http.StatusUnauthorized, Message: "no account: the request is not authenticated"}
		}
		return account, "", nil
	}
	secret := clientKey(x.r)
	if secret == "" {
		return "", "", &provider.Error{Status: http.StatusUnauthorized, Message: "missing API key: send it as Authorization: Bearer <key> or x-api-key"}
	}
	k, err := rt.w.Authenticate(ctx, secret)
	switch {
	case errors.Is(err, wallet.ErrUnknownKey):
		walletTotal.WithLabelValues("authenticate", "unknown_key").Inc()
		return "", "", &provider.Error{Status: http.StatusUnauthorized, Message: "invalid API key"}
	case errors.Is(err, wallet.ErrKeyRevoked):
		walletTotal.WithLabelValues("authenticate", "revoked").Inc()
		return "", "", &provider.Error{Status: http.StatusUnauthorized, Message: "this API key has been revoked"}
	case err != nil:
		// Only a key this instance verified recently may be served
		// unbilled: an outage must not turn the gateway into an open
		// relay for any well-formed key.
		known := ""
		if k, ok := rt.w.KnownKey(secret); ok {
			known = k.Account
		}
		_, refusal = rt.storeError(x, "authenticate", err, known)
		return "", "", refusal
	}
	return k.Account, k.ID, nil
}

// storeError applies on_store_error: refuse (503), or serve unbilled a
// client whose account is known without the store (allow).
func (rt *walletRuntime) storeError(x *exchange, op string, err error, knownAccount string) (*bill, *provider.Error) {
	walletTotal.WithLabelValues(op, "store_error").Inc()
	if rt.allow && knownAccount != "" && !errors.Is(err, walletapp.ErrUnloaded) {
		rt.logger.Error("wallet store unavailable; serving unbilled (on_store_error allow)",
			zap.String("op", op), zap.String("model", x.req.Model), zap.String("account", knownAccount), zap.Error(err))
		return nil, nil
	}
	msg := "billing is temporarily unavailable; no upstream was called"
	if rt.allow {
		msg = "billing is temporarily unavailable and this API key was not verified recently; no upstream was called"
	}
	rt.logger.Error("wallet store unavailable; refusing", zap.String("op", op), zap.Bool("allow", rt.allow), zap.Error(err))
	return nil, &provider.Error{Status: http.StatusServiceUnavailable, Message: msg}
}

// prepare readies the body for one attempt and starts a fresh meter: a
// failed attempt's usage is never billed. The upstream is asked to report
// usage where it would not by itself; the extra report is hidden from a
// client that did not ask for it.
func (b *bill) prepare(body []byte) []byte {
	b.meter = b.x.api.NewMeter()
	body, b.hideUsage = b.x.api.AskUsage(body, b.x.req)
	return body
}

func (b *bill) servedBy(channel, upstreamModel string) {
	b.channel, b.upstreamModel = channel, upstreamModel
}

// continuing sets the broken first attempt aside, to be billed in its own
// row; from here on the bill follows the continuation, which is billed
// only if one is committed.
func (b *bill) continuing() {
	if b.broken != nil || b.channel == "" {
		return
	}
	b.broken = &billedAnswer{channel: b.channel, upstreamModel: b.upstreamModel, meter: b.meter,
		body: b.x.body, inputBound: b.inputBound, outputBound: b.outputBound}
	b.channel, b.upstreamModel, b.meter = "", "", nil
}

// answers are the upstream answers to charge: the one that served, or a
// resumed answer's broken first attempt and its continuation.
func (b *bill) answers() []*billedAnswer {
	var out []*billedAnswer
	if b.broken != nil {
		out = append(out, b.broken)
	}
	// Only the attempt that served is billed; a failed one never set
	// channel, whatever it sent.
	if b.channel != "" && b.meter != nil {
		a := &billedAnswer{channel: b.channel, upstreamModel: b.upstreamModel, meter: b.meter,
			body: b.x.body, inputBound: b.inputBound, outputBound: b.outputBound}
		if b.broken != nil {
			a.body, a.inputBound, a.outputBound = b.x.resume.cur.body, b.contInBound, b.contOutBound
		}
		out = append(out, a)
	}
	return out
}

// chargePrice is what an answer of channel is charged at: its route's
// price, prompt-cache classes included (the model's price when the
// channel is none of its routes').
func (b *bill) chargePrice(channel string) wallet.Price {
	if p, ok := b.x.model.Charge[channel]; ok {
		return p.Price
	}
	// Not reached through a compiled config; cached input at the plain
	// input price never undercharges.
	p := b.price
	p.CacheRead, p.CacheWrite, p.CacheWrite1h = p.Input, p.Input, p.Input
	return p
}

// entry is the ledger row charging a.
func (b *bill) entry(a *billedAnswer) wallet.Entry {
	e := wallet.Entry{
		Account: b.res.Account, KeyID: b.res.KeyID, Model: b.res.Model,
		Channel: a.channel, RequestID: b.res.RequestID, UpstreamModel: a.upstreamModel, TraceID: b.traceID(),
	}
	u := a.meter.Usage()
	var c charge
	e.TokensIn, e.TokensOut, c = b.billable(a, u)
	tokens := wallet.Tokens{Input: e.TokensIn, Output: e.TokensOut}
	if c.kind != "implausible" && u.InputKnown {
		// A plausible report prices each class of input at its own
		// price: a cache read at a fraction of plain input, a write
		// above it. So does one whose output alone is estimated (an
		// Anthropic stream cut after message_start): its input is the
		// upstream's report.
		tokens.Input, tokens.CacheRead, tokens.CacheWrite, tokens.CacheWrite1h = u.PlainInput(), u.CacheRead, u.CacheWrite, u.CacheWrite1h
		e.TokensCacheRead, e.TokensCacheWrite, e.TokensCacheWrite1h = u.CacheRead, u.CacheWrite, u.CacheWrite1h
	}
	e.Cost = b.chargePrice(a.channel).CostOf(tokens)
	e.Note = c.note
	if c.note != "" {
		walletTotal.WithLabelValues("usage", c.kind).Inc()
		b.rt.logger.Warn("charging without a plausible usage report", zap.String("request_id", b.res.RequestID),
			zap.String("model", b.res.Model), zap.String("channel", a.channel), zap.String("reason", c.note),
			zap.Int64("tokens_in", e.TokensIn), zap.Int64("tokens_out", e.TokensOut))
	}
	return e
}

// attemptFailed writes a zero-charge ledger row so that an operator sees
// failed attempts next to the charge of the one that served. The row is
// written in the background, with the store's next group commit: failing
// over never waits on the store.
func (b *bill) attemptFailed(channel, upstreamModel, reason string) {
	if b.free {
		return
	}
	b.rt.w.RecordAttemptAsync(wallet.Entry{
		Account: b.res.Account, KeyID: b.res.KeyID, Model: b.res.Model, Channel: channel,
		RequestID: b.res.RequestID, Note: reason, UpstreamModel: upstreamModel, TraceID: b.traceID(),
	})
}

// traceID is the request's trace ID for its ledger rows, "" when the
// request is untraced.
func (b *bill) traceID() string {
	if b.x == nil {
		return ""
	}
	return b.x.trace.traceID()
}

// close settles the reservation: it charges the usage of the attempt that
// served (nothing when none did), or of a resumed answer's two attempts in
// two rows, and releases the rest. It runs exactly once, deferred, so
// panics and client disconnects settle too.
//
// The rows are decided here; their write happens after the handler
// returns, so that the client's answer completes (and its connection
// takes the next request) without waiting for the store, and the store
// can commit many settlements together (wallet.settleGather). The wallet
// counts the write until it is done, so a reload never closes the store
// under it and a shutdown waits for it; the reservation holds its money
// until then, so nothing can be spent twice. No goroutine waits for it:
// the batch that writes it reports the outcome (settled).
func (b *bill) close() {
	// b is nil when on_store_error allow admitted the request unbilled.
	if b == nil || b.closed || b.free {
		return
	}
	b.closed = true
	// Nothing served: a release row.
	entries := []wallet.Entry{{Account: b.res.Account, KeyID: b.res.KeyID, Model: b.res.Model, RequestID: b.res.RequestID, TraceID: b.traceID()}}
	if answers := b.answers(); len(answers) > 0 {
		entries = entries[:0]
		for _, a := range answers {
			entries = append(entries, b.entry(a))
		}
	}
	var cost wallet.Micros
	for _, e := range entries {
		cost += e.Cost
	}
	b.charge = min(cost, b.res.Amount)
	// No deadline of its own: the settlement joins the store's next batch,
	// whose statements the store bounds (statement_timeout, busy_timeout).
	b.rt.w.SettleAsync(b.res.ID, entries, func(charged wallet.Micros, err error) {
		defer b.live()
		b.settled(cost, charged, err)
	})
}

// settled logs and counts a closed bill's settlement; it runs on the
// goroutine that wrote the settlement's batch, so it must not block.
func (b *bill) settled(cost, charged wallet.Micros, err error) {
	switch {
	case errors.Is(err, wallet.ErrNotFound):
		walletTotal.WithLabelValues("settle", "not_found").Inc()
		b.rt.logger.Error("the reservation was already released (it expired and was swept); this request was not charged",
			zap.String("request_id", b.res.RequestID), zap.String("account", b.res.Account), zap.String("usage_cost", cost.String()))
		return
	case err != nil:
		walletTotal.WithLabelValues("settle", "error").Inc()
		b.rt.logger.Error("settling a reservation failed, after its retries; it stays reserved until it expires, then the sweeper releases it uncharged",
			zap.String("request_id", b.res.RequestID), zap.String("account", b.res.Account), zap.Error(err))
		return
	}
	b.rt.settledOK.Inc()
	b.x.model.charged.Add(float64(charged))
	if charged < cost {
		b.rt.logger.Warn("usage exceeded the reservation; charged the reserved amount",
			zap.String("request_id", b.res.RequestID), zap.String("reserved", b.res.Amount.String()), zap.String("usage_cost", cost.String()))
	}
}

// clientKey finds the client's API key in the headers the OpenAI and
// Anthropic SDKs send it in.
func clientKey(r *http.Request) string {
	if v := r.Header.Get("Authorization"); v != "" {
		if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
			return strings.TrimSpace(v[7:])
		}
	}
	if v := r.Header.Get("X-Api-Key"); v != "" {
		return v
	}
	return r.Header.Get("Api-Key")
}

// requestID is the request's ID, the {http.request.uuid} the access log
// and X-Request-Id show, made once per request: Caddy generates it on
// first use, and a failover decision and the ledger both need it.
func requestID(x *exchange) string {
	if x.id == "" {
		if x.repl != nil {
			x.id, _ = x.repl.GetString("http.request.uuid")
		}
		if x.id == "" {
			x.id = fmt.Sprintf("req-%d", time.Now().UnixNano())
		}
	}
	return x.id
}

// cachePartsFit reports whether u's cache classes are parts of its input:
// none negative, together no more than it. (Input is already known to be
// within its bound, so the differences cannot overflow.)
func cachePartsFit(u provider.Usage) bool {
	if u.CacheRead < 0 || u.CacheWrite < 0 || u.CacheWrite1h < 0 {
		return false
	}
	left := u.Input - u.CacheRead
	if left < 0 {
		return false
	}
	left -= u.CacheWrite
	return left >= 0 && u.CacheWrite1h <= left
}

// charge explains a settlement that is not simply the upstream's report:
// kind is a metric label, note goes on the ledger row ("" for a plain
// report).
type charge struct{ kind, note string }

// billable returns the tokens to charge for one upstream answer a (the
// attempt that served, or one half of a resumed answer).
//
//   - A plausible report wins: what the upstream reported.
//   - An implausible one (negative, above what the request could use,
//     cached parts that are negative or more than the input, or counts
//     that cannot be read) is charged at the request's bound, the most it
//     could have cost, every input token at the plain price.
//   - A missing count is estimated: the output from the content actually
//     delivered (the meter's decoded deltas, see provider.TokenEstimator),
//     the input from the request's text, each capped at its bound. A
//     partial report (Anthropic's message_start input) still counts.
//
// Settle caps the charge at the reservation either way, so no path can
// overdraw.
func (b *bill) billable(a *billedAnswer, u provider.Usage) (in, out int64, c charge) {
	switch {
	case u.Garbled:
		return a.inputBound, a.outputBound, charge{"implausible", fmt.Sprintf(
			"implausible usage reported (a count that is not an integer in range; the request allows at most %d in, %d out): charged at the bound",
			a.inputBound, a.outputBound)}
	case u.Input < 0 || u.Output < 0 || u.Input > a.inputBound || u.Output > a.outputBound:
		return a.inputBound, a.outputBound, charge{"implausible", fmt.Sprintf(
			"implausible usage reported (%d in, %d out; the request allows at most %d in, %d out): charged at the bound",
			u.Input, u.Output, a.inputBound, a.outputBound)}
	case u.InputKnown && !cachePartsFit(u):
		return a.inputBound, a.outputBound, charge{"implausible", fmt.Sprintf(
			"implausible usage reported (%d in, of which %d read from the cache and %d+%d written to it, %d out): charged at the bound of %d in, %d out",
			u.Input, u.CacheRead, u.CacheWrite, u.CacheWrite1h, u.Output, a.inputBound, a.outputBound)}
	}
	in, out = u.Input, u.Output
	if u.InputKnown && u.OutputKnown {
		return in, out, charge{}
	}
	var parts []string
	if !u.InputKnown {
		in = min(provider.EstimateInputTokens(a.body), a.inputBound)
		parts = append(parts, "input from the request's text")
	}
	if !u.OutputKnown {
		out = min(max(out, a.meter.DeliveredTokens()), a.outputBound)
		parts = append(parts, "output from the content delivered")
	}
	why := "the answer ended without a usage report"
	if err := b.x.r.Context().Err(); err != nil {
		why = "the client left before the usage report"
	}
	note := "estimated: " + why + "; " + parts[0]
	if len(parts) > 1 {
		note += " and " + parts[1]
	}
	return in, out, charge{"estimated", note}
}
