//go:build linux

package soak

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/binarytest"
)

// ports of one gateway instance.
type ports struct{ HTTP, Admin int }

// gateway is one `caddy run` process, restarted in place after a kill:
// each run is an incarnation, with its own pid, appended to one log.
type gateway struct {
	name    string
	bin     string
	dir     string // XDG dirs; they survive restarts
	cfgPath string
	logPath string
	ports   ports
	env     []string

	// life serialises what changes the process (kill and restart,
	// reloads), so a reload never races the kill.
	life sync.Mutex

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{}
	waitErr  error
	exits    []string // how each incarnation ended
	incs     []*incarnation
	variant  int // the config variant last loaded
	reloads  int
	failures []string // reloads that failed, with caddy's output
}

func newGateway(t *testing.T, name, bin string, p ports, env []string) *gateway {
	dir := filepath.Join(outDir(t), name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var base []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "XDG_DATA_HOME=") && !strings.HasPrefix(kv, "XDG_CONFIG_HOME=") {
			base = append(base, kv)
		}
	}
	base = append(base, "XDG_DATA_HOME="+filepath.Join(dir, "data"), "XDG_CONFIG_HOME="+filepath.Join(dir, "config"))
	return &gateway{name: name, bin: bin, dir: dir, cfgPath: filepath.Join(dir, "Caddyfile"),
		logPath: filepath.Join(dir, "caddy.log"), ports: p, env: append(base, env...)}
}

func (g *gateway) writeConfig(cfg string, variant int) error {
	g.mu.Lock()
	g.variant = variant
	g.mu.Unlock()
	return os.WriteFile(g.cfgPath, []byte(cfg), 0o600)
}

// start runs caddy on the config file and waits until the admin endpoint
// and the gateway's port answer.
func (g *gateway) start() error {
	g.mu.Lock()
	if g.cmd != nil && !g.hasExitedLocked() {
		g.mu.Unlock()
		return fmt.Errorf("%s: start while running", g.name)
	}
	for _, port := range []int{g.ports.HTTP, g.ports.Admin} {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 200*time.Millisecond); err == nil {
			c.Close()
			g.mu.Unlock()
			return fmt.Errorf("%s: port %d is in use before caddy started (a leftover process? set LLMF_SOAK_PORT_BASE)", g.name, port)
		}
	}
	logf, err := os.OpenFile(g.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		g.mu.Unlock()
		return err
	}
	fmt.Fprintf(logf, "\n===== %s: caddy run at %s =====\n", g.name, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(g.bin, "run", "--config", g.cfgPath, "--adapter", "caddyfile")
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = g.env, g.dir, logf, logf
	// The kernel kills caddy if the test binary dies (a panic, a -timeout).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		g.mu.Unlock()
		return err
	}
	exited := make(chan struct{})
	inc := &incarnation{pid: cmd.Process.Pid, start: time.Now()}
	g.cmd, g.exited = cmd, exited
	g.incs = append(g.incs, inc)
	g.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logf.Close()
		g.mu.Lock()
		g.waitErr = err
		g.exits = append(g.exits, exitString(cmd.ProcessState, err))
		inc.end = time.Now()
		g.mu.Unlock()
		close(exited)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			return fmt.Errorf("%s: caddy exited during start-up: %v", g.name, g.waitErr)
		default:
		}
		if binarytest.Ready(g.adminURL(), g.ports.HTTP) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: caddy did not answer within 60s of starting", g.name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func exitString(ps *os.ProcessState, err error) string {
	if ps == nil {
		return fmt.Sprint(err)
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return "signal " + ws.Signal().String()
	}
	return "exit " + strconv.Itoa(ps.ExitCode())
}

func (g *gateway) hasExitedLocked() bool {
	select {
	case <-g.exited:
		return true
	default:
		return false
	}
}

func (g *gateway) running() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cmd != nil && !g.hasExitedLocked()
}

func (g *gateway) pid() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cmd == nil || g.cmd.Process == nil {
		return 0
	}
	return g.cmd.Process.Pid
}

