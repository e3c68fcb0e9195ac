// Package walletapp is the prepaid wallet as a Caddy app (module ID
// llm_wallet): it owns the named wallets of a config, their stores (guest
// modules in the llm_wallet.stores namespace), the store's background
// sweeper, the admin API (admin.api.llm_wallet) and the `caddy llm-wallet`
// command.
//
// Handlers ask the app for a wallet by name during their Provision and
// call it per request; the app knows nothing about HTTP handlers, LLM APIs
// or prices. Stores are opened when the app starts (or when the first
// request needs one, whichever comes first), never in Provision, so that
// `caddy validate` changes nothing on disk. An open store is shared across
// config generations, so that a reload neither reopens it nor closes it
// under a request of the old config.
package walletapp

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/wallet"
)

func init() {
	caddy.RegisterModule(App{})
}

// Defaults.
const (
	// DefaultName is the wallet a handler or an admin call gets when it
	// names none.
	DefaultName = "default"
	// DefaultAdmissionTimeout bounds authentication plus reservation, so
	// that a slow store is an error on_store_error handles.
	DefaultAdmissionTimeout = 2 * time.Second
	// DefaultStatementTimeout bounds one store statement.
	DefaultStatementTimeout = 5 * time.Second
)

// App is the llm_wallet app: the config's named wallets.
type App struct {
	// Wallets by name. A handler that names no wallet uses "default";
	// with no wallet configured at all, "default" is an embedded SQLite
	// database under Caddy's data directory.
	Wallets map[string]*Config `json:"wallets,omitempty"`

	ctx     caddy.Context
	logger  *zap.Logger
	wallets map[string]*Wallet
}

// Config is one named wallet.
type Config struct {
	// StoreRaw is the wallet's store: {"backend":"sqlite","path":...} or
	// {"backend":"postgres","dsn":...}. Default: SQLite at
	// llm_failover/wallet.db under Caddy's data directory.
	StoreRaw json.RawMessage `json:"store,omitempty" caddy:"namespace=llm_wallet.stores inline_key=backend"`
	// ReservationTTL is how long a reservation may stay unsettled before
	// the sweeper releases it (after a crash). Default: 15m.
	ReservationTTL caddy.Duration `json:"reservation_ttl,omitempty"`
	// AdmissionTimeout bounds a request's key check and reservation
	// together. Default: 2s.
	AdmissionTimeout caddy.Duration `json:"admission_timeout,omitempty"`
	// StatementTimeout bounds each statement the store runs (PostgreSQL
	// statement_timeout, SQLite busy timeout). It applies from when a
	// database is first opened; a reload that keeps the database keeps
	// the open store and its timeout. Default: 5s.
	StatementTimeout caddy.Duration `json:"statement_timeout,omitempty"`
	// LeaseTTL is how long this instance's credit leases (the slices of
	// balances it serves reservations from, see package wallet) outlive
	// its last extension: after a crash, how long the money of its
	// requests stays reserved before another instance's sweep releases
	// it. The live instance extends them every third of it. At least 1s;
	// like statement_timeout it applies from when a database is first
	// opened. Default: 30s.
	LeaseTTL caddy.Duration `json:"lease_ttl,omitempty"`
}

// minLeaseTTL: leases are renewed every second (see keepalive.go), and a
// lease is only served from while less than two thirds of its TTL have
// passed since its renewal.
const minLeaseTTL = time.Second

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "llm_wallet",
		New: func() caddy.Module { return new(App) },
	}
}

// Provision loads each wallet's store module. It opens nothing.
func (a *App) Provision(ctx caddy.Context) error {
	a.ctx = ctx
	a.logger = ctx.Logger()
	a.wallets = make(map[string]*Wallet, len(a.Wallets))
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return err
	}
	for name, c := range a.Wallets {
		if name == "" {
			return errors.New("a wallet has an empty name")
		}
		if c == nil {
			c = new(Config)
		}
		w, err := a.provisionWallet(name, c)
		if err != nil {
			return fmt.Errorf("wallet %q: %w", name, err)
		}
		a.wallets[name] = w
	}
	return nil
}

