package walletapp

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI serves the wallets of the running config on Caddy's admin
// endpoint, addressed by name:
//
//	/llm_wallet/<name>/<endpoint>   a named wallet
//	/llm_wallet/<endpoint>          the only wallet (an error when there are several)
//
// Endpoints:
//
//	GET  status                               store kind, reachability, sweeper heartbeat
//	GET  accounts                             every account's balance
//	POST accounts            {"id"}           create an account
//	GET  accounts/<id>                        one balance
//	POST accounts/<id>/credit {"amount","note"} add money (a negative amount corrects)
//	GET  accounts/<id>/keys                   list keys (never the secrets)
//	POST accounts/<id>/keys  {"label"}        create a key; the secret is in this answer only
//	GET  accounts/<id>/usage?before=&limit=   ledger, newest first, paged (limit 100 by default, at most 1000)
//	POST keys/<key_id>/revoke                 revoke a key
//	GET  audit[?account=<id>]                 per account: balance = credits − charges, reserved = live reservations
//
// Caddy re-creates admin modules on every config load, so the module holds
// nothing: it reads the active config's llm_wallet app per request.
type adminAPI struct{}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.llm_wallet",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

// Routes returns the admin routes.
func (a *adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/llm_wallet/", Handler: caddy.AdminHandlerFunc(serveAdmin)}}
}

// endpoints are the first path segments of the short form.
var endpoints = map[string]bool{"status": true, "accounts": true, "keys": true, "audit": true}

// activeWallet finds the wallet a request addresses and the rest of its
// path, in the active config.
func activeWallet(path string) (*Wallet, string, error) {
	v, err := caddy.ActiveContext().AppIfConfigured("llm_wallet")
	if err != nil {
		return nil, "", caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("no wallet is configured")}
	}
	app := v.(*App)
	first, rest, _ := strings.Cut(path, "/")
	if w, ok := app.wallets[first]; ok {
		return w, rest, nil
	}
	if !endpoints[first] {
		return nil, "", caddy.APIError{HTTPStatus: http.StatusNotFound,
			Err: fmt.Errorf("no wallet named %q (configured: %s)", first, strings.Join(app.Names(), ", "))}
	}
	w, err := app.Wallet("")
	if err != nil || len(app.wallets) == 0 {
		if err == nil {
			err = errors.New("no wallet is configured")
		}
		return nil, "", caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
	}
	return w, path, nil
}