// stop sends SIGTERM and waits for the exit (SIGKILL after 30s), and
// returns how the process ended.
func (g *gateway) stop() string {
	g.mu.Lock()
	cmd, exited := g.cmd, g.exited
	g.mu.Unlock()
	if cmd == nil {
		return "not started"
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		// grace_period is 5s: it is stuck; keep what it is doing.
		g.dumpGoroutines("stop")
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			return "did not exit within 30s of SIGTERM; killed"
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.exits[len(g.exits)-1]
}

// kill9 kills the process as a crash or the OOM killer would.
func (g *gateway) kill9() error {
	g.mu.Lock()
	cmd, exited := g.cmd, g.exited
	g.mu.Unlock()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	select {
	case <-exited:
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("still alive 10s after SIGKILL")
	}
}

// reload runs `caddy reload` with the config file, as an operator would.
func (g *gateway) reload(cfg string, variant int) error {
	if err := g.writeConfig(cfg, variant); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), reloadStuck+10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, g.bin, "reload", "--config", g.cfgPath, "--adapter", "caddyfile", "--address", g.adminAddr())
	cmd.Env, cmd.WaitDelay = g.env, 5*time.Second
	// A reload that takes this long is stuck: what every goroutine is
	// doing then is what its owner needs.
	watchdog := time.AfterFunc(reloadStuck, func() { g.dumpGoroutines(fmt.Sprintf("reload-variant%d", variant)) })
	out, err := cmd.CombinedOutput()
	watchdog.Stop()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.reloads++
	if err != nil {
		err = fmt.Errorf("caddy reload (variant %d): %v: %s", variant, err, lastLines(string(out), 5))
		g.failures = append(g.failures, err.Error())
	}
	return err
}

// reloadStuck: `caddy reload` returns once the old config has stopped,
// which the grace period (5s) and the wallet's wait for settlements
// already decided (10s) bound; longer than this is a defect.
const reloadStuck = 20 * time.Second

// dumpGoroutines saves every goroutine's stack of the running process
// (the admin endpoint's /debug/pprof) next to its log.
func (g *gateway) dumpGoroutines(label string) {
	res, err := adminClient.Get(g.adminURL() + "/debug/pprof/goroutine?debug=2")
	if err != nil {
		return
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	_ = os.WriteFile(filepath.Join(g.dir, fmt.Sprintf("goroutines-%s-%d.txt", label, time.Now().Unix())), b, 0o644)
}

// goroutineProfile is the process's goroutine profile grouped by stack
// (debug=1), from the admin endpoint's /debug/pprof.
func (g *gateway) goroutineProfile() ([]byte, error) {
	res, err := adminClient.Get(g.adminURL() + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: /debug/pprof/goroutine: status %d", g.name, res.StatusCode)
	}
	return io.ReadAll(res.Body)
}

// incarnation is one run of the process.
type incarnation struct {
	pid        int
	start, end time.Time
}

// cli runs a short caddy subcommand against the instance's admin API.
func (g *gateway) cli(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, g.bin, args...)
	cmd.Env, cmd.WaitDelay = g.env, 5*time.Second
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (g *gateway) gatewayURL() string { return fmt.Sprintf("http://127.0.0.1:%d", g.ports.HTTP) }
func (g *gateway) adminURL() string   { return fmt.Sprintf("http://localhost:%d", g.ports.Admin) }
func (g *gateway) adminAddr() string  { return fmt.Sprintf("localhost:%d", g.ports.Admin) }

var adminClient = &http.Client{Timeout: 30 * time.Second}

// admin calls the admin API; out (when not nil) gets the JSON answer.
func (g *gateway) admin(method, path string, body io.Reader, want int, out any) error {
	req, err := http.NewRequest(method, g.adminURL()+path, body)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := adminClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s: admin %s %s: %w", g.name, method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != want {
		return fmt.Errorf("%s: admin %s %s: status %d, want %d: %s", g.name, method, path, res.StatusCode, want, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s: admin %s %s: %v in %.200q", g.name, method, path, err, b)
		}
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// scanLog reads the instance's whole log (every incarnation) and returns
// the lines that report a data race, a panic or a fatal runtime error,
// and counts the error-level log messages by message.
func (g *gateway) scanLog() (bad []string, errs map[string]int, err error) {
	f, err := os.Open(g.logPath)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	errs = map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		low := strings.ToLower(line)
		switch {
		case strings.Contains(line, "WARNING: DATA RACE"), strings.Contains(low, "panic"),
			strings.HasPrefix(line, "fatal error:"), strings.Contains(line, "concurrent map"):
			bad = append(bad, line)
		}
		if strings.HasPrefix(line, "{") && strings.Contains(line, `"level":"error"`) {
			var v struct {
				Logger string `json:"logger"`
				Msg    string `json:"msg"`
			}
			if json.Unmarshal([]byte(line), &v) == nil {
				errs[v.Logger+": "+v.Msg]++
			}
		}
	}
	return bad, errs, sc.Err()
}
