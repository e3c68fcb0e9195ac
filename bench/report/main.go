// Command report reads the JSON lines that bench/load -json printed
// (labelled "<mode> <target>", e.g. "stream llm_failover") and prints the
// comparison tables of bench/run.sh: medians over the repetitions of each
// target, ratios of rates and CPU, and differences of latencies.
//
// Two kinds of comparison are printed per mode, each when both of its
// targets have runs:
//
//   - llm_failover against reverse_proxy (column "llmf vs rp");
//   - every "llm_failover+<x>" target (e.g. llm_failover+wallet) against
//     plain llm_failover (column "on vs off"): the cost of the option x,
//     and against reverse_proxy (column "vs rp");
//   - every fleet run "<n>x<target>/<i>" (instance i of n, loaded at the
//     same time, bench/run.sh BENCH_INSTANCES=n) against <target> on one
//     instance (column "n vs 1"): per instance and all n together.
//
// Runs alternate A B [C] A B [C], so besides the ratio of the medians it
// gives the median of the per-pair ratios and differences: run i of the
// target under test against run i of its base, which ran just before it.
// Each pair ran side by side in time, which cancels most of the drift of a
// shared machine.
//
//	go run ./bench/report results.jsonl
//
// Several files are pooled, in the order given (runs of the same command,
// so that run j of each target is one repetition). -min-core-share F
// drops every repetition in which some run's gateway had less than F of
// its core, which on a shared machine measures the neighbour:
//
//	go run ./bench/report -min-core-share 0.9 bench/results/A.jsonl bench/results/B.jsonl
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
)

type pcts struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
}

type result struct {
	Label      string  `json:"label"`
	Requests   int     `json:"requests"`
	Errors     int     `json:"errors"`
	FirstError string  `json:"first_error"`
	RPS        float64 `json:"rps"`
	Latency    pcts    `json:"latency_ms"`
	TTFB       pcts    `json:"ttfb_ms"`
	CPUSeconds float64 `json:"server_cpu_s"`
	CPUPerReq  float64 `json:"server_cpu_us_per_request"`
	CPUShare   float64 `json:"server_cpu_core_share"`
	DBSeconds  float64 `json:"db_cpu_s"`
	DBPerReq   float64 `json:"db_cpu_us_per_request"`
	AllocBytes float64 `json:"server_alloc_bytes_per_request"`
	Allocs     float64 `json:"server_allocs_per_request"`
	GCPer1k    float64 `json:"server_gc_per_1k_requests"`
	// capacity is the rate at one core per instance: 1e6/CPUPerReq for one
	// instance, the sum of the instances' for a fleet.
	capacity float64
}

const (
	base = "reverse_proxy"
	test = "llm_failover"
	// optPrefix marks a target that is llm_failover with one option on,
	// such as "llm_failover+wallet"; it is compared against test.
	optPrefix = test + "+"
)

// comparison is one table: test against base.
type comparison struct {
	base, test string
	head       string // header of the ratio/difference column
	title      string // after the mode in the table's title
}

// dataset is every run read, by mode and target, in the order they ran.
type dataset struct {
	runs    map[string]map[string][]result // mode -> target -> runs in order
	modes   []string
	targets map[string][]string // mode -> targets in order of first run
	fleets  map[string][]*fleet // mode -> fleet runs in order of first run
}

func newDataset() *dataset {
	return &dataset{runs: map[string]map[string][]result{}, targets: map[string][]string{}, fleets: map[string][]*fleet{}}
}

// read adds the JSON lines of r; name is for errors.
func (d *dataset) read(r io.Reader, name string) error {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var r result
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return fmt.Errorf("%s: bad line: %w", name, err)
		}
		mode, target, _ := strings.Cut(r.Label, " ")
		if r.CPUPerReq > 0 {
			r.capacity = 1e6 / r.CPUPerReq
		}
		if d.runs[mode] == nil {
			d.runs[mode] = map[string][]result{}
			d.modes = append(d.modes, mode)
		}
		if of, n, i, ok := fleetPart(target); ok {
			d.fleets[mode] = addFleetPart(d.fleets[mode], of, n, i, r)
			continue
		}
		if d.runs[mode][target] == nil {
			d.targets[mode] = append(d.targets[mode], target)
		}
		d.runs[mode][target] = append(d.runs[mode][target], r)
	}
	return sc.Err()
}

