// Package e2e drives the xcaddy-built caddy binary (with llm_failover
// compiled in) over loopback: real processes, real config adaptation, real
// admin API, real signals. The in-process tests in the root package cannot
// see what these see: the CLI, reloads through `caddy reload`, a kill -9,
// two processes sharing one database, and the official SDKs.
//
// Environment:
//
//	LLMF_CADDY_BIN          the built binary (scripts/test.sh sets it to ./caddy)
//	LLMF_TEST_POSTGRES_DSN  a PostgreSQL the test may CREATE DATABASE on
//	CI=true                 turns every "missing prerequisite" skip into a failure
//
// Ports are fixed in the 19xxx range (other suites use 9xxx and 18xxx); each
// test has its own, so the tests could run in parallel, but they do not: the
// machines are small and the timing assertions are kinder without it.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/binarytest"
)

// ports of one caddy instance.
type ports struct {
	HTTP, Admin int
}

// Per-test ports, all in 19xxx. The second instance of the Postgres test
// uses its own pair.
var (
	portsFailover  = ports{19080, 19019}
	portsSDK       = ports{19081, 19020}
	portsReload    = ports{19082, 19021}
	portsWalletCLI = ports{19083, 19022}
	portsKill9     = ports{19084, 19023}
	portsPGA       = ports{19085, 19024}
	portsPGB       = ports{19086, 19025}
	portsSwitch    = ports{19087, 19026}
	portsSigterm   = ports{19088, 19027}
	// portsSigtermLoad: TestBinarySigtermChargesEveryAnswer.
	portsSigtermLoad = ports{19095, 19034}
)

// caddyBin is the binary under test.
func caddyBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("LLMF_CADDY_BIN")
	if bin == "" {
		binarytest.Prerequisite(t, "LLMF_CADDY_BIN is not set; run `make build` and set it to the built ./caddy (scripts/test.sh does)")
	}
	if !filepath.IsAbs(bin) {
		abs, err := filepath.Abs(bin)
		if err != nil {
			t.Fatal(err)
		}
		bin = abs
	}
	if st, err := os.Stat(bin); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		t.Fatalf("LLMF_CADDY_BIN=%s is not an executable file (err=%v); run `make build`", bin, err)
	}
	return bin
}

// postgresDSN is the server the Postgres test creates its database on.
func postgresDSN(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv("LLMF_TEST_POSTGRES_DSN")
	if dsn == "" {
		binarytest.Prerequisite(t, `LLMF_TEST_POSTGRES_DSN is not set; run eval "$(bash scripts/pg-test-server.sh start)"`)
	}
	return dsn
}

// runCaddy runs a short caddy subcommand (not `run`) and returns its
// combined output.
func runCaddy(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, caddyBin(t), args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// baseEnv is the test process's environment with XDG dirs moved to dir, so
// that caddy's data (autosave.json, the SQLite wallet) stays in the test's
// temporary directory.
func baseEnv(dir string, extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "XDG_DATA_HOME=") || strings.HasPrefix(kv, "XDG_CONFIG_HOME=") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "XDG_DATA_HOME="+filepath.Join(dir, "data"), "XDG_CONFIG_HOME="+filepath.Join(dir, "config"))
	return append(env, extra...)
}

// instance is one `caddy run` process.
type instance struct {
	t       *testing.T
	name    string
	bin     string
	dir     string // XDG dirs live here; they survive restarts
	cfgPath string
	logPath string
	ports   ports
	env     []string

	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
}

// newInstance writes the Caddyfile and starts caddy. The process is stopped
// (SIGTERM) when the test ends, and its log is printed if the test failed.
func newInstance(t *testing.T, name string, p ports, caddyfile string, extraEnv ...string) *instance {
	t.Helper()
	dir := t.TempDir()
	in := &instance{
		t: t, name: name, bin: caddyBin(t), dir: dir,
		cfgPath: filepath.Join(dir, "Caddyfile"),
		logPath: filepath.Join(dir, "caddy.log"),
		ports:   p,
		env:     baseEnv(dir, extraEnv...),
	}
	in.writeConfig(caddyfile)
	t.Cleanup(func() {
		in.stop()
		if t.Failed() {
			in.dumpLog()
		}
	})
	in.start()
	return in
}

