// Package binarytest holds what the suites that run the built Caddy binary
// (e2e, soak) share: how a missing prerequisite is reported, and how a
// started Caddy is known to be ready.
package binarytest

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

// Prerequisite skips t when something it needs is missing, except in CI,
// where a silent skip would make a broken setup look green.
func Prerequisite(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and a prerequisite is missing: %s", msg)
	}
	t.Skipf("skipping: %s", msg)
}

// Ready reports whether a started Caddy serves: its admin API at adminURL
// answers GET /config/ with 200, and its site's port on loopback accepts
// a connection.
func Ready(adminURL string, sitePort int) bool {
	c := http.Client{Timeout: time.Second}
	res, err := c.Get(adminURL + "/config/")
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return false
	}
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", sitePort), time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}
