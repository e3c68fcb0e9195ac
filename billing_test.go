package llmfailover

import (
	"testing"

	"github.com/llmfailover/caddy-llm-failover/provider"
)

// billable charges what the upstream reported, and stand-ins only for the
// counts it did not report.
func TestBillableFallback(t *testing.T) {
	for _, tt := range []struct {
		name              string
		u                 provider.Usage
		inputBound, deliv int64
		wantIn, wantOut   int64
	}{
		// Client hung up after some text: no usage ever arrived.
		{"nothing reported", provider.Usage{}, 4000, 305, 4000, 305},
		// Anthropic stream cut after message_start: input known, output
		// only a placeholder floor.
		{"input only", provider.Usage{Input: 30, Output: 1, InputKnown: true}, 9999, 12, 30, 12},
		{"floor beats delivered", provider.Usage{Input: 30, Output: 50, InputKnown: true}, 9999, 12, 30, 50},
		// A complete report wins over the fallback.
		{"complete", provider.Usage{Input: 3, Output: 4, InputKnown: true, OutputKnown: true}, 9999, 1000, 3, 4},
	} {
		in, out := billable(tt.u, tt.inputBound, tt.deliv)
		if in != tt.wantIn || out != tt.wantOut {
			t.Errorf("%s: billable = %d, %d; want %d, %d", tt.name, in, out, tt.wantIn, tt.wantOut)
		}
	}
}
