package llmfailover

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// The doctor sends each route of a channel one cheap real request (one
// output token) through the channel's adapter, credentials, headers and
// transport, exactly as a client's request would go, and says what is
// wrong with an actionable hint: the misconfigurations of real providers
// (a refused key, a new Vertex project's zero quota, a model not enabled,
// a Bedrock model needing an inference profile, an Azure deployment or
// api-version mismatch, a base URL whose path is wrong) all show only
// when an upstream is asked.

func init() {
	registerSubcommand("doctor", subcommand{
		usage: "[--channel <name>]",
		short: "Sends one cheap real request per model route of each channel (or one) and says what is wrong",
		run:   runDoctor,
	})
}

// doctorTimeout bounds one route's check.
const doctorTimeout = 20 * time.Second

// channelCheck is the doctor's verdict on one channel.
type channelCheck struct {
	Channel string       `json:"channel"`
	OK      bool         `json:"ok"`
	Routes  []routeCheck `json:"routes"`
}

// routeCheck is the verdict on one model route of the channel.
type routeCheck struct {
	Model         string `json:"model"`
	UpstreamModel string `json:"upstream_model,omitempty"`
	API           string `json:"api"`
	OK            bool   `json:"ok"`
	Status        int    `json:"status,omitempty"`
	// Problem is what went wrong: the upstream's message, or why nothing
	// was sent. Hint says what to do about it.
	Problem string `json:"problem,omitempty"`
	Hint    string `json:"hint,omitempty"`
	Took    string `json:"took"`
}

// doctorRoute is one route to check, with the channel that serves it.
type doctorRoute struct {
	model string
	route chain.Route
	ch    *channel
}

// routesOf lists the routes to the channel named name, each once.
func (a *App) routesOf(name string) (routes []doctorRoute, found bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	seen := map[string]bool{}
	for _, m := range a.models {
		for _, r := range m.chain.Routes {
			ch := m.channels[r.Channel]
			if ch.name != name {
				continue
			}
			found = true
			key := m.chain.Name + "\x00" + r.UpstreamModel + "\x00" + ch.base.String()
			if !seen[key] {
				seen[key] = true
				routes = append(routes, doctorRoute{model: m.chain.Name, route: r, ch: ch})
			}
		}
	}
	if !found {
		for _, c := range a.channels {
			found = found || c.state.name == name
		}
	}
	return routes, found
}

// serveCheck answers POST /llm_failover/channels/<name>/check.
func serveCheck(w http.ResponseWriter, r *http.Request, reg *App, name string) error {
	if err := caddykit.OnlyMethod(r, http.MethodPost); err != nil {
		return err
	}
	var routes []doctorRoute
	found := false
	if reg != nil {
		routes, found = reg.routesOf(name)
	}
	if !found {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no channel named %q", name)}
	}
	out := channelCheck{Channel: name, OK: true, Routes: []routeCheck{}}
	for _, dr := range routes {
		c := checkRoute(r.Context(), dr)
		out.OK = out.OK && c.OK
		out.Routes = append(out.Routes, c)
	}
	return caddykit.WriteJSON(w, out)
}

