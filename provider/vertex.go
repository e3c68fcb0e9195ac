package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"golang.org/x/oauth2/google"
)

func init() {
	caddy.RegisterModule(Vertex{})
}

// cloudPlatformScope is the OAuth scope Vertex AI needs.
const cloudPlatformScope = "https://www.googleapis.com/auth/cloud-platform"

// vertexAnthropicVersion is the body field Vertex requires of Claude calls.
const vertexAnthropicVersion = `"anthropic_version":"vertex-2023-10-16"`

// Vertex is Google Vertex AI: Claude through Anthropic's Messages API at
// .../publishers/anthropic/models/<model>:rawPredict (or
// :streamRawPredict), and Gemini and other models through the
// OpenAI-compatible .../endpoints/openapi/chat/completions. Requests carry
// an OAuth access token from a service account's JSON or the application
// default credentials, kept fresh in the background.
type Vertex struct {
	// Project is the Google Cloud project id.
	Project string `json:"project,omitempty"`
	// Region is the location, such as us-east5; "global" uses the global
	// endpoint.
	Region string `json:"region,omitempty"`
	// CredentialsFile is a service account's JSON key. Default: the
	// application default credentials.
	CredentialsFile string `json:"credentials_file,omitempty"`

	passThrough
	tokens  *tokenKeeper
	secrets []string
}

// CaddyModule returns the Caddy module information.
func (Vertex) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: Namespace + ".vertex", New: func() caddy.Module { return new(Vertex) }}
}

// Provision loads the credentials and starts keeping a token.
func (v *Vertex) Provision(ctx caddy.Context) error {
	var creds *google.Credentials
	if err := resolveSecrets("vertex", secret{"credentials_file", &v.CredentialsFile}); err != nil {
		return err
	}
	var err error
	fetchCtx, stopFetches := tokenFetchContext()
	if v.CredentialsFile != "" {
		var data []byte
		if data, err = os.ReadFile(v.CredentialsFile); err != nil {
			stopFetches()
			return fmt.Errorf("vertex credentials_file: %w", err)
		}
		creds, err = google.CredentialsFromJSONWithType(fetchCtx, data, google.ServiceAccount, cloudPlatformScope)
		if err != nil {
			stopFetches()
			return fmt.Errorf("vertex credentials_file %s: %w", v.CredentialsFile, err)
		}
	} else if creds, err = google.FindDefaultCredentials(fetchCtx, cloudPlatformScope); err != nil {
		stopFetches()
		return fmt.Errorf("vertex: no credentials_file and no application default credentials: %w", err)
	}
	v.secrets = jsonSecrets(creds.JSON)
	v.tokens = newTokenKeeper(creds.TokenSource, ctx.Logger())
	v.tokens.stopFetches = stopFetches
	return nil
}

// Cleanup stops the token refresh.
func (v *Vertex) Cleanup() error {
	if v.tokens != nil {
		v.tokens.stop()
	}
	return nil
}

// Serves reports Anthropic's Messages API (Claude) and OpenAI chat (the
// OpenAI-compatible endpoint).
func (Vertex) Serves(api API) bool { return api == AnthropicMessages || api == OpenAIChat }

// ModelAPI is the API Vertex serves model over: Anthropic's Messages for
// Claude (publishers/anthropic), the OpenAI-compatible endpoint for the
// rest. A probe of a Claude route sent to the OpenAI endpoint is refused
// ("is not publisher/model"); the soak found it.
func (Vertex) ModelAPI(model string) API {
	if strings.HasPrefix(model, "claude") {
		return AnthropicMessages
	}
	return OpenAIChat
}

// DefaultBaseURL is the region's endpoint.
func (v *Vertex) DefaultBaseURL() string {
	switch v.Region {
	case "":
		return ""
	case "global":
		return "https://aiplatform.googleapis.com"
	}
	return "https://" + v.Region + "-aiplatform.googleapis.com"
}

// CheckBaseURL refuses a channel without project or region, which shape
// every path, and a base path ending in /v1.
func (v *Vertex) CheckBaseURL(u *url.URL) error {
	if err := noBaseQuery("vertex", u); err != nil {
		return err
	}
	if v.Project == "" || v.Region == "" {
		return fmt.Errorf("the vertex provider needs project and region")
	}
	if strings.HasSuffix(u.Path, "/v1") {
		return fmt.Errorf("its path ends in /v1, which the vertex provider adds itself: drop it")
	}
	return nil
}

