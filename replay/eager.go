package replay

import (
	"context"
	"log/slog"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/graph"
)

// eager launches every command on the stream every step. It records
// nothing and is the reference the others must match bit for bit.
type eager struct{ base }

func newEager(spec Spec) (Strategy, error) { return &eager{newBase(spec)}, nil }

func (st *eager) Run(_ context.Context, s gpu.Stream, addrs []gpu.DevicePtr) (Result, error) {
	n, err := st.cb.Launch(st.b, s, addrs)
	st.c.Launches += int64(n)
	return Result{}, err
}

func (st *eager) Close() error { return nil }

// base is what every strategy keeps of its Spec, and its counters.
type base struct {
	b   gpu.Backend
	cb  *graph.CommandBuffer
	log *slog.Logger
	c   Counters
}

func newBase(spec Spec) base {
	return base{b: spec.Backend, cb: spec.Commands, log: spec.Logger}
}

// Counters returns what the strategy counted.
func (st *base) Counters() Counters { return st.c }
