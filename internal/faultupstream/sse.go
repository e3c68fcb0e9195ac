package faultupstream

import (
	"bufio"
	"encoding/json"
	"io"
	"strings"
)

// Event is one server-sent event as a client sees it.
type Event struct {
	Name string // "event:" field, empty when absent
	Data string // "data:" fields joined by "\n"
}

// ScanSSE reads server-sent events from r and calls fn for each as soon as it
// is complete, so a test can time events or stop early (fn returns false).
// Comment lines (": ping") are skipped. The error is the reader's, e.g.
// io.ErrUnexpectedEOF for a cut stream; a clean end returns nil.
func ScanSSE(r io.Reader, fn func(Event) bool) error {
	br := bufio.NewReader(r)
	var ev Event
	var data []string
	pending := false
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			if err == io.EOF {
				// A final event without its blank line counts, as in browsers'
				// EventSource; partial lines from a cut body do not.
				if pending && line == "" {
					ev.Data = strings.Join(data, "\n")
					fn(ev)
				}
				return nil
			}
			return err
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if !pending {
				continue
			}
			ev.Data = strings.Join(data, "\n")
			if !fn(ev) {
				return nil
			}
			ev, data, pending = Event{}, nil, false
		case strings.HasPrefix(line, ":"):
		default:
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "event":
				ev.Name, pending = value, true
			case "data":
				data, pending = append(data, value), true
			}
		}
	}
}

// ReadSSE collects every event of r. On error it returns the events read so
// far with the error.
func ReadSSE(r io.Reader) ([]Event, error) {
	var evs []Event
	err := ScanSSE(r, func(e Event) bool { evs = append(evs, e); return true })
	return evs, err
}

// StreamText concatenates the generated text carried by events of any of the
// three streaming APIs (chat delta.content, Anthropic text_delta, Responses
// output_text.delta), ignoring everything else, including malformed data.
func StreamText(evs []Event) string {
	var sb strings.Builder
	for _, e := range evs {
		var v struct {
			Type    string          `json:"type"`
			Delta   json.RawMessage `json:"delta"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(e.Data), &v) != nil {
			continue
		}
		switch v.Type {
		case "content_block_delta":
			var d struct {
				Text string `json:"text"`
			}
			_ = json.Unmarshal(v.Delta, &d)
			sb.WriteString(d.Text)
		case "response.output_text.delta":
			var d string
			_ = json.Unmarshal(v.Delta, &d)
			sb.WriteString(d)
		case "":
			for _, c := range v.Choices {
				sb.WriteString(c.Delta.Content)
			}
		}
	}
	return sb.String()
}
