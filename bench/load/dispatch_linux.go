package main

import (
	"runtime"
	"syscall"
	"time"
)

// prSetTimerSlack is prctl's PR_SET_TIMERSLACK: how late the kernel may
// wake this thread from a sleep (50 µs by default).
const prSetTimerSlack = 29

// clock sends the open loop's requests on time. Go's own timers wake a
// sleeping runtime with millisecond granularity (netpoll's epoll_wait
// takes milliseconds, and rounds anything under one up to one), so at
// 1,500 requests/s time.Sleep sends them late by up to a millisecond, in
// bursts: noise every target's latency carries. The clock instead sleeps
// on a thread of its own with nanosleep and a 1 µs timer slack, and wakes
// within microseconds of each due time. The runtime needs a second P
// meanwhile (the sleeping thread holds its P), so it asks for two.
type clock struct{}

func newClock() *clock {
	if runtime.GOMAXPROCS(0) < 2 {
		runtime.GOMAXPROCS(2)
	}
	runtime.LockOSThread()
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetTimerSlack, 1000, 0)
	return &clock{}
}

// sleepUntil returns at due or just after it.
func (*clock) sleepUntil(due time.Time) {
	for {
		d := time.Until(due)
		if d <= 0 {
			return
		}
		ts := syscall.NsecToTimespec(int64(d))
		_ = syscall.Nanosleep(&ts, nil)
	}
}

// release gives the thread back.
func (*clock) release() { runtime.UnlockOSThread() }
