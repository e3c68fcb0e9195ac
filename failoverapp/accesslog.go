package failoverapp

import (
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// ReadsClientKeys is implemented by a handler that takes the gateway's
// own API keys (wallet keys) from the client's request headers.
type ReadsClientKeys interface {
	ReadsClientKeys() bool
}

// keyHeaders are the request headers a wallet key arrives in. Caddy's
// access log redacts Authorization (unless should_log_credentials is
// on) but writes the other two in clear.
var keyHeaders = []string{"Authorization", "X-Api-Key", "Api-Key"}

// warnKeysInAccessLog logs, once per config, each server that reads
// wallet keys and whose access log would write one in clear, naming the
// headers and the filter that hides them. It asks each log's own encoder:
// a request carrying a marker in every key header is encoded exactly as
// the access log would encode it, so any filter that hides the value
// (delete, replace, hash, regexp, nested wraps) counts, and one keyed
// with the wrong case (request>headers>x-api-key, which Caddy never
// matches) does not.
func warnKeysInAccessLog(ctx caddy.Context, logger *zap.Logger) {
	httpApp, err := ctx.AppIfConfigured("http")
	if err != nil || httpApp == nil {
		return
	}
	logging := loggingConfig(ctx)
	if logging == nil {
		logger.Debug("cannot see the logging config; not checking access logs for wallet keys")
		return
	}
	for name, srv := range httpApp.(*caddyhttp.App).Servers {
		if srv.Logs == nil || !readsClientKeys(srv) {
			continue
		}
		leaked := headersLoggedInClear(logging, srv.Logs)
		if len(leaked) == 0 {
			continue
		}
		logger.Warn("this server's access log writes the wallet keys clients send in clear; "+
			"add to its log block: format filter { request>headers>X-Api-Key delete  request>headers>Api-Key delete } (see docs/security.md)",
			zap.String("server", name), zap.Strings("headers", leaked))
	}
}

// readsClientKeys reports whether a server has a handler that reads
// wallet keys, in its routes, subroutes or named routes.
func readsClientKeys(srv *caddyhttp.Server) bool {
	reads := func(h caddyhttp.MiddlewareHandler) bool {
		v, ok := h.(ReadsClientKeys)
		return ok && v.ReadsClientKeys()
	}
	if anyHandler(srv.Routes, reads) {
		return true
	}
	for _, r := range srv.NamedRoutes {
		if r != nil && anyHandler(caddyhttp.RouteList{*r}, reads) {
			return true
		}
	}
	return false
}

// headersLoggedInClear returns the key headers that some log receiving
// the server's access entries would write in clear.
func headersLoggedInClear(logging *caddy.Logging, cfg *caddyhttp.ServerLogConfig) []string {
	const marker = "llmf-access-log-check-"
	req, _ := http.NewRequest(http.MethodPost, "http://localhost/v1/messages", nil)
	for _, h := range keyHeaders {
		v := marker + h
		if h == "Authorization" {
			v = "Bearer " + v
		}
		req.Header.Set(h, v)
	}
	field := zap.Object("request", caddyhttp.LoggableHTTPRequest{Request: req, ShouldLogCredentials: cfg.ShouldLogCredentials})
	var leaked []string
	for _, loggerName := range accessLoggerNames(cfg) {
		for _, cl := range logging.Logs {
			if cl == nil || !logAccepts(cl, loggerName) {
				continue
			}
			enc := logEncoder(cl)
			if enc == nil {
				continue
			}
			buf, err := enc.Clone().EncodeEntry(zapcore.Entry{
				Level: zapcore.InfoLevel, Time: time.Now(), LoggerName: loggerName, Message: "handled request",
			}, []zapcore.Field{field})
			if err != nil {
				continue
			}
			for _, h := range keyHeaders {
				if strings.Contains(buf.String(), marker+h) && !slices.Contains(leaked, h) {
					leaked = append(leaked, h)
				}
			}
			buf.Free()
		}
	}
	slices.Sort(leaked)
	return leaked
}

// accessLoggerNames are the logger names the access entries of the
// server's LLM requests are written under: caddyhttp's access logger is
// "http.log.access", with the logger name of the request's host
// appended. Hosts no logger is named for go to the bare name only when
// the server names none at all: the Caddyfile names every site's hosts
// (and sets a default for a site without one), so a request for another
// host never reaches a site's handler, and counting it would warn about
// every correctly filtered config.
func accessLoggerNames(cfg *caddyhttp.ServerLogConfig) []string {
	full := func(n string) string {
		if n == "" {
			return "http.log.access"
		}
		return "http.log.access." + n
	}
	var names []string
	if cfg.DefaultLoggerName != "" || len(cfg.LoggerNames) == 0 {
		names = append(names, full(cfg.DefaultLoggerName))
	}
	for _, hostNames := range cfg.LoggerNames {
		for _, n := range hostNames {
			if !slices.Contains(names, full(n)) {
				names = append(names, full(n))
			}
		}
	}
	return names
}

// logAccepts applies a custom log's include and exclude lists to a
// logger name exactly as Caddy's filtering core does: the longest
// matching namespace wins, and an exclude of "*" rejects every module's
// entries.
func logAccepts(cl *caddy.CustomLog, name string) bool {
	if len(cl.Include) == 0 && len(cl.Exclude) == 0 {
		return true
	}
	name += "."
	var accept, reject int
	for _, ns := range cl.Include {
		if strings.HasPrefix(name, ns+".") && len(ns) > accept {
			accept = len(ns)
		}
	}
	if len(cl.Include) > 0 && accept == 0 {
		return false
	}
	for _, ns := range cl.Exclude {
		if ns == "*" {
			return false
		}
		if strings.HasPrefix(name, ns+".") && len(ns) > reject {
			reject = len(ns)
		}
	}
	if reject > accept {
		return false
	}
	return accept > reject || (len(cl.Include) == 0 && reject == 0)
}

// loggingConfig is the config's logging section. Caddy keeps the config
// a context belongs to unexported and offers no accessor, so it is read
// by reflection; a Caddy that renames the field makes this nil (and the
// check is skipped), which TestLoggingConfigIsVisible catches on upgrade.
func loggingConfig(ctx caddy.Context) *caddy.Logging {
	cfg, ok := unexported[*caddy.Config](reflect.ValueOf(&ctx).Elem(), "cfg")
	if !ok || cfg == nil {
		return nil
	}
	return cfg.Logging
}

// logEncoder is a custom log's provisioned encoder (unexported in Caddy,
// like the config; nil when it cannot be read).
func logEncoder(cl *caddy.CustomLog) zapcore.Encoder {
	enc, _ := unexported[zapcore.Encoder](reflect.ValueOf(&cl.BaseLog).Elem(), "encoder")
	return enc
}

// unexported reads the unexported field name of the addressable struct v
// when it has type T.
func unexported[T any](v reflect.Value, name string) (T, bool) {
	var zero T
	f := v.FieldByName(name)
	if !f.IsValid() || f.Type() != reflect.TypeFor[T]() {
		return zero, false
	}
	return reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Interface().(T), true
}
