package llmfailover

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// TestUpdateGolden rewrites the expected JSON of the adapt golden files
// from the current adapter when LLMF_UPDATE_GOLDEN=1; review the diff.
func TestUpdateGolden(t *testing.T) {
	if os.Getenv("LLMF_UPDATE_GOLDEN") != "1" {
		t.Skip("set LLMF_UPDATE_GOLDEN=1 to rewrite testdata/caddyfile_adapt")
	}
	files, _ := filepath.Glob("testdata/caddyfile_adapt/*.caddyfiletest")
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		parts := strings.SplitN(string(data), "----------", 2)
		if len(parts) == 2 && !strings.HasPrefix(strings.TrimSpace(parts[1]), "{") {
			continue // an expected error, written by hand
		}
		input := strings.TrimSpace(parts[0]) + "\n"
		out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(input), nil)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var pretty bytes.Buffer
		if err := json.Indent(&pretty, out, "", "\t"); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(input+"----------\n"+pretty.String()+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
