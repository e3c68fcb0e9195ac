package integration_test

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/internal/otlptest"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// tracedChannels: model m (chat) and claude (Messages, resumable) on a then
// b, billed; each channel authenticates with its own key, which must never
// be exported; b joins the request's trace (propagate_trace).
const tracedChannels = `
		channel a %s {
			header Authorization "Bearer upstream-key-a-0123456789"
		}
		channel b %s {
			header Authorization "Bearer upstream-key-b-0123456789"
			propagate_trace
		}
		model m {
			route a cost 1 1
			route b cost 2 2
			price 2 8
		}
		model claude {
			route a cost 1 1
			route b cost 2 2
			price 3 15
			stream_resume continue
		}
		wallet
`

// tracedGateway loads tracedChannels into a site with Caddy's tracing
// directive, exporting over OTLP/gRPC to rcv as the standard OTEL_*
// variables say, with a wallet on a fresh SQLite file.
// It returns the file Caddy's warnings are logged to.
func tracedGateway(t *testing.T, rcv *otlptest.Receiver, a, b *fu.Server) (logFile string) {
	t.Helper()
	logFile = filepath.Join(t.TempDir(), "caddy.log")
	cfg := strings.Replace(gatewayConfigWith(storeOption("sqlite "+t.TempDir()+"/w.db"), tracedChannels, a.URL, b.URL),
		"\tlog {\n\t\tlevel ERROR\n\t}", fmt.Sprintf("\tlog {\n\t\toutput file %s\n\t\tformat json\n\t\tlevel WARN\n\t}", logFile), 1)
	loadTraced(t, rcv, cfg)
	return logFile
}

// loadTraced loads cfg with Caddy's tracing directive added to its
// llm_failover site, exporting over OTLP/gRPC to rcv as the standard
// OTEL_* variables say.
func loadTraced(t *testing.T, rcv *otlptest.Receiver, cfg string) {
	t.Helper()
	if testing.Short() {
		t.Skip("in-process Caddy tests are skipped with -short")
	}
	for k, v := range map[string]string{
		"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": rcv.Endpoint,
		"OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_SERVICE_NAME": "llm-gateway",
		"OTEL_EXPORTER_OTLP_TIMEOUT": "2000",
	} {
		t.Setenv(k, v)
	}
	cfg = strings.Replace(cfg, "\tllm_failover {\n", "\ttracing {\n\t\tspan gateway\n\t}\n\tllm_failover {\n", 1)
	tc := caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
	tc.InitServer(cfg, "caddyfile")
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	// Before the receiver stops: a config without tracing, so that the
	// tracer providers flush and shut down while it still answers.
	t.Cleanup(func() { gateway(t, "channel a http://127.0.0.1:9\n\t\tmodel m {\n\t\t\troute a\n\t\t}") })
}

// oneTrace waits for the trace of the request whose gateway span has
// requestID, complete (the gateway span ends last), and returns its
// spans by role.
func oneTrace(t *testing.T, rcv *otlptest.Receiver, requestID string, attempts int) (server, gateway otlptest.Span, tries []otlptest.Span) {
	t.Helper()
	find := func(spans []otlptest.Span) (otlptest.Span, bool) {
		for _, s := range spans {
			if s.Scope == "github.com/llmfailover/caddy-llm-failover" && s.Attrs["llm_failover.request_id"] == requestID {
				return s, true
			}
		}
		return otlptest.Span{}, false
	}
	spans, ok := rcv.WaitFor(10*time.Second, func(spans []otlptest.Span) bool {
		g, ok := find(spans)
		return ok && len(rcv.Trace(g.TraceID)) == 2+attempts
	})
	gateway, found := find(spans)
	if !ok || !found {
		t.Fatalf("no complete trace for request %s among %d spans: %+v", requestID, len(spans), spans)
	}
	for _, s := range rcv.Trace(gateway.TraceID) {
		switch {
		case s.SpanID == gateway.SpanID:
		case s.Kind == "server":
			server = s
		default:
			tries = append(tries, s)
		}
	}
	if server.SpanID == "" || gateway.ParentID != server.SpanID || server.Name != "gateway" || server.Service != "llm-gateway" {
		t.Fatalf("the gateway span %s is not under Caddy's server span %+v", gateway.ParentID, server)
	}
	for _, s := range tries {
		if s.ParentID != gateway.SpanID || s.Kind != "client" {
			t.Errorf("attempt span %q (%s) under %s, want a client span under the gateway's %s", s.Name, s.Kind, s.ParentID, gateway.SpanID)
		}
	}
	return server, gateway, tries
}

