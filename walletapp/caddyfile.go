package walletapp

import (
	"encoding/json"
	"fmt"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("llm_wallet", parseGlobalOption)
}

// parseGlobalOption sets up one named wallet; the option repeats, one
// block per name. Syntax:
//
//	llm_wallet [<name>] {
//		store sqlite [<path>] | store postgres <dsn>
//		reservation_ttl   <duration>
//		admission_timeout <duration>
//		statement_timeout <duration>
//		lease_ttl         <duration>
//	}
func parseGlobalOption(d *caddyfile.Dispenser, existing any) (any, error) {
	app := new(App)
	if prev, ok := existing.(httpcaddyfile.App); ok {
		if err := json.Unmarshal(prev.Value, app); err != nil {
			return nil, fmt.Errorf("merging llm_wallet options: %w", err)
		}
	}
	if app.Wallets == nil {
		app.Wallets = map[string]*Config{}
	}
	d.Next() // consume option name
	name := DefaultName
	if d.NextArg() {
		name = d.Val()
	}
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	if _, dup := app.Wallets[name]; dup {
		return nil, d.Errf("llm_wallet %q is defined twice", name)
	}
	c, err := unmarshalConfig(d)
	if err != nil {
		return nil, err
	}
	app.Wallets[name] = c
	return httpcaddyfile.App{Name: "llm_wallet", Value: caddyconfig.JSON(app, nil)}, nil
}

func unmarshalConfig(d *caddyfile.Dispenser) (*Config, error) {
	c := new(Config)
	seen := caddykit.Seen{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if err := seen.Once(d, "llm_wallet: "); err != nil {
			return nil, err
		}
		var err error
		switch opt {
		case "store":
			c.StoreRaw, err = unmarshalStore(d)
		case "reservation_ttl":
			c.ReservationTTL, err = caddykit.DurationArg(d)
		case "admission_timeout":
			c.AdmissionTimeout, err = caddykit.DurationArg(d)
		case "statement_timeout":
			c.StatementTimeout, err = caddykit.DurationArg(d)
		case "lease_ttl":
			c.LeaseTTL, err = caddykit.DurationArg(d)
		default:
			return nil, d.Errf("unrecognized llm_wallet option '%s'", opt)
		}
		if err == nil && opt != "store" {
			err = caddykit.NoMoreArgs(d)
		}
		if err != nil {
			return nil, err
		}
	}
	return c, nil
}

func unmarshalStore(d *caddyfile.Dispenser) (json.RawMessage, error) {
	backend, arg, err := caddykit.DatabaseArgs(d, "store")
	if err != nil {
		return nil, err
	}
	var mod caddy.Module = &Postgres{DSN: arg}
	if backend == "sqlite" {
		mod = &SQLite{Path: arg}
	}
	return caddyconfig.JSONModuleObject(mod, "backend", backend, nil), nil
}
