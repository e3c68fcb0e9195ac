// Command load is a small HTTP load generator for the benchmarks in
// bench/: closed loop (-c workers each send one POST, read the whole
// answer, and send the next) or, with -rate, open loop (requests start at
// a constant rate, latency counted from when each was due: openloop.go),
// for -warmup (discarded) and then -d (measured). It reports requests per second, latency percentiles, the
// time to the first body byte (what a streaming client waits for before
// the first token) and errors: transport errors, non-200 answers, and SSE
// streams that do not end with "data: [DONE]".
//
//	go run ./bench/load -url http://127.0.0.1:18082/v1/chat/completions \
//	    -body '{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}' \
//	    -c 16 -d 5s -warmup 1s -json
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmfailover/caddy-llm-failover/bench/upstream/fake"
)

// Result is what one run measured; -json prints it.
type Result struct {
	URL         string `json:"url"`
	Label       string `json:"label,omitempty"`
	Concurrency int    `json:"concurrency"`
	// Rate is the open loop's arrival rate (requests per second); 0 in a
	// closed loop.
	Rate        float64 `json:"rate,omitempty"`
	Seconds     float64 `json:"seconds"`
	Requests    int     `json:"requests"`
	Errors      int     `json:"errors"`
	FirstError  string  `json:"first_error,omitempty"`
	RPS         float64 `json:"rps"`
	Stream      bool    `json:"stream"`
	BytesPerReq float64 `json:"bytes_per_request"`
	Latency     Pcts    `json:"latency_ms"`
	TTFB        Pcts    `json:"ttfb_ms"`
	// With -cpu-pid: the CPU time that process used during the measured
	// window, per request and as a share of one core. On a shared machine
	// this is steadier than requests/s, which depends on how much CPU the
	// neighbours leave; 1e6/ServerCPUPerReqUS is the request rate the
	// process could sustain on one core of its own.
	ServerCPUSeconds   float64 `json:"server_cpu_s,omitempty"`
	ServerCPUPerReqUS  float64 `json:"server_cpu_us_per_request,omitempty"`
	ServerCPUCoreShare float64 `json:"server_cpu_core_share,omitempty"`
	// With -db-pid: the same for a database server, counting the process
	// and its children (PostgreSQL's postmaster and its backends).
	DBCPUSeconds  float64 `json:"db_cpu_s,omitempty"`
	DBCPUPerReqUS float64 `json:"db_cpu_us_per_request,omitempty"`
	// With -vars: what the process allocated over the measured window,
	// in bytes and objects per request, and the collections it ran per
	// 1,000 requests. Allocation sets how often Go's collector runs, whose
	// marking is most of a proxy's tail at a fixed rate (bench/README.md),
	// and unlike CPU time it does not move with the neighbours.
	ServerAllocBytesPerReq float64 `json:"server_alloc_bytes_per_request,omitempty"`
	ServerAllocsPerReq     float64 `json:"server_allocs_per_request,omitempty"`
	ServerGCPer1kReq       float64 `json:"server_gc_per_1k_requests,omitempty"`
}

// Pcts are percentiles in milliseconds.
type Pcts struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p99_9"`
	Mean float64 `json:"mean"`
	Max  float64 `json:"max"`
}

type sample struct {
	lat, ttfb time.Duration
}

type worker struct {
	samples    []sample
	errors     int
	firstError string
	bytes      int64
	stream     bool
}

var doneMarker = []byte("data: [DONE]")

