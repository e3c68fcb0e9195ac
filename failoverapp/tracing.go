package failoverapp

import (
	"context"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/tracing"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
)

// Synthetic checks have no client request, so no request span to add
// theirs under; when the config traces requests (a server has Caddy's
// tracing handler), the app traces its probes too, each as its own
// trace. Caddy keeps its tracer provider to itself, so the app builds one
// the way Caddy does: an exporter from the standard OTEL_* variables
// (autoexport), a batching processor, the default resource
// (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES). It lives as long as the
// config: Stop flushes and shuts it down.

// probeTracerShutdown bounds the flush of the probe spans at Stop.
const probeTracerShutdown = 5 * time.Second

// startProbeTracing builds the probe tracer provider when the config
// traces requests; nil when it does not or the exporter cannot be built
// (logged: requests are still traced by Caddy).
func startProbeTracing(ctx caddy.Context, logger *zap.Logger) *sdktrace.TracerProvider {
	if !tracesRequests(ctx) {
		return nil
	}
	exp, err := autoexport.NewSpanExporter(context.Background())
	if err != nil {
		logger.Error("synthetic checks are not traced: building the OTLP exporter failed", zap.Error(err))
		return nil
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(resource.Default()))
}

// tracesRequests reports whether a server of the config has Caddy's
// tracing handler.
func tracesRequests(ctx caddy.Context) bool {
	httpApp, err := ctx.AppIfConfigured("http")
	if err != nil || httpApp == nil {
		return false
	}
	for _, srv := range httpApp.(*caddyhttp.App).Servers {
		if anyHandler(srv.Routes, func(h caddyhttp.MiddlewareHandler) bool {
			_, ok := h.(*tracing.Tracing)
			return ok
		}) {
			return true
		}
	}
	return false
}

// stopProbeTracing flushes and shuts down tp (nil: nothing to do).
func stopProbeTracing(tp *sdktrace.TracerProvider, logger *zap.Logger) {
	if tp == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTracerShutdown)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		logger.Warn("flushing the synthetic checks' spans failed", zap.Error(err))
	}
}

// ProbeTracer is the tracer synthetic checks start their traces with; nil
// when the config traces no requests.
func (a *App) ProbeTracer() trace.Tracer {
	if a == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.probeTraces == nil {
		return nil
	}
	return a.probeTraces.Tracer("github.com/llmfailover/caddy-llm-failover")
}
