package failover

import (
	"net/http"
	"strings"

	"github.com/llmfailover/caddy-llm-failover/provider"
)

// This file decides who and what may reach the upstreams: which client
// paths are forwarded with the operator's credentials, and who may list
// the models. (The app warns about a handler that serves anyone on a
// public address.)

// refusePath answers a request whose path must not reach an upstream: a
// path that could climb out of a channel's base path (400), or one that is
// neither an LLM endpoint the providers serve nor forwarded by the
// operator (404). It reports whether it answered.
func (e *Engine) refusePath(x *exchange) bool {
	if err := provider.CheckPath(x.r.URL.EscapedPath()); err != nil {
		_ = e.refuse(x, provider.Error{Status: http.StatusBadRequest, Message: err.Error()})
		return true
	}
	if provider.Served(x.r.URL.Path) || e.forwards(x.r.URL.Path) {
		return false
	}
	_ = e.refuse(x, provider.Error{Status: http.StatusNotFound, Code: "unknown_url",
		Message: "unknown endpoint " + x.r.URL.Path + ": this gateway serves LLM API endpoints only"})
	return true
}

// forwards reports whether the operator forwards p explicitly
// (forward_path).
func (e *Engine) forwards(p string) bool {
	for _, f := range e.opts.ForwardPaths {
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
func (e *Engine) authorizeListing(x *exchange) *provider.Error {
	if e.wallet == nil {
		return nil
	}
	ctx, cancel := e.wallet.w.AdmissionContext(x.r.Context())
	defer cancel()
	_, _, refusal := e.wallet.authenticate(ctx, x)
	return refusal
}
