package failoverapp

import (
	"encoding/json"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("llm_failover", parseGlobalOption)
}

// parseGlobalOption sets up the app from the global option. Syntax:
//
//	llm_failover {
//		history        sqlite [<path>] | postgres <dsn>
//		probe_leader   postgres <dsn>
//		heartbeat      <job> <url> {
//			style   healthchecks|uptime_kuma|cronitor|generic
//			states  start|success|fail...
//			timeout <duration>
//		}
//		max_held_bytes <size>
//	}
//
// heartbeat repeats, one per receiver.
func parseGlobalOption(d *caddyfile.Dispenser, existing any) (any, error) {
	if existing != nil {
		return nil, d.Err("llm_failover is specified more than once")
	}
	app := new(App)
	d.Next() // consume option name
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	seen := caddykit.Seen{}
	for d.NextBlock(0) {
		opt := d.Val()
		if opt != "heartbeat" {
			if err := seen.Once(d, "llm_failover: "); err != nil {
				return nil, err
			}
		}
		var err error
		switch opt {
		case "history":
			app.HistoryRaw, err = unmarshalHistory(d)
		case "probe_leader":
			if !d.NextArg() || d.Val() != "postgres" || !d.NextArg() {
				return nil, d.Errf("probe_leader needs: postgres <dsn>")
			}
			app.ProbeLeader = &ProbeLeader{DSN: d.Val()}
			err = caddykit.NoMoreArgs(d)
		case "heartbeat":
			var hb caddykit.HeartbeatConfig
			if hb, err = caddykit.UnmarshalHeartbeat(d); err == nil {
				app.Heartbeats = append(app.Heartbeats, hb)
			}
		case "max_held_bytes":
			if app.MaxHeldBytes, err = caddykit.SizeArg(d); err == nil {
				err = caddykit.NoMoreArgs(d)
			}
		default:
			return nil, d.Errf("unrecognized llm_failover option '%s'", opt)
		}
		if err != nil {
			return nil, err
		}
	}
	return httpcaddyfile.App{Name: "llm_failover", Value: caddyconfig.JSON(app, nil)}, nil
}

// unmarshalHistory reads `history sqlite [<path>]` or `history postgres <dsn>`.
func unmarshalHistory(d *caddyfile.Dispenser) (json.RawMessage, error) {
	backend, arg, err := caddykit.DatabaseArgs(d, "history")
	if err != nil {
		return nil, err
	}
	var mod caddy.Module = &HistoryPostgres{DSN: arg}
	if backend == "sqlite" {
		mod = &HistorySQLite{Path: arg}
	}
	return caddyconfig.JSONModuleObject(mod, "backend", backend, nil), nil
}

// Interface guard
var _ httpcaddyfile.UnmarshalGlobalFunc = parseGlobalOption
