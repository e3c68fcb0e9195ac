package failoverapp

import (
	"net"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// OpenToAnyone is implemented by a handler that answers with the
// operator's upstream credentials: ServesAnyone reports whether it does
// so for whoever reaches it (no client authentication, and not declared
// on purpose).
type OpenToAnyone interface {
	ServesAnyone() bool
}

// warnUnauthenticated logs, once per config (when the app starts, every
// handler provisioned), each server that has a handler serving anyone and
// listens beyond loopback: anyone who reaches it is answered with the
// operator's upstream credentials.
func warnUnauthenticated(ctx caddy.Context, logger *zap.Logger) {
	httpApp, err := ctx.AppIfConfigured("http")
	if err != nil || httpApp == nil {
		return
	}
	for name, srv := range httpApp.(*caddyhttp.App).Servers {
		if !servesAnyone(srv.Routes) || loopbackOnly(srv.Listen) {
			continue
		}
		logger.Warn("llm_failover serves this server's clients without authentication, paid with the channels' credentials; "+
			"configure a wallet (keys), a wallet account placeholder behind basic_auth or forward_auth, or say `auth off` if that is intended",
			zap.String("server", name), zap.Strings("listen", srv.Listen))
	}
}

// servesAnyone reports whether routes hold a handler serving anyone,
// subroutes included.
func servesAnyone(routes caddyhttp.RouteList) bool {
	return anyHandler(routes, func(h caddyhttp.MiddlewareHandler) bool {
		v, ok := h.(OpenToAnyone)
		return ok && v.ServesAnyone()
	})
}

// anyHandler reports whether a handler of routes, or of their
// subroutes, satisfies is.
func anyHandler(routes caddyhttp.RouteList, is func(caddyhttp.MiddlewareHandler) bool) bool {
	for _, r := range routes {
		for _, mh := range r.Handlers {
			if is(mh) {
				return true
			}
			if sub, ok := mh.(*caddyhttp.Subroute); ok && anyHandler(sub.Routes, is) {
				return true
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
