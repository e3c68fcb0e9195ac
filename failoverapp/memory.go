package failoverapp

import "sync/atomic"

// heldBytes counts the bytes of answers held in memory and not yet sent,
// across every request of the process: memory is one budget, whatever
// config or handler holds it.
var heldBytes atomic.Int64

// Memory is one config's limit (max_held_bytes) on the process's held
// bytes. It is the provider.Holder the engine hands adapters (without
// importing provider here: the interface is satisfied by its shape).
type Memory struct{ limit int64 }

// Full reports whether the process holds the limit already.
func (m *Memory) Full() bool { return heldBytes.Load() >= m.limit }

// Reserve counts n bytes as held, unless that would pass the limit.
func (m *Memory) Reserve(n int64) bool {
	if heldBytes.Add(n) > m.limit {
		heldBytes.Add(-n)
		return false
	}
	return true
}

// Hold counts n bytes read as held, and reports whether the process is
// now past the limit (the bytes stay counted until Release).
func (m *Memory) Hold(n int64) (over bool) { return heldBytes.Add(n) > m.limit }

// Release gives n held bytes back.
func (m *Memory) Release(n int64) { heldBytes.Add(-n) }

// HeldBytes is what the process holds now.
func HeldBytes() int64 { return heldBytes.Load() }