func main() {
	url := flag.String("url", "", "target URL (required)")
	bodyArg := flag.String("body", "", "request body: inline text, or @file / a path to an existing file")
	method := flag.String("method", http.MethodPost, "HTTP method")
	conc := flag.Int("c", 16, "concurrent workers (closed loop: one request in flight each)")
	dur := flag.Duration("d", 5*time.Second, "measured duration")
	warmup := flag.Duration("warmup", time.Second, "warm-up before measuring (results discarded)")
	timeout := flag.Duration("timeout", 30*time.Second, "per-request timeout")
	asJSON := flag.Bool("json", false, "print the result as one JSON object")
	label := flag.String("label", "", "label copied into the JSON result")
	cpuPID := flag.Int("cpu-pid", 0, "measure this process's CPU time (Linux /proc) over the measured window, e.g. the proxy's")
	dbPID := flag.Int("db-pid", 0, "measure the CPU time of this process and its children over the measured window, e.g. PostgreSQL's postmaster")
	varsURL := flag.String("vars", "", "read this Go process's expvar page (e.g. Caddy's admin http://127.0.0.1:2019/debug/vars) when the measured window opens and closes: its allocations and collections per request")
	rate := flag.Float64("rate", 0, "open loop: start this many requests per second, latency counted from when each was due (0: closed loop, -c workers)")
	maxInflight := flag.Int("max-inflight", 20000, "open loop: the most requests open at once; a request due beyond it is dropped (an error)")
	quantiles := flag.String("quantiles", "", "write the latency and ttfb quantile ladder of the measured requests to this file")
	holdN := flag.Int("hold", 0, "open this many requests at once, each on its own connection, and keep them open for -d (hold.go)")
	h2c := flag.Bool("h2c", false, "with -hold: send the requests as HTTP/2 streams without TLS (the server must allow h2c)")
	upstreamAddr := flag.String("upstream", "", "also serve the fake provider (bench/upstream/fake) on this address, in this process, for the run: the generator and the upstream then share one Go runtime instead of two processes taking turns on a CPU")
	upstreamChunks := flag.Int("upstream-chunks", 20, "with -upstream: content chunks per SSE stream")
	var headers headerFlags
	flag.Var(&headers, "H", "extra request header 'Name: value' (repeatable)")
	flag.Parse()
	if *url == "" || *conc < 1 || *dur <= 0 {
		flag.Usage()
		os.Exit(2)
	}
	if os.Getenv("GOGC") == "" {
		// The generator's own collections are noise in every target's
		// tail: at 1,500 requests/s on one CPU, GOGC=100 put the direct
		// run's p99 at 0.7 to 1.7 ms, 400 at 0.3 to 0.5 ms.
		debug.SetGCPercent(400)
	}
	if *upstreamAddr != "" {
		if err := serveUpstream(*upstreamAddr, *upstreamChunks); err != nil {
			fmt.Fprintln(os.Stderr, "load:", err)
			os.Exit(2)
		}
	}
	body, err := loadBody(*bodyArg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(2)
	}
	if *holdN > 0 {
		_ = json.NewEncoder(os.Stdout).Encode(hold(*url, body, *holdN, *dur, *h2c))
		return
	}

	pool := *conc
	if *rate > 0 {
		pool = *maxInflight // an open loop opens what it needs
	}
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        pool,
		MaxIdleConnsPerHost: pool,
		MaxConnsPerHost:     pool,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	client := &http.Client{Transport: tr, Timeout: *timeout}

	start := time.Now()
	measureFrom := start.Add(*warmup)
	end := measureFrom.Add(*dur)
	workers := make([]*worker, *conc)
	var wg sync.WaitGroup
	var cpuUsed, dbUsed <-chan [2]float64
	if *cpuPID > 0 {
		cpuUsed = atWindow("-cpu-pid", func() (float64, error) { return cpuSeconds(*cpuPID) }, measureFrom, end)
	}
	if *dbPID > 0 {
		dbUsed = atWindow("-db-pid", func() (float64, error) { return cpuTreeSeconds(*dbPID) }, measureFrom, end)
	}
	var memUsed <-chan [2]memStats
	if *varsURL != "" {
		memUsed = atWindow("-vars", func() (memStats, error) { return readMemStats(*varsURL) }, measureFrom, end)
	}
	if *rate > 0 {
		workers = []*worker{openLoop(client, *method, *url, body, headers, *rate, *maxInflight, start, measureFrom, end)}
	} else {
		for i := range workers {
			w := &worker{samples: make([]sample, 0, 4096)}
			workers[i] = w
			wg.Add(1)
			go func() {
				defer wg.Done()
				w.run(client, *method, *url, body, headers, measureFrom, end)
			}()
		}
		wg.Wait()
	}
	tr.CloseIdleConnections()

	res := summarize(workers, *dur)
	res.URL, res.Label, res.Concurrency, res.Rate = *url, *label, *conc, *rate
	if *quantiles != "" {
		var all []sample
		for _, w := range workers {
			all = append(all, w.samples...)
		}
		if err := writeQuantiles(*quantiles, all); err != nil {
			fmt.Fprintln(os.Stderr, "load:", err)
		}
	}
	if cpuUsed != nil {
		if cpu := grew(cpuUsed); cpu > 0 {
			res.ServerCPUSeconds = round3(cpu)
			res.ServerCPUCoreShare = round3(cpu / dur.Seconds())
			if res.Requests > 0 {
				res.ServerCPUPerReqUS = round3(cpu / float64(res.Requests) * 1e6)
			}
		}
	}
	if dbUsed != nil {
		if cpu := grew(dbUsed); cpu > 0 {
			res.DBCPUSeconds = round3(cpu)
			if res.Requests > 0 {
				res.DBCPUPerReqUS = round3(cpu / float64(res.Requests) * 1e6)
			}
		}
	}
	if memUsed != nil {
		if m, ok := <-memUsed; ok {
			b, o, gc := perRequest(m[0], m[1], res.Requests)
			res.ServerAllocBytesPerReq, res.ServerAllocsPerReq, res.ServerGCPer1kReq = math.Round(b), round3(o), round3(gc)
		}
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		_ = enc.Encode(res)
		// A one-line summary for whoever watches the run.
		cpu := ""
		if res.ServerCPUPerReqUS > 0 {
			cpu = fmt.Sprintf(", server cpu %.1f us/req (%.0f%% of a core)", res.ServerCPUPerReqUS, res.ServerCPUCoreShare*100)
		}
		if res.DBCPUPerReqUS > 0 {
			cpu += fmt.Sprintf(", db cpu %.1f us/req", res.DBCPUPerReqUS)
		}
		if res.ServerAllocBytesPerReq > 0 {
			cpu += fmt.Sprintf(", server alloc %.0f B/req (%.1f objects, %.2f GCs per 1k)", res.ServerAllocBytesPerReq, res.ServerAllocsPerReq, res.ServerGCPer1kReq)
		}
		fmt.Fprintf(os.Stderr, "%.0f req/s, p50 %.3f ms, ttfb p50 %.3f ms%s, %d errors\n", res.RPS, res.Latency.P50, res.TTFB.P50, cpu, res.Errors)
	} else {
		printText(res)
	}
	if res.Requests == 0 {
		os.Exit(1)
	}
}

