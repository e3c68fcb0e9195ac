package streamgate_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/shapes"
	"github.com/llmfailover/caddy-llm-failover/provider"
	. "github.com/llmfailover/caddy-llm-failover/streamgate"
)

// budget is a memory budget of limit bytes for Options.Hold.
type budget struct {
	mu         sync.Mutex
	limit      int64
	held, most int64
}

func (b *budget) hold(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held += n
	b.most = max(b.most, b.held)
	return b.held <= b.limit
}

func (b *budget) state() (held, most int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held, b.most
}

// A stream waiting for its first token counts what it holds, no more,
// and gives it all back when it commits, whichever way it ends.
func TestRelayHoldCountsWhatIsHeld(t *testing.T) {
	preamble := sse(shapes.ChatRole) + ": keep-alive\n\n"
	for _, tc := range []struct {
		name string
		then string
		want Outcome
	}{
		{"content", sse(shapes.ChatContent) + "data: [DONE]\n\n", Complete},
		{"error frame", sse(shapes.ChatError), UpstreamError},
		{"closed", "", ClosedEarly},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &budget{limit: 1 << 20}
			held := make(chan int64, 1)
			res, _ := relayWith(t, newFakeDown(), gate(provider.OpenAIChat, Options{Hold: b.hold}), func(u *upstream) {
				u.send(preamble)
				// Relay counts the chunk just after it has read it.
				var h int64
				for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
					if h, _ = b.state(); h == int64(len(preamble)) {
						break
					}
				}
				held <- h
				if tc.then != "" {
					u.send(tc.then)
				}
				u.close()
			})
			if res.Outcome != tc.want {
				t.Fatalf("outcome %v, want %v", res.Outcome, tc.want)
			}
			if h := <-held; h != int64(len(preamble)) {
				t.Errorf("held %d bytes of preamble, counted %d", len(preamble), h)
			}
			if h, _ := b.state(); h != 0 {
				t.Errorf("%d bytes still counted after Relay returned", h)
			}
		})
	}
}

// When the budget is spent, a held stream commits what it holds (as at
// MaxHeld) instead of holding more.
func TestRelayHoldCommitsWhenTheBudgetIsSpent(t *testing.T) {
	b := &budget{limit: 100}
	dst := newFakeDown()
	preamble := strings.Repeat(": keep-alive\n\n", 20) // 280 bytes, no content
	res, _ := relayWith(t, dst, gate(provider.OpenAIChat, Options{Hold: b.hold}), func(u *upstream) {
		u.send(preamble)
		u.send(sse(shapes.ChatContent) + "data: [DONE]\n\n")
		u.close()
	})
	if res.Outcome != Complete || !dst.committed() {
		t.Fatalf("outcome %v, committed %v", res.Outcome, dst.committed())
	}
	if _, body := dst.snapshot(); !strings.HasPrefix(body, preamble) {
		t.Fatalf("body %q", body)
	}
	if held, most := b.state(); held != 0 || most != int64(len(preamble)) {
		t.Fatalf("held %d at the end, %d at most", held, most)
	}
}

// panicDown is a client whose every Write panics, standing in for any
// bug that blows up a request as its stream commits.
type panicDown struct{ *fakeDown }

func (panicDown) Write([]byte) (int, error) { panic("boom") }

// A panic on the Relay goroutine (here the client's Write, as the held
// preamble goes out at commit) must still give back what the stream
// counted against the caller's budget: the budget is the process's, and
// bytes never given back shrink it for good.
func TestRelayPanicGivesBackWhatWasHeld(t *testing.T) {
	b := &budget{limit: 1 << 20}
	preamble := sse(shapes.ChatRole) + ": keep-alive\n\n"
	u := newUpstream()
	panicked := make(chan any, 1)
	go func() {
		defer func() { panicked <- recover() }()
		Relay(u.pr, u.cancel, panicDown{newFakeDown()}, gate(provider.OpenAIChat, Options{Hold: b.hold}))
	}()
	_, _ = u.pw.Write([]byte(preamble))
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if h, _ := b.state(); h == int64(len(preamble)) {
			break
		}
	}
	go func() { _, _ = u.pw.Write([]byte(sse(shapes.ChatContent))) }()
	select {
	case p := <-panicked:
		if p == nil {
			t.Fatal("Relay returned without the client's panic")
		}
	case <-time.After(waitLimit):
		t.Fatal("Relay did not return")
	}
	u.pr.Close()
	if h, most := b.state(); h != 0 {
		t.Fatalf("%d bytes (of %d at most) still counted after Relay panicked", h, most)
	}
}
