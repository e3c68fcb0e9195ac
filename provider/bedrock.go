package provider

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"
)

func init() {
	caddy.RegisterModule(Bedrock{})
}

// bedrockAnthropicVersion is the body field Bedrock requires of Claude
// calls.
const bedrockAnthropicVersion = `"anthropic_version":"bedrock-2023-05-31"`

// bedrockBetas are the anthropic-beta flags Bedrock accepts; it refuses a
// whole request naming any other, so the client's others are dropped.
var bedrockBetas = map[string]bool{
	"computer-use-2024-10-22": true, "computer-use-2025-01-24": true,
	"token-efficient-tools-2025-02-19": true, "interleaved-thinking-2025-05-14": true,
	"output-128k-2025-02-19": true, "dev-full-thinking-2025-05-14": true,
	"context-1m-2025-08-07": true, "context-management-2025-06-27": true,
	"tool-search-tool-2025-10-19": true, "tool-examples-2025-10-29": true,
	"effort-2025-11-24": true,
}

// Bedrock is AWS Bedrock's InvokeModel API for Claude:
// POST <base>/model/<model id>/invoke or /invoke-with-response-stream,
// signed with SigV4 (static keys or the AWS default credential chain) or
// sent with a Bedrock API key as a bearer token. Its binary event stream
// reaches the client as Anthropic's SSE, exception frames as Anthropic
// error events.
type Bedrock struct {
	// Region is the AWS region, such as us-east-1; it shapes the default
	// host and the signature.
	Region string `json:"region,omitempty"`
	// AccessKeyID, SecretAccessKey and SessionToken are static AWS
	// credentials. Default: the AWS default credential chain. Like
	// APIKey, they may hold {env.*} placeholders, resolved at Provision
	// (an unset variable is an error).
	AccessKeyID     string `json:"access_key_id,omitempty"`
	SecretAccessKey string `json:"secret_access_key,omitempty"`
	SessionToken    string `json:"session_token,omitempty"`
	// APIKey is a Bedrock API key, sent as a bearer token instead of a
	// signature.
	APIKey string `json:"api_key,omitempty"`

	passThrough
	creds  aws.CredentialsProvider
	signer *v4.Signer
	logger *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Bedrock) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: Namespace + ".bedrock", New: func() caddy.Module { return new(Bedrock) }}
}

// Provision sets up the credentials the requests are signed with.
func (b *Bedrock) Provision(ctx caddy.Context) error {
	b.logger = ctx.Logger()
	if err := resolveSecrets("bedrock", secret{"api_key", &b.APIKey}, secret{"access_key_id", &b.AccessKeyID},
		secret{"secret_access_key", &b.SecretAccessKey}, secret{"session_token", &b.SessionToken}); err != nil {
		return err
	}
	if b.APIKey != "" {
		return nil
	}
	if b.AccessKeyID != "" {
		b.creds = credentials.NewStaticCredentialsProvider(b.AccessKeyID, b.SecretAccessKey, b.SessionToken)
	} else {
		cfg, err := config.LoadDefaultConfig(ctx, config.WithRegion(b.Region))
		if err != nil {
			return fmt.Errorf("bedrock: loading the AWS default credential chain: %w", err)
		}
		b.creds = cfg.Credentials
	}
	b.creds = aws.NewCredentialsCache(b.creds)
	b.signer = v4.NewSigner()
	return nil
}

// Serves reports Anthropic's Messages API.
func (Bedrock) Serves(api API) bool { return api == AnthropicMessages }

// DefaultBaseURL is the region's bedrock-runtime endpoint.
func (b *Bedrock) DefaultBaseURL() string {
	if b.Region == "" {
		return ""
	}
	return "https://bedrock-runtime." + b.Region + ".amazonaws.com"
}

// CheckBaseURL refuses a channel without a region or with two kinds of
// credentials.
func (b *Bedrock) CheckBaseURL(u *url.URL) error {
	if err := noBaseQuery("bedrock", u); err != nil {
		return err
	}
	switch {
	case b.Region == "":
		return errors.New("the bedrock provider needs a region")
	case b.APIKey != "" && (b.AccessKeyID != "" || b.SecretAccessKey != ""):
		return errors.New("bedrock: set api_key or access keys, not both")
	case (b.AccessKeyID == "") != (b.SecretAccessKey == ""):
		return errors.New("bedrock: access_key_id and secret_access_key go together")
	case b.SessionToken != "" && b.AccessKeyID == "":
		return errors.New("bedrock: session_token needs access_key_id and secret_access_key")
	}
	return passThrough{}.CheckBaseURL(u)
}

