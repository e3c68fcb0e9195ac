package llmfailover

import (
	"net"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/provider"
)

// This file decides who and what may reach the upstreams: which client
// paths are forwarded with the operator's credentials, who may list the
// models, and the warning for a handler that serves anyone on a public
// address.

// refusePath answers a request whose path must not reach an upstream: a
// path that could climb out of a channel's base path (400), or one that is
// neither an LLM endpoint the providers serve nor forwarded by the
// operator (404). It reports whether it answered.
func (h *Handler) refusePath(x *exchange) bool {
	if err := provider.CheckPath(x.r.URL.EscapedPath()); err != nil {
		_ = h.refuse(x, provider.Error{Status: http.StatusBadRequest, Message: err.Error()})
		return true
	}
	if provider.Served(x.r.URL.Path) || h.forwards(x.r.URL.Path) {
		return false
	}
	_ = h.refuse(x, provider.Error{Status: http.StatusNotFound, Code: "unknown_url",
		Message: "unknown endpoint " + x.r.URL.Path + ": this gateway serves LLM API endpoints only"})
	return true
}

// forwards reports whether the operator forwards p explicitly
// (forward_path).
func (h *Handler) forwards(p string) bool {
	for _, f := range h.ForwardPaths {
		if prefix, ok := strings.CutSuffix(f, "/*"); ok {
			if p == prefix || strings.HasPrefix(p, prefix+"/") {
				return true
			}
		} else if p == f {
			return true
		}
	}
	return false
}

// authorizeListing applies the wallet's client authentication to GET
// /v1/models, which reserves nothing: a key (or account) the wallet would
// refuse for a completion is refused here too.
func (h *Handler) authorizeListing(x *exchange) *provider.Error {
	if h.wallet == nil {
		return nil
	}
	ctx, cancel := h.wallet.w.AdmissionContext(x.r.Context())
	defer cancel()
	_, _, refusal := h.wallet.authenticate(ctx, x)
	return refusal
}

// warnUnauthenticated logs, once per config (when the llm_failover app
// starts, every handler provisioned), each server that runs an
// llm_failover handler without client authentication (no wallet, no
// `auth off`) and listens beyond loopback: anyone who reaches it is
// answered with the operator's upstream credentials. Handlers behind
// Caddy's own authentication (basic_auth, forward_auth) should use the
// wallet's account placeholder or say `auth off`.
func warnUnauthenticated(ctx caddy.Context, logger *zap.Logger) {
	httpApp, err := ctx.AppIfConfigured("http")
	if err != nil || httpApp == nil {
		return
	}
	for name, srv := range httpApp.(*caddyhttp.App).Servers {
		if !unauthenticated(srv.Routes) || loopbackOnly(srv.Listen) {
			continue
		}
		logger.Warn("llm_failover serves this server's clients without authentication, paid with the channels' credentials; "+
			"configure a wallet (keys), a wallet account placeholder behind basic_auth or forward_auth, or say `auth off` if that is intended",
			zap.String("server", name), zap.Strings("listen", srv.Listen))
	}
}

// unauthenticated reports whether routes hold an llm_failover handler
// with neither a wallet nor auth off, subroutes included.
func unauthenticated(routes caddyhttp.RouteList) bool {
	for _, r := range routes {
		for _, mh := range r.Handlers {
			switch v := mh.(type) {
			case *Handler:
				if v.Wallet == nil && v.Auth != "off" {
					return true
				}
			case *caddyhttp.Subroute:
				if unauthenticated(v.Routes) {
					return true
				}
			}
		}
	}
	return false
}

// loopbackOnly reports whether every listen address is a loopback one.
func loopbackOnly(listen []string) bool {
	if len(listen) == 0 {
		return false
	}
	for _, l := range listen {
		addr, err := caddy.ParseNetworkAddress(l)
		if err != nil {
			return false
		}
		if addr.IsUnixNetwork() {
			continue
		}
		host := addr.Host
		if host == "localhost" {
			continue
		}
		ip := net.ParseIP(host)
		if ip == nil || !ip.IsLoopback() {
			return false
		}
	}
	return true
}
