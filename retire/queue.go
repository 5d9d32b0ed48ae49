package retire

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// Item is one deferred release: a buffer of Bytes bytes and the function
// that frees it (MemFree, a bfc Free, an unmap ...). Release may be nil for
// accounting-only items.
type Item struct {
	Bytes   uint64
	Release func() error
}

// Batch is the set of buffers freed after one submission.
type Batch []Item

// Bytes is the total size of the batch.
func (b Batch) Bytes() uint64 {
	var n uint64
	for _, it := range b {
		n += it.Bytes
	}
	return n
}

// Options configure a Queue. The zero value is valid: every zero field takes
// its documented default.
type Options struct {
	// MaxPending is the most batches that may wait for the timeline. When
	// Retire finds the queue full after polling, it waits for the oldest
	// batch before adding the new one, so pending memory never exceeds
	// MaxPending batches. Default 3.
	MaxPending int
	// WaitDeadline bounds every wait of the queue (for the oldest batch,
	// and a drain). Default DefaultWaitDeadline (30 s).
	WaitDeadline time.Duration
}

// DefaultMaxPending is the default of Options.MaxPending.
const DefaultMaxPending = 3

func (o Options) withDefaults() Options {
	if o.MaxPending <= 0 {
		o.MaxPending = DefaultMaxPending
	}
	if o.WaitDeadline <= 0 {
		o.WaitDeadline = DefaultWaitDeadline
	}
	return o
}

// Stats describe a queue. Batch counts are cumulative; byte counts are of
// the buffers' sizes.
type Stats struct {
	PendingBatches   int
	PendingBytes     uint64
	PeakPendingBytes uint64
	// How the released batches were released (see the package doc).
	ReleasedByPoll  uint64
	ReleasedByWait  uint64
	ReleasedByDrain uint64
	ReleasedForced  uint64
	// ReleaseErrors counts release functions that returned an error (each
	// was also returned to the caller that ran it).
	ReleaseErrors uint64
}

// Released is the total number of batches released.
func (s Stats) Released() uint64 {
	return s.ReleasedByPoll + s.ReleasedByWait + s.ReleasedByDrain + s.ReleasedForced
}

type pendingBatch struct {
	point uint64
	batch Batch
	bytes uint64
}

// Queue holds retired batches until their timeline points pass.
//
// A Queue is safe for concurrent use. Release functions run with the queue's
// lock held, in point order, so they must not call back into the Queue; the
// lock is never held while waiting for the timeline.
type Queue struct {
	tl   Timeline
	opts Options

	mu struct {
		sync.Mutex
		pending []pendingBatch // sorted by point, oldest first
		stats   Stats
	}
}

// NewQueue returns a queue over tl.
func NewQueue(tl Timeline, opts Options) *Queue {
	q := &Queue{tl: tl, opts: opts.withDefaults()}
	return q
}

// Options returns the queue's options with defaults applied.
func (q *Queue) Options() Options { return q.opts }

// Stats returns a snapshot of the queue's counters.
func (q *Queue) Stats() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	s := q.mu.stats
	s.PendingBatches = len(q.mu.pending)
	return s
}

