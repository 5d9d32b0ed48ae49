package replay

import (
	"context"

	"github.com/stablegraph/stablegraph/gpu"
)

// eager launches every command on the stream every step. It records
// nothing and is the reference the others must match bit for bit. It has
// no options, and counts Launches: the commands it enqueued.
type eager struct{ base }

func newEager(spec Spec) (Strategy, error) { return &eager{newBase(spec)}, nil }

func (st *eager) Run(_ context.Context, s gpu.Stream, addrs []gpu.DevicePtr) (Result, error) {
	n, err := st.cb.Launch(st.b, s, addrs)
	st.c.Launches += int64(n)
	return Result{}, err
}

func (st *eager) Close() error { return nil }

// AliasSafe: eager works in the caller's memory, the reference semantics.
func (st *eager) AliasSafe() bool { return true }
