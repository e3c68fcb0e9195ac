package failoverapp

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
)

// The drill proves each model's fallbacks work before the day they are
// needed ("failover is configured but never fires" is the failure users
// of other gateways report most): it sends each model one small real
// request per channel of its chain, with that channel made to fail inside
// the gateway, and shows the path each took. The drill's failovers are
// journaled (reason "drill"); nothing else records them: no breaker
// changes, no history, no bill.

func init() {
	registerSubcommand("drill", subcommand{
		usage: "[--model <name>]",
		short: "Sends each model one request per channel with that channel made to fail, and shows the path each took",
		run:   runDrill,
	})
}

// DrillRun is one drill request: its model, the channel made to fail,
// and the path it took.
type DrillRun struct {
	Model string `json:"model"`
	// Failed is the channel made to fail; the path starts there when it
	// is the chain's first.
	Failed string      `json:"failed_channel"`
	Path   []DrillStep `json:"path"`
	// OK: another channel answered.
	OK      bool   `json:"ok"`
	Problem string `json:"problem,omitempty"`
	Took    string `json:"took"`
}

// DrillStep is one attempt of a drill request.
type DrillStep struct {
	Channel string `json:"channel"`
	// Outcome is "ok", "drill" (made to fail), or the failure reason.
	Outcome string `json:"outcome"`
	Status  int    `json:"status,omitempty"`
}

// serveDrill answers POST /llm_failover/drill[?model=<name>].
func serveDrill(w http.ResponseWriter, r *http.Request, a *App) error {
	if err := caddykit.OnlyMethod(r, http.MethodPost); err != nil {
		return err
	}
	model := r.URL.Query().Get("model")
	runs, found := []DrillRun{}, false
	for _, d := range a.doctorList() {
		got, ok := d.Drill(r.Context(), model)
		found = found || ok
		runs = append(runs, got...)
	}
	if model != "" && !found {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no model named %q", model)}
	}
	return caddykit.WriteJSON(w, runs)
}

// doctorList is the handlers' doctors; none without a running config.
func (a *App) doctorList() []Doctor {
	if a == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Doctor(nil), a.doctors...)
}

// ErrDrillFailed is the drill's exit when a request found no channel.
var ErrDrillFailed = fmt.Errorf("the drill found a model with no working fallback")

func runDrill(out io.Writer, admin string, args []string, asJSON bool) error {
	fs := flag.NewFlagSet("drill", flag.ContinueOnError)
	fs.SetOutput(out)
	model := fs.String("model", "", "drill only this model")
	if err := fs.Parse(args); err != nil {
		return err
	}
	path := "/llm_failover/drill"
	if *model != "" {
		path += "?model=" + url.QueryEscape(*model)
	}
	var runs []DrillRun
	if err := caddykit.AdminCall(admin, http.MethodPost, path, nil, &runs); err != nil {
		return err
	}
	bad := 0
	for _, r := range runs {
		if !r.OK {
			bad++
		}
	}
	if asJSON {
		if err := printJSON(out, runs); err != nil {
			return err
		}
		runs = nil // printed
	}
	for _, r := range runs {
		steps := make([]string, 0, len(r.Path))
		for _, s := range r.Path {
			step := s.Channel + " " + s.Outcome
			if s.Status != 0 {
				step += fmt.Sprintf(" %d", s.Status)
			}
			steps = append(steps, step)
		}
		verdict := "ok  "
		if !r.OK {
			verdict = "FAIL"
		}
		fmt.Fprintf(out, "%s %s, %s made to fail: %s (%s)\n", verdict, r.Model, r.Failed, strings.Join(steps, " -> "), r.Took)
		if r.Problem != "" {
			fmt.Fprintf(out, "    %s\n", r.Problem)
		}
	}
	if len(runs) == 0 && !asJSON {
		fmt.Fprintln(out, "no model has a channel to drill")
	}
	if bad > 0 {
		return fmt.Errorf("%w: %d of %d drill requests", ErrDrillFailed, bad, len(runs))
	}
	return nil
}
