package provider

import (
	"net/http"
	"net/url"
	"strings"
)

// Credentialed is implemented by adapters that hold credentials of their
// own besides the channel's headers (API keys, access keys, a service
// account's private key), so that the gateway can scrub them from
// everything it sends to clients and logs, and fold them into the
// channel's identity (a rotated key starts with fresh health).
type Credentialed interface {
	Credentials() []string
}

// LiveCredentialed is implemented by adapters whose credentials change
// while they run (an OAuth access token refreshed every hour): they must
// be masked as the fixed ones are, and are asked for whenever something
// is masked.
type LiveCredentialed interface {
	LiveCredentials() []string
}

// protocolHeaders are request headers a channel may set that carry no
// secret: they select API versions and features.
var protocolHeaders = map[string]bool{
	"Anthropic-Version": true, "Anthropic-Beta": true, "Openai-Beta": true,
	"Content-Type": true, "Accept": true, "User-Agent": true,
}

// ChannelCredentials returns the secrets a channel holds: the values of
// its base URL's credential parameters (?key=, ?api-key=), of its headers
// (placeholders already resolved) but the protocol ones, and the adapter's
// own credentials when it has any. base may be nil.
func ChannelCredentials(base *url.URL, header http.Header, a Adapter) []string {
	var out []string
	if base != nil {
		for k, vs := range base.Query() {
			if credentialParams[strings.ToLower(k)] {
				out = append(out, vs...)
			}
		}
	}
	for k, vs := range header {
		if !protocolHeaders[http.CanonicalHeaderKey(k)] {
			out = append(out, vs...)
		}
	}
	if c, ok := a.(Credentialed); ok {
		out = append(out, c.Credentials()...)
	}
	return out
}