// checkRoute sends the route's check request and judges the answer.
func checkRoute(ctx context.Context, dr doctorRoute) (c routeCheck) {
	start := time.Now()
	upstreamModel := dr.route.UpstreamModel
	if upstreamModel == "" {
		upstreamModel = dr.model
	}
	api := checkAPI(dr.ch.adapter, upstreamModel)
	c = routeCheck{Model: dr.model, UpstreamModel: dr.route.UpstreamModel, API: api.String()}
	defer func() {
		c.Took = time.Since(start).Round(time.Millisecond).String()
		// One line per problem: token errors carry the response on a
		// line of their own.
		c.Problem = strings.Join(strings.Fields(scrub(dr.ch, c.Problem)), " ")
	}()
	ctx, cancel := context.WithTimeout(ctx, doctorTimeout)
	defer cancel()

	path, body := "/v1/chat/completions", []byte(`{"model":"`+dr.model+`","max_tokens":1,"messages":[{"role":"user","content":"ping"}]}`)
	if api == provider.AnthropicMessages {
		path = "/v1/messages"
	}
	client, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://llm-failover-doctor"+path, bytes.NewReader(body))
	if err != nil {
		c.Problem = err.Error()
		return c
	}
	client.Header.Set("Content-Type", "application/json")
	client.Header.Set("Anthropic-Version", "2023-06-01")
	req, err := api.ParseRequest(body)
	if err != nil {
		c.Problem = err.Error()
		return c
	}
	out, err := dr.ch.adapter.NewRequest(ctx, provider.Call{
		API: api, Base: dr.ch.base, Client: client, Body: body, Request: req,
		UpstreamModel: dr.route.UpstreamModel, Header: dr.ch.headers,
	})
	if err != nil {
		c.Problem = "could not build the request: " + err.Error()
		c.Hint = "the channel's credentials could not be used: for vertex check credentials_file (a service account's JSON key) or the application default credentials (GOOGLE_APPLICATION_CREDENTIALS, gcloud auth application-default login); a key that was deleted or disabled is refused here too"
		return c
	}
	res, err := dr.ch.rt.RoundTrip(out)
	if err != nil {
		c.Problem = "could not reach the upstream: " + err.Error()
		c.Hint = "check the channel's base URL (scheme and host) and that this machine can reach it"
		return c
	}
	defer res.Body.Close()
	c.Status = res.StatusCode
	answer, _ := io.ReadAll(io.LimitReader(dr.ch.adapter.ResponseBody(res), 64<<10))
	if res.StatusCode < 300 {
		c.OK = true
		return c
	}
	c.Problem = api.UpstreamMessage(answer)
	if c.Problem == "" {
		c.Problem = http.StatusText(res.StatusCode)
	}
	c.OK, c.Hint = diagnose(dr, out.URL.Path, res.StatusCode, c.Problem)
	return c
}

// checkAPI picks the client API a route is checked on: Anthropic Messages
// for a Claude model on a provider that speaks it, OpenAI chat otherwise.
func checkAPI(a provider.Adapter, upstreamModel string) provider.API {
	if a.Serves(provider.AnthropicMessages) && (!a.Serves(provider.OpenAIChat) || strings.Contains(strings.ToLower(upstreamModel), "claude")) {
		return provider.AnthropicMessages
	}
	return provider.OpenAIChat
}