// NewRequest builds the upstream request of one attempt.
func (v *Vertex) NewRequest(ctx context.Context, c Call) (*http.Request, error) {
	if v.tokens == nil {
		return nil, errNotProvisioned
	}
	token, err := v.tokens.token(ctx)
	if err != nil {
		return nil, fmt.Errorf("vertex: %w", err)
	}
	req, err := newRequest(ctx, c)
	if err != nil {
		return nil, err
	}
	prefix := withPrefix(c.Base.Path, "/v1/projects/"+v.Project+"/locations/"+v.Region)
	if c.API == OpenAIChat {
		req.URL = upstreamURL(c.Base, prefix+"/endpoints/openapi/chat/completions", "", clientQuery(c.Client.URL.RawQuery))
	} else {
		model := modelOf(c)
		verb := ":rawPredict"
		if c.Request.Stream {
			verb = ":streamRawPredict"
		}
		p := prefix + "/publishers/anthropic/models/"
		req.URL = upstreamURL(c.Base, p+model+verb, p+url.PathEscape(model)+verb, "")
		setBody(req, rewriteTop(c.Body, []string{"model", "anthropic_version"}, vertexAnthropicVersion))
		dropAnthropicHeaders(req.Header)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	return req, nil
}

// ResponseBody translates Google's error bodies to the client API's
// format.
func (Vertex) ResponseBody(res *http.Response) io.Reader {
	if res.StatusCode >= 400 && isJSON(res.Header) {
		api := AnthropicMessages
		if res.Request != nil && strings.HasSuffix(res.Request.URL.Path, "/chat/completions") {
			api = OpenAIChat
		}
		return translateError(res, api, vertexHint)
	}
	return res.Body
}

// vertexHint adds what to do about Vertex's common configuration errors.
func vertexHint(msg string) string {
	switch {
	case strings.Contains(msg, "not allowed to use Publisher Model"), strings.Contains(msg, "FAILED_PRECONDITION"):
		return msg + " (enable the model for this project in Vertex AI Model Garden)"
	case strings.Contains(msg, "per_base_model"):
		return msg + " (a new project's quota for this model is often 0: request a quota increase)"
	}
	return msg
}

// Hint says what Vertex's refusals of a check mean.
func (v *Vertex) Hint(r Refusal) string {
	switch {
	case r.Status == 0:
		return "the channel's Google credentials could not be used: check credentials_file (a service account's JSON key) or the application default credentials (GOOGLE_APPLICATION_CREDENTIALS, gcloud auth application-default login); a key that was deleted or disabled is refused here too"
	case r.has("FAILED_PRECONDITION", "not allowed to use Publisher Model", "Publisher Model"):
		return fmt.Sprintf("the model %s is not enabled for this Google Cloud project: enable it in Vertex AI Model Garden (and accept its terms) for the channel's region", r.UpstreamModel)
	case r.Status == http.StatusTooManyRequests && r.has("per_base_model", "Quota exceeded"):
		return "the project's quota for this model is 0 or used up (new Vertex projects start at 0 for Claude): request an increase under IAM & Admin, Quotas, for the model in the channel's region"
	}
	return ""
}

// Credentials returns the service account's private key (its
// long-lived secret; the access tokens are LiveCredentials).
func (v *Vertex) Credentials() []string { return v.secrets }

// LiveCredentials returns the access tokens requests were sent with
// lately: the current one and the one it replaced (an answer to a
// request sent before a refresh may echo the old one).
func (v *Vertex) LiveCredentials() []string {
	if v.tokens == nil {
		return nil
	}
	return v.tokens.recent()
}

// UnmarshalCaddyfile sets up the adapter from `provider vertex { ... }`.
func (v *Vertex) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return unmarshalOptions(d, map[string]*string{"project": &v.Project, "region": &v.Region, "credentials_file": &v.CredentialsFile})
}

var errNotProvisioned = fmt.Errorf("provider: adapter used before Provision")

// jsonSecrets picks the secrets of a Google credentials JSON.
func jsonSecrets(data []byte) []string {
	var f struct {
		PrivateKey   string `json:"private_key"`
		ClientSecret string `json:"client_secret"`
		RefreshToken string `json:"refresh_token"`
	}
	_ = json.Unmarshal(data, &f)
	return nonEmpty(f.PrivateKey, f.ClientSecret, f.RefreshToken)
}

// dropAnthropicHeaders removes what Anthropic's own API takes as headers
// and the cloud providers refuse (Vertex answers 400 to betas it does not
// know) or take in the body.
func dropAnthropicHeaders(h http.Header) {
	for _, k := range []string{"Anthropic-Beta", "Anthropic-Version", "X-Api-Key"} {
		delete(h, k)
	}
}

// setBody replaces the request's body.
func setBody(req *http.Request, body []byte) {
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	req.ContentLength = int64(len(body))
}

// Interface guards
var (
	_ Adapter               = (*Vertex)(nil)
	_ Credentialed          = (*Vertex)(nil)
	_ LiveCredentialed      = (*Vertex)(nil)
	_ Hinter                = (*Vertex)(nil)
	_ caddy.Provisioner     = (*Vertex)(nil)
	_ caddy.CleanerUpper    = (*Vertex)(nil)
	_ caddyfile.Unmarshaler = (*Vertex)(nil)
)
