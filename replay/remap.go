package replay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/graph"
	"github.com/stablegraph/stablegraph/vmm"
)

// remap keeps the graph's addresses fixed and moves the memory instead:
// XLA's way on CUDA (opt-in there), measured here as the baseline the
// circular pool was designed against. Each param and output has a
// virtual address range of its own, reserved by New (the buffer's size
// rounded up to whole granules); the graph is recorded once over those
// ranges. Each step, for every bound buffer whose memory is not the one
// its range maps already, remap waits for the device to finish the step
// before (the event recorded after its launch), unmaps the old memory,
// maps the physical chunk behind the caller's buffer into the range, and
// grants the step's device access; then it launches the graph. Nothing is
// copied: the step reads and writes the caller's own memory through the
// ranges, so the caller sees eager's bytes in its buffers.
//
// States, temps and constants are the executable's own memory at fixed
// addresses and are never remapped: the graph refers to them directly. A
// state rebound with BindState changes the address vector of the body,
// and the graph is recorded anew, as stable and pool do.
//
// # The caller's memory
//
// Mapping needs the physical chunk behind a bound address, which the
// driver does not give for memory it did not map through VMM: the caller
// allocates its params and outputs with a remappable allocator (package
// remappable: one chunk per buffer) and hands it to the executable
// (RemapOptions.Memory, stablegraph.Options' Remap.Memory), whose Chunk
// method is the lookup. New refuses a program with params or outputs and
// no lookup, and Run refuses, before it unmaps anything:
//
//   - a buffer the lookup does not know (plain MemAlloc memory, a bfc
//     region): gpu.ErrNotSupported, naming the buffer;
//   - a buffer that starts inside its chunk at an offset that is not a
//     whole number of granules, or whose chunk holds fewer bytes from
//     there than the buffer's range maps (its size rounded up to whole
//     granules): ErrInvalidBinding;
//   - two bound buffers whose ranges would map a granule of one chunk
//     both: ErrInvalidBinding (a write through one range would land in
//     the other's padding or bytes);
//   - memory on another device than the step's: gpu.ErrNotSupported.
//
// # Waiting for the device
//
// A range may be unmapped only once no work that uses it is pending, and
// unmapping is not ordered on a stream: the host waits. remap records an
// event after every launch and, before it remaps anything, polls it
// (EventQuery, following Spec.Poll: yields, then sleeps) until the step
// before is done, up to Spec.Wait or ctx's deadline, never
// with a device-wide synchronization. A step that moves nothing does not
// wait: the graph is launched behind the one before, as every graph
// strategy does. The wait is made under the executable's lock, since only
// Run sees which buffers moved; it is the cost this strategy exists to
// measure (the host cannot run ahead of the device by more than one step
// when buffers move).
//
// # Errors
//
// Run leaves every range in a state it knows: mapped to a known chunk,
// or empty. A failed unmap leaves the old chunk mapped; a failed map
// leaves the range empty; a failed set access unmaps the new chunk again
// (or, when that fails too, marks the range to be remapped). The next Run
// remaps what is not as it should be, so the strategy stays usable. Close
// unmaps every range and frees it, reporting every failure.
//
// # Options and counters
//
// Its options are RemapOptions (Options.Remap); Spec.Poll and Spec.Wait
// say how it waits. It counts Remaps (one per bound buffer that moved), a
// state rebound as a re-record for a move (MoveRerecords), and
// GraphLaunches.
type remap struct {
	base
	dev    int
	gran   uint64
	finder ChunkFinder
	poll   vmm.WaitPolicy
	wait   time.Duration
	bufs   []Buffer
	bound  []int         // the params and outputs, in order
	ranges []*remapRange // parallel to bound
	// addrs is the step's address vector with the bound buffers at their
	// ranges, rewritten every step.
	addrs   []gpu.DevicePtr
	targets []remapTarget // per bound buffer, this step's memory
	// byChunk and sameChunk chain the bound buffers by chunk as resolve
	// goes: the last one on each chunk, and for each the one before it on
	// the same chunk (-1: none). Kept across steps to allocate nothing.
	byChunk   map[*vmm.PhysicalAllocation]int
	sameChunk []int
	x         *graph.Exec // nil before the first step and after a failed record
	ev        gpu.Event   // recorded after every launch
	pending   bool        // ev marks a launch the device may not have finished
}

