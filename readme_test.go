package llmfailover

import (
	"os"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// caddyfileBlocks returns the ```caddyfile blocks of a Markdown file.
func caddyfileBlocks(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	rest := string(data)
	for {
		_, after, ok := strings.Cut(rest, "```caddyfile\n")
		if !ok {
			return blocks
		}
		block, tail, ok := strings.Cut(after, "```")
		if !ok {
			t.Fatalf("%s: unterminated code block", path)
		}
		blocks = append(blocks, block)
		rest = tail
	}
}

// TestReadmeMinimalCaddyfileAdapts: the README's "A minimal Caddyfile" is
// what a new operator copies first; it must load as written.
func TestReadmeMinimalCaddyfileAdapts(t *testing.T) {
	blocks := caddyfileBlocks(t, "README.md")
	if len(blocks) == 0 {
		t.Fatal("no caddyfile block in README.md")
	}
	for _, b := range blocks {
		_, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(b), map[string]any{"filename": "README.md"})
		if err != nil {
			t.Errorf("README.md's Caddyfile does not adapt: %v\n%s", err, b)
		}
		for _, w := range warnings {
			// The README aligns its comments; caddy fmt would not.
			if !strings.Contains(w.Message, "not formatted") {
				t.Errorf("warning: %s", w)
			}
		}
	}
}
