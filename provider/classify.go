package provider

import (
	"github.com/llmfailover/caddy-llm-failover/internal/jsonscan"
	"github.com/llmfailover/caddy-llm-failover/streamgate"
)

// dialect is how one API family's events are told apart.
type dialect struct {
	// overflow classifies an event whose data was too large to keep, by
	// its name alone ("" when it had none).
	overflow func(name string) streamgate.Kind
	// data classifies an event by its name and its data, which is
	// trimmed, non-empty and not [DONE].
	data func(name string, data []byte) streamgate.Kind
}

// keepalives are the event names that only keep a connection open, in
// every API.
var keepalives = map[string]bool{"ping": true, "keepalive": true, "keep-alive": true, "heartbeat": true}

// classify applies the rules every dialect shares, then the dialect's own.
//
// Choices beyond the obvious:
//   - An event with empty or all-whitespace data is Preamble in every
//     dialect: it carries nothing.
//   - Data that is not a JSON object (malformed, truncated, plain text) and
//     not [DONE] is Content in every dialect: the upstream is sending
//     something other than a recognisable error, and holding it back would
//     only delay the client until the gate timer fires.
//   - "data: [DONE]" is Terminal in every dialect, as is an event named
//     "error" an ErrorFrame; keep-alive names are Preamble.
//   - Unknown event names in the typed dialects are Content, as in the
//     generic one.
func classify(d dialect, ev streamgate.Event) streamgate.Kind {
	name := ev.Name
	if name == "message" {
		name = ""
	}
	if name == "error" {
		return streamgate.ErrorFrame
	}
	if keepalives[name] {
		return streamgate.Preamble
	}
	if ev.Overflow {
		return d.overflow(name)
	}
	data := trimWS(ev.Data)
	if len(data) == 0 {
		return streamgate.Preamble
	}
	if string(data) == "[DONE]" {
		return streamgate.Terminal
	}
	return d.data(name, data)
}

func overflowIsContent(string) streamgate.Kind { return streamgate.Content }

// genericDialect is an unknown SSE API: the first data event that is not
// an error counts as content.
var genericDialect = dialect{
	overflow: overflowIsContent,
	data: func(_ string, data []byte) streamgate.Kind {
		t := scanTop(data)
		if t.ok && (t.err || string(t.typ) == "error") {
			return streamgate.ErrorFrame
		}
		return streamgate.Content
	},
}

func trimWS(b []byte) []byte {
	i, j := 0, len(b)
	for i < j && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	for j > i && (b[j-1] == ' ' || b[j-1] == '\t' || b[j-1] == '\n' || b[j-1] == '\r') {
		j--
	}
	return b[i:j]
}

// top holds the top-level keys the classifiers and CheckBody care about.
type top struct {
	typ   []byte // contents of the "type" string
	delta []byte // raw "delta" value
	err   bool   // a non-null top-level "error"
	ok    bool   // data is a well-formed JSON object
}

func scanTop(data []byte) (t top) {
	it, ok := jsonscan.Object(data)
	if !ok {
		return t
	}
	for k, more := it.Next(); more; k, more = it.Next() {
		switch string(k) {
		case "type":
			if s := jsonscan.StringValue(it.Value()); s != nil {
				t.typ = s
			}
		case "error":
			if !jsonscan.IsNull(it.Value()) {
				t.err = true
			}
		case "delta":
			t.delta = it.Value()
		}
	}
	t.ok = it.Finished()
	return t
}
