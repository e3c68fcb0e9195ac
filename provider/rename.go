package provider

import (
	"bytes"
	"encoding/json"
	"io"
	"slices"
)

// RestoreModel returns src with the value of every "model" member of its
// JSON (a whole body, or the data of each server-sent event) that is not
// inside an array replaced by client, the name the client asked for, so
// that a route's upstream_model stays the gateway's business. The answer's
// own model is never inside an array (at the top, or in Anthropic's
// message_start "message" or a Responses event's "response"); what is,
// is content: a tool call's input such as {"model":"gpt-4o"} is the
// model's output and stays as it came. It rewrites bytes as they stream:
// a "model" key can only appear unescaped as a key of the JSON itself,
// never inside a string, so a scan of strings and brackets is all the
// parsing needed. Only a "model" member whose value has not fully arrived
// is held back, bounded by maxModelValue.
func RestoreModel(src io.Reader, client string) io.Reader {
	quoted, _ := json.Marshal(client)
	return &modelRestorer{src: src, client: quoted}
}

// maxModelValue bounds the bytes held back for one unfinished "model"
// member; a longer one is passed as it is.
const maxModelValue = 1024

var modelKey = []byte(`"model"`)

type modelRestorer struct {
	src    io.Reader
	client []byte // JSON-quoted client name
	in     []byte // bytes read, not yet processed
	out    []byte // processed bytes; out[off:] not yet returned
	off    int
	eof    error
	// Where the bytes moved to out leave the JSON: arrays open, inside a
	// string, after a backslash in one.
	arrays     int
	inStr, esc bool
}

// scan advances the JSON state over b, bytes moved to out unchanged.
func (m *modelRestorer) scan(b []byte) {
	for _, c := range b {
		switch {
		case m.esc:
			m.esc = false
		case m.inStr:
			switch c {
			case '\\':
				m.esc = true
			case '"':
				m.inStr = false
			}
		case c == '"':
			m.inStr = true
		case c == '[':
			m.arrays++
		case c == ']' && m.arrays > 0:
			m.arrays--
		}
	}
}

// emit moves b to out.
func (m *modelRestorer) emit(b []byte) {
	m.scan(b)
	m.out = append(m.out, b...)
}

func (m *modelRestorer) Read(p []byte) (int, error) {
	for m.off == len(m.out) {
		m.out, m.off = m.out[:0], 0
		if m.eof != nil {
			return 0, m.eof
		}
		if cap(m.in)-len(m.in) < 4096 {
			m.in = slices.Grow(m.in, 32<<10)
		}
		n, err := m.src.Read(m.in[len(m.in):cap(m.in)])
		m.in = m.in[:len(m.in)+n]
		if err != nil {
			m.eof = err
		}
		m.process(err != nil)
	}
	n := copy(p, m.out[m.off:])
	m.off += n
	return n, nil
}

// process moves what can be decided from in to out, keeping in only the
// tail that may still become a "model" member.
func (m *modelRestorer) process(final bool) {
	in, pos := m.in, 0
	for {
		i := bytes.Index(in[pos:], modelKey)
		if i < 0 {
			break
		}
		i += pos
		m.emit(in[pos:i])
		pos = i
		if m.inStr || m.arrays > 0 {
			// Inside a string (a value "model" followed by more), or
			// inside an array: not the answer's model.
			m.emit(in[i : i+len(modelKey)])
			pos = i + len(modelKey)
			continue
		}
		vs, ve, complete := modelValue(in, i+len(modelKey))
		if !complete && !final && len(in)-i <= maxModelValue {
			m.keep(in[i:])
			return
		}
		if vs < 0 || !complete {
			m.emit(in[i : i+len(modelKey)])
			pos = i + len(modelKey)
			continue
		}
		m.emit(in[i:vs])
		m.scan(in[vs:ve]) // a whole string: in and out of it
		m.out = append(m.out, m.client...)
		pos = ve
	}
	// A tail that begins the key is held for the next read.
	hold := 0
	if !final {
		for k := min(len(modelKey)-1, len(in)-pos); k > 0; k-- {
			if bytes.HasSuffix(in, modelKey[:k]) {
				hold = k
				break
			}
		}
	}
	m.emit(in[pos : len(in)-hold])
	m.keep(in[len(in)-hold:])
}

func (m *modelRestorer) keep(tail []byte) {
	n := copy(m.in, tail)
	m.in = m.in[:n]
}

// modelValue finds the string value after a "model" key ending at i:
// its span [vs, ve) quotes included. vs is -1 when what follows is not a
// string member; complete is false when the buffer ends first.
func modelValue(b []byte, i int) (vs, ve int, complete bool) {
	i = skipWS(b, i)
	if i >= len(b) {
		return 0, 0, false
	}
	if b[i] != ':' {
		return -1, 0, true
	}
	i = skipWS(b, i+1)
	if i >= len(b) {
		return 0, 0, false
	}
	if b[i] != '"' {
		return -1, 0, true
	}
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return i, j + 1, true
		}
	}
	return 0, 0, false
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
