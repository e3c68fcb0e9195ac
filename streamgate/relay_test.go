package streamgate_test

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/llmfailover/caddy-llm-failover/internal/shapes"
	"github.com/llmfailover/caddy-llm-failover/provider"
	. "github.com/llmfailover/caddy-llm-failover/streamgate"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeDown records the order of Commit/Write/Flush calls.
type fakeDown struct {
	mu        sync.Mutex
	ops       []string
	body      bytes.Buffer
	commitCh  chan struct{}
	failWrite int           // fail the n-th Write (1-based); 0 never
	writeLag  time.Duration // per-Write delay, a slow client
	lagAfter  int           // writeLag spares the first lagAfter Writes
	writes    int
}

func newFakeDown() *fakeDown { return &fakeDown{commitCh: make(chan struct{})} }

func (f *fakeDown) Commit() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, op := range f.ops {
		if op == "commit" {
			panic("Commit called twice")
		}
	}
	if len(f.ops) != 0 {
		panic("Commit after Write")
	}
	f.ops = append(f.ops, "commit")
	close(f.commitCh)
	return nil
}

func (f *fakeDown) Write(p []byte) (int, error) {
	f.mu.Lock()
	lag := f.writeLag
	if f.writes < f.lagAfter {
		lag = 0
	}
	f.mu.Unlock()
	time.Sleep(lag)
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.ops) == 0 {
		panic("Write before Commit")
	}
	f.writes++
	if f.writes == f.failWrite {
		return 0, errors.New("broken pipe")
	}
	f.ops = append(f.ops, "write:"+string(p))
	f.body.Write(p)
	return len(p), nil
}

func (f *fakeDown) Flush() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ops = append(f.ops, "flush")
	return nil
}

func (f *fakeDown) snapshot() ([]string, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.ops...), f.body.String()
}

func (f *fakeDown) committed() bool {
	select {
	case <-f.commitCh:
		return true
	default:
		return false
	}
}

// upstream is an io.Pipe body whose cancel behaves like a request context:
// the pending Read fails with the cause.
type upstream struct {
	pr     *io.PipeReader
	pw     *io.PipeWriter
	mu     sync.Mutex
	causes []error
	sent   bytes.Buffer
}

func newUpstream() *upstream {
	pr, pw := io.Pipe()
	return &upstream{pr: pr, pw: pw}
}

func (u *upstream) cancel(cause error) {
	u.mu.Lock()
	u.causes = append(u.causes, cause)
	u.mu.Unlock()
	u.pw.CloseWithError(cause)
}

func (u *upstream) cancelCauses() []error {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]error(nil), u.causes...)
}

// send writes s as one chunk; it returns once Relay has read all of it.
func (u *upstream) send(s string) {
	u.mu.Lock()
	u.sent.WriteString(s)
	u.mu.Unlock()
	_, _ = u.pw.Write([]byte(s))
}

func (u *upstream) close() { u.pw.Close() }

func (u *upstream) sentString() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.sent.String()
}

const waitLimit = 20 * time.Second // generous: the box is loaded

// relayWith runs Relay against a driven upstream and returns its result.
func relayWith(t *testing.T, dst *fakeDown, opts Options, drive func(u *upstream)) (Result, *upstream) {
	t.Helper()
	u := newUpstream()
	go drive(u)
	done := make(chan Result, 1)
	go func() { done <- Relay(u.pr, u.cancel, dst, opts) }()
	select {
	case res := <-done:
		u.pr.Close() // the caller owns src; this also unblocks the driver
		return res, u
	case <-time.After(waitLimit):
		t.Fatal("Relay did not return")
		return Result{}, nil
	}
}

func sse(data string) string { return "data: " + data + "\n\n" }

func antEv(name, data string) string { return "event: " + name + "\ndata: " + data + "\n\n" }

