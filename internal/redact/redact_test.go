package redact

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

func TestSecretsMasksValuesAndTokens(t *testing.T) {
	s := NewSecrets("Bearer sk-upstream-0123456789", "short", "plainsecretvalue")
	for in, want := range map[string]string{
		"request had Authorization=Bearer sk-upstream-0123456789": "request had Authorization=" + Mask,
		"key sk-upstream-0123456789 is invalid":                   "key " + Mask + " is invalid",
		"x=plainsecretvalue;":                                     "x=" + Mask + ";",
		"short stays":                                             "short stays",
	} {
		if got := s.String(in); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
	}
	var none *Secrets
	if got := none.String("abc"); got != "abc" {
		t.Errorf("nil Secrets changed the text: %q", got)
	}
}

func TestSecretsHeaderDropsEchoes(t *testing.T) {
	s := NewSecrets("Bearer sk-upstream-0123456789")
	h := http.Header{"X-Echo": {"sk-upstream-0123456789"}, "Content-Type": {"application/json"}}
	s.Header(h)
	if _, ok := h["X-Echo"]; ok {
		t.Error("a header echoing a secret survived")
	}
	if h.Get("Content-Type") == "" {
		t.Error("an innocent header was dropped")
	}
}

func TestShapes(t *testing.T) {
	for in, want := range map[string]string{
		"Incorrect API key provided: sk-proj-abcdefghij1234":   "Incorrect API key provided: " + Mask,
		"header was Bearer eyJhbGciOi.payload.sig":             "header was " + Mask,
		"id ghp_0123456789abcdefghij0123456789abcdef is bad":   "id " + Mask + " is bad",
		"AWS AKIAABCDEFGHIJKLMNOP leaked":                      "AWS " + Mask + " leaked",
		"model gpt-4o-mini is overloaded, try again in 20s":    "model gpt-4o-mini is overloaded, try again in 20s",
		"internationalizationinternationalization is one word": "internationalizationinternationalization is one word",
	} {
		if got := Shapes(in); got != want {
			t.Errorf("Shapes(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzMessage: whatever the input, a configured secret never survives
// Message, and masking is idempotent.
func FuzzMessage(f *testing.F) {
	const secret = "Bearer sk-upstream-0123456789"
	s := NewSecrets(secret)
	f.Add("request had Authorization=Bearer sk-upstream-0123456789")
	f.Add("sk-upstream-0123456789sk-upstream-0123456789")
	f.Add("Bearer Bearer sk-upstream-012345678")
	f.Add("")
	f.Fuzz(func(t *testing.T, in string) {
		out := s.Message(in)
		if strings.Contains(out, "sk-upstream-0123456789") {
			t.Fatalf("secret survived: %q -> %q", in, out)
		}
		if again := s.Message(out); again != out {
			t.Fatalf("not idempotent: %q -> %q -> %q", in, out, again)
		}
	})
}

// FuzzShapesFastPath: when the scan says a string can hold no shape, the
// regular expressions indeed mask nothing in it.
func FuzzShapesFastPath(f *testing.F) {
	for _, s := range []string{"The server is overloaded, please try again later.", "Incorrect API key provided: sk-proj-abcdefghij1234",
		"x-Bearer abcdefghij", "tokens", "AKIAABCDEFGHIJKLMNOP", "aizaSyabcdefghijklmnopqrstu", strings.Repeat("a1", 16), "ümlaut basic 12345678", "ſk-abcdefghij", "\u212aey-abcdefghij"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		if mayHoldShape(in) {
			return
		}
		if credentialShapes.MatchString(in) || longTokens.MatchString(in) {
			t.Fatalf("mayHoldShape(%q) is false, but an expression matches it", in)
		}
	})
}

func BenchmarkShapes(b *testing.B) {
	for _, in := range []string{"The server is overloaded, please try again later.", "Incorrect API key provided: sk-proj-abcdefghij1234"} {
		b.Run(strings.Fields(in)[1], func(b *testing.B) {
			for b.Loop() {
				_ = Shapes(in)
			}
		})
	}
}

// Bytes masks what String masks, and hands back the very bytes it was
// given when they hold no secret.
func TestSecretsBytes(t *testing.T) {
	s := NewSecrets("Bearer sk-upstream-0123456789", "x-goog-key-ABCDEFGHIJ", "plainsecretvalue")
	for _, in := range []string{
		"data: {\"content\":\"Bearer sk-upstream-0123456789\"}\n\n",
		"data: {\"content\":\"sk-upstream-0123456789\"}\n\n",
		"x-goog-key-ABCDEFGHIJ and plainsecretvalue",
		"sk-upstream-01 is not it, sk-upstream-0123456789 is", // a prefix that fails first
		"x-goog-key-ABCDEFGHI",                                // one byte short
		"nothing here",
		"",
	} {
		b := []byte(in)
		got := s.Bytes(b)
		if string(got) != s.String(in) {
			t.Errorf("Bytes(%q) = %q, String gives %q", in, got, s.String(in))
		}
		if string(got) == in && len(in) > 0 && &got[0] != &b[0] {
			t.Errorf("Bytes(%q) copied bytes that hold no secret", in)
		}
	}
	var none *Secrets
	if got := none.Bytes([]byte("abc")); string(got) != "abc" {
		t.Errorf("nil Secrets changed the bytes: %q", got)
	}
}

func BenchmarkSecretsBytes(b *testing.B) {
	var keys []string
	for i := range 10 {
		keys = append(keys, "Bearer sk-proj-"+strings.Repeat(string(rune('a'+i)), 40))
	}
	s := NewSecrets(keys...)
	event := []byte(`data: {"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":{"content":"Hello there, how are you today?"},"finish_reason":null}]}` + "\n\n")
	b.SetBytes(int64(len(event)))
	b.ReportAllocs()
	for b.Loop() {
		s.Bytes(event)
	}
}

// A URL as views and errors show it keeps where it points and the names
// of its query, never a userinfo or a query value.
func TestURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:9000":                      "http://127.0.0.1:9000",
		"https://h.example/api?api-version=1&key=S3": "https://h.example/api?api-version=" + Mask + "&key=" + Mask,
		"ftp://user:pw@h.example/x":                  "ftp://" + Mask + "@h.example/x",
		"https://h.example/v1?":                      "https://h.example/v1",
	} {
		u, err := url.Parse(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := URL(u); got != want {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
	}
}
