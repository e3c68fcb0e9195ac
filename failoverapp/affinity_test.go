package failoverapp

import (
	"fmt"
	"testing"
	"time"
)

// A full affinity table forgets the conversation whose pin expires
// soonest, one for each new one, and never grows past its bound, whether
// pins come from this process or from the fleet's table.
func TestAffinityTableForgetsSoonestWhenFull(t *testing.T) {
	reset := func() {
		affinity.Lock()
		affinity.m = make(map[string]affinityEntry)
		for affinity.expiry.Len() > 0 {
			k, _, _ := affinity.expiry.First()
			affinity.expiry.Remove(k)
		}
		affinity.Unlock()
	}
	reset()
	t.Cleanup(reset)
	a := &App{}
	now := time.Unix(1_800_000_000, 0)
	for i := range maxAffinityEntries {
		// Key 5 expires soonest; the others within a few minutes of it.
		ttl := time.Duration(2+i%5) * time.Minute
		if i == 5 {
			ttl = time.Minute
		}
		a.RememberAffinity("m", fmt.Sprint("conv-", i), Pin{Channel: "a"}, ttl, now)
	}
	a.RememberAffinity("m", "conv-new", Pin{Channel: "b"}, time.Minute, now)
	if _, ok := a.Affinity(t.Context(), "m", "conv-5", now); ok {
		t.Error("the soonest to expire was kept")
	}
	for _, k := range []string{"conv-0", "conv-6", "conv-new"} {
		if _, ok := a.Affinity(t.Context(), "m", k, now); !ok {
			t.Errorf("%s was forgotten", k)
		}
	}
	// A known conversation moving channel takes no room.
	a.RememberAffinity("m", "conv-0", Pin{Channel: "b"}, time.Hour, now)
	if p, ok := a.Affinity(t.Context(), "m", "conv-0", now); !ok || p.Channel != "b" {
		t.Errorf("conv-0: %+v %v", p, ok)
	}
	affinity.Lock()
	n, q := len(affinity.m), affinity.expiry.Len()
	affinity.Unlock()
	if n != maxAffinityEntries || q != n {
		t.Errorf("%d entries, %d in the expiry queue, bound %d", n, q, maxAffinityEntries)
	}
}
