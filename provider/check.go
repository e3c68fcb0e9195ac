package provider

import (
	"fmt"
	"net/http"
	"strings"
)

// This file is what the doctor needs to know about providers beyond the
// synthetic request it shares with probes (probe.go): what a refusal of
// it means (each adapter adds its own provider's meanings, Hinter).

// Refusal is an upstream's refusal of a check request, or (Status 0) the
// adapter's failure to build one.
type Refusal struct {
	Status int
	// Path is the upstream path the check was sent to.
	Path string
	// UpstreamModel is the name the channel was asked for.
	UpstreamModel string
	// Message is the upstream's message (or the build error).
	Message string
}

// has reports whether the message holds any of subs.
func (r Refusal) has(subs ...string) bool {
	for _, s := range subs {
		if strings.Contains(r.Message, s) {
			return true
		}
	}
	return false
}

// Hinter is an adapter that knows what its provider's refusals mean.
type Hinter interface {
	// Hint says what to do about r; "" when it is none it knows.
	Hint(r Refusal) string
}

// Diagnose turns a refused check into a hint. ok is true when the refusal
// still shows that the key and the model were accepted (an upstream that
// wants another token limit parameter).
func Diagnose(a Adapter, r Refusal) (ok bool, hint string) {
	if r.Status == http.StatusBadRequest && r.has("max_tokens", "max_completion_tokens") {
		return true, ""
	}
	if h, isHinter := a.(Hinter); isHinter {
		if hint := h.Hint(r); hint != "" {
			return false, hint
		}
	}
	switch {
	case r.Status == 0:
		return false, "the channel's credentials could not be used: a key that was deleted or disabled is refused here too"
	case r.Status == http.StatusTooManyRequests:
		return false, "the upstream rate-limits or has no quota left for this key: check the account's plan, billing and limits"
	case r.Status == http.StatusUnauthorized || r.Status == http.StatusForbidden:
		return false, "the upstream refused the credentials: the key is wrong, expired or revoked; rotate the key in the channel's provider block or header"
	case r.Status == http.StatusNotFound:
		return false, fmt.Sprintf("nothing answers at %s: a base URL is scheme and host (optionally a proxy's path prefix) and the provider adds its own path, so drop any /v1 you added; or the model %s does not exist there", r.Path, r.UpstreamModel)
	}
	return false, "the upstream refused the check request; its message says why"
}
