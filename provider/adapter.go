package provider

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func init() {
	caddy.RegisterModule(OpenAI{})
	caddy.RegisterModule(Anthropic{})
}

// Namespace is the Caddy module namespace of the adapters.
const Namespace = "http.handlers.llm_failover.providers"

// Adapter is the kind of upstream a channel is: how a request is sent to it
// and how its answer is read. Adapters are Caddy modules in Namespace.
type Adapter interface {
	// Serves reports whether the upstream can answer the API.
	Serves(api API) bool
	// DefaultBaseURL is the base URL of a channel that names none, or ""
	// when a channel must name one.
	DefaultBaseURL() string
	// CheckBaseURL refuses a base URL that cannot work with the client
	// paths joined to it.
	CheckBaseURL(u *url.URL) error
	// NewRequest builds the upstream request of one attempt.
	NewRequest(ctx context.Context, c Call) (*http.Request, error)
	// ResponseBody returns the answer's body in the framing the client's
	// API expects.
	ResponseBody(res *http.Response) io.Reader
	// CopyResponseHeader copies the answer's headers a client may see.
	CopyResponseHeader(dst, src http.Header)
	// IsStream reports whether the answer is an event stream.
	IsStream(h http.Header) bool
	// IsJSON reports whether the answer is a JSON document.
	IsJSON(h http.Header) bool
}

// Call is what NewRequest needs to build one attempt's request.
type Call struct {
	API API
	// Base is the channel's base URL, without a trailing slash; the
	// client's path and query are joined to it.
	Base *url.URL
	// Client is the client's request: its path, query and headers.
	Client *http.Request
	// Body is the request body to send (the client's, or AskUsage's).
	Body []byte
	// Request is Body parsed; it locates the model to rename.
	Request Request
	// UpstreamModel, when set, replaces the model name in Body.
	UpstreamModel string
	// Header holds the channel's own headers, set on top of the client's.
	Header http.Header
	// PassHeader names client headers the operator forwards besides the
	// API's own allowlist.
	PassHeader []string
	// Continuation, when set, says that Body continues a stream another
	// channel broke (stream_resume), and in which form. In a Prefill its
	// final assistant message is the text delivered so far: an adapter
	// whose upstream must be told to continue it, rather than answer
	// after it, says so its own way.
	Continuation ContinuationForm
}

// OpenAI is an OpenAI-compatible upstream: the client's path is joined to
// the base URL and sent as is, whatever the API (such hosts often serve
// /v1/messages too).
type OpenAI struct {
	// Continuation is how the host is asked to continue a chat answer
	// (continuation.go): prefix, continue_final_message or prefill for a
	// host that continues a final assistant message, or instructed (the
	// default: the OpenAI API has no prefill).
	Continuation string `json:"continuation,omitempty"`

	passThrough
}

// CaddyModule returns the Caddy module information.
func (OpenAI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: Namespace + ".openai", New: func() caddy.Module { return new(OpenAI) }}
}

// Serves reports true: an OpenAI-compatible host is sent every API.
func (OpenAI) Serves(API) bool { return true }

// DefaultBaseURL is "": OpenAI-compatible hosts are many.
func (OpenAI) DefaultBaseURL() string { return "" }

// NewRequest builds the upstream request of one attempt; a chat
// continuation is marked the way the host documents it.
func (o OpenAI) NewRequest(ctx context.Context, c Call) (*http.Request, error) {
	if c.Continuation == Prefill && c.API == OpenAIChat {
		if c.UpstreamModel != "" {
			c.Body, c.UpstreamModel = c.Request.WithModel(c.Body, c.UpstreamModel), ""
		}
		c.Body = o.continueBody(c.Body)
	}
	return newRequest(ctx, c)
}

// Anthropic is Anthropic's own API.
type Anthropic struct{ passThrough }

// CaddyModule returns the Caddy module information.
func (Anthropic) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: Namespace + ".anthropic", New: func() caddy.Module { return new(Anthropic) }}
}

// Serves reports whether api is one of Anthropic's (model listing
// included, which Anthropic serves at the same path).
func (Anthropic) Serves(api API) bool { return api.Anthropic() || api == OpenAIModels }

// DefaultBaseURL is Anthropic's API host.
func (Anthropic) DefaultBaseURL() string { return "https://api.anthropic.com" }

// anthropicVersion is the API version sent when the client names none;
// Anthropic refuses requests without one.
const anthropicVersion = "2023-06-01"

