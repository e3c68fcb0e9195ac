//go:build linux

package soak

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/llmfailover/caddy-llm-failover/wallet"
)

// What the end of the run holds the gateway to. Each bound says why it is
// what it is.
const (
	// storeGrace: a billed request may be refused with 503 (billing
	// unavailable, on_store_error deny) while PostgreSQL is disturbed and
	// this long after: pgx finds a broken pooled connection only when it
	// uses it, and an admission waits admission_timeout (3s) before it
	// gives up. Outside these windows a 503 of the store is a defect.
	storeGrace = 10 * time.Second
	// crashWindow: an answer the killed instance completed this long
	// before the kill may be uncharged (its settlement was not written
	// yet: settlements are batched every 20 ms, and the race detector
	// slows everything). Earlier answers must be charged.
	crashWindow = 2 * time.Second
	// unreservedAfter: once traffic stops, spare lease money goes back
	// after about a second idle, and a dead instance's after lease_ttl
	// plus a sweep (every reservation_ttl/3); this is the most the end of
	// the run waits for nothing to be reserved, with slack for a loaded
	// machine.
	unreservedAfter = leaseTTL + reservationTTL + 5*time.Second
)

// Resource bounds: "flat" means each process's end sample is within
// these of its first, all taken with no request in flight, idle
// connections closed and on the same config (see resources.take).
//
//   - Goroutines other than pooled connections' (see countGoroutines):
//     what remains varies only with the roles an instance holds (the
//     probe leader and its prober), by 5 or so, once no probe round is
//     under way (goroutinesBetweenProbes); +12
//     fails a leak of one goroutine per 150 requests in the short run
//     (2,000 requests), one per 6,000 in the 30-minute one.
//   - Open descriptors count pooled sockets too (upstreams, PostgreSQL:
//     up to about 25 between samples); +30.
//   - RSS: the race build's shadow memory grows with everything the heap
//     ever held, and a Go heap settles over minutes; ×1.5 + 64 MiB fails
//     growth that does not settle (the long run's figures show where it
//     settles).
const (
	maxGoroutineGrowth = 12
	maxFDGrowth        = 30
	// RSS: growth beyond start × maxRSSRatio + maxRSSSlack fails.
	maxRSSRatio = 1.5
	maxRSSSlack = 64 << 20
)

// setupAccounts creates the wallet accounts on instance a: three funded
// accounts (clients spread over them, so both instances lease from each),
// one with no money (every request must be refused with 402), the
// account probes are charged to, and an unknown key.
func setupAccounts(g *gateway) (map[string][]wallKey, error) {
	keys := map[string][]wallKey{}
	create := func(id, credit string) (wallKey, error) {
		if err := g.admin(http.MethodPost, "/llm_wallet/accounts", strings.NewReader(`{"id":"`+id+`"}`), http.StatusCreated, nil); err != nil {
			return wallKey{}, err
		}
		if credit != "" {
			if err := g.admin(http.MethodPost, "/llm_wallet/accounts/"+id+"/credit", strings.NewReader(`{"amount":"`+credit+`","note":"soak"}`), http.StatusOK, nil); err != nil {
				return wallKey{}, err
			}
		}
		var k struct {
			Key string `json:"key"`
		}
		err := g.admin(http.MethodPost, "/llm_wallet/accounts/"+id+"/keys", strings.NewReader(`{"label":"soak"}`), http.StatusCreated, &k)
		return wallKey{account: id, secret: k.Key}, err
	}
	for i := 1; i <= 3; i++ {
		k, err := create(fmt.Sprintf("soak-%d", i), "1000")
		if err != nil {
			return nil, err
		}
		keys["funded"] = append(keys["funded"], k)
	}
	k, err := create("soak-poor", "")
	if err != nil {
		return nil, err
	}
	keys["poor"] = []wallKey{k}
	if _, err := create("soak-probes", "100"); err != nil {
		return nil, err
	}
	var rnd [24]byte
	_, _ = rand.Read(rnd[:])
	keys["badkey"] = []wallKey{{secret: "sk-llmf-" + hex.EncodeToString(rnd[:])}}
	return keys, nil
}

// sample is one instance's resources at one point.
type sample struct {
	label      string
	inst       int
	pid        int
	at         time.Duration
	rss        int64 // bytes
	fds        int
	goroutines int
	// ownGoroutines leaves out the goroutines of pooled connections
	// (net/http's client and server connection loops, database pools),
	// whose number is the pools' size, not a leak.
	ownGoroutines int
	// probing: a probe round was still under way when the goroutines
	// were counted (see probeRoundWait).
	probing   bool
	heapInuse uint64
	err       error
}

