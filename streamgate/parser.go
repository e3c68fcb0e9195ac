package streamgate

import (
	"bytes"
)

// Event is one dispatched SSE event. Data (and the Event itself) is only
// valid during the callback that receives it: it may point into the chunk
// being fed, so a consumer that needs it later must copy it.
type Event struct {
	// Name is the value of the last "event:" field; "" stands for the
	// spec's default type "message".
	Name string
	Data []byte
	// ID is the last event ID in effect when the event was dispatched
	// (it persists across events, as the spec requires).
	ID string
	// Overflow is set when the event's data grew beyond Parser.MaxEvent;
	// its data was discarded to keep memory bounded, so Data is nil and
	// only Name and ID can be trusted.
	Overflow bool
}

var utf8BOM = []byte{0xEF, 0xBB, 0xBF}

// Parser is an incremental parser for text/event-stream as specified by the
// WHATWG HTML standard (section 9.2.6). Feed it chunks as they arrive; the
// split points may fall anywhere, including between the CR and LF of one
// line ending.
//
// Event data is handed out without copying when the whole event sits in one
// chunk and has a single data line, which is the common case for LLM
// streams; otherwise it is assembled in a buffer the Parser reuses.
//
// The zero value is ready to use.
type Parser struct {
	// MaxEvent bounds the bytes buffered for one line or one event's data
	// (0 means no bound). An upstream that never sends a line ending would
	// otherwise grow the buffer without limit.
	MaxEvent int

	line     []byte // partial line carried over from earlier chunks
	lineOver bool   // line exceeded MaxEvent; its tail was discarded

	data    []byte // data assembled across lines or chunks
	dataRef []byte // zero-copy data pointing into the current chunk
	hasData bool   // at least one data field since the last dispatch
	over    bool   // event data exceeded MaxEvent

	name      string
	nameCache string // last unknown event name, to avoid re-allocating it per event
	id        string

	dirty   bool // field lines seen since the last blank line
	started bool // first line seen (BOM handling)
	lastCR  bool // previous chunk ended in CR: a leading LF belongs to it

	lineStart int // offset of the current line in the chunk, -1 if it began earlier
	evStart   int
	evEnd     int
}

// shrinkAbove is the capacity beyond which reusable buffers are released
// after use, so one huge event does not pin memory for an idle stream.
const shrinkAbove = 64 << 10

// Feed parses chunk and calls emit for every event dispatched by it. emit
// may be nil.
//
// The result is the offset just past the last line ending in chunk at which
// no event is partially accumulated (a "clean boundary": after a blank line,
// or after a comment outside an event), or -1 if there is none. Bytes up to
// a clean boundary can be forwarded or dropped without splitting an event.
func (p *Parser) Feed(chunk []byte, emit func(Event)) int {
	boundary := -1
	if len(chunk) == 0 {
		return boundary
	}
	i := 0
	if p.lastCR {
		p.lastCR = false
		if chunk[0] == '\n' {
			i = 1
			if !p.dirty {
				boundary = 1
			}
		}
	}
	if p.dirty {
		p.evStart = -1
	}
	// nextLF is the offset in chunk of the next LF at or after i (-1:
	// none is left; -2: not looked for yet), found once and kept until a
	// line ends past it: lines ended by a lone CR must not search the
	// rest of the chunk again each, which made a chunk's cost quadratic.
	nextLF := -2
	for i < len(chunk) {
		rest := chunk[i:]
		// Scan for LF with the fast path first; CR-only endings are rare,
		// so look for CR only up to the LF.
		if nextLF == -2 || nextLF >= 0 && nextLF < i {
			if nextLF = bytes.IndexByte(rest, '\n'); nextLF >= 0 {
				nextLF += i
			}
		}
		lf := -1
		if nextLF >= 0 {
			lf = nextLF - i
		}
		seg := rest
		if lf >= 0 {
			seg = rest[:lf]
		}
		var k, tl int
		if cr := bytes.IndexByte(seg, '\r'); cr >= 0 {
			k, tl = cr, 1
			switch {
			case cr+1 == len(rest):
				p.lastCR = true
			case rest[cr+1] == '\n':
				tl = 2
			}
		} else if lf >= 0 {
			k, tl = lf, 1
		} else {
			p.appendLine(rest)
			break
		}
		end := i + k + tl
		if len(p.line) > 0 || p.lineOver {
			p.appendLine(rest[:k])
			p.lineStart = -1
			p.processLine(p.line, false, p.lineOver, end, emit)
			p.resetLine()
		} else {
			p.lineStart = i
			p.processLine(rest[:k], true, false, end, emit)
		}
		if !p.dirty {
			boundary = end
		}
		i = end
	}
	// A zero-copy reference must not outlive the chunk it points into.
	if p.dataRef != nil {
		p.data = append(p.data[:0], p.dataRef...)
		p.dataRef = nil
	}
	return boundary
}

