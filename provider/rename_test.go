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