// NewRequest builds and signs the upstream request of one attempt.
func (b *Bedrock) NewRequest(ctx context.Context, c Call) (*http.Request, error) {
	if b.logger == nil {
		return nil, errNotProvisioned
	}
	req, err := newRequest(ctx, c)
	if err != nil {
		return nil, err
	}
	id := modelOf(c)
	verb := "/invoke"
	if c.Request.Stream {
		verb = "/invoke-with-response-stream"
	}
	p := c.Base.Path + "/model/"
	req.URL = upstreamURL(c.Base, p+id+verb, p+strings.ReplaceAll(url.PathEscape(id), ":", "%3A")+verb, "")
	add := []string{bedrockAnthropicVersion}
	if betas := allowedBetas(req.Header.Values("Anthropic-Beta")); betas != nil {
		enc, _ := json.Marshal(betas)
		add = append(add, `"anthropic_beta":`+string(enc))
	}
	body := rewriteTop(c.Body, []string{"model", "stream", "anthropic_version", "anthropic_beta"}, add...)
	setBody(req, body)
	dropAnthropicHeaders(req.Header)
	req.Header.Set("Content-Type", "application/json")
	if b.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+b.APIKey)
		return req, nil
	}
	creds, err := b.creds.Retrieve(ctx)
	if err != nil {
		return nil, fmt.Errorf("bedrock: retrieving AWS credentials: %w", err)
	}
	sum := sha256.Sum256(body)
	if err := b.signer.SignHTTP(ctx, creds, req, hex.EncodeToString(sum[:]), "bedrock", b.Region, time.Now()); err != nil {
		return nil, fmt.Errorf("bedrock: signing: %w", err)
	}
	return req, nil
}

// allowedBetas keeps the beta flags Bedrock knows, from comma-separated
// header values.
func allowedBetas(values []string) []string {
	var out []string
	for _, v := range values {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); bedrockBetas[f] {
				out = append(out, f)
			}
		}
	}
	return out
}

// eventStreamType is the content type of Bedrock's binary stream.
const eventStreamType = "application/vnd.amazon.eventstream"

func isAWSEventStream(h http.Header) bool {
	return strings.HasPrefix(strings.ToLower(strings.TrimSpace(h.Get("Content-Type"))), eventStreamType)
}

// IsStream reports Bedrock's event stream (or plain SSE).
func (Bedrock) IsStream(h http.Header) bool { return isAWSEventStream(h) || isEventStream(h) }

// ResponseBody turns the event stream into Anthropic's SSE and Bedrock's
// error bodies into Anthropic's.
func (b *Bedrock) ResponseBody(res *http.Response) io.Reader {
	switch {
	case res.StatusCode < 300 && isAWSEventStream(res.Header):
		ctx := context.Background()
		if res.Request != nil {
			ctx = res.Request.Context()
		}
		return newEventStreamSSE(ctx, res.Body)
	case res.StatusCode >= 400 && isJSON(res.Header):
		return translateError(res, AnthropicMessages, func(msg string) string {
			msg = bedrockHint(msg)
			if b.logger != nil && strings.Contains(msg, "inference profile") {
				b.logger.Warn("bedrock refused the model id", zap.String("message", msg))
			}
			return msg
		})
	}
	return res.Body
}

// bedrockHint adds what to do when a model needs an inference profile.
func bedrockHint(msg string) string {
	if strings.Contains(msg, "on-demand throughput") {
		return msg + " (use the model's cross-region inference profile id as upstream_model, e.g. us.anthropic.claude-sonnet-4-5-20250929-v1:0)"
	}
	return msg
}

// CopyResponseHeader copies the answer's headers; an event stream is
// announced as the SSE it becomes.
func (Bedrock) CopyResponseHeader(dst, src http.Header) {
	copyResponseHeader(dst, src)
	if isAWSEventStream(src) {
		dst.Set("Content-Type", "text/event-stream")
	}
}

// Hint says what Bedrock's refusals of a check mean.
func (b *Bedrock) Hint(r Refusal) string {
	switch {
	case r.has("on-demand throughput", "inference profile"):
		return fmt.Sprintf("Bedrock serves %s only through an inference profile: set upstream_model to its profile id, e.g. us.%s", r.UpstreamModel, strings.TrimPrefix(r.UpstreamModel, "us."))
	case r.has("signature", "security token", "UnrecognizedClient"):
		return "AWS refused the credentials: the access key, secret or region do not match, or the key was deactivated; check the channel's provider block (or the environment it reads them from)"
	}
	return ""
}

// Credentials returns the API key or the static AWS keys.
func (b *Bedrock) Credentials() []string {
	return nonEmpty(b.APIKey, b.AccessKeyID, b.SecretAccessKey, b.SessionToken)
}

// UnmarshalCaddyfile sets up the adapter from `provider bedrock { ... }`.
func (b *Bedrock) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return unmarshalOptions(d, map[string]*string{
		"region": &b.Region, "access_key_id": &b.AccessKeyID, "secret_access_key": &b.SecretAccessKey,
		"session_token": &b.SessionToken, "api_key": &b.APIKey,
	})
}

// Interface guards
var (
	_ Adapter               = (*Bedrock)(nil)
	_ Credentialed          = (*Bedrock)(nil)
	_ Hinter                = (*Bedrock)(nil)
	_ caddy.Provisioner     = (*Bedrock)(nil)
	_ caddyfile.Unmarshaler = (*Bedrock)(nil)
)