// wantAttrs fails for each key of want whose value in s differs.
func wantAttrs(t *testing.T, what string, s otlptest.Span, want map[string]any) {
	t.Helper()
	for k, v := range want {
		if got := s.Attrs[k]; fmt.Sprint(got) != fmt.Sprint(v) {
			t.Errorf("%s: %s = %v (%T), want %v", what, k, got, got, v)
		}
	}
}

// A traced request that fails over once is one trace: Caddy's server span,
// the gateway's span under it with a decision event for the failover, and
// an attempt span per upstream attempt under that, with the GenAI
// attributes and ours exactly as docs/operations.md lists them; then a
// stream resumed on the backup. Only the backup, which propagates, gets a
// traceparent (the attempt's, never the client's tracestate or baggage),
// and no credential, prompt or answer text is in any exported byte.
func TestTracingFailoverAndResume(t *testing.T) {
	rcv := otlptest.Start(t)
	// Short waits, so that the picture drawn from the trace shows its bars.
	a := upstream(t, fu.Status(503, `{"error":{"message":"overloaded, upstream-key-a-0123456789"}}`).After(15*time.Millisecond))
	b := upstream(t, fu.SlowHeaders(40*time.Millisecond, fu.OKNamed("backup").WithUsage(100, 20)))
	logFile := tracedGateway(t, rcv, a, b)
	secret, _ := newWalletAccount(t, "acct-7f3a", "10")

	const prompt = "PROMPT-TEXT-never-exported"
	body := []byte(`{"model":"m","max_tokens":50,"messages":[{"role":"user","content":"` + prompt + `"}]}`)
	clientTrace := "0af7651916cd43dd8448eb211c80319c"
	res, got := postSettled(t, "acct-7f3a", "/v1/chat/completions", body, append(bearer(secret),
		"Traceparent", "00-"+clientTrace+"-b7ad6b7169203331-01", "Tracestate", "client=tracestate-value", "Baggage", "user=baggage-value")...)
	if res.StatusCode != 200 || res.Header.Get("X-Served-By") != "b" {
		t.Fatalf("status %d served by %q: %s", res.StatusCode, res.Header.Get("X-Served-By"), got)
	}
	rows := requestRows(t, "acct-7f3a")
	charge := rows[len(rows)-1]
	_, gw, tries := oneTrace(t, rcv, charge.RequestID, 2)
	if gw.TraceID != clientTrace {
		t.Errorf("trace %s, want the client's %s (W3C trace context)", gw.TraceID, clientTrace)
	}
	for _, row := range rows {
		if row.RequestID == charge.RequestID && row.TraceID != clientTrace {
			t.Errorf("ledger row %s %s names trace %q, want %s", row.Kind, row.Channel, row.TraceID, clientTrace)
		}
	}
	if gw.Name != "llm_failover chat m" || gw.Kind != "internal" || gw.StatusError {
		t.Errorf("gateway span %q %s error=%v", gw.Name, gw.Kind, gw.StatusError)
	}
	want := wallet.Price{Input: 2_000_000, Output: 8_000_000}.Cost(100, 20)
	wantAttrs(t, "gateway span", gw, map[string]any{
		"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.request.max_tokens": 50,
		"gen_ai.response.model": "m", "gen_ai.usage.input_tokens": 100, "gen_ai.usage.output_tokens": 20,
		"llm_failover.stream": false, "llm_failover.attempts": 2, "llm_failover.served_by": "b", "llm_failover.resumed": false,
		"llm_failover.wallet.charge_micros": int64(want),
	})
	if r, ok := gw.Attrs["llm_failover.wallet.reserved_micros"].(int64); !ok || r < int64(want) {
		t.Errorf("reserved_micros %v, want at least the charge %d", gw.Attrs["llm_failover.wallet.reserved_micros"], want)
	}
	if len(gw.Events) != 1 || gw.Events[0].Name != "llm_failover.decision" {
		t.Fatalf("gateway events %+v, want one llm_failover.decision", gw.Events)
	}
	wantAttrs(t, "decision event", otlptest.Span{Attrs: gw.Events[0].Attrs}, map[string]any{
		"llm_failover.channel": "a", "llm_failover.attempt": 1, "llm_failover.failover.reason": "status",
		"llm_failover.next_channel": "b", "llm_failover.upstream_status": 503,
	})
	if len(tries) != 2 {
		t.Fatalf("%d attempt spans, want 2", len(tries))
	}
	first, second := tries[0], tries[1]
	for _, s := range tries {
		if s.Name != "chat m" {
			t.Errorf("attempt span named %q, want \"chat m\"", s.Name)
		}
	}
	wantAttrs(t, "first attempt", first, map[string]any{
		"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "m",
		"server.address": "127.0.0.1", "llm_failover.channel": "a", "llm_failover.attempt": 1,
		"llm_failover.attempt.kind": "chain", "llm_failover.breaker.state": "closed",
		"llm_failover.outcome": "failed", "error.type": "503", "llm_failover.failover.reason": "status",
		"http.response.status_code": 503,
	})
	if !first.StatusError {
		t.Error("the failed attempt's span status is not Error")
	}
	wantAttrs(t, "second attempt", second, map[string]any{
		"llm_failover.channel": "b", "llm_failover.attempt": 2, "llm_failover.outcome": "served",
		"gen_ai.usage.input_tokens": 100, "gen_ai.usage.output_tokens": 20, "gen_ai.response.finish_reasons": []any{"stop"},
	})
	if _, ok := second.Attrs["error.type"]; ok || second.StatusError {
		t.Errorf("the served attempt has error.type %v", second.Attrs["error.type"])
	}
	if _, ok := second.Attrs["llm_failover.time_to_first_content_ms"]; !ok {
		t.Error("the served attempt has no time to first content")
	}

	// Only b propagates: the attempt's own traceparent, nothing of the
	// client's.
	if tp := a.LastRequest().Header.Get("Traceparent"); tp != "" {
		t.Errorf("channel a (no propagate_trace) got traceparent %q", tp)
	}
	hb := b.LastRequest().Header
	if tp := hb.Get("Traceparent"); tp != "00-"+clientTrace+"-"+second.SpanID+"-01" {
		t.Errorf("channel b got traceparent %q, want the second attempt's span %s", tp, second.SpanID)
	}
	for _, h := range []string{"Tracestate", "Baggage"} {
		if v := hb.Get(h); v != "" {
			t.Errorf("channel b got the client's %s %q", h, v)
		}
	}

	failoverPicture(t, rcv.Trace(gw.TraceID))

	// The failover log line names the trace; the GenAI metrics counted
	// both attempts.
	logged, _ := os.ReadFile(logFile)
	if !bytes.Contains(logged, []byte(`"msg":"failover"`)) || !bytes.Contains(logged, []byte(`"trace_id":"`+clientTrace+`"`)) {
		t.Errorf("no failover log line names trace %s:\n%s", clientTrace, logged)
	}
	for _, series := range []string{
		`gen_ai_client_operation_duration_seconds_count{error_type="503",gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="m",server_address="127.0.0.1"}`,
		`gen_ai_client_operation_duration_seconds_count{error_type="",gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="m",server_address="127.0.0.1"}`,
		`gen_ai_client_token_usage_sum{gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="m",gen_ai_token_type="output",server_address="127.0.0.1"}`,
	} {
		if v, ok := brkMetric(t, series); !ok || v < 1 {
			t.Errorf("%s = %v, %v; want at least 1", series, v, ok)
		}
	}

	// The journal's decision names the trace.
	var journaled failoverapp.DecisionsAnswer
	if err := adminGet(t, "/llm_failover/decisions?reason=status", &journaled); err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(journaled.Decisions, func(d failoverapp.DecisionView) bool { return d.RequestID == charge.RequestID }); i < 0 ||
		journaled.Decisions[i].TraceID != clientTrace {
		t.Errorf("no journaled decision of request %s names trace %s: %+v", charge.RequestID, clientTrace, journaled.Decisions)
	}

	// A stream cut after 40 pieces, continued on b.
	pieces := resumePieces()
	a.Set(fu.OKNamed("primary").WithPieces(pieces...).WithCutAfter(40))
	b.Set(fu.OKNamed("backup").WithPieces(pieces[40:]...))
	s := streamPost(t, nil, "/v1/messages", resumeRequest("claude"), "", append(bearer(secret), "anthropic-version", "2023-06-01")...)
	wantText(t, s, strings.Join(pieces, ""))
	waitUnreserved(t, "acct-7f3a") // settled: its rows are written
	rows = requestRows(t, "acct-7f3a")
	_, gw, tries = oneTrace(t, rcv, rows[len(rows)-1].RequestID, 2)
	wantAttrs(t, "resumed gateway span", gw, map[string]any{
		"llm_failover.resumed": true, "llm_failover.continuation.form": "prefill", "llm_failover.served_by": "b",
		"llm_failover.stream": true, "gen_ai.operation.name": "chat", "gen_ai.request.model": "claude",
	})
	if len(gw.Events) != 1 || gw.Events[0].Attrs["llm_failover.failover.reason"] != "resumed" {
		t.Errorf("resumed gateway events %+v, want one resumed decision", gw.Events)
	}
	if len(tries) == 2 {
		wantAttrs(t, "broken attempt", tries[0], map[string]any{
			"gen_ai.provider.name": "openai", "llm_failover.outcome": "broken", "llm_failover.stream_gate": "committed_on_content",
			"llm_failover.attempt.kind": "chain",
		})
		wantAttrs(t, "continuation", tries[1], map[string]any{
			"llm_failover.attempt.kind": "continuation", "llm_failover.outcome": "served", "llm_failover.continuation.form": "prefill",
			"llm_failover.stream_gate": "committed_on_content",
		})
	}

	// Nothing secret or private in any byte exported. (The client's
	// tracestate is, as W3C trace context asks: it is the trace's.)
	for _, raw := range rcv.Raw() {
		for _, never := range []string{"upstream-key-a-0123456789", "upstream-key-b-0123456789", secret, prompt,
			"Hello from backup", strings.Join(pieces[:3], ""), "baggage-value", "acct-7f3a"} {
			if bytes.Contains(raw, []byte(never)) {
				t.Errorf("an exported span holds %q", never)
			}
		}
	}
}