// serveUpstream serves the fake provider on addr in the background.
func serveUpstream(addr string, chunks int) error {
	u, err := fake.New(fake.Config{Chunks: chunks})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("the upstream's listener: %w", err)
	}
	go func() { _ = u.Serve(ln) }()
	return nil
}

// run is one closed-loop worker. A request counts when it starts after
// measureFrom and finishes by end; requests that straddle either edge are
// dropped, so warm-up and drain do not skew the figures.
func (w *worker) run(client *http.Client, method, url string, body []byte, headers headerFlags, measureFrom, end time.Time) {
	buf := make([]byte, 32<<10)
	tail := make([]byte, 0, 64)
	for {
		began := time.Now()
		if !began.Before(end) {
			return
		}
		ctx, cancel := context.WithDeadline(context.Background(), end.Add(5*time.Second))
		req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
		if err != nil {
			cancel()
			w.fail(err.Error())
			return
		}
		req.Header.Set("Content-Type", "application/json")
		for _, h := range headers {
			k, v, _ := strings.Cut(h, ":")
			req.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
		}
		s, n, isStream, errMsg := do(client, req, buf, &tail)
		cancel()
		finished := time.Now()
		if began.Before(measureFrom) || finished.After(end) {
			continue
		}
		if errMsg != "" {
			w.fail(errMsg)
			continue
		}
		s.lat = finished.Sub(began)
		w.samples = append(w.samples, s)
		w.bytes += n
		w.stream = w.stream || isStream
	}
}

func (w *worker) fail(msg string) {
	w.errors++
	if w.firstError == "" {
		w.firstError = msg
	}
}