func TestRelayErrorFirstFrame(t *testing.T) {
	dst := newFakeDown()
	res, _ := relayWith(t, dst, gate(provider.OpenAIChat, Options{}), func(u *upstream) {
		u.send(sse(shapes.ChatError))
		u.send(sse(shapes.ChatContent)) // never read
	})
	ops, _ := dst.snapshot()
	if res.Outcome != UpstreamError || res.Committed || len(ops) != 0 {
		t.Fatalf("res %+v, ops %q", res, ops)
	}
	if string(res.ErrorData) != shapes.ChatError || res.Committed {
		t.Fatalf("ErrorData %q, CanFailover %v", res.ErrorData, !res.Committed)
	}
}

func TestRelayErrorAfterRoleChunk(t *testing.T) {
	dst := newFakeDown()
	res, _ := relayWith(t, dst, gate(provider.OpenAIChat, Options{}), func(u *upstream) {
		u.send(": OPENROUTER PROCESSING\n\n")
		u.send(sse(shapes.ChatRole))
		u.send(sse(shapes.ChatError))
	})
	if ops, _ := dst.snapshot(); res.Outcome != UpstreamError || len(ops) != 0 {
		t.Fatalf("res %+v, ops %q", res, ops)
	}
}

func TestRelayAnthropicErrorAfterPreamble(t *testing.T) {
	dst := newFakeDown()
	res, _ := relayWith(t, dst, gate(provider.AnthropicMessages, Options{}), func(u *upstream) {
		u.send(antEv("message_start", shapes.AntStart))
		u.send(antEv("ping", shapes.AntPing))
		u.send(antEv("error", shapes.AntError))
	})
	if ops, _ := dst.snapshot(); res.Outcome != UpstreamError || len(ops) != 0 || string(res.ErrorData) != shapes.AntError {
		t.Fatalf("res %+v, ops %q", res, ops)
	}
}

func TestRelayClosedEarly(t *testing.T) {
	dst := newFakeDown()
	res, _ := relayWith(t, dst, gate(provider.OpenAIResponses, Options{}), func(u *upstream) {
		u.send(antEv("response.created", shapes.RespCreated))
		u.pw.CloseWithError(errors.New("connection reset"))
	})
	if ops, _ := dst.snapshot(); res.Outcome != ClosedEarly || len(ops) != 0 || res.Err == nil || res.Committed {
		t.Fatalf("res %+v, ops %q", res, ops)
	}
}

func TestRelayContentCommitsAndFlushesPerEvent(t *testing.T) {
	dst := newFakeDown()
	events := []string{sse(shapes.ChatRole), sse(shapes.ChatContent), sse(shapes.ChatContent), sse(shapes.ChatFinish), sse(shapes.ChatUsage), sse("[DONE]")}
	res, u := relayWith(t, dst, gate(provider.OpenAIChat, Options{}), func(u *upstream) {
		for _, e := range events {
			u.send(e)
		}
		u.close()
	})
	ops, body := dst.snapshot()
	if res.Outcome != Complete || !res.Committed || res.Err != nil {
		t.Fatalf("res %+v", res)
	}
	if body != u.sentString() || res.BytesSent != int64(len(body)) {
		t.Fatalf("body differs from upstream:\n%q\n%q", body, u.sentString())
	}
	// The role chunk was held: it goes out at commit, with the first
	// content chunk, under one flush; after that each event is written and
	// flushed on its own.
	want := []string{"commit", "write:" + events[0], "write:" + events[1], "flush"}
	for _, e := range events[2:] {
		want = append(want, "write:"+e, "flush")
	}
	if fmt.Sprint(ops) != fmt.Sprint(want) {
		t.Fatalf("ops\n%q\nwant\n%q", ops, want)
	}
}

