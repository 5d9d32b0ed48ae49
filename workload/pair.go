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
// row's step is timed (gated where the row's is). Run times one of its
// steps beside each of its own measured steps (after it, and before it on
// odd steps, so that neither side always follows the binding and the last
// step's readback), so that a row's host time and latency and the floor's
// are taken in the same regime of the host's clock. Its outputs are not checked: the floor row checks the same
// executable's.
type floorPair struct {
	exe   *sg.Executable
	bind  sg.Bindings
	s     gpu.Stream
	timer *stepTimer
	// undo releases what newFloorPair made, newest first.
	undo []func() error
}

// pairWarmup is how many floor steps newFloorPair runs before any is
// timed: the first records the graph, the next replay it.
const pairWarmup = 3

// newFloorPair builds the pair for w with opts (its device, seed, gate) and
// runs its warm-up. On error everything made so far is released.
func newFloorPair(ctx context.Context, b gpu.Backend, w *Workload, opts RunOptions) (_ *floorPair, err error) {
	p := &floorPair{}
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("workload %s: the paired floor: %w", w.Name, err), p.close())
		}
	}()
	caller, err := NewCallerWith(b, opts.Device, w, Fixed, opts.Seed, CallerOptionsFor(sg.StrategyPatch))
	if err != nil {
		return nil, err
	}
	p.undo = append(p.undo, caller.Close)
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
	if p.bind, err = caller.Bind(0); err != nil {
		return nil, err
	}
	for range pairWarmup {
		if _, err := p.step(ctx); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// step times one floor step and waits for it, as Run times its own.
func (p *floorPair) step(ctx context.Context) (stepTimes, error) {
	var outs sg.Outputs
	times, err := p.timer.step(func() error {
		var err error
		outs, err = p.exe.Run(ctx, p.s, p.bind)
		return err
	})
	if err != nil {
		return stepTimes{}, fmt.Errorf("the paired floor's step: %w", err)
	}
	outs.Release()
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
