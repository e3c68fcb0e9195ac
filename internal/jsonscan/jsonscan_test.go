package jsonscan

import (
	"encoding/json"
	"testing"
)

func TestSkipValue(t *testing.T) {
	cases := map[string]int{
		`"a\"b" ,`:              6,
		`{"a":[1,{"b":"}"}]} x`: 19,
		`[1, 2]`:                6,
		`-1.5e+3,`:              7,
		`true}`:                 4,
		`null`:                  4,
		`{"a":1`:                -1, // truncated
		`"open`:                 -1,
		``:                      -1,
		`@`:                     -1,
	}
	for in, want := range cases {
		if got := SkipValue([]byte(in), 0); got != want {
			t.Errorf("SkipValue(%q) = %d, want %d", in, got, want)
		}
	}
}

func TestObjectWalk(t *testing.T) {
	b := []byte(` {"model" : "m", "nested":{"model":"x"}, "list":[1,{"k":"v"}], "s":"a\"}"} `)
	it, ok := Object(b)
	if !ok {
		t.Fatal("not an object")
	}
	var keys []string
	var spans []string
	for key, ok := it.Next(); ok; key, ok = it.Next() {
		keys = append(keys, string(key))
		pos := it.Pos()
		v := it.Value()
		if string(b[pos:pos+len(v)]) != string(v) {
			t.Fatalf("Pos does not locate the value of %s", key)
		}
		spans = append(spans, string(v))
	}
	if !it.Finished() {
		t.Fatal("walk did not finish cleanly")
	}
	want := []string{"model", "nested", "list", "s"}
	if len(keys) != len(want) {
		t.Fatalf("keys %q", keys)
	}
	for i := range want {
		if keys[i] != want[i] {
			t.Fatalf("keys %q, want %q", keys, want)
		}
	}
	if spans[0] != `"m"` || spans[1] != `{"model":"x"}` || spans[3] != `"a\"}"` {
		t.Fatalf("values %q", spans)
	}
}

func TestEnterLeave(t *testing.T) {
	b := []byte(`{"choices":[{"delta":{"content":"hi"}}],"usage":null}`)
	it, _ := Object(b)
	var content, usage []byte
	for key, ok := it.Next(); ok; key, ok = it.Next() {
		switch string(key) {
		case "choices":
			arr, ok := it.Enter('[', ']')
			if !ok {
				t.Fatal("choices is an array")
			}
			if _, ok := arr.Next(); ok {
				obj, _ := arr.Enter('{', '}')
				for k, ok := obj.Next(); ok; k, ok = obj.Next() {
					if string(k) == "delta" {
						d, _ := obj.Enter('{', '}')
						for k2, ok := d.Next(); ok; k2, ok = d.Next() {
							if string(k2) == "content" {
								content = StringValue(d.Value())
							}
						}
						obj.Leave(&d)
					}
				}
				arr.Leave(&obj)
			}
			it.Leave(&arr)
		case "usage":
			usage = it.Value()
		}
	}
	if string(content) != "hi" || !IsNull(usage) || !it.Finished() {
		t.Fatalf("content %q usage %q finished %v", content, usage, it.Finished())
	}
}

func TestMalformed(t *testing.T) {
	for _, in := range []string{`{"a" 1}`, `{"a":1,,}`, `{a:1}`, `{"a":1} junk`, `[`} {
		it, ok := Object([]byte(in))
		if !ok {
			continue
		}
		for _, ok := it.Next(); ok; _, ok = it.Next() {
		}
		if it.Finished() {
			t.Errorf("%q walked as well-formed", in)
		}
	}
}

func TestIsEmpty(t *testing.T) {
	for in, want := range map[string]bool{`null`: true, `""`: true, `[]`: true, `{ }`: true, `false`: true, `"x"`: false, `[0]`: false, `0`: false} {
		if got := IsEmpty([]byte(in)); got != want {
			t.Errorf("IsEmpty(%s) = %v", in, got)
		}
	}
}

// FuzzObject: the walker never panics, and whatever encoding/json accepts
// as an object it walks to the end, meeting every member.
func FuzzObject(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1,"b":[1,{"c":"d"}]}`, `{"a\u0062":"\"}"}`, `{"a":`, ` {"n":-1.5E+3,"t":true} `} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		it, ok := Object(b)
		n := 0
		if ok {
			for _, ok := it.Next(); ok; _, ok = it.Next() {
				n++
			}
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal(b, &obj) != nil || obj == nil {
			return
		}
		if !ok || !it.Finished() || n < len(obj) {
			t.Fatalf("valid object %q: walked ok=%v finished=%v members=%d, encoding/json found %d", b, ok, ok && it.Finished(), n, len(obj))
		}
	})
}
