package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// portsDemo: Caddyfile.example's ports (8080, 2019; upstreams 9501-9503,
// heartbeat receiver 9509) moved into 19xxx for the test.
var portsDemo = ports{19111, 19112}

// demoConfig is Caddyfile.example with its gateway and admin on p, and its
// three demo upstreams (9501-9503) and heartbeat receiver (9509) on
// first, first+1, first+2 and first+3.
func demoConfig(t *testing.T, p ports, first int) string {
	t.Helper()
	raw, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	at := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", first+i) }
	return strings.NewReplacer(":8080", fmt.Sprintf(":%d", p.HTTP), "localhost:2019", fmt.Sprintf("localhost:%d", p.Admin),
		"127.0.0.1:9501", at(0), "127.0.0.1:9502", at(1), "127.0.0.1:9503", at(2), "127.0.0.1:9509", at(3)).Replace(string(raw))
}

// startDemo starts cfg (a demoConfig) as instance name and sets it up as
// scripts/run-demo.sh does on its first run: the demo account and the
// probes' account funded, a key for the demo. It returns the instance, a
// `caddy llm-wallet` runner against it and the key.
func startDemo(t *testing.T, name string, p ports, cfg string) (*instance, func(args ...string) string, string) {
	t.Helper()
	in := newInstance(t, name, p, cfg, "FLAKY_API_KEY=k1", "OVERLOADED_API_KEY=k2", "BACKUP_API_KEY=k3")
	cli := func(args ...string) string {
		t.Helper()
		out, err := runCaddy(t, in.env, append([]string{"llm-wallet", "--address", in.adminAddr()}, args...)...)
		if err != nil {
			t.Fatalf("llm-wallet %v: %v\n%s", args, err, out)
		}
		return out
	}
	cli("create-account", "demo")
	cli("credit", "demo", "5")
	cli("create-account", "demo-probes")
	cli("credit", "demo-probes", "1")
	return in, cli, cliFields(cli("create-key", "demo", "demo"))["key"]
}