// With tracing on, each synthetic check is a trace of its own: a root
// span for the probe and its attempt under it, which the app's own tracer
// provider (built from the same OTEL_* variables) exports.
func TestTracingProbes(t *testing.T) {
	rcv := otlptest.Start(t)
	up := upstream(t, fu.OK())
	prefix := uniqueName("prTrace")
	loadTraced(t, rcv, probeConfig(prefix, up.URL, "interval 200ms"))
	name := "llm_failover probe " + prefix + "m"
	spans, ok := rcv.WaitFor(10*time.Second, func(spans []otlptest.Span) bool {
		for _, s := range spans {
			if s.Name == name && len(rcv.Trace(s.TraceID)) == 2 {
				return true
			}
		}
		return false
	})
	if !ok {
		t.Fatalf("no probe trace among %d spans", len(spans))
	}
	for _, root := range spans {
		if root.Name != name {
			continue
		}
		if root.ParentID != "" || root.Service != "llm-gateway" {
			t.Errorf("probe span %+v is not a root span of service llm-gateway", root)
		}
		for _, s := range rcv.Trace(root.TraceID) {
			if s.SpanID != root.SpanID {
				wantAttrs(t, "probe attempt", s, map[string]any{"llm_failover.attempt.kind": "probe", "llm_failover.channel": prefix + "A",
					"llm_failover.outcome": "served"})
				if s.ParentID != root.SpanID {
					t.Errorf("probe attempt under %s, want %s", s.ParentID, root.SpanID)
				}
			}
		}
		return
	}
}

