package vmm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
)

// Timeline is a monotonic 64-bit counter in pinned host memory that a
// stream advances and the host reads without synchronizing. It is the one
// timeline of the module: pool slots (package replay) and retirement queues
// (package retire) both wait on it.
//
// Points are handed out by Signal, 1, 2, 3, ...; the counter holds the last
// point the device wrote. A timeline is monotonic only if the writes happen
// in the order of their points, so signal one timeline from one stream (or
// from streams ordered by events). Bind makes that a rule the timeline
// enforces, and lets its waits notice a faulted stream.
//
// A Timeline is safe for concurrent use.
type Timeline struct {
	drv TimelineDriver
	ops gpu.StreamMemOps // drv's, found with gpu.StreamMemOpsOf
	dev int

	// sig serialises Signal and Close, so that points reach the stream in
	// increasing order when several goroutines signal it. Lock order: sig,
	// then mu.
	sig struct {
		sync.Mutex
		last uint64 // last point handed out by Signal
	}
	// bound is the stream Bind set (a gpu.Stream), 0 when unbound. Read
	// without sig by Wait.
	bound atomic.Uint64

	// mu guards the host memory's lifetime: readers (Completed, Signal)
	// share it, Close takes it alone, so no read or enqueue ever touches
	// freed memory and Completed never waits behind a Signal.
	mu struct {
		sync.RWMutex
		mem    gpu.HostMem
		final  uint64 // Completed after Close
		closed bool
	}

	policy atomic.Pointer[WaitPolicy] // nil: the default
	waits  waitCounters
}

// NewTimeline allocates an 8-byte, zeroed host-visible counter for streams
// of dev. A device without stream memory operations gives an error wrapping
// gpu.ErrNotSupported, before anything is allocated.
func NewTimeline(drv TimelineDriver, dev int) (*Timeline, error) {
	ops, err := gpu.StreamMemOpsOf(drv, dev)
	if err != nil {
		return nil, fmt.Errorf("vmm: new timeline on device %d: %w", dev, err)
	}
	mem, err := ops.HostAlloc(8)
	if err != nil {
		return nil, fmt.Errorf("vmm: new timeline on device %d: HostAlloc: %w", dev, err)
	}
	if len(mem.Bytes) < 8 {
		// A short view would make Load64 read out of bounds; refuse it
		// rather than trust the backend.
		ferr := ops.HostFree(mem.Handle)
		return nil, errors.Join(fmt.Errorf("vmm: new timeline on device %d: host word of %d bytes: %w", dev, len(mem.Bytes), gpu.ErrInvalidValue), ferr)
	}
	t := &Timeline{drv: drv, ops: ops, dev: dev}
	t.mu.mem = mem
	return t, nil
}

// Bind makes s the only stream that may signal the timeline, for a user
// that signals from one stream and joins its other streams into it (the
// client's retirement queues). A bound timeline refuses Signal on any
// other stream with gpu.ErrInvalidValue; its waits, once they sleep, query
// s before every sleep and end early with s's error when s has faulted (a
// faulted stream never writes its point); and Close refuses, with
// gpu.ErrIllegalState, while s still has a point to write. Bind on a
// timeline already bound to another stream is gpu.ErrInvalidValue.
func (t *Timeline) Bind(s gpu.Stream) error {
	if s == 0 {
		return fmt.Errorf("vmm: bind a timeline to stream 0: %w", gpu.ErrInvalidHandle)
	}
	if !t.bound.CompareAndSwap(0, uint64(s)) && t.bound.Load() != uint64(s) {
		return fmt.Errorf("vmm: bind a timeline to stream %#x: bound to stream %#x: %w", uint64(s), t.bound.Load(), gpu.ErrInvalidValue)
	}
	return nil
}

// Signal enqueues on s the write of the next point and returns that point:
// once s has finished the work submitted before this call, Completed
// returns at least point. On error no point is consumed.
func (t *Timeline) Signal(s gpu.Stream) (point uint64, err error) {
	t.sig.Lock()
	defer t.sig.Unlock()
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.mu.closed {
		return 0, fmt.Errorf("vmm: timeline signal: %w", errReleased("timeline"))
	}
	if b := gpu.Stream(t.bound.Load()); b != 0 && b != s {
		return 0, fmt.Errorf("vmm: timeline signal on stream %#x of a timeline bound to stream %#x: %w",
			uint64(s), uint64(b), gpu.ErrInvalidValue)
	}
	p := t.sig.last + 1
	if err := t.ops.StreamWriteValue64(s, t.mu.mem.Ptr, p); err != nil {
		return 0, fmt.Errorf("vmm: timeline signal of point %d: %w", p, err)
	}
	t.sig.last = p
	return p, nil
}

// Signalled is the last point handed out by Signal (0 before the first).
func (t *Timeline) Signalled() uint64 {
	t.sig.Lock()
	defer t.sig.Unlock()
	return t.sig.last
}