// Caddyfile.example, as `make run` serves it, answers every API the demo
// prints a command for in that API's own format (its Responses request
// got a chat completion, so the SDK's output_text was undefined), and
// shows the operator features: the status page, readiness, probes that
// run, a heartbeat receiver that is pinged, the history store.
func TestBinaryDemoAnswersEveryAPI(t *testing.T) {
	cfg := demoConfig(t, portsDemo, 19113)
	for _, line := range strings.Split(cfg, "\n") {
		if line = strings.TrimSpace(line); !strings.HasPrefix(line, "#") && (strings.Contains(line, ":95") || strings.Contains(line, ":8080") || strings.Contains(line, ":2019")) {
			t.Fatalf("a port of Caddyfile.example was not moved: %s", line)
		}
	}
	in, cli, key := startDemo(t, "demo", portsDemo, cfg)

	post := func(path string, body string, hdr ...string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, in.gatewayURL()+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		res, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, b
	}
	var chat struct {
		Object  string `json:"object"`
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if code, b := post("/v1/chat/completions", `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`); code != 200 ||
		json.Unmarshal(b, &chat) != nil || chat.Object != "chat.completion" || len(chat.Choices) != 1 || chat.Choices[0].Message.Content == "" {
		t.Errorf("chat: %d %s", code, b)
	}
	var resp struct {
		Object string `json:"object"`
		Output []struct {
			Content []struct{ Type, Text string } `json:"content"`
		} `json:"output"`
	}
	if code, b := post("/v1/responses", `{"model":"gpt-4o-mini","input":"hi"}`); code != 200 || json.Unmarshal(b, &resp) != nil ||
		resp.Object != "response" || len(resp.Output) != 1 || len(resp.Output[0].Content) != 1 || resp.Output[0].Content[0].Type != "output_text" {
		t.Errorf("responses: %d %s; want a Response whose output holds output_text", code, b)
	}
	if code, b := post("/v1/responses", `{"model":"gpt-4o-mini","input":"hi","stream":true}`); code != 200 ||
		!bytes.Contains(b, []byte("event: response.output_text.delta")) || !bytes.Contains(b, []byte("event: response.completed")) {
		t.Errorf("responses stream: %d %s", code, b)
	}
	var emb struct {
		Object string `json:"object"`
		Data   []struct {
			Embedding []float64 `json:"embedding"`
		} `json:"data"`
	}
	if code, b := post("/v1/embeddings", `{"model":"gpt-4o-mini","input":"hi"}`); code != 200 || json.Unmarshal(b, &emb) != nil ||
		emb.Object != "list" || len(emb.Data) != 1 || len(emb.Data[0].Embedding) == 0 {
		t.Errorf("embeddings: %d %s", code, b)
	}
	if code, b := post("/v1/messages", `{"model":"claude-sonnet-4","max_tokens":256,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		"anthropic-version", "2023-06-01"); code != 200 || !bytes.Contains(b, []byte("event: content_block_delta")) || !bytes.Contains(b, []byte("event: message_stop")) {
		t.Errorf("messages stream: %d %s", code, b)
	}

	get := func(url string) (int, string) {
		res, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
		if err != nil {
			return 0, err.Error()
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, body := get(in.gatewayURL() + "/status"); code != 200 || !strings.Contains(body, "llm_failover demo") || !strings.Contains(body, "gpt-4o-mini") {
		t.Errorf("status page: %d %.300s", code, body)
	}
	if code, body := get(in.gatewayURL() + "/status/ready"); code != 200 {
		t.Errorf("ready: %d %s", code, body)
	}
	// The prober runs and pings its heartbeat receiver; the history store
	// flushes.
	var jobs []struct {
		Job        string `json:"job"`
		Runs       int    `json:"runs"`
		Heartbeats int    `json:"heartbeats"`
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, body := get(in.adminURL() + "/llm_failover/jobs")
		_ = json.Unmarshal([]byte(body), &jobs)
		runs := map[string]int{}
		for _, j := range jobs {
			if j.Job == "prober" && j.Heartbeats != 1 {
				t.Fatalf("the prober has %d heartbeat receivers, want the demo's one", j.Heartbeats)
			}
			runs[j.Job] = j.Runs
		}
		if runs["prober"] > 0 && runs["history_flush"] > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("jobs after 20 s: %s", body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if log, _ := os.ReadFile(in.logPath); !bytes.Contains(log, []byte(`"uri":"/ping/prober"`)) {
		t.Error("the heartbeat receiver was never pinged")
	}

	// Every subcommand prints a table, the admin API's JSON with --json,
	// and says what to do when nothing answers at the admin address.
	if out := cli("status"); strings.Contains(out, "{") || !strings.Contains(out, "reachable") || !strings.Contains(out, "sqlite") {
		t.Errorf("llm-wallet status is not a table:\n%s", out)
	}
	out, err := runCaddy(t, in.env, "llm-wallet", "--address", in.adminAddr(), "--json", "status")
	var st map[string]any
	if err != nil || json.Unmarshal([]byte(out), &st) != nil || st["reachable"] != true {
		t.Errorf("llm-wallet --json status: %v\n%s", err, out)
	}
	out, err = runCaddy(t, in.env, "llm-failover", "--address", in.adminAddr(), "--json", "drill")
	var runs []map[string]any
	if err != nil || json.Unmarshal([]byte(out), &runs) != nil || len(runs) != 2 {
		t.Errorf("llm-failover --json drill: %v\n%s", err, out)
	}
	out, err = runCaddy(t, in.env, "llm-failover", "--address", "localhost:1", "decisions")
	if err == nil || !strings.Contains(out, "is caddy running?") || !strings.Contains(out, "--config") {
		t.Errorf("llm-failover against an admin address where nothing answers: %v\n%s", err, out)
	}
}

// portsDemoRestart: TestBinaryDemoReadmeFailoverAfterRestart's gateway and
// admin; its upstreams and heartbeat receiver are 19119-19122.
var portsDemoRestart = ports{19117, 19118}

// README.md ("Two commands") promises that the demo's first request, the
// chat completion it prints, is answered by "backup" and that the log
// shows why: one `failover` line from "flaky" (503) to "backup". A second
// `make run` (the demo key and accounts already exist) must keep that
// promise too, not only the very first start.
func TestBinaryDemoReadmeFailoverAfterRestart(t *testing.T) {
	cfg := demoConfig(t, portsDemoRestart, 19119)
	in, _, key := startDemo(t, "demo-restart", portsDemoRestart, cfg)

	// The second `make run`: same data directory, accounts already there.
	in.stop()
	if err := os.Truncate(in.logPath, 0); err != nil {
		t.Fatal(err)
	}
	in.start()

	req, _ := http.NewRequest(http.MethodPost, in.gatewayURL()+"/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !bytes.Contains(b, []byte("Hello from the backup channel.")) {
		t.Fatalf("chat: %d %s", res.StatusCode, b)
	}
	var sawFailover bool
	var opened string
	log, _ := os.ReadFile(in.logPath)
	for _, line := range bytes.Split(log, []byte("\n")) {
		var l struct {
			Msg, Channel, Reason, NextChannel string
			UpstreamStatus                    int `json:"upstream_status"`
		}
		if json.Unmarshal(line, &l) != nil {
			continue
		}
		var nc struct {
			Next string `json:"next_channel"`
		}
		_ = json.Unmarshal(line, &nc)
		switch {
		case l.Msg == "failover" && l.Channel == "flaky" && l.Reason == "status" && l.UpstreamStatus == 503 && nc.Next == "backup":
			sawFailover = true
		case l.Msg == "breaker state changed" && l.Channel == "flaky":
			opened = string(line)
		}
	}
	if !sawFailover {
		t.Errorf("no `failover` line from flaky (503) to backup for the README's request after a restart; flaky's breaker: %s", opened)
	}
}
