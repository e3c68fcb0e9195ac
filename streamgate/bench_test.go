package streamgate_test

import (
	"bytes"
	"io"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmfailover/caddy-llm-failover/internal/redact"
	"github.com/llmfailover/caddy-llm-failover/internal/shapes"
	"github.com/llmfailover/caddy-llm-failover/provider"
	. "github.com/llmfailover/caddy-llm-failover/streamgate"
)

type discardDown struct{ n int64 }

func (d *discardDown) Commit() error               { return nil }
func (d *discardDown) Write(p []byte) (int, error) { d.n += int64(len(p)); return len(p), nil }
func (d *discardDown) Flush() error                { return nil }

func chatStream(events int) (stream []byte, perEvent [][]byte) {
	var b bytes.Buffer
	add := func(s string) {
		start := b.Len()
		b.WriteString(s)
		perEvent = append(perEvent, b.Bytes()[start:b.Len()])
	}
	add(sse(shapes.ChatRole))
	for range events {
		add(sse(shapes.ChatContent))
	}
	add(sse(shapes.ChatFinish))
	add(sse(shapes.ChatUsage))
	add(sse("[DONE]"))
	return b.Bytes(), perEvent
}

// BenchmarkRelay measures per-event pass-through cost. "event-per-read"
// mirrors a streaming upstream (each Read returns one SSE event);
// "16KiB-reads" is a backlogged upstream; "short-in-one-read" is a short
// answer that arrives in one read, as a local upstream's often does (the
// chunk that decides the stream holds all of it). "/drop" hides the usage
// chunk, as the gateway does when it asked for usage the client did not.
// "/masked" scrubs every event for ten 48-byte keys, as the gateway does
// for the channels' credentials.
func BenchmarkRelay(b *testing.B) {
	stream, events := chatStream(1000)
	short, shortEvents := chatStream(20)
	for _, bc := range []struct {
		name   string
		stream []byte
		events int
		src    func() io.Reader
		opts   Options
	}{
		{"event-per-read", stream, len(events), func() io.Reader { return &chunkReader{chunks: append([][]byte(nil), events...)} }, gate(provider.OpenAIChat, Options{})},
		{"16KiB-reads", stream, len(events), func() io.Reader { return bytes.NewReader(stream) }, gate(provider.OpenAIChat, Options{})},
		{"event-per-read/drop", stream, len(events), func() io.Reader { return &chunkReader{chunks: append([][]byte(nil), events...)} }, gate(provider.OpenAIChat, Options{Drop: isUsageOnly})},
		{"16KiB-reads/drop", stream, len(events), func() io.Reader { return bytes.NewReader(stream) }, gate(provider.OpenAIChat, Options{Drop: isUsageOnly})},
		{"event-per-read/masked", stream, len(events), func() io.Reader { return &chunkReader{chunks: append([][]byte(nil), events...)} }, gate(provider.OpenAIChat, Options{Scrub: tenKeys.Bytes})},
		{"short-in-one-read", short, len(shortEvents), func() io.Reader { return bytes.NewReader(short) }, gate(provider.OpenAIChat, Options{})},
		{"short-in-one-read/drop", short, len(shortEvents), func() io.Reader { return bytes.NewReader(short) }, gate(provider.OpenAIChat, Options{Drop: isUsageOnly})},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.stream)))
			b.ReportAllocs()
			for b.Loop() {
				res := Relay(bc.src(), nil, &discardDown{}, bc.opts)
				if res.Outcome != Complete {
					b.Fatal(res.Outcome)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*bc.events), "ns/event")
		})
	}
}

func BenchmarkParserFeed(b *testing.B) {
	stream, events := chatStream(1000)
	b.Run("whole", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(stream)))
		var p Parser
		for b.Loop() {
			p.Feed(stream, func(Event) {})
		}
	})
	b.Run("event-per-chunk", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(stream)))
		var p Parser
		for b.Loop() {
			for _, e := range events {
				p.Feed(e, func(Event) {})
			}
		}
	})
}

type flushSignal struct {
	discardDown
	once sync.Once
	ch   chan struct{}
}

func (f *flushSignal) Flush() error { f.once.Do(func() { close(f.ch) }); return nil }

// BenchmarkIdleCommittedStreams reports the memory one committed stream
// costs while it waits on a silent upstream: read buffer, parser, timers,
// relay state, the goroutine's stack (and the test's io.Pipe, a few hundred
// bytes).
func BenchmarkIdleCommittedStreams(b *testing.B) {
	const streams = 1000
	first := []byte(sse(shapes.ChatRole) + sse(shapes.ChatContent))
	var perStream float64
	for b.Loop() {
		var before, after runtime.MemStats
		// Two cycles empty sync.Pool (and its victim cache), so every
		// stream's read buffer is counted rather than recycled from a
		// previous iteration.
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&before)

		pws := make([]*io.PipeWriter, streams)
		var wg sync.WaitGroup
		for i := range streams {
			pr, pw := io.Pipe()
			pws[i] = pw
			dst := &flushSignal{ch: make(chan struct{})}
			wg.Add(1)
			go func() {
				defer wg.Done()
				Relay(pr, func(err error) { pr.CloseWithError(err) }, dst, gate(provider.OpenAIChat, Options{IdleTimeout: time.Hour}))
			}()
			if _, err := pw.Write(first); err != nil {
				b.Fatal(err)
			}
			<-dst.ch // committed and flushed; next it blocks in Read
		}
		time.Sleep(20 * time.Millisecond)
		runtime.GC()
		runtime.ReadMemStats(&after)
		perStream = float64(int64(after.HeapInuse+after.StackInuse)-int64(before.HeapInuse+before.StackInuse)) / streams

		for _, pw := range pws {
			pw.Close()
		}
		wg.Wait()
	}
	b.ReportMetric(perStream, "bytes/stream")
}

func TestBenchStreamShape(t *testing.T) {
	stream, events := chatStream(3)
	if len(events) != 7 || !strings.HasSuffix(string(stream), "data: [DONE]\n\n") {
		t.Fatalf("%d events", len(events))
	}
}

// tenKeys masks ten channel keys of today's length.
var tenKeys = func() *redact.Secrets {
	var keys []string
	for i := range 10 {
		keys = append(keys, "Bearer sk-proj-"+strings.Repeat(string(rune('a'+i)), 40))
	}
	return redact.NewSecrets(keys...)
}()
