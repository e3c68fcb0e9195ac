package provider

import (
	"net/url"
	"strings"
	"testing"
)

func TestServed(t *testing.T) {
	for p, want := range map[string]bool{
		"/v1/chat/completions":            true,
		"/openai/v1/chat/completions/":    true,
		"/v1/messages/count_tokens":       true,
		"/v1/models":                      true,
		"/v1/responses":                   true,
		"/v1/fine_tuning/jobs":            false,
		"/v1/files/x/completions":         false,
		"/v1/fine_tuning/jobs/embeddings": false,
		"/":                               false,
		"/echo":                           false,
	} {
		if got := Served(p); got != want {
			t.Errorf("Served(%q) = %v, want %v", p, got, want)
		}
	}
}

func TestCheckPath(t *testing.T) {
	for p, ok := range map[string]bool{
		"/v1/chat/completions":             true,
		"/v1/chat.completions":             true,
		"/../../echo/v1/chat/completions":  false,
		"/v1/./chat/completions":           false,
		"/v1/%2e%2e/chat/completions":      false,
		"/v1/%2E./chat/completions":        false,
		"/v1/.%2e/chat/completions":        false,
		"/v1/chat%2fcompletions":           false,
		"/v1/chat%5ccompletions":           false,
		"/v1\\..\\chat":                    false,
		"/v1/%zz":                          false,
		"/v1/..":                           false,
		"/v1/chat/completions/.":           false,
		"/v1/chat/completions/...":         true,
		"/v1/chat/completions/..x":         true,
		"/v1/chat/completions?x=/../../..": true, // a query is not a path
	} {
		if p == "/v1/chat/completions?x=/../../.." {
			p = "/v1/chat/completions"
		}
		if got := CheckPath(p) == nil; got != ok {
			t.Errorf("CheckPath(%q) ok = %v, want %v", p, got, ok)
		}
	}
}

// FuzzCheckPath: a path CheckPath accepts, joined to a base path, never
// leaves the base path once an upstream resolves its dot segments.
func FuzzCheckPath(f *testing.F) {
	for _, s := range []string{"/v1/chat/completions", "/../x", "/%2e%2e/x", "/a/%2E/b", "/a%2f..%2fb", "/.%2E/"} {
		f.Add(s)
	}
	base, _ := url.Parse("https://up.example.com/base")
	f.Fuzz(func(t *testing.T, p string) {
		if !strings.HasPrefix(p, "/") || CheckPath(p) != nil {
			return
		}
		dec, err := url.PathUnescape(p)
		if err != nil {
			t.Fatalf("accepted a path that does not decode: %q", p)
		}
		joined := base.ResolveReference(&url.URL{Path: base.Path + dec})
		if !strings.HasPrefix(joined.Path, base.Path+"/") && joined.Path != base.Path {
			t.Fatalf("%q escapes the base path: %s", p, joined.Path)
		}
	})
}
