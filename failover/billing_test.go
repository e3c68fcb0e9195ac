package failover

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/llmfailover/caddy-llm-failover/provider"
	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

// billable charges what the upstream reported when it is plausible, the
// bound when it is not, and estimates only the counts it did not report:
// the output from the content delivered, the input from the request's
// text, never the bound.
func TestBillable(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"Write a short poem about the sea."}]}`)
	content := "The sea is wide, the sea is deep, and in its arms the sailors sleep."
	inputEstimate := provider.EstimateInputTokens(body)
	outputEstimate := provider.EstimateTokens([]byte(content))
	for _, tt := range []struct {
		name            string
		u               provider.Usage
		clientGone      bool
		wantIn, wantOut int64
		wantNote        string
	}{
		{"nothing reported", provider.Usage{}, false, inputEstimate, outputEstimate, "estimated: the answer ended without a usage report; input from the request's text and output from the content delivered"},
		{"client gone", provider.Usage{}, true, inputEstimate, outputEstimate, "estimated: the client left"},
		// Anthropic stream cut after message_start: input known, output
		// only a placeholder floor.
		{"input only", provider.Usage{Input: 30, Output: 1, InputKnown: true}, false, 30, outputEstimate, "output from the content delivered"},
		{"floor beats delivered", provider.Usage{Input: 30, Output: 500, InputKnown: true}, false, 30, 500, "estimated"},
		{"complete", provider.Usage{Input: 3, Output: 4, InputKnown: true, OutputKnown: true}, false, 3, 4, ""},
		{"negative", provider.Usage{Input: -5, Output: 4, InputKnown: true, OutputKnown: true}, false, 4000, 1000, "implausible usage reported (-5 in, 4 out"},
		{"above the bound", provider.Usage{Input: 3, Output: 1001, InputKnown: true, OutputKnown: true}, false, 4000, 1000, "implausible"},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		if tt.clientGone {
			cancel()
		}
		x := &exchange{r: httptest.NewRequest("POST", "/v1/chat/completions", nil).WithContext(ctx), body: body}
		b := &bill{x: x, inputBound: 4000, outputBound: 1000, meter: provider.OpenAIChat.NewMeter()}
		b.meter.Event(streamgate.Event{Data: []byte(`{"choices":[{"delta":{"content":"` + content + `"}}]}`)})
		in, out, c := b.billable(&billedAnswer{meter: b.meter, body: body, inputBound: b.inputBound, outputBound: b.outputBound}, tt.u)
		cancel()
		if in != tt.wantIn || out != tt.wantOut || !strings.Contains(c.note, tt.wantNote) || (tt.wantNote == "") != (c.note == "") {
			t.Errorf("%s: billable = %d, %d, %q; want %d, %d, %q", tt.name, in, out, c.note, tt.wantIn, tt.wantOut, tt.wantNote)
		}
	}
	if inputEstimate >= int64(len(body))/2 || inputEstimate < 8 {
		t.Errorf("the input estimate %d is not the text's (body %d bytes)", inputEstimate, len(body))
	}
}
