package failover

import (
	"fmt"

	"github.com/llmfailover/caddy-llm-failover/provider"
)

// charge explains a settlement that is not simply the upstream's report:
// kind is a metric label, note goes on the ledger row ("" for a plain
// report).
type charge struct{ kind, note string }

// billable returns the tokens to charge for one upstream answer a (the
// attempt that served, or one half of a resumed answer).
//
//   - A plausible report wins: what the upstream reported.
//   - An implausible one (negative, or above what the request could use) is
//     charged at the request's bound, the most it could have cost.
//   - A missing count is estimated: the output from the content actually
//     delivered (the meter's decoded deltas, see provider.TokenEstimator),
//     the input from the request's text, each capped at its bound. A
//     partial report (Anthropic's message_start input) still counts.
//
// Settle caps the charge at the reservation either way, so no path can
// overdraw.
func (b *bill) billable(a *billedAnswer, u provider.Usage) (in, out int64, c charge) {
	if u.Input < 0 || u.Output < 0 || u.Input > a.inputBound || u.Output > a.outputBound {
		return a.inputBound, a.outputBound, charge{"implausible", fmt.Sprintf(
			"implausible usage reported (%d in, %d out; the request allows at most %d in, %d out): charged at the bound",
			u.Input, u.Output, a.inputBound, a.outputBound)}
	}
	in, out = u.Input, u.Output
	if u.InputKnown && u.OutputKnown {
		return in, out, charge{}
	}
	var parts []string
	if !u.InputKnown {
		in = min(provider.EstimateInputTokens(a.body), a.inputBound)
		parts = append(parts, "input from the request's text")
	}
	if !u.OutputKnown {
		out = min(max(out, a.meter.DeliveredTokens()), a.outputBound)
		parts = append(parts, "output from the content delivered")
	}
	why := "the answer ended without a usage report"
	if err := b.x.r.Context().Err(); err != nil {
		why = "the client left before the usage report"
	}
	note := "estimated: " + why + "; " + parts[0]
	if len(parts) > 1 {
		note += " and " + parts[1]
	}
	return in, out, charge{"estimated", note}
}
