package replay

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/vmm"
)

// PoolOptions configure pool (Options.Pool).
type PoolOptions struct {
	// Slots is the number of slots (1 to MaxPoolSlots). Two let the host
	// prepare a step while the device runs the one before. Default 2.
	Slots int
	// ZeroCopyOutputs makes pool (also when auto chooses it) hand out its
	// outputs in the slot that ran instead of copying them into the
	// caller's buffers: Run's Outputs hold the slot's addresses and a
	// lease, and the slot is not reused until Outputs.Release. Output
	// bindings are then optional and ignored. Other strategies write the
	// caller's output buffers as usual. Default false.
	ZeroCopyOutputs bool
}

// MaxPoolSlots bounds PoolOptions.Slots.
const MaxPoolSlots = 64

// defaultPoolSlots is PoolOptions.Slots' default.
const defaultPoolSlots = 2

func (o PoolOptions) withDefaults() (PoolOptions, error) {
	switch {
	case o.Slots == 0:
		o.Slots = defaultPoolSlots
	case o.Slots < 0 || o.Slots > MaxPoolSlots:
		return o, fmt.Errorf("%d pool slots (1 to %d)", o.Slots, MaxPoolSlots)
	}
	return o, nil
}

// pool keeps PoolOptions.Slots slots, each one VMM allocation holding a
// copy of every param and output, mapped by New and kept mapped until
// Close, each with its own graph recorded at its first use and replayed
// forever after (see copies.go for the copies). States, constants and
// temps are the executable's own, shared by all slots: steps are ordered
// on the device anyway, because they share the states. A step whose bound
// buffers overlap runs over copies laid out as the caller's within the
// slot's own memory, which is sized for it (copies.go, "Aliased layouts").
// It needs VMM and stream memory operations; New fails with an error
// wrapping gpu.ErrNotSupported without them.
//
// # Slots and the timeline
//
// One vmm.Timeline per executable. Each slot remembers the point signalled
// after its last step; a slot is ready when the timeline has reached that
// point (the device is done with it) and no lease holds it. A step:
//
//  1. Acquire (under the executable's lock) picks the least recently used
//     slot not leased; when it is not ready, the executable drops its lock
//     and waits, on the timeline (yielding briefly, then backing off, up
//     to the executable's slot wait; see Spec.Poll) or for a lease
//     to be released, then tries again;
//  2. Run brings the slot's graph to the caller's addresses (only copy
//     nodes change), launches it, and enqueues the timeline write that
//     releases the slot right after, before anything that synchronises
//     (docs/ARCHITECTURE.md, rule 4);
//  3. the outputs handed back are the slot's that ran (rule 5): copied into
//     the caller's buffers by the graph, or, with zero-copy outputs, the
//     slot's own addresses under a lease.
//
// # Leases
//
// With PoolOptions.ZeroCopyOutputs a successful step leases its slot to the
// caller until the lease is released. Acquire never picks a leased slot;
// when all are leased, the executable waits up to its slot wait for a
// release and then fails with ErrSlotWait. Release may be called from any
// goroutine, without the executable's lock: the lease state has its own
// mutex (lock order: the executable's, then leases).
//
// # Options and counters
//
// Its options are PoolOptions (Options.Pool) and the copies' (CopyOptions,
// Options.Copies); it polls the timeline as Spec.Poll says. It counts what
// stable counts, and TimelineWrites (one per step) and SlotWaitSleeps (the
// waits for a slot that outlasted the yields); the executable counts
// SlotWaits. Each slot's graph is recorded at its first use (Records; no
// re-record).
type pool struct {
	base
	plan     *copyPlan
	tl       *vmm.Timeline
	slots    []*poolSlot
	zeroCopy bool
	outIdx   []int // per output of the executable, its index in plan.persistent
	mem      Memory

	// Guarded by the executable's lock.
	next *poolSlot // the slot acquire chose for the next run
	uses uint64    // steps launched, for least-recently-used order

	leases struct {
		sync.Mutex
		// changed is closed (and replaced) at every release, and closed
		// for good at close, to wake the runs waiting for a slot.
		changed chan struct{}
		closed  bool
	}
}

// poolSlot is one slot. leased is guarded by pool.leases; the rest by the
// executable's lock.
type poolSlot struct {
	index  int
	mem    *vmm.Allocation
	set    *copySet
	point  uint64 // timeline point signalled after its last step; 0: never used
	used   uint64 // pool.uses at its last step
	leased bool
}