// RemapOptions configure remap (Options.Remap).
type RemapOptions struct {
	// Memory is where remap finds the physical memory behind the params
	// and outputs the caller binds: the remappable.Allocator they are
	// allocated from. Remap needs it for a program with params or outputs;
	// the other strategies ignore it. Default nil.
	Memory ChunkFinder
}

// remapRange is one bound buffer's range and what it maps.
type remapRange struct {
	res  *vmm.Reservation
	size uint64 // the bytes mapped: the buffer's size in whole granules
	// m is the mapping of chunk from byte from on; nil when the range is
	// empty. ok is false when m is not known to be accessible (a set
	// access failed and so did the unmap after it): remap it.
	m     *vmm.Mapping
	chunk *vmm.PhysicalAllocation
	from  uint64
	ok    bool
}

// remapTarget is the memory a bound buffer should map this step.
type remapTarget struct {
	chunk *vmm.PhysicalAllocation
	from  uint64
}

// defaultDeviceWait bounds remap's wait when Spec.Wait is zero (the root
// package passes its SlotWait, whose default this is).
const defaultDeviceWait = 30 * time.Second

// newRemap checks the device and the options, creates the event and
// reserves a range per param and output; on error it releases what it
// made.
func newRemap(spec Spec) (_ Strategy, err error) {
	b, dev := spec.Backend, spec.Ordinal
	_, gran, err := gpu.VirtualMemoryOf(b, dev)
	if err != nil {
		return nil, fmt.Errorf("remap: ranges need virtual memory management: %w", err)
	}
	r := &remap{base: newBase(spec), dev: dev, gran: gran, finder: spec.Options.Remap.Memory, poll: spec.Poll,
		wait: spec.Wait, bufs: spec.Buffers, bound: spec.classes.Bound}
	if r.wait <= 0 {
		r.wait = defaultDeviceWait
	}
	if len(r.bound) > 0 && r.finder == nil {
		return nil, fmt.Errorf("remap: no remappable allocator (Options.Remap.Memory): remap maps the physical memory behind "+
			"the params and outputs, which must come from one (package remappable): %w", gpu.ErrNotSupported)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, r.Close())
		}
	}()
	if r.ev, err = b.EventCreate(dev, gpu.EventDisableTiming); err != nil {
		return nil, fmt.Errorf("remap: event: %w", err)
	}
	for _, id := range r.bound {
		d := &spec.Buffers[id]
		size := gpu.RoundUp(uint64(max(d.Size, 1)), gran)
		res, err := vmm.Reserve(b, dev, size, 0)
		if err != nil {
			return nil, fmt.Errorf("remap: range of %s %q: %w", d.Class, d.Name, err)
		}
		r.ranges = append(r.ranges, &remapRange{res: res, size: size})
	}
	r.addrs = make([]gpu.DevicePtr, len(spec.Buffers))
	r.targets = make([]remapTarget, len(r.bound))
	r.byChunk, r.sameChunk = make(map[*vmm.PhysicalAllocation]int, len(r.bound)), make([]int, len(r.bound))
	return r, nil
}