type resources struct {
	mu      sync.Mutex
	samples []sample
}

// take samples every running instance with no request in flight: it
// holds the clients back, reloads any instance on variant B onto A, closes their idle connections, waits 2.5s (for
// settlements, idle leases going back, idle upstream connections closing),
// and reads RSS and open descriptors from /proc, goroutines
// from the admin endpoint's /debug/pprof, the heap from /debug/vars.
func (rs *resources) take(l *load, gws []*gateway, u *upstreams, label string, tl *timeline) {
	resume, quiet := l.quiesce(30 * time.Second)
	defer resume()
	if !quiet {
		tl.note("resource sample %q: requests still in flight after 30s; sampling anyway", label)
		for _, g := range gws {
			g.dumpGoroutines("sample-" + label)
		}
	}
	// Every sample is taken on config variant A (probes, history and the
	// probe leader add their goroutines and connections), so that the
	// samples compare like with like.
	for i, g := range gws {
		g.life.Lock()
		g.mu.Lock()
		v := g.variant
		g.mu.Unlock()
		if g.running() && v != variantA {
			t0 := time.Now()
			err := g.reload(gatewayConfig(g.ports, variantA, u), variantA)
			tl.mu.Lock()
			tl.reloads = append(tl.reloads, reloadEvent{inst: i, variant: variantA, at: t0, took: time.Since(t0), err: err})
			tl.mu.Unlock()
		}
		g.life.Unlock()
	}
	// The clients' idle connections go, and the gateways' to the
	// upstreams time out (keepalive 1s), so what is counted is the
	// gateway's own.
	l.closeIdle()
	time.Sleep(2500 * time.Millisecond)
	for i, g := range gws {
		if !g.running() {
			continue
		}
		s := sampleOne(g, label)
		s.label, s.inst, s.at = label, i, time.Since(tl.start)
		rs.mu.Lock()
		rs.samples = append(rs.samples, s)
		rs.mu.Unlock()
	}
	tl.note("resource sample %q", label)
}

func sampleOne(g *gateway, label string) sample {
	s := sample{pid: g.pid()}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.pid))
	if err != nil {
		s.err = err
		return s
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			s.rss = kb << 10
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", s.pid))
	if err != nil {
		s.err = err
		return s
	}
	s.fds = len(fds)
	prof, probing, err := g.goroutinesBetweenProbes()
	if err != nil {
		s.err = err
		return s
	}
	s.probing = probing
	s.goroutines, s.ownGoroutines = countGoroutines(prof)
	_ = os.WriteFile(filepath.Join(g.dir, fmt.Sprintf("goroutines-sample-%s-pid%d.txt", label, s.pid)), prof, 0o644)
	var vars struct {
		Memstats struct {
			HeapInuse uint64 `json:"HeapInuse"`
		} `json:"memstats"`
	}
	if res, err := adminClient.Get(g.adminURL() + "/debug/vars"); err == nil {
		_ = json.NewDecoder(res.Body).Decode(&vars)
		res.Body.Close()
		s.heapInuse = vars.Memstats.HeapInuse
	}
	return s
}

// probeRoundWait bounds how long a sample waits for a moment between
// probe rounds. Variant A probes every billed model each second, and a
// round against a stalled upstream holds a goroutine or three per probe
// until the probe's timeout: counted, it reads as a leak of a dozen
// (a short run's end sample once had +13 of them). Rounds that end on
// time leave such moments every second; none within the wait is
// reported beside the sample.
const probeRoundWait = 15 * time.Second

