package stablegraph

import (
	"context"
	"errors"
	"fmt"

	"github.com/stablegraph/stablegraph/gpu"
)

// stable is StrategyStable: every param and output has one persistent
// allocation of its own for the life of the executable (so a fault names
// the buffer), the step's graph is recorded once over them, and each step
// copies params in and outputs out (see persist.go). Its allocations are
// made at Compile, so a step allocates nothing; like every strategy it runs
// under the executable's lock, which makes lookup, allocation and use one
// critical section.
type stable struct {
	strategyEnv
	plan  *copyPlan
	slot  *slotGraph
	mem   []gpu.DevicePtr // the persistent allocations, parallel to plan.persistent
	names []string        // their buffers' names, for errors
}

// newStable allocates the persistent copies and returns the strategy and
// the device bytes it holds. On error it has released everything.
func newStable(e *Executable, env strategyEnv) (_ *stable, bytes uint64, err error) {
	plan, err := newCopyPlan(e, false, !e.opts.StreamCopies)
	if err != nil {
		return nil, 0, err
	}
	st := &stable{strategyEnv: env, plan: plan}
	defer func() {
		if err != nil {
			err = errors.Join(err, st.freeMem())
		}
	}()
	for _, id := range plan.persistent {
		d := &e.bufs[id]
		size := gpu.RoundUp(uint64(d.size), e.opts.Alignment)
		p, err := e.b.MemAlloc(e.dev, size)
		if err != nil {
			return nil, 0, fmt.Errorf("stable: allocate the persistent copy of %s %q (%d bytes): %w", d.class, d.name, size, err)
		}
		st.mem = append(st.mem, p)
		st.names = append(st.names, d.name)
		bytes += size
	}
	st.slot = plan.newSlot(st.mem)
	return st, bytes, nil
}

func (st *stable) run(_ context.Context, s gpu.Stream, addrs []gpu.DevicePtr) (stepResult, error) {
	_, err := st.plan.step(&st.strategyEnv, st.slot, s, addrs)
	return stepResult{}, err
}

// close destroys the graph and frees the persistent copies, reporting every
// failure.
func (st *stable) close() error {
	var errs []error
	if st.slot != nil {
		errs = append(errs, st.plan.dropExec(&st.strategyEnv, st.slot))
	}
	errs = append(errs, st.freeMem())
	return errors.Join(errs...)
}

// freeMem frees the persistent copies; one whose free fails is reported
// and forgotten, since the executable is closed whatever happens.
func (st *stable) freeMem() error {
	var errs []error
	for i, p := range st.mem {
		if err := st.b.MemFree(p); err != nil {
			errs = append(errs, fmt.Errorf("free the persistent copy of %q: %w", st.names[i], err))
		}
	}
	st.mem = nil
	return errors.Join(errs...)
}
