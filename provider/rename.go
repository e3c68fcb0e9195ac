package provider

import (
	"bytes"
	"encoding/json"
	"io"
	"slices"
)

// RestoreModel returns src with the value of every "model" member of its
// JSON (a whole body, or the data of each server-sent event) replaced by
// client, the name the client asked for, so that a route's upstream_model
// stays the gateway's business. It rewrites bytes as they stream: a
// "model" key can only appear unescaped as a key of the JSON itself, never
// inside a string, so no parsing is needed. Only a "model" member whose
// value has not fully arrived is held back, bounded by maxModelValue.
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
		vs, ve, complete := modelValue(in, i+len(modelKey))
		if !complete && !final && len(in)-i <= maxModelValue {
			m.out = append(m.out, in[pos:i]...)
			m.keep(in[i:])
			return
		}
		if vs < 0 || !complete {
			m.out = append(m.out, in[pos:i+len(modelKey)]...)
			pos = i + len(modelKey)
			continue
		}
		m.out = append(append(m.out, in[pos:vs]...), m.client...)
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
	m.out = append(m.out, in[pos:len(in)-hold]...)
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
