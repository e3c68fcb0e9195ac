package streamgate_test

import (
	"fmt"
	"github.com/llmfailover/caddy-llm-failover/internal/shapes"
	. "github.com/llmfailover/caddy-llm-failover/streamgate"
	"reflect"
	"strings"
	"testing"
	"time"
)

type rec struct {
	Name, Data, ID string
	Overflow       bool
}

func collect(chunks ...string) []rec {
	var p Parser
	var out []rec
	for _, c := range chunks {
		p.Feed([]byte(c), func(ev Event) {
			out = append(out, rec{ev.Name, string(ev.Data), ev.ID, ev.Overflow})
		})
	}
	return out
}

// feedSplit feeds s in pieces of the given sizes (cycling), as a network
// would deliver it.
func feedSplit(s string, sizes ...int) []rec {
	var chunks []string
	for i, k := 0, 0; i < len(s); k++ {
		n := min(sizes[k%len(sizes)], len(s)-i)
		chunks = append(chunks, s[i:i+n])
		i += n
	}
	return collect(chunks...)
}

func TestParserLineEndings(t *testing.T) {
	want := []rec{{"a", "1", "", false}, {"", "2", "", false}}
	for _, in := range []string{
		"event: a\ndata: 1\n\ndata: 2\n\n",
		"event: a\r\ndata: 1\r\n\r\ndata: 2\r\n\r\n",
		"event: a\rdata: 1\r\rdata: 2\r\r",
		"event: a\r\ndata: 1\n\rdata: 2\r\n\n",
	} {
		if got := collect(in); !reflect.DeepEqual(got, want) {
			t.Errorf("%q: got %v, want %v", in, got, want)
		}
		for n := 1; n <= len(in); n++ {
			if got := feedSplit(in, n); !reflect.DeepEqual(got, want) {
				t.Errorf("%q split %d: got %v, want %v", in, n, got, want)
			}
		}
	}
}

