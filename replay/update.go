package replay

import (
	"context"
	"errors"

	"github.com/stablegraph/stablegraph/gpu"
)

// update re-records the commands into a new graph when addresses change
// and applies it to the executable graph with a whole-graph exec update
// (graph.CommandBuffer.Update), re-instantiating when the driver refuses.
// A failed update (not a refusal) leaves the executable graph as it was,
// and the next step updates it again. It has no options. It counts
// GraphUpdates, and a refused update as a re-record (UpdateFallbacks, and
// Stats.Fallbacks says why); GraphLaunches.
type update struct{ callerGraph }

func newUpdate(spec Spec) (Strategy, error) { return &update{callerGraph{base: newBase(spec)}}, nil }

func (st *update) Run(_ context.Context, s gpu.Stream, addrs []gpu.DevicePtr) (Result, error) {
	switch {
	case st.x == nil:
		// The first step, or a failed step dropped the graph.
		if err := st.record(addrs, causeRetry, nil); err != nil {
			return Result{}, err
		}
	case st.cb.Moved(st.x.Addrs(), addrs):
		err := st.cb.Update(st.b, st.x, addrs)
		if err == nil {
			st.c.GraphUpdates++
			break
		}
		if !errors.Is(err, gpu.ErrGraphUpdate) {
			return Result{}, err
		}
		st.refused("graph exec update", err)
		if rerr := st.record(addrs, causeRefused, err); rerr != nil {
			return Result{}, rerr
		}
	}
	return Result{}, st.launch(s)
}
