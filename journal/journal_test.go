package journal

import (
	"reflect"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func filled() *Journal {
	j := New(5)
	for i, d := range []Decision{
		{Channel: "a", Reason: "status", Model: "m"},
		{Channel: "a", Reason: "header_timeout", Model: "m"},
		{Channel: "b", Reason: "status", Model: "m"},
		{Channel: "a", Reason: "status", Model: "n"},
		{Channel: "c", Reason: "status", Model: "n"},
		{Channel: "b", Reason: "status", Model: "n"},
		{Channel: "a", Reason: "stream_error_frame", Model: "m"},
	} {
		d.At = t0.Add(time.Duration(i) * time.Minute)
		d.Attempt = i + 1
		j.Add(d)
	}
	return j
}

func attempts(ds []Decision) []int {
	var out []int
	for _, d := range ds {
		out = append(out, d.Attempt)
	}
	return out
}

func TestBoundedNewestFirst(t *testing.T) {
	j := filled()
	// Size 5: the first two are gone.
	if got := attempts(j.Query(Filter{}, 0)); !reflect.DeepEqual(got, []int{7, 6, 5, 4, 3}) {
		t.Fatalf("%v", got)
	}
	if got := attempts(j.Query(Filter{}, 2)); !reflect.DeepEqual(got, []int{7, 6}) {
		t.Fatalf("limit: %v", got)
	}
	if got := New(3).Query(Filter{}, 0); len(got) != 0 {
		t.Fatalf("empty: %v", got)
	}
}

func TestFilters(t *testing.T) {
	j := filled()
	for _, c := range []struct {
		f    Filter
		want []int
	}{
		{Filter{Reason: "status"}, []int{6, 5, 4, 3}},
		{Filter{Channel: "a"}, []int{7, 4}},
		{Filter{Model: "n", Channel: "b"}, []int{6}},
		{Filter{Since: t0.Add(5 * time.Minute)}, []int{7, 6}},
		{Filter{Reason: "nothing"}, nil},
	} {
		if got := attempts(j.Query(c.f, 0)); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%+v: %v, want %v", c.f, got, c.want)
		}
	}
}

func TestGroup(t *testing.T) {
	ds := filled().Query(Filter{Reason: "status"}, 0)
	if got := Group(ds, ByChannel); !reflect.DeepEqual(got, []Count{{"b", 2}, {"a", 1}, {"c", 1}}) {
		t.Errorf("by channel: %v", got)
	}
	if got := Group(ds, ByModel); !reflect.DeepEqual(got, []Count{{"n", 3}, {"m", 1}}) {
		t.Errorf("by model: %v", got)
	}
	if _, err := ParseGroupBy("upstream"); err == nil {
		t.Error("bad group accepted")
	}
	if g, err := ParseGroupBy("reason"); err != nil || g != ByReason {
		t.Error(g, err)
	}
}
