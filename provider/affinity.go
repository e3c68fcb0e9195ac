package provider

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"

	"github.com/llmfailover/caddy-llm-failover/internal/jsonscan"
)

// A provider's prompt cache lives on the channel that wrote it: the next
// turn of a conversation is cheap only where the previous one went. The
// gateway keeps a conversation on its channel (cache affinity); this file
// says which requests belong to one conversation.

// sessionHeaders are the headers coding agents send to name their
// session, in the order they are trusted: Claude Code's, Codex's (its
// current and its older spelling), and the generic one.
var sessionHeaders = []string{"X-Claude-Code-Session-Id", "Session-Id", "Session_id", "X-Session-Id"}

// ConversationKey names the conversation a request belongs to, or ""
// when it shows none: the request's prompt_cache_key (OpenAI chat and
// Responses), else a session header, else a hash of what stays the same
// from one turn to the next (the system prompt or instructions, the
// tools, and the conversation's first message, with the one after it
// when that is a system prompt). The kind of key is its prefix, so that a
// header value can never equal a prefix hash. A prefix shorter than
// minCachedPrefix names no conversation: providers cache nothing that
// short, and pinning every short request that happens to open alike
// (a health check, a one-line prompt) to one channel would only keep
// traffic off the chain's first choice. body is walked once, the hashed
// parts as they are, with no decoding.
func ConversationKey(h http.Header, body []byte) string {
	var pck, msgs []byte
	stable := 0 // bytes of the hashed prefix
	sum := sha256.New()
	err := eachTopLevel(body, func(key []byte, start, end int) error {
		v := body[start:end]
		switch string(key) {
		case "prompt_cache_key":
			pck = v
		case "system", "instructions", "tools":
			if !jsonscan.IsNull(v) {
				sum.Write(key)
				sum.Write(v)
				stable += len(v)
			}
		case "messages", "input":
			msgs = v
		}
		return nil
	})
	if err != nil {
		return ""
	}
	var k string
	if pck != nil && json.Unmarshal(pck, &k) == nil && k != "" {
		return bounded("pck:", k)
	}
	for _, name := range sessionHeaders {
		if v := h.Get(name); v != "" {
			return bounded("hdr:", v)
		}
	}
	if arr, ok := jsonscan.Array(msgs); ok {
		for i := 0; i < 2; i++ {
			if _, more := arr.Next(); !more {
				break
			}
			m := arr.Value()
			sum.Write(m)
			stable += len(m)
			if !isSystemMessage(m) {
				break
			}
		}
	}
	if stable < minCachedPrefix {
		return ""
	}
	return "pfx:" + hex.EncodeToString(sum.Sum(nil)[:16])
}

// minCachedPrefix is the shortest repeated opening that names a
// conversation: providers cache prefixes of 1,024 tokens or more, about
// 4 KB of text.
const minCachedPrefix = 4096

// maxKeyLen bounds a key the client chose, so that the affinity table's
// memory is bounded by its entry count, whatever clients send.
const maxKeyLen = 64

// bounded is kind+v, or kind and a hash of v when v is long.
func bounded(kind, v string) string {
	if len(v) <= maxKeyLen {
		return kind + v
	}
	sum := sha256.Sum256([]byte(v))
	return kind + "#" + hex.EncodeToString(sum[:16])
}

// isSystemMessage reports whether a message is a system (or developer)
// prompt.
func isSystemMessage(m []byte) bool {
	obj, ok := jsonscan.Object(m)
	if !ok {
		return false
	}
	for k, more := obj.Next(); more; k, more = obj.Next() {
		if string(k) == "role" {
			r := string(jsonscan.StringValue(obj.Value()))
			return r == "system" || r == "developer"
		}
	}
	return false
}
