package vmm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"stablegraph/gpu"
)

// Backoff bounds of Timeline.Wait. The first sleeps are short because the
// point is usually reached within microseconds of the wait starting; the cap
// keeps a wait on a hung device to about a thousand wake-ups a second, and
// bounds how late a wait notices that its point was reached.
const (
	waitBackoffMin = time.Microsecond
	waitBackoffMax = time.Millisecond
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

// Wait waits until the timeline reaches point, polling with exponential
// backoff (1µs doubling to 1ms) between reads, sleeping, never spinning.
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
	deadline, ok := ctx.Deadline()
	ctxDeadline := ok // whether the deadline is ctx's, for the error
	if timeout > 0 {
		if d := time.Now().Add(timeout); !ok || d.Before(deadline) {
			deadline, ok, ctxDeadline = d, true, false
		}
	}
	if !ok {
		return fmt.Errorf("vmm: timeline wait for point %d: neither a timeout nor a context deadline: %w", point, gpu.ErrInvalidValue)
	}

	timedOut := func(cause error) error {
		return fmt.Errorf("vmm: timeline wait for point %d: still at %d of %d signalled at the deadline: %w",
			point, t.Completed(), t.Signalled(), cause)
	}
	var timer *time.Timer
	backoff := waitBackoffMin
	for {
		if t.Reached(point) {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			if ctxDeadline {
				// ctx's own timer may not have fired yet at this instant.
				return timedOut(fmt.Errorf("%w (%w)", gpu.ErrTimeout, context.DeadlineExceeded))
			}
			return timedOut(gpu.ErrTimeout)
		}
		sleep := min(backoff, left)
		if timer == nil {
			timer = time.NewTimer(sleep)
			defer timer.Stop()
		} else {
			timer.Reset(sleep) // the channel was drained: Reset is safe
		}
		select {
		case <-ctx.Done():
			if t.Reached(point) {
				return nil
			}
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return timedOut(fmt.Errorf("%w (%w)", gpu.ErrTimeout, ctx.Err()))
			}
			return fmt.Errorf("vmm: timeline wait for point %d: %w", point, ctx.Err())
		case <-timer.C:
		}
		backoff = min(2*backoff, waitBackoffMax)
	}
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