// traceShown are the attributes the documentation's picture of a
// failover trace shows under each span.
var traceShown = []string{"gen_ai.provider.name", "gen_ai.request.model", "server.address", "llm_failover.channel",
	"llm_failover.attempt", "llm_failover.breaker.state", "llm_failover.outcome", "error.type", "http.response.status_code",
	"gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.response.finish_reasons",
	"llm_failover.time_to_first_content_ms", "llm_failover.attempts", "llm_failover.served_by",
	"llm_failover.wallet.reserved_micros", "llm_failover.wallet.charge_micros"}

// failoverPicture draws the trace as docs/operations.md shows it, and
// rewrites docs/failover-trace.svg from it when LLMF_UPDATE_DOCS=1.
func failoverPicture(t *testing.T, trace []otlptest.Span) {
	t.Helper()
	svg := otlptest.Waterfall(trace, traceShown)
	d := xml.NewDecoder(bytes.NewReader(svg))
	for {
		if _, err := d.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("the trace picture is not well-formed XML: %v", err)
		}
	}
	for _, s := range trace {
		if !bytes.Contains(svg, []byte(">"+s.Name+" <")) {
			t.Errorf("the trace picture lacks span %q", s.Name)
		}
	}
	if os.Getenv("LLMF_UPDATE_DOCS") == "1" {
		if err := os.WriteFile("../docs/failover-trace.svg", svg, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// trace_content puts the prompt on the gateway's span and the answer's
// text on the attempts', each cut at its bound; the channels' keys stay
// out whatever the bound. A retry_same retry is an attempt span too.
func TestTracingContentOptIn(t *testing.T) {
	rcv := otlptest.Start(t)
	// It fails once with a 500, which retry_same retries on the same
	// channel: the retry is an attempt span of its own.
	up := upstream(t, fu.FailFirst(1, fu.Status(500, ""), fu.OKNamed("content")))
	loadTraced(t, rcv, gatewayConfigWith("", `
		channel a %s {
			header Authorization "Bearer upstream-key-c-0123456789"
		}
		model m {
			route a
		}
		auth off
		trace_content 40
		retry_same 500
`, up.URL))
	body := []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"Tell me a story about a lighthouse keeper."}]}`)
	s := streamPost(t, nil, "/v1/chat/completions", body, "")
	okStream(t, s)
	spans, ok := rcv.WaitFor(10*time.Second, func(spans []otlptest.Span) bool {
		n := 0
		for _, s := range spans {
			if s.Scope == "github.com/llmfailover/caddy-llm-failover" {
				n++
			}
		}
		return n == 3
	})
	if !ok {
		t.Fatalf("spans: %+v", spans)
	}
	for _, s := range spans {
		switch s.Name {
		case "llm_failover chat m":
			wantAttrs(t, "gateway span", s, map[string]any{
				"llm_failover.prompt": `{"messages":[{"role":"user","content":"T`, "llm_failover.prompt.truncated": true})
		case "chat m":
			if s.Attrs["llm_failover.attempt"] == int64(1) {
				wantAttrs(t, "failed attempt span", s, map[string]any{"llm_failover.attempt.kind": "chain", "error.type": "500"})
				continue
			}
			wantAttrs(t, "retry span", s, map[string]any{"llm_failover.attempt.kind": "retry_same", "llm_failover.attempt": 2,
				"llm_failover.completion": "Hello from content", "llm_failover.completion.truncated": false})
		}
	}
	for _, raw := range rcv.Raw() {
		if bytes.Contains(raw, []byte("upstream-key-c-0123456789")) {
			t.Error("an exported span holds the channel's key")
		}
	}
}

