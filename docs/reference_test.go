package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// caddyfileSources are the files whose functions read the Caddyfile.
var caddyfileSources = []string{
	"../caddyfile.go", "../failoverapp/caddyfile.go", "../walletapp/caddyfile.go", "../status/page.go",
	"../internal/caddykit/caddykit.go", "../internal/caddykit/jobs.go", "../provider/*.go",
}

// TestReferenceHasEveryOption fails when the parser knows a directive,
// option or keyword the reference (configuration.md) does not name: every
// string a Caddyfile-reading function switches on, and every option of a
// provider's options map, must appear in it as a word in backticks or in
// one of its caddyfile blocks.
func TestReferenceHasEveryOption(t *testing.T) {
	ref, err := os.ReadFile("configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	known := parserWords(t)
	if len(known) < 40 {
		t.Fatalf("found only %d Caddyfile words in the parser: the harvest is broken", len(known))
	}
	var missing []string
	for w, where := range known {
		if !regexp.MustCompile(`(^|[^A-Za-z0-9_.-])` + regexp.QuoteMeta(w) + `($|[^A-Za-z0-9_-])`).Match(ref) {
			missing = append(missing, w+" ("+where+")")
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("docs/configuration.md does not name %s", m)
	}
}

// parserWords harvests the words the Caddyfile parsers accept: string
// literals in the case clauses of functions that take a
// *caddyfile.Dispenser (or are UnmarshalCaddyfile), and the keys of the
// map literals they pass their options in.
func parserWords(t *testing.T) map[string]string {
	t.Helper()
	words := map[string]string{}
	fset := token.NewFileSet()
	for _, pattern := range caddyfileSources {
		files, err := filepath.Glob(pattern)
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: %v", pattern, err)
		}
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, file, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, decl := range f.Decls {
				fn, ok := decl.(*ast.FuncDecl)
				if !ok || !readsCaddyfile(fn) {
					continue
				}
				ast.Inspect(fn.Body, func(n ast.Node) bool {
					switch n := n.(type) {
					case *ast.CaseClause:
						for _, e := range n.List {
							addLiteral(words, e, fset, fn)
						}
					case *ast.CompositeLit:
						if m, ok := n.Type.(*ast.MapType); ok && isString(m.Key) {
							for _, el := range n.Elts {
								if kv, ok := el.(*ast.KeyValueExpr); ok {
									addLiteral(words, kv.Key, fset, fn)
								}
							}
						}
					}
					return true
				})
			}
		}
	}
	return words
}

func readsCaddyfile(fn *ast.FuncDecl) bool {
	if fn.Name.Name == "UnmarshalCaddyfile" {
		return true
	}
	for _, p := range fn.Type.Params.List {
		if star, ok := p.Type.(*ast.StarExpr); ok {
			if sel, ok := star.X.(*ast.SelectorExpr); ok && sel.Sel.Name == "Dispenser" {
				return true
			}
		}
		if sel, ok := p.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Helper" {
			return true
		}
	}
	return false
}

func isString(e ast.Expr) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == "string"
}

func addLiteral(words map[string]string, e ast.Expr, fset *token.FileSet, fn *ast.FuncDecl) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return
	}
	s, err := strconv.Unquote(lit.Value)
	if err != nil || s == "" || strings.ContainsAny(s, " {}") {
		return
	}
	p := fset.Position(lit.Pos())
	words[s] = filepath.Base(p.Filename) + " " + fn.Name.Name
}
