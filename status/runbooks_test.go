package status

import (
	"os"
	"strings"
	"testing"
)

func FuzzRunbookText(f *testing.F) {
	for _, s := range []string{"state-open", "README.md", "../go.mod", "", "a/b", `..\x`, "."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		text, ok := runbookText(name)
		if !ok {
			return
		}
		n := strings.TrimSuffix(name, ".md")
		want, err := os.ReadFile("../docs/runbooks/" + n + ".md")
		if err != nil || string(want) != string(text) || strings.ContainsAny(n, `/\`) {
			t.Fatalf("runbookText(%q) served something that is not docs/runbooks/%s.md", name, n)
		}
	})
}
