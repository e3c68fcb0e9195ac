// Package caddykit holds the small pieces of Caddy glue that the
// llm_failover handler and the llm_wallet app share: Caddyfile argument
// readers, admin API answers and metric registration. It knows Caddy and
// nothing of LLM APIs, channels or money.
package caddykit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/dustin/go-humanize"
	"github.com/prometheus/client_golang/prometheus"
)

// Seen remembers where each option of one block was written, so that a
// repeated option is an error pointing at both places instead of the last
// one silently winning.
type Seen map[string]string

// Once fails if the dispenser's current option was already seen in this
// block; what prefixes the message (e.g. "breaker: ").
func (s Seen) Once(d *caddyfile.Dispenser, what string) error {
	opt := d.Val()
	if first, dup := s[opt]; dup {
		return d.Errf("%s%s specified more than once (first at %s)", what, opt, first)
	}
	s[opt] = Position(d)
	return nil
}

// Position is where the dispenser's current token was written, as
// caddyfile.Dispenser.Errf reports it.
func Position(d *caddyfile.Dispenser) string {
	return fmt.Sprintf("%s:%d", d.File(), d.Line())
}

// DurationArg reads the option's one argument as a duration (Caddy's
// syntax, days included). A Caddyfile duration is never negative.
//
// Zero is refused: a zero duration in the JSON means "the default", so
// `header_timeout 0` would silently mean 240 s to someone who meant
// "none". Options where 0 means off read DurationOrOffArg.
func DurationArg(d *caddyfile.Dispenser) (caddy.Duration, error) {
	opt := d.Val()
	dur, err := DurationOrOffArg(d)
	if err == nil && dur == 0 {
		return 0, d.Errf("%s: 0 is not a duration this option can take (in the JSON, 0 means its default); omit the option for the default", opt)
	}
	return dur, err
}

// DurationOrOffArg is DurationArg for an option whose 0 means off.
func DurationOrOffArg(d *caddyfile.Dispenser) (caddy.Duration, error) {
	opt := d.Val()
	if !d.NextArg() {
		return 0, d.ArgErr()
	}
	dur, err := caddy.ParseDuration(d.Val())
	if err != nil || dur < 0 {
		return 0, d.Errf("%s: bad duration %q", opt, d.Val())
	}
	return caddy.Duration(dur), nil
}

// IntArg reads the option's next argument as an integer of at least min.
func IntArg(d *caddyfile.Dispenser, min int) (int, error) {
	opt := d.Val()
	if !d.NextArg() {
		return 0, d.ArgErr()
	}
	n, err := strconv.Atoi(d.Val())
	if err != nil || n < min {
		return 0, d.Errf("%s: %q must be an integer of at least %d", opt, d.Val(), min)
	}
	return n, nil
}

// SizeArg reads the option's next argument as a size in bytes ("10MiB").
func SizeArg(d *caddyfile.Dispenser) (int64, error) {
	opt := d.Val()
	if !d.NextArg() {
		return 0, d.ArgErr()
	}
	n, err := humanize.ParseBytes(d.Val())
	if err != nil || n == 0 || n > 1<<62 {
		return 0, d.Errf("%s: bad size %q", opt, d.Val())
	}
	return int64(n), nil
}

// DatabaseArgs reads the arguments that name a database, `sqlite
// [<path>]` or `postgres <dsn>`, for the option opt (store, history):
// the backend, and its path or DSN ("" for SQLite's default path).
func DatabaseArgs(d *caddyfile.Dispenser, opt string) (backend, arg string, err error) {
	if !d.NextArg() {
		return "", "", d.Errf("%s needs sqlite [<path>] or postgres <dsn>", opt)
	}
	switch backend = d.Val(); backend {
	case "sqlite":
		if d.NextArg() {
			arg = d.Val()
		}
	case "postgres":
		if !d.NextArg() {
			return "", "", d.Errf("%s postgres needs a DSN, e.g. {env.DATABASE_URL}", opt)
		}
		arg = d.Val()
	default:
		return "", "", d.Errf("%s: unknown store %q (want sqlite or postgres)", opt, backend)
	}
	return backend, arg, NoMoreArgs(d)
}

// NoMoreArgs fails when the option has arguments left over.
func NoMoreArgs(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// OnlyMethod refuses an admin request of any other method with 405.
func OnlyMethod(r *http.Request, method string) error {
	if r.Method != method {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed; use %s", r.Method, method)}
	}
	return nil
}

// WriteJSON answers an admin request with v as indented JSON.
func WriteJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// Register adds package-level collectors to a config's metrics registry.
// Caddy makes a new registry per config load; collectors that live at
// package level keep their counts across `caddy reload`, and registering
// one twice in the same registry is not an error.
func Register(reg prometheus.Registerer, collectors ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if !errors.As(err, &already) {
				return fmt.Errorf("registering metrics: %w", err)
			}
		}
	}
	return nil
}

// AdminCall sends one request to Caddy's admin API at admin, with body
// (when not nil) as JSON, and decodes the JSON answer into out (when not
// nil). An answer of 400 or more is an error carrying the API's message.
func AdminCall(admin, method, path string, body, out any) error {
	var rd io.Reader
	hdr := http.Header{}
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
		hdr.Set("Content-Type", "application/json")
	}
	resp, err := caddycmd.AdminAPIRequest(admin, method, path, hdr, rd)
	if err != nil {
		// AdminAPIRequest wraps the dial error with %v: only its text
		// is left to tell a refused connection.
		if errors.Is(err, syscall.ECONNREFUSED) || strings.Contains(err.Error(), "connection refused") {
			return fmt.Errorf("nothing answers at Caddy's admin address %s: is caddy running? If its admin address is another, "+
				"give it with --address, or the config that sets it with --config, as for caddy reload: %w", admin, err)
		}
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decoding admin answer: %w", err)
	}
	return nil
}
