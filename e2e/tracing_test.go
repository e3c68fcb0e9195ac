package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/internal/otlptest"
)

var portsTracing = ports{19617, 19618}

// The built binary, configured as an operator would (the tracing
// directive, OTEL_* variables), exports one trace per request to an OTLP
// gRPC receiver: a failover is Caddy's server span, the gateway's span
// with its decision event, and two attempt spans; and a SIGTERM flushes
// what is left.
func TestBinaryTracesAFailover(t *testing.T) {
	caddyBin(t)
	rcv := otlptest.Start(t)
	bad := fu.New(fu.Status(503, ""))
	defer bad.Close()
	good := fu.New(fu.OKNamed("good").WithUsage(7, 3))
	defer good.Close()
	cfg := globalOptions(portsTracing) + site(portsTracing, fmt.Sprintf(`
		channel bad %s
		channel good %s
		model m {
			route bad cost 1 1
			route good cost 2 2
		}
		auth off
`, bad.URL, good.URL))
	cfg = strings.Replace(cfg, "\tllm_failover {\n", "\ttracing\n\tllm_failover {\n", 1)
	in := newInstance(t, "tracing", portsTracing, cfg,
		"OTEL_EXPORTER_OTLP_PROTOCOL=grpc", "OTEL_EXPORTER_OTLP_ENDPOINT="+rcv.Endpoint, "OTEL_EXPORTER_OTLP_INSECURE=true",
		"OTEL_SERVICE_NAME=gateway-e2e")
	if code, _, body := post(t, in.gatewayURL()+"/v1/chat/completions", fu.ChatRequest("m", false)); code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	// The batch processor exports every 5 s by default; a clean stop
	// flushes at once.
	in.stop()
	spans, ok := rcv.WaitFor(10*time.Second, func(spans []otlptest.Span) bool { return len(spans) >= 4 })
	if !ok {
		t.Fatalf("%d spans exported, want 4: %+v", len(spans), spans)
	}
	byName := map[string][]otlptest.Span{}
	for _, s := range spans {
		if s.TraceID != spans[0].TraceID || s.Service != "gateway-e2e" {
			t.Errorf("span %q of trace %s, service %q: want one trace of gateway-e2e", s.Name, s.TraceID, s.Service)
		}
		byName[s.Name] = append(byName[s.Name], s)
	}
	gw := byName["llm_failover chat m"]
	if len(gw) != 1 || len(byName["chat m"]) != 2 || len(gw[0].Events) != 1 {
		t.Fatalf("spans by name: %+v", byName)
	}
	for _, s := range byName["chat m"] {
		if s.ParentID != gw[0].SpanID {
			t.Errorf("attempt %v not under the gateway span", s.Attrs["llm_failover.channel"])
		}
	}
	if got := gw[0].Attrs["llm_failover.served_by"]; got != "good" {
		t.Errorf("served_by %v", got)
	}
}
