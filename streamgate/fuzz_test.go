package streamgate_test

import (
	"bytes"
	"github.com/llmfailover/caddy-llm-failover/internal/shapes"
	"github.com/llmfailover/caddy-llm-failover/provider"
	. "github.com/llmfailover/caddy-llm-failover/streamgate"
	"io"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// refParse is a deliberately naive transcription of the WHATWG algorithm
// over the whole input, used as an oracle for the incremental Parser.
func refParse(in string) []rec {
	in = strings.TrimPrefix(in, "\xEF\xBB\xBF")
	var lines []string
	for {
		i := strings.IndexAny(in, "\r\n")
		if i < 0 {
			break // a final line without terminator is discarded
		}
		lines = append(lines, in[:i])
		if in[i] == '\r' && i+1 < len(in) && in[i+1] == '\n' {
			i++
		}
		in = in[i+1:]
	}
	var out []rec
	var data, name, id string
	has := false
	for _, l := range lines {
		if l == "" {
			if has {
				out = append(out, rec{name, strings.TrimSuffix(data, "\n"), id, false})
			}
			data, name, has = "", "", false
			continue
		}
		if l[0] == ':' {
			continue
		}
		field, value, found := strings.Cut(l, ":")
		if found {
			value = strings.TrimPrefix(value, " ")
		}
		switch field {
		case "data":
			data += value + "\n"
			has = true
		case "event":
			name = value
		case "id":
			if !strings.Contains(value, "\x00") {
				id = value
			}
		}
	}
	return out
}

// splitChunks cuts in into pieces whose sizes cycle through seed (a 0 byte
// stands for 1).
func splitChunks(in []byte, seed []byte) [][]byte {
	if len(seed) == 0 {
		seed = []byte{1}
	}
	var out [][]byte
	for i, k := 0, 0; i < len(in); k++ {
		n := min(max(int(seed[k%len(seed)]), 1), len(in)-i)
		out = append(out, in[i:i+n])
		i += n
	}
	return out
}

func parseChunks(chunks [][]byte) ([]rec, bool) {
	var p Parser
	var out []rec
	for _, c := range chunks {
		p.Feed(c, func(ev Event) { out = append(out, rec{ev.Name, string(ev.Data), ev.ID, ev.Overflow}) })
	}
	return out, p.Finish(nil)
}

func FuzzParser(f *testing.F) {
	f.Add([]byte("event: a\r\ndata: 1\r\n\r\ndata: 2\r\r"), []byte{3, 1, 7})
	f.Add([]byte("\xEF\xBB\xBFdata: x\n\n: c\nid: 1\ndata\n\n"), []byte{1})
	f.Fuzz(func(t *testing.T, in []byte, seed []byte) {
		whole, wp := parseChunks([][]byte{in})
		var bytewise [][]byte
		for i := range in {
			bytewise = append(bytewise, in[i:i+1])
		}
		one, op := parseChunks(bytewise)
		split, sp := parseChunks(splitChunks(in, seed))
		if !reflect.DeepEqual(whole, one) || !reflect.DeepEqual(whole, split) {
			t.Fatalf("events differ:\nwhole %+v\nbytes %+v\nsplit %+v", whole, one, split)
		}
		if wp != op || wp != sp {
			t.Fatalf("pending differs: %v %v %v", wp, op, sp)
		}
		if ref := refParse(string(in)); !(len(ref) == 0 && len(whole) == 0) && !reflect.DeepEqual(whole, ref) {
			t.Fatalf("differs from the reference algorithm:\ngot  %+v\nwant %+v", whole, ref)
		}
	})
}

type chunkReader struct {
	chunks [][]byte
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.chunks[0])
	if n == len(c.chunks[0]) {
		c.chunks = c.chunks[1:]
	} else {
		c.chunks[0] = c.chunks[0][n:]
	}
	return n, nil
}

// recDown is a Downstream that checks call order and keeps the bytes.
type recDown struct {
	mu        sync.Mutex
	committed bool
	body      bytes.Buffer
	bad       string
}

func (d *recDown) Commit() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.committed {
		d.bad = "Commit twice"
	}
	d.committed = true
	return nil
}

func (d *recDown) Write(p []byte) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.committed {
		d.bad = "Write before Commit"
	}
	return d.body.Write(p)
}

func (d *recDown) Flush() error { return nil }

// fuzzAPIs are the stream formats FuzzRelay picks from; the order keeps
// the seed corpus meaning what it did (0 generic, 1 chat, 2 responses, 3
// anthropic).
var fuzzAPIs = [...]provider.API{provider.Unknown, provider.OpenAIChat, provider.OpenAIResponses, provider.AnthropicMessages}

