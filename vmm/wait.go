package vmm

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
)

// Defaults of WaitPolicy.
const (
	// DefaultWaitYield is how long a wait polls with yields before it first
	// sleeps. The common wait is a pool step whose slot the step before last
	// is still using: it lasts up to one GPU step, so the yield phase must
	// outlast the steps this runtime is for, or every wait ends in an
	// oversleep and steps run back to back slower than their GPU time
	// (docs/GPU-MACHINE.md, "The waiting policy", has the measurement). A
	// hung device still costs a core for at most this long per wait, as
	// CUDA's own default spin-wait would.
	DefaultWaitYield = time.Millisecond
	// DefaultWaitMinSleep is the first sleep after the yield phase. A Go
	// sleep shorter than this sleeps about this long anyway on Linux (timer
	// and scheduler latency), so asking for less only misleads.
	DefaultWaitMinSleep = 50 * time.Microsecond
	// DefaultWaitMaxSleep caps the sleeps: a wait on a hung device wakes
	// about a thousand times a second, and a long wait notices its point
	// at most this late.
	DefaultWaitMaxSleep = time.Millisecond
)

// WaitPolicy is how a wait for a host-visible counter polls it: Timeline.Wait,
// the module's one timeline wait (pool slots, retirement queues), follows
// it (docs/ARCHITECTURE.md, rule 3).
//
// A wait first polls for at most Yield, calling runtime.Gosched between
// reads: a point the device reaches within that time is seen within about a
// microsecond, where a sleep, however short it is asked to be, costs tens of
// microseconds. Then it sleeps between reads, MinSleep first and each sleep
// twice the last, up to MaxSleep. A hung device thus costs a core for Yield
// once per wait, never longer, and the wait ends with an error at its
// deadline.
//
// The zero value is the default policy; zero fields take the defaults.
type WaitPolicy struct {
	// Yield bounds the yield phase. Default DefaultWaitYield (1 ms);
	// negative: no yield phase, sleep from the first poll.
	Yield time.Duration
	// MinSleep is the first sleep after the yield phase. Default
	// DefaultWaitMinSleep (50 µs); must not be negative.
	MinSleep time.Duration
	// MaxSleep caps the sleeps. Default DefaultWaitMaxSleep (1 ms); must
	// not be negative. A MinSleep above it is lowered to it.
	MaxSleep time.Duration
}

// DefaultWaitPolicy returns the default policy with every field set.
func DefaultWaitPolicy() WaitPolicy { return WaitPolicy{}.normalized() }

// Validate reports a policy with a negative sleep.
func (p WaitPolicy) Validate() error {
	if p.MinSleep < 0 || p.MaxSleep < 0 {
		return fmt.Errorf("vmm: wait policy %+v: negative sleep: %w", p, gpu.ErrInvalidValue)
	}
	return nil
}

// normalized fills the zero fields with the defaults and orders the sleeps.
// Negative sleeps (refused by Validate) are taken as the defaults.
func (p WaitPolicy) normalized() WaitPolicy {
	if p.Yield == 0 {
		p.Yield = DefaultWaitYield
	}
	if p.MinSleep <= 0 {
		p.MinSleep = DefaultWaitMinSleep
	}
	if p.MaxSleep <= 0 {
		p.MaxSleep = DefaultWaitMaxSleep
	}
	p.MinSleep = min(p.MinSleep, p.MaxSleep)
	return p
}

// Next is the policy as a function: what a wait that has polled for
// elapsed, and whose last sleep was prev (0: it has not slept), does before
// its next read. Zero means yield (runtime.Gosched); otherwise it sleeps
// that long (Poll shortens the sleep to the deadline).
func (p WaitPolicy) Next(elapsed, prev time.Duration) time.Duration {
	p = p.normalized()
	switch {
	case prev == 0 && elapsed < p.Yield:
		return 0
	case prev == 0:
		return p.MinSleep
	}
	return min(2*prev, p.MaxSleep)
}

// WaitCount is what one wait did.
type WaitCount struct {
	Yields int64 // runtime.Gosched calls between reads
	Sleeps int64 // sleeps between reads
}