func (r *remap) Run(ctx context.Context, s gpu.Stream, addrs []gpu.DevicePtr) (Result, error) {
	if err := r.resolve(addrs); err != nil {
		return Result{}, err
	}
	if err := r.remapMoved(ctx); err != nil {
		return Result{}, err
	}
	copy(r.addrs, addrs)
	for k, id := range r.bound {
		r.addrs[id] = r.ranges[k].res.Ptr()
	}
	switch {
	case r.x == nil:
		// The first step (a failed record keeps the graph before).
		if err := r.record(causeRetry); err != nil {
			return Result{}, err
		}
	case !slices.Equal(r.x.Addrs(), r.addrs):
		// A state rebound: the ranges never move.
		if err := r.record(causeMoved); err != nil {
			return Result{}, err
		}
	}
	if err := r.x.Launch(r.b, s); err != nil {
		return Result{}, err
	}
	r.c.GraphLaunches++
	if err := r.b.EventRecord(r.ev, s); err != nil {
		// Without the event the next remap could not tell when the device
		// is done with the ranges: wait for the launch here instead.
		// (When that fails too, the stream has faulted, and so will the
		// next step's query of the event.)
		err = fmt.Errorf("remap: record the event after the launch: %w", err)
		if serr := r.b.StreamSynchronize(s); serr != nil {
			return Result{}, errors.Join(err, fmt.Errorf("remap: wait for the launch instead: %w", serr))
		}
		r.pending = false
		return Result{}, err
	}
	r.pending = true
	return Result{}, nil
}

// resolve finds the memory behind every bound buffer and checks that it
// can be mapped, into r.targets. It changes nothing else.
func (r *remap) resolve(addrs []gpu.DevicePtr) error {
	clear(r.byChunk)
	for k, id := range r.bound {
		d, p, rg := &r.bufs[id], addrs[id], r.ranges[k]
		chunk, from, err := r.finder.Chunk(p)
		if errors.Is(err, gpu.ErrNotFound) {
			return fmt.Errorf("remap: %s %q is bound at %#x, which is not memory of the remappable allocator (Options.Remap.Memory): %w (%w)",
				d.Class, d.Name, uint64(p), gpu.ErrNotSupported, err)
		}
		if err != nil {
			return fmt.Errorf("remap: find the memory of %s %q at %#x: %w", d.Class, d.Name, uint64(p), err)
		}
		switch {
		case chunk.Device() != r.dev:
			return fmt.Errorf("remap: %s %q is bound to memory of device %d; the step runs on device %d: %w",
				d.Class, d.Name, chunk.Device(), r.dev, gpu.ErrNotSupported)
		case from%r.gran != 0:
			return fmt.Errorf("%w: remap: %s %q is bound at %#x, %d bytes into its physical allocation; "+
				"remap maps whole granules of %d bytes, so a buffer must start at a multiple of them",
				ErrInvalidBinding, d.Class, d.Name, uint64(p), from, r.gran)
		case from > chunk.Size() || chunk.Size()-from < rg.size:
			return fmt.Errorf("%w: remap: %s %q needs %d bytes of its physical allocation (%d rounded up to whole granules of %d); "+
				"the one at %#x has %d from there",
				ErrInvalidBinding, d.Class, d.Name, rg.size, d.Size, r.gran, uint64(p), chunk.Size()-min(from, chunk.Size()))
		}
		r.targets[k] = remapTarget{chunk: chunk, from: from}
		// Only buffers on the same chunk can share a granule: walk those.
		first, seen := r.byChunk[chunk]
		for j := first; seen && j >= 0; j = r.sameChunk[j] {
			o := r.targets[j]
			if o.from < from+rg.size && from < o.from+r.ranges[j].size {
				od := &r.bufs[r.bound[j]]
				return fmt.Errorf("%w: remap: %s %q at %#x and %s %q at %#x share a granule of one physical allocation; "+
					"remap maps whole granules of %d bytes, so each bound buffer needs granules of its own",
					ErrInvalidBinding, od.Class, od.Name, uint64(addrs[r.bound[j]]), d.Class, d.Name, uint64(p), r.gran)
			}
		}
		r.sameChunk[k] = -1
		if seen {
			r.sameChunk[k] = first
		}
		r.byChunk[chunk] = k
	}
	return nil
}

// remapMoved maps r.targets into the ranges that do not map them already,
// after waiting for the step before when there is any.
func (r *remap) remapMoved(ctx context.Context) error {
	waited := false
	for k, rg := range r.ranges {
		t := r.targets[k]
		if rg.m != nil && rg.ok && rg.chunk == t.chunk && rg.from == t.from {
			continue
		}
		if !waited {
			if err := r.waitDevice(ctx); err != nil {
				return err
			}
			waited = true
		}
		if err := r.remapRange(k, t); err != nil {
			return err
		}
		r.c.Remaps++
	}
	return nil
}

