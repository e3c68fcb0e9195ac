package llmfailover

import (
	"bufio"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestImportRules fails on any import the layout forbids (ARCHITECTURE.md,
// "Packages"): each package knows only what it needs, and nothing
// reaches back into the handler.
func TestImportRules(t *testing.T) {
	const mod = "github.com/llmfailover/caddy-llm-failover"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}|{{join .Imports " "}}|{{join .Deps " "}}`, mod+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	imports, deps := map[string][]string{}, map[string][]string{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Buffer(make([]byte, 1<<20), 1<<22)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), "|", 3)
		pkg := strings.TrimPrefix(strings.TrimPrefix(parts[0], mod), "/")
		imports[pkg], deps[pkg] = strings.Fields(parts[1]), strings.Fields(parts[2])
	}
	if len(imports) < 20 {
		t.Fatalf("go list found only %d packages", len(imports))
	}
	ours := func(p string) string {
		if p == mod {
			return ""
		}
		if rest, ok := strings.CutPrefix(p, mod+"/"); ok {
			return rest
		}
		return "external:" + p
	}
	// The packages of the plugin's Caddy modules and apps.
	modulePkgs := []string{"", "failover", "failoverapp", "status", "walletapp", "probe"}
	isCaddy := func(p string) bool { return strings.HasPrefix(p, "github.com/caddyserver/caddy/") }

	forbid := func(pkg string, direct bool, bad func(string) bool, why string) {
		t.Helper()
		list := imports[pkg]
		if !direct {
			list = deps[pkg]
		}
		if _, ok := imports[pkg]; !ok {
			t.Errorf("no package %q: the rule %q guards nothing", pkg, why)
			return
		}
		for _, p := range list {
			if bad(p) {
				t.Errorf("%s imports %s: %s", pkgName(pkg), p, why)
			}
		}
	}
	named := func(names ...string) func(string) bool {
		return func(p string) bool { return slices.Contains(names, ours(p)) }
	}

	for pkg, list := range imports {
		for _, p := range list {
			switch ours(p) {
			case "":
				t.Errorf("%s imports the handler module: nothing may", pkgName(pkg))
			case "integration", "e2e":
				t.Errorf("%s imports %s, a leaf", pkgName(pkg), p)
			}
		}
	}
	forbid("failoverapp", true, named("failover", "status"), "registrations come in, never a handler")
	forbid("status", true, named("failover", "probe"), "the page renders the app's read model only")
	forbid("probe", false, func(p string) bool { return named("failover", "failoverapp", "walletapp")(p) || isCaddy(p) },
		"the scheduler knows a probe target, never the handler, the app or Caddy")
	forbid("walletapp", true, named("failover", "failoverapp", "status", "probe", "provider"), "the wallet knows no handler and no LLM API")
	for _, pkg := range []string{"provider", "streamgate", "breaker", "chain", "wallet", "history", "history/store", "journal", "jobs", "idempotency", "idempotency/store", "latency"} {
		forbid(pkg, false, named(modulePkgs...), "a library never imports a module package")
	}
	for _, pkg := range []string{"streamgate", "breaker", "chain", "journal", "jobs", "idempotency", "latency"} {
		forbid(pkg, false, isCaddy, "it knows nothing of Caddy")
	}
	for pkg := range imports {
		if strings.HasPrefix(pkg, "internal/") {
			forbid(pkg, false, named(modulePkgs...), "internal packages serve the modules, never the other way round")
		}
	}
}

func pkgName(p string) string {
	if p == "" {
		return "the handler module"
	}
	return p
}
