package llmfailover

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// serveWalletAdmin serves /llm_failover/wallet/...:
//
//	GET  status                               store kind, reachability, sweeper heartbeat
//	GET  accounts                             every account's balance
//	POST accounts            {"id"}           create an account
//	GET  accounts/<id>                        one balance
//	POST accounts/<id>/credit {"amount","note"} add money (a negative amount corrects)
//	GET  accounts/<id>/keys                   list keys (never the secrets)
//	POST accounts/<id>/keys  {"label"}        create a key; the secret is in this answer only
//	GET  accounts/<id>/usage?before=&limit=   ledger, newest first, paged
//	POST keys/<key_id>/revoke                 revoke a key
func serveWalletAdmin(w http.ResponseWriter, r *http.Request, path string) error {
	holder := activeWallet()
	if holder == nil {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("no llm_failover handler has a wallet configured")}
	}
	st := holder.store
	ctx := r.Context()
	parts := strings.Split(path, "/")
	switch {
	case path == "status":
		if err := onlyMethod(r, http.MethodGet); err != nil {
			return err
		}
		last, sweepErr := holder.heartbeat()
		status := map[string]any{"store": holder.kind, "reachable": true, "last_sweep": last, "sweep_every": sweepEvery.String()}
		if sweepErr != "" {
			status["last_sweep_error"] = sweepErr
		}
		if err := st.Ping(ctx); err != nil {
			status["reachable"] = false
			status["error"] = err.Error()
		}
		return writeJSON(w, status)
	case path == "accounts":
		switch r.Method {
		case http.MethodGet:
			accts, err := st.Accounts(ctx)
			if err != nil {
				return walletAPIError(err)
			}
			out := make([]accountView, 0, len(accts))
			for _, a := range accts {
				out = append(out, viewAccount(a))
			}
			return writeJSON(w, out)
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
			return writeJSON(w, viewAccount(a))
		}
		return onlyMethod(r, http.MethodGet)
	case len(parts) == 2 && parts[0] == "accounts":
		if err := onlyMethod(r, http.MethodGet); err != nil {
			return err
		}
		a, err := st.Account(ctx, parts[1])
		if err != nil {
			return walletAPIError(err)
		}
		return writeJSON(w, viewAccount(a))
	case len(parts) == 3 && parts[0] == "accounts" && parts[2] == "credit":
		if err := onlyMethod(r, http.MethodPost); err != nil {
			return err
		}
		var body struct {
			Amount string `json:"amount"`
			Note   string `json:"note"`
		}
		if err := decodeJSON(r, &body); err != nil {
			return err
		}
		neg := strings.HasPrefix(body.Amount, "-")
		amount, err := wallet.ParseMicros(strings.TrimPrefix(body.Amount, "-"))
		if err != nil {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("amount: %w", err)}
		}
		if neg {
			amount = -amount
		}
		a, err := st.Credit(ctx, parts[1], amount, body.Note)
		if err != nil {
			return walletAPIError(err)
		}
		return writeJSON(w, viewAccount(a))
	case len(parts) == 3 && parts[0] == "accounts" && parts[2] == "keys":
		switch r.Method {
		case http.MethodGet:
			keys, err := st.Keys(ctx, parts[1])
			if err != nil {
				return walletAPIError(err)
			}
			if keys == nil {
				keys = []wallet.Key{}
			}
			return writeJSON(w, keys)
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
			return writeJSON(w, map[string]any{"key": secret, "id": k.ID, "account": k.Account, "prefix": k.Prefix, "label": k.Label,
				"note": "store this key now: it is not kept and cannot be shown again"})
		}
		return onlyMethod(r, http.MethodGet)
	case len(parts) == 3 && parts[0] == "accounts" && parts[2] == "usage":
		if err := onlyMethod(r, http.MethodGet); err != nil {
			return err
		}
		before, _ := strconv.ParseInt(r.URL.Query().Get("before"), 10, 64)
		limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
		if limit <= 0 || limit > 1000 {
			limit = 100
		}
		rows, err := st.Usage(ctx, parts[1], before, limit)
		if err != nil {
			return walletAPIError(err)
		}
		out := struct {
			Entries []entryView `json:"entries"`
			Next    int64       `json:"next_before,omitempty"`
		}{Entries: make([]entryView, 0, len(rows))}
		for _, e := range rows {
			out.Entries = append(out.Entries, entryView{ID: e.ID, Kind: e.Kind, KeyID: e.KeyID, Model: e.Model, Channel: e.Channel,
				RequestID: e.RequestID, TokensIn: e.TokensIn, TokensOut: e.TokensOut, Cost: e.Cost.String(), Note: e.Note, Time: e.Time})
		}
		if len(rows) == limit {
			out.Next = rows[len(rows)-1].ID
		}
		return writeJSON(w, out)
	case len(parts) == 3 && parts[0] == "keys" && parts[2] == "revoke":
		if err := onlyMethod(r, http.MethodPost); err != nil {
			return err
		}
		if err := st.RevokeKey(ctx, parts[1]); err != nil {
			return walletAPIError(err)
		}
		return writeJSON(w, map[string]string{"id": parts[1], "status": "revoked"})
	}
	return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no such wallet endpoint: %s", r.URL.Path)}
}

type accountView struct {
	ID        string    `json:"id"`
	Balance   string    `json:"balance"`
	Reserved  string    `json:"reserved"`
	Available string    `json:"available"`
	CreatedAt time.Time `json:"created_at"`
}

func viewAccount(a wallet.Account) accountView {
	return accountView{ID: a.ID, Balance: a.Balance.String(), Reserved: a.Reserved.String(), Available: a.Available().String(), CreatedAt: a.CreatedAt}
}

type entryView struct {
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
}

// activeWallet is the store of the running config's first handler with a
// wallet.
func activeWallet() *storeHolder {
	if reg := activeRegistry(); reg != nil {
		return reg.walletStore()
	}
	return nil
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
		return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("decoding request body: %w", err)}
	}
	return nil
}
