package replay

import (
	"context"
	"errors"
	"fmt"

	"github.com/stablegraph/stablegraph/gpu"
)

// stable gives every param and output one persistent allocation of its own
// for the life of the executable (so a fault names the buffer): the step's
// graph is recorded once over them, and each step copies params in and
// outputs out (see copies.go); states are never copied. The copies are
// nodes of the step's graph, so a step is one launch; only their
// caller-side pointers are updated when the caller's buffers move
// (Counters.CopyNodeUpdates), nothing else is patched. Its allocations are
// made by New, so a step allocates nothing.
type stable struct {
	base
	plan  *copyPlan
	slot  *slotGraph
	mem   []gpu.DevicePtr // the persistent allocations, parallel to plan.persistent
	names []string        // their buffers' names, for errors
	bytes uint64          // what mem holds
}

// newStable allocates the persistent copies. On error it has released
// everything.
func newStable(spec Spec) (_ Strategy, err error) {
	plan, err := newCopyPlan(&spec, false, !spec.Options.StreamCopies)
	if err != nil {
		return nil, err
	}
	st := &stable{base: newBase(spec), plan: plan}
	defer func() {
		if err != nil {
			err = errors.Join(err, st.freeMem())
		}
	}()
	for _, id := range plan.persistent {
		d := &spec.Buffers[id]
		size := gpu.RoundUp(uint64(d.Size), spec.Options.Alignment)
		p, err := st.b.MemAlloc(spec.Device, size)
		if err != nil {
			return nil, fmt.Errorf("stable: allocate the persistent copy of %s %q (%d bytes): %w", d.Class, d.Name, size, err)
		}
		st.mem = append(st.mem, p)
		st.names = append(st.names, d.Name)
		st.bytes += size
	}
	st.slot = plan.newSlot(st.mem)
	return st, nil
}

func (st *stable) Run(_ context.Context, s gpu.Stream, addrs []gpu.DevicePtr) (Result, error) {
	_, err := st.plan.step(&st.base, st.slot, s, addrs)
	return Result{}, err
}

// Memory is the persistent copies.
func (st *stable) Memory() Memory { return Memory{Persistent: st.bytes} }

// Close destroys the graph and frees the persistent copies, reporting
// every failure.
func (st *stable) Close() error {
	var errs []error
	if st.slot != nil {
		errs = append(errs, st.plan.dropExec(&st.base, st.slot))
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

// modelStable prices the copies of a step.
func modelStable(spec Spec) Candidate {
	pl, err := newCopyPlan(&spec, false, !spec.Options.StreamCopies)
	if err != nil {
		return Candidate{Strategy: Stable, Note: err.Error()}
	}
	us, note := pl.model(spec.Options.Costs)
	return Candidate{Strategy: Stable, Usable: true, StepUS: us, Note: note}
}
