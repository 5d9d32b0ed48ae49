package workload

import (
	"context"
	"errors"
	"fmt"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
)

// floorPair is the floor Bench times beside every row (RunOptions.PairFloor):
// the workload compiled with patch on fixed buffers, warmed up, its step
// timed by a step timer of its own on a stream of its own, exactly as a
// row's step is timed (gated where the row's is), its caller doing the
// row's caller's allocations and copies without moving anything
// (CallerOptions.ShadowMoves) beside a Random row. After every pairBlock of
// its own measured steps, Run times a block of as many of the floor's
// behind one untimed step (block), so that a row's host time, latency and
// GPU time and the floor's are taken in the same regime of the host's
// clock, and each side's steps follow one of its own. Its outputs are read
// as a row's are, not checked: the floor row checks the same executable's.
type floorPair struct {
	exe    *sg.Executable
	w      *Workload
	caller *Caller
	steps  int      // the steps bound so far
	out    [][]byte // the outputs' readback buffers, reused
	s      gpu.Stream
	timer  *stepTimer
	// undo releases what newFloorPair made, newest first.
	undo []func() error
}

// pairWarmup is how many floor steps newFloorPair runs before any is
// timed: the first records the graph, the next replay it.
const pairWarmup = 3

// pairBlock is how many of a row's measured steps each block of the
// floor's follows (RunOptions.PairFloor): short enough that a block and
// the floor's beside it share the host's regime, which lasts many steps,
// and long enough that the first step of each, which follows the other
// executable's block, is a small part of it.
const pairBlock = 8

// newFloorPair builds the pair for w with opts (its device, seed, gate) and
// runs its warm-up. On error everything made so far is released.
func newFloorPair(ctx context.Context, b gpu.Backend, w *Workload, opts RunOptions) (_ *floorPair, err error) {
	p := &floorPair{w: w}
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("workload %s: the paired floor: %w", w.Name, err), p.close())
		}
	}()
	copts := CallerOptionsFor(sg.StrategyPatch)
	copts.PinnedInputs = opts.PinnedInputs // the row's harness
	// A Random row's caller allocates, frees and (gpt2-decode) copies
	// before every step; the floor's does the same work, to keep the
	// buffers it binds.
	copts.ShadowMoves = opts.Pattern == Random
	caller, err := NewCallerWith(b, opts.Device, w, Fixed, opts.Seed, copts)
	if err != nil {
		return nil, err
	}
	p.undo = append(p.undo, caller.Close)
	p.caller = caller
	if p.s, err = b.StreamCreate(opts.Device, gpu.StreamNonBlocking, 0); err != nil {
		return nil, fmt.Errorf("stream: %w", err)
	}
	s := p.s
	p.undo = append(p.undo, func() error { return b.StreamDestroy(s) }, func() error { return b.StreamSynchronize(s) })
	timer, releaseTimer, err := newStepTimer(b, opts.Device, s, opts, nil)
	if err != nil {
		return nil, err
	}
	p.timer = timer
	p.undo = append(p.undo, releaseTimer)
	sopts := sg.Options{Strategy: sg.StrategyPatch, Device: opts.Device, Logger: opts.Logger, Costs: opts.Costs}
	if p.exe, err = compileWorkload(ctx, b, w, sopts); err != nil {
		return nil, err
	}
	p.undo = append(p.undo, p.exe.Close)
	for range pairWarmup {
		if _, err := p.step(ctx); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// block runs one untimed floor step, then times n, each as Run times its
// own: the untimed one runs after the row's block, as the row's first step
// after this block runs after it.
func (p *floorPair) block(ctx context.Context, n int) ([]stepTimes, error) {
	if _, err := p.step(ctx); err != nil {
		return nil, err
	}
	times := make([]stepTimes, n)
	for i := range times {
		t, err := p.step(ctx)
		if err != nil {
			return nil, err
		}
		times[i] = t
	}
	return times, nil
}

// step times one floor step and waits for it, as Run times its own, with
// the same work around it: the step's inputs written before it (its
// caller's Bind) and its outputs read back and hashed after it, which a
// row's step has too and which leave the host's caches as the next step
// finds them.
func (p *floorPair) step(ctx context.Context) (stepTimes, error) {
	bind, err := p.caller.Bind(p.steps)
	if err != nil {
		return stepTimes{}, fmt.Errorf("the paired floor's step %d: %w", p.steps, err)
	}
	p.steps++
	var outs sg.Outputs
	times, err := p.timer.step(func() error {
		var err error
		outs, err = p.exe.Run(ctx, p.s, bind)
		return err
	})
	if err != nil {
		return stepTimes{}, fmt.Errorf("the paired floor's step: %w", err)
	}
	defer outs.Release()
	if _, p.out, err = digest(ctx, p.exe, p.w, outs, p.out); err != nil {
		return stepTimes{}, fmt.Errorf("the paired floor's step: %w", err)
	}
	return times, nil
}

// close releases the pair: the executable (which waits for its last
// step), the timer, the stream, the caller's buffers.
func (p *floorPair) close() error {
	var errs error
	for i := len(p.undo) - 1; i >= 0; i-- {
		errs = errors.Join(errs, p.undo[i]())
	}
	p.undo = nil
	return errs
}