// newPool checks the device, maps the slots and creates the timeline. A
// device without VMM or stream memory operations fails with an error
// wrapping gpu.ErrNotSupported before anything is created; a failure at
// slot k releases slots 0..k-1.
func newPool(spec Spec) (_ Strategy, err error) {
	b, dev, opts := spec.Backend, spec.Ordinal, spec.Options.Pool
	if _, _, err := gpu.VirtualMemoryOf(b, dev); err != nil {
		return nil, fmt.Errorf("pool: slots need virtual memory management: %w", err)
	}
	if _, err := gpu.StreamMemOpsOf(b, dev); err != nil {
		return nil, fmt.Errorf("pool: the slot timeline needs stream memory operations: %w", err)
	}
	plan, err := newCopyPlan(&spec, opts.ZeroCopyOutputs, !spec.Options.Copies.OnStream)
	if err != nil {
		return nil, err
	}
	offs, size := plan.layout()
	// Room for the aliased layouts too (copies.go); a program without
	// params and outputs still gets (empty) slots, so the pool behaves the
	// same; the smallest allocation is one granule.
	size = max(size+plan.aliasSlack(), 1)
	p := &pool{base: newBase(spec), plan: plan, zeroCopy: opts.ZeroCopyOutputs}
	p.leases.changed = make(chan struct{})
	for _, id := range spec.classes.Outputs {
		for k, pid := range plan.persistent {
			if pid == id {
				p.outIdx = append(p.outIdx, k)
			}
		}
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.Close())
		}
	}()
	n := opts.Slots
	for k := range n {
		a, err := vmm.Allocate(b, dev, size, nil)
		if err != nil {
			return nil, fmt.Errorf("pool: map slot %d of %d (%d bytes): %w", k, n, size, err)
		}
		persist := make([]gpu.DevicePtr, len(offs))
		for i, off := range offs {
			persist[i] = a.Ptr().Add(off)
		}
		// Aliased layouts go to the slot's own memory: a slot's copies
		// carry nothing from one step to the next.
		p.slots = append(p.slots, &poolSlot{index: k, mem: a, set: plan.newSet(persist, a.Ptr(), true, nil)})
		p.mem.Slots += a.Size()
	}
	p.mem.SlotCount = len(p.slots)
	if p.tl, err = vmm.NewTimeline(b, dev); err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	if err := p.tl.SetWaitPolicy(spec.Poll); err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	return p, nil
}

// Memory is the slots.
func (p *pool) Memory() Memory { return p.mem }

// WarmUp: pool records each slot's graph at the slot's first use.
func (p *pool) WarmUp() int { return len(p.slots) }

// AliasSafe: bound buffers that overlap get copies laid out as the caller's
// within the slot (copies.go).
func (p *pool) AliasSafe() bool { return true }

// LeasesOutputs reports whether Run hands out slot memory instead of
// copying into the caller's output buffers.
func (p *pool) LeasesOutputs() bool { return p.zeroCopy }

// Acquire chooses the slot of the next run. It returns nil when that slot
// is ready, or a function that waits, without the executable's lock, until
// it may be (ctx carries the deadline).
func (p *pool) Acquire() func(context.Context) error {
	if p.next != nil {
		return nil
	}
	p.leases.Lock()
	var slot *poolSlot
	for _, s := range p.slots {
		if !s.leased && (slot == nil || s.used < slot.used) {
			slot = s
		}
	}
	changed := p.leases.changed
	p.leases.Unlock()
	if slot == nil {
		n := len(p.slots)
		return func(ctx context.Context) error {
			select {
			case <-changed:
				return nil
			case <-ctx.Done():
				return slotWaitErr(fmt.Sprintf("all %d slots are leased (zero-copy outputs not released)", n),
					fmt.Errorf("%w (%w)", gpu.ErrTimeout, ctx.Err()), ctx.Err())
			}
		}
	}
	// Checked without waiting first: most slots are ready. The closure
	// holds the timeline itself, not p.tl, which close clears under the
	// executable's lock while the wait runs without it (a closed timeline
	// still answers Wait, from its last value).
	if tl, point := p.tl, slot.point; !tl.Reached(point) {
		return func(ctx context.Context) error {
			if err := tl.Wait(ctx, point, 0); err != nil {
				return slotWaitErr(fmt.Sprintf("slot %d: the device has not finished the step that last used it", slot.index), err, ctx.Err())
			}
			return nil
		}
	}
	p.next = slot
	return nil
}

// slotWaitErr wraps a failed wait for a slot: ErrSlotWait when the deadline
// passed, the cancellation otherwise.
func slotWaitErr(what string, err, ctxErr error) error {
	if errors.Is(ctxErr, context.Canceled) {
		return fmt.Errorf("pool: %s: %w", what, ctxErr)
	}
	return fmt.Errorf("%w: %s: %w", ErrSlotWait, what, err)
}

