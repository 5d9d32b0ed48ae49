package retire

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/vmm"
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
	// passes (deadline <= 0 means DefaultWaitDeadline). Waiting yields for
	// a short bounded time, then sleeps with back-off; it never spins for
	// long. A missed deadline is an error wrapping gpu.ErrTimeout.
	Wait(ctx context.Context, point uint64, deadline time.Duration) error
}

// DefaultWaitDeadline bounds a timeline wait when the caller gives none.
const DefaultWaitDeadline = 30 * time.Second

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

	policy atomic.Pointer[vmm.WaitPolicy] // nil: the default

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

// SetWaitPolicy sets how Wait polls: the policy of vmm.Timeline.Wait (see
// vmm.WaitPolicy; the zero value is the default). A policy with a negative
// sleep is refused.
func (t *StreamTimeline) SetWaitPolicy(p vmm.WaitPolicy) error {
	if err := p.Validate(); err != nil {
		return fmt.Errorf("retire: %w", err)
	}
	t.policy.Store(&p)
	return nil
}

func (t *StreamTimeline) waitPolicy() vmm.WaitPolicy {
	if p := t.policy.Load(); p != nil {
		return *p
	}
	return vmm.WaitPolicy{}
}

// Wait blocks until the device has written point, polling as the
// timeline's wait policy says (vmm.WaitPolicy: a short bounded phase of
// yields between reads, then sleeps growing to a cap). Once it sleeps, it
// also queries the bound stream before every sleep and returns early with
// the stream's error when the stream reports a fault, since a faulted
// stream never writes its point. A point never signalled is
// gpu.ErrInvalidValue (it would never complete).
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
	return pollWait(ctx, t.waitPolicy(), point, deadline, t.Completed, query)
}

// pollWait waits, following pol, until completed reaches point; query, once
// the wait sleeps, checks the stream for a fault that would make the wait
// hopeless.
func pollWait(ctx context.Context, pol vmm.WaitPolicy, point uint64, deadline time.Duration, completed func() uint64, query func() error) error {
	if deadline <= 0 {
		deadline = DefaultWaitDeadline
	}
	start := time.Now()
	var check func() error
	if query != nil {
		check = func() error {
			if err := query(); err != nil {
				return fmt.Errorf("stream failed: %w", err)
			}
			return nil
		}
	}
	_, err := pol.Poll(ctx, start.Add(deadline), func() bool { return completed() >= point }, check)
	if err == nil {
		return nil
	}
	if errors.Is(err, gpu.ErrTimeout) {
		return fmt.Errorf("retire: wait for point %d: completed %d after %v: %w",
			point, completed(), time.Since(start).Round(time.Microsecond), err)
	}
	return fmt.Errorf("retire: wait for point %d: completed %d: %w", point, completed(), err)
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