// EventStart reports, during an emit callback, the offset in the chunk being
// fed at which the dispatched event's first line began, or -1 if it began
// in an earlier chunk.
func (p *Parser) EventStart() int { return p.evStart }

// EventEnd reports, during an emit callback, the offset in the chunk being
// fed just past the blank line that dispatched the event (including the LF
// of a CRLF when it is in the same chunk).
func (p *Parser) EventEnd() int { return p.evEnd }

// AtBoundary reports whether everything fed so far ends on a clean
// boundary: no partial line and no partially accumulated event.
func (p *Parser) AtBoundary() bool { return !p.dirty && len(p.line) == 0 && !p.lineOver }

// Finish ends the stream. Per the spec an event still being accumulated at
// end of stream is discarded, not dispatched; but because a caller needs to
// judge how the stream ended, Finish passes that unterminated event to
// inspect (if non-nil and the event has data) instead, processing a final
// line that lacks its line ending as if it had one. It reports whether
// there was an unterminated event at all. The parser is reset for reuse,
// keeping MaxEvent.
func (p *Parser) Finish(inspect func(Event)) bool {
	if len(p.line) > 0 || p.lineOver {
		p.lineStart = -1
		p.processLine(p.line, false, p.lineOver, -1, nil)
	}
	pending := p.dirty
	if pending && (p.hasData || p.over) && inspect != nil {
		inspect(p.event())
	}
	*p = Parser{MaxEvent: p.MaxEvent, line: p.line[:0], data: p.data[:0]}
	return pending
}

// LineLen is how many bytes of an unterminated line the parser holds
// (MaxEvent once the line grew past it).
func (p *Parser) LineLen() int { return len(p.line) }

// Buffered is how many bytes the parser holds of the line and the event
// in progress: its own copies, besides whatever its caller keeps of them.
func (p *Parser) Buffered() int { return len(p.line) + len(p.data) }

func (p *Parser) appendLine(b []byte) {
	if p.lineOver {
		return
	}
	if p.MaxEvent > 0 && len(p.line)+len(b) > p.MaxEvent {
		// Keep a prefix so the field name is still known.
		b = b[:max(0, min(len(b), p.MaxEvent-len(p.line)))]
		p.lineOver = true
	}
	p.line = append(p.line, b...)
}

func (p *Parser) resetLine() {
	p.lineOver = false
	if cap(p.line) > shrinkAbove {
		p.line = nil
		return
	}
	p.line = p.line[:0]
}