// keepWholeCores drops, per mode, every repetition in which some run had
// less than share of a core (CPUShare; runs without the figure are kept):
// run j of every target and fleet instance goes together, so that the
// pairs stay pairs. It returns, per mode, the repetitions kept and read.
// On a shared machine a run whose gateway was starved measures the
// neighbour, not the gateway.
func (d *dataset) keepWholeCores(share float64) map[string][2]int {
	out := map[string][2]int{}
	for _, mode := range d.modes {
		// Every run list of the mode: the targets', then the fleet
		// instances', written back in the same order below.
		var lists [][]result
		for _, t := range d.targets[mode] {
			lists = append(lists, d.runs[mode][t])
		}
		for _, f := range d.fleets[mode] {
			lists = append(lists, f.parts...)
		}
		reps := 0
		for _, l := range lists {
			reps = max(reps, len(l))
		}
		keep := make([]bool, reps)
		kept := 0
		for j := range keep {
			keep[j] = true
			for _, l := range lists {
				if j < len(l) && l[j].CPUShare > 0 && l[j].CPUShare < share {
					keep[j] = false
				}
			}
			if keep[j] {
				kept++
			}
		}
		for k, l := range lists {
			var in []result
			for j, r := range l {
				if keep[j] {
					in = append(in, r)
				}
			}
			lists[k] = in
		}
		for _, t := range d.targets[mode] {
			d.runs[mode][t], lists = lists[0], lists[1:]
		}
		for _, f := range d.fleets[mode] {
			for i := range f.parts {
				f.parts[i], lists = lists[0], lists[1:]
			}
		}
		out[mode] = [2]int{kept, reps}
	}
	return out
}

