package caddykit

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// envPlaceholder matches {env.NAME}.
var envPlaceholder = regexp.MustCompile(`\{env\.([^{}]+)\}`)

// Resolve replaces the placeholders of a config value that may be a
// secret (a key, a DSN, a heartbeat URL) when the config loads. An
// {env.NAME} whose variable is unset or empty, or a value that resolves
// to nothing, is an error that names the variable and says what to do,
// never the value.
func Resolve(v string) (string, error) {
	var unset []string
	for _, m := range envPlaceholder.FindAllStringSubmatch(v, -1) {
		if os.Getenv(m[1]) == "" && !slices.Contains(unset, m[1]) {
			unset = append(unset, m[1])
		}
	}
	if len(unset) > 0 {
		verb := "is"
		if len(unset) > 1 {
			verb = "are"
		}
		return "", fmt.Errorf("the environment variable %s %s not set or empty: set it in the environment caddy runs in (it is read when the config loads)",
			strings.Join(unset, ", "), verb)
	}
	out, err := caddy.NewReplacer().ReplaceOrErr(v, true, true)
	switch {
	case err != nil:
		return "", fmt.Errorf("a placeholder that cannot be resolved when the config loads: only {env.*} and {file.*} can (%w)", err)
	case out == "":
		return "", errors.New("the value is empty")
	}
	return out, nil
}
