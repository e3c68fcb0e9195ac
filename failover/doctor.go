package failover

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// doctorTimeout bounds one route's check.
const doctorTimeout = 20 * time.Second

// doctor is the engine as the target of the app's doctor: it sends each
// route of a channel one cheap real request through the channel's
// adapter, credentials, headers and transport, as a client's would go.
type doctor struct{ e *Engine }

// CheckChannel checks every model route to the channel called name, each
// (model, upstream model) once.
func (d doctor) CheckChannel(ctx context.Context, name string) (routes []failoverapp.RouteCheck, found bool) {
	seen := map[string]bool{}
	for _, ch := range d.e.channels {
		found = found || ch.Name == name
	}
	for _, modelName := range d.e.modelList {
		m := d.e.models[modelName]
		for _, r := range m.Chain.Routes {
			ch := d.e.channels[r.Channel]
			key := modelName + "\x00" + r.UpstreamModel
			if ch.Name != name || seen[key] {
				continue
			}
			seen[key] = true
			routes = append(routes, d.e.checkRoute(ctx, modelName, r, ch))
		}
	}
	return routes, found
}

// checkRoute sends the route's check request and judges the answer.
func (e *Engine) checkRoute(ctx context.Context, model string, route chain.Route, ch *Channel) (c failoverapp.RouteCheck) {
	start := time.Now()
	upstream := upstreamModel(&route, model)
	api := provider.CheckAPI(ch.Adapter, upstream)
	c = failoverapp.RouteCheck{Model: model, UpstreamModel: route.UpstreamModel, API: api.String()}
	defer func() {
		c.Took = time.Since(start).Round(time.Millisecond).String()
		// One line per problem, no secret: token errors carry the
		// response on a line of their own, and may quote a key, whole
		// or in part, as a client's error would be masked.
		c.Problem = strings.Join(strings.Fields(e.secrets.Message(c.Problem)), " ")
		c.Hint = e.secrets.String(c.Hint) // our words, quoting paths: exact secrets only
	}()
	ctx, cancel := context.WithTimeout(ctx, doctorTimeout)
	defer cancel()

	path, hdr, body, err := provider.CheckRequest(api, model)
	if err != nil {
		c.Problem = err.Error()
		return c
	}
	client, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://llm-failover-doctor"+path, bytes.NewReader(body))
	if err != nil {
		c.Problem = err.Error()
		return c
	}
	client.Header = hdr
	req, err := api.ParseRequest(body)
	if err != nil {
		c.Problem = err.Error()
		return c
	}
	out, err := ch.Adapter.NewRequest(ctx, provider.Call{
		API: api, Base: ch.Base, Client: client, Body: body, Request: req,
		UpstreamModel: route.UpstreamModel, Header: ch.Header,
	})
	if err != nil {
		c.Problem = "could not build the request: " + err.Error()
		_, c.Hint = provider.Diagnose(ch.Adapter, provider.Refusal{UpstreamModel: upstream, Message: err.Error()})
		return c
	}
	res, err := ch.Transport.RoundTrip(out)
	if err != nil {
		c.Problem = "could not reach the upstream: " + err.Error()
		c.Hint = "check the channel's base URL (scheme and host) and that this machine can reach it"
		return c
	}
	defer res.Body.Close()
	c.Status = res.StatusCode
	answer, _ := io.ReadAll(io.LimitReader(ch.Adapter.ResponseBody(res), 64<<10))
	if res.StatusCode < 300 {
		c.OK = true
		return c
	}
	c.Problem = api.UpstreamMessage(answer)
	if c.Problem == "" {
		c.Problem = http.StatusText(res.StatusCode)
	}
	c.OK, c.Hint = provider.Diagnose(ch.Adapter, provider.Refusal{Status: res.StatusCode, Path: out.URL.Path, UpstreamModel: upstream, Message: c.Problem})
	return c
}

// Interface guard
var _ failoverapp.Doctor = doctor{}