func main() {
	share := flag.Float64("min-core-share", 0, "drop every repetition in which a run's gateway had less than this share of its core (e.g. 0.9)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: report [-min-core-share F] results.jsonl [more.jsonl ...]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	d := newDataset()
	for _, name := range flag.Args() {
		f, err := os.Open(name)
		if err != nil {
			fmt.Fprintln(os.Stderr, "report:", err)
			os.Exit(1)
		}
		err = d.read(f, name)
		f.Close()
		if err != nil {
			fmt.Fprintln(os.Stderr, "report:", err)
			os.Exit(1)
		}
	}

	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	if *share > 0 {
		kept := d.keepWholeCores(*share)
		for _, mode := range d.modes {
			fmt.Fprintf(w, "%s: kept %d of %d repetitions, those in which every run had at least %.2f of its core\n", mode, kept[mode][0], kept[mode][1], *share)
		}
	}
	ok := true
	for _, mode := range d.modes {
		cmps := []comparison{{base: base, test: test, head: "llmf vs rp"}}
		for _, t := range d.targets[mode] {
			if opt, found := strings.CutPrefix(t, optPrefix); found {
				cmps = append(cmps, comparison{base: test, test: t, head: "on vs off", title: opt + " on vs off"},
					comparison{base: base, test: t, head: "vs rp", title: opt + " vs reverse_proxy"})
			}
		}
		for _, c := range cmps {
			if !table(w, mode, c, d.runs[mode][c.base], d.runs[mode][c.test]) {
				ok = false
			}
		}
		for _, f := range d.fleets[mode] {
			if !fleetTable(w, mode, f, d.runs[mode][f.of]) {
				ok = false
			}
		}
	}
	if !ok {
		w.Flush()
		os.Exit(3)
	}
}

// table prints one comparison of one mode; it reports false when a run of
// either target had errors. It prints nothing when a target has no runs.
func table(w *bufio.Writer, mode string, c comparison, a, b []result) bool {
	if len(a) == 0 || len(b) == 0 {
		return true
	}
	n := min(len(a), len(b))
	title := mode
	if c.title != "" {
		title += ", " + c.title
	}
	wa, wb := max(14, len(c.base)), max(14, len(c.test))
	fmt.Fprintf(w, "\n%s (%d runs each, medians)\n", title, n)
	fmt.Fprintf(w, "  %-22s %*s %*s %12s %22s\n", "metric", wa, c.base, wb, c.test, c.head, "paired median [min..max]")
	row := func(name string, get func(result) float64, ratio bool) {
		ma, mb := median(pick(a, get)), median(pick(b, get))
		writeRow(w, name, []column{{wa, ma}, {wb, mb}}, ma, mb, pairs(a[:n], b[:n], get, ratio), ratio)
	}
	row("requests/s", func(r result) float64 { return r.RPS }, true)
	if a[0].CPUPerReq > 0 && b[0].CPUPerReq > 0 {
		row("caddy cpu us/request", func(r result) float64 { return r.CPUPerReq }, true)
		row("one-core capacity r/s", func(r result) float64 { return r.capacity }, true)
		row("caddy core share %", func(r result) float64 { return 100 * r.CPUShare }, true)
	}
	if a[0].AllocBytes > 0 && b[0].AllocBytes > 0 {
		// Caddy's allocation per request (the whole process: Caddy's
		// server, the transport and the handler), which sets how often
		// its collector runs.
		row("caddy alloc B/request", func(r result) float64 { return r.AllocBytes }, true)
		row("caddy allocs/request", func(r result) float64 { return r.Allocs }, true)
		row("caddy GCs/1k requests", func(r result) float64 { return r.GCPer1k }, true)
	}
	if c.title != "" && b[0].DBPerReq > 0 {
		// The database's CPU (postmaster and backends) per request: for
		// the base, whatever else the server did in the window.
		row("postgres cpu us/req", func(r result) float64 { return r.DBPerReq }, false)
	}
	row("latency p50 ms", func(r result) float64 { return r.Latency.P50 }, false)
	row("latency p90 ms", func(r result) float64 { return r.Latency.P90 }, false)
	row("latency p99 ms", func(r result) float64 { return r.Latency.P99 }, false)
	if mode == "stream" {
		row("ttfb p50 ms", func(r result) float64 { return r.TTFB.P50 }, false)
		row("ttfb p99 ms", func(r result) float64 { return r.TTFB.P99 }, false)
	}
	if c.title != "" && a[0].CPUPerReq > 0 && b[0].CPUPerReq > 0 {
		// What the option adds in absolute terms, the figure to set
		// against a budget per request.
		row("added cpu us/request", func(r result) float64 { return r.CPUPerReq }, false)
	}
	return totals(w, c.base, a) && totals(w, c.test, b)
}

// totals prints a target's requests and errors over its runs and reports
// whether none had an error.
func totals(w *bufio.Writer, name string, rs []result) bool {
	errs, reqs, first := 0, 0, ""
	for _, r := range rs {
		errs += r.Errors
		reqs += r.Requests
		if first == "" {
			first = r.FirstError
		}
	}
	fmt.Fprintf(w, "  %-22s %d requests, %d errors", name, reqs, errs)
	if first != "" {
		fmt.Fprintf(w, " (first: %s)", first)
	}
	fmt.Fprintln(w)
	return first == ""
}

// column is one printed value of a row, right-aligned in width; NaN
// prints as "-".
type column struct {
	width int
	value float64
}

// writeRow prints a metric's columns, then how the tested median mb
// compares with the base's ma (a ratio, or a difference in ms or, for a
// name with " us/", in µs) and the same for the sorted per-pair values.
func writeRow(w *bufio.Writer, name string, cols []column, ma, mb float64, paired []float64, ratio bool) {
	prec, unit := 3, "ms"
	if ratio || strings.Contains(name, " us/") {
		prec, unit = 1, "us"
	}
	fmt.Fprintf(w, "  %-22s", name)
	for _, c := range cols {
		if math.IsNaN(c.value) {
			fmt.Fprintf(w, " %*s", c.width, "-")
		} else {
			fmt.Fprintf(w, " %*.*f", c.width, prec, c.value)
		}
	}
	lo, hi := paired[0], paired[len(paired)-1]
	switch {
	case ratio:
		fmt.Fprintf(w, " %11.3fx %8.3fx [%.3f..%.3f]\n", mb/ma, median(paired), lo, hi)
	case unit == "us":
		fmt.Fprintf(w, " %+9.1f us %+8.1f us [%+.1f..%+.1f]\n", mb-ma, median(paired), lo, hi)
	default:
		fmt.Fprintf(w, " %+9.3f ms %+8.3f ms [%+.3f..%+.3f]\n", mb-ma, median(paired), lo, hi)
	}
}

// pairs compares run i of b with run i of a, which ran just before it,
// and returns the ratios (or differences), sorted.
func pairs(a, b []result, get func(result) float64, ratio bool) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		if ratio {
			out[i] = get(b[i]) / get(a[i])
		} else {
			out[i] = get(b[i]) - get(a[i])
		}
	}
	sort.Float64s(out)
	return out
}

func pick(rs []result, get func(result) float64) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = get(r)
	}
	return out
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// fleet is the runs of one target on n instances at once: parts[i] are
// instance i+1's runs, in order.
type fleet struct {
	of    string
	n     int
	parts [][]result
}

// fleetPart parses a fleet run's target, "<n>x<target>/<i>".
func fleetPart(target string) (of string, n, i int, ok bool) {
	count, rest, found := strings.Cut(target, "x")
	rest, index, found2 := strings.Cut(rest, "/")
	n, err1 := strconv.Atoi(count)
	i, err2 := strconv.Atoi(index)
	if !found || !found2 || err1 != nil || err2 != nil || n < 2 || i < 1 || i > n || rest == "" {
		return "", 0, 0, false
	}
	return rest, n, i, true
}

func addFleetPart(fs []*fleet, of string, n, i int, r result) []*fleet {
	for _, f := range fs {
		if f.of == of && f.n == n {
			f.parts[i-1] = append(f.parts[i-1], r)
			return fs
		}
	}
	f := &fleet{of: of, n: n, parts: make([][]result, n)}
	f.parts[i-1] = append(f.parts[i-1], r)
	return append(fs, f)
}