func (p *pool) Run(_ context.Context, s gpu.Stream, addrs []gpu.DevicePtr) (Result, error) {
	if p.Acquire() != nil {
		// The executable always acquires first; this is a bug guard, not a
		// path that waits.
		return Result{}, fmt.Errorf("pool: no slot is ready: %w", gpu.ErrIllegalState)
	}
	slot := p.next
	p.next = nil
	p.c.SlotWaitSleeps = p.tl.WaitStats().Slept
	sg, launched, err := p.plan.step(&p.base, slot.set, s, addrs)
	if launched {
		// Rule 4 (docs/ARCHITECTURE.md): the write that releases the slot follows the slot's work
		// at once, before the executable records its step event or anyone
		// synchronises.
		point, serr := p.tl.Signal(s)
		if serr == nil {
			slot.point = point
			p.c.TimelineWrites++
		} else {
			// The slot's work is in flight with no point to wait for: wait
			// for it here, so the slot is free when it is next taken.
			err = errors.Join(err, fmt.Errorf("pool: signal the timeline after slot %d: %w", slot.index, serr))
			if werr := p.b.StreamSynchronize(s); werr != nil {
				err = errors.Join(err, fmt.Errorf("pool: wait for slot %d instead: %w", slot.index, werr))
			}
		}
		p.uses++
		slot.used = p.uses
	}
	if err != nil {
		return Result{}, err
	}
	if !p.zeroCopy {
		return Result{}, nil
	}
	outs := make([]gpu.DevicePtr, len(p.outIdx))
	for i, k := range p.outIdx {
		outs[i] = sg.persist[k]
	}
	p.leases.Lock()
	slot.leased = true
	p.leases.Unlock()
	return Result{Outs: outs, Lease: &lease{p: p, slot: slot}}, nil
}

// Close wakes the runs waiting for a slot, destroys the graphs, closes the
// timeline and unmaps and releases every slot, reporting every failure.
// The executable has waited for its last step, so the timeline has no
// write pending.
func (p *pool) Close() error {
	p.leases.Lock()
	if !p.leases.closed {
		p.leases.closed = true
		close(p.leases.changed)
	}
	p.leases.Unlock()
	var errs []error
	for _, s := range p.slots {
		errs = append(errs, p.plan.closeSet(&p.base, s.set))
	}
	if p.tl != nil {
		if err := p.tl.Close(); err != nil {
			errs = append(errs, fmt.Errorf("pool: %w", err))
		}
		p.tl = nil
	}
	for _, s := range p.slots {
		if err := s.mem.Close(); err != nil {
			errs = append(errs, fmt.Errorf("pool: slot %d: %w", s.index, err))
		}
	}
	p.slots = nil
	return errors.Join(errs...)
}

// lease is a pool slot held for the caller by zero-copy outputs.
type lease struct {
	p        *pool
	slot     *poolSlot
	released bool // guarded by p.leases
}

// Release gives the slot back to the pool and wakes the runs waiting for
// one. It is idempotent and safe from any goroutine.
func (l *lease) Release() {
	p := l.p
	p.leases.Lock()
	defer p.leases.Unlock()
	if l.released {
		return
	}
	l.released = true
	l.slot.leased = false
	if !p.leases.closed {
		close(p.leases.changed)
		p.leases.changed = make(chan struct{})
	}
}

// Released reports whether Release was called.
func (l *lease) Released() bool {
	l.p.leases.Lock()
	defer l.p.leases.Unlock()
	return l.released
}

// modelPool prices a pool step (its copies and the timeline write), or
// says why the device cannot run it: no VMM or stream memory operations,
// a program it cannot lease, or slots larger than
// Costs.PoolMemoryFraction of the free memory.
func modelPool(spec Spec) Candidate {
	cand := Candidate{Strategy: Pool}
	opts, costs := spec.Options.Pool, spec.Costs
	_, gran, err := gpu.VirtualMemoryOf(spec.Backend, spec.Ordinal)
	if err != nil {
		cand.Note = err.Error()
		return cand
	}
	if _, err := gpu.StreamMemOpsOf(spec.Backend, spec.Ordinal); err != nil {
		cand.Note = err.Error()
		return cand
	}
	pl, err := newCopyPlan(&spec, opts.ZeroCopyOutputs, !spec.Options.Copies.OnStream)
	if err != nil {
		cand.Note = err.Error()
		return cand
	}
	_, size := pl.layout()
	slots := uint64(opts.Slots) * gpu.RoundUp(max(size+pl.aliasSlack(), 1), gran)
	free, _, err := spec.Backend.MemGetInfo(spec.Ordinal)
	if err != nil {
		cand.Note = fmt.Sprintf("free device memory unknown: %v", err)
		return cand
	}
	if budget := costs.PoolMemoryFraction * float64(free); float64(slots) > budget {
		cand.Note = fmt.Sprintf("%d slots would take %d bytes, more than %.0f%% of the %d bytes free",
			opts.Slots, slots, 100*costs.PoolMemoryFraction, free)
		return cand
	}
	us, note := pl.model(costs)
	cand.Usable, cand.StepUS = true, us+costs.TimelineWriteUS
	cand.Note = fmt.Sprintf("%s, a timeline write, %d bytes of slots", note, slots)
	if opts.ZeroCopyOutputs {
		cand.Note += ", outputs leased"
	}
	return cand
}
