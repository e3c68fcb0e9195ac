package integration_test

import (
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// The status page's runbook links resolve to runbooks the gateway serves
// itself, escaped, with no external asset; an unknown name, or one that
// tries to leave the runbooks, is a 404.
func TestStatusServesRunbooks(t *testing.T) {
	a := upstream(t, fu.Status(503, ""))
	b := upstream(t, fu.OKNamed("backup"))
	prefix := uniqueName("rb")
	statusGateway(t, prefix, a.URL, b.URL, "failures 2\n\t\t\tcooldown 1m")
	for range 3 {
		chatStatus(t, prefix+"m")
	}
	_, page := getBody(t, gatewayURL+"/status")
	base := regexp.MustCompile(`<base href="([^"]+)">`).FindSubmatch(page)
	if base == nil || string(base[1]) != "/status/" {
		t.Fatalf("status page base: %q", base)
	}
	links := regexp.MustCompile(`href="(runbooks/[a-z_-]+)"`).FindAllSubmatch(page, -1)
	if len(links) == 0 {
		t.Fatalf("no runbook link on the page:\n%s", page)
	}
	for _, l := range links {
		url := gatewayURL + string(base[1]) + string(l[1])
		res, body := getBody(t, url)
		if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") {
			t.Fatalf("GET %s: %d %s", url, res.StatusCode, res.Header.Get("Content-Type"))
		}
		mustNotContain(t, body, "<script", "<link", "<img", "github.com")
	}

	// The text is the file's, escaped.
	want, err := os.ReadFile("../docs/runbooks/state-open.md")
	if err != nil {
		t.Fatal(err)
	}
	res, body := getBody(t, gatewayURL+"/status/runbooks/state-open")
	firstLine, _, _ := strings.Cut(string(want), "\n")
	mustContain(t, body, firstLine, "channels/&lt;name&gt;/reset")
	mustNotContain(t, body, "<name>")
	if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("CSP %q", csp)
	}
	if res, _ := getBody(t, gatewayURL+"/status/runbooks/state-open.md"); res.StatusCode != 200 {
		t.Errorf("with .md: %d", res.StatusCode)
	}

	for _, p := range []string{"/status/runbooks/no-such-reason", "/status/runbooks/", "/status/runbooks/..%2fREADME", "/status/runbooks/sub%2fREADME"} {
		if res, body := getBody(t, gatewayURL+p); res.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %d %q; want 404", p, res.StatusCode, body)
		}
	}
	// A path that leaves /status is not the status page's to answer at
	// all; whoever does must not serve the file.
	if res, body := getBody(t, gatewayURL+"/status/runbooks/%2e%2e%2f%2e%2e%2fgo.mod"); res.StatusCode < 400 || strings.Contains(string(body), "module ") {
		t.Errorf("traversal: %d %q", res.StatusCode, body)
	}
}
