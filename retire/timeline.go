package retire

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"stablegraph/gpu"
)

// Timeline is a monotonic counter advanced by the GPU (see the package doc
// for the rule that ties its points to submissions).
//
// Implementations must be safe for concurrent use.
type Timeline interface {
	// Completed returns the highest point the GPU has passed. It never
	// blocks and never decreases.
	Completed() uint64
	// Wait blocks until Completed() >= point, ctx is done, or deadline
	// passes (deadline <= 0 means DefaultWaitDeadline). Waiting backs off;
	// it never spins. A missed deadline is an error wrapping
	// gpu.ErrTimeout.
	Wait(ctx context.Context, point uint64, deadline time.Duration) error
}

// DefaultWaitDeadline bounds a timeline wait when the caller gives none.
const DefaultWaitDeadline = 30 * time.Second

// Back-off of timeline waits: the first sleep is minBackoff and each
// following one doubles up to maxBackoff. Short first sleeps keep the
// latency of a wait that is almost over low; the cap keeps a long wait from
// oversleeping by more than a millisecond.
const (
	minBackoff = time.Microsecond
	maxBackoff = time.Millisecond
	// queryBackoff is the sleep from which a StreamTimeline wait also
	// queries its stream on each round, so that a stream that faulted (and
	// will never write its point) ends the wait at once instead of at the
	// deadline. Below it the query would cost more than the sleep.
	queryBackoff = 64 * time.Microsecond
)

// StreamTimelineBackend is what a StreamTimeline needs from a backend.
// gpu.Backend satisfies it.
type StreamTimelineBackend interface {
	gpu.StreamMemOps
	StreamQuery(s gpu.Stream) (idle bool, err error)
}

// StreamTimeline is a Timeline kept in one 8-byte word of host-visible
// memory that the device writes with StreamWriteValue64.
//
// A StreamTimeline is bound to the stream of its first Signal: points from
// one word are only ordered if one stream writes them, so a Signal on any
// other stream is refused. Work on other streams joins the timeline by
// making the bound stream wait for it (an event) before the Signal.
//
// StreamTimeline is safe for concurrent use. Close must not race with
// Signal; Completed and Wait may be called after Close and then see the
// value read at Close.
type StreamTimeline struct {
	b   StreamTimelineBackend
	mem gpu.HostMem

	signalled atomic.Uint64 // last point handed out by Signal
	stream    atomic.Uint64 // bound gpu.Stream, 0 until the first Signal

	sigMu sync.Mutex // serialises Signal so points reach the stream in order

	// life guards the host memory against Close: Completed reads the word
	// under the read lock, Close frees it under the write lock.
	life struct {
		sync.RWMutex
		closed bool
		final  uint64 // Completed at Close
	}
}

// NewStreamTimeline allocates a timeline word for use by streams of dev.
// It fails with gpu.ErrNotSupported when dev has no stream memory
// operations; the caller then needs another kind of Timeline.
func NewStreamTimeline(b gpu.Backend, dev int) (*StreamTimeline, error) {
	ops, err := gpu.StreamMemOpsOf(b, dev)
	if err != nil {
		return nil, fmt.Errorf("retire: timeline on device %d: %w", dev, err)
	}
	mem, err := ops.HostAlloc(8)
	if err != nil {
		return nil, fmt.Errorf("retire: timeline on device %d: host word: %w", dev, err)
	}
	if len(mem.Bytes) < 8 {
		// A short view would make Load64 read out of bounds; refuse it
		// rather than trust the backend.
		ferr := ops.HostFree(mem.Handle)
		return nil, errors.Join(fmt.Errorf("retire: timeline on device %d: host word of %d bytes: %w", dev, len(mem.Bytes), gpu.ErrInvalidValue), ferr)
	}
	return &StreamTimeline{b: b, mem: mem}, nil
}

// Signal enqueues on s the write of the next point and returns that point.
// The first Signal binds the timeline to s; a later Signal on another stream
// fails with gpu.ErrInvalidValue.
func (t *StreamTimeline) Signal(s gpu.Stream) (uint64, error) {
	t.sigMu.Lock()
	defer t.sigMu.Unlock()
	if t.isClosed() {
		return 0, fmt.Errorf("retire: signal on closed timeline: %w", gpu.ErrIllegalState)
	}
	if s == 0 {
		return 0, fmt.Errorf("retire: signal on stream 0: %w", gpu.ErrInvalidHandle)
	}
	bound := gpu.Stream(t.stream.Load())
	if bound != 0 && bound != s {
		return 0, fmt.Errorf("retire: signal on stream %#x of a timeline bound to stream %#x: %w",
			uint64(s), uint64(bound), gpu.ErrInvalidValue)
	}
	p := t.signalled.Load() + 1
	if err := t.b.StreamWriteValue64(s, t.mem.Ptr, p); err != nil {
		return 0, fmt.Errorf("retire: signal point %d on stream %#x: %w", p, uint64(s), err)
	}
	t.stream.Store(uint64(s))
	t.signalled.Store(p)
	return p, nil
}

