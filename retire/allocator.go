package retire

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/vmm"
)

// AllocatorStats is a snapshot of an Allocator.
type AllocatorStats struct {
	// Queue is the retirement queue's own snapshot: one batch per Free.
	Queue Stats
	// Pending counts the allocations freed but not yet released: those
	// waiting in the queue and those past their point whose release failed
	// and waits for a retry. PendingBytes is their total size.
	Pending      int
	PendingBytes uint64
	// PeakPendingBytes is the queue's peak (Queue.PeakPendingBytes).
	PeakPendingBytes uint64
	// Released counts the allocations released (closed) so far.
	Released      int
	ReleasedBytes uint64
}

// Allocator allocates with vmm.Allocate and defers each free on a retirement
// Queue until the timeline has passed the point of the last work that used
// the memory, so that memory is never released under a kernel still queued
// on a stream.
//
// The rule: Free(a, point) promises that every use of a was submitted to the
// timeline's stream before the Signal that returned point. a is then a
// one-item Batch retired at point whose release is a.Close() of a.Size()
// bytes; it is released by the first poll (Poll, a later Free, Drain) that
// reads a completed value of at least point, and never before.
//
// It follows the Queue's semantics (see the package doc): Free polls first
// and releases at once an allocation whose point has already passed, and
// when Options.MaxPending frees are still pending, Free waits (up to
// Options.WaitDeadline) for the oldest before queueing. Drain is bounded by
// Options.WaitDeadline (default DefaultWaitDeadline) or ctx.
//
// A release that fails (a.Close returned an error; the allocation stays
// open) is kept past the queue and retried by the next Poll or Drain; its
// point has passed, so retrying it is always safe.
//
// It is safe for concurrent use. Lock order: the Queue's, then the
// Allocator's, then the Allocation's; no lock of the Allocator is held
// across a wait.
type Allocator struct {
	drv vmm.Driver
	tl  SignalledTimeline
	q   *Queue

	released atomic.Int64 // allocations released so far, for Poll's count

	mu struct {
		sync.Mutex
		queued        map[*vmm.Allocation]bool // freed, not yet released
		retry         []*vmm.Allocation        // past their point; Close failed
		retryBytes    uint64
		releasedBytes uint64
	}
}

// NewAllocator returns an allocator over drv whose frees wait for tl on a
// Queue with opts. The caller keeps ownership of tl and closes it after
// Drain.
func NewAllocator(drv vmm.Driver, tl SignalledTimeline, opts Options) (*Allocator, error) {
	if drv == nil || tl == nil {
		return nil, fmt.Errorf("retire: new allocator: nil driver or timeline: %w", gpu.ErrInvalidValue)
	}
	al := &Allocator{drv: drv, tl: tl, q: NewQueue(tl, opts)}
	al.mu.queued = map[*vmm.Allocation]bool{}
	return al, nil
}

// Options returns the queue's options with defaults applied.
func (al *Allocator) Options() Options { return al.q.Options() }

// Alloc allocates as vmm.Allocate does. When the device is out of memory,
// it first releases whatever the timeline has already passed (Poll) and,
// if that released anything, tries once more.
func (al *Allocator) Alloc(dev int, size uint64, peers []int) (*vmm.Allocation, error) {
	a, err := vmm.Allocate(al.drv, dev, size, peers)
	if err == nil || !errors.Is(err, gpu.ErrOutOfMemory) {
		return a, err
	}
	n, pollErr := al.Poll()
	if n == 0 {
		return nil, errors.Join(err, pollErr)
	}
	a, err = vmm.Allocate(al.drv, dev, size, peers)
	if err != nil {
		return nil, errors.Join(err, pollErr)
	}
	return a, nil
}

