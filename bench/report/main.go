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
//     plain llm_failover (column "on vs off"): the cost of the option x.
//
// Runs alternate A B [C] A B [C], so besides the ratio of the medians it
// gives the median of the per-pair ratios and differences: run i of the
// target under test against run i of its base, which ran just before it.
// Each pair ran side by side in time, which cancels most of the drift of a
// shared machine.
//
//	go run ./bench/report results.jsonl
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
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
	CPUPerReq  float64 `json:"server_cpu_us_per_request"`
	CPUShare   float64 `json:"server_cpu_core_share"`
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

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: report results.jsonl")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(1)
	}
	defer f.Close()
	runs := map[string]map[string][]result{} // mode -> target -> runs in order
	var modes []string
	targets := map[string][]string{} // mode -> targets in order of first run
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var r result
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			fmt.Fprintln(os.Stderr, "report: bad line:", err)
			os.Exit(1)
		}
		mode, target, _ := strings.Cut(r.Label, " ")
		if runs[mode] == nil {
			runs[mode] = map[string][]result{}
			modes = append(modes, mode)
		}
		if runs[mode][target] == nil {
			targets[mode] = append(targets[mode], target)
		}
		runs[mode][target] = append(runs[mode][target], r)
	}

	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	ok := true
	for _, mode := range modes {
		cmps := []comparison{{base: base, test: test, head: "llmf vs rp"}}
		for _, t := range targets[mode] {
			if opt, found := strings.CutPrefix(t, optPrefix); found {
				cmps = append(cmps, comparison{base: test, test: t, head: "on vs off", title: opt + " on vs off"})
			}
		}
		for _, c := range cmps {
			if !table(w, mode, c, runs[mode][c.base], runs[mode][c.test]) {
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
		var paired []float64
		for i := 0; i < n; i++ {
			if ratio {
				paired = append(paired, get(b[i])/get(a[i]))
			} else {
				paired = append(paired, get(b[i])-get(a[i]))
			}
		}
		sort.Float64s(paired)
		if ratio {
			fmt.Fprintf(w, "  %-22s %*.1f %*.1f %11.3fx %8.3fx [%.3f..%.3f]\n", name, wa, ma, wb, mb, mb/ma, median(paired), paired[0], paired[len(paired)-1])
		} else if strings.Contains(name, " us/") {
			// A CPU difference in microseconds per request.
			fmt.Fprintf(w, "  %-22s %*.1f %*.1f %+9.1f us %+8.1f us [%+.1f..%+.1f]\n", name, wa, ma, wb, mb, mb-ma, median(paired), paired[0], paired[len(paired)-1])
		} else {
			fmt.Fprintf(w, "  %-22s %*.3f %*.3f %+9.3f ms %+8.3f ms [%+.3f..%+.3f]\n", name, wa, ma, wb, mb, mb-ma, median(paired), paired[0], paired[len(paired)-1])
		}
	}
	row("requests/s", func(r result) float64 { return r.RPS }, true)
	if a[0].CPUPerReq > 0 && b[0].CPUPerReq > 0 {
		row("caddy cpu us/request", func(r result) float64 { return r.CPUPerReq }, true)
		row("one-core capacity r/s", func(r result) float64 { return 1e6 / r.CPUPerReq }, true)
		row("caddy core share %", func(r result) float64 { return 100 * r.CPUShare }, true)
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
	ok := true
	for _, t := range []struct {
		name string
		rs   []result
	}{{c.base, a}, {c.test, b}} {
		errs, reqs, first := 0, 0, ""
		for _, r := range t.rs {
			errs += r.Errors
			reqs += r.Requests
			if first == "" {
				first = r.FirstError
			}
		}
		fmt.Fprintf(w, "  %-22s %d requests, %d errors", t.name, reqs, errs)
		if first != "" {
			fmt.Fprintf(w, " (first: %s)", first)
			ok = false
		}
		fmt.Fprintln(w)
	}
	return ok
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
