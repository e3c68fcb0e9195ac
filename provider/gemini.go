package provider

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func init() {
	caddy.RegisterModule(Gemini{})
}

// geminiPrefix is where Google AI Studio serves its OpenAI-compatible API.
const geminiPrefix = "/v1beta/openai"

// Gemini is Google AI Studio's OpenAI-compatible endpoint: client paths
// /v1/<path> go to <base>/v1beta/openai/<path>, with the key as a bearer
// token. Its errors, which Google may wrap in an array, reach the client
// in OpenAI's format.
type Gemini struct {
	passThrough
	// APIKey is the AI Studio key (GEMINI_API_KEY). It may hold {env.*}
	// placeholders, resolved at Provision (an unset variable is an error).
	APIKey string `json:"api_key,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Gemini) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: Namespace + ".gemini", New: func() caddy.Module { return new(Gemini) }}
}

// Provision resolves the api_key's placeholders ({env.GEMINI_API_KEY}).
func (g *Gemini) Provision(caddy.Context) error {
	return resolveSecrets("gemini", secret{"api_key", &g.APIKey})
}

// Serves reports the OpenAI APIs AI Studio's compatible endpoint has.
func (Gemini) Serves(api API) bool {
	return api == OpenAIChat || api == OpenAIEmbeddings || api == OpenAIModels
}

// DefaultBaseURL is AI Studio's API host.
func (Gemini) DefaultBaseURL() string { return "https://generativelanguage.googleapis.com" }

// CheckBaseURL refuses a base path ending in /v1, which would never reach
// /v1beta/openai.
func (Gemini) CheckBaseURL(u *url.URL) error {
	if err := noBaseQuery("gemini", u); err != nil {
		return err
	}
	return passThrough{}.CheckBaseURL(u)
}

// NewRequest builds the upstream request of one attempt.
func (g *Gemini) NewRequest(ctx context.Context, c Call) (*http.Request, error) {
	req, err := newRequest(ctx, c)
	if err != nil {
		return nil, err
	}
	req.URL = upstreamURL(c.Base, withPrefix(c.Base.Path, geminiPrefix)+apiTail(c.Client.URL.Path), "", clientQuery(c.Client.URL.RawQuery))
	if g.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+g.APIKey)
	}
	return req, nil
}

// ResponseBody translates Google's error bodies to OpenAI's format.
func (Gemini) ResponseBody(res *http.Response) io.Reader {
	if res.StatusCode >= 400 && isJSON(res.Header) {
		return translateError(res, OpenAIChat, nil)
	}
	return res.Body
}

// Hint says what Gemini's refusals of a check mean.
func (g *Gemini) Hint(r Refusal) string {
	switch {
	case r.has("API key not valid", "API_KEY_INVALID"):
		return "Google refused the credentials: the api_key is wrong, deleted, or restricted to other APIs; create one in Google AI Studio"
	case r.Status == http.StatusNotFound:
		return fmt.Sprintf("nothing answers at %s: the base URL is scheme and host and the provider adds /v1beta/openai itself, so drop any /v1beta you added; or the model %s does not exist there", r.Path, r.UpstreamModel)
	}
	return ""
}

// Credentials returns the API key.
func (g *Gemini) Credentials() []string { return nonEmpty(g.APIKey) }

// UnmarshalCaddyfile sets up the adapter from `provider gemini { ... }`.
func (g *Gemini) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return unmarshalOptions(d, map[string]*string{"api_key": &g.APIKey})
}

// Interface guards
var (
	_ Adapter               = (*Gemini)(nil)
	_ Credentialed          = (*Gemini)(nil)
	_ Hinter                = (*Gemini)(nil)
	_ caddy.Provisioner     = (*Gemini)(nil)
	_ caddyfile.Unmarshaler = (*Gemini)(nil)
)