func TestRelaySlowFirstTokenWithinGate(t *testing.T) {
	dst := newFakeDown()
	res, u := relayWith(t, dst, gate(provider.AnthropicMessages, Options{GateTimeout: 10 * time.Second}), func(u *upstream) {
		u.send(antEv("message_start", shapes.AntStart))
		u.send(antEv("content_block_start", shapes.AntBlockStart))
		time.Sleep(150 * time.Millisecond)
		if dst.committed() {
			panic("committed on preamble alone")
		}
		u.send(antEv("content_block_delta", shapes.AntBlockDelta))
		u.send(antEv("content_block_stop", shapes.AntBlockStop))
		u.send(antEv("message_delta", shapes.AntMsgDelta))
		u.send(antEv("message_stop", shapes.AntMsgStop))
		u.close()
	})
	if _, body := dst.snapshot(); res.Outcome != Complete || body != u.sentString() || res.CommittedAtGate {
		t.Fatalf("res %+v body %q", res, body)
	}
}

func TestRelayGateExpiryCommits(t *testing.T) {
	dst := newFakeDown()
	res, u := relayWith(t, dst, gate(provider.OpenAIChat, Options{GateTimeout: 50 * time.Millisecond}), func(u *upstream) {
		u.send(sse(shapes.ChatRole))
		select {
		case <-dst.commitCh: // committed by the timer while Relay is blocked in Read
		case <-time.After(waitLimit):
			panic("gate timer did not commit")
		}
		u.send(sse(shapes.ChatContent))
		u.send(sse(shapes.ChatFinish))
		u.send(sse("[DONE]"))
		u.close()
	})
	ops, body := dst.snapshot()
	if res.Outcome != Complete || !res.Committed || !res.CommittedAtGate || body != u.sentString() {
		t.Fatalf("res %+v body %q", res, body)
	}
	if ops[0] != "commit" || ops[1] != "write:"+sse(shapes.ChatRole) || ops[2] != "flush" {
		t.Fatalf("ops %q", ops)
	}
}

func TestRelayGateExpiryFailover(t *testing.T) {
	dst := newFakeDown()
	res, u := relayWith(t, dst, gate(provider.OpenAIChat, Options{GateTimeout: 50 * time.Millisecond, GateFailover: true}), func(u *upstream) {
		u.send(sse(shapes.ChatRole)) // then nothing
	})
	ops, _ := dst.snapshot()
	if res.Outcome != GateTimeout || res.Committed || len(ops) != 0 {
		t.Fatalf("res %+v ops %q", res, ops)
	}
	if c := u.cancelCauses(); len(c) != 1 || c[0] != ErrGateTimeout {
		t.Fatalf("cancel causes %v", c)
	}
}

func TestRelayMaxHeldCommits(t *testing.T) {
	dst := newFakeDown()
	res, u := relayWith(t, dst, gate(provider.OpenAIChat, Options{MaxHeld: 600, GateTimeout: time.Hour}), func(u *upstream) {
		for !dst.committed() {
			u.send(sse(shapes.ChatRole)) // endless preamble
		}
		u.send(sse(shapes.ChatContent))
		u.send(sse("[DONE]"))
		u.close()
	})
	if _, body := dst.snapshot(); res.Outcome != Complete || body != u.sentString() {
		t.Fatalf("res %+v", res)
	}
}

