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
// stream advances and the host reads without synchronizing.
//
// Points are handed out by Signal, 1, 2, 3, ...; the counter holds the last
// point the device wrote. A timeline is monotonic only if the writes happen
// in the order of their points, so signal one timeline from one stream (or
// from streams ordered by events).
//
// A Timeline is safe for concurrent use.
type Timeline struct {
	drv TimelineDriver
	dev int

	// sig serialises Signal, so that points reach the stream in increasing
	// order when several goroutines signal it. Lock order: sig, then mu.
	sig struct {
		sync.Mutex
		last uint64 // last point handed out by Signal
	}

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
	if err := checkStreamMemOps(drv, dev); err != nil {
		return nil, fmt.Errorf("vmm: new timeline on device %d: %w", dev, err)
	}
	mem, err := drv.HostAlloc(8)
	if err != nil {
		return nil, fmt.Errorf("vmm: new timeline on device %d: HostAlloc: %w", dev, err)
	}
	t := &Timeline{drv: drv, dev: dev}
	t.mu.mem = mem
	return t, nil
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
	p := t.sig.last + 1
	if err := t.drv.StreamWriteValue64(s, t.mu.mem.Ptr, p); err != nil {
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
// short bounded time (100 µs by default), then sleeps growing from 50 µs to
// 1 ms. It never spins past the yield phase.
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
	n, err := t.WaitPolicy().Poll(ctx, deadline, func() bool { return t.Reached(point) }, nil)
	t.waits.add(n, err)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, gpu.ErrTimeout):
		return fmt.Errorf("vmm: timeline wait for point %d: still at %d of %d signalled at the deadline: %w",
			point, t.Completed(), t.Signalled(), err)
	}
	return fmt.Errorf("vmm: timeline wait for point %d: %w", point, err)
}

// Close frees the counter's host memory. Completed keeps returning the last
// value read; Signal fails. A second Close is gpu.ErrInvalidHandle. Close
// does not wait: writes still queued on a stream must be drained first
// (Wait for Signalled), or the device would write freed memory.
func (t *Timeline) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.mu.closed {
		return fmt.Errorf("vmm: timeline close: %w", errReleased("timeline"))
	}
	final := t.mu.mem.Load64(0)
	if err := t.drv.HostFree(t.mu.mem.Handle); err != nil {
		return fmt.Errorf("vmm: timeline close: HostFree: %w", err)
	}
	t.mu.final = final
	t.mu.mem = gpu.HostMem{}
	t.mu.closed = true
	return nil
}
