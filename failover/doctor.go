package failover

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"time"
	"unicode"

	"github.com/llmfailover/caddy-llm-failover/chain"
	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	"github.com/llmfailover/caddy-llm-failover/probe"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// doctorTimeout bounds one check request.
const doctorTimeout = 20 * time.Second

// doctorBodyLimit bounds what the doctor keeps of a refusal's body, for
// its message.
const doctorBodyLimit = 64 << 10

// doctor is the engine as the target of the app's doctor: it sends each
// route of a channel a small real request, plain and streamed, through
// the same walk as client traffic (adapter, credentials, headers,
// transport, timers, stream gate, body checks), so that an answer traffic
// would fail over from never passes. It is sent whatever the channel's
// breaker says, and records nothing.
type doctor struct{ e *Engine }

// CheckChannel checks every model route to the channel called name, each
// (model, upstream model) once, plain and streamed.
func (d doctor) CheckChannel(ctx context.Context, name string) (routes []failoverapp.RouteCheck, found bool) {
	seen := map[string]bool{}
	for _, ch := range d.e.channels {
		found = found || ch.Name == name
	}
	for _, modelName := range d.e.modelList {
		m := d.e.models[modelName]
		for i := range m.Chain.Routes {
			r := &m.Chain.Routes[i]
			ch := d.e.channels[r.Channel]
			key := modelName + "\x00" + r.UpstreamModel
			if ch.Name != name || seen[key] {
				continue
			}
			seen[key] = true
			for _, stream := range []bool{false, true} {
				routes = append(routes, d.e.checkRoute(ctx, m, r, stream))
			}
		}
	}
	return routes, found
}

// checkRoute sends the route one check request and judges the answer as
// traffic is judged.
func (e *Engine) checkRoute(ctx context.Context, m *Model, route *chain.Route, stream bool) (c failoverapp.RouteCheck) {
	start := time.Now()
	ch := e.channels[route.Channel]
	upstream := upstreamModel(route, m.Name)
	api, ok := probeAPI(ch, m, route)
	c = failoverapp.RouteCheck{Model: m.Name, UpstreamModel: route.UpstreamModel, API: api.String(), Stream: stream}
	defer func() {
		c.Took = time.Since(start).Round(time.Millisecond).String()
		// One line per problem, no secret: token errors carry the
		// response on a line of their own, and may quote a key, whole
		// or in part, as a client's error would be masked.
		c.Problem = terminalLine(e.liveSecrets().String(e.secrets.Message(c.Problem)))
		c.Hint = terminalLine(e.scrubString(c.Hint)) // our words, quoting paths: exact secrets only
	}()
	if !ok {
		c.Problem = "the channel serves no API a check can be written in"
		return c
	}
	ctx, cancel := context.WithTimeout(ctx, doctorTimeout)
	defer cancel()
	x, w, err := checkExchange(ctx, m, api, stream, modeDoctor)
	if err != nil {
		c.Problem = err.Error()
		return c
	}
	end := e.walk(x, []*chain.Route{route}, nil, time.Now().Add(doctorTimeout))
	res := end.res
	if !end.answered {
		res = retryWith(end.last)
	}
	refusal := provider.Refusal{Path: x.upstreamPath, UpstreamModel: upstream}
	switch f := res.fail; {
	case x.attempts == 0 || res.verdict == clientGone:
		c.Problem = "the check was stopped before an answer"
		return c
	case res.verdict == served && !x.committedAt.IsZero():
		c.OK, c.Status = true, w.status
		return c
	case res.verdict == served:
		c.Status, c.Problem = w.status, "the answer ended before any content"
		c.Hint = "traffic would fail over from this channel (stream_closed_early): the upstream answers 2xx with nothing in it"
		return c
	case res.verdict == passed:
		c.Status = res.status
		refusal.Status, refusal.Message = res.status, e.quote(api.UpstreamMessage(w.body.Bytes()))
	case f.reason == reasonErrorFrame || f.reason == reasonErrorBody:
		c.Status = http.StatusOK
		where := "its stream carried an error event"
		if f.reason == reasonErrorBody {
			where = "its body was an error"
		}
		c.Problem = "answered 200, but " + where + ": " + f.message
		c.Hint = "traffic would fail over from this channel (" + string(f.reason) + "); the upstream's message says why"
		if f.frameStatus != 0 {
			_, c.Hint = provider.Diagnose(ch.Adapter, provider.Refusal{Status: f.frameStatus, Path: x.upstreamPath, UpstreamModel: upstream, Message: f.message})
		}
		return c
	case f.status != 0:
		c.Status = f.status
		refusal.Status, refusal.Message = f.status, f.message
	case strings.HasPrefix(f.detail, buildFailed):
		c.Problem = "could not build the request: " + strings.TrimPrefix(f.detail, buildFailed)
		refusal.Message = c.Problem
		_, c.Hint = provider.Diagnose(ch.Adapter, refusal)
		return c
	default:
		c.Problem = "could not get an answer (" + string(f.reason) + "): " + f.detail
		c.Hint = "check the channel's base URL (scheme and host) and that this machine can reach it; traffic would fail over (" + string(f.reason) + ")"
		return c
	}
	c.Problem = refusal.Message
	if c.Problem == "" {
		c.Problem = http.StatusText(refusal.Status)
	}
	c.OK, c.Hint = provider.Diagnose(ch.Adapter, refusal)
	return c
}

// checkExchange is a doctor's or a drill's request of model m in api: a
// small one (the model's probe max_tokens, else what the smallest models
// accept), as a client would send it.
func checkExchange(ctx context.Context, m *Model, api provider.API, stream bool, md mode) (*exchange, *doctorWriter, error) {
	maxTokens := probe.DefaultMaxTokens
	if m.Probe != nil {
		maxTokens = m.Probe.MaxTokens
	}
	path, hdr, body, err := provider.ProbeRequest(api, m.Name, "Say OK.", maxTokens, stream, false)
	if err != nil {
		return nil, nil, err
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://llm-failover-check"+path, bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	r.Header = hdr
	w := &doctorWriter{probeWriter: probeWriter{header: http.Header{}}}
	x := newExchange(w, r, api, md)
	x.model, x.body = m, body
	if x.req, err = api.ParseRequest(body); err != nil {
		return nil, nil, err
	}
	return x, w, nil
}

// doctorWriter is the check's ResponseWriter: a probe's, that keeps the
// start of the body too, for a refusal's message.
type doctorWriter struct {
	probeWriter
	body bytes.Buffer
}

func (w *doctorWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	if room := doctorBodyLimit - w.body.Len(); room > 0 {
		w.body.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// Interface guards
var (
	_ failoverapp.Doctor = doctor{}
	_ http.Flusher       = (*doctorWriter)(nil)
)

// terminalLine makes s one line fit for the operator's terminal, where
// `caddy llm-failover doctor` and `drill` print it: white space runs and
// control characters (an upstream's message may carry escape sequences
// that would rewrite what the terminal shows) become one space.
func terminalLine(s string) string {
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }), " ")
}
