package provider

import (
	"net/url"
	"strings"
)

// credentialParams name the query parameters through which some API takes
// a credential: Google's key, Azure's api-key, OAuth's access_token, and
// the spellings other gateways accept. The gateway authenticates clients by
// header only, so such a parameter is never the gateway's own; forwarded,
// it would hand a client's key to a third party, or, where the upstream
// prefers the query to the header the channel set (Google does), run the
// request on the client's account.
var credentialParams = map[string]bool{
	"key": true, "api-key": true, "api_key": true, "apikey": true,
	"x-api-key": true, "x-goog-api-key": true,
	"access_token": true, "token": true, "auth": true, "authorization": true,
}

// clientQuery is the client's raw query an upstream may see: every pair
// whose name is a credential parameter (in any case, percent-encoded or
// not) is dropped, the rest kept byte for byte in their order. A pair is
// also read as split at ';', as some servers split it, and dropped when
// any part names a credential; a name that does not unescape is dropped,
// since what an upstream would make of it cannot be known.
func clientQuery(raw string) string {
	if raw == "" {
		return ""
	}
	var out strings.Builder
	for pair := range strings.SplitSeq(raw, "&") {
		if pair == "" || !plainParam(pair) {
			continue
		}
		if out.Len() > 0 {
			out.WriteByte('&')
		}
		out.WriteString(pair)
	}
	return out.String()
}

// plainParam reports whether no ';'-separated part of pair names a
// credential parameter.
func plainParam(pair string) bool {
	for part := range strings.SplitSeq(pair, ";") {
		name, _, _ := strings.Cut(part, "=")
		name, err := url.QueryUnescape(name)
		if err != nil || credentialParams[strings.ToLower(strings.TrimSpace(name))] {
			return false
		}
	}
	return true
}