func TestParserCRLFSplitAcrossChunks(t *testing.T) {
	// The LF of a CRLF arriving in the next chunk must not count as a
	// second (blank) line, or "data: 1" would be dispatched too early and
	// the event split in two.
	got := collect("data: 1\r", "\ndata: 2\r", "\n\r", "\n")
	want := []rec{{"", "1\n2", "", false}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestParserFields(t *testing.T) {
	in := ": comment\n" +
		"data\n\n" + // field without colon: empty data, dispatched
		"data:no-space\ndata:  two spaces\n\n" +
		"id: 7\nevent: x\ndata: a\n\n" +
		"data: b\n\n" + // id persists; event resets
		"id\ndata: c\n\n" + // id without value resets it
		"event: only\n\n" + // no data: not dispatched
		"retry: 1500\nfoo: bar\ndata: d\n\n" + // retry and unknown fields are ignored
		"id: bad\x00id\ndata: e\n\n" // ids with NUL are ignored
	want := []rec{
		{"", "", "", false},
		{"", "no-space\n two spaces", "", false},
		{"x", "a", "7", false},
		{"", "b", "7", false},
		{"", "c", "", false},
		{"", "d", "", false},
		{"", "e", "", false},
	}
	var p Parser
	var got []rec
	p.Feed([]byte(in), func(ev Event) { got = append(got, rec{ev.Name, string(ev.Data), ev.ID, false}) })
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
}

func TestParserBOM(t *testing.T) {
	in := "\xEF\xBB\xBFdata: 1\n\n\xEF\xBB\xBFdata: 2\n\n"
	// Only the leading BOM is stripped; a later one makes an unknown field.
	want := []rec{{"", "1", "", false}}
	for n := 1; n <= len(in); n++ {
		if got := feedSplit(in, n); !reflect.DeepEqual(got, want) {
			t.Errorf("split %d: got %v, want %v", n, got, want)
		}
	}
}

func TestParserMultilineAndUnterminated(t *testing.T) {
	var p Parser
	var got []string
	emit := func(ev Event) { got = append(got, string(ev.Data)) }
	p.Feed([]byte("data: a\ndata:\ndata: c\n\ndata: tail"), emit)
	if !reflect.DeepEqual(got, []string{"a\n\nc"}) {
		t.Fatalf("got %q", got)
	}
	var last string
	if !p.Finish(func(ev Event) { last = string(ev.Data) }) || last != "tail" {
		t.Fatalf("Finish: unterminated %q", last)
	}
	if len(got) != 1 {
		t.Fatal("Finish dispatched the unterminated event")
	}
	if p.Finish(nil) {
		t.Fatal("Finish after reset reports a pending event")
	}
	// A comment at EOF is not an event.
	p.Feed([]byte(": ping"), nil)
	if p.Finish(nil) {
		t.Fatal("partial comment counted as an event")
	}
}

func TestParserByteAtATime(t *testing.T) {
	in := "\xEF\xBB\xBF: hi\r\nevent: message_start\r\ndata: {\"type\":\"message_start\"}\r\n\r\n" +
		"event: ping\rdata: {\"type\": \"ping\"}\r\r" +
		"id: 1\ndata: {\"a\":\ndata: 1}\n\n: keep-alive\n\ndata: [DONE]\n\n"
	whole := collect(in)
	if len(whole) != 4 {
		t.Fatalf("whole: %v", whole)
	}
	if got := feedSplit(in, 1); !reflect.DeepEqual(got, whole) {
		t.Fatalf("byte at a time:\n%v\nwhole:\n%v", got, whole)
	}
	if got := feedSplit(in, 3, 1, 7, 2); !reflect.DeepEqual(got, whole) {
		t.Fatalf("mixed splits:\n%v\nwhole:\n%v", got, whole)
	}
}

func TestParserBoundaries(t *testing.T) {
	var p Parser
	chunk := []byte(": ping\n\ndata: a\n\nevent: x\ndata: b\r\n\r\ndata: partial")
	var spans [][2]int
	b := p.Feed(chunk, func(Event) { spans = append(spans, [2]int{p.EventStart(), p.EventEnd()}) })
	want := [][2]int{{8, 17}, {17, 37}}
	if !reflect.DeepEqual(spans, want) {
		t.Errorf("spans %v, want %v", spans, want)
	}
	if b != 37 {
		t.Errorf("boundary %d, want 37", b)
	}
	spans = nil
	b = p.Feed([]byte("\n\n"), func(Event) { spans = append(spans, [2]int{p.EventStart(), p.EventEnd()}) })
	if !reflect.DeepEqual(spans, [][2]int{{-1, 2}}) || b != 2 {
		t.Errorf("continued event: spans %v boundary %d", spans, b)
	}
	if b := p.Feed([]byte("data: x"), nil); b != -1 {
		t.Errorf("partial-only chunk boundary %d", b)
	}
}

func TestParserMaxEvent(t *testing.T) {
	p := Parser{MaxEvent: 16}
	var got []rec
	emit := func(ev Event) { got = append(got, rec{ev.Name, string(ev.Data), ev.ID, ev.Overflow}) }
	p.Feed([]byte("event: big\ndata: "+strings.Repeat("x", 40)+"\n\ndata: ok\n\n"), emit)
	p.Feed([]byte("data: "+strings.Repeat("y", 10)), emit)
	p.Feed([]byte(strings.Repeat("y", 30)+"\n\n"), emit)
	want := []rec{{"big", "", "", true}, {"", "ok", "", false}, {"", "", "", true}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if line, data := BufferCaps(&p); line > 64 || data > 64 {
		t.Fatalf("buffers grew past the bound: line %d data %d", line, data)
	}
}

func TestParserZeroCopyAllocs(t *testing.T) {
	var p Parser
	chunk := []byte("data: " + shapes.ChatContent + "\n\n")
	n := testing.AllocsPerRun(100, func() { p.Feed(chunk, func(Event) {}) })
	if n != 0 {
		t.Errorf("Feed of a whole event allocates %v times", n)
	}
	named := []byte("event: content_block_delta\ndata: " + shapes.AntBlockDelta + "\n\n")
	if n := testing.AllocsPerRun(100, func() { p.Feed(named, func(Event) {}) }); n != 0 {
		t.Errorf("Feed of a named event allocates %v times", n)
	}
}

func ExampleParser() {
	var p Parser
	emit := func(ev Event) { fmt.Printf("%s %s\n", ev.Name, ev.Data) }
	p.Feed([]byte("event: message_start\ndata: {}\r"), emit)
	p.Feed([]byte("\n\r\n: ping\n\n"), emit)
	// Output: message_start {}
}

// Lines ended by a lone CR (which the spec allows) cost what LF-ended ones
// do: the parser must not look for the next LF again at every CR, which
// made a chunk's cost grow with its square.
func TestParserCROnlyIsLinear(t *testing.T) {
	feedTime := func(chunk []byte) time.Duration {
		best := time.Duration(1 << 62)
		for range 3 {
			var p Parser
			p.MaxEvent = DefaultMaxEvent
			start := time.Now()
			p.Feed(chunk, func(Event) {})
			best = min(best, time.Since(start))
		}
		return best
	}
	for _, size := range []int{16 << 10, 256 << 10} {
		// Blank lines and comments, what a keep-alive sends: the least
		// work a line can take, so the search for the next LF is all.
		lf := []byte(strings.Repeat(":\n\n", size/3))
		cr := []byte(strings.Repeat(":\r\r", size/3))
		tl, tc := feedTime(lf), feedTime(cr)
		t.Logf("%d KiB: LF-ended %v, CR-ended %v (%.0fx)", size>>10, tl, tc, float64(tc)/float64(tl))
		if size == 256<<10 && tc > 4*tl+time.Millisecond {
			t.Errorf("a %d KiB chunk of CR-ended lines took %v, LF-ended %v", size>>10, tc, tl)
		}
	}
}
