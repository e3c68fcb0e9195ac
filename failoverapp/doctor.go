package failoverapp

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/llmfailover/caddy-llm-failover/internal/caddykit"
)

// The doctor sends each route of a channel two small real requests, plain
// and streamed, through the same walk as a client's (the channel's
// adapter, credentials, headers, transport, stream gate and body checks),
// judges each answer as traffic is judged, and says what is wrong with an
// actionable hint: the misconfigurations of real providers (a refused key, a new
// Vertex project's zero quota, a model not enabled, a Bedrock model
// needing an inference profile, an Azure deployment or api-version
// mismatch, a base URL whose path is wrong) all show only when an
// upstream is asked. Handlers register the Doctor that sends them.

func init() {
	registerSubcommand("doctor", subcommand{
		usage: "[--channel <name>]",
		short: "Sends one cheap real request per model route of each channel (or one) and says what is wrong",
		run:   runDoctor,
	})
}

// Doctor checks the routes of a handler's channels.
type Doctor interface {
	// CheckChannel checks every model route to the channel called name;
	// found is false when the handler has no such channel.
	CheckChannel(ctx context.Context, name string) (routes []RouteCheck, found bool)
	// Drill sends, for each route but the last of the model called
	// model (every model when ""), one request with that route's channel
	// made to fail (drill.go); found is false when the handler has no
	// such model.
	Drill(ctx context.Context, model string) (runs []DrillRun, found bool)
}

// Doctors registers a handler's doctor.
func (a *App) Doctors(d Doctor) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.doctors = append(a.doctors, d)
}

// ChannelCheck is the doctor's verdict on one channel.
type ChannelCheck struct {
	Channel string       `json:"channel"`
	OK      bool         `json:"ok"`
	Routes  []RouteCheck `json:"routes"`
	// Unexercised says that real traffic got no successful answer from
	// the channel within exercisedWindow: a fallback that is never used
	// is not known to work until the day it is needed.
	Unexercised string `json:"unexercised,omitempty"`
}

// exercisedWindow is how far back the doctor looks for the channel's last
// successful answer to real traffic.
const exercisedWindow = 7 * 24 * time.Hour

// RouteCheck is the verdict on one model route of the channel.
type RouteCheck struct {
	Model         string `json:"model"`
	UpstreamModel string `json:"upstream_model,omitempty"`
	API           string `json:"api"`
	// Stream: the check was a streamed request (each route is checked
	// plain and streamed).
	Stream bool `json:"stream"`
	OK     bool `json:"ok"`
	Status int  `json:"status,omitempty"`
	// Problem is what went wrong: the upstream's message, or why nothing
	// was sent. Hint says what to do about it.
	Problem string `json:"problem,omitempty"`
	Hint    string `json:"hint,omitempty"`
	Took    string `json:"took"`
}

// serveCheck answers POST /llm_failover/channels/<name>/check.
func serveCheck(w http.ResponseWriter, r *http.Request, a *App, name string) error {
	if err := caddykit.OnlyMethod(r, http.MethodPost); err != nil {
		return err
	}
	doctors := a.doctorList()
	out := ChannelCheck{Channel: name, OK: true, Routes: []RouteCheck{}}
	found := false
	for _, d := range doctors {
		routes, ok := d.CheckChannel(r.Context(), name)
		found = found || ok
		for _, c := range routes {
			out.OK = out.OK && c.OK
			out.Routes = append(out.Routes, c)
		}
	}
	if !found {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no channel named %q", name)}
	}
	now := time.Now()
	hist, _ := a.status.sources(now)
	if hist.Channel(name, now, exercisedWindow).Windows[exercisedWindow].Successes == 0 {
		out.Unexercised = fmt.Sprintf("no client request got a successful answer from %s in the last %d days: "+
			"a fallback never used is not known to work; `caddy llm-failover drill` makes each channel fail in turn to show the next ones answer", name, int(exercisedWindow.Hours()/24))
	}
	return caddykit.WriteJSON(w, out)
}

var ErrDoctorFound = errors.New("the doctor found problems")

func runDoctor(out io.Writer, admin string, args []string, asJSON bool) error {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	fs.SetOutput(out)
	only := fs.String("channel", "", "check only this channel")
	if err := fs.Parse(args); err != nil {
		return err
	}
	names := []string{*only}
	if *only == "" {
		var chans []ChannelStateView
		if err := caddykit.AdminCall(admin, http.MethodGet, "/llm_failover/channels", nil, &chans); err != nil {
			return err
		}
		names = names[:0]
		for _, c := range chans {
			names = append(names, c.Name)
		}
	}
	bad := 0
	checks := []ChannelCheck{}
	for _, name := range names {
		var c ChannelCheck
		if err := caddykit.AdminCall(admin, http.MethodPost, "/llm_failover/channels/"+url.PathEscape(name)+"/check", nil, &c); err != nil {
			return fmt.Errorf("checking channel %s: %w", name, err)
		}
		if asJSON {
			checks = append(checks, c)
		} else {
			printCheck(out, c)
		}
		if !c.OK {
			bad++
		}
	}
	if asJSON {
		if err := printJSON(out, checks); err != nil {
			return err
		}
	}
	if bad > 0 {
		return fmt.Errorf("%w in %d of %d channels", ErrDoctorFound, bad, len(names))
	}
	return nil
}

func printCheck(out io.Writer, c ChannelCheck) {
	if len(c.Routes) == 0 {
		fmt.Fprintf(out, "%s: no model routes to it, nothing to check\n", c.Channel)
		return
	}
	if c.Unexercised != "" {
		defer fmt.Fprintf(out, "    note: %s\n", c.Unexercised)
	}
	for _, r := range c.Routes {
		target := r.Model
		if r.UpstreamModel != "" {
			target += " as " + r.UpstreamModel
		}
		if r.Stream {
			target += ", streamed"
		}
		if r.OK {
			fmt.Fprintf(out, "%s: ok  %s (%s, %s)\n", c.Channel, target, r.API, r.Took)
			continue
		}
		status := ""
		if r.Status != 0 {
			status = fmt.Sprintf(" %d", r.Status)
		}
		fmt.Fprintf(out, "%s: FAIL %s (%s):%s %s\n", c.Channel, target, r.API, status, r.Problem)
		if r.Hint != "" {
			fmt.Fprintf(out, "    hint: %s\n", r.Hint)
		}
	}
}