func serveAdmin(w http.ResponseWriter, r *http.Request) error {
	wal, path, err := activeWallet(strings.Trim(strings.TrimPrefix(r.URL.Path, "/llm_wallet/"), "/"))
	if err != nil {
		return err
	}
	ctx := r.Context()
	st, err := wal.Store()
	if path == "status" {
		if err := caddykit.OnlyMethod(r, http.MethodGet); err != nil {
			return err
		}
		last, sweepErr := wal.Heartbeat()
		status := map[string]any{"wallet": wal.Name(), "store": wal.Kind(), "reachable": true, "last_sweep": last, "sweep_every": wal.SweepEvery().String()}
		if sweepErr != "" {
			status["last_sweep_error"] = sweepErr
		}
		if err == nil {
			err = st.Ping(ctx)
		}
		if err != nil {
			// A store that never answered since start is an outage
			// to report, not an admin API failure.
			status["reachable"] = false
			status["error"] = err.Error()
		}
		return caddykit.WriteJSON(w, status)
	}
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
	}
	parts := strings.Split(path, "/")
	switch {
	case path == "accounts":
		switch r.Method {
		case http.MethodGet:
			accts, err := st.Accounts(ctx)
			if err != nil {
				return walletAPIError(err)
			}
			out := make([]AccountView, 0, len(accts))
			for _, a := range accts {
				out = append(out, viewAccount(a))
			}
			return caddykit.WriteJSON(w, out)
		case http.MethodPost:
			var body struct {
				ID string `json:"id"`
			}
			if err := decodeJSON(r, &body); err != nil {
				return err
			}
			a, err := st.CreateAccount(ctx, body.ID)
			if err != nil {
				return walletAPIError(err)
			}
			w.WriteHeader(http.StatusCreated)
			return caddykit.WriteJSON(w, viewAccount(a))
		}
		return caddykit.OnlyMethod(r, http.MethodGet)
	case len(parts) == 2 && parts[0] == "accounts":
		if err := caddykit.OnlyMethod(r, http.MethodGet); err != nil {
			return err
		}
		a, err := st.Account(ctx, parts[1])
		if err != nil {
			return walletAPIError(err)
		}
		return caddykit.WriteJSON(w, viewAccount(a))
	case len(parts) == 3 && parts[0] == "accounts" && parts[2] == "credit":
		if err := caddykit.OnlyMethod(r, http.MethodPost); err != nil {
			return err
		}
		var body struct {
			Amount string `json:"amount"`
			Note   string `json:"note"`
		}
		if err := decodeJSON(r, &body); err != nil {
			return err
		}
		amount, err := wallet.ParseSignedMicros(body.Amount)
		if err != nil {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("amount: %w", err)}
		}
		a, err := st.Credit(ctx, parts[1], amount, body.Note)
		if err != nil {
			return walletAPIError(err)
		}
		return caddykit.WriteJSON(w, viewAccount(a))
	case len(parts) == 3 && parts[0] == "accounts" && parts[2] == "keys":
		switch r.Method {
		case http.MethodGet:
			keys, err := st.Keys(ctx, parts[1])
			if err != nil {
				return walletAPIError(err)
			}
			out := make([]KeyView, 0, len(keys))
			for _, k := range keys {
				out = append(out, viewKey(k))
			}
			return caddykit.WriteJSON(w, out)
		case http.MethodPost:
			var body struct {
				Label string `json:"label"`
			}
			if err := decodeJSON(r, &body); err != nil {
				return err
			}
			secret, k, err := st.CreateKey(ctx, parts[1], body.Label)
			if err != nil {
				return walletAPIError(err)
			}
			w.WriteHeader(http.StatusCreated)
			return caddykit.WriteJSON(w, map[string]any{"key": secret, "id": k.ID, "account": k.Account, "prefix": k.Prefix, "label": k.Label,
				"note": "store this key now: it is not kept and cannot be shown again"})
		}
		return caddykit.OnlyMethod(r, http.MethodGet)
	case len(parts) == 3 && parts[0] == "accounts" && parts[2] == "usage":
		if err := caddykit.OnlyMethod(r, http.MethodGet); err != nil {
			return err
		}
		// A cursor or a limit that does not read is refused, where the
		// first page would have a script page over it forever (before=0
		// is the newest, as in the store).
		before, err := queryInt(r, "before", 0, math.MaxInt64)
		if err != nil {
			return err
		}
		limit, err := queryInt(r, "limit", 1, math.MaxInt64)
		if err != nil {
			return err
		}
		if limit == 0 {
			limit = wallet.DefaultUsageLimit
		}
		limit = min(limit, wallet.MaxUsageLimit)
		rows, err := st.Usage(ctx, parts[1], before, int(limit))
		if err != nil {
			return walletAPIError(err)
		}
		out := struct {
			Entries []EntryView `json:"entries"`
			Next    int64       `json:"next_before,omitempty"`
		}{Entries: make([]EntryView, 0, len(rows))}
		for _, e := range rows {
			out.Entries = append(out.Entries, EntryView{ID: e.ID, Kind: e.Kind, KeyID: e.KeyID, Model: e.Model, Channel: e.Channel,
				RequestID: e.RequestID, TokensIn: e.TokensIn, TokensOut: e.TokensOut, Cost: e.Cost.String(), Note: e.Note, Time: e.Time,
				TokensCacheRead: e.TokensCacheRead, TokensCacheWrite: e.TokensCacheWrite, TokensCacheWrite1h: e.TokensCacheWrite1h,
				UpstreamModel: e.UpstreamModel, TraceID: e.TraceID})
		}
		if len(rows) == int(limit) {
			out.Next = rows[len(rows)-1].ID
		}
		return caddykit.WriteJSON(w, out)
	case path == "audit":
		if err := caddykit.OnlyMethod(r, http.MethodGet); err != nil {
			return err
		}
		rows, err := st.Audit(ctx, r.URL.Query().Get("account"))
		if err != nil {
			return walletAPIError(err)
		}
		return caddykit.WriteJSON(w, viewAudit(rows))
	case len(parts) == 3 && parts[0] == "keys" && parts[2] == "revoke":
		if err := caddykit.OnlyMethod(r, http.MethodPost); err != nil {
			return err
		}
		if err := st.RevokeKey(ctx, parts[1]); err != nil {
			return walletAPIError(err)
		}
		return caddykit.WriteJSON(w, map[string]string{"id": parts[1], "status": "revoked"})
	}
	return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no such wallet endpoint: %s", r.URL.Path)}
}

// AccountView is an account as the admin API shows it.
type AccountView struct {
	ID        string    `json:"id"`
	Balance   string    `json:"balance"`
	Reserved  string    `json:"reserved"`
	Available string    `json:"available"`
	CreatedAt time.Time `json:"created_at"`
}

