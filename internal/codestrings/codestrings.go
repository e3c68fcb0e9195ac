// Package codestrings reads the string literals of the plugin's own code,
// for tests that check what the docs and alert rules quote (log messages,
// metric label values) is something the code can say.
package codestrings

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
)

// skip are the module's folders that are not the plugin: benchmarks, the
// soak, the end-to-end and SDK suites, the in-process tests, test data.
var skip = map[string]bool{"bench": true, "soak": true, "e2e": true, "sdktest": true, "integration": true, "testdata": true}

// Of returns every string literal of the non-test Go files under root
// (the module's root), the folders in skip and hidden ones left out.
func Of(root string) (map[string]bool, error) {
	lits := map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && (skip[d.Name()] || strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil {
					lits[s] = true
				}
			}
			return true
		})
		return nil
	})
	return lits, err
}
