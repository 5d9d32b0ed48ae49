package replay

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/stablegraph/stablegraph/gpu"
)

// stable gives every param and output one persistent allocation of its own
// for the life of the executable (so a fault names the buffer): the step's
// graph is recorded once over them, and each step copies params in and
// outputs out (see copies.go); states are never copied. The copies are
// nodes of the step's graph, so a step is one launch; only their
// caller-side pointers are updated when the caller's buffers move
// (Counters.CopyNodeUpdates), nothing else is patched. Its allocations are
// made by New, so a step allocates nothing, with one exception: the first
// step whose bound buffers overlap, one of them written, allocates the area
// where stable lays out copies of the overlapping buffers as the caller's
// are (copies.go, "Aliased layouts"), as large as the copies of every bound
// buffer together, and keeps it until Close.
//
// Its options are the copies' (CopyOptions, Options.Copies). It counts
// BytesCopied, CopyNodeUpdates, AliasedSteps, Launches (the copies when
// they are stream copies), a state rebound as a re-record for a move
// (MoveRerecords), a refused copy node update as one for a refusal
// (UpdateFallbacks, and Stats.Fallbacks says why) and a step after a
// failed update as one for a retry; GraphLaunches.
type stable struct {
	base
	plan  *copyPlan
	set   *copySet
	mem   []gpu.DevicePtr // the persistent allocations, parallel to plan.persistent
	names []string        // their buffers' names, for errors
	dev   int
	// area is the aliased layouts' allocation (0 until the first aliased
	// step); bytes is what mem and area hold, read by Memory without the
	// executable's lock.
	area  gpu.DevicePtr
	bytes atomic.Uint64
}

// newStable allocates the persistent copies. On error it has released
// everything.
func newStable(spec Spec) (_ Strategy, err error) {
	plan, err := newCopyPlan(&spec, false, !spec.Options.Copies.OnStream)
	if err != nil {
		return nil, err
	}
	st := &stable{base: newBase(spec), plan: plan, dev: spec.Ordinal}
	defer func() {
		if err != nil {
			err = errors.Join(err, st.freeMem())
		}
	}()
	for _, id := range plan.persistent {
		d := &spec.Buffers[id]
		size := gpu.RoundUp(uint64(d.Size), spec.Alignment)
		p, err := st.b.MemAlloc(spec.Ordinal, size)
		if err != nil {
			return nil, fmt.Errorf("stable: allocate the persistent copy of %s %q (%d bytes): %w", d.Class, d.Name, size, err)
		}
		st.mem = append(st.mem, p)
		st.names = append(st.names, d.Name)
		st.bytes.Add(size)
	}
	st.set = plan.newSet(st.mem, 0, false, st.allocArea)
	return st, nil
}

// allocArea allocates the aliased layouts' area.
func (st *stable) allocArea() (gpu.DevicePtr, error) {
	size := st.plan.callerBytes()
	p, err := st.b.MemAlloc(st.dev, size)
	if err != nil {
		return 0, fmt.Errorf("stable: allocate %d bytes: %w", size, err)
	}
	st.area = p
	st.bytes.Add(size)
	return p, nil
}

func (st *stable) Run(_ context.Context, s gpu.Stream, addrs []gpu.DevicePtr) (Result, error) {
	_, _, err := st.plan.step(&st.base, st.set, s, addrs)
	return Result{}, err
}

// AliasSafe: bound buffers that overlap get copies laid out as the caller's
// (copies.go).
func (st *stable) AliasSafe() bool { return true }

// Memory is the persistent copies, and the aliased layouts' area once
// allocated.
func (st *stable) Memory() Memory { return Memory{Persistent: st.bytes.Load()} }

// Close destroys the graphs and frees the persistent copies, reporting
// every failure.
func (st *stable) Close() error {
	var errs []error
	if st.set != nil {
		errs = append(errs, st.plan.closeSet(&st.base, st.set))
	}
	errs = append(errs, st.freeMem())
	return errors.Join(errs...)
}

// freeMem frees the persistent copies and the area; one whose free fails
// is reported and forgotten, since the executable is closed whatever
// happens.
func (st *stable) freeMem() error {
	var errs []error
	for i, p := range st.mem {
		if err := st.b.MemFree(p); err != nil {
			errs = append(errs, fmt.Errorf("free the persistent copy of %q: %w", st.names[i], err))
		}
	}
	st.mem = nil
	if st.area != 0 {
		if err := st.b.MemFree(st.area); err != nil {
			errs = append(errs, fmt.Errorf("free the aliased layouts' area: %w", err))
		}
		st.area = 0
	}
	return errors.Join(errs...)
}

// modelStable prices the copies of a step.
func modelStable(spec Spec) Candidate {
	pl, err := newCopyPlan(&spec, false, !spec.Options.Copies.OnStream)
	if err != nil {
		return Candidate{Strategy: Stable, Note: err.Error()}
	}
	us, note := pl.model(spec.Costs)
	return Candidate{Strategy: Stable, Usable: true, StepUS: us, Note: note}
}
