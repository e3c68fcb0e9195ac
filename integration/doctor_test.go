package integration_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	"github.com/llmfailover/caddy-llm-failover/internal/fakeproviders"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// The doctor against fakes of each provider, one channel per
// misconfiguration real users hit, and one that is fine: each gets its
// verdict and the hint that says what to do.
func TestDoctorNamesEachMisconfiguration(t *testing.T) {
	az := fakeproviders.NewAzure("az-key", "gpt4o-prod")
	t.Cleanup(az.Close)
	gm := fakeproviders.NewGemini("gm-key")
	t.Cleanup(gm.Close)
	vertex := map[fakeproviders.Mode]*fakeproviders.Vertex{}
	sa := map[fakeproviders.Mode]string{}
	for _, m := range []fakeproviders.Mode{fakeproviders.QuotaZero, fakeproviders.ModelNotEnabled, fakeproviders.TokenRefused} {
		v := fakeproviders.NewVertex("proj-1", "us-east5", time.Hour)
		t.Cleanup(v.Close)
		v.SetMode(m)
		p, err := v.WriteServiceAccount(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		vertex[m], sa[m] = v, p
	}
	br := fakeproviders.NewBedrock("us-east-1", "AKIAFAKE", "fake-secret")
	t.Cleanup(br.Close)

	azure := func(name, opts string) string {
		return fmt.Sprintf("channel %s %s {\n provider azure {\n %s\n }\n}\n", name, az.URL, opts)
	}
	vertexCh := func(name string, m fakeproviders.Mode) string {
		return fmt.Sprintf("channel %s %s {\n provider vertex {\n project proj-1\n region us-east5\n credentials_file %s\n }\n}\n", name, vertex[m].URL, sa[m])
	}
	bedrock := func(name, secret string) string {
		return fmt.Sprintf("channel %s %s {\n provider bedrock {\n region us-east-1\n access_key_id AKIAFAKE\n secret_access_key %s\n }\n}\n", name, br.URL, secret)
	}
	gemini := func(name, base, key string) string {
		return fmt.Sprintf("channel %s %s {\n provider gemini {\n api_key %s\n }\n}\n", name, base, key)
	}
	routes := map[string]string{
		"azure-ok": "gpt4o-prod", "azure-badkey": "gpt4o-prod", "azure-nodeploy": "gpt4o-typo", "azure-oldversion": "gpt4o-prod",
		"gemini-badkey": "gemini-2.5-flash", "gemini-badbase": "gemini-2.5-flash",
		"vertex-quota": "claude-sonnet-4-5@20250929", "vertex-disabled": "claude-sonnet-4-5@20250929", "vertex-token": "claude-sonnet-4-5@20250929",
		"bedrock-profile": "anthropic.claude-sonnet-4-5-20250929-v1:0", "bedrock-badsecret": "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
	}
	cfg := azure("azure-ok", "api_key az-key") + azure("azure-badkey", "api_key az-wrong-key") +
		azure("azure-nodeploy", "api_key az-key") + azure("azure-oldversion", "api_key az-key\n api_version 2023-05-15") +
		gemini("gemini-badkey", gm.URL, "gm-wrong-key") + gemini("gemini-badbase", gm.URL+"/v1beta", "gm-key") +
		vertexCh("vertex-quota", fakeproviders.QuotaZero) + vertexCh("vertex-disabled", fakeproviders.ModelNotEnabled) +
		vertexCh("vertex-token", fakeproviders.TokenRefused) +
		bedrock("bedrock-profile", "fake-secret") + bedrock("bedrock-badsecret", "wrong-secret")
	for ch, up := range routes {
		cfg += fmt.Sprintf("model m-%s {\n route %s upstream_model %s\n}\n", ch, ch, up)
	}
	gateway(t, "%s", cfg)

	var out bytes.Buffer
	err := failoverapp.Command(&out, fmt.Sprintf("localhost:%d", adminPort), "doctor")
	if !errors.Is(err, failoverapp.ErrDoctorFound) || !strings.Contains(err.Error(), "in 10 of 11 channels") {
		t.Fatalf("doctor returned %v, want problems in 10 of 11 channels:\n%s", err, &out)
	}
	want := map[string][]string{
		"azure-ok":          {"azure-ok: ok  m-azure-ok as gpt4o-prod (openai_chat"},
		"azure-badkey":      {"FAIL", " 401 Access denied", "refused the credentials"},
		"azure-nodeploy":    {"FAIL", " 404 ", `no deployment named "gpt4o-typo"`},
		"azure-oldversion":  {"FAIL", " 404 ", "api_version v1"},
		"gemini-badkey":     {"FAIL", "API key not valid", "refused the credentials"},
		"gemini-badbase":    {"FAIL", " 404 ", "nothing answers at /v1beta/v1beta/openai/chat/completions", "drop any /v1"},
		"vertex-quota":      {"FAIL", " 429 Quota exceeded", "quota for this model is 0"},
		"vertex-disabled":   {"FAIL", " 400 ", "is not allowed to use Publisher Model", "not enabled", "Model Garden"},
		"vertex-token":      {"FAIL", "could not build the request", "Invalid JWT Signature", "credentials_file"},
		"bedrock-profile":   {"FAIL", " 400 ", "on-demand throughput", "us.anthropic.claude-sonnet-4-5-20250929-v1:0"},
		"bedrock-badsecret": {"FAIL", " 403 ", "signature", "refused the credentials"},
	}
	text := out.String()
	blocks := doctorBlocks(text)
	for ch, subs := range want {
		for _, s := range subs {
			if !strings.Contains(blocks[ch], s) {
				t.Errorf("%s: the doctor's output lacks %q:\n%s", ch, s, blocks[ch])
			}
		}
	}
	for _, secret := range []string{"az-key", "az-wrong-key", "gm-key", "gm-wrong-key", "wrong-secret", "PRIVATE KEY"} {
		if strings.Contains(text, secret) {
			t.Errorf("the doctor's output shows the secret %q", secret)
		}
	}

	// One channel, through --channel and the admin endpoint.
	out.Reset()
	if err := failoverapp.Command(&out, fmt.Sprintf("localhost:%d", adminPort), "doctor", "--channel", "azure-ok"); err != nil {
		t.Fatalf("doctor --channel azure-ok: %v\n%s", err, &out)
	}
	if code, body := brkAdmin(t, http.MethodPost, "/llm_failover/channels/nope/check"); code != http.StatusNotFound {
		t.Fatalf("check of an unknown channel: %d %s", code, body)
	}
	if code, body := brkAdmin(t, http.MethodGet, "/llm_failover/channels/azure-ok/check"); code != http.StatusMethodNotAllowed {
		t.Fatalf("GET check: %d %s", code, body)
	}
}

// doctorBlocks splits the doctor's output by channel: each channel's
// lines and the hints under them.
func doctorBlocks(text string) map[string]string {
	blocks := map[string]string{}
	var cur string
	for _, line := range strings.SplitAfter(text, "\n") {
		if name, _, ok := strings.Cut(line, ": "); ok && !strings.HasPrefix(line, " ") {
			cur = name
		}
		blocks[cur] += line
	}
	return blocks
}

// An upstream that echoes part of the channel's key in its refusal, as
// OpenAI does ("Incorrect API key provided: sk-proj-abc…wxyz"): the
// doctor masks it as a client's error would be, not only exact copies.
func TestDoctorMasksAnEchoedKey(t *testing.T) {
	const key = "sk-chan-Zq8vK2mP9xW4nR7tB3"
	up := upstream(t, fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, _ int64) {
		got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprintf(w, `{"error":{"message":"Incorrect API key provided: %s****%s. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","code":"invalid_api_key"}}`,
			got[:14], got[len(got)-4:])
	}))
	gateway(t, `
		channel echo %s {
			header Authorization "Bearer `+key+`"
		}
		model m {
			route echo
		}
	`, up.URL)
	code, body := brkAdmin(t, http.MethodPost, "/llm_failover/channels/echo/check")
	if code != http.StatusOK || !bytes.Contains(body, []byte("Incorrect API key")) {
		t.Fatalf("check: %d %s", code, body)
	}
	if bytes.Contains(body, []byte(key[:14])) {
		t.Errorf("the doctor's answer shows the channel's key: %s", body)
	}
}

