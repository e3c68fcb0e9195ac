package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// Ports of the status tests' two instances (19xxx like the others).
var (
	portsStatusA = ports{19347, 19346}
	portsStatusB = ports{19349, 19348}
)

// statusSite is a gateway with a status page at /status whose history is
// kept in PostgreSQL.
func statusSite(p ports, upstream string) string {
	return withFailover(globalOptions(p), "history postgres {env.LLMF_E2E_DSN}") + fmt.Sprintf(`http://:%d {
	bind 127.0.0.1
	handle /status* {
		llm_status {
			title Fleet status
		}
	}
	llm_failover {
		channel shared %s
		model gpt-fleet {
			route shared
		}
	}
}
`, p.HTTP, upstream)
}

// channelAttempts reads the page's JSON and returns the shared channel's
// 5-minute attempts.
func channelAttempts(t *testing.T, in *instance) int64 {
	t.Helper()
	res, err := gatewayClient.Get(in.gatewayURL() + "/status?format=json")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var v struct {
		Models []struct {
			Channels []struct {
				Name    string `json:"name"`
				Windows map[string]struct {
					Attempts int64 `json:"attempts"`
				} `json:"windows"`
			} `json:"channels"`
		} `json:"models"`
	}
	if err := json.NewDecoder(res.Body).Decode(&v); err != nil || len(v.Models) != 1 || len(v.Models[0].Channels) != 1 {
		t.Fatalf("status JSON of %s: %v %+v", in.name, err, v)
	}
	return v.Models[0].Channels[0].Windows["5m"].Attempts
}

// Two caddy processes on one PostgreSQL history: each flushes what it
// saw, and each page shows the fleet's totals. Then the HTML page of the
// built binary, and a restart of one instance keeps the totals.
func TestBinaryStatusFleetOnPostgres(t *testing.T) {
	caddyBin(t)
	dsn := createDatabase(t, postgresDSN(t))
	up := fu.New(fu.OKNamed("fleet"))
	defer up.Close()
	a := newInstance(t, "status-a", portsStatusA, statusSite(portsStatusA, up.URL), "LLMF_E2E_DSN="+dsn)
	b := newInstance(t, "status-b", portsStatusB, statusSite(portsStatusB, up.URL), "LLMF_E2E_DSN="+dsn)
	for i := range 5 {
		in := a
		if i >= 3 {
			in = b
		}
		if code, _, body := post(t, in.gatewayURL()+"/v1/chat/completions", fu.ChatRequest("gpt-fleet", false)); code != 200 {
			t.Fatalf("%s: %d %s", in.name, code, body)
		}
	}
	// The flush job runs every 5 s.
	if !waitFor(20*time.Second, func() bool { return channelAttempts(t, a) == 5 && channelAttempts(t, b) == 5 }) {
		t.Fatalf("fleet totals: a shows %d, b shows %d, want 5 each", channelAttempts(t, a), channelAttempts(t, b))
	}

	res, err := gatewayClient.Get(b.gatewayURL() + "/status")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("page: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	for _, want := range []string{"Fleet status", "gpt-fleet", "shared"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Contains(string(page), up.URL) {
		t.Error("the page shows the upstream's URL")
	}

	// A restart of a: its memory is gone, the store is not.
	a.stop()
	a.start()
	if got := channelAttempts(t, a); got != 5 {
		t.Fatalf("after restarting a: %d attempts, want 5", got)
	}
}