// Retire defers b until the timeline passes point, the point of the last
// submission that used b's buffers. It first polls; if MaxPending batches
// are still pending it waits for the oldest (up to WaitDeadline) and
// releases it; then it adds b. Retire always takes ownership of b: when
// that wait fails (a deadline, a faulted stream) b is added all the same,
// the queue holds more than MaxPending batches until a later poll or drain,
// and the error is returned. Errors of release functions run on the way are
// joined into the result.
func (q *Queue) Retire(ctx context.Context, b Batch, point uint64) error {
	var errs []error
	q.mu.Lock()
	errs = q.pollLocked(errs)
	for len(q.mu.pending) >= q.opts.MaxPending {
		oldest := q.mu.pending[0].point
		n := len(q.mu.pending)
		q.mu.Unlock()
		werr := q.tl.Wait(ctx, oldest, q.opts.WaitDeadline)
		q.mu.Lock()
		if werr != nil {
			errs = append(errs, fmt.Errorf("retire: %d batches pending (max %d): wait for oldest point %d: %w",
				n, q.opts.MaxPending, oldest, werr))
			break
		}
		errs = q.releaseLocked(errs, oldest, &q.mu.stats.ReleasedByWait)
		// The wait may have covered more than the oldest.
		errs = q.pollLocked(errs)
	}
	pb := pendingBatch{point: point, batch: b, bytes: b.Bytes()}
	i := sort.Search(len(q.mu.pending), func(i int) bool { return q.mu.pending[i].point > point })
	q.mu.pending = append(q.mu.pending, pendingBatch{})
	copy(q.mu.pending[i+1:], q.mu.pending[i:])
	q.mu.pending[i] = pb
	q.mu.stats.PendingBytes += pb.bytes
	q.mu.stats.PeakPendingBytes = max(q.mu.stats.PeakPendingBytes, q.mu.stats.PendingBytes)
	// A batch whose point already passed (or point 0) goes at once.
	errs = q.pollLocked(errs)
	q.mu.Unlock()
	return errors.Join(errs...)
}

// Poll releases every batch whose point the timeline has passed, without
// blocking.
func (q *Queue) Poll() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return errors.Join(q.pollLocked(nil)...)
}

func (q *Queue) pollLocked(errs []error) []error {
	if len(q.mu.pending) == 0 {
		return errs
	}
	return q.releaseLocked(errs, q.tl.Completed(), &q.mu.stats.ReleasedByPoll)
}

// Drain waits for the newest pending point and releases every batch pending
// when it was called. On a failed wait nothing more is released and the
// batches stay pending (never freed early).
func (q *Queue) Drain(ctx context.Context) error {
	q.mu.Lock()
	if len(q.mu.pending) == 0 {
		q.mu.Unlock()
		return nil
	}
	newest := q.mu.pending[len(q.mu.pending)-1].point
	q.mu.Unlock()
	if err := q.tl.Wait(ctx, newest, q.opts.WaitDeadline); err != nil {
		return fmt.Errorf("retire: drain to point %d: %w", newest, err)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return errors.Join(q.releaseLocked(nil, newest, &q.mu.stats.ReleasedByDrain)...)
}

// DrainThrough is the explicit drain of a caller that has proved by other
// means that the device passed point: typically it read the timeline's
// Signalled value, then synchronized the timeline's stream. It releases
// every batch with a point up to point at once, without waiting, counted as
// drained. Unlike Drain it does not trust the timeline word, so a drain
// after a synchronize never waits, even if the word's writes were lost.
func (q *Queue) DrainThrough(point uint64) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return errors.Join(q.releaseLocked(nil, point, &q.mu.stats.ReleasedByDrain)...)
}

// ReleaseAll releases every pending batch without consulting the timeline.
// Call it only when the device will not touch the buffers again: every
// stream that used them was synchronized and is idle, or is dead after a
// fault (a drain would then wait for points that are never written).
func (q *Queue) ReleaseAll() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return errors.Join(q.releaseLocked(nil, ^uint64(0), &q.mu.stats.ReleasedForced)...)
}

// releaseLocked releases the pending batches with point <= upTo, oldest
// first, counting them in *counter.
func (q *Queue) releaseLocked(errs []error, upTo uint64, counter *uint64) []error {
	n := 0
	for n < len(q.mu.pending) && q.mu.pending[n].point <= upTo {
		n++
	}
	if n == 0 {
		return errs
	}
	done := q.mu.pending[:n]
	for _, pb := range done {
		for _, it := range pb.batch {
			if it.Release == nil {
				continue
			}
			if err := it.Release(); err != nil {
				q.mu.stats.ReleaseErrors++
				errs = append(errs, fmt.Errorf("retire: release of %d bytes retired at point %d: %w", it.Bytes, pb.point, err))
			}
		}
		q.mu.stats.PendingBytes -= pb.bytes
		*counter++
	}
	rest := copy(q.mu.pending, q.mu.pending[n:])
	clear(q.mu.pending[rest:]) // drop references to released batches
	q.mu.pending = q.mu.pending[:rest]
	return errs
}
