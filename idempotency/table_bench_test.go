package idempotency

import (
	"fmt"
	"testing"
	"time"
)

// What finishing a kept call costs once the table is full of answers
// that have not expired: the busy state of a gateway whose answers fill
// max_stored within the retention window. n is how many are kept.
//
//	go test -run '^$' -bench TableKeepWhenFull ./idempotency/
func BenchmarkTableKeepWhenFull(b *testing.B) {
	for _, n := range []int{1000, 30000} {
		b.Run(fmt.Sprint(n, "_kept"), func(b *testing.B) {
			body := make([]byte, 2048)
			lim := Limits{Retention: time.Hour, MaxStored: int64(n) * (2048 + keptOverhead)}
			tb := NewTable()
			now := time.Unix(1_800_000_000, 0)
			finish := func(i int) {
				_, f, _ := tb.Begin(fmt.Sprint("call-", i), "fp", now)
				f.status, f.body = 200, body
				tb.Finish(f, true, lim, now)
			}
			for i := range n {
				finish(i)
			}
			i := n
			b.ReportAllocs()
			for b.Loop() {
				finish(i)
				i++
				now = now.Add(time.Microsecond)
			}
		})
	}
}
