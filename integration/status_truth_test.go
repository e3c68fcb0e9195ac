package integration_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/failoverapp"
	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// The status page against what clients got, request by request: each test
// drives real traffic through the gateway and compares the page's models,
// incidents and /metrics with the answers the clients read.

// statusModel is the named model of the admin status JSON.
func statusModel(t *testing.T, v statusJSON, name string) (status string, windows map[string]failoverapp.WindowView) {
	t.Helper()
	for _, m := range v.Models {
		if m.Name == name {
			return m.Status, m.Windows
		}
	}
	t.Fatalf("no model %q on the status page", name)
	return "", nil
}

// modelIncidents are the page's incidents of the named model.
func modelIncidents(v statusJSON, name string) []failoverapp.IncidentView {
	var out []failoverapp.IncidentView
	for _, in := range v.Incidents {
		if in.Kind == "model" && in.Subject == name {
			out = append(out, in)
		}
	}
	return out
}

// requestsOf sums caddy_llm_failover_requests_total of model over every
// outcome.
func requestsOf(t *testing.T, model string) float64 {
	t.Helper()
	code, body := brkAdmin(t, http.MethodGet, "/metrics")
	if code != 200 {
		t.Fatalf("GET /metrics: %d", code)
	}
	prefix := `caddy_llm_failover_requests_total{model="` + model + `",`
	sum := 0.0
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(line[strings.LastIndexByte(line, ' ')+1:]), 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// One outage, one incident: a model whose only channel fails every
// request (each client gets the upstream's 503) has one "no working
// channel" incident from its first trip until the channel serves again,
// whether or not anyone read the status page meanwhile. A page view
// while the breaker is half-open by the clock (its cooldown over, its
// trial not yet sent) must not end the outage: the trial fails, the
// clients' errors go on, and a wallboard refreshing the page would
// otherwise cut one outage into as many incidents as it had cooldowns.
func TestStatusModelIncidentSurvivesAPageViewBetweenTrials(t *testing.T) {
	a := upstream(t, fu.Status(503, ""))
	name := uniqueName("inc")
	gateway(t, fmt.Sprintf(`
		channel %[1]sa %%s
		model %[1]sm {
			route %[1]sa
		}
		breaker {
			failures 1
			cooldown 300ms
		}
	`, name), a.URL)
	model := name + "m"
	for i := range 3 {
		if got := chatStatus(t, model); got != 503 {
			t.Fatalf("request %d: %d, want the upstream's 503", i, got)
		}
		// The cooldown ends: the next request is the channel's trial. The
		// page is read in between, as a wallboard does.
		time.Sleep(400 * time.Millisecond)
		fetchStatus(t, adminURL+"/llm_failover/status")
	}
	hits(t, a, 3)
	v := fetchStatus(t, adminURL+"/llm_failover/status")
	ins := modelIncidents(v, model)
	if len(ins) != 1 {
		t.Errorf("one outage (3 clients, 3 × 503, never a working channel) shows as %d model incidents: %+v", len(ins), ins)
	}
}

// A model whose only channel's trial hangs is down: none of its channels
// may be sent anything (the trial holds the channel's one trial slot),
// and every other client is refused with 503 meanwhile. The page must not
// read "operational" beside its own ongoing "no working channel"
// incident.
func TestStatusModelDownWhileItsOnlyTrialHangs(t *testing.T) {
	a := upstream(t, fu.NoHeaders())
	name := uniqueName("hangm")
	gateway(t, fmt.Sprintf(`
		channel %[1]sa %%s
		model %[1]sm {
			route %[1]sa
		}
		stream_header_timeout 2s
		breaker {
			failures 1
			cooldown 300ms
		}
	`, name), a.URL)
	model := name + "m"
	body := bytes.Replace(fu.ChatRequest("x", true), []byte(`"x"`), []byte(strconv.Quote(model)), 1)
	if res, _ := post(t, "/v1/chat/completions", body); res.StatusCode != 504 {
		t.Fatalf("first request: %d, want 504 (the header timeout)", res.StatusCode)
	}
	time.Sleep(400 * time.Millisecond) // the cooldown ends
	done := make(chan int)
	go func() {
		res, err := http.Post(gatewayURL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			done <- 0
			return
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		done <- res.StatusCode
	}()
	time.Sleep(300 * time.Millisecond) // the trial waits on the hanging channel
	res, _ := post(t, "/v1/chat/completions", body)
	v := fetchStatus(t, adminURL+"/llm_failover/status")
	status, _ := statusModel(t, v, model)
	ongoing := false
	for _, in := range modelIncidents(v, model) {
		ongoing = ongoing || in.Ongoing
	}
	<-done
	if res.StatusCode != 503 {
		t.Fatalf("a request during the trial: %d, want 503 (no channel may be sent it)", res.StatusCode)
	}
	if status != "down" {
		t.Errorf("during the hanging trial (clients refused with 503, model incident ongoing: %v) the model reads %q, want down",
			ongoing, status)
	}
}

// A model whose every request the wallet refuses (a price no balance can
// cover: the operator's mistake) is an outage its clients have. The page
// says its models show "what clients got, one count per client request",
// and requests_total "how each request ended for its client": both must
// count these requests, or the operator sees a model with no traffic at
// all while every client reads 402.
func TestStatusCountsRequestsTheWalletRefused(t *testing.T) {
	a := upstream(t, fu.OKNamed("a"))
	b := upstream(t, fu.OKNamed("b"))
	walletGateway(t, a, b)
	secret, _ := newWalletAccount(t, "acct", "1")
	_, w := statusModel(t, fetchStatus(t, adminURL+"/llm_failover/status"), "pricey")
	pageBefore := w["5m"].Attempts
	metricBefore := requestsOf(t, "pricey")
	for i := range 3 {
		res, body := post(t, "/v1/chat/completions", fu.ChatRequest("pricey", false), bearer(secret)...)
		if res.StatusCode != http.StatusPaymentRequired {
			t.Fatalf("request %d: %d %s, want 402", i, res.StatusCode, body)
		}
	}
	hits(t, a, 0)
	_, w = statusModel(t, fetchStatus(t, adminURL+"/llm_failover/status"), "pricey")
	if got := w["5m"].Attempts - pageBefore; got != 3 {
		t.Errorf("the status page counts %d of the 3 requests its clients were refused (402): %+v", got, w["5m"])
	}
	if got := requestsOf(t, "pricey") - metricBefore; got != 3 {
		t.Errorf("requests_total counts %v of the 3 requests refused with 402", got)
	}
}

// requests_total{outcome="served"} is how many requests were answered:
// an upstream's error passed back to the client (here a channel whose key
// is wrong answers 401 to every request) is not one. The page counts
// those requests as client errors, never as successes; /metrics must not
// read a model whose every client gets 401 as one serving all of them.
func TestRequestsTotalServedCountsNoPassedBackError(t *testing.T) {
	a := upstream(t, fu.Status(401, fu.OpenAIErrorBody("Incorrect API key provided", "invalid_request_error", "invalid_api_key")))
	name := uniqueName("pass")
	gateway(t, fmt.Sprintf(`
		channel %[1]sa %%s
		model %[1]sm {
			route %[1]sa
		}
	`, name), a.URL)
	model := name + "m"
	for i := range 3 {
		if got := chatStatus(t, model); got != 401 {
			t.Fatalf("request %d: %d, want the upstream's 401 passed back", i, got)
		}
	}
	_, w := statusModel(t, fetchStatus(t, adminURL+"/llm_failover/status"), model)
	if w["5m"].Successes != 0 || w["5m"].Client != 3 {
		t.Fatalf("page: %+v, want 3 client errors and no success", w["5m"])
	}
	if served, _ := brkMetric(t, `caddy_llm_failover_requests_total{model="`+model+`",outcome="served"}`); served != 0 {
		t.Errorf("requests_total counts %v of the 3 requests answered with the upstream's 401 as served", served)
	}
	if got := requestsOf(t, model); got != 3 {
		t.Errorf("requests_total counts %v requests, want 3", got)
	}
}

// A resumed stream's client had its first content when the first channel
// sent it, long before the stream stalled and was continued: the model's
// time to first content (what its clients waited) is that, not the time
// until the continuation's content, which is a second after here.
func TestStatusModelFirstContentOfAResumedStream(t *testing.T) {
	pieces := resumePieces()
	a := upstream(t, stallAfter(pieces, 20))
	b := upstream(t, fu.OKNamed("backup").WithPieces(pieces[20:]...))
	name := uniqueName("rttfc")
	gateway(t, fmt.Sprintf(`
		channel %[1]sa %%s
		channel %[1]sb %%s
		model %[1]sm {
			route %[1]sa cost 1 1
			route %[1]sb cost 2 2
		}
		stream_resume continue
		stream_idle_timeout 1s
	`, name), a.URL, b.URL)
	model := name + "m"
	s := streamPost(t, nil, "/v1/messages", resumeRequest(model), "", "anthropic-version", "2023-06-01")
	wantText(t, s, strings.Join(pieces, ""))
	first := s.at(" t00")
	if first < 0 || first > 500*time.Millisecond {
		t.Fatalf("the client's first content came after %s", first)
	}
	var w failoverapp.WindowView
	waitFor(t, 5*time.Second, "the request in the model's history", func() bool {
		_, ws := statusModel(t, fetchStatus(t, adminURL+"/llm_failover/status"), model)
		w = ws["5m"]
		return w.Attempts == 1
	})
	if w.Successes != 1 {
		t.Fatalf("model window %+v, want one served request", w)
	}
	if w.TTFTp95 > 500 {
		t.Errorf("the model's first content p95 reads %d ms; its one client had first content after %s", w.TTFTp95, first)
	}
}
