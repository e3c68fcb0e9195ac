package status

import (
	"html/template"
	"io/fs"
	"net/http"
	"strings"

	"github.com/llmfailover/caddy-llm-failover/docs"
)

// runbookText returns the runbook called name (with or without ".md");
// false for any name that is not one of the embedded files.
func runbookText(name string) ([]byte, bool) {
	name = strings.TrimSuffix(name, ".md")
	if name == "" || strings.ContainsAny(name, `/\`) || !fs.ValidPath(name) {
		return nil, false
	}
	b, err := docs.Runbooks.ReadFile("runbooks/" + name + ".md")
	return b, err == nil
}

// serveRunbook answers <status>/runbooks/<name> with the runbook as
// escaped text in a minimal HTML page (no external assets), or 404.
func serveRunbook(w http.ResponseWriter, name string) {
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	text, ok := runbookText(name)
	if !ok {
		h.Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte("no runbook by that name; the list is at runbooks/README\n"))
		return
	}
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'")
	h.Set("X-Frame-Options", "DENY")
	_ = runbookTemplate.Execute(w, map[string]string{"Name": strings.TrimSuffix(name, ".md"), "Text": string(text)})
}

var runbookTemplate = template.Must(template.New("runbook").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Runbook: {{.Name}}</title>
<style>body{margin:0 auto;max-width:860px;padding:16px;font:15px/1.5 system-ui,sans-serif}pre{white-space:pre-wrap;font:14px/1.5 ui-monospace,monospace}</style>
</head><body><p><a href="../">status page</a> · <a href="README">all runbooks</a></p>
<pre>{{.Text}}</pre>
</body></html>
`))