// do sends one request and reads the whole answer. ttfb is the time to
// the first byte of the body, not of the headers: a stream gate may hold
// headers and body alike, and a client sees a token only with the body.
func do(client *http.Client, req *http.Request, buf []byte, tail *[]byte) (s sample, n int64, stream bool, errMsg string) {
	began := time.Now()
	res, err := client.Do(req)
	if err != nil {
		return s, 0, false, "transport: " + err.Error()
	}
	defer res.Body.Close()
	stream = strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream")
	*tail = (*tail)[:0]
	for {
		m, rerr := res.Body.Read(buf)
		if m > 0 {
			if n == 0 {
				s.ttfb = time.Since(began)
			}
			n += int64(m)
			if stream {
				*tail = appendTail(*tail, buf[:m], 32)
			}
		}
		if rerr != nil {
			if !errors.Is(rerr, io.EOF) {
				return s, n, stream, "reading body: " + rerr.Error()
			}
			break
		}
	}
	if res.StatusCode != http.StatusOK {
		return s, n, stream, fmt.Sprintf("status %d", res.StatusCode)
	}
	if n == 0 {
		return s, n, stream, "empty body"
	}
	if stream && !bytes.Contains(*tail, doneMarker) {
		return s, n, stream, "stream did not end with data: [DONE]"
	}
	return s, n, stream, ""
}

// appendTail keeps the last max bytes seen.
func appendTail(tail, p []byte, max int) []byte {
	if len(p) >= max {
		return append(tail[:0], p[len(p)-max:]...)
	}
	tail = append(tail, p...)
	if len(tail) > max {
		tail = append(tail[:0], tail[len(tail)-max:]...)
	}
	return tail
}

func summarize(workers []*worker, dur time.Duration) Result {
	var all []sample
	var res Result
	var bytesTotal int64
	for _, w := range workers {
		all = append(all, w.samples...)
		res.Errors += w.errors
		if res.FirstError == "" {
			res.FirstError = w.firstError
		}
		bytesTotal += w.bytes
		res.Stream = res.Stream || w.stream
	}
	res.Requests = len(all)
	res.Seconds = dur.Seconds()
	res.RPS = float64(res.Requests) / dur.Seconds()
	if res.Requests > 0 {
		res.BytesPerReq = float64(bytesTotal) / float64(res.Requests)
	}
	lat := make([]time.Duration, len(all))
	ttfb := make([]time.Duration, len(all))
	for i, s := range all {
		lat[i], ttfb[i] = s.lat, s.ttfb
	}
	res.Latency = pcts(lat)
	res.TTFB = pcts(ttfb)
	return res
}

func pcts(d []time.Duration) Pcts {
	if len(d) == 0 {
		return Pcts{}
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	var sum time.Duration
	for _, v := range d {
		sum += v
	}
	at := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(d)))) - 1
		if i < 0 {
			i = 0
		}
		return ms(d[i])
	}
	return Pcts{P50: at(0.50), P90: at(0.90), P99: at(0.99), P999: at(0.999), Mean: ms(sum / time.Duration(len(d))), Max: ms(d[len(d)-1])}
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }

func printText(r Result) {
	fmt.Printf("%s  c=%d  %.1fs\n", r.URL, r.Concurrency, r.Seconds)
	fmt.Printf("  requests   %d (%.0f/s), errors %d", r.Requests, r.RPS, r.Errors)
	if r.FirstError != "" {
		fmt.Printf(" (first: %s)", r.FirstError)
	}
	fmt.Println()
	fmt.Printf("  latency ms p50 %.3f  p90 %.3f  p99 %.3f  mean %.3f  max %.3f\n", r.Latency.P50, r.Latency.P90, r.Latency.P99, r.Latency.Mean, r.Latency.Max)
	fmt.Printf("  ttfb ms    p50 %.3f  p90 %.3f  p99 %.3f\n", r.TTFB.P50, r.TTFB.P90, r.TTFB.P99)
	fmt.Printf("  stream %v, %.0f bytes/request\n", r.Stream, r.BytesPerReq)
	if r.ServerCPUSeconds > 0 {
		fmt.Printf("  server cpu %.3fs (%.0f%% of a core), %.1f us/request\n", r.ServerCPUSeconds, r.ServerCPUCoreShare*100, r.ServerCPUPerReqUS)
	}
	if r.DBCPUSeconds > 0 {
		fmt.Printf("  db cpu %.3fs, %.1f us/request\n", r.DBCPUSeconds, r.DBCPUPerReqUS)
	}
	if r.ServerAllocBytesPerReq > 0 {
		fmt.Printf("  server allocated %.0f bytes, %.1f objects a request; %.2f collections per 1,000 requests\n",
			r.ServerAllocBytesPerReq, r.ServerAllocsPerReq, r.ServerGCPer1kReq)
	}
}

