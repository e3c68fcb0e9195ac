// Package otlptest is an OTLP trace receiver for tests: a real gRPC
// server speaking the OpenTelemetry collector's TraceService, started on
// a loopback port, that keeps every span it is sent and the raw bytes of
// every export (so a test can look for what must never be exported).
package otlptest

import (
	"context"
	"encoding/hex"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, flattened for assertions.
type Span struct {
	TraceID, SpanID, ParentID string
	Name                      string
	Kind                      string // internal, server, client, …
	Start, End                time.Time
	Attrs                     map[string]any
	Events                    []Event
	// StatusError: the span's status is Error; StatusMessage its message.
	StatusError   bool
	StatusMessage string
	// Service is the resource's service.name; Scope the instrumentation
	// scope's name.
	Service, Scope string
}

// Event is one span event.
type Event struct {
	Name  string
	At    time.Time
	Attrs map[string]any
}

// Receiver is a running OTLP/gRPC trace receiver.
type Receiver struct {
	collectortrace.UnimplementedTraceServiceServer
	// Endpoint is its address as OTEL_EXPORTER_OTLP_ENDPOINT takes it.
	Endpoint string

	srv *grpc.Server
	mu  sync.Mutex
	got []Span
	raw [][]byte
}

// Start starts a receiver on a loopback port; it stops with the test.
func Start(t testing.TB) *Receiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Receiver{Endpoint: "http://" + ln.Addr().String(), srv: grpc.NewServer()}
	collectortrace.RegisterTraceServiceServer(r.srv, r)
	go func() { _ = r.srv.Serve(ln) }()
	t.Cleanup(r.srv.Stop)
	return r
}

// Export implements the collector's TraceService.
func (r *Receiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	raw, _ := proto.Marshal(req)
	var spans []Span
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{
					TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentID: hex.EncodeToString(s.GetParentSpanId()), Name: s.GetName(), Kind: kindName(int32(s.GetKind())),
					Start: time.Unix(0, int64(s.GetStartTimeUnixNano())), End: time.Unix(0, int64(s.GetEndTimeUnixNano())),
					Attrs: attrs(s.GetAttributes()), StatusError: s.GetStatus().GetCode() == 2, StatusMessage: s.GetStatus().GetMessage(),
					Service: service, Scope: ss.GetScope().GetName(),
				}
				for _, e := range s.GetEvents() {
					sp.Events = append(sp.Events, Event{Name: e.GetName(), At: time.Unix(0, int64(e.GetTimeUnixNano())), Attrs: attrs(e.GetAttributes())})
				}
				spans = append(spans, sp)
			}
		}
	}
	r.mu.Lock()
	r.got = append(r.got, spans...)
	r.raw = append(r.raw, raw)
	r.mu.Unlock()
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func kindName(k int32) string {
	return map[int32]string{1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}[k]
}

func attrs(kvs []*commonpb.KeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = value(kv.GetValue())
	}
	return m
}

func value(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_ArrayValue:
		var out []any
		for _, e := range x.ArrayValue.GetValues() {
			out = append(out, value(e))
		}
		return out
	}
	return nil
}

// Spans returns the spans received so far, oldest start first.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]Span(nil), r.got...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}

// Raw returns the bytes of every export request received so far.
func (r *Receiver) Raw() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]byte(nil), r.raw...)
}

// Trace returns the spans of trace id.
func (r *Receiver) Trace(id string) []Span {
	var out []Span
	for _, s := range r.Spans() {
		if s.TraceID == id {
			out = append(out, s)
		}
	}
	return out
}

// WaitFor waits up to d for cond to hold over the spans received, and
// returns them.
func (r *Receiver) WaitFor(d time.Duration, cond func([]Span) bool) ([]Span, bool) {
	deadline := time.Now().Add(d)
	for {
		spans := r.Spans()
		if cond(spans) {
			return spans, true
		}
		if time.Now().After(deadline) {
			return spans, false
		}
		time.Sleep(20 * time.Millisecond)
	}
}
