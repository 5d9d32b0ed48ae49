package vmm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"stablegraph/gpu"
)

// DeferredOptions configure a DeferredAllocator. The zero value is valid;
// defaults are applied in NewDeferredAllocator.
type DeferredOptions struct {
	// DrainTimeout bounds Drain's wait for the timeline; a context deadline
	// may shorten it. Default 10s: far beyond any healthy step, short
	// enough that a hung device is reported.
	DrainTimeout time.Duration
}

// DeferredStats is a snapshot of a DeferredAllocator's queue.
type DeferredStats struct {
	Pending          int    // allocations freed but not yet released
	PendingBytes     uint64 // their total size
	PeakPendingBytes uint64 // highest PendingBytes seen
	Released         int    // allocations released so far
	ReleasedBytes    uint64 // their total size
}

// DeferredAllocator allocates with Allocate and defers each free until a
// Timeline has passed the point of the last work that used the memory, so
// that memory is never released under a kernel still queued on a stream.
//
// The rule: Free(a, point) promises that every use of a was submitted to
// the timeline's stream before the Signal that returned point. a is
// released by the first Poll (or Drain) that reads a completed value of at
// least point, and never before.
//
// It is safe for concurrent use. Its mutex is held across the releases
// (short driver calls) but never across a wait; lock order: the
// DeferredAllocator's, then the Allocation's.
type DeferredAllocator struct {
	drv          Driver
	tl           *Timeline
	drainTimeout time.Duration

	mu struct {
		sync.Mutex
		pending       []pendingFree // sorted by point; equal points keep Free order
		queued        map[*Allocation]bool
		pendingBytes  uint64
		peakPending   uint64
		released      int
		releasedBytes uint64
	}
}

type pendingFree struct {
	a     *Allocation
	point uint64
}

// NewDeferredAllocator returns an allocator over drv whose frees wait for
// tl. The caller keeps ownership of tl and closes it after Drain.
func NewDeferredAllocator(drv Driver, tl *Timeline, opts DeferredOptions) (*DeferredAllocator, error) {
	if drv == nil || tl == nil {
		return nil, fmt.Errorf("vmm: new deferred allocator: nil driver or timeline: %w", gpu.ErrInvalidValue)
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = 10 * time.Second
	}
	d := &DeferredAllocator{drv: drv, tl: tl, drainTimeout: opts.DrainTimeout}
	d.mu.queued = map[*Allocation]bool{}
	return d, nil
}

// Alloc allocates as Allocate does. When the device is out of memory, it
// first releases whatever the timeline has already passed (Poll) and, if
// that released anything, tries once more.
func (d *DeferredAllocator) Alloc(dev int, size uint64, peers []int) (*Allocation, error) {
	a, err := Allocate(d.drv, dev, size, peers)
	if err == nil || !errors.Is(err, gpu.ErrOutOfMemory) {
		return a, err
	}
	n, pollErr := d.Poll()
	if n == 0 {
		return nil, errors.Join(err, pollErr)
	}
	a, err = Allocate(d.drv, dev, size, peers)
	if err != nil {
		return nil, errors.Join(err, pollErr)
	}
	return a, nil
}

