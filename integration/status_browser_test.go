package integration_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	fu "github.com/llmfailover/caddy-llm-failover/internal/faultupstream"
)

// The status page in a real browser: headless Chromium (Debian's
// chromium package, installed by .ci/run) loads it from the in-process
// Caddy, the test reads the rendered text, not the HTML source, and saves
// screenshots under artifacts/ (ignored by git) for a human to look at.

// chromiumPath finds the browser, failing under CI=true instead of
// skipping.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no chromium on PATH but CI=true: the browser test must not be skipped in CI; .ci/run installs it")
	}
	t.Skip("no chromium on PATH; apt-get install chromium")
	return ""
}

func TestStatusPageInBrowser(t *testing.T) {
	browser := chromiumPath(t)
	a := upstream(t, fu.Sequence(fu.OK(), fu.OK(), fu.Status(503, ""), fu.Status(503, ""), fu.Status(503, "")))
	b := upstream(t, fu.OKNamed("backup"))
	statusGateway(t, "br", a.URL, b.URL, "failures 3\n\t\t\tcooldown 5m")
	for range 8 {
		chatStatus(t, "brm")
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox,
		chromedp.Flag("headless", "new"), chromedp.WindowSize(1100, 900))
	alloc, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(alloc)
	defer cancel()
	ctx, cancel = context.WithTimeout(ctx, 60*time.Second)
	defer cancel()

	var text, publicText, runbookText string
	var full, phone, public []byte
	var wideBad, phoneBad, publicBad, runbookLinks []string
	steps := []struct {
		what    string
		actions []chromedp.Action
	}{
		{"the page at 1280 px", []chromedp.Action{
			chromedp.EmulateViewport(1280, 900),
			chromedp.Navigate(gatewayURL + "/status"),
			chromedp.Text("body", &text, chromedp.ByQuery),
			chromedp.Evaluate(layoutProblems, &wideBad),
			chromedp.FullScreenshot(&full, 100),
		}},
		{"the page at 390 px", []chromedp.Action{
			chromedp.EmulateViewport(390, 844),
			chromedp.Navigate(gatewayURL + "/status"),
			chromedp.Evaluate(layoutProblems, &phoneBad),
			chromedp.FullScreenshot(&phone, 100),
		}},
		{"the public page at 390 px", []chromedp.Action{
			chromedp.Navigate(gatewayURL + "/public"),
			chromedp.Text("body", &publicText, chromedp.ByQuery),
			chromedp.Evaluate(layoutProblems, &publicBad),
			chromedp.FullScreenshot(&public, 100),
		}},
		// A runbook the page links to, followed as a reader would.
		{"a runbook link", []chromedp.Action{
			chromedp.Navigate(gatewayURL + "/status"),
			chromedp.Click(`a[href="runbooks/state-open"]`, chromedp.ByQuery, chromedp.NodeVisible),
			chromedp.WaitReady(`body`, chromedp.ByQuery),
			chromedp.Text("body", &runbookText, chromedp.ByQuery),
			chromedp.Evaluate(`[...document.querySelectorAll('a[href]')].map(a => a.href)`, &runbookLinks),
		}},
	}
	for _, st := range steps {
		if err := chromedp.Run(ctx, st.actions...); err != nil {
			t.Fatalf("driving chromium (%s): %v", st.what, err)
		}
	}
	for name, bad := range map[string][]string{"1280 px": wideBad, "390 px": phoneBad, "public at 390 px": publicBad} {
		for _, b := range bad {
			t.Errorf("status page at %s: %s", name, b)
		}
	}
	if !strings.Contains(runbookText, "open") || len(runbookText) < 200 {
		t.Errorf("the state-open runbook did not render as a page:\n%s", runbookText)
	}
	for _, link := range runbookLinks {
		if !strings.HasPrefix(link, gatewayURL) {
			continue // links out of the gateway are not ours to check
		}
		if res, _ := getBody(t, link); res.StatusCode != 200 {
			t.Errorf("the runbook links to %s: %d", link, res.StatusCode)
		}
	}
	// Durations read as people write them, never as Go prints them.
	if d := regexp.MustCompile(`\b\d+h\d+m[\d.]+s\b|\b\d+m[\d.]+s\b|\b[\d.]+(ns|µs)\b|\b\d{5,} ms\b`).FindString(text); d != "" {
		t.Errorf("the page shows a raw duration %q", d)
	}
	for _, want := range []string{"Example gateway", "brm", "brA", "Down", "skipping it (breaker open) until", "breaker open", "Incidents", "channel brA open", "ongoing", "Last 90 days"} {
		if !strings.Contains(text, want) {
			t.Errorf("rendered page lacks %q:\n%s", want, text)
		}
	}
	for _, bad := range []string{"brA", "brB", a.Addr(), b.Addr(), "status-secret"} {
		if strings.Contains(publicText, bad) {
			t.Errorf("public page shows %q:\n%s", bad, publicText)
		}
	}
	if !strings.Contains(publicText, "brm") {
		t.Errorf("public page lacks the model:\n%s", publicText)
	}
	dir := "artifacts"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, png := range map[string][]byte{"status-page.png": full, "status-page-phone.png": phone, "status-page-public.png": public} {
		if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("screenshots in %s", dir)
}

// layoutProblems lists what a reader cannot read at the viewport's
// width: an element that sticks out of it (tables scroll inside their own
// box and are left out), or a status pill or figure label wrapped onto
// several lines.
const layoutProblems = `(() => {
	const vw = document.documentElement.clientWidth, bad = [];
	const name = el => el.tagName.toLowerCase() + (el.className ? '.' + el.className : '') + ' "' + (el.textContent || '').trim().slice(0, 40) + '"';
	if (document.documentElement.scrollWidth > vw + 1) bad.push('the page scrolls sideways: ' + document.documentElement.scrollWidth + ' px wide');
	for (const el of document.querySelectorAll('body *')) {
		if (el.closest('.scroll') || el.closest('svg')) continue;
		const r = el.getBoundingClientRect(), card = el.parentElement.closest('.card');
		const right = card ? card.getBoundingClientRect().right : vw;
		if (r.width > 0 && (r.right > right + 1 || r.left < -1)) bad.push(name(el) + ' is cut off (' + Math.round(r.left) + '..' + Math.round(r.right) + ', its box ends at ' + Math.round(right) + ' px)');
	}
	for (const el of document.querySelectorAll('.pill, .kv div > span, h2, h3')) {
		const lh = parseFloat(getComputedStyle(el).lineHeight) || 20;
		if (el.getBoundingClientRect().height > 2.5 * lh) bad.push(name(el) + ' wraps onto ' + Math.round(el.getBoundingClientRect().height / lh) + ' lines');
	}
	return bad;
})()`