// Free retires a at point; from then on the allocator owns a and the
// caller must not Close it. point must have been returned by the
// timeline's Signal (else gpu.ErrInvalidValue: it would never be reached).
// Freeing an allocation already queued or closed is gpu.ErrInvalidHandle.
// Free is Queue.Retire: it may release a itself when point has passed and
// may wait for the oldest pending free (see Allocator); errors of releases
// run on the way are returned.
func (al *Allocator) Free(a *vmm.Allocation, point uint64) error {
	if a == nil {
		return fmt.Errorf("retire: deferred free of a nil allocation: %w", gpu.ErrInvalidValue)
	}
	if last := al.tl.Signalled(); point > last {
		return fmt.Errorf("retire: deferred free of %#x at point %d: only %d points were signalled: %w",
			uint64(a.Ptr()), point, last, gpu.ErrInvalidValue)
	}
	if a.Closed() {
		return fmt.Errorf("retire: deferred free of %#x: the allocation is already closed: %w", uint64(a.Ptr()), gpu.ErrInvalidHandle)
	}
	al.mu.Lock()
	if al.mu.queued[a] {
		al.mu.Unlock()
		return fmt.Errorf("retire: deferred free of %#x: already queued (double free): %w", uint64(a.Ptr()), gpu.ErrInvalidHandle)
	}
	al.mu.queued[a] = true
	al.mu.Unlock()
	return al.q.Retire(context.Background(), Batch{{Bytes: a.Size(), Release: func() error { return al.release(a) }}}, point)
}

// release closes a, whose point has passed; it runs under the queue's lock
// (or from retryLocked). A failed Close puts a on the retry list.
func (al *Allocator) release(a *vmm.Allocation) error {
	al.mu.Lock()
	defer al.mu.Unlock()
	if err := al.closeLocked(a); err != nil {
		al.mu.retry = append(al.mu.retry, a)
		al.mu.retryBytes += a.Size()
		return err
	}
	return nil
}

// closeLocked closes a and accounts for it. An allocation its owner closed
// while queued (breaking the contract) is dropped with an error: there is
// nothing left to release or retry.
func (al *Allocator) closeLocked(a *vmm.Allocation) error {
	if a.Closed() {
		delete(al.mu.queued, a)
		return fmt.Errorf("allocation %#x was closed while queued: %w", uint64(a.Ptr()), gpu.ErrInvalidHandle)
	}
	if err := a.Close(); err != nil {
		return err
	}
	delete(al.mu.queued, a)
	al.mu.releasedBytes += a.Size()
	al.released.Add(1)
	return nil
}

// retry closes the allocations whose earlier release failed; those that
// fail again stay for the next try.
func (al *Allocator) retry() error {
	al.mu.Lock()
	defer al.mu.Unlock()
	var errs []error
	kept := al.mu.retry[:0]
	var keptBytes uint64
	for _, a := range al.mu.retry {
		if err := al.closeLocked(a); err != nil {
			errs = append(errs, fmt.Errorf("retire: retried release of %#x: %w", uint64(a.Ptr()), err))
			if !a.Closed() {
				kept = append(kept, a)
				keptBytes += a.Size()
			}
		}
	}
	clear(al.mu.retry[len(kept):])
	al.mu.retry = kept
	al.mu.retryBytes = keptBytes
	return errors.Join(errs...)
}

// Poll retries failed releases, then releases every queued allocation whose
// point the timeline has passed, without blocking (Queue.Poll). It returns
// how many allocations were released while it ran (under concurrent use
// this may include releases by other calls), and the release errors.
func (al *Allocator) Poll() (released int, err error) {
	before := al.released.Load()
	rerr := al.retry()
	perr := al.q.Poll()
	return int(al.released.Load() - before), errors.Join(rerr, perr)
}

// Drain waits until the timeline passes the point of every allocation
// queued when it was called, then releases them (Queue.Drain), and retries
// failed releases. The wait ends at Options.WaitDeadline or ctx's deadline
// (gpu.ErrTimeout) or when ctx is cancelled; what the timeline had passed
// by then is still released (a Poll), and the rest stays queued.
func (al *Allocator) Drain(ctx context.Context) error {
	derr := al.q.Drain(ctx)
	var perr error
	if derr != nil {
		perr = al.q.Poll()
	}
	rerr := al.retry()
	return errors.Join(derr, perr, rerr)
}

// Stats returns a snapshot. Its queue and retry parts are read one after
// the other, so under concurrent use they may be of slightly different
// moments.
func (al *Allocator) Stats() AllocatorStats {
	qs := al.q.Stats()
	al.mu.Lock()
	defer al.mu.Unlock()
	return AllocatorStats{
		Queue:            qs,
		Pending:          qs.PendingBatches + len(al.mu.retry),
		PendingBytes:     qs.PendingBytes + al.mu.retryBytes,
		PeakPendingBytes: qs.PeakPendingBytes,
		Released:         int(al.released.Load()),
		ReleasedBytes:    al.mu.releasedBytes,
	}
}
