package failover

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestEveryReasonHasARunbook: each reason operators are shown (the
// reasons list) and each breaker state has a page in docs/runbooks, and
// the list names every constant of type reason but outcomeOK.
func TestEveryReasonHasARunbook(t *testing.T) {
	declared, listed := reasonNames(t)
	for _, name := range declared {
		if !slices.Contains(listed, name) && name != "outcomeOK" {
			t.Errorf("%s is missing from reasons", name)
		}
	}
	names := []string{"state-closed", "state-open", "state-half_open", "state-parked"}
	for _, r := range reasons {
		names = append(names, string(r))
	}
	for _, n := range names {
		if _, err := os.Stat("../docs/runbooks/" + n + ".md"); err != nil {
			t.Errorf("no runbook for %q: %v", n, err)
		}
	}
}

// reasonNames finds the names of the package's constants of type reason,
// and the names the reasons list is written with.
func reasonNames(t *testing.T) (declared, listed []string) {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range pkgs {
		for _, f := range pkg.Files {
			ast.Inspect(f, func(n ast.Node) bool {
				vs, ok := n.(*ast.ValueSpec)
				if !ok {
					return true
				}
				if id, ok := vs.Type.(*ast.Ident); ok && id.Name == "reason" {
					for _, n := range vs.Names {
						declared = append(declared, n.Name)
					}
				}
				if len(vs.Names) == 1 && vs.Names[0].Name == "reasons" {
					for _, e := range vs.Values[0].(*ast.CompositeLit).Elts {
						listed = append(listed, e.(*ast.Ident).Name)
					}
				}
				return true
			})
		}
	}
	if len(declared) < 20 || len(listed) == 0 {
		t.Fatalf("found %d constants of type reason and %d listed: the parse no longer finds them", len(declared), len(listed))
	}
	return declared, listed
}
