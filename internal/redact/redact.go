// Package redact removes secrets from text that leaves the gateway: the
// operator's configured credentials, wherever an upstream echoes them, and
// anything shaped like a credential in messages quoted from upstreams.
//
// It knows strings and HTTP headers only: not where the secrets come from
// (channels, adapters) nor where the text goes (clients, logs).
package redact

import (
	"bytes"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// Mask replaces every secret this package removes.
const Mask = "[REDACTED]"

// minSecret is the shortest configured value treated as a secret: shorter
// header values (a version, "true") are not credentials, and masking them
// would mangle ordinary words.
const minSecret = 8

// Secrets masks a fixed set of known secrets. The zero value and nil mask
// nothing.
type Secrets struct {
	r *strings.Replacer
	// probes are what Bytes looks for before it rewrites anything: every
	// value that holds no other (where a value holds its own token, the
	// token alone is found wherever the value is), grouped by its first
	// minSecret bytes. Keys of one vendor share them ("sk-proj-"), so ten
	// keys cost about one look, not ten.
	probes []probe
}

// probe is the values that begin with one prefix of minSecret bytes.
type probe struct {
	prefix []byte
	values [][]byte
}

// NewSecrets returns a Secrets masking each value of at least minSecret
// bytes and, for a value of the form "<scheme> <token>" (Bearer, Basic),
// its token alone, which is what upstreams most often echo.
func NewSecrets(values ...string) *Secrets {
	var all []string
	add := func(v string) {
		if v = strings.TrimSpace(v); len(v) >= minSecret && !slices.Contains(all, v) {
			all = append(all, v)
		}
	}
	for _, v := range values {
		add(v)
		if _, token, ok := strings.Cut(strings.TrimSpace(v), " "); ok {
			add(token)
		}
	}
	if len(all) == 0 {
		return &Secrets{}
	}
	// Longest first: strings.Replacer tries the old strings in argument
	// order at each position, so a value wins over its own token.
	slices.SortFunc(all, func(a, b string) int { return len(b) - len(a) })
	pairs := make([]string, 0, 2*len(all))
	var probes []probe
	for i, v := range all {
		pairs = append(pairs, v, Mask)
		if slices.ContainsFunc(all[i+1:], func(w string) bool { return strings.Contains(v, w) }) {
			continue
		}
		prefix := []byte(v[:minSecret])
		at := slices.IndexFunc(probes, func(p probe) bool { return bytes.Equal(p.prefix, prefix) })
		if at < 0 {
			probes = append(probes, probe{prefix: prefix})
			at = len(probes) - 1
		}
		probes[at].values = append(probes[at].values, []byte(v))
	}
	return &Secrets{r: strings.NewReplacer(pairs...), probes: probes}
}

// String returns s with every known secret masked.
func (s *Secrets) String(in string) string {
	if s == nil || s.r == nil || in == "" {
		return in
	}
	return s.r.Replace(in)
}

// Bytes returns b with every known secret masked: b itself, not copied,
// when it holds none, which is what model output on its way to a client
// almost always is (a look for each secret is far cheaper than a rewrite).
func (s *Secrets) Bytes(b []byte) []byte {
	if s == nil || s.r == nil {
		return b
	}
	for _, p := range s.probes {
		for rest := b; ; {
			i := bytes.Index(rest, p.prefix)
			if i < 0 {
				break
			}
			rest = rest[i:]
			for _, v := range p.values {
				if bytes.HasPrefix(rest, v) {
					return []byte(s.r.Replace(string(b)))
				}
			}
			rest = rest[1:]
		}
	}
	return b
}

// Contains reports whether in holds a known secret.
func (s *Secrets) Contains(in string) bool {
	return s.String(in) != in
}

// Header deletes from h every header whose name or value holds a known
// secret: a header echoing a key is not worth keeping half-masked.
func (s *Secrets) Header(h http.Header) {
	if s == nil || s.r == nil {
		return
	}
	for k, vs := range h {
		if s.Contains(k) {
			delete(h, k)
			continue
		}
		for _, v := range vs {
			if s.Contains(v) {
				delete(h, k)
				break
			}
		}
	}
}

// Message returns a message quoted from an upstream with its known secrets
// and its credential-shaped strings masked.
func (s *Secrets) Message(in string) string {
	return Shapes(s.String(in))
}

// credentialShapes match what credentials look like whoever issued them:
// an Authorization-style scheme and token, and the sk-/key- style prefixed
// keys. longTokens are unbroken runs of key characters, masked when they
// mix letters and digits, so that long words and numbers stay readable.
var (
	credentialShapes = regexp.MustCompile(`(?i)\b(?:bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{8,}` +
		`|\b(?:sk|pk|rk|key|api|xai|gsk)[-_][A-Za-z0-9._-]{8,}` +
		`|\bAKIA[A-Z0-9]{16}\b|\bAIza[A-Za-z0-9_-]{20,}`)
	longTokens = regexp.MustCompile(`[A-Za-z0-9_+/=-]{32,}`)
)

// Shapes masks credential-shaped strings in s.
func Shapes(s string) string {
	if !mayHoldShape(s) {
		// Most messages ("The server is overloaded") hold none: this
		// scan costs a fraction of the two regular expressions, which
		// every failover's message would otherwise pay.
		return s
	}
	s = credentialShapes.ReplaceAllLiteralString(s, Mask)
	return longTokens.ReplaceAllStringFunc(s, func(m string) string {
		if mixed(m) {
			return Mask
		}
		return m
	})
}

// shapeStarts are the lower-case words every credentialShapes match
// begins with, at a word boundary.
var shapeStarts = [...]string{"bearer", "basic", "token", "sk", "pk", "rk", "key", "api", "xai", "gsk", "akia", "aiza"}

// mayHoldShape reports whether s could hold a match of credentialShapes or
// longTokens: one of shapeStarts at a word boundary (in any case, as the
// expression's (?i) reads it), or a run of 32 longTokens characters.
// False means Shapes has nothing to mask. Any byte beyond ASCII makes it
// true: (?i) folds some non-ASCII letters onto ASCII ones (ſ is s, the
// Kelvin sign k), which only the expressions get right.
func mayHoldShape(s string) bool {
	run := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x80 {
			return true
		}
		if isTokenChar(c) {
			if run++; run >= 32 {
				return true
			}
		} else {
			run = 0
		}
		if (i == 0 || !isWordChar(s[i-1])) && isWordChar(c) {
			for _, w := range shapeStarts {
				if len(s)-i >= len(w) && strings.EqualFold(s[i:i+len(w)], w) {
					return true
				}
			}
		}
	}
	return false
}

// isTokenChar is longTokens' character class.
func isTokenChar(c byte) bool {
	return isWordChar(c) || c == '+' || c == '/' || c == '=' || c == '-'
}

// isWordChar is what \b takes for a word character: ASCII letters, digits
// and the underscore.
func isWordChar(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_'
}

func mixed(s string) bool {
	letter, digit := false, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			digit = true
		case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			letter = true
		}
	}
	return letter && digit
}

// URL is u as views, events and error messages may show it: its
// userinfo and the values of its query, either of which may hold a
// credential (?key=, ?api-key=), are masked; the scheme, host, path and
// the query's parameter names stay readable.
func URL(u *url.URL) string {
	c := *u
	c.User, c.RawQuery, c.ForceQuery, c.Fragment, c.RawFragment = nil, "", false, "", ""
	s := c.String()
	if u.User != nil {
		s = strings.Replace(s, "//", "//"+Mask+"@", 1)
	}
	if u.RawQuery != "" {
		params := strings.FieldsFunc(u.RawQuery, func(r rune) bool { return r == '&' || r == ';' })
		for i, p := range params {
			name, _, _ := strings.Cut(p, "=")
			params[i] = name + "=" + Mask
		}
		s += "?" + strings.Join(params, "&")
	}
	return s
}