// The doctor judges its answers as traffic is judged, plain and
// streamed: a channel that answers 200 with an error event inside its
// streams (the demo's "overloaded" channel), or with an error as its JSON
// body, fails the check, though its status is 200; it accepted any 2xx
// and never read the body. It checks an open channel too, and changes
// neither its breaker nor its history.
func TestDoctorJudgesAnswersAsTrafficDoes(t *testing.T) {
	errorInStream := upstream(t, fu.BehaviorFunc(func(w http.ResponseWriter, r *http.Request, n int64) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if bytes.Contains(body, []byte(`"stream":true`)) {
			fu.ErrorAfterPreamble().Serve(w, r, n)
			return
		}
		fu.OK().Serve(w, r, n)
	}))
	errorBody := upstream(t, fu.JSONErrorWith200())
	good := upstream(t, fu.OK())
	gateway(t, `
		channel drframe %s
		channel drbody %s
		channel drgood %s
		model drm {
			route drframe
			route drbody
			route drgood
		}
		breaker {
			failures 1
			cooldown 10m
		}
	`, errorInStream.URL, errorBody.URL, good.URL)
	check := func(name string) failoverapp.ChannelCheck {
		t.Helper()
		code, body := brkAdmin(t, http.MethodPost, "/llm_failover/channels/"+name+"/check")
		var c failoverapp.ChannelCheck
		if code != http.StatusOK || json.Unmarshal(body, &c) != nil || len(c.Routes) != 2 {
			t.Fatalf("check %s: %d %s", name, code, body)
		}
		return c
	}

	c := check("drframe")
	plain, streamed := c.Routes[0], c.Routes[1]
	if c.OK || !plain.OK || plain.Stream || streamed.OK || !streamed.Stream {
		t.Errorf("drframe: %+v; want the plain check ok and the streamed one failed", c)
	}
	if !strings.Contains(streamed.Problem, "its stream carried an error event") || !strings.Contains(streamed.Hint, "rate") {
		t.Errorf("drframe streamed: problem %q, hint %q", streamed.Problem, streamed.Hint)
	}

	c = check("drbody")
	for _, r := range c.Routes {
		if r.OK || !strings.Contains(r.Problem, "answered 200, but its body was an error") || !strings.Contains(r.Hint, "error_body") {
			t.Errorf("drbody (stream %v): %+v", r.Stream, r)
		}
	}
	if c.OK {
		t.Error("drbody passed the doctor")
	}
	if c := check("drgood"); !c.OK {
		t.Errorf("drgood: %+v", c)
	}

	// One client request takes drframe out of rotation (its error event
	// is a rate limit: parked): the doctor still checks it, and leaves
	// its breaker and its history as they were.
	res, _ := post(t, "/v1/chat/completions", fu.ChatRequest("drm", true))
	if res.StatusCode != 200 {
		t.Fatalf("client request: %d", res.StatusCode)
	}
	before := fetchStatus(t, adminURL+"/llm_failover/status")
	hits := errorInStream.Hits()
	check("drframe")
	if errorInStream.Hits() != hits+2 {
		t.Errorf("the doctor sent %d requests to the open channel, want 2", errorInStream.Hits()-hits)
	}
	after := fetchStatus(t, adminURL+"/llm_failover/status")
	if b, a := channelWindow(t, before, "drframe", "5m"), channelWindow(t, after, "drframe", "5m"); !reflect.DeepEqual(a, b) {
		t.Errorf("the doctor's checks were recorded: %+v, then %+v", b, a)
	}
	state := func(v statusJSON) string {
		for _, m := range v.Models {
			for _, ch := range m.Channels {
				if ch.Name == "drframe" {
					return ch.State
				}
			}
		}
		return ""
	}
	if b, a := state(before), state(after); b == "closed" || a != b {
		t.Errorf("drframe was %s before the doctor's checks and %s after; want it out of rotation, and unchanged", b, a)
	}
}

