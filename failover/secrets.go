package failover

import (
	"net/http"
	"slices"

	"github.com/llmfailover/caddy-llm-failover/internal/redact"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// This file keeps the operator's secrets inside the gateway: every
// channel credential (gathered into e.secrets when the engine is built)
// is masked in what an upstream makes the gateway say (quoted messages,
// failure details, answer headers) and in everything an answer carries
// to the client, whatever channel echoed it.

// scrubFailure masks secrets in what a failure quotes or describes, before
// it reaches a log line, an event or a client. The upstream's message is
// cut to its bound only once masked: a secret the cut split would pass.
func (e *Engine) scrubFailure(f *failure) {
	if f == nil {
		return
	}
	f.message = e.quote(f.message)
	f.detail = e.scrubString(f.detail)
}

// quote is an upstream's message as the gateway may quote it: secrets and
// credential shapes masked, then cut to its bound.
func (e *Engine) quote(msg string) string {
	return provider.CutMessage(e.liveSecrets().String(e.secrets.Message(msg)))
}

// scrubString masks the known secrets, the live ones included, in s.
func (e *Engine) scrubString(s string) string {
	return e.liveSecrets().String(e.secrets.String(s))
}

// liveSecrets masks the credentials the channels hold now that change as
// they run (Vertex's access tokens); nil when no channel has any.
// The masker is built again only when the tokens changed (hourly).
func (e *Engine) liveSecrets() *redact.Secrets {
	if len(e.live) == 0 {
		return nil
	}
	var all []string
	for _, lc := range e.live {
		all = append(all, lc.LiveCredentials()...)
	}
	if c := e.liveMask.Load(); c != nil && slices.Equal(c.values, all) {
		return c.secrets
	}
	c := &liveMask{values: all, secrets: redact.NewSecrets(all...)}
	e.liveMask.Store(c)
	return c.secrets
}

// liveMask is the masker of one set of live credentials.
type liveMask struct {
	values  []string
	secrets *redact.Secrets
}

// copyResponseHeader copies the headers of an upstream's answer that a
// client may see: the adapter's allowlist and the operator's extras, then
// any header echoing a secret dropped.
func (e *Engine) copyResponseHeader(ch *Channel, dst, src http.Header) {
	ch.Adapter.CopyResponseHeader(dst, src)
	ch.Extras.CopyResponse(dst, src)
	e.secrets.Header(dst)
	e.liveSecrets().Header(dst)
}

// scrubBytes masks secrets in bytes on their way to a client: a whole
// answer, and an error event held back for a resume. Bytes that hold none
// (nearly all) come back as they are, uncopied.
func (e *Engine) scrubBytes(b []byte) []byte { return e.liveSecrets().Bytes(e.secrets.Bytes(b)) }

// scrubber is scrubBytes for the many writes of one stream (streamgate's
// Scrub, every event): the live credentials are looked up once, not per
// event. The upstream can only echo what it was sent before.
func (e *Engine) scrubber() func([]byte) []byte {
	live := e.liveSecrets()
	return func(b []byte) []byte { return live.Bytes(e.secrets.Bytes(b)) }
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