// A stream cut after commit ends with the gateway's error event. A tail
// cut inside an event goes out, ended by a blank line, only when its data
// is whole JSON: half a JSON object would reach an SDK as an event of its
// own and throw before the error event was read.
func TestRelayCutAfterCommit(t *testing.T) {
	for _, tc := range []struct {
		name, tail, prefix string
		held               bool // the tail never reaches the client
	}{
		{"at boundary", "", "", false},
		{"mid line", `data: {"id":"x","choi`, "", true},
		{"mid event", "data: " + shapes.ChatContent + "\n", "\n\n", false},
		{"after CR", "data: " + shapes.ChatContent + "\r", "\n\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := newFakeDown()
			res, u := relayWith(t, dst, gate(provider.OpenAIChat, Options{}), func(u *upstream) {
				u.send(sse(shapes.ChatRole) + sse(shapes.ChatContent))
				u.send(sse(shapes.ChatContent))
				if tc.tail != "" {
					u.send(tc.tail)
				}
				u.close()
			})
			_, body := dst.snapshot()
			errEv := string(provider.OpenAIChat.ErrorEvent(CodeTruncated, ""))
			errEv = errEv[:strings.Index(errEv, `"message"`)]
			if res.Outcome != Truncated || !res.Committed {
				t.Fatalf("res %+v", res)
			}
			sent := u.sentString()
			if tc.held {
				sent = strings.TrimSuffix(sent, tc.tail)
			}
			if !strings.HasPrefix(body, sent+tc.prefix+errEv) {
				t.Fatalf("body %q\nwant upstream bytes, %q, then the error event", body, tc.prefix)
			}
			if strings.Count(body, CodeTruncated) != 1 || strings.Contains(body, "[DONE]") {
				t.Fatalf("body %q", body)
			}
			if res.BytesSent != int64(len(sent)) {
				t.Fatalf("BytesSent %d, want %d", res.BytesSent, len(sent))
			}
			// The client must see exactly the upstream events plus one error.
			var kinds []Kind
			var p Parser
			p.Feed([]byte(body), func(ev Event) { kinds = append(kinds, provider.OpenAIChat.Classify(ev)) })
			if kinds[len(kinds)-1] != ErrorFrame {
				t.Fatalf("client's last event is %v", kinds[len(kinds)-1])
			}
		})
	}
}

func TestRelayAnthropicCutBeforeMessageStop(t *testing.T) {
	dst := newFakeDown()
	res, _ := relayWith(t, dst, gate(provider.AnthropicMessages, Options{}), func(u *upstream) {
		u.send(antEv("message_start", shapes.AntStart))
		u.send(antEv("content_block_delta", shapes.AntBlockDelta))
		u.pw.CloseWithError(errors.New("unexpected EOF"))
	})
	_, body := dst.snapshot()
	if res.Outcome != Truncated || res.Err == nil || !strings.HasSuffix(body, string(provider.AnthropicMessages.ErrorEvent(CodeTruncated, "upstream closed the stream before it was complete; the response is incomplete"))) {
		t.Fatalf("res %+v body %q", res, body)
	}
}

func TestRelayStallAfterCommit(t *testing.T) {
	dst := newFakeDown()
	start := time.Now()
	res, u := relayWith(t, dst, gate(provider.OpenAIResponses, Options{IdleTimeout: 100 * time.Millisecond}), func(u *upstream) {
		u.send(antEv("response.created", shapes.RespCreated))
		u.send(antEv("response.output_text.delta", shapes.RespTextDelta))
		// then silence, connection kept open
	})
	if res.Outcome != Stalled || !errors.Is(res.Err, ErrIdleTimeout) {
		t.Fatalf("res %+v", res)
	}
	if time.Since(start) < 100*time.Millisecond {
		t.Fatal("stalled before IdleTimeout")
	}
	if c := u.cancelCauses(); len(c) == 0 || c[0] != ErrIdleTimeout {
		t.Fatalf("cancel causes %v", c)
	}
	_, body := dst.snapshot()
	if !strings.HasSuffix(body, "\n\n") || strings.Count(body, CodeStalled) != 1 || !strings.Contains(body, "event: error\ndata: {\"type\":\"error\",\"code\":\"stream_stalled\"") {
		t.Fatalf("body %q", body)
	}
}

func TestRelaySlowClientIsNotAStall(t *testing.T) {
	dst := newFakeDown()
	dst.writeLag = 150 * time.Millisecond
	res, u := relayWith(t, dst, gate(provider.OpenAIChat, Options{IdleTimeout: 50 * time.Millisecond}), func(u *upstream) {
		for range 4 {
			u.send(sse(shapes.ChatContent))
		}
		u.send(sse("[DONE]"))
		u.close()
	})
	if _, body := dst.snapshot(); res.Outcome != Complete || body != u.sentString() {
		t.Fatalf("res %+v", res)
	}
}