func viewAccount(a wallet.Account) AccountView {
	return AccountView{ID: a.ID, Balance: a.Balance.String(), Reserved: a.Reserved.String(), Available: a.Available().String(), CreatedAt: a.CreatedAt}
}

// KeyView is the admin API's view of an API key, in the names the key's
// creation answers with.
type KeyView struct {
	ID        string     `json:"id"`
	Account   string     `json:"account"`
	Prefix    string     `json:"prefix"`
	Label     string     `json:"label"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

func viewKey(k wallet.Key) KeyView {
	return KeyView{ID: k.ID, Account: k.Account, Prefix: k.Prefix, Label: k.Label, CreatedAt: k.CreatedAt, RevokedAt: k.RevokedAt}
}

// queryInt reads the query parameter name as an integer in [lo, hi]; 0
// when it is absent.
func queryInt(r *http.Request, name string, lo, hi int64) (int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("%s: want a whole number from %d to %d, got %q", name, lo, hi, v)}
	}
	return n, nil
}

// AuditView is the admin API's audit: the accounts checked and those
// whose books disagree.
type AuditView struct {
	Accounts    int                `json:"accounts"`
	Clean       bool               `json:"clean"`
	Differences []AuditAccountView `json:"differences"`
}

// AuditAccountView is one account whose books disagree: the balance next
// to credits − charges, reserved next to the live reservations' sum.
type AuditAccountView struct {
	Account  string `json:"account"`
	Balance  string `json:"balance"`
	Ledger   string `json:"ledger"`
	Reserved string `json:"reserved"`
	Live     string `json:"live_reservations"`
}

func viewAudit(rows []wallet.AuditRow) AuditView {
	v := AuditView{Accounts: len(rows), Differences: []AuditAccountView{}}
	for _, r := range rows {
		if !r.Clean() {
			v.Differences = append(v.Differences, AuditAccountView{Account: r.Account, Balance: r.Balance.String(),
				Ledger: r.Ledger.String(), Reserved: r.Reserved.String(), Live: r.Live.String()})
		}
	}
	v.Clean = len(v.Differences) == 0
	return v
}

// EntryView is a ledger row as the admin API shows it.
type EntryView struct {
	ID        int64     `json:"id"`
	Kind      string    `json:"kind"`
	KeyID     string    `json:"key_id,omitempty"`
	Model     string    `json:"model,omitempty"`
	Channel   string    `json:"channel,omitempty"`
	RequestID string    `json:"request_id,omitempty"`
	TokensIn  int64     `json:"tokens_in"`
	TokensOut int64     `json:"tokens_out"`
	Cost      string    `json:"cost"`
	Note      string    `json:"note,omitempty"`
	Time      time.Time `json:"time"`
	// UpstreamModel is the name the channel knows Model by.
	UpstreamModel string `json:"upstream_model,omitempty"`
	// The parts of TokensIn read from the prompt cache and written to it
	// (5 minutes, 1 hour), charged at their own prices.
	TokensCacheRead    int64 `json:"tokens_cache_read,omitempty"`
	TokensCacheWrite   int64 `json:"tokens_cache_write,omitempty"`
	TokensCacheWrite1h int64 `json:"tokens_cache_write_1h,omitempty"`
	// TraceID is the request's OpenTelemetry trace ID, when it was traced.
	TraceID string `json:"trace_id,omitempty"`
}

func walletAPIError(err error) error {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, wallet.ErrUnknownAccount), errors.Is(err, wallet.ErrUnknownKey), errors.Is(err, wallet.ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, wallet.ErrAccountExists), errors.Is(err, wallet.ErrKeyRevoked):
		status = http.StatusConflict
	case errors.Is(err, wallet.ErrInvalid), errors.Is(err, wallet.ErrInsufficientFunds):
		status = http.StatusBadRequest
	}
	return caddy.APIError{HTTPStatus: status, Err: err}
}

func decodeJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		status := http.StatusBadRequest
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			status = http.StatusRequestEntityTooLarge
		}
		return caddy.APIError{HTTPStatus: status, Err: fmt.Errorf("decoding request body: %w", err)}
	}
	// One JSON object and nothing after it: a second one, or garbage, is
	// a client bug that must not move money on the strength of the first.
	if err := dec.Decode(&struct{}{}); err != io.EOF {
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: errors.New("decoding request body: more than one JSON value")}
	}
	return nil
}

// Interface guard
var _ caddy.AdminRouter = (*adminAPI)(nil)
