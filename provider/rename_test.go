package provider

import (
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestRestoreModel(t *testing.T) {
	in := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\" : \"claude-sonnet-4-5@20250929\",\"text\":\"say \\\"model\\\":\\\"x\\\"\"}}\n\n" +
		`{"model":null,"role":"model","choices":[]}` + `{"model":"gpt"}`
	want := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\" : \"claude\",\"text\":\"say \\\"model\\\":\\\"x\\\"\"}}\n\n" +
		`{"model":null,"role":"model","choices":[]}` + `{"model":"claude"}`
	for name, src := range map[string]io.Reader{
		"whole":        strings.NewReader(in),
		"byte by byte": iotest.OneByteReader(strings.NewReader(in)),
	} {
		got, err := io.ReadAll(RestoreModel(src, "claude"))
		if err != nil || string(got) != want {
			t.Errorf("%s: got %q, %v\nwant %q", name, got, err, want)
		}
	}
}

// A "model" inside an array is content, not the answer's model: a tool
// call's input (Anthropic's tool_use "input" is raw JSON) stays as the
// model wrote it, while the answer's own model is rewritten wherever the
// API puts it. An audit found tool arguments rewritten to the client's
// model name on every renamed route (Bedrock, Vertex).
func TestRestoreModelLeavesContentAlone(t *testing.T) {
	const up, client = "us.anthropic.claude-sonnet-4-5-20250929-v1:0", "claude-sonnet-4-5"
	for _, c := range []struct{ name, in, want string }{
		{"tool input",
			`{"id":"msg_1","model":"` + up + `","content":[{"type":"tool_use","name":"switch_model","input":{"model":"gpt-4o","opts":[{"model":"x"}]}}],"stop_reason":"tool_use"}`,
			`{"id":"msg_1","model":"` + client + `","content":[{"type":"tool_use","name":"switch_model","input":{"model":"gpt-4o","opts":[{"model":"x"}]}}],"stop_reason":"tool_use"}`},
		{"a model after the array",
			`{"content":[{"input":{"model":"gpt-4o"}}],"model":"` + up + `"}`,
			`{"content":[{"input":{"model":"gpt-4o"}}],"model":"` + client + `"}`},
		{"brackets inside strings",
			`{"text":"a ] [ \"]\" b","model":"` + up + `","content":[{"text":"[[","input":{"model":"k"}}]}`,
			`{"text":"a ] [ \"]\" b","model":"` + client + `","content":[{"text":"[[","input":{"model":"k"}}]}`},
		{"responses event",
			"data: " + `{"type":"response.created","response":{"model":"` + up + `","output":[]}}` + "\n\n" +
				"data: " + `{"type":"response.output_item.done","item":{"arguments":"{\"model\":\"gpt\"}"}}` + "\n\n",
			"data: " + `{"type":"response.created","response":{"model":"` + client + `","output":[]}}` + "\n\n" +
				"data: " + `{"type":"response.output_item.done","item":{"arguments":"{\"model\":\"gpt\"}"}}` + "\n\n"},
	} {
		for name, src := range map[string]io.Reader{
			"whole":        strings.NewReader(c.in),
			"byte by byte": iotest.OneByteReader(strings.NewReader(c.in)),
		} {
			got, err := io.ReadAll(RestoreModel(src, client))
			if err != nil || string(got) != c.want {
				t.Errorf("%s, %s: got %s, %v\nwant %s", c.name, name, got, err, c.want)
			}
		}
	}
}

func FuzzRestoreModel(f *testing.F) {
	f.Add([]byte(`{"model":"a","x":{"model":"b"}}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		whole, _ := io.ReadAll(RestoreModel(strings.NewReader(string(in)), "m"))
		split, _ := io.ReadAll(RestoreModel(iotest.OneByteReader(strings.NewReader(string(in))), "m"))
		if !strings.Contains(string(in), `"model"`) && string(whole) != string(in) {
			t.Fatalf("changed input without a model key: %q -> %q", in, whole)
		}
		if len(in) < maxModelValue && string(whole) != string(split) {
			t.Fatalf("read size changes the result: %q vs %q", whole, split)
		}
	})
}

// BenchmarkRestoreModel is the restorer over an Anthropic stream of 200
// text deltas on a renamed route, read as the gate reads: what every byte
// of such a route's answers costs.
func BenchmarkRestoreModel(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"us.anthropic.claude-sonnet-4-5-20250929-v1:0\",\"content\":[],\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\n\n")
	for range 200 {
		sb.WriteString("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello there, this is a \\\"token\\\" or two.\"}}\n\n")
	}
	in := sb.String()
	buf := make([]byte, 16<<10)
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		r := RestoreModel(strings.NewReader(in), "claude-sonnet-4-5")
		for {
			if _, err := r.Read(buf); err != nil {
				break
			}
		}
	}
}