func round3(v float64) float64 { return math.Round(v*1e3) / 1e3 }

// grew is how much a counter read at the window's ends grew (0 when it
// could not be read).
func grew(w <-chan [2]float64) float64 {
	v, ok := <-w
	if !ok {
		return 0
	}
	return v[1] - v[0]
}

// atWindow calls read when the measured window opens and when it closes
// and sends the two readings; after an error, which it prints, it closes
// the channel instead.
func atWindow[T any](flagName string, read func() (T, error), from, to time.Time) <-chan [2]T {
	out := make(chan [2]T, 1)
	go func() {
		time.Sleep(time.Until(from))
		before, err1 := read()
		time.Sleep(time.Until(to))
		after, err2 := read()
		if err := errors.Join(err1, err2); err != nil {
			fmt.Fprintf(os.Stderr, "load: %s: %v\n", flagName, err)
			close(out)
			return
		}
		out <- [2]T{before, after}
	}()
	return out
}

// procStat holds the fields of /proc/PID/stat this tool reads, in clock
// ticks of 1/100 s (USER_HZ on Linux).
type procStat struct {
	ppid                         int
	utime, stime, cutime, cstime int64
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	// Fields after the command name, which may hold spaces: "pid (comm) state ...".
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	var st procStat
	var errs [5]error
	st.ppid, errs[0] = strconv.Atoi(f[1])
	st.utime, errs[1] = strconv.ParseInt(f[11], 10, 64)
	st.stime, errs[2] = strconv.ParseInt(f[12], 10, 64)
	st.cutime, errs[3] = strconv.ParseInt(f[13], 10, 64)
	st.cstime, errs[4] = strconv.ParseInt(f[14], 10, 64)
	if err := errors.Join(errs[:]...); err != nil {
		return procStat{}, fmt.Errorf("unexpected /proc/%d/stat: %w", pid, err)
	}
	return st, nil
}

// cpuSeconds reads the user+system CPU time of a process, all threads.
func cpuSeconds(pid int) (float64, error) {
	st, err := readStat(pid)
	if err != nil {
		return 0, err
	}
	return float64(st.utime+st.stime) / 100, nil
}

// cpuTreeSeconds is the CPU time of a process and its children: its own,
// that of the children it has reaped (cutime, cstime: a PostgreSQL backend
// that exits during the window still counts) and that of the live ones.
// Grandchildren count only once reaped by a child, which PostgreSQL's
// backends do not have.
func cpuTreeSeconds(pid int) (float64, error) {
	st, err := readStat(pid)
	if err != nil {
		return 0, err
	}
	ticks := st.utime + st.stime + st.cutime + st.cstime
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, d := range dirs {
		child, err := strconv.Atoi(d.Name())
		if err != nil || child == pid {
			continue
		}
		// A process may exit between the listing and the read: skip it.
		if cs, err := readStat(child); err == nil && cs.ppid == pid {
			ticks += cs.utime + cs.stime
		}
	}
	return float64(ticks) / 100, nil
}

func loadBody(arg string) ([]byte, error) {
	if strings.HasPrefix(arg, "@") {
		return os.ReadFile(arg[1:])
	}
	if arg != "" && !strings.HasPrefix(strings.TrimSpace(arg), "{") {
		if st, err := os.Stat(arg); err == nil && st.Mode().IsRegular() {
			return os.ReadFile(arg)
		}
	}
	return []byte(arg), nil
}

type headerFlags []string

func (h *headerFlags) String() string     { return strings.Join(*h, ", ") }
func (h *headerFlags) Set(v string) error { *h = append(*h, v); return nil }
