package main

import (
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"
)

// TestCPUTreeSecondsCountsReapedChildren runs a child that burns CPU and
// exits: its time must move from nowhere into the parent's tree (the
// reaped children's cutime/cstime), as a PostgreSQL backend's does when
// it exits during a measured window.
func TestCPUTreeSecondsCountsReapedChildren(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	self := os.Getpid()
	// Own time first: read the other way round, a clock tick between the
	// two reads would make the tree look smaller than the process.
	own, err := cpuSeconds(self)
	if err != nil {
		t.Fatal(err)
	}
	before, err := cpuTreeSeconds(self)
	if err != nil {
		t.Fatal(err)
	}
	if before < own {
		t.Fatalf("tree %.2fs < the process's own %.2fs", before, own)
	}
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	child := (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	if child < 0.05 {
		t.Fatalf("the child used only %.3fs of CPU; the test needs a busier child", child)
	}
	ownAfter, _ := cpuSeconds(self)
	after, err := cpuTreeSeconds(self)
	if err != nil {
		t.Fatal(err)
	}
	// Ticks are 10 ms; allow two on each reading.
	if got := (after - before) - (ownAfter - own); got < child-0.04 {
		t.Errorf("the tree grew %.3fs besides the process's own, want at least the child's %.3fs", got, child)
	}
}

// TestCPUTreeSecondsCountsLiveChildren: a child still running counts
// with its own utime and stime.
func TestCPUTreeSecondsCountsLiveChildren(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; sleep 30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	// Wait until the loop is done: the child's CPU stops growing.
	var child float64
	for i := 0; i < 300; i++ {
		c, err := cpuSeconds(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if c >= 0.05 && c == child {
			break
		}
		child = c
		time.Sleep(50 * time.Millisecond)
	}
	// The process's own reading first: its time grows while the tree is
	// walked (the walk reads every /proc/N/stat), so read the other way
	// round the tree's own part would be the smaller one and could hide
	// the child's ticks (CI saw 0.44 s for a 0.46 s child).
	st, err := readStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	selfOnly := float64(st.utime+st.stime+st.cutime+st.cstime) / 100
	tree, err := cpuTreeSeconds(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if tree-selfOnly < child-0.02 {
		t.Errorf("the tree has %.3fs beyond the process and its reaped children, want the live child's %.3fs", tree-selfOnly, child)
	}
}
