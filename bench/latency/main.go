// Command latency reads the JSON lines bench/load -rate -json printed in
// bench/latency.sh (labelled "<mode> <target> <rate>", e.g. "json
// llm_failover 1500") and prints the latency each target adds to the
// upstream's own at each fixed rate: for every repetition, the target's
// percentile minus the direct run's of the same repetition (they ran side
// by side), then the median over repetitions. With -svg it also draws the
// added p50 and p99 against the rate.
//
//	go run ./bench/latency -svg latency.svg results.jsonl
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
)

type pcts struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p99_9"`
}

type run struct {
	Label    string  `json:"label"`
	Requests int     `json:"requests"`
	Errors   int     `json:"errors"`
	RPS      float64 `json:"rps"`
	Latency  pcts    `json:"latency_ms"`
	TTFB     pcts    `json:"ttfb_ms"`
	// The proxy's CPU over the measured window (bench/load -cpu-pid):
	// whether a knee is the core running out or something else.
	CPUPerRequestUS float64 `json:"server_cpu_us_per_request"`
	CPUCoreShare    float64 `json:"server_cpu_core_share"`
	// What the proxy allocated a request over the window and its
	// collections per 1,000 requests (bench/load -vars; Caddy only): how
	// often its collector interrupts, the tail's main part once the
	// machine's wake-up is out (bench/README.md).
	AllocBytes float64 `json:"server_alloc_bytes_per_request"`
	GCPer1k    float64 `json:"server_gc_per_1k_requests"`
}

// key is one cell of the table.
type key struct {
	mode, target string
	rate         int
}

// direct is the upstream read without a proxy: the baseline.
const direct = "direct"

func main() {
	svg := flag.String("svg", "", "also draw the added p50 and p99 latency against the rate to this SVG file")
	flag.Parse()
	runs := map[key][]run{}
	for _, path := range flag.Args() {
		if err := read(path, runs); err != nil {
			fmt.Fprintln(os.Stderr, "latency:", err)
			os.Exit(1)
		}
	}
	rows := added(runs)
	printTable(os.Stdout, rows)
	if *svg != "" {
		if err := os.WriteFile(*svg, []byte(chart(rows)), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "latency:", err)
			os.Exit(1)
		}
	}
}

func read(path string, runs map[key][]run) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r run
		if json.Unmarshal(sc.Bytes(), &r) != nil || r.Label == "" {
			continue
		}
		f := strings.Fields(r.Label)
		if len(f) != 3 {
			continue
		}
		rate, err := strconv.Atoi(f[2])
		if err != nil {
			continue
		}
		k := key{f[0], f[1], rate}
		runs[k] = append(runs[k], r)
	}
	return sc.Err()
}

// row is one target at one rate: what it added to direct's latency and
// time to first byte, medians over the repetitions, and its own figures.
type row struct {
	key
	reps              int
	rps               float64
	errors            int
	lat, ttfb, direct pcts // added latency, added ttfb; direct's own latency
	// p99Lo and p99Hi are the least and the most p99 added in one
	// repetition: how far one run's tail can be trusted on this machine.
	p99Lo, p99Hi float64
	// cpuUS and cpuShare are the proxy's CPU a request and share of its
	// core, medians; 0 when not measured.
	cpuUS, cpuShare float64
	// allocB and gcPer1k are the proxy's bytes allocated a request and
	// collections per 1,000 requests, medians; 0 when not measured.
	allocB, gcPer1k float64
}

func added(runs map[key][]run) []row {
	var rows []row
	for k, rs := range runs {
		if k.target == direct {
			continue
		}
		base := runs[key{k.mode, direct, k.rate}]
		n := min(len(rs), len(base))
		if n == 0 {
			continue
		}
		r := row{key: k, reps: n}
		var lat, ttfb, own [4][]float64
		var rps, cpuUS, cpuShare, allocB, gcPer1k []float64
		for i := 0; i < n; i++ {
			t, d := rs[i], base[i]
			for j, pair := range [4][2]float64{{t.Latency.P50, d.Latency.P50}, {t.Latency.P90, d.Latency.P90}, {t.Latency.P99, d.Latency.P99}, {t.Latency.P999, d.Latency.P999}} {
				lat[j] = append(lat[j], pair[0]-pair[1])
			}
			for j, pair := range [4][2]float64{{t.TTFB.P50, d.TTFB.P50}, {t.TTFB.P90, d.TTFB.P90}, {t.TTFB.P99, d.TTFB.P99}, {t.TTFB.P999, d.TTFB.P999}} {
				ttfb[j] = append(ttfb[j], pair[0]-pair[1])
			}
			for j, v := range [4]float64{d.Latency.P50, d.Latency.P90, d.Latency.P99, d.Latency.P999} {
				own[j] = append(own[j], v)
			}
			rps = append(rps, t.RPS)
			cpuUS, cpuShare = append(cpuUS, t.CPUPerRequestUS), append(cpuShare, t.CPUCoreShare)
			allocB, gcPer1k = append(allocB, t.AllocBytes), append(gcPer1k, t.GCPer1k)
			r.errors += t.Errors
		}
		r.lat = pcts{median(lat[0]), median(lat[1]), median(lat[2]), median(lat[3])}
		r.ttfb = pcts{median(ttfb[0]), median(ttfb[1]), median(ttfb[2]), median(ttfb[3])}
		r.direct = pcts{median(own[0]), median(own[1]), median(own[2]), median(own[3])}
		r.rps = median(rps)
		r.p99Lo, r.p99Hi = slices.Min(lat[2]), slices.Max(lat[2])
		r.cpuUS, r.cpuShare = median(cpuUS), median(cpuShare)
		r.allocB, r.gcPer1k = median(allocB), median(gcPer1k)
		rows = append(rows, r)
	}
	sort.Slice(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if a.mode != b.mode {
			return a.mode < b.mode
		}
		if a.rate != b.rate {
			return a.rate < b.rate
		}
		return a.target < b.target
	})
	return rows
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func printTable(w io.Writer, rows []row) {
	fmt.Fprintln(w, "| mode | rate/s | target | added p50 | p90 | p99 | p99 over runs | p99.9 | added TTFB p50 | p99 | direct p50 / p99 | proxy CPU µs/request (core) | proxy alloc B/request (GCs per 1k) | served/s | errors | runs |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		cpu := "–"
		if r.cpuUS > 0 {
			cpu = fmt.Sprintf("%.0f (%.0f %%)", r.cpuUS, r.cpuShare*100)
		}
		alloc := "–"
		if r.allocB > 0 {
			alloc = fmt.Sprintf("%.0f (%.2f)", r.allocB, r.gcPer1k)
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s to %s | %s | %s | %s | %.2f / %.2f | %s | %s | %.0f | %d | %d |\n",
			r.mode, r.rate, r.target, msf(r.lat.P50), msf(r.lat.P90), msf(r.lat.P99), msf(r.p99Lo), msf(r.p99Hi), msf(r.lat.P999),
			msf(r.ttfb.P50), msf(r.ttfb.P99), r.direct.P50, r.direct.P99, cpu, alloc, r.rps, r.errors, r.reps)
	}
	fmt.Fprintln(w, "\nAdded latencies in ms: the target's percentile minus the direct run's, per repetition, median over repetitions; \"p99 over runs\" is the least and the most of one repetition.")
}