func TestRelayCleanEndWithoutDone(t *testing.T) {
	dst := newFakeDown()
	start := time.Now()
	res, u := relayWith(t, dst, gate(provider.OpenAIChat, Options{IdleTimeout: time.Hour}), func(u *upstream) {
		u.send(sse(shapes.ChatRole) + sse(shapes.ChatContent))
		u.send(sse(shapes.ChatFinish))
		u.send(sse(shapes.ChatUsage))
		u.close()
	})
	if _, body := dst.snapshot(); res.Outcome != Complete || body != u.sentString() || res.Err != nil {
		t.Fatalf("res %+v body %q", res, body)
	}
	if time.Since(start) > waitLimit/2 {
		t.Fatal("clean end was not prompt")
	}
}

func TestRelayUnterminatedDoneIsNormalEnd(t *testing.T) {
	dst := newFakeDown()
	res, u := relayWith(t, dst, gate(provider.OpenAIChat, Options{}), func(u *upstream) {
		u.send(sse(shapes.ChatContent) + "data: [DONE]")
		u.close()
	})
	if _, body := dst.snapshot(); res.Outcome != Complete || body != u.sentString() {
		t.Fatalf("res %+v body %q", res, body)
	}
}

func TestRelayMalformedAfterCommitPassesThrough(t *testing.T) {
	dst := newFakeDown()
	res, u := relayWith(t, dst, gate(provider.OpenAIChat, Options{}), func(u *upstream) {
		u.send(sse(shapes.ChatContent))
		u.send("data: {not json\xff\x00}\n\n")
		u.send("garbage without field\r\n\r\n")
		u.send(sse("[DONE]"))
		u.close()
	})
	if _, body := dst.snapshot(); res.Outcome != Complete || body != u.sentString() {
		t.Fatalf("res %+v body %q", res, body)
	}
}

func TestRelayInBandErrorAfterCommit(t *testing.T) {
	dst := newFakeDown()
	res, u := relayWith(t, dst, gate(provider.OpenAIChat, Options{}), func(u *upstream) {
		u.send(sse(shapes.ChatContent))
		u.send(sse(shapes.ChatError))
		u.close()
	})
	_, body := dst.snapshot()
	if res.Outcome != UpstreamError || !res.Committed || string(res.ErrorData) != shapes.ChatError {
		t.Fatalf("res %+v", res)
	}
	if body != u.sentString() {
		t.Fatalf("an error was appended after the upstream's own: %q", body)
	}
}

// Scrub rewrites every event that reaches the client, content and errors
// alike: held before commit, written after it, with or without Drop.
func TestRelayScrubsEveryEvent(t *testing.T) {
	const secret = "sk-secret-0123456789"
	content := sse(`{"choices":[{"index":0,"delta":{"content":"` + secret + `"}}]}`)
	errEvent := sse(`{"error":{"message":"key ` + secret + ` expired","type":"server_error"}}`)
	scrub := func(b []byte) []byte { return bytes.ReplaceAll(b, []byte(secret), []byte("[REDACTED]")) }
	want := strings.ReplaceAll(sse(shapes.ChatRole)+content+content+errEvent, secret, "[REDACTED]")
	for _, c := range []struct {
		name   string
		opts   Options
		chunks []string
	}{
		{"event per read", Options{Scrub: scrub}, []string{sse(shapes.ChatRole), content, content, errEvent}},
		{"with drop", Options{Scrub: scrub, Drop: isUsageOnly}, []string{sse(shapes.ChatRole), content, content, errEvent}},
		{"in the deciding chunk", Options{Scrub: scrub}, []string{sse(shapes.ChatRole) + content + content + errEvent}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dst := newFakeDown()
			res, _ := relayWith(t, dst, gate(provider.OpenAIChat, c.opts), func(u *upstream) {
				for _, ch := range c.chunks {
					u.send(ch)
				}
				u.close()
			})
			if _, body := dst.snapshot(); res.Outcome != UpstreamError || !res.Committed || body != want {
				t.Fatalf("res %+v\nbody %q\nwant %q", res, body, want)
			}
		})
	}
}

