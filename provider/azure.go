package provider

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
)

func init() {
	caddy.RegisterModule(Azure{})
}

// Azure is Azure OpenAI. With api_version v1 (the default) requests go to
// <base>/openai/v1/<path> with the deployment name as "model"; with a
// dated api_version they go to
// <base>/openai/deployments/<upstream model>/<path>?api-version=<date>,
// where the deployment in the path chooses the model, except the
// Responses API's, which go to <base>/openai/responses?api-version=<date>
// with the deployment as "model".
type Azure struct {
	passThrough
	// APIVersion is "v1" (default) or a dated version such as 2024-10-21.
	APIVersion string `json:"api_version,omitempty"`
	// APIKey is sent as the api-key header. It may hold {env.*}
	// placeholders, resolved at Provision (an unset variable is an error).
	APIKey string `json:"api_key,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Azure) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: Namespace + ".azure", New: func() caddy.Module { return new(Azure) }}
}

// Provision resolves the api_key's placeholders ({env.AZURE_OPENAI_API_KEY}).
func (a *Azure) Provision(caddy.Context) error {
	return resolveSecrets("azure", secret{"api_key", &a.APIKey})
}

// Serves reports the OpenAI APIs Azure OpenAI has.
func (Azure) Serves(api API) bool { return !api.Anthropic() && api != Unknown }

// DefaultBaseURL is "": every Azure resource has its own host.
func (Azure) DefaultBaseURL() string { return "" }

var azureDate = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}(-preview)?$`)

func (a *Azure) dated() bool { return a.APIVersion != "" && a.APIVersion != "v1" }

// CheckBaseURL refuses an api_version that is neither v1 nor a date, and
// a base path that would double the client's /v1.
func (a *Azure) CheckBaseURL(u *url.URL) error {
	if err := noBaseQuery("azure", u); err != nil {
		return err
	}
	if a.dated() && !azureDate.MatchString(a.APIVersion) {
		return fmt.Errorf("azure api_version %q is neither v1 nor a date such as 2024-10-21", a.APIVersion)
	}
	p := strings.TrimSuffix(u.Path, "/")
	if strings.HasSuffix(p, "/v1") && !(strings.HasSuffix(p, "/openai/v1") && !a.dated()) {
		return fmt.Errorf("its path ends in /v1, which the azure provider adds itself: drop it")
	}
	return nil
}

// NewRequest builds the upstream request of one attempt.
func (a *Azure) NewRequest(ctx context.Context, c Call) (*http.Request, error) {
	req, err := newRequest(ctx, c)
	if err != nil {
		return nil, err
	}
	tail := apiTail(c.Client.URL.Path)
	if a.dated() {
		q := url.Values{"api-version": {a.APIVersion}}.Encode()
		if cq := clientQuery(c.Client.URL.RawQuery); cq != "" {
			q = cq + "&" + q
		}
		if c.API == OpenAIResponses {
			// The Responses API has no deployment in its path: the body's
			// "model" (the deployment, renamed by newRequest) chooses it.
			req.URL = upstreamURL(c.Base, withPrefix(c.Base.Path, "/openai")+tail, "", q)
		} else {
			dep := modelOf(c)
			prefix := withPrefix(c.Base.Path, "/openai") + "/deployments/"
			req.URL = upstreamURL(c.Base, prefix+dep+tail, prefix+url.PathEscape(dep)+tail, q)
		}
	} else {
		req.URL = upstreamURL(c.Base, withPrefix(c.Base.Path, "/openai/v1")+tail, "", clientQuery(c.Client.URL.RawQuery))
	}
	if a.APIKey != "" {
		req.Header.Set("Api-Key", a.APIKey)
	}
	return req, nil
}

// Hint says what Azure's refusals of a check mean.
func (a *Azure) Hint(r Refusal) string {
	switch {
	case r.has("DeploymentNotFound", "API deployment for this resource does not exist"):
		return fmt.Sprintf("the Azure resource has no deployment named %q: upstream_model must be the deployment's name (Azure AI Foundry, Deployments), not the model's", r.UpstreamModel)
	case r.has("API version not supported", "api-version"), r.Status == http.StatusNotFound && strings.Contains(r.Path, "/openai/deployments/"):
		return "Azure does not serve this api_version on this path: use api_version v1 (the default, /openai/v1/...) or a dated version the resource supports, such as 2024-10-21"
	case r.has("invalid subscription key"):
		return "Azure refused the credentials: the api_key is wrong, or belongs to another resource than the base URL's; copy Key 1 from the resource's Keys and Endpoint page"
	case r.Status == http.StatusNotFound:
		return fmt.Sprintf("nothing answers at %s: the base URL is the resource's endpoint (https://<resource>.openai.azure.com) and the provider adds /openai itself, so drop any /openai or /v1 you added", r.Path)
	}
	return ""
}

// Credentials returns the API key.
func (a *Azure) Credentials() []string { return nonEmpty(a.APIKey) }

// UnmarshalCaddyfile sets up the adapter from `provider azure { ... }`.
func (a *Azure) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return unmarshalOptions(d, map[string]*string{"api_version": &a.APIVersion, "api_key": &a.APIKey})
}

// unmarshalOptions reads a provider block of single-argument options.
func unmarshalOptions(d *caddyfile.Dispenser, opts map[string]*string) error {
	d.Next() // consume the adapter name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := caddykit.Seen{}
	for d.NextBlock(0) {
		dst, ok := opts[d.Val()]
		if !ok {
			return d.Errf("unrecognized provider option '%s'", d.Val())
		}
		if err := seen.Once(d, "provider: "); err != nil {
			return err
		}
		if !d.NextArg() {
			return d.ArgErr()
		}
		*dst = d.Val()
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	return nil
}

func nonEmpty(vals ...string) []string {
	var out []string
	for _, v := range vals {
		if v != "" {
			out = append(out, v)
		}
	}
	return out
}

// Interface guards
var (
	_ Adapter               = (*Azure)(nil)
	_ Credentialed          = (*Azure)(nil)
	_ Hinter                = (*Azure)(nil)
	_ caddy.Provisioner     = (*Azure)(nil)
	_ caddyfile.Unmarshaler = (*Azure)(nil)
)
