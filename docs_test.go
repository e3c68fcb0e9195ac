package llmfailover

import (
	"os"
	"os/exec"
	"regexp"
	"testing"
)

// TestAlertRules checks docs/alerts.yml with Prometheus's own checker.
// .ci/run installs promtool (Debian's prometheus package); elsewhere the
// test is skipped when it is missing, and says so.
func TestAlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool is not installed but CI=true: .ci/run must install Debian's prometheus package")
		}
		t.Skip("promtool not installed (apt-get install prometheus): docs/alerts.yml not checked")
	}
	out, err := exec.Command(promtool, "check", "rules", "docs/alerts.yml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}

// TestEveryReasonHasARunbook: each failure reason the hop loop can log
// (the reason* constants), each breaker state and each outcome the status
// page shows links to a page in docs/runbooks.
func TestEveryReasonHasARunbook(t *testing.T) {
	src, err := os.ReadFile("hop.go")
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"rate_limited", "client_gone", "truncated", "stalled", "no_working_channel",
		"state-closed", "state-open", "state-half_open", "state-parked", "probe_failed"}
	for _, m := range regexp.MustCompile(`(?m)^\s+reason\w+\s+=\s+"([a-z_]+)"`).FindAllSubmatch(src, -1) {
		names = append(names, string(m[1]))
	}
	if len(names) < 20 {
		t.Fatalf("found only %d reasons in hop.go: the pattern no longer matches", len(names))
	}
	for _, n := range names {
		if _, err := os.Stat("docs/runbooks/" + n + ".md"); err != nil {
			t.Errorf("no runbook for %q: %v", n, err)
		}
	}
}
