package provider

import (
	"net/url"
	"strings"
	"testing"
)

// A client's key in the query never reaches an upstream, whatever its
// spelling; everything else of the query does, byte for byte.
func TestClientQuery(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"", ""},
		{"beta=true", "beta=true"},
		{"key=client", ""},
		{"beta=true&key=client", "beta=true"},
		{"KEY=client&beta=true", "beta=true"},
		{"api-key=c&api_key=c&apikey=c&x-api-key=c&x-goog-api-key=c&access_token=c&token=c&auth=c&authorization=c", ""},
		{"%6Bey=client&a=1", "a=1"},   // "key", percent-encoded
		{"k%65y=client", ""},          // likewise
		{"+key=client&a=1", "a=1"},    // a plus is a space, trimmed
		{"key", ""},                   // a bare name
		{"a=1;key=client&b=2", "b=2"}, // some servers split at ';'
		{"%zz=1&a=%20x", "a=%20x"},    // a name that does not unescape; values kept raw
		{"a=1&&b=2&", "a=1&b=2"},      // empty pairs dropped
		{"keys=1&monkey=2&key2=3", "keys=1&monkey=2&key2=3"},
		{"a=key%3Dclient", "a=key%3Dclient"}, // a value naming it is a value
	} {
		if got := clientQuery(tt.in); got != tt.want {
			t.Errorf("clientQuery(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func FuzzClientQuery(f *testing.F) {
	for _, s := range []string{"a=1&key=2", "k%65y=1;b=2", "%zz", "&&"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		out := clientQuery(raw)
		if len(out) > len(raw) {
			t.Fatalf("clientQuery(%q) = %q grew", raw, out)
		}
		if clientQuery(out) != out {
			t.Fatalf("clientQuery(%q) = %q is not a fixed point", raw, out)
		}
		for pair := range strings.SplitSeq(out, "&") {
			if !plainParam(pair) {
				t.Fatalf("clientQuery(%q) kept %q", raw, pair)
			}
		}
		if q, err := url.ParseQuery(out); err == nil {
			for name := range q {
				if credentialParams[strings.ToLower(strings.TrimSpace(name))] {
					t.Fatalf("clientQuery(%q) = %q: url.ParseQuery finds %q", raw, out, name)
				}
			}
		}
	})
}
