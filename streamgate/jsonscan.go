package streamgate

import "bytes"

// A minimal, allocation-free JSON walker. Classify runs on every event of
// every stream, and all it needs are a few keys near the top of small
// objects; decoding into maps or structs would allocate per event. The
// walker checks structure (balanced brackets, terminated strings, key/colon
// syntax) but not the full grammar: json.Valid is used where strictness
// matters (CheckBody).

func skipWS(b []byte, i int) int {
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

// skipString expects b[i] == '"' and returns the index just past the closing
// quote, or -1. Most strings in stream chunks are short, where a plain loop
// beats the call overhead of bytes.IndexByte; long ones switch to it.
func skipString(b []byte, i int) int {
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

// skipValue returns the index just past the JSON value starting at b[i], or
// -1 if it is malformed or truncated.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
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

// iter walks the members of a JSON object or the elements of an array in
// a single pass: next stops at the start of each value, which the caller
// may skip, take raw (value), or descend into (enter/leave) without
// scanning it twice.
type iter struct {
	b       []byte
	i       int
	close   byte
	started bool
	pending bool // positioned at a value the caller has not consumed
	done    bool // closing bracket consumed
	bad     bool // malformed input
}

func openIter(b []byte, open, close byte) (iter, bool) {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != open {
		return iter{}, false
	}
	return iter{b: b, i: i + 1, close: close}, true
}

func objectIter(b []byte) (iter, bool) { return openIter(b, '{', '}') }
func arrayIter(b []byte) (iter, bool)  { return openIter(b, '[', ']') }

// next advances to the next member of an object (returning its key without
// quotes) or element of an array (key nil). It returns false at the end or
// on malformed input (then bad is set).
func (it *iter) next() (key []byte, ok bool) {
	if it.pending {
		it.value()
	}
	if it.bad || it.done {
		return nil, false
	}
	b := it.b
	i := skipWS(b, it.i)
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
		i = skipWS(b, i+1)
	}
	it.started = true
	if it.close == '}' {
		if i >= len(b) || b[i] != '"' {
			it.bad = true
			return nil, false
		}
		e := skipString(b, i)
		if e < 0 {
			it.bad = true
			return nil, false
		}
		key = b[i+1 : e-1]
		i = skipWS(b, e)
		if i >= len(b) || b[i] != ':' {
			it.bad = true
			return nil, false
		}
		i = skipWS(b, i+1)
	} else {
		key = b[i:i] // non-nil: "ok" must not depend on the key
	}
	it.i, it.pending = i, true
	return key, true
}

// value consumes the current value and returns it raw.
func (it *iter) value() []byte {
	it.pending = false
	e := skipValue(it.b, it.i)
	if e < 0 {
		it.bad = true
		return nil
	}
	v := it.b[it.i:e]
	it.i = e
	return v
}

// enter descends into the current value if it opens with open; otherwise
// it consumes the value and reports false.
func (it *iter) enter(open, close byte) (iter, bool) {
	if it.i < len(it.b) && it.b[it.i] == open {
		it.pending = false
		return iter{b: it.b, i: it.i + 1, close: close}, true
	}
	it.value()
	return iter{}, false
}

// leave consumes the rest of a child from enter and resumes after it.
func (it *iter) leave(c *iter) {
	for _, ok := c.next(); ok; _, ok = c.next() {
	}
	it.i = c.i
	it.bad = it.bad || c.bad
}

// finished reports whether the walk consumed a well-formed top-level value
// with nothing but whitespace after it.
func (it *iter) finished() bool {
	return !it.bad && skipWS(it.b, it.i) == len(it.b)
}

// isEmptyValue reports whether a raw JSON value carries nothing: null, "",
// [], {}, false. Providers pad preamble chunks with exactly these.
func isEmptyValue(v []byte) bool {
	switch string(v) {
	case "null", `""`, "false", "[]", "{}":
		return true
	}
	if len(v) >= 2 && (v[0] == '[' || v[0] == '{') {
		return skipWS(v, 1) == len(v)-1
	}
	return false
}

func isNull(v []byte) bool { return string(v) == "null" }

// stringValue returns the raw contents of a JSON string value (escapes not
// decoded), or nil if v is not a string.
func stringValue(v []byte) []byte {
	if len(v) >= 2 && v[0] == '"' {
		return v[1 : len(v)-1]
	}
	return nil
}