// Completed is the last point the device has written, read from host
// memory without synchronizing with any stream; it never blocks on the
// device.
func (t *Timeline) Completed() uint64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.mu.closed {
		return t.mu.final
	}
	return t.mu.mem.Load64(0)
}

// Reached reports whether the timeline has passed point.
func (t *Timeline) Reached(point uint64) bool { return t.Completed() >= point }

// SetWaitPolicy sets how Wait polls (see WaitPolicy; the zero value is
// the default). A policy with a negative sleep is refused. It may be called
// at any time; waits already polling keep the policy they started with.
func (t *Timeline) SetWaitPolicy(p WaitPolicy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	p = p.normalized()
	t.policy.Store(&p)
	return nil
}

// WaitPolicy is the policy Wait follows, every field set.
func (t *Timeline) WaitPolicy() WaitPolicy {
	if p := t.policy.Load(); p != nil {
		return *p
	}
	return DefaultWaitPolicy()
}

// WaitStats sum what the timeline's waits did: how many had to poll, how
// many of those outlasted the yield phase and slept, and how many timed out.
func (t *Timeline) WaitStats() WaitStats { return t.waits.snapshot() }

// Wait waits until the timeline reaches point, polling the host-visible
// counter as the timeline's WaitPolicy says: yields between reads for a
// short bounded time (DefaultWaitYield), then sleeps growing from
// DefaultWaitMinSleep to DefaultWaitMaxSleep. It never spins past the
// yield phase. A bound timeline (Bind) also queries its stream before
// every sleep and returns that stream's fault instead of waiting for a
// point it will never write.
//
// The wait ends at timeout after the call or at ctx's deadline, whichever
// comes first; at least one of them must be set (timeout > 0 or a ctx with
// a deadline), since a hung device must give an error, not a wait forever.
// Passing the deadline is an error wrapping gpu.ErrTimeout (and
// context.DeadlineExceeded when ctx's deadline was the one passed);
// cancelling ctx returns an error wrapping ctx.Err(). A point never
// signalled is gpu.ErrInvalidValue: it cannot be reached.
func (t *Timeline) Wait(ctx context.Context, point uint64, timeout time.Duration) error {
	if t.Reached(point) {
		return nil
	}
	if last := t.Signalled(); point > last {
		return fmt.Errorf("vmm: timeline wait for point %d: only %d points were signalled: %w", point, last, gpu.ErrInvalidValue)
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	var check func() error
	if t.bound.Load() != 0 {
		check = t.checkStream
	}
	n, err := t.WaitPolicy().Poll(ctx, deadline, func() bool { return t.Reached(point) }, check)
	t.waits.add(n, err)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, gpu.ErrTimeout):
		return fmt.Errorf("vmm: timeline wait for point %d: still at %d of %d signalled at the deadline: %w",
			point, t.Completed(), t.Signalled(), err)
	}
	return fmt.Errorf("vmm: timeline wait for point %d (completed %d): %w", point, t.Completed(), err)
}

// checkStream returns the bound stream's fault, nil while it is healthy
// (busy or idle) or once the timeline is closed.
func (t *Timeline) checkStream() error {
	t.mu.RLock()
	closed := t.mu.closed
	t.mu.RUnlock()
	if closed {
		return nil
	}
	_, err := t.drv.StreamQuery(gpu.Stream(t.bound.Load()))
	if err == nil || errors.Is(err, gpu.ErrNotReady) {
		return nil
	}
	return fmt.Errorf("stream failed: %w", err)
}

// Close frees the counter's host memory. Completed keeps returning the last
// value read; Signal fails. A second Close is gpu.ErrInvalidHandle. Close
// does not wait: writes still queued on a stream must be drained first
// (Wait for Signalled), or the device would write freed memory. A bound
// timeline checks it: while its stream is busy and a signalled point is
// not yet written, Close frees nothing and returns gpu.ErrIllegalState
// (synchronize the stream and call Close again); a stream that is idle, or
// that failed, writes nothing more, so Close proceeds.
func (t *Timeline) Close() error {
	t.sig.Lock()
	defer t.sig.Unlock()
	t.mu.RLock()
	closed := t.mu.closed
	t.mu.RUnlock()
	if closed {
		return fmt.Errorf("vmm: timeline close: %w", errReleased("timeline"))
	}
	if s := gpu.Stream(t.bound.Load()); s != 0 && t.Completed() < t.sig.last {
		idle, err := t.drv.StreamQuery(s)
		busy := (err == nil && !idle) || errors.Is(err, gpu.ErrNotReady)
		if completed := t.Completed(); busy && completed < t.sig.last {
			return fmt.Errorf("vmm: timeline close: stream %#x still to write point %d (completed %d): %w",
				uint64(s), t.sig.last, completed, gpu.ErrIllegalState)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	final := t.mu.mem.Load64(0)
	if err := t.ops.HostFree(t.mu.mem.Handle); err != nil {
		return fmt.Errorf("vmm: timeline close: HostFree: %w", err)
	}
	t.mu.final = final
	t.mu.mem = gpu.HostMem{}
	t.mu.closed = true
	return nil
}
