package workload

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/report"
)

// DefaultGateWatchdog is RunOptions.GateWatchdog's default: far more than
// any step's host call takes, even on a loaded machine, so that the
// watchdog fires only for a call that waits on its own stream.
const DefaultGateWatchdog = 2 * time.Second

// stepTimer times one step at a time on an idle stream: the host time of
// the call that enqueues it, the GPU time of what the call enqueued, and
// the step's latency (from the call to the end of that work).
//
// Gated (the backend has gpu.StreamWaits): the stream first records evPre,
// then waits behind the gate, a word of mapped host memory, for the step's
// ticket k; ev0 is recorded behind the wait. The host times the call, then
// stores k into the gate; ev1 is recorded after the call's work. Everything
// the call enqueued reaches the device at once when the gate opens, so
// ev0→ev1 is the device's work alone (the host's per-node updates, checks
// and table writes before the launch are no longer in it) and evPre→ev1
// the latency. A call that waits on the stream itself would deadlock
// behind the gate: a watchdog opens it after GateWatchdog. What the call
// enqueues after that release runs as it comes, so that step's GPU time
// includes host time: the step is marked released (a host call merely
// slower than the watchdog is marked the same way), left out of the GPU
// percentiles and named in the row's note (describe), never averaged in
// silently. The gate only ever rises, so a watchdog that fires late, into
// a later step, cannot hold that step's stream back.
//
// Ungated (no stream waits, or RunOptions.NoGate): ev0 before the call and
// ev1 after it, as before gating; the GPU time is the latency.
type stepTimer struct {
	b        gpu.Backend
	s        gpu.Stream
	pre      gpu.Event // gated only
	ev       [2]gpu.Event
	waits    gpu.StreamWaits // nil: ungated
	gate     gpu.HostMem
	ticket   uint64 // the last value the stream was told to wait for
	watchdog time.Duration
	// why is the reason the timer is ungated; empty when gated.
	why string
	// barrier, when set, aligns the ranks of a communicator before each
	// step (see "Aligning the ranks' step times" in ranks.go); gateEv is
	// recorded behind the gate, before the device's barrier, when gated.
	barrier *rankBarrier
	gateEv  gpu.Event
	// steps counts the calls of step since measure (the warm-up's are
	// before it); released are those of them the watchdog let through.
	steps    int
	released []int
	// mu guards the gate's value, which the watchdog's goroutine raises
	// too, and fired, the last ticket the watchdog opened the gate for.
	mu     sync.Mutex
	opened uint64
	fired  uint64
}

// stepTimes are one step's times.
type stepTimes struct {
	gpu, latency, host time.Duration
	// skew is how long the device waited behind the gate for the other
	// ranks (the barrier's time); zero without a barrier.
	skew time.Duration
}

