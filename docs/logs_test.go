package docs

import (
	"bufio"
	"github.com/llmfailover/caddy-llm-failover/internal/codestrings"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestLogMessagesAreTheCodes fails when operations.md's table of log
// messages names a message no code logs: an operator filtering on the
// documented text (msg == "...") must find it. Each message in the
// table's first column must be a string literal of the plugin's code,
// exactly.
func TestLogMessagesAreTheCodes(t *testing.T) {
	documented := loggedMessages(t, "operations.md")
	if len(documented) < 10 {
		t.Fatalf("found only %d messages in operations.md's log table: the harvest is broken", len(documented))
	}
	literals := codeStrings(t, "..")
	for _, m := range documented {
		if !literals[m] {
			t.Errorf("docs/operations.md documents the log message %q, which no code logs", m)
		}
	}
}

// loggedMessages reads the first column of the table under "Reading the
// logs" (| `message` | level | fields |).
func loggedMessages(t *testing.T, file string) []string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	row := regexp.MustCompile("^\\| `([^`]+)` \\| (debug|info|warn|error) \\|")
	var msgs []string
	in := false
	for sc := bufio.NewScanner(f); sc.Scan(); {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## Reading the logs"):
			in = true
		case in && strings.HasPrefix(line, "## "):
			return msgs
		case in:
			if m := row.FindStringSubmatch(line); m != nil {
				msgs = append(msgs, m[1])
			}
		}
	}
	return msgs
}

// codeStrings is every string literal of the module's non-test Go files,
// outside the benchmarks, the soak and the end-to-end suites.
func codeStrings(t *testing.T, root string) map[string]bool {
	t.Helper()
	lits, err := codestrings.Of(root)
	if err != nil {
		t.Fatal(err)
	}
	return lits
}