// The drill shows each fallback answer before the day it is needed: for
// each channel of a chain but the last, one request as if it had reached
// that channel and it failed. A fallback that is broken fails the drill;
// the drill's failovers are journaled (reason drill) and nothing else is
// recorded. The doctor notes a channel real traffic never got an answer
// from.
func TestDrillShowsEachFallback(t *testing.T) {
	first, second := upstream(t, fu.OK()), upstream(t, fu.OK())
	broken := upstream(t, fu.Status(503, ""))
	gateway(t, `
		channel dlA %s
		channel dlB %s
		channel dlC %s
		channel dlD %s
		model dlm {
			route dlA cost 1 1
			route dlB cost 2 2
			route dlC cost 3 3
		}
		model dlone {
			route dlD
		}
	`, first.URL, second.URL, broken.URL, first.URL)
	hits := [3]int64{first.Hits(), second.Hits(), broken.Hits()}
	code, body := brkAdmin(t, http.MethodPost, "/llm_failover/drill?model=dlm")
	var runs []failoverapp.DrillRun
	if code != http.StatusOK || json.Unmarshal(body, &runs) != nil || len(runs) != 2 {
		t.Fatalf("drill: %d %s", code, body)
	}
	path := func(r failoverapp.DrillRun) string {
		var s []string
		for _, st := range r.Path {
			s = append(s, st.Channel+" "+st.Outcome)
		}
		return strings.Join(s, ", ")
	}
	if r := runs[0]; r.Failed != "dlA" || !r.OK || path(r) != "dlA drill, dlB ok" {
		t.Errorf("drill of dlA: %+v, path %q", r, path(r))
	}
	// dlB failing leaves dlC, which is broken: the drill finds it.
	if r := runs[1]; r.Failed != "dlB" || r.OK || path(r) != "dlB drill, dlC status" || !strings.Contains(r.Problem, "every other channel failed") {
		t.Errorf("drill of dlB: %+v, path %q", r, path(r))
	}
	if got := [3]int64{first.Hits() - hits[0], second.Hits() - hits[1], broken.Hits() - hits[2]}; got != [3]int64{0, 1, 1} {
		t.Errorf("upstream requests %v; want none to a channel made to fail, one to each fallback", got)
	}
	// Only the failovers are journaled; the breakers and history are untouched.
	var d failoverapp.DecisionsAnswer
	if err := adminGet(t, "/llm_failover/decisions?model=dlm&reason=drill", &d); err != nil || d.Total != 2 {
		t.Errorf("journal: %+v %v; want the two drill failovers", d, err)
	}
	v := fetchStatus(t, adminURL+"/llm_failover/status")
	if w := channelWindow(t, v, "dlC", "5m"); w.Attempts != 0 {
		t.Errorf("the drill was recorded in dlC's history: %+v", w)
	}
	for _, m := range v.Models {
		for _, c := range m.Channels {
			if c.State != "closed" {
				t.Errorf("the drill changed %s's breaker: %s", c.Name, c.State)
			}
		}
	}
	// A model of one channel has nothing to fail over to.
	code, body = brkAdmin(t, http.MethodPost, "/llm_failover/drill?model=dlone")
	if code != http.StatusOK || json.Unmarshal(body, &runs) != nil || len(runs) != 1 || runs[0].OK || !strings.Contains(runs[0].Problem, "nothing to fail over to") {
		t.Errorf("drill of a one-channel model: %d %s", code, body)
	}
	if code, _ := brkAdmin(t, http.MethodPost, "/llm_failover/drill?model=nope"); code != http.StatusNotFound {
		t.Errorf("drill of an unknown model: %d", code)
	}
	// The CLI prints the paths, and exits non-zero on a broken fallback.
	var out bytes.Buffer
	err := failoverapp.Command(&out, fmt.Sprintf("localhost:%d", adminPort), "drill", "--model", "dlm")
	if !errors.Is(err, failoverapp.ErrDrillFailed) || !strings.Contains(out.String(), "ok   dlm, dlA made to fail: dlA drill -> dlB ok") ||
		!strings.Contains(out.String(), "FAIL dlm, dlB made to fail: dlB drill -> dlC status 503") {
		t.Errorf("CLI: %v\n%s", err, out.String())
	}

	// No client request ever got an answer from dlB: the doctor says so.
	if res, _ := post(t, "/v1/chat/completions", fu.ChatRequest("dlm", false)); res.StatusCode != 200 {
		t.Fatalf("client request: %d", res.StatusCode)
	}
	// An attempt is recorded once its answer is written.
	waitFor(t, 5*time.Second, "dlA's success in the history", func() bool {
		return channelWindow(t, fetchStatus(t, adminURL+"/llm_failover/status"), "dlA", "5m").Successes > 0
	})
	var c failoverapp.ChannelCheck
	if _, body := brkAdmin(t, http.MethodPost, "/llm_failover/channels/dlB/check"); json.Unmarshal(body, &c) != nil || !strings.Contains(c.Unexercised, "no client request got a successful answer from dlB") {
		t.Errorf("doctor on the never-used dlB: %s", body)
	}
	c = failoverapp.ChannelCheck{}
	if _, body := brkAdmin(t, http.MethodPost, "/llm_failover/channels/dlA/check"); json.Unmarshal(body, &c) != nil || c.Unexercised != "" {
		t.Errorf("doctor on dlA, which served: %s", body)
	}
}
