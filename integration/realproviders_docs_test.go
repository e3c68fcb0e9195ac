package integration_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// Every Caddyfile of docs/providers.md is one of testdata/real_providers,
// and each adapts without error or warning.
func TestRealProviderCaddyfilesAdaptAndAreInTheDocs(t *testing.T) {
	readme, err := os.ReadFile("../docs/providers.md")
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob("testdata/real_providers/*.caddyfile")
	if len(files) < 3 {
		t.Fatalf("%d Caddyfiles in testdata/real_providers", len(files))
	}
	for _, f := range files {
		body, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(readme), string(body)) {
			t.Errorf("docs/providers.md does not show %s as it is", f)
		}
		_, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(body, map[string]any{"filename": f})
		if err != nil || len(warnings) > 0 {
			t.Errorf("%s: %v %v", f, err, warnings)
		}
	}
}
