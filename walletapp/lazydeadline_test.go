package walletapp

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestLazyDeadlineBehavesLikeWithDeadline(t *testing.T) {
	type key struct{}
	parent := context.WithValue(context.Background(), key{}, "v")

	// Waited on: it fires at its deadline.
	ctx, cancel := withLazyDeadline(parent, time.Now().Add(20*time.Millisecond))
	if ctx.Value(key{}) != "v" {
		t.Fatal("the parent's values are lost")
	}
	if err := ctx.Err(); err != nil {
		t.Fatalf("Err before the deadline = %v", err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done never closed at the deadline")
	}
	if err := ctx.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Err after the deadline = %v", err)
	}
	cancel()

	// Never waited on: Err still reports the deadline.
	ctx, cancel = withLazyDeadline(parent, time.Now().Add(5*time.Millisecond))
	time.Sleep(10 * time.Millisecond)
	if err := ctx.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Err past an unwatched deadline = %v", err)
	}
	cancel()
	<-ctx.Done()

	// Canceled: Done closes and a derived context ends too.
	ctx, cancel = withLazyDeadline(parent, time.Now().Add(time.Hour))
	child, childCancel := context.WithCancel(ctx)
	defer childCancel()
	cancel()
	select {
	case <-child.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a derived context outlived the cancel")
	}
	if err := ctx.Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Err after cancel = %v", err)
	}

	// The parent's end and its earlier deadline count.
	p, pcancel := context.WithTimeout(parent, 10*time.Millisecond)
	ctx, cancel = withLazyDeadline(p, time.Now().Add(time.Hour))
	defer cancel()
	if d, _ := ctx.Deadline(); time.Until(d) > time.Second {
		t.Fatalf("deadline %v ignores the parent's", d)
	}
	pcancel()
	if err := ctx.Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Err after the parent's cancel = %v", err)
	}
}