// waitDevice waits for the last launch to complete, polling its event.
func (r *remap) waitDevice(ctx context.Context) error {
	if !r.pending {
		return nil
	}
	var qerr error
	done := func() bool {
		ok, err := r.b.EventQuery(r.ev)
		if err != nil {
			qerr = err
			return true
		}
		return ok
	}
	_, err := r.poll.Poll(ctx, time.Now().Add(r.wait), done, nil)
	switch {
	case qerr != nil:
		return fmt.Errorf("remap: wait for the step before to finish with the ranges: %w", qerr)
	case err != nil:
		return fmt.Errorf("remap: wait for the step before to finish with the ranges (up to %v): %w", r.wait, err)
	}
	r.pending = false
	return nil
}

// remapRange makes range k map t: unmaps what it maps, maps t, grants the
// step's device access.
func (r *remap) remapRange(k int, t remapTarget) error {
	rg, d := r.ranges[k], &r.bufs[r.bound[k]]
	if rg.m != nil {
		if err := rg.m.Close(); err != nil {
			return fmt.Errorf("remap: %s %q: %w", d.Class, d.Name, err)
		}
		rg.m, rg.chunk, rg.ok = nil, nil, false
	}
	m, err := vmm.MapRange(rg.res, 0, t.chunk, t.from, rg.size)
	if err != nil {
		return fmt.Errorf("remap: %s %q: %w", d.Class, d.Name, err)
	}
	if err := m.SetAccess([]int{r.dev}); err != nil {
		err = fmt.Errorf("remap: %s %q: %w", d.Class, d.Name, err)
		if uerr := m.Close(); uerr != nil {
			// Still mapped, without access: the next step remaps it.
			rg.m, rg.chunk, rg.from = m, t.chunk, t.from
			return errors.Join(err, fmt.Errorf("remap: %s %q: undo the map: %w", d.Class, d.Name, uerr))
		}
		return err
	}
	rg.m, rg.chunk, rg.from, rg.ok = m, t.chunk, t.from, true
	return nil
}

// record records and instantiates the graph over r.addrs, replacing the
// old one only once the new one exists; a record after the first is a
// re-record for cause. Traced commands are captured, not traced for
// patching: the addresses do not move.
func (r *remap) record(cause recordCause) error {
	x, err := r.cb.Instantiate(r.b, r.addrs, false)
	if err != nil {
		return err
	}
	r.countRecord(r.c.Records > 0, cause, nil)
	err = r.dropExec()
	r.x = x
	return err
}

func (r *remap) dropExec() error {
	if r.x == nil {
		return nil
	}
	err := r.x.Destroy(r.b)
	r.x = nil
	return err
}

// Close destroys the graph, unmaps and frees every range and destroys the
// event, reporting every failure. The executable has waited for its last
// step. What could not be released stays held, so Close may be retried.
func (r *remap) Close() error {
	errs := []error{r.dropExec()}
	kept := r.ranges[:0]
	for k, rg := range r.ranges {
		if rg.m != nil {
			if err := rg.m.Close(); err != nil {
				errs = append(errs, fmt.Errorf("remap: range %d: %w", k, err))
				kept = append(kept, rg)
				continue
			}
			rg.m, rg.chunk, rg.ok = nil, nil, false
		}
		if err := rg.res.Free(); err != nil {
			errs = append(errs, fmt.Errorf("remap: range %d: %w", k, err))
			kept = append(kept, rg)
		}
	}
	r.ranges = kept
	if r.ev != 0 {
		if err := r.b.EventDestroy(r.ev); err != nil {
			errs = append(errs, fmt.Errorf("remap: event: %w", err))
		} else {
			r.ev = 0
		}
	}
	return errors.Join(errs...)
}
