package failover

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// A traced request's ledger rows (the failed attempt's and the charge)
// name its trace; an untraced request's name none.
func TestLedgerRowsCarryTraceID(t *testing.T) {
	bad := upstream(t, fu.Status(http.StatusServiceUnavailable, fu.OpenAIErrorBody("overloaded", "server_error", "")))
	good := upstream(t, fu.OKNamed("b").WithUsage(10, 5))
	e := testEngine(t, testPlan(t, Options{}, func(m *Model) {
		m.Price = wallet.Price{Input: 1_000, Output: 1_000}
	}, testChannel{name: uniqueName("trace-bad"), url: bad.URL}, testChannel{name: uniqueName("trace-good"), url: good.URL}))
	ctx, st, secret := withTestWallet(t, e)

	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	serve := func(traced bool) string {
		reqCtx, traceID := context.Background(), ""
		if traced {
			var span trace.Span
			reqCtx, span = tp.Tracer("test").Start(reqCtx, "request")
			defer span.End()
			traceID = span.SpanContext().TraceID().String()
		}
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(string(fu.ChatRequest("m", false)))).WithContext(reqCtx)
		req.Header.Set("Authorization", "Bearer "+secret)
		w := httptest.NewRecorder()
		serveDirect(e, w, req)
		if w.Code != http.StatusOK {
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
		return traceID
	}
	// rowsOf waits for the account's charge and failed-attempt rows to
	// include charges charge rows, newest first.
	rowsOf := func(charges int) []wallet.Entry {
		var rows []wallet.Entry
		eventually(t, 5*time.Second, "the requests' ledger rows", func() bool {
			all, err := st.Usage(ctx, "acct", 0, 100)
			if err != nil {
				t.Fatal(err)
			}
			rows = rows[:0]
			n := 0
			for _, r := range all {
				if r.Kind == wallet.KindCharge || r.Kind == wallet.KindFailedAttempt {
					rows = append(rows, r)
				}
				if r.Kind == wallet.KindCharge {
					n++
				}
			}
			return n == charges && len(rows) > charges
		})
		return rows
	}

	traceID := serve(true)
	if len(traceID) != 32 {
		t.Fatalf("trace ID %q", traceID)
	}
	rows := rowsOf(1)
	if len(rows) != 2 {
		t.Fatalf("rows %+v, want a failed attempt and a charge", rows)
	}
	traced := rows[0].RequestID
	for _, r := range rows {
		if r.TraceID != traceID || r.RequestID != traced {
			t.Errorf("%s row's trace ID = %q, want %q: %+v", r.Kind, r.TraceID, traceID, r)
		}
	}

	serve(false)
	for _, r := range rowsOf(2) {
		if r.RequestID != traced && r.TraceID != "" {
			t.Errorf("untraced request's %s row has trace ID %q", r.Kind, r.TraceID)
		}
	}
}