// A hedged request is one trace: two overlapping attempt spans under the
// gateway's, the hedge's of kind hedge, the loser's outcome hedge_lost,
// and decision events for the hedge and for its loser.
func TestTracingHedge(t *testing.T) {
	rcv := otlptest.Start(t)
	a := upstream(t, fu.SlowFirstToken(3*time.Second).Named("a"))
	b := upstream(t, fu.OKNamed("b"))
	loadTraced(t, rcv, gatewayConfig(hedgedChannels, a.URL, b.URL, "hedge-tr", "200ms", "hedge {\n\t\t\tbudget 100%\n\t\t}"))
	res, body := post(t, "/v1/chat/completions", fu.ChatRequest("hedge-tr", true))
	if res.StatusCode != 200 {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	answeredBy(t, res, "b")
	var gw otlptest.Span
	spans, ok := rcv.WaitFor(10*time.Second, func(spans []otlptest.Span) bool {
		for _, s := range spans {
			if s.Scope == "github.com/llmfailover/caddy-llm-failover" && s.Attrs["gen_ai.request.model"] == "hedge-tr" && s.Kind == "internal" {
				gw = s
				return len(rcv.Trace(s.TraceID)) == 4
			}
		}
		return false
	})
	if !ok {
		t.Fatalf("no complete trace of the hedged request among %d spans: %+v", len(spans), spans)
	}
	var tries []otlptest.Span
	for _, s := range rcv.Trace(gw.TraceID) {
		if s.Kind == "client" && s.ParentID == gw.SpanID {
			tries = append(tries, s)
		}
	}
	if len(tries) != 2 {
		t.Fatalf("%d attempt spans under the gateway's, want 2", len(tries))
	}
	byChannel := map[any]otlptest.Span{}
	for _, s := range tries {
		byChannel[s.Attrs["llm_failover.channel"]] = s
	}
	wantAttrs(t, "first attempt", byChannel["a"], map[string]any{"llm_failover.attempt.kind": "chain", "llm_failover.outcome": "hedge_lost"})
	wantAttrs(t, "hedge attempt", byChannel["b"], map[string]any{"llm_failover.attempt.kind": "hedge", "llm_failover.outcome": "served"})
	wantAttrs(t, "gateway span", gw, map[string]any{"llm_failover.served_by": "b", "llm_failover.attempts": 2})
	var reasons []string
	for _, ev := range gw.Events {
		reasons = append(reasons, fmt.Sprint(ev.Attrs["llm_failover.failover.reason"]))
	}
	if strings.Join(reasons, ",") != "hedge,hedge_lost" {
		t.Errorf("decision events %v, want hedge then hedge_lost", reasons)
	}
}
