package status

import (
	"cmp"
	"fmt"
	"html/template"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
)

// render writes the status page as one self-contained HTML document:
// inline CSS and SVG, no script, readable on a phone. refresh > 0 adds a
// meta refresh. base is the page's own path, ending in "/": its runbook
// links are relative to it.
func render(w io.Writer, v failoverapp.StatusView, refresh time.Duration, base string) error {
	return statusTemplate.Execute(w, map[string]any{"V": v, "Refresh": int(refresh.Seconds()), "Reasons": v.Legend, "Base": base})
}

// barColor is a bar's colour by the share of down and limited outcomes:
// grey without traffic, red for outages, amber for rate limits.
func barColor(b failoverapp.BarView) string {
	judged := b.Attempts - b.Client
	if judged <= 0 {
		return "#d4d8dd"
	}
	down, limited := float64(b.Down)/float64(judged), float64(b.Limited)/float64(judged)
	switch {
	case down >= 0.25:
		return "#c62828"
	case down >= 0.05:
		return "#ef6c00"
	case limited >= 0.05:
		return "#f9a825"
	case down > 0 || limited > 0:
		return "#9ccc65"
	}
	return "#2e7d32"
}

// barTitle is a bar's tooltip; unit is what it counts (requests for a
// model, attempts for a channel).
func barTitle(b failoverapp.BarView, layout, unit string) string {
	if b.Attempts == 0 {
		return b.Start.Format(layout) + ": no traffic"
	}
	ok := percent(b.SuccessRate)
	if b.SuccessRate == nil {
		ok = "no upstream verdict" // client errors only: drawn grey
	} else {
		ok += " ok"
	}
	return fmt.Sprintf("%s: %d %s, %s, %d down, %d rate limited, %d client errors",
		b.Start.Format(layout), b.Attempts, unit, ok, b.Down, b.Limited, b.Client)
}

// bars draws bars as an inline SVG, one rect per period, with a tooltip.
func bars(bs []failoverapp.BarView, layout, unit string) template.HTML {
	const w, gap, h = 6, 2, 28
	out := fmt.Sprintf(`<svg class="bars" viewBox="0 0 %d %d" preserveAspectRatio="none" role="img">`, len(bs)*(w+gap), h)
	for i, b := range bs {
		out += fmt.Sprintf(`<rect x="%d" y="0" width="%d" height="%d" rx="1" fill="%s"><title>%s</title></rect>`,
			i*(w+gap), w, h, barColor(b), template.HTMLEscapeString(barTitle(b, layout, unit)))
	}
	return template.HTML(out + `</svg>`)
}

// percent is a success rate over judged attempts (client errors
// excluded), "–" when there were none (nil): no data is not 100 %. It is
// rounded down to the hundredth, so that a rate with failures never
// reads as a perfect 100.00%.
func percent(rate *float64) string {
	if rate == nil {
		return "–"
	}
	return fmt.Sprintf("%.2f%%", math.Floor(10000**rate+1e-9)/100)
}

// cacheReads is a window's cache-read share as a whole percent, "" when
// it has no input tokens (no share is known, which is not 0 %). A share
// that rounds to 0 or 100 without being it reads "<1 %" or ">99 %".
func cacheReads(w failoverapp.WindowView) string {
	if w.CacheReadShare == nil || w.InputTokens <= 0 {
		return ""
	}
	p := 100 * *w.CacheReadShare
	switch {
	case p > 0 && p < 0.5:
		return "<1 %"
	case p < 100 && p >= 99.5:
		return ">99 %"
	}
	return fmt.Sprintf("%d %%", int(math.Round(p)))
}