// NewRequest builds the upstream request of one attempt, adding the
// anthropic-version header when neither the client nor the channel set it.
func (Anthropic) NewRequest(ctx context.Context, c Call) (*http.Request, error) {
	req, err := newRequest(ctx, c)
	if err != nil {
		return nil, err
	}
	if req.Header.Get("Anthropic-Version") == "" {
		req.Header.Set("Anthropic-Version", anthropicVersion)
	}
	return req, nil
}

// passThrough is what the adapters share today: a plain HTTP API whose
// answers reach the client in their own framing.
type passThrough struct{}

// noBaseQuery refuses a base URL with a query for the providers that
// build the whole upstream URL themselves, which would silently drop it.
// The query is not quoted: it may hold a key.
func noBaseQuery(provider string, u *url.URL) error {
	if u.RawQuery != "" || u.ForceQuery {
		return fmt.Errorf("the %s provider builds the upstream URL's query itself, so the base URL's query would never be sent: drop it", provider)
	}
	return nil
}

// CheckBaseURL refuses a base path ending in /v1: client paths begin with
// /v1 already, so the upstream would be asked for /v1/v1/....
func (passThrough) CheckBaseURL(u *url.URL) error {
	if p := strings.TrimSuffix(u.Path, "/"); strings.HasSuffix(p, "/v1") {
		return fmt.Errorf("its path ends in /v1, which client paths such as /v1/chat/completions already begin with: drop the /v1")
	}
	return nil
}

// ResponseBody returns the body as the upstream sent it.
func (passThrough) ResponseBody(res *http.Response) io.Reader { return res.Body }

// CopyResponseHeader copies the answer's allowlisted headers.
func (passThrough) CopyResponseHeader(dst, src http.Header) { copyResponseHeader(dst, src) }

// IsLineStream reports an NDJSON (or kin) answer.
func (passThrough) IsLineStream(h http.Header) bool { return isLineStream(h) }

// IsStream reports a text/event-stream answer.
func (passThrough) IsStream(h http.Header) bool { return isEventStream(h) }

// IsJSON reports a JSON answer (application/json and its +json kin).
func (passThrough) IsJSON(h http.Header) bool { return isJSON(h) }

// UnmarshalCaddyfile sets up the adapter from `provider <name>`; no
// adapter has options yet, so a block must be empty.
func (passThrough) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume the adapter name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		return d.Errf("unrecognized provider option '%s'", d.Val())
	}
	return nil
}

var errNoTarget = errors.New("provider: call has no base URL or client request")

// newRequest builds the request of one attempt: URL from the base and the
// client's path and query, the upstream's Host, the body with its model
// renamed, and the client's headers an upstream may see (an allowlist),
// the channel's own on top.
func newRequest(ctx context.Context, c Call) (*http.Request, error) {
	if c.Base == nil || c.Client == nil {
		return nil, errNoTarget
	}
	r, base := c.Client, c.Base
	out := r.WithContext(ctx)
	out.RequestURI = ""
	out.Close = false
	out.TransferEncoding = nil
	out.Trailer = nil
	out.Host = base.Host
	// With no dot segment and no encoded separator, the client's path
	// appended to the base path stays under it, however the upstream
	// normalises.
	if err := CheckPath(r.URL.EscapedPath()); err != nil {
		return nil, err
	}
	u := &url.URL{Scheme: base.Scheme, Host: base.Host, Path: base.Path + r.URL.Path, RawQuery: clientQuery(r.URL.RawQuery)}
	if base.RawQuery != "" {
		q := u.RawQuery
		u.RawQuery = base.RawQuery
		if q != "" {
			u.RawQuery += "&" + q
		}
	}
	out.URL = u
	out.Header = requestHeader(c.API, r.Header, c.Header, c.PassHeader)
	body := c.Body
	if c.UpstreamModel != "" {
		body = c.Request.WithModel(body, c.UpstreamModel)
	}
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	out.ContentLength = int64(len(body))
	return out, nil
}

// Interface guards
var (
	_ Adapter               = (*OpenAI)(nil)
	_ Adapter               = (*Anthropic)(nil)
	_ caddyfile.Unmarshaler = (*OpenAI)(nil)
	_ caddyfile.Unmarshaler = (*Anthropic)(nil)
	_ LineStreamer          = (*OpenAI)(nil)
	_ LineStreamer          = (*Anthropic)(nil)
)