// together combines run j of every instance into what the fleet did:
// rates, CPU cores and one-core capacities add up; CPU per request is the
// fleet's CPU over its requests; the database (measured by the first
// instance's load over the same window) is divided by all the requests; a
// p50 is the requests-weighted mean of the instances' (an estimate), a
// p90 or p99 the worst instance's.
func (f *fleet) together(j int) result {
	var t result
	for _, part := range f.parts {
		r := part[j]
		t.Requests += r.Requests
		t.Errors += r.Errors
		if t.FirstError == "" {
			t.FirstError = r.FirstError
		}
		t.RPS += r.RPS
		t.CPUSeconds += r.CPUSeconds
		t.CPUShare += r.CPUShare
		t.capacity += r.capacity
		t.Latency.P50 += r.Latency.P50 * float64(r.Requests)
		t.TTFB.P50 += r.TTFB.P50 * float64(r.Requests)
		t.Latency.P90, t.Latency.P99 = max(t.Latency.P90, r.Latency.P90), max(t.Latency.P99, r.Latency.P99)
		t.TTFB.P90, t.TTFB.P99 = max(t.TTFB.P90, r.TTFB.P90), max(t.TTFB.P99, r.TTFB.P99)
	}
	if t.Requests > 0 {
		t.Latency.P50 /= float64(t.Requests)
		t.TTFB.P50 /= float64(t.Requests)
		t.CPUPerReq = t.CPUSeconds / float64(t.Requests) * 1e6
		t.DBPerReq = f.parts[0][j].DBSeconds / float64(t.Requests) * 1e6
	}
	return t
}

// fleetTable prints target on one instance against target on f.n
// instances: each instance's medians, the fleet's, and the fleet against
// one instance. It reports false when a run had errors.
func fleetTable(w *bufio.Writer, mode string, f *fleet, single []result) bool {
	n := len(single)
	for _, part := range f.parts {
		n = min(n, len(part))
	}
	if n == 0 {
		return true
	}
	all := make([]result, n)
	for j := range all {
		all[j] = f.together(j)
	}
	const width = 12
	head := fmt.Sprintf("%d vs 1", f.n)
	fmt.Fprintf(w, "\n%s, %s on %d instances vs 1 (%d runs each, medians)\n", mode, strings.TrimPrefix(f.of, optPrefix), f.n, n)
	fmt.Fprintf(w, "  %-22s %*s", "metric", width, "1 instance")
	for i := range f.parts {
		fmt.Fprintf(w, " %*s", width, fmt.Sprintf("instance %d", i+1))
	}
	fmt.Fprintf(w, " %*s %12s %22s\n", width, fmt.Sprintf("%d together", f.n), head, "paired median [min..max]")
	// fleetRow prints a row; perInstance false leaves the instances'
	// columns out, for a figure only the fleet as a whole has.
	fleetRow := func(name string, get func(result) float64, ratio, perInstance bool) {
		ma, mb := median(pick(single[:n], get)), median(pick(all, get))
		cols := []column{{width, ma}}
		for _, part := range f.parts {
			v := math.NaN()
			if perInstance {
				v = median(pick(part[:n], get))
			}
			cols = append(cols, column{width, v})
		}
		cols = append(cols, column{width, mb})
		writeRow(w, name, cols, ma, mb, pairs(single[:n], all, get, ratio), ratio)
	}
	row := func(name string, get func(result) float64, ratio bool) { fleetRow(name, get, ratio, true) }
	row("requests/s", func(r result) float64 { return r.RPS }, true)
	if single[0].CPUPerReq > 0 && all[0].CPUPerReq > 0 {
		row("caddy cpu us/request", func(r result) float64 { return r.CPUPerReq }, true)
		row("one-core capacity r/s", func(r result) float64 { return r.capacity }, true)
		row("caddy core share %", func(r result) float64 { return 100 * r.CPUShare }, true)
	}
	if single[0].DBPerReq > 0 && all[0].DBPerReq > 0 {
		// The database serves the whole fleet: one figure for it.
		fleetRow("postgres cpu us/req", func(r result) float64 { return r.DBPerReq }, false, false)
	}
	row("latency p50 ms", func(r result) float64 { return r.Latency.P50 }, false)
	row("latency p99 ms", func(r result) float64 { return r.Latency.P99 }, false)
	if mode == "stream" {
		row("ttfb p50 ms", func(r result) float64 { return r.TTFB.P50 }, false)
	}
	ok := totals(w, "1 instance", single)
	for i, part := range f.parts {
		ok = totals(w, fmt.Sprintf("instance %d of %d", i+1, f.n), part) && ok
	}
	return ok
}
