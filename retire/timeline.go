package retire

import (
	"context"
	"time"

	"github.com/stablegraph/stablegraph/vmm"
)

// Timeline is what a Queue waits on: a monotonic counter advanced by the
// GPU (see the package doc for the rule that ties its points to
// submissions). *vmm.Timeline, the module's timeline, satisfies it; tests
// may pass their own.
//
// Implementations must be safe for concurrent use.
type Timeline interface {
	// Completed returns the highest point the GPU has passed. It never
	// blocks and never decreases.
	Completed() uint64
	// Wait blocks until Completed() >= point, ctx is done, or timeout
	// passes. Waiting yields for a short bounded time, then sleeps with
	// back-off; it never spins for long. A missed deadline is an error
	// wrapping gpu.ErrTimeout.
	Wait(ctx context.Context, point uint64, timeout time.Duration) error
}

// SignalledTimeline is a Timeline that also reports the last point it handed
// out, so that a free at a point never signalled (which would never be
// reached) is refused. *vmm.Timeline satisfies it.
type SignalledTimeline interface {
	Timeline
	Signalled() uint64
}

var _ SignalledTimeline = (*vmm.Timeline)(nil)

// DefaultWaitDeadline bounds a queue's waits when Options.WaitDeadline is
// zero.
const DefaultWaitDeadline = 30 * time.Second
