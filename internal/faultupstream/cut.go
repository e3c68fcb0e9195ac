package faultupstream

// WithCutAfter returns a copy that, like CutMidStream, hangs up (with a
// FIN) right after its n-th content event, before any usage report.
func (a Answer) WithCutAfter(n int) Answer {
	a.cutAfter = n
	return a
}