// diagnose turns a refused check into a hint. ok is true when the refusal
// still shows that the key and the model were accepted (an upstream that
// wants another token limit parameter).
func diagnose(dr doctorRoute, path string, status int, msg string) (ok bool, hint string) {
	upstream := dr.route.UpstreamModel
	if upstream == "" {
		upstream = dr.model
	}
	has := func(subs ...string) bool {
		for _, s := range subs {
			if strings.Contains(msg, s) {
				return true
			}
		}
		return false
	}
	switch {
	case status == http.StatusBadRequest && has("max_tokens", "max_completion_tokens"):
		return true, ""
	case has("on-demand throughput", "inference profile"):
		return false, fmt.Sprintf("Bedrock serves %s only through an inference profile: set upstream_model to its profile id, e.g. us.%s", upstream, strings.TrimPrefix(upstream, "us."))
	case has("DeploymentNotFound", "API deployment for this resource does not exist"):
		return false, fmt.Sprintf("the Azure resource has no deployment named %q: upstream_model must be the deployment's name (Azure AI Foundry, Deployments), not the model's", upstream)
	case has("API version not supported", "api-version"), status == http.StatusNotFound && strings.Contains(path, "/openai/deployments/"):
		return false, "Azure does not serve this api_version on this path: use api_version v1 (the default, /openai/v1/...) or a dated version the resource supports, such as 2024-10-21"
	case has("FAILED_PRECONDITION", "not allowed to use Publisher Model", "Publisher Model"):
		return false, fmt.Sprintf("the model %s is not enabled for this Google Cloud project: enable it in Vertex AI Model Garden (and accept its terms) for the channel's region", upstream)
	case status == http.StatusTooManyRequests && has("per_base_model", "Quota exceeded"):
		return false, "the project's quota for this model is 0 or used up (new Vertex projects start at 0 for Claude): request an increase under IAM & Admin, Quotas, for the model in the channel's region"
	case status == http.StatusTooManyRequests:
		return false, "the upstream rate-limits or has no quota left for this key: check the account's plan, billing and limits"
	case status == http.StatusUnauthorized || status == http.StatusForbidden || has("API key not valid", "API_KEY_INVALID", "invalid subscription key", "signature", "security token", "UnrecognizedClient"):
		return false, "the upstream refused the credentials: the key is wrong, expired or revoked, or (AWS) the access key, secret or region do not match; rotate the key in the channel's provider block or header"
	case status == http.StatusNotFound:
		return false, fmt.Sprintf("nothing answers at %s: a base URL is scheme and host (optionally a proxy's path prefix) and the provider adds its own path, so drop any /v1, /openai or /v1beta you added; or the model %s does not exist there", path, upstream)
	}
	return false, "the upstream refused the check request; its message says why"
}

// scrub removes the channel's credentials from text shown to an operator.
func scrub(ch *channel, text string) string {
	var secrets []string
	if c, ok := ch.adapter.(provider.Credentialed); ok {
		secrets = c.Credentials()
	}
	for _, vals := range ch.headers {
		secrets = append(secrets, vals...)
	}
	for _, s := range secrets {
		if len(s) >= 4 {
			text = strings.ReplaceAll(text, s, "[redacted]")
		}
	}
	return text
}

var errDoctorFound = errors.New("the doctor found problems")

func runDoctor(out io.Writer, admin string, args []string) error {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	fs.SetOutput(out)
	only := fs.String("channel", "", "check only this channel")
	if err := fs.Parse(args); err != nil {
		return err
	}
	names := []string{*only}
	if *only == "" {
		var chans []channelView
		if err := caddykit.AdminCall(admin, http.MethodGet, "/llm_failover/channels", nil, &chans); err != nil {
			return err
		}
		names = names[:0]
		for _, c := range chans {
			names = append(names, c.Name)
		}
	}
	bad := 0
	for _, name := range names {
		var c channelCheck
		if err := caddykit.AdminCall(admin, http.MethodPost, "/llm_failover/channels/"+name+"/check", nil, &c); err != nil {
			return fmt.Errorf("checking channel %s: %w", name, err)
		}
		printCheck(out, c)
		if !c.OK {
			bad++
		}
	}
	if bad > 0 {
		return fmt.Errorf("%w in %d of %d channels", errDoctorFound, bad, len(names))
	}
	return nil
}

func printCheck(out io.Writer, c channelCheck) {
	if len(c.Routes) == 0 {
		fmt.Fprintf(out, "%s: no model routes to it, nothing to check\n", c.Channel)
		return
	}
	for _, r := range c.Routes {
		target := r.Model
		if r.UpstreamModel != "" {
			target += " as " + r.UpstreamModel
		}
		if r.OK {
			fmt.Fprintf(out, "%s: ok  %s (%s, %s)\n", c.Channel, target, r.API, r.Took)
			continue
		}
		status := ""
		if r.Status != 0 {
			status = fmt.Sprintf(" %d", r.Status)
		}
		fmt.Fprintf(out, "%s: FAIL %s (%s):%s %s\n", c.Channel, target, r.API, status, r.Problem)
		if r.Hint != "" {
			fmt.Fprintf(out, "    hint: %s\n", r.Hint)
		}
	}
}
