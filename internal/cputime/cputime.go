// Package cputime reads the CPU time this process has used, for
// benchmarks that report it per operation: unlike wall time, it leaves
// out what a busy machine gives other processes.
package cputime

import (
	"syscall"
	"time"
)

// Process is the user and system CPU time this process has used. It is 0
// if the kernel cannot say, which getrusage(RUSAGE_SELF) only does for a
// bad pointer.
func Process() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
