package walletapp

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
	"github.com/llmfailover/caddy-llm-failover/internal/pgconf"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

func init() {
	caddy.RegisterModule(SQLite{})
	caddy.RegisterModule(Postgres{})
}

// Backend is a store module (namespace llm_wallet.stores): it names a
// database and opens it. Provision only resolves the configuration; Open
// is what touches the database.
type Backend interface {
	// Kind is "sqlite" or "postgres", for the status endpoint.
	Kind() string
	// PoolKey identifies the database, so that wallets and configs using
	// the same one share one open store. It may hold secrets: never log it.
	PoolKey() string
	// Open opens (creating or migrating) the database.
	Open(o wallet.Options) (wallet.Store, error)
	// Remote reports whether the database is reached over the network and
	// may be down for a while: the wallet then starts without it and
	// connects in the background, instead of refusing the config.
	Remote() bool
}

// SQLite is the embedded store, for a single gateway instance.
type SQLite struct {
	// Path is the database file. Default: llm_failover/wallet.db under
	// Caddy's data directory.
	Path string `json:"path,omitempty"`

	abs string
}

// CaddyModule returns the Caddy module information.
func (SQLite) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "llm_wallet.stores.sqlite",
		New: func() caddy.Module { return new(SQLite) },
	}
}

// Provision resolves the path; it creates nothing.
func (s *SQLite) Provision(caddy.Context) error {
	path := s.Path
	if path == "" {
		path = filepath.Join(caddy.AppDataDir(), "llm_failover", "wallet.db")
	}
	// Resolved like a DSN: an unset {env.*} is an error naming it, never
	// a path with a hole (/wallet.db at the root).
	resolved, err := caddykit.Resolve(path)
	if err != nil {
		return fmt.Errorf("sqlite path: %w", err)
	}
	abs, err := filepath.Abs(resolved)
	if err != nil {
		return fmt.Errorf("sqlite path %q: %w", s.Path, err)
	}
	s.abs = abs
	return nil
}

// Kind implements Backend.
func (*SQLite) Kind() string { return "sqlite" }

// PoolKey implements Backend.
func (s *SQLite) PoolKey() string { return "sqlite:" + s.abs }

// Open implements Backend.
func (s *SQLite) Open(o wallet.Options) (wallet.Store, error) { return wallet.OpenSQLite(s.abs, o) }

// Remote implements Backend: a file cannot be down, so failing to open
// it is the config's mistake.
func (*SQLite) Remote() bool { return false }

// Postgres is a store shared by several gateway instances.
type Postgres struct {
	// DSN is the connection string; it may be a placeholder such as
	// {env.DATABASE_URL}, resolved at Provision and never shown.
	DSN string `json:"dsn"`

	dsn string
}

// CaddyModule returns the Caddy module information.
func (Postgres) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "llm_wallet.stores.postgres",
		New: func() caddy.Module { return new(Postgres) },
	}
}

// Provision resolves the DSN; it connects to nothing.
func (p *Postgres) Provision(caddy.Context) error {
	dsn, err := caddykit.Resolve(p.DSN)
	if err != nil {
		return fmt.Errorf("postgres DSN: %w", err)
	}
	// A DSN that cannot parse is the config's mistake, refused now; a
	// database that does not answer is an outage the wallet rides out.
	if err := pgconf.Validate(dsn); err != nil {
		return err
	}
	p.dsn = dsn
	return nil
}

// Remote implements Backend.
func (*Postgres) Remote() bool { return true }

// Kind implements Backend.
func (*Postgres) Kind() string { return "postgres" }

// PoolKey implements Backend.
func (p *Postgres) PoolKey() string { return "postgres:" + p.dsn }

// openTimeout bounds connecting and migrating.
const openTimeout = 15 * time.Second

// Open implements Backend.
func (p *Postgres) Open(o wallet.Options) (wallet.Store, error) {
	ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
	defer cancel()
	return wallet.OpenPostgres(ctx, p.dsn, o)
}

// Interface guards
var (
	_ Backend           = (*SQLite)(nil)
	_ Backend           = (*Postgres)(nil)
	_ caddy.Provisioner = (*SQLite)(nil)
	_ caddy.Provisioner = (*Postgres)(nil)
)
