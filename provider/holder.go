package provider

import (
	"context"
	"errors"
)

// Holder is the memory budget an adapter counts what it holds against
// while it reads an answer (a Bedrock frame, read whole): the engine's,
// shared by every request, so that no upstream can make the gateway hold
// more than its operator allows.
type Holder interface {
	// Hold counts n more bytes as held and reports whether the budget is
	// now exceeded; the bytes stay counted until Release.
	Hold(n int64) (over bool)
	// Release gives n held bytes back.
	Release(n int64)
}

// ErrMemoryBudget is the error of a read the memory budget did not allow.
var ErrMemoryBudget = errors.New("the gateway holds its limit of buffered answers")

type holderKey struct{}

// WithHolder returns ctx carrying h: the requests an adapter builds with
// it count their answers' buffers against h.
func WithHolder(ctx context.Context, h Holder) context.Context {
	return context.WithValue(ctx, holderKey{}, h)
}

// holderFrom is the Holder ctx carries, or one that counts nothing.
func holderFrom(ctx context.Context) Holder {
	if h, ok := ctx.Value(holderKey{}).(Holder); ok && h != nil {
		return h
	}
	return unbounded{}
}

type unbounded struct{}

func (unbounded) Hold(int64) bool { return false }
func (unbounded) Release(int64)   {}