func msf(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }

// chart draws added p50 (thin) and p99 (thick) latency against the rate,
// one colour per target, one panel per mode, on a log scale from 10 µs
// (added latencies below it, noise included, sit on the axis): past a
// target's knee its latency grows by orders of magnitude, and a linear
// scale would flatten everything below it.
func chart(rows []row) string {
	modes, targets, rates := []string{}, []string{}, []int{}
	seen := map[string]bool{}
	maxY := 0.1
	for _, r := range rows {
		for _, s := range []string{"m" + r.mode, "t" + r.target, "r" + strconv.Itoa(r.rate)} {
			if seen[s] {
				continue
			}
			seen[s] = true
			switch s[0] {
			case 'm':
				modes = append(modes, r.mode)
			case 't':
				targets = append(targets, r.target)
			case 'r':
				rates = append(rates, r.rate)
			}
		}
		maxY = math.Max(maxY, math.Max(r.lat.P99, r.lat.P50))
	}
	if len(rows) == 0 {
		// Only the direct runs: nothing was added to draw.
		return `<svg xmlns="http://www.w3.org/2000/svg" width="400" height="40"><text x="10" y="25">no proxy measured</text></svg>` + "\n"
	}
	sort.Ints(rates)
	sort.Strings(targets)
	maxY = math.Pow(10, math.Ceil(math.Log10(maxY)))
	colors := []string{"#4f7cac", "#c0504d", "#9bbb59", "#8064a2", "#f79646"}
	const pw, ph, left, top, gap = 460, 300, 60, 50, 40
	width := left + len(modes)*(pw+gap) + 220
	height := top + ph + 70
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="14" font-weight="bold">Latency added to the upstream's at a fixed request rate (p50 thin, p99 thick), ms, log scale</text>`+"\n", left)
	const floor = 0.01
	logMin, logMax := math.Log10(floor), math.Log10(maxY)
	yOf := func(v float64) float64 {
		return float64(top+ph) - (math.Log10(math.Max(v, floor))-logMin)/(logMax-logMin)*ph
	}
	minR, maxR := float64(rates[0]), float64(rates[len(rates)-1])
	if maxR == minR {
		maxR = minR + 1
	}
	for mi, mode := range modes {
		x0 := left + mi*(pw+gap)
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-weight="bold">%s</text>`+"\n", x0, top-8, html.EscapeString(mode))
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", x0, top, pw, ph)
		for v := floor; v <= maxY*1.0001; v *= 10 {
			y := yOf(v)
			fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#eee"/><text x="%d" y="%.1f" text-anchor="end">%g</text>`+"\n", x0, x0+pw, y, y, x0-4, y+4, v)
		}
		px := func(rate int) float64 { return float64(x0) + (float64(rate)-minR)/(maxR-minR)*float64(pw-20) + 10 }
		for _, rate := range rates {
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%d</text>`+"\n", px(rate), top+ph+16, rate)
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">requests per second</text>`+"\n", x0+pw/2, top+ph+34)
		for ti, target := range targets {
			for _, p99 := range []bool{false, true} {
				var pts []string
				for _, r := range rows {
					if r.mode != mode || r.target != target {
						continue
					}
					v := r.lat.P50
					if p99 {
						v = r.lat.P99
					}
					y := yOf(math.Min(v, maxY))
					pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(r.rate), y))
				}
				w := 1.2
				if p99 {
					w = 2.8
				}
				fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="%.1f" points="%s"/>`+"\n", colors[ti%len(colors)], w, strings.Join(pts, " "))
			}
		}
	}
	lx := left + len(modes)*(pw+gap)
	for ti, target := range targets {
		y := top + 20 + ti*20
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2.8"/><text x="%d" y="%d">%s</text>`+"\n",
			lx, lx+24, y, y, colors[ti%len(colors)], lx+30, y+4, html.EscapeString(target))
	}
	b.WriteString("</svg>\n")
	return b.String()
}
