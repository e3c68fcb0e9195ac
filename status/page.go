// Package status is the llm_status handler (http.handlers.llm_status):
// the gateway's status page as HTML or JSON, the runbooks its links point
// to, and a readiness endpoint for load balancers. It renders the
// llm_failover app's status view and knows nothing of how requests are
// served.
package status

import (
	"bytes"
	"fmt"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
)

func init() {
	caddy.RegisterModule(Page{})
	httpcaddyfile.RegisterHandlerDirective("llm_status", parseStatusCaddyfile)
	// Before reverse_proxy, like llm_failover, so a status route needs no
	// `order` line (the anchor must be a standard directive).
	httpcaddyfile.RegisterDirectiveOrder("llm_status", httpcaddyfile.Before, "reverse_proxy")
}

// Page serves the gateway's status page: every model's status, its
// channels' breaker state, success rates, 48 hour and 90 day bars, recent
// failover decisions and incidents, as HTML (no external assets, no
// JavaScript needed) or, with `Accept: application/json` or
// `?format=json`, as JSON. It reads the running config's llm_failover app
// at request time, so one page shows every llm_failover handler.
type Page struct {
	// Title heads the page.
	Title string `json:"title,omitempty"`
	// HideChannels shows models only: no channel name or URL, for a
	// public page.
	HideChannels bool `json:"hide_channels,omitempty"`
	// Refresh reloads the page every this often; 0 never. Anything else
	// must be at least 1s (Validate).
	Refresh caddy.Duration `json:"refresh,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Page) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.llm_status",
		New: func() caddy.Module { return new(Page) },
	}
}

// Validate refuses a refresh the page's meta refresh, which counts whole
// seconds, cannot say: a negative one, or one under a second (it would
// silently mean never). A JSON config gets the Caddyfile's checks.
func (p *Page) Validate() error {
	if r := time.Duration(p.Refresh); r < 0 || (r > 0 && r < time.Second) {
		return fmt.Errorf("llm_status: refresh %s: want 0 (off) or at least 1s", r)
	}
	return nil
}

// ServeHTTP implements caddyhttp.Handler. It is a terminal handler.
func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return caddyhttp.Error(http.StatusMethodNotAllowed, fmt.Errorf("the status page answers GET"))
	}
	if strings.HasSuffix(r.URL.Path, "/ready") {
		serveReady(w, r)
		return nil
	}
	if i := strings.LastIndex(r.URL.Path, "/runbooks/"); i >= 0 {
		serveRunbook(w, r.URL.Path[i+len("/runbooks/"):])
		return nil
	}
	view := failoverapp.Status(time.Now(), p.Title, p.HideChannels)
	w.Header().Set("Cache-Control", "no-store")
	if wantsJSON(r) {
		return caddykit.WriteJSON(w, view)
	}
	var buf bytes.Buffer
	if err := render(&buf, view, time.Duration(p.Refresh), pageBase(r.URL.Path)); err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("rendering the status page: %w", err))
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	// Inline styles only; nothing loads from anywhere, no <base> other
	// than the page's own may move its links, and no other site may frame
	// it (X-Frame-Options for browsers that predate frame-ancestors).
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'self'; frame-ancestors 'none'")
	h.Set("X-Frame-Options", "DENY")
	_, err := w.Write(buf.Bytes())
	return err
}

// pageBase is the page's own path ending in "/", for its <base href>
// (runbook links are relative to it). The path is cleaned first: a
// request for //evil.example/status still matches `handle /status*`
// through Caddy's own cleaning, and its raw path as a base would be a
// network-path reference pointing the page's links at another host.
func pageBase(p string) string {
	return strings.TrimSuffix(path.Clean("/"+p), "/") + "/"
}

func wantsJSON(r *http.Request) bool {
	if f := r.URL.Query().Get("format"); f != "" {
		return f == "json"
	}
	return strings.Contains(r.Header.Get("Accept"), "application/json")
}

// parseStatusCaddyfile sets up the handler from Caddyfile tokens:
//
//	llm_status [<matcher>] {
//	    title <text>
//	    hide_channels
//	    refresh <duration>
//	}
func parseStatusCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	p := new(Page)
	err := p.UnmarshalCaddyfile(h.Dispenser)
	return p, err
}

// UnmarshalCaddyfile implements caddyfile.Unmarshaler.
func (p *Page) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive's name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := caddykit.Seen{}
	for d.NextBlock(0) {
		if err := seen.Once(d, "llm_status: "); err != nil {
			return err
		}
		switch d.Val() {
		case "title":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			p.Title = strings.Join(args, " ")
		case "hide_channels":
			if err := caddykit.NoMoreArgs(d); err != nil {
				return err
			}
			p.HideChannels = true
		case "refresh":
			dur, err := caddykit.DurationOrOffArg(d)
			if err == nil {
				err = caddykit.NoMoreArgs(d)
			}
			if err != nil {
				return err
			}
			p.Refresh = dur
			if err := p.Validate(); err != nil {
				return d.Err(err.Error())
			}
		default:
			return d.Errf("llm_status: unknown option %q", d.Val())
		}
	}
	return nil
}

// Interface guards
var (
	_ caddyhttp.MiddlewareHandler = (*Page)(nil)
	_ caddyfile.Unmarshaler       = (*Page)(nil)
	_ caddy.Validator             = (*Page)(nil)
)
