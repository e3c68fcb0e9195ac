// Command report reads the JSON lines that bench/load -json printed
// (labelled "<mode> <target>", e.g. "stream llm_failover") and prints the
// comparison table of bench/run.sh: medians over the repetitions of each
// target, the llm_failover/reverse_proxy ratio of requests per second and
// the llm_failover-minus-reverse_proxy difference of latencies.
//
// Runs alternate A B A B, so besides the ratio of the medians it gives the
// median of the per-pair ratios and differences: each pair ran side by
// side in time, which cancels most of the drift of a shared machine.
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
)

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
		runs[mode][target] = append(runs[mode][target], r)
	}

	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	ok := true
	for _, mode := range modes {
		a, b := runs[mode][base], runs[mode][test]
		if len(a) == 0 || len(b) == 0 {
			continue
		}
		n := min(len(a), len(b))
		fmt.Fprintf(w, "\n%s (%d runs each, medians)\n", mode, n)
		fmt.Fprintf(w, "  %-22s %14s %14s %12s %22s\n", "metric", base, test, "llmf vs rp", "paired median [min..max]")
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
				fmt.Fprintf(w, "  %-22s %14.1f %14.1f %11.3fx %8.3fx [%.3f..%.3f]\n", name, ma, mb, mb/ma, median(paired), paired[0], paired[len(paired)-1])
			} else {
				fmt.Fprintf(w, "  %-22s %14.3f %14.3f %+9.3f ms %+8.3f ms [%+.3f..%+.3f]\n", name, ma, mb, mb-ma, median(paired), paired[0], paired[len(paired)-1])
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
		for _, t := range []string{base, test} {
			errs, reqs, first := 0, 0, ""
			for _, r := range runs[mode][t] {
				errs += r.Errors
				reqs += r.Requests
				if first == "" {
					first = r.FirstError
				}
			}
			fmt.Fprintf(w, "  %-22s %d requests, %d errors", t, reqs, errs)
			if first != "" {
				fmt.Fprintf(w, " (first: %s)", first)
				ok = false
			}
			fmt.Fprintln(w)
		}
	}
	if !ok {
		w.Flush()
		os.Exit(3)
	}
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
