package streamgate_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/shapes"
	"github.com/llmfailover/caddy-llm-failover/provider"
	. "github.com/llmfailover/caddy-llm-failover/streamgate"
)

// Content stall detection (Options.StallFloor). The timings leave wide
// margins: they assert what happens and in which order, not how fast.

const stallFloor = 300 * time.Millisecond

var (
	antStart = antEv("message_start", shapes.AntStart)
	antDelta = antEv("content_block_delta", shapes.AntBlockDelta)
	antPing  = antEv("ping", shapes.AntPing)
	antStop  = antEv("message_stop", shapes.AntMsgStop)
)

// keepAlive sends ev every period for up to d, or until Relay stops
// reading (a cancel closes the pipe); it reports whether it lasted d.
func keepAlive(u *upstream, ev string, every, d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(every) {
		// Recorded before it is written, as send does: the relay may
		// deliver it, and the test compare, before Write returns.
		u.mu.Lock()
		u.sent.WriteString(ev)
		u.mu.Unlock()
		if _, err := u.pw.Write([]byte(ev)); err != nil {
			return false
		}
	}
	return true
}

func stallMessage(d time.Duration) string {
	return "upstream stalled: no content for " + d.String() + "; the response is incomplete"
}

// An upstream that goes on pinging but sends no content after commit is
// Stalled once StallFloor passes, though IdleTimeout never would be; with
// DeferBreak the error event is handed back, not written.
func TestRelayContentStallWhilePinging(t *testing.T) {
	for _, tc := range []struct {
		name    string
		gate    bool // committed by the gate timer, before any content
		preface string
	}{
		{"after content", false, antStart + antDelta},
		{"gate commit", true, antStart},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := newFakeDown()
			opts := Options{StallFloor: stallFloor, DeferBreak: true, IdleTimeout: time.Hour}
			if tc.gate {
				opts.GateTimeout = 50 * time.Millisecond
			}
			pingsFrom := make(chan time.Time, 1)
			res, u := relayWith(t, dst, gate(provider.AnthropicMessages, opts), func(u *upstream) {
				u.send(tc.preface)
				<-dst.commitCh
				pingsFrom <- time.Now()
				keepAlive(u, antPing, 50*time.Millisecond, waitLimit/2)
			})
			stalledAfter := time.Since(<-pingsFrom)
			if res.Outcome != Stalled || !res.Committed || !errors.Is(res.Err, ErrContentStall) || errors.Is(res.Err, ErrIdleTimeout) {
				t.Fatalf("res %+v", res)
			}
			if !strings.Contains(res.Err.Error(), "content") || stalledAfter < stallFloor {
				t.Fatalf("err %v after %v", res.Err, stalledAfter)
			}
			want := provider.AnthropicMessages.ErrorEvent(CodeStalled, stallMessage(stallFloor))
			if string(res.Deferred) != string(want) {
				t.Fatalf("deferred %q, want %q", res.Deferred, want)
			}
			_, body := dst.snapshot()
			if strings.Contains(body, CodeStalled) || !strings.HasPrefix(u.sentString(), body) || !strings.HasSuffix(body, "\n\n") {
				t.Fatalf("body %q", body)
			}
			if n := strings.Count(body, "event: ping"); n < 3 {
				t.Fatalf("only %d pings reached the client: bytes did not keep coming", n)
			}
			if c := u.cancelCauses(); len(c) != 1 || c[0] != ErrContentStall {
				t.Fatalf("cancel causes %v", c)
			}
		})
	}
}

// Without DeferBreak the error event, saying content stopped, is appended;
// SSE comments count no more than pings.
func TestRelayContentStallCommentsAppendsError(t *testing.T) {
	dst := newFakeDown()
	res, _ := relayWith(t, dst, gate(provider.OpenAIChat, Options{StallFloor: stallFloor}), func(u *upstream) {
		u.send(sse(shapes.ChatRole) + sse(shapes.ChatContent))
		keepAlive(u, ": keep-alive\n\n", 50*time.Millisecond, waitLimit/2)
	})
	_, body := dst.snapshot()
	want := string(provider.OpenAIChat.ErrorEvent(CodeStalled, stallMessage(stallFloor)))
	if res.Outcome != Stalled || !errors.Is(res.Err, ErrContentStall) || res.Deferred != nil || !strings.HasSuffix(body, want) {
		t.Fatalf("res %+v body %q", res, body)
	}
}