func (p *Parser) processLine(l []byte, fromChunk, overlong bool, end int, emit func(Event)) {
	if !p.started {
		p.started = true
		l = bytes.TrimPrefix(l, utf8BOM)
	}
	if len(l) == 0 {
		p.dispatch(end, emit)
		return
	}
	if l[0] == ':' {
		return
	}
	if !p.dirty {
		p.dirty = true
		p.evStart = p.lineStart
	}
	field, value := l, []byte(nil)
	if c := bytes.IndexByte(l, ':'); c >= 0 {
		field, value = l[:c], l[c+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(field) {
	case "data":
		if overlong {
			p.over = true
			p.hasData = true
			return
		}
		p.addData(value, fromChunk)
	case "event":
		if !overlong {
			p.name = p.internName(value)
		}
	case "id":
		if !overlong && bytes.IndexByte(value, 0) < 0 && string(value) != p.id {
			p.id = string(value)
		}
	}
}

func (p *Parser) addData(v []byte, fromChunk bool) {
	if p.over {
		return
	}
	if !p.hasData {
		p.hasData = true
		if fromChunk && (p.MaxEvent <= 0 || len(v) <= p.MaxEvent) {
			p.dataRef = v
			return
		}
		p.data = append(p.data[:0], v...)
	} else {
		if p.dataRef != nil {
			p.data = append(p.data[:0], p.dataRef...)
			p.dataRef = nil
		}
		p.data = append(p.data, '\n')
		p.data = append(p.data, v...)
	}
	if p.MaxEvent > 0 && len(p.data) > p.MaxEvent {
		p.over = true
		p.data = p.data[:0]
	}
}

func (p *Parser) event() Event {
	ev := Event{Name: p.name, ID: p.id}
	switch {
	case p.over:
		ev.Overflow = true
	case p.dataRef != nil:
		ev.Data = p.dataRef
	default:
		ev.Data = p.data
	}
	return ev
}

func (p *Parser) dispatch(end int, emit func(Event)) {
	p.evEnd = end
	p.dirty = false
	if (p.hasData || p.over) && emit != nil {
		emit(p.event())
	}
	p.hasData, p.over, p.dataRef, p.name = false, false, nil, ""
	if cap(p.data) > shrinkAbove {
		p.data = nil
	} else {
		p.data = p.data[:0]
	}
}

// internName returns the event name as a string without allocating for the
// names LLM providers actually send.
func (p *Parser) internName(v []byte) string {
	if s := knownName(v); s != "" {
		return s
	}
	if string(v) == p.nameCache {
		return p.nameCache
	}
	p.nameCache = string(v)
	return p.nameCache
}

// knownName maps the event and type names that LLM APIs send to constant
// strings (the switch on string(b) does not allocate), or "" if unknown.
func knownName(b []byte) string {
	switch string(b) {
	case "message":
		return "message"
	case "error":
		return "error"
	case "ping":
		return "ping"
	case "keepalive":
		return "keepalive"
	case "keep-alive":
		return "keep-alive"
	case "heartbeat":
		return "heartbeat"
	case "message_start":
		return "message_start"
	case "message_delta":
		return "message_delta"
	case "message_stop":
		return "message_stop"
	case "content_block_start":
		return "content_block_start"
	case "content_block_delta":
		return "content_block_delta"
	case "content_block_stop":
		return "content_block_stop"
	case "response.created":
		return "response.created"
	case "response.in_progress":
		return "response.in_progress"
	case "response.queued":
		return "response.queued"
	case "response.completed":
		return "response.completed"
	case "response.incomplete":
		return "response.incomplete"
	case "response.failed":
		return "response.failed"
	case "response.output_item.added":
		return "response.output_item.added"
	case "response.output_item.done":
		return "response.output_item.done"
	case "response.content_part.added":
		return "response.content_part.added"
	case "response.content_part.done":
		return "response.content_part.done"
	case "response.output_text.delta":
		return "response.output_text.delta"
	case "response.output_text.done":
		return "response.output_text.done"
	case "response.output_text.annotation.added":
		return "response.output_text.annotation.added"
	case "response.refusal.delta":
		return "response.refusal.delta"
	case "response.refusal.done":
		return "response.refusal.done"
	case "response.function_call_arguments.delta":
		return "response.function_call_arguments.delta"
	case "response.function_call_arguments.done":
		return "response.function_call_arguments.done"
	case "response.reasoning_summary_part.added":
		return "response.reasoning_summary_part.added"
	case "response.reasoning_summary_part.done":
		return "response.reasoning_summary_part.done"
	case "response.reasoning_summary_text.delta":
		return "response.reasoning_summary_text.delta"
	case "response.reasoning_summary_text.done":
		return "response.reasoning_summary_text.done"
	case "response.reasoning_text.delta":
		return "response.reasoning_text.delta"
	case "response.reasoning_text.done":
		return "response.reasoning_text.done"
	}
	return ""
}
