package docs

import (
	"os"
	"os/exec"
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
	out, err := exec.Command(promtool, "check", "rules", "alerts.yml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}

// TestAlertRulesFire runs alerts_test.yml, promtool's unit tests of the
// rules: each alert fires on the series of the situation it names (as
// Prometheus stores them after a scrape of Caddy's /metrics) and stays
// quiet in normal operation.
func TestAlertRulesFire(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool is not installed but CI=true: .ci/run must install Debian's prometheus package")
		}
		t.Skip("promtool not installed (apt-get install prometheus): docs/alerts_test.yml not run")
	}
	out, err := exec.Command(promtool, "test", "rules", "alerts_test.yml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}
