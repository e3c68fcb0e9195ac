package provider

import (
	"net/http"
	"strings"
	"testing"
)

// A conversation's turns share a key, different conversations do not; an
// explicit key or session header wins over the prefix.
func TestConversationKey(t *testing.T) {
	long := strings.Repeat("You are terse. ", 300) // a prompt worth caching
	turn1 := `{"model":"m","system":"` + long + `","tools":[{"name":"f"}],"messages":[{"role":"user","content":"Hi"}]}`
	turn2 := `{"model":"m","system":"` + long + `","tools":[{"name":"f"}],"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello"},{"role":"user","content":"More"}]}`
	other := `{"model":"m","system":"` + long + `","tools":[{"name":"f"}],"messages":[{"role":"user","content":"Bye"}]}`
	chat1 := `{"model":"m","messages":[{"role":"system","content":"` + long + `"},{"role":"user","content":"Q1"}]}`
	chat2 := `{"model":"m","messages":[{"role":"system","content":"` + long + `"},{"role":"user","content":"Q1"},{"role":"assistant","content":"A"},{"role":"user","content":"Q2"}]}`
	chatOther := `{"model":"m","messages":[{"role":"system","content":"` + long + `"},{"role":"user","content":"Q9"}]}`
	none := http.Header{}
	k := func(h http.Header, body string) string { return ConversationKey(h, []byte(body)) }
	if a, b := k(none, turn1), k(none, turn2); a == "" || a != b || !strings.HasPrefix(a, "pfx:") {
		t.Errorf("Messages turns: %q, %q", a, b)
	}
	if k(none, turn1) == k(none, other) {
		t.Error("two Messages conversations share a key")
	}
	if a, b := k(none, chat1), k(none, chat2); a == "" || a != b {
		t.Errorf("chat turns: %q, %q", a, b)
	}
	if k(none, chat1) == k(none, chatOther) {
		t.Error("two chat conversations with one system prompt share a key")
	}
	if got := k(none, `{"model":"m","prompt_cache_key":"conv-7","messages":[{"role":"user","content":"x"}]}`); got != "pck:conv-7" {
		t.Errorf("prompt_cache_key: %q", got)
	}
	h := http.Header{}
	h.Set("X-Claude-Code-Session-Id", "s-1")
	h.Set("X-Session-Id", "s-2")
	if got := k(h, turn1); got != "hdr:s-1" {
		t.Errorf("session header: %q", got)
	}
	// A key the client chose is bounded: the table's memory must not
	// grow with what clients send.
	h = http.Header{"X-Session-Id": {strings.Repeat("s", 100_000)}}
	if got := k(h, turn1); len(got) > 4+maxKeyLen || got != k(h, turn2) || !strings.HasPrefix(got, "hdr:#") {
		t.Errorf("a 100 KB session header gives key %d bytes long (%.20q)", len(got), got)
	}
	h = http.Header{"Session_id": {"codex-1"}}
	if got := k(h, turn1); got != "hdr:codex-1" {
		t.Errorf("Codex's session_id header: %q", got)
	}
	// Too short to be cached anywhere: no conversation, so a one-line
	// prompt many clients send alike is not pinned to one channel.
	if got := k(none, `{"model":"m","messages":[{"role":"user","content":"Say hello."}]}`); got != "" {
		t.Errorf("a short prompt names a conversation: %q", got)
	}
	for _, bad := range []string{``, `[]`, `{"model":"m"}`, `{"model":`} {
		if got := k(none, bad); got != "" {
			t.Errorf("%q: key %q", bad, got)
		}
	}
}

// BenchmarkConversationKey: naming a turn's conversation by its prefix,
// for a coding-agent request with a 40 KB system prompt and 20 turns.
func BenchmarkConversationKey(b *testing.B) {
	var msgs []string
	for i := range 20 {
		msgs = append(msgs, `{"role":"user","content":"turn `+strings.Repeat("x", i)+`"}`, `{"role":"assistant","content":"ok"}`)
	}
	body := []byte(`{"model":"m","system":"` + strings.Repeat("You are a careful coding assistant. ", 1150) + `","tools":[{"name":"edit","input_schema":{"type":"object"}}],"messages":[` + strings.Join(msgs, ",") + `]}`)
	h := http.Header{}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if ConversationKey(h, body) == "" {
			b.Fatal("no key")
		}
	}
}