// newStepTimer makes the events (and, when gated, the gate) on dev for
// stream s; barrier, when not nil, aligns the ranks before each step.
// release frees them all; it opens the gate and synchronizes s first, so
// that nothing is left waiting on memory it frees. On error everything
// made so far is already released.
func newStepTimer(b gpu.Backend, dev int, s gpu.Stream, opts RunOptions, barrier *rankBarrier) (_ *stepTimer, _ func() error, err error) {
	t := &stepTimer{b: b, s: s, watchdog: opts.GateWatchdog, barrier: barrier}
	var undo []func() error
	release := func() error {
		var errs error
		for i := len(undo) - 1; i >= 0; i-- {
			errs = errors.Join(errs, undo[i]())
		}
		undo = nil
		return errs
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, release())
		}
	}()
	event := func() (gpu.Event, error) {
		e, err := b.EventCreate(dev, gpu.EventDefault)
		if err != nil {
			return 0, fmt.Errorf("workload: event: %w", err)
		}
		undo = append(undo, func() error { return b.EventDestroy(e) })
		return e, nil
	}
	for i := range t.ev {
		if t.ev[i], err = event(); err != nil {
			return nil, nil, err
		}
	}
	if opts.NoGate {
		t.why = "RunOptions.NoGate"
		return t, release, nil
	}
	waits, err := gpu.StreamWaitsOf(b, dev)
	if err != nil {
		if !errors.Is(err, gpu.ErrNotSupported) {
			return nil, nil, fmt.Errorf("workload: stream waits: %w", err)
		}
		t.why = err.Error()
		return t, release, nil
	}
	host, err := gpu.StreamMemOpsOf(b, dev)
	if err != nil {
		if !errors.Is(err, gpu.ErrNotSupported) {
			return nil, nil, fmt.Errorf("workload: step gate: %w", err)
		}
		t.why = err.Error()
		return t, release, nil
	}
	gate, err := host.HostAlloc(8)
	if err != nil {
		if !errors.Is(err, gpu.ErrNotSupported) {
			return nil, nil, fmt.Errorf("workload: step gate: %w", err)
		}
		t.why = err.Error()
		return t, release, nil
	}
	undo = append(undo, func() error {
		// Open for every ticket handed out, let the stream pass, then
		// free the word it polls.
		t.open(t.ticket, false)
		return errors.Join(b.StreamSynchronize(s), host.HostFree(gate.Handle))
	})
	if t.pre, err = event(); err != nil {
		return nil, nil, err
	}
	if barrier != nil {
		if t.gateEv, err = event(); err != nil {
			return nil, nil, err
		}
	}
	t.waits, t.gate = waits, gate
	return t, release, nil
}

// gated reports whether the GPU time excludes host time.
func (t *stepTimer) gated() bool { return t.waits != nil }

// measure starts the measured steps: the steps and releases counted so
// far (the warm-up's) are forgotten.
func (t *stepTimer) measure() {
	t.steps, t.released = 0, nil
}

// open raises the gate to ticket k, if it is not there already, for the
// host (dog false) or the watchdog, and reports whether this call raised
// it: a watchdog that finds the gate raised released nothing.
func (t *stepTimer) open(k uint64, dog bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if int64(k-t.opened) <= 0 {
		return false
	}
	t.opened = k
	t.gate.Store64(0, k)
	if dog {
		t.fired = k
	}
	return true
}

// releasedBy reports whether the watchdog raised the gate for ticket k.
func (t *stepTimer) releasedBy(k uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.fired == k
}

// step times call, which enqueues one step on t.s, and waits for the step's
// device work. The gate is open again whenever step returns.
func (t *stepTimer) step(call func() error) (stepTimes, error) {
	if t.barrier != nil {
		if err := t.barrier.wait(); err != nil {
			return stepTimes{}, err
		}
	}
	if !t.gated() {
		return t.stepEvents(call)
	}
	k := t.ticket + 1
	if err := t.b.EventRecord(t.pre, t.s); err != nil {
		return stepTimes{}, fmt.Errorf("record the step's first event: %w", err)
	}
	if err := t.waits.StreamWaitValue64(t.s, t.gate.Ptr, k); err != nil {
		return stepTimes{}, fmt.Errorf("hold the stream behind the gate: %w", err)
	}
	t.ticket = k
	step := t.steps
	t.steps++
	dog := time.AfterFunc(t.watchdog, func() { t.open(k, true) })
	open := func() {
		dog.Stop() // if it has fired, open says whether it opened the gate
		t.open(k, false)
		if t.releasedBy(k) {
			t.released = append(t.released, step)
		}
	}
	if t.barrier != nil {
		if err := t.b.EventRecord(t.gateEv, t.s); err != nil {
			open()
			return stepTimes{}, fmt.Errorf("record the gate's event: %w", err)
		}
		if err := t.barrier.enqueue(); err != nil {
			open()
			return stepTimes{}, err
		}
	}
	if err := t.b.EventRecord(t.ev[0], t.s); err != nil {
		open()
		return stepTimes{}, fmt.Errorf("record the start event: %w", err)
	}
	t0 := time.Now()
	err := call()
	host := time.Since(t0)
	open()
	if err != nil {
		return stepTimes{}, err
	}
	if err := t.finish(); err != nil {
		return stepTimes{}, err
	}
	gpuTime, err := t.b.EventElapsed(t.ev[0], t.ev[1])
	if err != nil {
		return stepTimes{}, fmt.Errorf("elapsed time: %w", err)
	}
	if t.barrier != nil {
		// The latency is the rank's own: the gate's wait for its host,
		// then its device work, without the wait for the other ranks.
		toGate, err := t.b.EventElapsed(t.pre, t.gateEv)
		if err != nil {
			return stepTimes{}, fmt.Errorf("elapsed time: %w", err)
		}
		skew, err := t.b.EventElapsed(t.gateEv, t.ev[0])
		if err != nil {
			return stepTimes{}, fmt.Errorf("elapsed time: %w", err)
		}
		return stepTimes{gpu: gpuTime, latency: toGate + gpuTime, host: host, skew: skew}, nil
	}
	latency, err := t.b.EventElapsed(t.pre, t.ev[1])
	if err != nil {
		return stepTimes{}, fmt.Errorf("elapsed time: %w", err)
	}
	return stepTimes{gpu: gpuTime, latency: latency, host: host}, nil
}