// Signalled returns the last point handed out by Signal.
func (t *StreamTimeline) Signalled() uint64 { return t.signalled.Load() }

// Completed returns the last point the device wrote.
func (t *StreamTimeline) Completed() uint64 {
	t.life.RLock()
	defer t.life.RUnlock()
	if t.life.closed {
		return t.life.final
	}
	return t.mem.Load64(0)
}

func (t *StreamTimeline) isClosed() bool {
	t.life.RLock()
	defer t.life.RUnlock()
	return t.life.closed
}

// Wait blocks until the device has written point, backing off between
// reads. It returns early with the stream's error when the bound stream
// reports a fault, since a faulted stream never writes its point. A point
// never signalled is gpu.ErrInvalidValue (it would never complete).
func (t *StreamTimeline) Wait(ctx context.Context, point uint64, deadline time.Duration) error {
	if t.Completed() >= point {
		return nil
	}
	if last := t.signalled.Load(); point > last {
		return fmt.Errorf("retire: wait for point %d, last signalled is %d: %w", point, last, gpu.ErrInvalidValue)
	}
	query := func() error {
		s := gpu.Stream(t.stream.Load())
		if s == 0 || t.isClosed() {
			return nil
		}
		_, err := t.b.StreamQuery(s)
		if errors.Is(err, gpu.ErrNotReady) {
			return nil // busy, which is no failure
		}
		return err
	}
	return backoffWait(ctx, point, deadline, t.Completed, query)
}

// backoffWait polls completed until it reaches point, sleeping between
// polls with exponential back-off; query, when the back-off is long enough
// to afford it, checks the stream for a fault that would make the wait
// hopeless.
func backoffWait(ctx context.Context, point uint64, deadline time.Duration, completed func() uint64, query func() error) error {
	if deadline <= 0 {
		deadline = DefaultWaitDeadline
	}
	start := time.Now()
	end := start.Add(deadline)
	backoff := minBackoff
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if completed() >= point {
			return nil
		}
		if backoff >= queryBackoff && query != nil {
			if err := query(); err != nil {
				// The fault may have come after the point was written.
				if completed() >= point {
					return nil
				}
				return fmt.Errorf("retire: wait for point %d: stream failed: %w", point, err)
			}
		}
		now := time.Now()
		if !now.Before(end) {
			return fmt.Errorf("retire: wait for point %d: completed %d after %v: %w",
				point, completed(), now.Sub(start).Round(time.Microsecond), gpu.ErrTimeout)
		}
		sleep := min(backoff, end.Sub(now))
		if timer == nil {
			timer = time.NewTimer(sleep)
		} else {
			timer.Reset(sleep)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("retire: wait for point %d: completed %d: %w", point, completed(), ctx.Err())
		case <-timer.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// Close frees the timeline word. The device must be done writing it: when a
// signal is still outstanding and the bound stream is busy, Close frees
// nothing and returns gpu.ErrIllegalState (synchronize the stream and call
// Close again). A stream that is idle, or that failed, will write nothing
// more, so Close proceeds. Close is idempotent.
func (t *StreamTimeline) Close() error {
	t.sigMu.Lock()
	defer t.sigMu.Unlock()
	if t.isClosed() {
		return nil
	}
	if last := t.signalled.Load(); t.Completed() < last {
		if s := gpu.Stream(t.stream.Load()); s != 0 {
			idle, err := t.b.StreamQuery(s)
			busy := (err == nil && !idle) || errors.Is(err, gpu.ErrNotReady)
			if busy && t.Completed() < last {
				return fmt.Errorf("retire: close timeline: stream %#x still to write point %d (completed %d): %w",
					uint64(s), last, t.Completed(), gpu.ErrIllegalState)
			}
		}
	}
	t.life.Lock()
	t.life.final = t.mem.Load64(0)
	t.life.closed = true
	t.life.Unlock()
	if err := t.b.HostFree(t.mem.Handle); err != nil {
		return fmt.Errorf("retire: close timeline: %w", err)
	}
	return nil
}