// An event split across reads, anywhere in the secret it holds, reaches
// the client scrubbed whole: no prefix of the secret goes out first.
func TestRelayScrubsAnEventSplitAcrossReads(t *testing.T) {
	const secret = "sk-secret-0123456789"
	content := sse(`{"choices":[{"index":0,"delta":{"content":"` + secret + `"}}]}`)
	errEvent := sse(`{"error":{"message":"key ` + secret + ` expired","type":"server_error"}}`)
	scrub := func(b []byte) []byte { return bytes.ReplaceAll(b, []byte(secret), []byte("[REDACTED]")) }
	for _, ev := range []string{content, errEvent} {
		want := strings.ReplaceAll(content+ev, secret, "[REDACTED]")
		for i := 1; i < len(ev); i++ {
			dst := newFakeDown()
			res, _ := relayWith(t, dst, gate(provider.OpenAIChat, Options{Scrub: scrub}), func(u *upstream) {
				u.send(content)
				u.send(ev[:i])
				u.send(ev[i:])
				u.close()
			})
			// (Truncated after content: the stream had no [DONE].)
			if _, body := dst.snapshot(); !res.Committed || !strings.HasPrefix(body, want) {
				t.Fatalf("split at %d: res %+v\nbody %q\nwant first %q", i, res, body, want)
			}
		}
	}
}

func isUsageOnly(ev Event) bool { return bytes.Contains(ev.Data, []byte(`"choices":[]`)) }

func TestRelayDropHidesUsageChunk(t *testing.T) {
	stream := ": keep-alive\n\n" + sse(shapes.ChatRole) + sse(shapes.ChatContent) + sse(shapes.ChatFinish) +
		"data: " + shapes.ChatUsage[:40] + "\r\ndata: " + shapes.ChatUsage[40:] + "\r\n\r\n" + ": after\n\n" + sse("[DONE]")
	want := strings.Replace(stream, "data: "+shapes.ChatUsage[:40]+"\r\ndata: "+shapes.ChatUsage[40:]+"\r\n\r\n", "", 1)
	// Multi-line data is joined with "\n", so the split usage chunk is
	// still recognised.
	for _, size := range []int{1, 3, 7, 64, len(stream)} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			dst := newFakeDown()
			var observed int
			res, _ := relayWith(t, dst, gate(provider.OpenAIChat, Options{Drop: isUsageOnly, Observe: func(Event) { observed++ }}), func(u *upstream) {
				for i := 0; i < len(stream); i += size {
					u.send(stream[i:min(i+size, len(stream))])
				}
				u.close()
			})
			_, body := dst.snapshot()
			if res.Outcome != Complete || body != want {
				t.Fatalf("res %+v\nbody %q\nwant %q", res, body, want)
			}
			if observed != 5 {
				t.Fatalf("observed %d events, want 5 (dropped ones included)", observed)
			}
			if res.BytesSent != int64(len(want)) {
				t.Fatalf("BytesSent %d", res.BytesSent)
			}
		})
	}
}

