package replay

import (
	"context"

	"github.com/stablegraph/stablegraph/gpu"
)

// record records the commands into a graph and, whenever an address they
// use changes, records and instantiates it again: what other runtimes
// ship, and the cost the other graph strategies avoid. It has no options.
// It counts Records, and every move as a re-record for a move
// (MoveRerecords); GraphLaunches.
type record struct{ callerGraph }

func newRecord(spec Spec) (Strategy, error) { return &record{callerGraph{base: newBase(spec)}}, nil }

func (st *record) Run(_ context.Context, s gpu.Stream, addrs []gpu.DevicePtr) (Result, error) {
	switch {
	case st.x == nil:
		// The first step, or a failed step dropped the graph.
		if err := st.record(addrs, causeRetry, nil); err != nil {
			return Result{}, err
		}
	case st.cb.Moved(st.x.Addrs(), addrs):
		if err := st.record(addrs, causeMoved, nil); err != nil {
			return Result{}, err
		}
	}
	return Result{}, st.launch(s)
}