func FuzzRelay(f *testing.F) {
	f.Add([]byte("data: "+shapes.ChatRole+"\n\ndata: "+shapes.ChatContent+"\n\ndata: [DONE]\n\n"), []byte{5, 200, 1}, uint8(1), uint8(0))
	f.Add([]byte("event: message_start\ndata: {}\r\n\r\nevent: content_block_delta\rdata: x\r\rdata: cut"), []byte{2}, uint8(3), uint8(1))
	f.Add([]byte("data: "+shapes.ChatContent+"\n\ndata: "+shapes.ChatUsage+"\r\rdata: [DONE]\n\n"), []byte{9, 1}, uint8(1), uint8(3))
	f.Fuzz(func(t *testing.T, in []byte, seed []byte, dialect, mode uint8) {
		api := fuzzAPIs[dialect%uint8(len(fuzzAPIs))]
		// The JSON walker must survive arbitrary bytes, not only SSE.
		_ = api.CheckBody(in)
		api.Classify(Event{Name: string(seed), Data: in})
		opts := gate(api, Options{GateTimeout: time.Hour, IdleTimeout: time.Hour})
		if mode&1 != 0 {
			opts.MaxHeld = 64
		}
		dropping := mode&2 != 0
		if dropping {
			// Drop events by a content-derived rule so decisions vary.
			opts.Drop = func(ev Event) bool { return len(ev.Data)%3 == 0 }
		}
		dst := &recDown{}
		res := Relay(&chunkReader{chunks: splitChunks(in, seed)}, nil, dst, opts)
		if dst.bad != "" {
			t.Fatal(dst.bad)
		}
		body := dst.body.Bytes()
		if !res.Committed {
			if len(body) != 0 || dst.committed {
				t.Fatalf("not committed but wrote %q", body)
			}
			return
		}
		if res.Outcome == ClientGone || res.BytesSent > int64(len(body)) {
			t.Fatalf("res %+v with %d bytes", res, len(body))
		}
		sent, tail := body[:res.BytesSent], body[res.BytesSent:]
		if dropping {
			want := dropFiltered(in, opts.Drop)
			got, _ := parseChunks([][]byte{sent})
			if !reflect.DeepEqual(names(got), names(want)) {
				t.Fatalf("client sees\n%+v\nwant\n%+v", got, want)
			}
		} else if !bytes.HasPrefix(in, sent) {
			t.Fatalf("bytes sent are not the upstream's:\n%q\n%q", sent, in)
		} else if len(sent) < len(in) {
			// Only the unterminated tail of a stream cut mid-event may be
			// held back (it would reach an SDK as bad JSON): no whole
			// event of the upstream's is lost.
			got, _ := parseChunks([][]byte{sent})
			want, _ := parseChunks([][]byte{in})
			if res.Outcome != Truncated || !reflect.DeepEqual(got, want) {
				t.Fatalf("%v, and the client lost upstream bytes %q", res.Outcome, in[len(sent):])
			}
		}
		switch res.Outcome {
		case Truncated:
			tail = bytes.TrimPrefix(tail, []byte("\n\n"))
			if !bytes.Equal(tail, api.ErrorEvent(CodeTruncated, "upstream closed the stream before it was complete; the response is incomplete")) {
				t.Fatalf("appended %q", tail)
			}
		case Complete, UpstreamError:
			if res.Outcome == UpstreamError {
				// An unterminated error event is ended for the client.
				tail = bytes.TrimPrefix(tail, []byte("\n\n"))
			}
			if len(tail) != 0 {
				t.Fatalf("%v but appended %q", res.Outcome, tail)
			}
		default:
			t.Fatalf("unexpected outcome %v", res.Outcome)
		}
	})
}

// dropFiltered is what a client should see: the upstream's events minus the
// dropped ones.
func dropFiltered(in []byte, drop func(Event) bool) []rec {
	var p Parser
	var out []rec
	p.Feed(in, func(ev Event) {
		if !drop(ev) {
			out = append(out, rec{ev.Name, string(ev.Data), "", ev.Overflow})
		}
	})
	return out
}

// names drops IDs: cutting an event out also cuts its id line, which
// legitimately changes the last event ID seen later.
func names(rs []rec) []rec {
	out := make([]rec, len(rs))
	for i, r := range rs {
		out[i] = rec{Name: r.Name, Data: r.Data, Overflow: r.Overflow}
	}
	return out
}