func ago(now, t time.Time) string {
	if t.IsZero() {
		return ""
	}
	d := now.Sub(t).Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm ago", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}

// span is a duration as people write it: "850 ms", "12.4 s", "9 min 0 s".
func span(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	d = d.Round(time.Second)
	return fmt.Sprintf("%d min %d s", int(d.Minutes()), int(d.Seconds())%60)
}

// kindLabels name a learned deadline's kind of wait for people.
var kindLabels = map[string]string{"header": "response headers", "first_content": "first content", "gap": "pause in a stream"}

// deadlineLimit is a learned deadline's limit; a configured timeout of 0
// leaves the wait unbounded.
func deadlineLimit(d failoverapp.LearnedDeadlineView) string {
	if d.LimitMs <= 0 {
		return "none"
	}
	return span(time.Duration(d.LimitMs) * time.Millisecond)
}

// deadlineBasis says where a deadline comes from: "p99 1.2 s over 60
// samples", or the configured timeout while the samples are too few.
func deadlineBasis(d failoverapp.LearnedDeadlineView) string {
	if !d.Learned {
		return fmt.Sprintf("configured timeout: %d samples so far", d.Samples)
	}
	return fmt.Sprintf("p%s %s over %d samples", strconv.FormatFloat(d.Percentile, 'f', -1, 64),
		span(time.Duration(d.QuantileMs)*time.Millisecond), d.Samples)
}

var statusLabels = map[string]string{
	failoverapp.StatusOperational: "Operational", failoverapp.StatusDegraded: "Degraded", failoverapp.StatusLimited: "Rate limited", failoverapp.StatusDown: "Down",
}

var statusTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"bars":    bars,
	"percent": percent,
	"cache":   cacheReads,
	"ago":     ago,
	"span":    span,
	"kind":    func(k string) string { return cmp.Or(kindLabels[k], k) },
	"limit":   deadlineLimit,
	"basis":   deadlineBasis,
	"label":   func(s string) string { return statusLabels[s] },
	"lower":   strings.ToLower,
	"runbook": failoverapp.RunbookPath,
	"ts":      func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
	"ms": func(n int64) string {
		if n == 0 {
			return "–"
		}
		return fmt.Sprintf("%d ms", n)
	},
	"win": func(m map[string]failoverapp.WindowView, k string) failoverapp.WindowView { return m[k] },
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<base href="{{.Base}}">
{{if .Refresh}}<meta http-equiv="refresh" content="{{.Refresh}}">{{end}}
<title>{{.V.Title}} – {{label .V.Status}}</title>
<style>
:root{--fg:#1f2328;--mute:#59636e;--line:#d0d7de;--bg:#f6f8fa;--ok:#2e7d32;--deg:#ef6c00;--lim:#b8860b;--down:#c62828}
*{box-sizing:border-box}body{margin:0;font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
main{max-width:960px;margin:0 auto;padding:16px}
h1{font-size:22px;margin:4px 0 12px}h2{font-size:18px;margin:0}h3{font-size:15px;margin:0}
.banner{padding:14px 16px;border-radius:8px;color:#fff;font-weight:600;font-size:17px;margin-bottom:16px}
.b-operational{background:var(--ok)}.b-degraded{background:var(--deg)}.b-rate_limited{background:var(--lim)}.b-down{background:var(--down)}
.card{background:#fff;border:1px solid var(--line);border-radius:8px;padding:14px 16px;margin-bottom:14px}
.head{display:flex;flex-wrap:wrap;gap:8px;align-items:baseline;justify-content:space-between}
.pill{display:inline-block;border-radius:999px;padding:1px 10px;font-size:13px;font-weight:600;color:#fff}
.p-operational{background:var(--ok)}.p-degraded{background:var(--deg)}.p-rate_limited{background:var(--lim)}.p-down{background:var(--down)}
.mute{color:var(--mute);font-size:13px}
.bars{width:100%;height:28px;display:block;margin:4px 0 0}
.axis{display:flex;justify-content:space-between;color:var(--mute);font-size:12px;margin-bottom:8px}
table{border-collapse:collapse;width:100%;font-size:13px}td,th{text-align:left;padding:3px 6px;border-bottom:1px solid #eef0f2;vertical-align:top}
th{color:var(--mute);font-weight:600}
.scroll td,.scroll th{white-space:nowrap}
.channel{border-top:1px solid var(--line);margin-top:12px;padding-top:10px}
.kv{display:grid;grid-template-columns:repeat(auto-fit,minmax(140px,1fr));gap:6px 14px;margin:8px 0}
.kv div span{display:block;color:var(--mute);font-size:12px}
a{color:#0969da}
.scroll{overflow-x:auto}
footer{color:var(--mute);font-size:12px;margin:18px 0}
</style></head>
<body><main>
<h1>{{.V.Title}}</h1>
<div class="banner b-{{.V.Status}}">{{if eq .V.Status "operational"}}All models operational{{else}}{{label .V.Status}} —{{range .V.Models}}{{if ne .Status "operational"}} <a href="#model-{{.Name}}" style="color:#fff">{{.Name}}</a> is {{lower (label .Status)}}.{{end}}{{end}}{{end}}</div>
{{$now := .V.GeneratedAt}}{{$hidden := .V.Hidden}}
{{range .V.Models}}
<section class="card" id="model-{{.Name}}">
<div class="head"><h2>{{.Name}}</h2><span><span class="pill p-{{.Status}}">{{label .Status}}</span> <span class="mute">since {{ts .Since}} ({{ago $now .Since}})</span></span></div>
<div class="mute">What clients got: requests answered in full, or failed after every channel was tried.</div>
<div class="kv">{{$m := .}}{{range $k := $.V.WindowKeys}}{{$w := win $m.Windows $k}}<div><span>requests ok {{$k}}</span>{{percent $w.SuccessRate}} <span>{{$w.Attempts}} requests · {{$w.Down}} failed · {{$w.Limited}} limited</span></div>{{end}}
{{$d := win .Windows "1h"}}<div><span>first content 1h p50 / p95</span>{{ms $d.TTFTp50}} / {{ms $d.TTFTp95}}</div>
{{with cache $d}}<div><span>cache reads 1h</span>{{.}} <span>of {{$d.InputTokens}} input tokens</span></div>{{end}}</div>
<div class="mute">Last 90 days</div>{{bars .Daily "2006-01-02" "requests"}}<div class="axis"><span>90 days ago</span><span>today</span></div>
<div class="mute">Last 48 hours</div>{{bars .Hourly "Jan 2 15:00 UTC" "requests"}}<div class="axis"><span>48 h ago</span><span>now</span></div>
{{if .Channels}}<div class="mute">Its channels, by upstream attempt: a failed attempt fails over to the next channel, so it is not a failed request.</div>{{end}}
{{range .Channels}}
<div class="channel" id="channel-{{$m.Name}}-{{.Name}}">
<div class="head"><h3>{{.Name}}</h3><span><span class="pill p-{{.Status}}">{{label .Status}}</span> <span class="mute">breaker <a href="{{.StateRunbook}}">{{.State}}</a> since {{ago $now .Since}}</span></span></div>
<div class="mute">The gateway is {{.Doing}}{{if not .Until.IsZero}} until {{ts .Until}}{{end}}.</div>
<div class="kv">{{$c := .}}{{range $k := $.V.WindowKeys}}{{$w := win $c.Windows $k}}<div><span>attempts ok {{$k}}</span>{{percent $w.SuccessRate}} <span>{{$w.Attempts}} att · {{$w.Down}} down · {{$w.Limited}} limited · {{$w.Client}} client</span></div>{{end}}
{{$d := win .Windows "1h"}}<div><span>first content 1h p50 / p95</span>{{ms $d.TTFTp50}} / {{ms $d.TTFTp95}}</div>
{{with cache $d}}<div><span>cache reads 1h</span>{{.}} <span>of {{$d.InputTokens}} input tokens</span></div>{{end}}
<div><span>last failure</span>{{with .LastFailure}}<a href="{{.Runbook}}">{{.Reason}}</a>{{if .Status}} {{.Status}}{{end}} <span>{{ts .At}} ({{ago $now .At}})</span>{{else}}none{{end}}</div>
{{with .Probes}}<div><span>synthetic checks (not traffic)</span>{{if .LastAt.IsZero}}none sent{{else}}last {{.LastResult}}{{if .LastReason}} ({{.LastReason}}){{end}}{{end}} <span>{{if not .LastAt.IsZero}}{{ago $now .LastAt}} · {{end}}spent today ${{.SpentToday}}{{if .BudgetStopped}} · the budget left cannot cover another probe: stopped for today{{end}}</span></div>{{end}}</div>
{{bars .Daily "2006-01-02" "attempts"}}<div class="axis"><span>90 days</span><span>today</span></div>
{{bars .Hourly "Jan 2 15:00 UTC" "attempts"}}<div class="axis"><span>48 h</span><span>now</span></div>
{{if .LearnedDeadlines}}<div class="scroll"><table><tr><th>learned deadline</th><th title="prompt / output size: s, m, l">size</th><th>limit</th><th>from</th></tr>
{{range .LearnedDeadlines}}<tr><td>{{kind .Kind}}</td><td>{{.Class}}</td><td>{{limit .}}</td><td>{{basis .}}</td></tr>
{{end}}</table></div>{{end}}
{{if .Decisions}}<div class="scroll"><table><tr><th>failover at</th><th>reason</th><th>upstream</th><th>attempt</th><th>elapsed</th><th>budget left</th><th>next</th></tr>
{{range .Decisions}}<tr><td>{{ts .At}}</td><td><a href="{{.Runbook}}">{{.Reason}}</a></td><td>{{if .UpstreamStatus}}{{.UpstreamStatus}}{{else}}–{{end}}</td><td>{{.Attempt}}</td><td>{{span .Elapsed}}</td><td>{{span .Remaining}}</td><td>{{if .Next}}{{.Next}}{{else}}none: client answered with an error{{end}}</td></tr>
{{end}}</table></div>{{end}}
</div>
{{end}}
</section>
{{else}}<section class="card">No models are configured.</section>
{{end}}
<section class="card"><h2>Incidents</h2>
{{if .V.Incidents}}<div class="scroll"><table><tr><th>what</th><th>started</th><th>ended</th><th>reasons</th><th>counted</th></tr>
{{range .V.Incidents}}<tr><td>{{if eq .Kind "model"}}model {{.Subject}} had no working channel{{else}}channel {{.Subject}} open{{end}}</td><td>{{ts .Start}}</td><td>{{if .Ongoing}}<strong>ongoing</strong>{{else}}{{ts .End}}{{end}}</td><td>{{range $r, $n := .Reasons}}<a href="{{runbook $r}}">{{$r}}</a> ×{{$n}} {{end}}</td><td>{{if eq .Kind "model"}}{{.Attempts}} requests, {{.Failures}} failed{{else}}{{.Attempts}} attempts, {{.Failures}} failed (those that opened it included){{end}}</td></tr>
{{end}}</table></div>{{else}}<p class="mute">No incidents in the last 90 days.</p>{{end}}
</section>
{{if .Reasons}}<section class="card"><h2>Runbooks</h2><p>{{range $i, $r := .Reasons}}{{if $i}} · {{end}}<a href="{{runbook $r}}">{{$r}}</a>{{end}}</p></section>{{end}}
<footer>Generated {{ts .V.GeneratedAt}} from real traffic through this gateway. Bars: green ok, light green some failures, amber rate limited, orange or red down, grey no traffic. Also as JSON: <a href="?format=json">?format=json</a>.</footer>
</main></body></html>
`))
