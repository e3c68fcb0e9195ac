package main

import (
	"bufio"
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestFleetPart(t *testing.T) {
	for _, c := range []struct {
		target string
		of     string
		n, i   int
		ok     bool
	}{
		{"2xllm_failover+wallet_pg/1", "llm_failover+wallet_pg", 2, 1, true},
		{"4xllm_failover+wallet_pg/4", "llm_failover+wallet_pg", 4, 4, true},
		{"reverse_proxy", "", 0, 0, false}, // has an x, is no fleet
		{"llm_failover+wallet_pg", "", 0, 0, false},
		{"1xllm_failover/1", "", 0, 0, false}, // one instance is no fleet
		{"2xllm_failover/3", "", 0, 0, false},
		{"2xllm_failover/0", "", 0, 0, false},
		{"2x/1", "", 0, 0, false},
	} {
		of, n, i, ok := fleetPart(c.target)
		if of != c.of || n != c.n || i != c.i || ok != c.ok {
			t.Errorf("fleetPart(%q) = %q, %d, %d, %v; want %q, %d, %d, %v", c.target, of, n, i, ok, c.of, c.n, c.i, c.ok)
		}
	}
}

func FuzzFleetPart(f *testing.F) {
	for _, s := range []string{"2xllm_failover+wallet_pg/1", "reverse_proxy", "9xa/9", "2x/1", "x/", "-2xa/-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, target string) {
		of, n, i, ok := fleetPart(target)
		if !ok {
			return
		}
		if of == "" || n < 2 || i < 1 || i > n {
			t.Fatalf("fleetPart(%q) accepted %q, %d, %d", target, of, n, i)
		}
	})
}

// TestFleetTogether: rates, cores and one-core capacities add up, CPU per
// request is the fleet's CPU over its requests, the database's CPU (read
// by the first instance's load) is spread over every request.
func TestFleetTogether(t *testing.T) {
	a := result{Requests: 300, RPS: 100, CPUSeconds: 0.3, CPUPerReq: 1000, CPUShare: 0.1, DBSeconds: 0.6, capacity: 1000,
		Latency: pcts{P50: 2, P99: 9}}
	b := result{Requests: 100, RPS: 50, CPUSeconds: 0.2, CPUPerReq: 2000, CPUShare: 0.07, capacity: 500,
		Latency: pcts{P50: 6, P99: 20}, FirstError: "status 500", Errors: 1}
	var fs []*fleet
	fs = addFleetPart(fs, "t", 2, 2, b)
	fs = addFleetPart(fs, "t", 2, 1, a)
	if len(fs) != 1 {
		t.Fatalf("%d fleets, want 1", len(fs))
	}
	got := fs[0].together(0)
	near := func(name string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9 {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	near("RPS", got.RPS, 150)
	near("CPUPerReq", got.CPUPerReq, 1250) // 0.5 s over 400 requests
	near("capacity", got.capacity, 1500)
	near("CPUShare", got.CPUShare, 0.17)
	near("DBPerReq", got.DBPerReq, 1500) // 0.6 s over 400 requests
	near("latency p50", got.Latency.P50, 3)
	near("latency p99", got.Latency.P99, 20)
	if got.Requests != 400 || got.Errors != 1 || got.FirstError != "status 500" {
		t.Errorf("together %+v, want 400 requests and b's error", got)
	}

	var out strings.Builder
	w := bufio.NewWriter(&out)
	single := []result{{Requests: 200, RPS: 100, CPUPerReq: 1000, CPUShare: 0.1, DBPerReq: 1000, capacity: 1000}}
	if fleetTable(w, "json", fs[0], single) {
		t.Errorf("fleetTable reported no error although instance 2 had one")
	}
	w.Flush()
	for _, want := range []string{"json, t on 2 instances vs 1", "one-core capacity r/s", "1.500x", "postgres cpu us/req", "instance 2 of 2        100 requests, 1 errors"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the table has no %q:\n%s", want, out.String())
		}
	}
}

// -min-core-share drops whole repetitions, pooled over files: run j of
// every target (and fleet instance) goes when any of them was starved,
// so that what is left still pairs run j with run j.
func TestKeepWholeCores(t *testing.T) {
	line := func(label string, rps, share float64) string {
		return fmt.Sprintf(`{"label":%q,"requests":100,"rps":%v,"server_cpu_us_per_request":100,"server_cpu_core_share":%v}`, label, rps, share) + "\n"
	}
	first := line("json llm_failover", 1, 0.95) + line("json llm_failover+wallet", 1, 0.97) +
		line("json llm_failover", 2, 0.95) + line("json llm_failover+wallet", 2, 0.5) // starved: both go
	second := line("json llm_failover", 3, 0.4) + line("json llm_failover+wallet", 3, 0.99) + // starved: both go
		line("json llm_failover", 4, 0.91) + line("json llm_failover+wallet", 4, 0.92) +
		line("json 2xllm_failover/1", 5, 0.95) + line("json 2xllm_failover/2", 5, 0.95) +
		line("json 2xllm_failover/1", 6, 0.95) + line("json 2xllm_failover/2", 6, 0.2) + // starved: repetition 2 goes anyway
		line("json 2xllm_failover/1", 7, 0.95) + line("json 2xllm_failover/2", 7, 0.95) +
		line("json 2xllm_failover/1", 8, 0.95) + line("json 2xllm_failover/2", 8, 0.95)
	d := newDataset()
	if err := d.read(strings.NewReader(first), "first"); err != nil {
		t.Fatal(err)
	}
	if err := d.read(strings.NewReader(second), "second"); err != nil {
		t.Fatal(err)
	}
	kept := d.keepWholeCores(0.9)
	if kept["json"] != [2]int{2, 4} {
		t.Errorf("kept %v of json, want 2 of 4", kept["json"])
	}
	rps := func(rs []result) []float64 { return pick(rs, func(r result) float64 { return r.RPS }) }
	for _, target := range []string{"llm_failover", "llm_failover+wallet"} {
		if got := rps(d.runs["json"][target]); fmt.Sprint(got) != "[1 4]" {
			t.Errorf("%s kept runs of %v requests/s, want [1 4]", target, got)
		}
	}
	// The fleet runs of a repetition go with its single runs, and
	// starve it too.
	f := d.fleets["json"][0]
	for i, part := range f.parts {
		if got := rps(part); fmt.Sprint(got) != "[5 8]" {
			t.Errorf("fleet instance %d kept %v, want [5 8]", i+1, got)
		}
	}
	// Without the fleet's starved run the second repetition would still go
	// (the wallet's), so check that a fleet alone drops one too.
	d = newDataset()
	if err := d.read(strings.NewReader(line("json llm_failover", 1, 0.95)+line("json 2xllm_failover/1", 2, 0.95)+line("json 2xllm_failover/2", 2, 0.3)), "fleet"); err != nil {
		t.Fatal(err)
	}
	if kept := d.keepWholeCores(0.9); kept["json"] != [2]int{0, 1} || len(d.runs["json"]["llm_failover"]) != 0 {
		t.Errorf("a starved fleet instance kept its repetition: %v, %v", kept["json"], d.runs["json"]["llm_failover"])
	}
}