// Free queues a for release once the timeline reaches point; from then on
// the allocator owns a and the caller must not Close it. point must have
// been returned by the timeline's Signal (else gpu.ErrInvalidValue: it
// would never be reached). Freeing an allocation already queued or closed
// is gpu.ErrInvalidHandle. Free itself releases nothing; Poll and Drain do.
func (d *DeferredAllocator) Free(a *Allocation, point uint64) error {
	if a == nil {
		return fmt.Errorf("vmm: deferred free of a nil allocation: %w", gpu.ErrInvalidValue)
	}
	if last := d.tl.Signalled(); point > last {
		return fmt.Errorf("vmm: deferred free of %#x at point %d: only %d points were signalled: %w",
			uint64(a.Ptr()), point, last, gpu.ErrInvalidValue)
	}
	if a.isClosed() {
		return fmt.Errorf("vmm: deferred free of %#x: the allocation is already closed: %w", uint64(a.Ptr()), gpu.ErrInvalidHandle)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mu.queued[a] {
		return fmt.Errorf("vmm: deferred free of %#x: already queued (double free): %w", uint64(a.Ptr()), gpu.ErrInvalidHandle)
	}
	i, _ := slices.BinarySearchFunc(d.mu.pending, point, func(p pendingFree, point uint64) int {
		if p.point <= point {
			return -1 // after every equal point, to keep Free order
		}
		return 1
	})
	d.mu.pending = slices.Insert(d.mu.pending, i, pendingFree{a, point})
	d.mu.queued[a] = true
	d.mu.pendingBytes += a.Size()
	d.mu.peakPending = max(d.mu.peakPending, d.mu.pendingBytes)
	return nil
}

// Poll releases every queued allocation whose point the timeline has
// reached, reading the timeline once without blocking. It returns how many
// it released. An allocation whose release fails stays queued and is tried
// again by the next Poll; the failures are returned joined.
func (d *DeferredAllocator) Poll() (released int, err error) {
	completed := d.tl.Completed()
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.releaseLocked(completed)
}

// releaseLocked releases the queued allocations with point <= completed.
func (d *DeferredAllocator) releaseLocked(completed uint64) (int, error) {
	var (
		errs []error
		kept []pendingFree
		n, i int
	)
	for ; i < len(d.mu.pending) && d.mu.pending[i].point <= completed; i++ {
		p := d.mu.pending[i]
		if p.a.isClosed() {
			// Its owner closed it after handing it to Free, breaking the
			// contract; there is nothing left to release or retry.
			errs = append(errs, fmt.Errorf("point %d: allocation %#x was closed while queued: %w",
				p.point, uint64(p.a.Ptr()), gpu.ErrInvalidHandle))
			delete(d.mu.queued, p.a)
			d.mu.pendingBytes -= p.a.Size()
			continue
		}
		if err := p.a.Close(); err != nil {
			errs = append(errs, fmt.Errorf("point %d: %w", p.point, err))
			kept = append(kept, p)
			continue
		}
		n++
		size := p.a.Size()
		delete(d.mu.queued, p.a)
		d.mu.pendingBytes -= size
		d.mu.released++
		d.mu.releasedBytes += size
	}
	// Failed releases go back in front: their points are the smallest.
	d.mu.pending = append(kept, d.mu.pending[i:]...)
	if len(errs) > 0 {
		return n, fmt.Errorf("vmm: deferred release (timeline at %d): %w", completed, errors.Join(errs...))
	}
	return n, nil
}

// Drain waits until the timeline passes the point of every allocation
// queued when it was called, then releases them. The wait backs off and
// ends at DrainTimeout or ctx's deadline (gpu.ErrTimeout) or when ctx is
// cancelled; what the timeline had passed by then is still released.
func (d *DeferredAllocator) Drain(ctx context.Context) error {
	d.mu.Lock()
	var target uint64
	if n := len(d.mu.pending); n > 0 {
		target = d.mu.pending[n-1].point
	}
	d.mu.Unlock()
	waitErr := d.tl.Wait(ctx, target, d.drainTimeout)
	_, relErr := d.Poll()
	if err := errors.Join(waitErr, relErr); err != nil {
		return fmt.Errorf("vmm: deferred drain to point %d: %w", target, err)
	}
	return nil
}

// Stats returns a snapshot of the queue.
func (d *DeferredAllocator) Stats() DeferredStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return DeferredStats{
		Pending:          len(d.mu.pending),
		PendingBytes:     d.mu.pendingBytes,
		PeakPendingBytes: d.mu.peakPending,
		Released:         d.mu.released,
		ReleasedBytes:    d.mu.releasedBytes,
	}
}
