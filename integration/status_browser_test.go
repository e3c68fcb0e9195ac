package integration_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
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

	var text, publicText string
	var full, phone, public []byte
	err := chromedp.Run(ctx,
		chromedp.Navigate(gatewayURL+"/status"),
		chromedp.Text("body", &text, chromedp.ByQuery),
		chromedp.FullScreenshot(&full, 100),
		chromedp.EmulateViewport(390, 844),
		chromedp.FullScreenshot(&phone, 100),
		chromedp.Navigate(gatewayURL+"/public"),
		chromedp.Text("body", &publicText, chromedp.ByQuery),
		chromedp.FullScreenshot(&public, 100),
	)
	if err != nil {
		t.Fatalf("driving chromium: %v", err)
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