func (in *instance) writeConfig(caddyfile string) {
	in.t.Helper()
	if err := os.WriteFile(in.cfgPath, []byte(caddyfile), 0o600); err != nil {
		in.t.Fatal(err)
	}
}

// start launches the process and waits until both the admin endpoint and
// the gateway's port answer.
func (in *instance) start() {
	t := in.t
	t.Helper()
	if in.cmd != nil && !in.hasExited() {
		t.Fatalf("%s: start while running", in.name)
	}
	for _, port := range []int{in.ports.HTTP, in.ports.Admin} {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 200*time.Millisecond); err == nil {
			c.Close()
			t.Fatalf("%s: port %d is already in use before caddy started (a leftover process?)", in.name, port)
		}
	}
	logf, err := os.OpenFile(in.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(logf, "\n===== %s: caddy run at %s =====\n", in.name, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(in.bin, "run", "--config", in.cfgPath, "--adapter", "caddyfile")
	cmd.Env = in.env
	cmd.Dir = in.dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	setDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("%s: starting caddy: %v", in.name, err)
	}
	in.cmd = cmd
	in.exited = make(chan struct{})
	go func() {
		in.waitErr = cmd.Wait()
		logf.Close()
		close(in.exited)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if in.hasExited() {
			in.dumpLog()
			t.Fatalf("%s: caddy exited during start-up: %v", in.name, in.waitErr)
		}
		if binarytest.Ready(in.adminURL(), in.ports.HTTP) {
			return
		}
		if time.Now().After(deadline) {
			in.dumpLog()
			t.Fatalf("%s: caddy did not become ready within 30s", in.name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (in *instance) hasExited() bool {
	select {
	case <-in.exited:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and waits; SIGKILL after 20s.
func (in *instance) stop() {
	if in.cmd == nil || in.hasExited() {
		return
	}
	// A pooled connection that never carried a request counts as active
	// for 5s in net/http's Shutdown; closing the pools spares that wait.
	gatewayClient.CloseIdleConnections()
	http.DefaultClient.CloseIdleConnections()
	_ = in.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-in.exited:
	case <-time.After(20 * time.Second):
		in.t.Errorf("%s: caddy did not exit within 20s of SIGTERM; killing it", in.name)
		_ = in.cmd.Process.Kill()
		<-in.exited
	}
}

// kill9 kills the process with SIGKILL, as a crash or the OOM killer would.
func (in *instance) kill9() {
	in.t.Helper()
	if err := in.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		in.t.Fatalf("%s: kill -9: %v", in.name, err)
	}
	select {
	case <-in.exited:
	case <-time.After(10 * time.Second):
		in.t.Fatalf("%s: process still alive 10s after SIGKILL", in.name)
	}
}

func (in *instance) dumpLog() {
	b, err := os.ReadFile(in.logPath)
	if err != nil {
		in.t.Logf("%s: no log: %v", in.name, err)
		return
	}
	const max = 48 << 10
	if len(b) > max {
		b = append([]byte("...(truncated)...\n"), b[len(b)-max:]...)
	}
	in.t.Logf("----- %s: caddy log (%s) -----\n%s\n----- end of %s log -----", in.name, in.logPath, b, in.name)
}

func (in *instance) gatewayURL() string { return fmt.Sprintf("http://127.0.0.1:%d", in.ports.HTTP) }
func (in *instance) adminURL() string   { return fmt.Sprintf("http://localhost:%d", in.ports.Admin) }
func (in *instance) adminAddr() string  { return fmt.Sprintf("localhost:%d", in.ports.Admin) }

// admin calls the admin API and decodes a JSON answer into out (when not
// nil). It fails the test on a status other than want.
func (in *instance) admin(method, path string, body any, want int, out any) {
	in.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			in.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, in.adminURL()+path, rd)
	if err != nil {
		in.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	c := http.Client{Timeout: 15 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		in.t.Fatalf("%s: admin %s %s: %v", in.name, method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		in.t.Fatalf("%s: admin %s %s: status %d, want %d; body: %s", in.name, method, path, resp.StatusCode, want, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			in.t.Fatalf("%s: admin %s %s: decoding %q: %v", in.name, method, path, b, err)
		}
	}
}

// globalOptions is the global block every test config starts with. The
// grace period bounds how long a reload or a stop waits for open
// connections; 10s unless a test needs another.
func globalOptions(p ports) string { return globalOptionsGrace(p, "10s") }

func globalOptionsGrace(p ports, grace string) string {
	return fmt.Sprintf(`{
	admin localhost:%d
	auto_https off
	http_port %d
	grace_period %s
	persist_config off
}
`, p.Admin, p.HTTP, grace)
}

// withWallet adds a global llm_wallet option (its block's body) to a
// global options block.
func withWallet(global, wallet string) string {
	return strings.TrimSuffix(global, "}\n") + "\tllm_wallet {\n" + wallet + "\n\t}\n}\n"
}

// withFailover adds a global llm_failover option (its block's body) to a
// global options block.
func withFailover(global, body string) string {
	return strings.TrimSuffix(global, "}\n") + "\tllm_failover {\n\t\t" + body + "\n\t}\n}\n"
}

// site wraps an llm_failover block in a loopback-only site on the
// instance's HTTP port.
func site(p ports, body string) string {
	return fmt.Sprintf(`http://:%d {
	bind 127.0.0.1
	header {
		defer
		X-Served-By {http.llm_failover.channel}
	}
	llm_failover {
%s
	}
}
`, p.HTTP, body)
}

// gatewayClient is shared by the tests; it never follows redirects and has
// a generous pool for the concurrency test.
var gatewayClient = &http.Client{
	Timeout: 60 * time.Second,
	Transport: &http.Transport{
		MaxIdleConns:        512,
		MaxIdleConnsPerHost: 512,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// post sends a JSON body with optional header pairs and returns the status,
// headers and whole body.
func post(t *testing.T, url string, body []byte, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := gatewayClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: reading body: %v (got %q so far)", url, err, b)
	}
	return resp.StatusCode, resp.Header, b
}

// sseEvent is one server-sent event.
type sseEvent struct {
	Name string
	Data string
	At   time.Duration // since the request was sent
}

// readSSE reads events until the body ends; err is the body's read error
// (nil for a clean end).
func readSSE(r io.Reader, start time.Time, each func(sseEvent)) ([]sseEvent, error) {
	var events []sseEvent
	var cur sseEvent
	var data []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.Name != "" || data != nil {
				cur.Data = strings.Join(data, "\n")
				cur.At = time.Since(start)
				events = append(events, cur)
				if each != nil {
					each(cur)
				}
			}
			cur, data = sseEvent{}, nil
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "event:"):
			cur.Name = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
	return events, sc.Err()
}

// chatText concatenates the content deltas of OpenAI chat chunks, and
// reports whether any chunk carried an error.
func chatText(events []sseEvent) (text string, sawError bool) {
	var sb strings.Builder
	for _, ev := range events {
		if ev.Data == "[DONE]" {
			continue
		}
		var chunk struct {
			Error   json.RawMessage `json:"error"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev.Data), &chunk); err != nil {
			sawError = true
			continue
		}
		if len(chunk.Error) > 0 && string(chunk.Error) != "null" || ev.Name == "error" {
			sawError = true
		}
		for _, c := range chunk.Choices {
			sb.WriteString(c.Delta.Content)
		}
	}
	return sb.String(), sawError
}

// waitFor polls cond until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}
