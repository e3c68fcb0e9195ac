//go:build linux

package e2e

import (
	"os/exec"
	"syscall"
)

// setDeathSignal makes the kernel kill caddy if the test binary dies (a
// panic or a `go test -timeout`), so no gateway outlives its test.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
