package otlptest

import (
	"fmt"
	"html"
	"sort"
	"strings"
	"time"
)

// Waterfall draws one trace's spans as a trace viewer shows them: a row
// per span, children under their parent, a bar from its start to its end
// on the trace's time axis, events as marks on their span's bar, and the
// attributes named in show under each span. The result is an SVG image.
func Waterfall(spans []Span, show []string) []byte {
	if len(spans) == 0 {
		return nil
	}
	rows := treeOrder(spans)
	t0, t1 := spans[0].Start, spans[0].End
	for _, s := range spans {
		if s.Start.Before(t0) {
			t0 = s.Start
		}
		if s.End.After(t1) {
			t1 = s.End
		}
	}
	total := max(t1.Sub(t0), time.Microsecond)
	const (
		width, labelW, barW = 1100, 380, 600
		rowH, attrH, pad    = 26, 15, 16
	)
	type drawn struct {
		s     Span
		depth int
		attrs []string
	}
	var all []drawn
	height := pad*2 + 30
	for _, r := range rows {
		d := drawn{s: r.s, depth: r.depth}
		for _, k := range show {
			if v, ok := r.s.Attrs[k]; ok {
				d.attrs = append(d.attrs, fmt.Sprintf("%s=%v", k, v))
			}
		}
		for _, e := range r.s.Events {
			parts := []string{"event " + e.Name + ":"}
			keys := make([]string, 0, len(e.Attrs))
			for k := range e.Attrs {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				parts = append(parts, fmt.Sprintf("%s=%v", strings.TrimPrefix(k, "llm_failover."), e.Attrs[k]))
			}
			d.attrs = append(d.attrs, strings.Join(parts, " "))
		}
		all = append(all, d)
		height += rowH + attrH*len(wrap(d.attrs, 110))
	}
	x := func(t time.Time) float64 { return labelW + float64(t.Sub(t0))/float64(total)*barW }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="ui-monospace,Menlo,Consolas,monospace" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="13" font-weight="bold">trace %s · %s</text>`+"\n", pad, pad+8, spans[0].TraceID, total.Round(10*time.Microsecond))
	y := pad + 30
	for _, d := range all {
		fill := map[string]string{"server": "#7c8db5", "internal": "#4f9a94", "client": "#d9a441"}[d.s.Kind]
		if d.s.StatusError {
			fill = "#c8553d"
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s <tspan fill="#777">(%s)</tspan></text>`+"\n",
			pad+14*d.depth, y+15, esc(d.s.Name), d.s.Kind)
		x0, x1 := x(d.s.Start), x(d.s.End)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="16" rx="2" fill="%s"/>`+"\n", x0, y+3, max(x1-x0, 1.5), fill)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" fill="#333">%s</text>`+"\n", min(x1+4, width-70), y+15, d.s.End.Sub(d.s.Start).Round(10*time.Microsecond))
		for _, e := range d.s.Events {
			ex := x(e.At)
			fmt.Fprintf(&b, `<path d="M%.1f %d l5 6 l-5 6 l-5 -6 z" fill="#222"/>`+"\n", ex, y+5)
		}
		y += rowH
		for _, line := range wrap(d.attrs, 110) {
			fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="10.5" fill="#555">%s</text>`+"\n", pad+14*d.depth+10, y+8, esc(line))
			y += attrH
		}
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

func esc(s string) string { return html.EscapeString(s) }

// wrap joins items into lines of at most n characters.
func wrap(items []string, n int) []string {
	var lines []string
	cur := ""
	for _, it := range items {
		switch {
		case cur == "":
			cur = it
		case len(cur)+2+len(it) <= n:
			cur += "  " + it
		default:
			lines = append(lines, cur)
			cur = it
		}
	}
	if cur != "" {
		lines = append(lines, cur)
	}
	return lines
}

type treeRow struct {
	s     Span
	depth int
}

// treeOrder lists spans depth first from the roots, siblings by start.
func treeOrder(spans []Span) []treeRow {
	ids := map[string]bool{}
	children := map[string][]Span{}
	for _, s := range spans {
		ids[s.SpanID] = true
	}
	var roots []Span
	for _, s := range spans {
		if !ids[s.ParentID] {
			roots = append(roots, s)
		} else {
			children[s.ParentID] = append(children[s.ParentID], s)
		}
	}
	var out []treeRow
	var walk func(ss []Span, depth int)
	walk = func(ss []Span, depth int) {
		sort.SliceStable(ss, func(i, j int) bool { return ss[i].Start.Before(ss[j].Start) })
		for _, s := range ss {
			out = append(out, treeRow{s, depth})
			walk(children[s.SpanID], depth+1)
		}
	}
	walk(roots, 0)
	return out
}
