// Package jsonscan is a minimal, allocation-free JSON walker, shared by
// the stream gate (which classifies every event of every stream and needs
// only a few keys near the top of small objects) and the request parser
// (which needs the top-level fields of a body and their byte spans).
// Decoding into maps or structs would allocate per event. The walker checks
// structure (balanced brackets, terminated strings, key/colon syntax) but
// not the full grammar: callers use Valid (valid.go) where strictness
// matters.
package jsonscan

import "bytes"

// SkipWS returns the index of the first non-whitespace byte at or after i.
func SkipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// SkipString expects b[i] == '"' and returns the index just past the closing
// quote, or -1. Most strings in stream chunks are short, where a plain loop
// beats the call overhead of bytes.IndexByte; long ones switch to it.
func SkipString(b []byte, i int) int {
	i++
	for n := 0; i < len(b) && n < 32; n++ {
		switch b[i] {
		case '"':
			return i + 1
		case '\\':
			i += 2
		default:
			i++
		}
	}
	for i < len(b) {
		q := bytes.IndexByte(b[i:], '"')
		if q < 0 {
			return -1
		}
		q += i
		// The quote is escaped iff an odd number of backslashes precede it.
		n := 0
		for j := q - 1; j >= i && b[j] == '\\'; j-- {
			n++
		}
		if n%2 == 0 {
			return q + 1
		}
		i = q + 1
	}
	return -1
}

// SkipValue returns the index just past the JSON value starting at b[i], or
// -1 if it is malformed or truncated.
func SkipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return SkipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = SkipString(b, i)
				if i < 0 {
					return -1
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return -1
	default:
		j := i
		for j < len(b) {
			c := b[j]
			if c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r' {
				break
			}
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c == '-' || c == '+' || c == '.' || c == 'E') {
				return -1
			}
			j++
		}
		if j == i {
			return -1
		}
		return j
	}
}

// Iter walks the members of a JSON object or the elements of an array in
// a single pass: next stops at the start of each value, which the caller
// may skip, take raw (value), or descend into (enter/leave) without
// scanning it twice.
type Iter struct {
	b       []byte
	i       int
	close   byte
	started bool
	pending bool // positioned at a value the caller has not consumed
	done    bool // closing bracket consumed
	bad     bool // malformed input
}

func open(b []byte, open, close byte) (Iter, bool) {
	i := SkipWS(b, 0)
	if i >= len(b) || b[i] != open {
		return Iter{}, false
	}
	return Iter{b: b, i: i + 1, close: close}, true
}

// Object starts walking the members of the object in b.
func Object(b []byte) (Iter, bool) { return open(b, '{', '}') }

// Array starts walking the elements of the array in b.
func Array(b []byte) (Iter, bool) { return open(b, '[', ']') }

// Next advances to the next member of an object (returning its key without
// quotes) or element of an array (key nil). It returns false at the end or
// on malformed input (then bad is set).
func (it *Iter) Next() (key []byte, ok bool) {
	if it.pending {
		it.Value()
	}
	if it.bad || it.done {
		return nil, false
	}
	b := it.b
	i := SkipWS(b, it.i)
	if i >= len(b) {
		it.bad = true
		return nil, false
	}
	if b[i] == it.close {
		it.i, it.done = i+1, true
		return nil, false
	}
	if it.started {
		if b[i] != ',' {
			it.bad = true
			return nil, false
		}
		i = SkipWS(b, i+1)
	}
	it.started = true
	if it.close == '}' {
		if i >= len(b) || b[i] != '"' {
			it.bad = true
			return nil, false
		}
		e := SkipString(b, i)
		if e < 0 {
			it.bad = true
			return nil, false
		}
		key = b[i+1 : e-1]
		i = SkipWS(b, e)
		if i >= len(b) || b[i] != ':' {
			it.bad = true
			return nil, false
		}
		i = SkipWS(b, i+1)
	} else {
		key = b[i:i] // non-nil: "ok" must not depend on the key
	}
	it.i, it.pending = i, true
	return key, true
}

// Pos is the offset in the walked bytes where the current value starts
// (valid after Next, before Value).
func (it *Iter) Pos() int { return it.i }

// Peek returns the first byte of the current value (valid after Next,
// before Value), so a caller can decide whether to descend into it.
func (it *Iter) Peek() byte {
	if it.i < len(it.b) {
		return it.b[it.i]
	}
	return 0
}

// Value consumes the current value and returns it raw.
func (it *Iter) Value() []byte {
	it.pending = false
	e := SkipValue(it.b, it.i)
	if e < 0 {
		it.bad = true
		return nil
	}
	v := it.b[it.i:e]
	it.i = e
	return v
}

// Enter descends into the current value if it opens with open; otherwise
// it consumes the value and reports false.
func (it *Iter) Enter(open, close byte) (Iter, bool) {
	if it.i < len(it.b) && it.b[it.i] == open {
		it.pending = false
		return Iter{b: it.b, i: it.i + 1, close: close}, true
	}
	it.Value()
	return Iter{}, false
}

// Leave consumes the rest of a child from enter and resumes after it.
func (it *Iter) Leave(c *Iter) {
	for _, ok := c.Next(); ok; _, ok = c.Next() {
	}
	it.i = c.i
	it.bad = it.bad || c.bad
}

// Finished reports whether the walk consumed a well-formed top-level value
// with nothing but whitespace after it.
func (it *Iter) Finished() bool {
	return !it.bad && SkipWS(it.b, it.i) == len(it.b)
}

// IsEmpty reports whether a raw JSON value carries nothing: null, "",
// [], {}, false. Providers pad preamble chunks with exactly these.
func IsEmpty(v []byte) bool {
	switch string(v) {
	case "null", `""`, "false", "[]", "{}":
		return true
	}
	if len(v) >= 2 && (v[0] == '[' || v[0] == '{') {
		return SkipWS(v, 1) == len(v)-1
	}
	return false
}

// IsNull reports whether a raw value is null.
func IsNull(v []byte) bool { return string(v) == "null" }

// StringValue returns the raw contents of a JSON string value (escapes not
// decoded), or nil if v is not a string.
func StringValue(v []byte) []byte {
	if len(v) >= 2 && v[0] == '"' {
		return v[1 : len(v)-1]
	}
	return nil
}
