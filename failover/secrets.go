package failover

import (
	"net/http"

	"github.com/llmfailover/caddy-llm-failover/internal/redact"
	"github.com/llmfailover/caddy-llm-failover/provider"
)

// This file keeps the operator's secrets inside the gateway: every
// channel credential is masked in what an upstream makes the gateway say
// (quoted messages, failure details, answer headers), whatever channel
// echoed it.

// provisionSecrets gathers every channel's credentials into one masker.
func (e *Engine) provisionSecrets() {
	var all []string
	for _, ch := range e.channels {
		all = append(all, provider.ChannelCredentials(ch.Header, ch.Adapter)...)
	}
	e.secrets = redact.NewSecrets(all...)
}

// scrubFailure masks secrets in what a failure quotes or describes, before
// it reaches a log line, an event or a client.
func (e *Engine) scrubFailure(f *failure) {
	if f == nil {
		return
	}
	f.message = e.secrets.Message(f.message)
	f.detail = e.secrets.String(f.detail)
}

// copyResponseHeader copies the headers of an upstream's answer that a
// client may see: the adapter's allowlist and the operator's extras, then
// any header echoing a secret dropped.
func (e *Engine) copyResponseHeader(ch *Channel, dst, src http.Header) {
	ch.Adapter.CopyResponseHeader(dst, src)
	ch.Extras.CopyResponse(dst, src)
	e.secrets.Header(dst)
}

// scrubBytes masks secrets in bytes on their way to a client: what a
// committed stream sends from its error event on (streamgate's Scrub),
// and an error event held back for a resume.
func (e *Engine) scrubBytes(b []byte) []byte {
	if s := e.secrets.String(string(b)); s != string(b) {
		return []byte(s)
	}
	return b
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