// A pause seen earlier raises the limit to StallFactor times it: after a
// 200ms gap (limit 1.6s) a 600ms pause is a slow model, not a stalled one.
func TestRelayContentStallAdaptsToEarlierPause(t *testing.T) {
	t.Run("longer pause later is tolerated", func(t *testing.T) {
		dst := newFakeDown()
		res, u := relayWith(t, dst, gate(provider.AnthropicMessages, Options{StallFloor: stallFloor, DeferBreak: true}), func(u *upstream) {
			u.send(antStart + antDelta)
			time.Sleep(200 * time.Millisecond)
			u.send(antDelta)
			if !keepAlive(u, antPing, 50*time.Millisecond, 600*time.Millisecond) {
				return
			}
			u.send(antDelta)
			u.send(antStop)
			u.close()
		})
		if _, body := dst.snapshot(); res.Outcome != Complete || res.Err != nil || res.Deferred != nil || body != u.sentString() {
			t.Fatalf("res %+v body %q", res, body)
		}
		time.Sleep(2 * stallFloor) // no timer may fire after Relay returned
		if c := u.cancelCauses(); len(c) != 0 {
			t.Fatalf("cancel causes %v", c)
		}
	})
	t.Run("the raised limit still ends a stall", func(t *testing.T) {
		dst := newFakeDown()
		pauseFrom := make(chan time.Time, 1)
		res, _ := relayWith(t, dst, gate(provider.AnthropicMessages, Options{StallFloor: stallFloor}), func(u *upstream) {
			u.send(antStart + antDelta)
			time.Sleep(200 * time.Millisecond)
			u.send(antDelta)
			pauseFrom <- time.Now()
			keepAlive(u, antPing, 50*time.Millisecond, waitLimit/2)
		})
		paused := time.Since(<-pauseFrom)
		if res.Outcome != Stalled || !errors.Is(res.Err, ErrContentStall) {
			t.Fatalf("res %+v", res)
		}
		// The message names the limit: 8 × the gap the relay saw, 1.6s
		// when it saw the first delta as soon as it was sent. A loaded
		// machine can deliver the first delta late and the second on
		// time, so the gap it sees may be a little shorter; 1.4s (a
		// 175ms gap) is still far above the 300ms floor, so the limit
		// was raised by the earlier pause.
		_, body := dst.snapshot()
		_, rest, ok := strings.Cut(body, "no content for ")
		d, _, ok2 := strings.Cut(rest, ";")
		if !ok || !ok2 {
			t.Fatalf("body %q", body)
		}
		limit, err := time.ParseDuration(d)
		if err != nil || limit < 1400*time.Millisecond || paused < limit {
			t.Fatalf("limit %v (%v), stalled after a pause of %v; body %q", limit, err, paused, body)
		}
	})
}

// With StallFloor 0 nothing changes: pings keep the stream alive, and only
// IdleTimeout (reset by any bytes) applies.
func TestRelayNoStallFloorPingsOnly(t *testing.T) {
	dst := newFakeDown()
	res, u := relayWith(t, dst, gate(provider.AnthropicMessages, Options{StallFactor: 8, IdleTimeout: 250 * time.Millisecond, DeferBreak: true}), func(u *upstream) {
		u.send(antStart + antDelta)
		if !keepAlive(u, antPing, 50*time.Millisecond, 4*stallFloor) {
			return
		}
		u.send(antDelta + antStop)
		u.close()
	})
	if _, body := dst.snapshot(); res.Outcome != Complete || res.Err != nil || body != u.sentString() {
		t.Fatalf("res %+v body %q", res, body)
	}
}

// Time spent writing to a slow client is not the upstream's stall, even
// when each write takes longer than StallFloor and the limit never grows
// beyond the longest gap (StallFactor 1): only the short waits in Read
// between contents count, not the writes. The commit's write is quick, so
// that the first gap, between the first two contents, cannot raise the
// limit above the floor: the slow writes come after it.
func TestRelaySlowClientIsNotAContentStall(t *testing.T) {
	const floor = 500 * time.Millisecond
	dst := newFakeDown()
	dst.writeLag, dst.lagAfter = floor+100*time.Millisecond, 1
	written := func(n int) { // until the client has all n deltas
		for {
			if _, body := dst.snapshot(); strings.Count(body, "event: content_block_delta") >= n {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	res, u := relayWith(t, dst, gate(provider.AnthropicMessages, Options{StallFloor: floor, StallFactor: 1, DeferBreak: true}), func(u *upstream) {
		u.send(antStart + antDelta)
		for i := range 4 {
			written(i + 1)
			time.Sleep(100 * time.Millisecond) // Relay waits in Read
			u.send(antDelta)
		}
		u.send(antStop)
		u.close()
	})
	if _, body := dst.snapshot(); res.Outcome != Complete || res.Err != nil || body != u.sentString() {
		t.Fatalf("res %+v body %q", res, body)
	}
	if c := u.cancelCauses(); len(c) != 0 {
		t.Fatalf("cancel causes %v", c)
	}
}

// Once the stream's normal end is seen no content is due: what trails it
// (a usage chunk, [DONE]) may take its time.
func TestRelayNoContentStallAfterEnd(t *testing.T) {
	dst := newFakeDown()
	res, u := relayWith(t, dst, gate(provider.OpenAIChat, Options{StallFloor: stallFloor, DeferBreak: true}), func(u *upstream) {
		u.send(sse(shapes.ChatRole) + sse(shapes.ChatContent))
		u.send(sse(shapes.ChatFinish))
		if !keepAlive(u, ": keep-alive\n\n", 50*time.Millisecond, 3*stallFloor) {
			return
		}
		u.send(sse(shapes.ChatUsage) + sse("[DONE]"))
		u.close()
	})
	if _, body := dst.snapshot(); res.Outcome != Complete || res.Err != nil || body != u.sentString() {
		t.Fatalf("res %+v body %q", res, body)
	}
}

// A complete stream reports its longest pause between content events,
// which a caller learns stall limits from.
func TestRelayReportsTheLongestContentGap(t *testing.T) {
	dst := newFakeDown()
	opts := Options{StallFloor: 5 * time.Second, IdleTimeout: time.Hour}
	res, _ := relayWith(t, dst, gate(provider.AnthropicMessages, opts), func(u *upstream) {
		u.send(antStart + antDelta)
		time.Sleep(50 * time.Millisecond)
		u.send(antDelta)
		time.Sleep(250 * time.Millisecond)
		u.send(antDelta)
		u.send(antStop)
		u.close()
	})
	if res.Outcome != Complete {
		t.Fatalf("res %+v", res)
	}
	if res.LongestGap < 250*time.Millisecond || res.LongestGap > waitLimit {
		t.Fatalf("longest gap %v, want the 250 ms pause", res.LongestGap)
	}
}