// A chunk that decides the stream goes to the client as it is, with the
// commit: one flush for the chunk, headers and all, whether events were
// dropped before or after the deciding one and whether the chunk ends
// inside an event.
func TestRelayDropDecidedInAChunk(t *testing.T) {
	usage := sse(shapes.ChatUsage)
	finish := sse(shapes.ChatFinish)
	for _, c := range []struct {
		name   string
		chunks []string
		want   string
	}{
		{"usage after the content", []string{sse(shapes.ChatRole) + sse(shapes.ChatContent) + usage + sse("[DONE]")},
			sse(shapes.ChatRole) + sse(shapes.ChatContent) + sse("[DONE]")},
		{"usage before the content", []string{": hi\n\n" + usage + sse(shapes.ChatContent) + sse("[DONE]")},
			": hi\n\n" + sse(shapes.ChatContent) + sse("[DONE]")},
		{"chunk ends inside an event", []string{sse(shapes.ChatContent) + finish[:20], finish[20:] + usage + sse("[DONE]")},
			sse(shapes.ChatContent) + finish + sse("[DONE]")},
	} {
		t.Run(c.name, func(t *testing.T) {
			dst := newFakeDown()
			res, _ := relayWith(t, dst, gate(provider.OpenAIChat, Options{Drop: isUsageOnly}), func(u *upstream) {
				for _, ch := range c.chunks {
					u.send(ch)
				}
				u.close()
			})
			ops, body := dst.snapshot()
			if res.Outcome != Complete || body != c.want {
				t.Fatalf("res %+v\nbody %q\nwant %q", res, body, c.want)
			}
			flushes := 0
			for _, op := range ops {
				if op == "flush" {
					flushes++
				}
			}
			if flushes != len(c.chunks) || ops[0] != "commit" || ops[len(ops)-1] != "flush" {
				t.Fatalf("want commit, then one flush a chunk: %q", ops)
			}
		})
	}
}

func TestRelayClientGone(t *testing.T) {
	dst := newFakeDown()
	dst.failWrite = 2
	res, u := relayWith(t, dst, gate(provider.OpenAIChat, Options{}), func(u *upstream) {
		for range 100 {
			u.send(sse(shapes.ChatContent))
		}
	})
	if res.Outcome != ClientGone || res.Err == nil || !res.Committed {
		t.Fatalf("res %+v", res)
	}
	if c := u.cancelCauses(); len(c) != 1 || c[0] != ErrClientGone {
		t.Fatalf("cancel causes %v", c)
	}
}

func TestRelayGenericEnds(t *testing.T) {
	dst := newFakeDown()
	res, _ := relayWith(t, dst, gate(provider.Unknown, Options{}), func(u *upstream) {
		u.send(sse(`{"x":1}`))
		u.close()
	})
	if res.Outcome != Complete {
		t.Fatalf("clean EOF: %+v", res)
	}
	dst = newFakeDown()
	res, _ = relayWith(t, dst, gate(provider.Unknown, Options{}), func(u *upstream) {
		u.send(sse(`{"x":1}`) + `data: {"x"`)
		u.close()
	})
	if res.Outcome != Truncated {
		t.Fatalf("EOF mid-event: %+v", res)
	}
}

func TestRelayObserveSeesPreambleAndContent(t *testing.T) {
	dst := newFakeDown()
	var names []string
	res, _ := relayWith(t, dst, gate(provider.AnthropicMessages, Options{Observe: func(ev Event) { names = append(names, ev.Name) }}), func(u *upstream) {
		u.send(antEv("message_start", shapes.AntStart) + antEv("ping", shapes.AntPing))
		u.send(antEv("content_block_delta", shapes.AntBlockDelta) + antEv("message_stop", shapes.AntMsgStop))
		u.close()
	})
	if res.Outcome != Complete || strings.Join(names, ",") != "message_start,ping,content_block_delta,message_stop" {
		t.Fatalf("res %+v names %v", res, names)
	}
}

// gate sets opts up for api's stream format, the way the handler does.
func gate(api provider.API, opts Options) Options {
	g := api.NewMeter().GateOptions()
	opts.Classify, opts.ErrorEvent, opts.EndsAtEOF = g.Classify, g.ErrorEvent, g.EndsAtEOF
	if opts.Observe == nil {
		opts.Observe = g.Observe // the meter's, whose walk Classify reuses
	}
	return opts
}

func TestStrings(t *testing.T) {
	want := []string{"complete", "upstream_error", "closed_early", "gate_timeout", "truncated", "stalled", "client_gone"}
	for i, w := range want {
		if got := Outcome(i).String(); got != w {
			t.Errorf("Outcome(%d) = %q, want %q", i, got, w)
		}
	}
	if Terminal.String() != "terminal" || Kind(9).String() != "kind(9)" {
		t.Error("Kind.String")
	}
}
