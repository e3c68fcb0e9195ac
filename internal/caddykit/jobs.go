package caddykit

import (
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/llmfailover/caddy-llm-failover/jobs"
)

// Jobs is the process's background jobs and their heartbeats. It is
// process-wide, like the metrics it feeds: a job's record survives
// `caddy reload`, and every config's heartbeats attach to it by name.
var Jobs = jobs.NewRegistry(newPinger())

func newPinger() *jobs.Pinger {
	p := jobs.NewPinger(&http.Client{}, 2, 256, jobs.DefaultRetries)
	p.Report = func(job string, style jobs.Style, state jobs.State, err error) {
		// Never the URL: it is the receiver's secret.
		caddy.Log().Named("llm_failover.heartbeat").Warn("heartbeat ping failed; the job itself is unaffected",
			zap.String("job", job), zap.String("style", string(style)), zap.String("state", string(state)), zap.Error(err))
	}
	return p
}

// HeartbeatConfig attaches a heartbeat receiver to a job.
type HeartbeatConfig struct {
	// Job is the job's name, e.g. wallet_sweep.default.
	Job string `json:"job"`
	// URL is the receiver's ping URL; it may be a placeholder such as
	// {env.HC_SWEEP_URL}, resolved when the config loads. It is a secret:
	// it appears in no log line and no admin answer.
	URL string `json:"url"`
	// Style is healthchecks (default), uptime_kuma, cronitor or generic.
	Style string `json:"style,omitempty"`
	// States to report: start, success, fail. Default: success and fail
	// (and start for healthchecks and cronitor).
	States []string `json:"states,omitempty"`
	// Timeout bounds one ping. Default: 10s.
	Timeout caddy.Duration `json:"timeout,omitempty"`
}

// UnmarshalHeartbeat reads `heartbeat <job> <url> [{ style ...; states ...; timeout ... }]`.
func UnmarshalHeartbeat(d *caddyfile.Dispenser) (HeartbeatConfig, error) {
	var c HeartbeatConfig
	if !d.Args(&c.Job, &c.URL) {
		return c, d.Errf("heartbeat needs <job> <url>")
	}
	if err := NoMoreArgs(d); err != nil {
		return c, err
	}
	seen := Seen{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if err := seen.Once(d, "heartbeat: "); err != nil {
			return c, err
		}
		var err error
		switch d.Val() {
		case "style":
			if !d.NextArg() {
				return c, d.ArgErr()
			}
			c.Style = d.Val()
			err = NoMoreArgs(d)
		case "states":
			c.States = d.RemainingArgs()
			if len(c.States) == 0 {
				return c, d.ArgErr()
			}
		case "timeout":
			if c.Timeout, err = DurationArg(d); err == nil {
				err = NoMoreArgs(d)
			}
		default:
			return c, d.Errf("unrecognized heartbeat option '%s'", d.Val())
		}
		if err != nil {
			return c, err
		}
	}
	if _, err := c.heartbeat(false); err != nil {
		return c, d.Errf("heartbeat %s: %v", c.Job, err)
	}
	return c, nil
}

// heartbeat checks the config and builds the receiver; with resolve, the
// URL's placeholders are replaced.
func (c HeartbeatConfig) heartbeat(resolve bool) (jobs.Heartbeat, error) {
	if c.Job == "" {
		return jobs.Heartbeat{}, fmt.Errorf("a heartbeat needs a job name")
	}
	style, err := jobs.ParseStyle(c.Style)
	if err != nil {
		return jobs.Heartbeat{}, err
	}
	hb := jobs.Heartbeat{URL: c.URL, Style: style, Timeout: time.Duration(c.Timeout)}
	for _, s := range c.States {
		st, err := jobs.ParseState(s)
		if err != nil {
			return jobs.Heartbeat{}, err
		}
		hb.States = append(hb.States, st)
	}
	if c.Timeout < 0 {
		return jobs.Heartbeat{}, fmt.Errorf("timeout must not be negative")
	}
	if resolve {
		if hb.URL, err = Resolve(c.URL); err != nil {
			return jobs.Heartbeat{}, fmt.Errorf("url: %w", err)
		}
		u, err := url.Parse(hb.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			// Not quoted: the URL is a secret.
			return jobs.Heartbeat{}, fmt.Errorf("url must be an absolute http(s) URL")
		}
	}
	return hb, nil
}

// ValidateHeartbeats resolves and validates every receiver without attaching
// it, so that a config with a bad one is refused when it loads.
func ValidateHeartbeats(configs []HeartbeatConfig) error {
	for _, c := range configs {
		if _, err := c.heartbeat(true); err != nil {
			return fmt.Errorf("heartbeat %s: %w", c.Job, err)
		}
	}
	return nil
}

// AttachHeartbeats attaches every receiver to its job and returns the
// function that detaches them all (for Cleanup; safe to call twice).
func AttachHeartbeats(configs []HeartbeatConfig) (detach func(), err error) {
	var detachers []func()
	detach = func() {
		for _, d := range detachers {
			d()
		}
		detachers = nil
	}
	for _, c := range configs {
		hb, err := c.heartbeat(true)
		if err != nil {
			detach()
			return func() {}, fmt.Errorf("heartbeat %s: %w", c.Job, err)
		}
		detachers = append(detachers, Jobs.Attach(c.Job, hb))
	}
	return detach, nil
}

// The jobs' series are labelled job_name, not job: Prometheus sets its own
// target label job on every series it scrapes, which would overwrite the
// job's name (or move it to exported_job) and leave alerts naming the
// scrape job instead of the job that failed.
var (
	jobLastSuccessDesc = prometheus.NewDesc("caddy_llm_failover_job_last_success_timestamp_seconds",
		"When each background job last succeeded; alert when it is older than a few intervals.", []string{"job_name"}, nil)
	jobDurationDesc = prometheus.NewDesc("caddy_llm_failover_job_duration_seconds",
		"How long each background job's last run took.", []string{"job_name"}, nil)
	jobOverdueDesc = prometheus.NewDesc("caddy_llm_failover_job_overdue",
		"1 when a periodic job has not succeeded for two of its intervals.", []string{"job_name"}, nil)
)

// JobMetrics reads the jobs' records at scrape time.
type JobMetrics struct{}

// Describe implements prometheus.Collector.
func (JobMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- jobLastSuccessDesc
	ch <- jobDurationDesc
	ch <- jobOverdueDesc
}

// Collect implements prometheus.Collector.
func (JobMetrics) Collect(ch chan<- prometheus.Metric) {
	for _, s := range Jobs.Statuses() {
		if !s.LastSuccess.IsZero() {
			ch <- prometheus.MustNewConstMetric(jobLastSuccessDesc, prometheus.GaugeValue, float64(s.LastSuccess.UnixNano())/1e9, s.Name)
		}
		if s.Runs > 0 {
			ch <- prometheus.MustNewConstMetric(jobDurationDesc, prometheus.GaugeValue, s.Duration.Seconds(), s.Name)
		}
		overdue := 0.0
		if s.Overdue {
			overdue = 1
		}
		ch <- prometheus.MustNewConstMetric(jobOverdueDesc, prometheus.GaugeValue, overdue, s.Name)
	}
}