// WaitStats sum what the waits of one timeline did.
type WaitStats struct {
	// Waits counts the waits that had to poll (the point was not reached
	// at the call).
	Waits int64
	// Slept counts those of them that slept at least once: they outlasted
	// the yield phase.
	Slept int64
	// Yields and Sleeps sum their WaitCounts.
	Yields, Sleeps int64
	// Timeouts counts the waits that ended at their deadline.
	Timeouts int64
}

// waitCounters accumulate WaitStats without locks.
type waitCounters struct {
	waits, slept, yields, sleeps, timeouts atomic.Int64
}

func (c *waitCounters) add(n WaitCount, err error) {
	c.waits.Add(1)
	if n.Sleeps > 0 {
		c.slept.Add(1)
	}
	c.yields.Add(n.Yields)
	c.sleeps.Add(n.Sleeps)
	if errors.Is(err, gpu.ErrTimeout) {
		c.timeouts.Add(1)
	}
}

func (c *waitCounters) snapshot() WaitStats {
	return WaitStats{Waits: c.waits.Load(), Slept: c.slept.Load(), Yields: c.yields.Load(),
		Sleeps: c.sleeps.Load(), Timeouts: c.timeouts.Load()}
}

// Poll polls done, following p, until it reports true, and then returns
// nil. It gives up at deadline or at ctx's deadline, whichever comes first
// (a zero deadline: ctx's alone); with neither it fails at once with
// gpu.ErrInvalidValue, since a hung device must give an error. Passing the
// deadline is an error wrapping gpu.ErrTimeout, and also
// context.DeadlineExceeded when the deadline passed was ctx's; a cancelled
// ctx gives an error wrapping ctx.Err(). check, when not nil, is called
// before every sleep (never in the yield phase, where it would cost more
// than the wait): an error from it that done does not overrule ends the
// wait and is returned unwrapped. The count says what the wait did.
func (p WaitPolicy) Poll(ctx context.Context, deadline time.Time, done func() bool, check func() error) (WaitCount, error) {
	var n WaitCount
	if done() {
		return n, nil
	}
	end, ctxEnd := deadline, false
	if d, ok := ctx.Deadline(); ok && (end.IsZero() || !d.After(end)) {
		end, ctxEnd = d, true
	}
	if end.IsZero() {
		return n, fmt.Errorf("neither a deadline nor a context deadline: %w", gpu.ErrInvalidValue)
	}
	timedOut := func() error {
		if ctxEnd {
			// ctx's own timer may not have fired yet at this instant.
			return fmt.Errorf("%w (%w)", gpu.ErrTimeout, context.DeadlineExceeded)
		}
		return gpu.ErrTimeout
	}
	p = p.normalized()
	start := time.Now()
	var (
		timer *time.Timer
		prev  time.Duration
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if done() {
			return n, nil
		}
		now := time.Now()
		if !now.Before(end) {
			return n, timedOut()
		}
		sleep := p.Next(now.Sub(start), prev)
		if sleep == 0 {
			select {
			case <-ctx.Done():
				return n, ctxErr(ctx, done)
			default:
			}
			runtime.Gosched()
			n.Yields++
			continue
		}
		if check != nil {
			if err := check(); err != nil {
				// The failure may have come after the point was reached.
				if done() {
					return n, nil
				}
				return n, err
			}
		}
		prev = sleep
		sleep = min(sleep, end.Sub(now))
		if timer == nil {
			timer = time.NewTimer(sleep)
		} else {
			timer.Reset(sleep) // the channel was drained: Reset is safe
		}
		n.Sleeps++
		select {
		case <-ctx.Done():
			return n, ctxErr(ctx, done)
		case <-timer.C:
		}
	}
}

// ctxErr is the error of a wait whose ctx is done, nil when done() holds
// after all.
func ctxErr(ctx context.Context, done func() bool) error {
	if done() {
		return nil
	}
	if err := ctx.Err(); errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w (%w)", gpu.ErrTimeout, err)
	}
	return ctx.Err()
}
