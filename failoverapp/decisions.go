package failoverapp

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
	"github.com/llmfailover/caddy-llm-failover/journal"
)

// DecisionsAnswer is the admin answer of GET /llm_failover/decisions:
// rows newest first, or counts when grouped.
type DecisionsAnswer struct {
	Since     time.Time       `json:"since,omitzero"`
	GroupBy   string          `json:"group_by,omitempty"`
	Counts    []journal.Count `json:"counts,omitempty"`
	Decisions []DecisionView  `json:"decisions,omitempty"`
	Total     int             `json:"total"`
}

// maxDecisionRows bounds an ungrouped answer; grouping counts them all.
const maxDecisionRows = 1000

// serveDecisions answers GET /llm_failover/decisions?reason=&channel=&model=&since=1h&group_by=channel|reason|model.
func serveDecisions(w http.ResponseWriter, r *http.Request) error {
	if err := caddykit.OnlyMethod(r, http.MethodGet); err != nil {
		return err
	}
	q := r.URL.Query()
	f := journal.Filter{Reason: q.Get("reason"), Channel: q.Get("channel"), Model: q.Get("model")}
	if s := q.Get("since"); s != "" {
		d, err := caddy.ParseDuration(s)
		if err != nil || d <= 0 {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("since: %q is not a positive duration (e.g. 1h)", s)}
		}
		f.Since = time.Now().Add(-d)
	}
	ans := DecisionsAnswer{Since: f.Since}
	a := active()
	if a == nil {
		return caddykit.WriteJSON(w, ans)
	}
	_, jr := a.status.sources(time.Now())
	if g := q.Get("group_by"); g != "" {
		by, err := journal.ParseGroupBy(g)
		if err != nil {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
		}
		rows := jr.Query(f, 0)
		ans.GroupBy, ans.Counts, ans.Total = string(by), journal.Group(rows, by), len(rows)
		return caddykit.WriteJSON(w, ans)
	}
	for _, d := range jr.Query(f, maxDecisionRows) {
		ans.Decisions = append(ans.Decisions, DecisionView{Decision: d, Runbook: RunbookPath(d.Reason)})
	}
	ans.Total = len(ans.Decisions)
	return caddykit.WriteJSON(w, ans)
}

// serveStatus answers GET /llm_failover/status: the status page's JSON,
// channels included.
func serveStatus(w http.ResponseWriter, r *http.Request) error {
	if err := caddykit.OnlyMethod(r, http.MethodGet); err != nil {
		return err
	}
	return caddykit.WriteJSON(w, Status(time.Now(), "", false))
}

func init() {
	registerSubcommand("decisions", subcommand{
		usage: "[--reason R] [--channel C] [--model M] [--since 1h] [--by channel|reason|model]",
		short: "Lists failover decisions from the journal, or counts them grouped",
		run:   runDecisions,
	})
}

func runDecisions(out io.Writer, admin string, args []string, asJSON bool) error {
	fs := flag.NewFlagSet("decisions", flag.ContinueOnError)
	fs.SetOutput(out)
	reason := fs.String("reason", "", "only this failure reason")
	channel := fs.String("channel", "", "only this channel")
	model := fs.String("model", "", "only this model")
	since := fs.String("since", "1h", "how far back")
	by := fs.String("by", "", "count by channel, reason or model")
	if err := fs.Parse(args); err != nil {
		return err
	}
	q := url.Values{}
	for k, v := range map[string]string{"reason": *reason, "channel": *channel, "model": *model, "since": *since, "group_by": *by} {
		if v != "" {
			q.Set(k, v)
		}
	}
	var ans DecisionsAnswer
	if err := caddykit.AdminCall(admin, http.MethodGet, "/llm_failover/decisions?"+q.Encode(), nil, &ans); err != nil {
		return err
	}
	if asJSON {
		return printJSON(out, ans)
	}
	return printDecisions(out, ans)
}

// printDecisions prints the answer as a table.
func printDecisions(out io.Writer, ans DecisionsAnswer) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	if ans.GroupBy != "" {
		fmt.Fprintf(tw, "%s\tFAILOVERS\n", ans.GroupBy)
		for _, c := range ans.Counts {
			fmt.Fprintf(tw, "%s\t%d\n", c.Key, c.Count)
		}
		fmt.Fprintf(tw, "total\t%d\n", ans.Total)
		return tw.Flush()
	}
	fmt.Fprintln(tw, "TIME\tMODEL\tCHANNEL\tATTEMPT\tREASON\tSTATUS\tELAPSED\tBUDGET LEFT\tNEXT\tREQUEST")
	for _, d := range ans.Decisions {
		status := "-"
		if d.UpstreamStatus != 0 {
			status = strconv.Itoa(d.UpstreamStatus)
		}
		next := d.Next
		if next == "" {
			next = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", d.At.Local().Format(time.DateTime), d.Model, d.Channel, d.Attempt,
			d.Reason, status, d.Elapsed.Round(time.Millisecond), d.Remaining.Round(time.Millisecond), next, d.RequestID)
	}
	if len(ans.Decisions) == 0 {
		fmt.Fprintln(tw, "(no failover decisions match)")
	}
	return tw.Flush()
}