// stepEvents is step without a gate: events around the call.
func (t *stepTimer) stepEvents(call func() error) (stepTimes, error) {
	if err := t.b.EventRecord(t.ev[0], t.s); err != nil {
		return stepTimes{}, fmt.Errorf("record the start event: %w", err)
	}
	t0 := time.Now()
	err := call()
	host := time.Since(t0)
	if err != nil {
		return stepTimes{}, err
	}
	if err := t.finish(); err != nil {
		return stepTimes{}, err
	}
	el, err := t.b.EventElapsed(t.ev[0], t.ev[1])
	if err != nil {
		return stepTimes{}, fmt.Errorf("elapsed time: %w", err)
	}
	return stepTimes{gpu: el, latency: el, host: host}, nil
}

// finish records the end event and waits for it.
func (t *stepTimer) finish() error {
	if err := t.b.EventRecord(t.ev[1], t.s); err != nil {
		return fmt.Errorf("record the end event: %w", err)
	}
	return t.b.EventSynchronize(t.ev[1])
}

// describe fills r's GPUTiming and adds to its note what a reader of the
// GPU column must know: that it is ungated and why, or which measured
// steps the watchdog let through. r's samples are set (SetSamples): the
// GPU percentiles are computed again without the released steps, whose
// GPU samples include host time, unless every step was released.
func (t *stepTimer) describe(r *report.Result) {
	if !t.gated() {
		r.GPUTiming = report.GPUTimingEvents
		r.Note = joinNote(r.Note, "GPU time not gated ("+t.why+"): events around Run, so it includes the host time before the launch (it is the latency)")
		return
	}
	r.GPUTiming = report.GPUTimingGated
	if len(t.released) == 0 {
		return
	}
	steps := make([]string, len(t.released))
	out := map[int]bool{}
	for i, s := range t.released {
		steps[i] = fmt.Sprint(s)
		out[s] = true
	}
	what := fmt.Sprintf("%d of %d measured steps (%s) released by the watchdog after %v (Run waited on its stream, or its host call took that long): their GPU samples include the host time of what Run enqueued after the release",
		len(t.released), len(r.StepSamplesUS), strings.Join(steps, ", "), t.watchdog)
	var kept []float64
	for i, v := range r.StepSamplesUS {
		if !out[i] {
			kept = append(kept, v)
		}
	}
	if len(kept) == 0 {
		r.Note = joinNote(r.Note, what+", and so does the GPU column: every step was released")
		return
	}
	r.StepUS = report.Summarize(kept)
	r.Note = joinNote(r.Note, what+" and are left out of the GPU column")
}

// releasedSteps are the measured steps the watchdog let through.
func (t *stepTimer) releasedSteps() []int { return append([]int(nil), t.released...) }
