//go:build !linux

package e2e

import "os/exec"

// setDeathSignal has no portable equivalent outside Linux; t.Cleanup still
// stops caddy on every normal exit.
func setDeathSignal(*exec.Cmd) {}