// goroutinesBetweenProbes is the goroutine profile taken when no probe
// round is under way, or after probeRoundWait with probing true.
func (g *gateway) goroutinesBetweenProbes() (prof []byte, probing bool, err error) {
	deadline := time.Now().Add(probeRoundWait)
	for {
		prof, err = g.goroutineProfile()
		probing = err == nil && bytes.Contains(prof, []byte("probe.(*Scheduler).Round"))
		if !probing || time.Now().After(deadline) {
			return prof, probing, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// poolStacks are the frames of the goroutines a pooled connection runs.
var poolStacks = []string{
	"net/http.(*persistConn).readLoop", "net/http.(*persistConn).writeLoop", "net/http.(*conn).serve",
	"pgxpool.(*Pool).backgroundHealthCheck", "database/sql.(*DB).connectionOpener",
}

// countGoroutines reads a goroutine profile grouped by stack (debug=1):
// the total, and the goroutines that are not a pooled connection's. The
// profile's first line ("goroutine profile: total N") heads the first
// group with no blank line between: it is cut off, or the largest group
// (the profile lists them largest first), where a leak would show, is
// never counted.
func countGoroutines(prof []byte) (total, own int) {
	body := string(prof)
	if head, rest, ok := strings.Cut(body, "\n"); ok && strings.HasPrefix(head, "goroutine profile:") {
		body = rest
	}
	for _, group := range strings.Split(body, "\n\n") {
		group = strings.TrimSpace(group)
		n, err := strconv.Atoi(strings.Fields(group + " x")[0])
		if err != nil || !strings.Contains(group, " @ ") {
			continue
		}
		total += n
		pooled := false
		for _, f := range poolStacks {
			pooled = pooled || strings.Contains(group, f)
		}
		if !pooled {
			own += n
		}
	}
	return total, own
}

// checker runs the end-of-run checks and writes the report.
type checker struct {
	t    *testing.T
	gws  []*gateway
	u    *upstreams
	tl   *timeline
	l    *load
	rs   *resources
	keys map[string][]wallKey
	out  string

	defects []string
	report  bytes.Buffer
}

func (c *checker) defect(format string, args ...any) {
	c.defects = append(c.defects, fmt.Sprintf(format, args...))
}

func (c *checker) printf(format string, args ...any) { fmt.Fprintf(&c.report, format, args...) }

func (c *checker) run() {
	c.printf("soak of %v: instances a and b (%s), one PostgreSQL; %d requests\n\n", c.tl.stop.Sub(c.tl.start).Round(time.Second), filepath.Base(c.gws[0].bin), len(c.l.records))
	unreserved := c.checkUnreserved()
	c.rs.take(c.l, c.gws, c.u, "end", c.tl)
	rows := c.ledger()
	c.checkReady()
	c.checkAudit()
	for _, p := range c.u.problems() {
		c.defect("a provider fake refused a request (the gateway spoke its wire format wrong): %s", p)
	}
	exits := c.stopAll()

	c.printTimeline()
	c.judge()
	c.printOutcomes()
	c.checkLedger(rows)
	c.printf("\nreserved after the traffic stopped: %s\n", unreserved)
	c.printf("process exits: %s\n", strings.Join(exits, "; "))
	c.checkResources()
	c.checkLogs()
	c.printFaults()

	if len(c.defects) == 0 {
		c.printf("\nno defects\n")
	} else {
		c.printf("\n%d defects:\n", len(c.defects))
		for _, d := range c.defects {
			c.printf("  - %s\n", d)
		}
	}
	_ = os.WriteFile(filepath.Join(c.out, "report.txt"), c.report.Bytes(), 0o644)
	c.t.Logf("\n%s", c.report.String())
	if len(c.defects) > 0 {
		n := min(len(c.defects), 40)
		c.t.Errorf("the soak found %d defects; the first %d:\n  %s", len(c.defects), n, strings.Join(c.defects[:n], "\n  "))
	}
}

type accountView struct {
	ID       string `json:"id"`
	Balance  string `json:"balance"`
	Reserved string `json:"reserved"`
}

// checkUnreserved waits until no account has money reserved; longer than
// unreservedAfter is a defect.
func (c *checker) checkUnreserved() string {
	var accts []accountView
	var err error
	for {
		err = c.gws[0].admin(http.MethodGet, "/llm_wallet/accounts", nil, http.StatusOK, &accts)
		held := []string{}
		for _, a := range accts {
			if a.Reserved != "0" {
				held = append(held, a.ID+" "+a.Reserved)
			}
		}
		if err == nil && len(held) == 0 {
			return fmt.Sprintf("none %.1fs after (lease_ttl %v, bound %v)", time.Since(c.tl.stop).Seconds(), leaseTTL, unreservedAfter)
		}
		if time.Since(c.tl.stop) > unreservedAfter {
			c.defect("%v after the traffic stopped money is still reserved (lease_ttl %v): %v %v", unreservedAfter, leaseTTL, held, err)
			return fmt.Sprintf("STILL HELD after %v: %v %v", unreservedAfter, held, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

type ledgerRow struct {
	ID        int64     `json:"id"`
	Kind      string    `json:"kind"`
	Channel   string    `json:"channel"`
	RequestID string    `json:"request_id"`
	Cost      string    `json:"cost"`
	Note      string    `json:"note"`
	Time      time.Time `json:"time"`
	account   string
}

// ledger reads every row of the clients' accounts through the admin API.
func (c *checker) ledger() []ledgerRow {
	var all []ledgerRow
	for _, kind := range []string{"funded", "poor"} {
		for _, k := range c.keys[kind] {
			before := int64(0)
			for {
				var page struct {
					Entries []ledgerRow `json:"entries"`
					Next    int64       `json:"next_before"`
				}
				path := "/llm_wallet/accounts/" + url.PathEscape(k.account) + "/usage?limit=1000"
				if before > 0 {
					path += "&before=" + strconv.FormatInt(before, 10)
				}
				if err := c.gws[0].admin(http.MethodGet, path, nil, http.StatusOK, &page); err != nil {
					c.defect("reading the ledger: %v", err)
					return all
				}
				for _, e := range page.Entries {
					e.account = k.account
					all = append(all, e)
				}
				if page.Next == 0 {
					break
				}
				before = page.Next
			}
		}
	}
	return all
}

// checkReady: once the faults are over, both instances say they are
// ready (no background job overdue, the wallet's store answering).
func (c *checker) checkReady() {
	for _, g := range c.gws {
		var last string
		ok := false
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
			res, err := adminClient.Get(g.gatewayURL() + "/status/ready")
			if err != nil {
				last = err.Error()
				continue
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			last = fmt.Sprintf("%d %s", res.StatusCode, strings.TrimSpace(string(b)))
			if res.StatusCode == http.StatusOK {
				ok = true
				break
			}
		}
		c.printf("%s /status/ready: %s\n", g.name, last)
		if !ok {
			c.defect("%s is not ready 15s after the faults stopped: %s", g.name, last)
		}
	}
}

// checkAudit runs `caddy llm-wallet audit` against both instances, as an
// operator would after an incident.
func (c *checker) checkAudit() {
	for _, g := range c.gws {
		out, err := g.cli("llm-wallet", "--address", g.adminAddr(), "audit")
		c.printf("%s: caddy llm-wallet audit: %s\n", g.name, strings.TrimSpace(firstLine(out)))
		if err != nil || !strings.HasPrefix(out, "clean:") {
			c.defect("%s: caddy llm-wallet audit: %v\n%s", g.name, err, out)
		}
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// stopAll stops both instances with SIGTERM; each incarnation must have
// exited 0 (a race build exits 66 after a data race), except the one
// killed with -9.
func (c *checker) stopAll() []string {
	var out []string
	for i, g := range c.gws {
		g.stop()
		g.mu.Lock()
		exits := append([]string(nil), g.exits...)
		g.mu.Unlock()
		for n, e := range exits {
			kills := 0
			for _, k := range c.tl.kills {
				if k.inst == i {
					kills++
				}
			}
			killed := n < kills // incarnations end in order, each kill followed by a start
			if killed && e != "signal killed" || !killed && e != "exit 0" {
				c.defect("%s, incarnation %d: %s", g.name, n+1, e)
			}
		}
		out = append(out, g.name+": "+strings.Join(exits, ", "))
	}
	return out
}

// inPG: PostgreSQL was disturbed (or had been within storeGrace) while
// r was under way.
func (c *checker) inPG(r *record) bool {
	for _, w := range c.tl.pgWindows {
		if overlaps(r.Sent, r.Done, w[0], w[1].Add(storeGrace)) {
			return true
		}
	}
	return false
}

// reloading: a reload of r's instance was under way when r was sent, or
// r went out on a pooled connection the old server may still hold. Go's
// server, once shutting down, closes a connection whose first request it
// then reads, unanswered, and leaves one that has carried none open for up
// to 5s; Go's client pools a connection it dialed for a request that took
// another (and counts it as reused). A request sent on such a connection
// up to the grace period after the reload fails with EOF.
func (c *checker) reloading(r *record) bool {
	c.tl.mu.Lock()
	defer c.tl.mu.Unlock()
	for _, e := range c.tl.reloads {
		window := 500 * time.Millisecond
		if r.Reused {
			window = reloadGrace
		}
		if e.inst == r.Inst && overlaps(r.Sent, r.Done, e.at, e.at.Add(e.took+window)) {
			return true
		}
	}
	return false
}

// connBefore describes the request that last used r's kept-alive
// connection before r (by its local address), for a connection that
// failed: what it carried, and how long it was idle, says whether the
// gateway closed it at a reload or held it after an answer.
func (c *checker) connBefore(r *record) string {
	if !r.Reused || r.Conn == "" {
		return ""
	}
	var prev *record
	for _, q := range c.l.records {
		if q != r && q.Inst == r.Inst && q.Conn == r.Conn && q.Sent.Before(r.Sent) && (prev == nil || q.Sent.After(prev.Sent)) {
			prev = q
		}
	}
	if prev == nil {
		return fmt.Sprintf("; connection %s: no earlier request on it", r.Conn)
	}
	return fmt.Sprintf("; connection %s last carried request %d (%s %s stream=%v, %s, %d), which ended %.3fs before this one was sent",
		r.Conn, prev.Seq, prev.API, prev.Model, prev.Stream, prev.Class, prev.Status, r.Sent.Sub(prev.Done).Seconds())
}

func overlaps(a0, a1, b0, b1 time.Time) bool { return !a0.After(b1) && !a1.Before(b0) }

// judge decides, request by request, whether its outcome is one the
// gateway may give at that moment; what it may not give is a defect.
func (c *checker) judge() {
	tl := c.tl
	seen := map[string]int{}
	for _, r := range c.l.records {
		inKill := tl.killed(r)
		inPG := c.inPG(r)
		if r.ReqID != "" {
			seen[r.ReqID]++
			if seen[r.ReqID] == 2 {
				r.Defect = "two answers carry the same X-Request-Id"
			}
		}
		switch r.Class {
		case classOK:
			if r.Acct == "poor" || r.Acct == "badkey" {
				r.Defect = "served a key that must be refused (" + r.Acct + ")"
			}
		case classErrorEvent:
			r.Why = "the upstream broke after the answer was committed"
		case classClientAbort:
			r.Why = "the client hung up on purpose"
		case classGatewayError:
			r.Why = "no channel could answer (faults, open or parked breakers)"
		case classStore503:
			switch {
			case !r.billed():
				r.Defect = "an unbilled route refused for the wallet's store"
			case inPG:
				r.Why = "PostgreSQL was disturbed"
			default:
				r.Defect = "billing unavailable outside the database faults"
			}
		case class401:
			if r.Acct != "badkey" {
				r.Defect = "a valid key refused with 401"
			}
		case class402:
			if r.Acct != "poor" {
				r.Defect = "a funded account refused with 402"
			}
		case classHung:
			r.Defect = fmt.Sprintf("no answer, or no end of it, within %v: the request hung in the gateway", clientTimeout)
		case classConnError, classTransportCut:
			switch {
			case inKill:
				r.Why = "the instance was killed with -9"
			case r.Class == classConnError && c.reloading(r) && r.Done.Sub(r.Sent) < time.Second &&
				(strings.Contains(r.Detail, "EOF") || strings.Contains(r.Detail, "connection reset") || strings.Contains(r.Detail, "server closed idle connection")):
				// `caddy reload` shuts the old server down: it closes its
				// idle keep-alive connections, a connection it had just
				// accepted, and one that carried no request yet when its
				// first request comes (see reloading), so a request sent on
				// one fails before a byte of answer (HTTP/1.1's keep-alive
				// race; Go retries it only for idempotent requests, the
				// SDKs retry it). Caddy's, not the handler's; counted apart.
				r.Why = "its connection was closed by a reload's server hand-over"
			default:
				r.Defect = "the connection failed with no instance killed"
			}
		default:
			r.Defect = "the client got an answer that is neither complete nor ended with an error event in its dialect"
		}
		if r.Defect != "" {
			c.defect("request %d (%s %s %s stream=%v, %s, instance %s, %.2fs..%.2fs, id %s): %s: %s: %s%s",
				r.Seq, r.API, r.Model, r.Acct, r.Stream, r.ServedBy, c.gws[r.Inst].name,
				r.Sent.Sub(tl.start).Seconds(), r.Done.Sub(tl.start).Seconds(), r.ReqID, r.Class, r.Defect, r.Detail,
				c.connBefore(r))
		}
	}
}

// checkLedger compares the ledger with the client log, request by
// request: a billed answer (status 200, whatever happened to it after)
// is settled exactly once, with a charge (a resumed one in two rows, its
// two channels'); a refused or failed request is never charged; every
// settlement belongs to a request a client sent. The only exception is
// the kill: the killed instance's answers in flight, or completed within
// crashWindow before it, may be unsettled (their money stays in its lease
// and is released uncharged after lease_ttl).
func (c *checker) checkLedger(rows []ledgerRow) {
	tl := c.tl
	settled := map[string][]ledgerRow{}
	for _, e := range rows {
		if e.Kind == wallet.KindCharge || e.Kind == wallet.KindRelease {
			settled[e.RequestID] = append(settled[e.RequestID], e)
		}
	}
	logged := map[string]bool{}
	var answers, once, resumed, lost, refused, failedReleased int
	var lostGap time.Duration
	lostAt := map[time.Time]int{} // billed answers lost, by the kill that lost them
	for _, r := range c.l.records {
		if !r.billed() || r.ReqID == "" {
			continue
		}
		logged[r.ReqID] = true
		s := settled[r.ReqID]
		charges := 0
		for _, e := range s {
			if e.Kind == wallet.KindCharge {
				charges++
			}
		}
		where := fmt.Sprintf("request %d (%s %s stream=%v, %s %s, instance %s, %.2fs..%.2fs, id %s)", r.Seq, r.API, r.Model, r.Stream,
			r.Class, r.ServedBy, c.gws[r.Inst].name, r.Sent.Sub(tl.start).Seconds(), r.Done.Sub(tl.start).Seconds(), r.ReqID)
		if r.Status != http.StatusOK {
			if charges > 0 {
				c.defect("%s: answered %d and charged: %+v", where, r.Status, s)
			} else if len(s) > 1 {
				c.defect("%s: answered %d and settled %d times: %+v", where, r.Status, len(s), s)
			} else {
				refused++
				failedReleased += len(s)
			}
			continue
		}
		answers++
		want := 1
		if r.Resumed {
			want = 2
		}
		killedAt, crashed := tl.crashed(r)
		switch {
		case len(s) == want && charges >= 1:
			if r.Resumed {
				resumed++
			} else {
				once++
			}
		case len(s) == 0 && crashed:
			lost++
			lostAt[killedAt]++
			if r.Done.Before(killedAt) {
				lostGap = max(lostGap, killedAt.Sub(r.Done))
			}
		default:
			c.defect("%s: a billed answer has %d settlement rows (%d charges), want %d: %+v%s", where, len(s), charges, want, s, c.settleLog(r.ReqID))
		}
	}
	var orphans int
	for id, s := range settled {
		if logged[id] {
			continue
		}
		// A settlement the killed instance wrote for an answer whose
		// headers never reached its client is the only one allowed.
		lost := false
		for _, k := range tl.kills {
			lost = lost || s[0].Time.After(k.at.Add(-crashWindow)) && s[0].Time.Before(k.at.Add(time.Second))
		}
		if lost {
			orphans++
			continue
		}
		c.defect("ledger rows for request %s, which no client sent or got an answer to: %+v", id, s)
	}
	c.printf("\nbilling (ledger of the clients' accounts, %d rows, against the client log):\n", len(rows))
	c.printf("  billed answers (status 200)                  %d\n", answers)
	c.printf("    settled once, charged                      %d\n", once)
	c.printf("    resumed, charged in two rows               %d\n", resumed)
	c.printf("    unsettled, in flight at the kill           %d (answers completed before it: at most %v before)\n", lost, lostGap.Round(time.Millisecond))
	c.printf("  refused or failed billed requests, never charged  %d (%d with their release row)\n", refused, failedReleased)
	c.printf("  settlements of answers lost with the kill    %d\n", orphans)

	// The killed instance's credit leases (and the reservations of its
	// streams cut mid-way) are released uncharged once lease_ttl has
	// passed, by the survivor's sweep, each with an `expired` row. A kill
	// that lost no billed answer may leave nothing to release: its leases
	// may have given their spare money back, and a stream mid-way on it may
	// have been settled (or unbilled) before the kill reached it.
	for _, k := range tl.kills {
		var first time.Duration = -1
		n := 0
		for _, e := range rows {
			if e.Kind == wallet.KindExpired && e.Time.After(k.at) && e.Time.Before(k.at.Add(leaseTTL+reservationTTL+10*time.Second)) {
				n++
				if d := e.Time.Sub(k.at); first < 0 || d < first {
					first = d
				}
			}
		}
		bound := leaseTTL + reservationTTL/3 + 3*time.Second
		switch {
		case n > 0:
			c.printf("  %s: its leases were released uncharged %.2fs after the kill (%d expired rows; lease_ttl %v, bound %v)\n",
				k.why, first.Seconds(), n, leaseTTL, bound)
			if first > bound {
				c.defect("%s: its leases were released %.2fs after the kill, later than lease_ttl %v plus a sweep (bound %v)", k.why, first.Seconds(), leaseTTL, bound)
			}
		case lostAt[k.at] > 0:
			c.defect("%s: %d billed answers were lost with it unsettled, but no expired row shows its leases released", k.why, lostAt[k.at])
		default:
			c.printf("  %s: no expired row, and none due: it lost no billed answer unsettled (%d billed streams were mid-way when it was sent)\n", k.why, k.mid)
		}
	}
}

// settleLog finds what the instances logged about a request's settlement.
func (c *checker) settleLog(id string) string {
	var out []string
	for _, g := range c.gws {
		b, _ := os.ReadFile(g.logPath)
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, id) {
				out = append(out, g.name+": "+line)
			}
		}
	}
	if len(out) == 0 {
		return ""
	}
	return "; logged: " + strings.Join(out, " | ")
}

func (c *checker) printTimeline() {
	c.tl.mu.Lock()
	defer c.tl.mu.Unlock()
	var ok, failed int
	var longest time.Duration
	for _, r := range c.tl.reloads {
		if r.err != nil {
			failed++
			c.defect("caddy reload of %s at %.1fs failed: %v", c.gws[r.inst].name, r.at.Sub(c.tl.start).Seconds(), r.err)
		} else {
			ok++
		}
		if r.took > reloadStuck {
			c.defect("caddy reload of %s at %.1fs took %v (bound %v); goroutine dump in %s", c.gws[r.inst].name, r.at.Sub(c.tl.start).Seconds(),
				r.took.Round(time.Millisecond), reloadStuck, c.gws[r.inst].dir)
		}
		longest = max(longest, r.took)
	}
	c.printf("\ntimeline:\n")
	for _, e := range c.tl.events {
		c.printf("  %s\n", e)
	}
	c.printf("  caddy reload: %d done, %d failed, the longest took %v\n", ok, failed, longest.Round(time.Millisecond))
}

func (c *checker) printOutcomes() {
	type key struct{ class, verdict string }
	counts := map[key]int{}
	byAPI := map[string]map[string]int{}
	for _, r := range c.l.records {
		v := "expected: " + r.Why
		switch {
		case r.Defect != "":
			v = "DEFECT: " + r.Defect
		case r.Class == classOK:
			v = "served"
		case r.Why == "":
			v = "expected"
		}
		counts[key{r.Class, v}]++
		k := fmt.Sprintf("%-9s %-6s %-6s", r.API, map[bool]string{true: "stream", false: "json"}[r.Stream], map[bool]string{true: "billed", false: "free"}[r.billed()])
		if r.Slow {
			k = fmt.Sprintf("%-9s %-6s %-6s", "chat", "slow", "billed")
		}
		if byAPI[k] == nil {
			byAPI[k] = map[string]int{}
		}
		byAPI[k][r.Class]++
	}
	keys := make([]key, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return counts[keys[i]] > counts[keys[j]] })
	c.printf("\nrequests by outcome class:\n")
	tw := tabwriter.NewWriter(&c.report, 2, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "  class\tverdict\trequests\n")
	for _, k := range keys {
		fmt.Fprintf(tw, "  %s\t%s\t%d\n", k.class, k.verdict, counts[k])
	}
	fmt.Fprintf(tw, "  total\t\t%d\n", len(c.l.records))
	tw.Flush()
	c.printf("\nby API, mode and billing (ok / error_event / gateway_error / other):\n")
	names := make([]string, 0, len(byAPI))
	for k := range byAPI {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		m := byAPI[k]
		other := 0
		for cl, n := range m {
			if cl != classOK && cl != classErrorEvent && cl != classGatewayError {
				other += n
			}
		}
		c.printf("  %s  %5d / %4d / %4d / %4d\n", k, m[classOK], m[classErrorEvent], m[classGatewayError], other)
	}
	// Failover must hide most faults: with at most two of nine upstreams
	// failing at a time and every model on two or more channels, a
	// share of funded and free requests below this means it stopped
	// working (the faults alone, unhidden, would fail far more).
	var tried, served int
	for _, r := range c.l.records {
		if r.Acct == "funded" || r.Acct == "free" {
			tried++
			if r.Class == classOK || r.Class == classClientAbort {
				served++
			}
		}
	}
	share := float64(served) / float64(max(tried, 1))
	c.printf("\nserved in full: %d of %d funded and unbilled requests (%.1f%%; the floor is %.0f%%)\n", served, tried, 100*share, 100*minServedShare)
	if share < minServedShare {
		c.defect("only %.1f%% of the funded and unbilled requests were served in full (floor %.0f%%)", 100*share, 100*minServedShare)
	}
}

// minServedShare: see printOutcomes.
const minServedShare = 0.75

// checkResources prints the samples and holds each process's end sample
// to the bounds above against its first (the restarted instance against
// its first sample after the restart).
func (c *checker) checkResources() {
	c.rs.mu.Lock()
	defer c.rs.mu.Unlock()
	c.printf("\nresources (no request in flight; RSS and heap in MiB):\n")
	tw := tabwriter.NewWriter(&c.report, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "  instance\tpid\tsample\tat\tRSS\theap\tgoroutines\t(own)\tfds\t\n")
	first := map[int]sample{}
	last := map[int]sample{}
	for _, s := range c.rs.samples {
		if s.err != nil {
			c.defect("sampling %s (pid %d, %s): %v", c.gws[s.inst].name, s.pid, s.label, s.err)
			continue
		}
		probing := ""
		if s.probing {
			probing = fmt.Sprintf(" (a probe round still under way after %s)", probeRoundWait)
		}
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%.0fs\t%.1f\t%.1f\t%d\t%d\t%d\t%s\n", c.gws[s.inst].name, s.pid, s.label, s.at.Seconds(),
			float64(s.rss)/(1<<20), float64(s.heapInuse)/(1<<20), s.goroutines, s.ownGoroutines, s.fds, probing)
		if _, ok := first[s.pid]; !ok {
			first[s.pid] = s
		}
		last[s.pid] = s
	}
	tw.Flush()
	c.printf("  bounds, end against first sample of the same process: own goroutines +%d, fds +%d, RSS ×%.1f + %d MiB\n",
		maxGoroutineGrowth, maxFDGrowth, maxRSSRatio, maxRSSSlack>>20)
	for pid, s0 := range first {
		s1 := last[pid]
		if s1.label != "end" {
			continue // the killed incarnation
		}
		name := c.gws[s1.inst].name
		if d := s1.ownGoroutines - s0.ownGoroutines; d > maxGoroutineGrowth {
			c.defect("%s (pid %d): goroutines other than pooled connections' %d at %s, %d at the end (+%d, bound +%d); profiles in %s",
				name, pid, s0.ownGoroutines, s0.label, s1.ownGoroutines, d, maxGoroutineGrowth, c.gws[s1.inst].dir)
		}
		if d := s1.fds - s0.fds; d > maxFDGrowth {
			c.defect("%s (pid %d): open fds %d at %s, %d at the end (+%d, bound +%d)", name, pid, s0.fds, s0.label, s1.fds, d, maxFDGrowth)
		}
		if bound := int64(float64(s0.rss)*maxRSSRatio) + maxRSSSlack; s1.rss > bound {
			c.defect("%s (pid %d): RSS %d MiB at %s, %d MiB at the end (bound %d MiB)", name, pid, s0.rss>>20, s0.label, s1.rss>>20, bound>>20)
		}
	}
}

// checkLogs: no data race, no panic, no fatal error in either instance's
// output, over every incarnation; the error-level messages are counted.
func (c *checker) checkLogs() {
	c.printf("\nlogs:\n")
	for _, g := range c.gws {
		bad, errs, err := g.scanLog()
		if err != nil {
			c.defect("%s: reading the log: %v", g.name, err)
		}
		for i, line := range bad {
			if i < 10 {
				c.defect("%s: the log reports: %.300s", g.name, line)
			}
		}
		c.printf("  %s: %d data race, panic or fatal lines; error-level messages:\n", g.name, len(bad))
		type kv struct {
			k string
			n int
		}
		var list []kv
		for k, n := range errs {
			list = append(list, kv{k, n})
		}
		sort.Slice(list, func(i, j int) bool { return list[i].n > list[j].n })
		for _, e := range list {
			c.printf("    %6d  %s\n", e.n, e.k)
		}
	}
}

// printFaults prints how many requests each front answered under each
// fault, and fails when a fault kind was never exercised.
func (c *checker) printFaults() {
	c.printf("\nupstream requests answered under each fault (rows: fronts; columns: faults):\n")
	tw := tabwriter.NewWriter(&c.report, 2, 8, 1, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "  \t")
	for f := fault(0); f < numFaults; f++ {
		fmt.Fprintf(tw, "%s\t", f)
	}
	fmt.Fprintf(tw, "\n")
	var total [numFaults]int64
	for _, fr := range c.u.fronts {
		fmt.Fprintf(tw, "  %s\t", fr.name)
		for f := fault(0); f < numFaults; f++ {
			n := fr.answered[f].Load()
			total[f] += n
			fmt.Fprintf(tw, "%d\t", n)
		}
		fmt.Fprintf(tw, "\n")
		if fr.answered[healthy].Load() == 0 {
			c.defect("upstream %s served no request: its adapter was not exercised", fr.name)
		}
	}
	tw.Flush()
	for f := fault(1); f < numFaults; f++ {
		if total[f] == 0 {
			c.defect("no request met fault %s: the soak did not exercise it", f)
		}
	}
}
