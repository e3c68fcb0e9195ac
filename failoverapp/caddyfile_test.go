package failoverapp

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
)

func TestGlobalOption(t *testing.T) {
	v, err := parseGlobalOption(caddyfile.NewTestDispenser(`llm_failover {
		history postgres {env.HISTORY_DSN}
		probe_leader postgres {env.LEADER_DSN}
		heartbeat prober https://hc.example/ping/1
		heartbeat history_flush https://hc.example/ping/2 {
			style generic
		}
		max_held_bytes 64MiB
	}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	app := v.(httpcaddyfile.App)
	var got App
	if err := json.Unmarshal(app.Value, &got); err != nil || app.Name != "llm_failover" {
		t.Fatalf("%s %s: %v", app.Name, app.Value, err)
	}
	if string(got.HistoryRaw) != `{"backend":"postgres","dsn":"{env.HISTORY_DSN}"}` || got.ProbeLeader == nil ||
		got.ProbeLeader.DSN != "{env.LEADER_DSN}" || len(got.Heartbeats) != 2 || got.Heartbeats[1].Style != "generic" ||
		got.MaxHeldBytes != 64<<20 {
		t.Fatalf("parsed %s", app.Value)
	}
	sqlite, err := parseGlobalOption(caddyfile.NewTestDispenser("llm_failover {\n history sqlite\n}"), nil)
	if err != nil || !strings.Contains(string(sqlite.(httpcaddyfile.App).Value), `"history":{"backend":"sqlite"}`) {
		t.Fatalf("bare sqlite: %v %v", sqlite, err)
	}

	for in, want := range map[string]string{
		"llm_failover {\n history\n}":                                   "history needs sqlite [<path>] or postgres <dsn>",
		"llm_failover {\n history mysql x\n}":                           `unknown store "mysql"`,
		"llm_failover {\n history postgres\n}":                          "history postgres needs a DSN",
		"llm_failover {\n history sqlite a b\n}":                        "wrong argument count",
		"llm_failover {\n probe_leader sqlite x\n}":                     "probe_leader needs: postgres <dsn>",
		"llm_failover {\n max_held_bytes lots\n}":                       "bad size",
		"llm_failover {\n max_held_bytes 1MiB\n max_held_bytes 2MiB\n}": "specified more than once",
		"llm_failover {\n heartbeat prober\n}":                          "heartbeat needs <job> <url>",
		"llm_failover {\n window 5m\n}":                                 "unrecognized llm_failover option 'window'",
		"llm_failover now {\n}":                                         "wrong argument count",
	} {
		if _, err := parseGlobalOption(caddyfile.NewTestDispenser(in), nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", in, err, want)
		}
	}
	if _, err := parseGlobalOption(caddyfile.NewTestDispenser("llm_failover {\n}"), httpcaddyfile.App{}); err == nil {
		t.Error("a second llm_failover option was accepted")
	}
}