func (a *App) provisionWallet(name string, c *Config) (*Wallet, error) {
	if c.ReservationTTL < 0 || c.AdmissionTimeout < 0 || c.StatementTimeout < 0 || c.LeaseTTL < 0 {
		return nil, errors.New("durations must not be negative")
	}
	if c.LeaseTTL != 0 && time.Duration(c.LeaseTTL) < minLeaseTTL {
		return nil, fmt.Errorf("lease_ttl %v is shorter than %v", time.Duration(c.LeaseTTL), minLeaseTTL)
	}
	var backend Backend
	if c.StoreRaw != nil {
		mod, err := a.ctx.LoadModule(c, "StoreRaw")
		if err != nil {
			return nil, fmt.Errorf("loading store: %w", err)
		}
		backend = mod.(Backend)
	} else {
		s := new(SQLite)
		if err := s.Provision(a.ctx); err != nil {
			return nil, err
		}
		backend = s
	}
	w := &Wallet{
		name:             name,
		backend:          backend,
		ttl:              orDefault(c.ReservationTTL, wallet.DefaultReservationTTL),
		admissionTimeout: orDefault(c.AdmissionTimeout, DefaultAdmissionTimeout),
		statementTimeout: orDefault(c.StatementTimeout, DefaultStatementTimeout),
		leaseTTL:         orDefault(c.LeaseTTL, wallet.DefaultLeaseTTL),
		logger:           a.logger.With(zap.String("wallet", name)),
	}
	return w, nil
}

func orDefault(d caddy.Duration, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return time.Duration(d)
}

// Wallet returns the wallet called name, for a handler's Provision. An
// empty name means the only wallet (an error when there are several);
// with no wallet
// configured, "default" is created on demand (embedded SQLite).
func (a *App) Wallet(name string) (*Wallet, error) {
	if name == "" {
		if len(a.wallets) > 1 {
			return nil, fmt.Errorf("several wallets exist (%s): name one", strings.Join(a.Names(), ", "))
		}
		for _, w := range a.wallets {
			return w, nil
		}
		name = DefaultName
	}
	if w, ok := a.wallets[name]; ok {
		return w, nil
	}
	if name == DefaultName && len(a.wallets) == 0 {
		w, err := a.provisionWallet(name, new(Config))
		if err != nil {
			return nil, fmt.Errorf("wallet %q: %w", name, err)
		}
		a.wallets[name] = w
		return w, nil
	}
	if len(a.wallets) == 0 {
		return nil, fmt.Errorf("no wallet named %q: declare it in the global llm_wallet option", name)
	}
	return nil, fmt.Errorf("no wallet named %q (configured: %s)", name, strings.Join(a.Names(), ", "))
}

// Names lists the wallets, sorted.
func (a *App) Names() []string {
	names := make([]string, 0, len(a.wallets))
	for n := range a.wallets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Start opens every wallet's store (shared with the previous config when
// it used the same database) and starts its sweeper. A remote store that
// does not answer does not refuse the config: a restart during a database
// outage must not take every site of this Caddy down. The wallet connects
// in the background, and billed requests follow on_store_error meanwhile.
func (a *App) Start() error {
	for _, name := range a.Names() {
		if _, err := a.wallets[name].Store(); err != nil && !errors.Is(err, ErrUnavailable) {
			return fmt.Errorf("wallet %q: %w", name, err)
		}
	}
	return nil
}

// Stop does nothing: the old config's requests may still be running, so
// the stores are released in Cleanup, which waits for them.
func (a *App) Stop() error { return nil }

// Cleanup releases the stores this config opened. A store no config uses
// any more closes once the requests that entered it have finished.
func (a *App) Cleanup() error {
	for _, w := range a.wallets {
		w.release()
	}
	return nil
}

// Interface guards
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)
