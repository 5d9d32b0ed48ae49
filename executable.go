package stablegraph

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/graph"
	"github.com/stablegraph/stablegraph/internal/trace"
	"github.com/stablegraph/stablegraph/replay"
)

// Bindings give the device address of every param and output buffer for
// one step: the caller's memory, which may be at new addresses every step.
// Each must hold at least the buffer's declared size.
type Bindings map[Buffer]gpu.DevicePtr

// Outputs say, after a step, where each output buffer's result is. It is
// the address the caller bound, except under StrategyPool with
// Options.Pool.ZeroCopyOutputs, where it is the memory of the pool slot that ran
// the step, leased to the caller: that slot is not reused until Release,
// so the results stay valid until then and no longer.
//
// The zero Outputs holds no output. Outputs may be copied; copies share
// the lease. Release is safe from any goroutine.
type Outputs struct {
	prog *Program
	// ids are the output buffers (the executable's own list, never
	// modified) and addrs their addresses: inline up to outputsInline
	// outputs, so that a step allocates nothing for them, else in more.
	ids   []int
	addrs [outputsInline]gpu.DevicePtr
	more  []gpu.DevicePtr
	lease replay.Lease
}

// outputsInline is how many outputs Outputs holds without an allocation.
const outputsInline = 8

// at is the address of the k-th output.
func (o *Outputs) at(k int) gpu.DevicePtr {
	if o.more != nil {
		return o.more[k]
	}
	return o.addrs[k]
}

// lookup returns buf's address and whether buf is among the outputs.
func (o *Outputs) lookup(buf Buffer) (gpu.DevicePtr, bool) {
	if buf.p != o.prog || o.prog == nil {
		return 0, false
	}
	for k, id := range o.ids {
		if id == buf.id {
			return o.at(k), true
		}
	}
	return 0, false
}

// Addr is the address of output buf's result, 0 when buf is not an output
// of the step.
func (o Outputs) Addr(buf Buffer) gpu.DevicePtr {
	p, _ := o.lookup(buf)
	return p
}

// Buffers lists the outputs, in no particular order.
func (o Outputs) Buffers() []Buffer {
	out := make([]Buffer, 0, len(o.ids))
	for _, id := range o.ids {
		out = append(out, Buffer{p: o.prog, id: id})
	}
	return out
}

// Leased reports whether the outputs are pool slot memory leased to the
// caller and not yet released.
func (o Outputs) Leased() bool { return o.lease != nil && !o.lease.Released() }

// Release ends the lease on the outputs' slot, so that a later step may
// reuse it; the addresses must not be used after. It is idempotent, a no-op
// for outputs that are not leased, and safe to call after the executable
// is closed (Close ends every lease).
func (o Outputs) Release() {
	if o.lease != nil {
		o.lease.Release()
	}
}

// MemoryStats are the bytes of device memory an executable owns.
type MemoryStats struct {
	// States and Constants are the executable's own allocations of them; a
	// state rebound to the caller's memory (BindState) no longer counts.
	States, Constants uint64
	Temps             uint64 // the temp arena, with sharing
	TempsUnshared     uint64 // what the temps would take without sharing
	// Workspace is the library workspace the executable's tracer owns for
	// its library commands (GEMMs), allocated at the first one run or
	// captured: 0 before, and without library commands.
	Workspace uint64
	// Persistent is what StrategyStable holds: a persistent copy of every
	// param and output, and the area for copies laid out as the caller's
	// overlapping buffers are, once a step needed it.
	Persistent uint64
	// Slots is what StrategyPool holds: SlotCount slots of physical memory,
	// each with a copy of every param and output, rounded up to the VMM
	// granularity.
	Slots     uint64
	SlotCount int
}

// Total is all the device memory the executable holds while it runs
// (TempsUnshared aside, which is not allocated).
func (m MemoryStats) Total() uint64 {
	return m.States + m.Constants + m.Temps + m.Workspace + m.Persistent + m.Slots
}

// Counters count the work an executable's strategy did (see
// replay.Counters for each field). Stats holds them summed since Compile
// and for the last step alone, so a benchmark can report totals and
// per-step figures.
type Counters = replay.Counters

// Fallbacks say why the strategy's graph updates were refused, by reason
// (see replay.Fallbacks).
type Fallbacks = replay.Fallbacks

// Choice says which strategy an executable runs and why (see
// replay.Choice).
type Choice = replay.Choice

// Candidate is one strategy StrategyAuto weighed (see replay.Candidate).
type Candidate = replay.Candidate

// Stats is a snapshot of an executable's counters.
type Stats struct {
	// Strategy is the strategy that runs: the one StrategyAuto chose, when
	// it was asked for (see Executable.Choice).
	Strategy Strategy
	// Ran is the strategy that ran the last step: Strategy, except while
	// StrategyAuto probes, when it is the candidate measured ("" before the
	// first step).
	Ran Strategy
	// Probing is true while StrategyAuto is still measuring its
	// candidates: the last step ran one of them, or the model's choice
	// while the probes' times are pending, and Strategy is the model's
	// choice so far.
	Probing bool
	// Steps counts successful Runs.
	Steps int64
	// Counters are the totals since Compile.
	Counters
	// Last are the counters of the most recent Run alone (failed or not).
	Last Counters
	// Fallbacks say why the updates counted in Counters.UpdateFallbacks
	// were refused: by reason, and the last refusal in full.
	Fallbacks Fallbacks
}

// TraceInfo describes one traced command (GEMMs included).
type TraceInfo struct {
	Command   string // "command 3 (gemm)"
	Patchable bool   // differential tracing proved a template
	Reason    string // why not patchable; "" when patchable or not yet traced for patching
	Cached    int    // traces in its cache
	// Flattened: its latest trace went into the step's graph node by node;
	// otherwise it is one child-graph node, and NotFlatReason says why
	// ("" before it was recorded into a graph).
	Flattened     bool
	NotFlatReason string
}

// Executable is a compiled Program bound to a device and a strategy. Run
// executes one step.
//
// An Executable is safe for concurrent use. Its methods are serialised by
// one mutex, which the graph rules require anyway (a graph and its exec
// must not be used from two goroutines at once), and consecutive steps are
// ordered on the device even when they are run on different streams: each
// Run records an event, and a Run on another stream first waits for it,
// because every step shares the executable's temps and states. The waits
// that do not hold the mutex are a pool step's wait for a slot, so that
// results can be read and leases released meanwhile, and Close's wait for
// the last step. The read-only accessors (Stats, Memory, Choice, Strategy,
// Traces) never wait for the device nor behind Close: Traces waits at most
// for a step being enqueued, the others for nothing.
type Executable struct {
	// Immutable after Compile.
	b     gpu.Backend
	dev   int
	opts  Options
	log   *slog.Logger
	prog  *Program // identifies the program's Buffers
	name  string
	bufs  []bufDecl
	rbufs []replay.Buffer // the buffers as the strategy knows them (class, size, flow)
	// classes split them by class: Bound are the buffers Bindings must
	// name.
	classes replay.Classes
	funcs   map[string]gpu.Function
	cb      *graph.CommandBuffer
	// strat is the replay strategy, called only through the replay
	// interfaces. Run, Acquire, Counters and Close are called under mu;
	// the reports (memory, choice) without it. Closed once, by Close, and
	// kept for those reports.
	strat replay.Strategy
	// leased: the strategy hands out its own memory for outputs (zero-copy
	// pool), so outputs need not be bound.
	leased bool
	// aliasSafe: the strategy gives eager's results for bound buffers that
	// overlap (replay.AliasSafe); otherwise such bindings are refused.
	aliasSafe bool

	// closing is cancelled when Close begins: it wakes at once every Run
	// waiting for a pool slot and every read waiting for the last step,
	// which then fail with ErrClosed. closeSem (capacity 1) serialises
	// Closes, as a channel so that a Close waiting for another honours its
	// context.
	closing    context.Context
	beginClose context.CancelFunc
	closeSem   chan struct{}

	// trMu guards the traced commands' state (their caches, templates,
	// flattening), which a step changes: Run holds it while the strategy
	// enqueues the step, Close while it releases the tracer, Traces while
	// it reads them. Taken under mu, before any strategy lock.
	trMu sync.Mutex

	// pub is what the read-only accessors report, published by Run,
	// BindState and Close; a leaf lock, never held across a call.
	pub struct {
		sync.Mutex
		stats   Stats
		stepped bool        // a step ran (Stats.Ran)
		mem     MemoryStats // the executable's own memory; the strategy's is asked for
		closed  bool        // Close began
		// released: everything is released (Close succeeded, or Compile
		// failed), as mu.released, for a Close that must not wait for mu.
		released bool
	}

	mu struct {
		sync.Mutex
		closed   bool // Close began: every method fails with ErrClosed
		released bool // everything is released (Close succeeded, or Compile failed)
		// addrs is the address of every buffer for the current step:
		// fixed for owned buffers, set from Bindings for the others.
		addrs    []gpu.DevicePtr
		owned    []gpu.DevicePtr // per buffer, its own allocation (0: none)
		arena    gpu.DevicePtr   // the temps' allocation
		boundGen []uint64        // per buffer, the step that bound it
		gen      uint64
		modules  []gpu.Module
		capture  gpu.Stream // the tracer's capture stream
		done     gpu.Event  // recorded after every step
		last     gpu.Stream // stream of the last step, 0 before the first
		tr       *trace.Tracer
		stats    Stats // Counters as of the last step, Last, Steps, SlotWaits
		rebound  int   // states bound to the caller's memory (BindState)
		// probeTrace is the tracer's work in StrategyAuto's probe steps,
		// which counts in no counter (Counters.ProbeSteps).
		probeTrace trace.Stats
		// ov and ids are the scratch of the overlap check (bindLocked).
		ov  replay.Overlaps
		ids []int
	}
}

// Strategy is the replay strategy that runs: the one requested, or the
// one StrategyAuto chose (see Choice; while auto is still probing, the
// model's choice).
func (e *Executable) Strategy() Strategy {
	return replay.StatusOf(e.strat, e.opts.Strategy, false).Running
}

// Choice says which strategy runs and why: for StrategyAuto, the measured
// and modelled cost of every candidate and any fallback. Under
// StrategyAuto with probing (Options.Auto.ProbeSteps) it changes once, when
// auto decides (Choice.Probing turns false).
func (e *Executable) Choice() Choice { return replay.ChoiceOf(e.strat, e.opts.Strategy) }

// Program is the program compiled.
func (e *Executable) Program() *Program { return e.prog }

// Memory reports the device memory the executable owns, the strategy's
// persistent copies and pool slots and the tracer's library workspace
// included. While StrategyAuto probes it holds every candidate's memory;
// once it decides, the kept one's only.
func (e *Executable) Memory() MemoryStats {
	e.pub.Lock()
	m := e.pub.mem
	e.pub.Unlock()
	sm := replay.MemoryOf(e.strat)
	m.Persistent, m.Slots, m.SlotCount = sm.Persistent, sm.Slots, sm.SlotCount
	return m
}

// Run executes one step on stream s with the params and outputs at the
// addresses in b, and returns where the outputs are. It enqueues work and
// returns without waiting for it; synchronise s (or read through
// ReadOutput) before using the results. State buffers are updated in
// place.
//
// The bindings are checked before anything is enqueued (errors wrap
// ErrInvalidBinding and name the buffer): every param and output bound,
// each to at least its size of one live allocation where the backend can
// tell (gpu.CheckBinding), and buffers that overlap in memory only as the
// package doc's "Bindings" section allows. s must not be capturing: a step
// is refused on a capturing stream with an error wrapping
// ErrStreamCapturing.
//
// Under StrategyPool, Run may first wait for a slot, without holding the
// executable's lock, up to Options.SlotWait or ctx's deadline; passing it
// is an error wrapping ErrSlotWait; Close wakes the wait, which fails with
// ErrClosed. With zero-copy outputs the caller must Release the Outputs
// returned (see Outputs). A nil ctx is an error wrapping
// gpu.ErrInvalidValue, as for every method that takes a context.
func (e *Executable) Run(ctx context.Context, s gpu.Stream, b Bindings) (Outputs, error) {
	steps, closed := e.published()
	if closed {
		return Outputs{}, ErrClosed
	}
	if ctx == nil {
		return Outputs{}, e.stepErr(steps, "", errNilContext)
	}
	if err := ctx.Err(); err != nil {
		return Outputs{}, e.stepErr(steps, "", err)
	}
	// Before anything is bound or enqueued: a capturing stream would take
	// the step's work into the caller's graph (see ErrStreamCapturing).
	if err := e.checkStream(s); err != nil {
		return Outputs{}, e.stepErr(steps, "", err)
	}
	var (
		deadline time.Time
		waits    int64
	)
	e.mu.Lock()
	for {
		if e.mu.closed {
			e.mu.Unlock()
			return Outputs{}, ErrClosed
		}
		if err := e.bindLocked(b); err != nil {
			step := e.mu.stats.Steps
			e.mu.Unlock()
			return Outputs{}, e.stepErr(step, "", err)
		}
		wait := replay.Acquire(e.strat)
		if wait == nil {
			break
		}
		// Wait without the lock, so that other goroutines may read
		// results, release leases or close meanwhile; then bind again,
		// since another step may have run. Close cancels the wait.
		waits++
		e.mu.stats.SlotWaits++
		e.pub.Lock()
		e.pub.stats.SlotWaits = e.mu.stats.SlotWaits // seen while it waits
		e.pub.Unlock()
		if deadline.IsZero() {
			deadline = time.Now().Add(e.opts.SlotWait)
		}
		step := e.mu.stats.Steps
		e.mu.Unlock()
		wctx, cancel := context.WithDeadline(ctx, deadline)
		stop := context.AfterFunc(e.closing, cancel)
		err := wait(wctx)
		stop()
		cancel()
		if e.closing.Err() != nil {
			return Outputs{}, e.stepErr(step, "", fmt.Errorf("woken from the wait for a pool slot: %w", ErrClosed))
		}
		if err != nil {
			return Outputs{}, e.stepErr(step, e.Strategy(), err)
		}
		e.mu.Lock()
	}
	defer e.mu.Unlock()
	step := e.mu.stats.Steps
	before := e.countersLocked()
	before.SlotWaits -= waits // this step's waits belong to its Last
	if e.mu.last != 0 && e.mu.last != s {
		if err := e.b.StreamWaitEvent(s, e.mu.done); err != nil {
			e.mu.stats.Last = e.mu.stats.Counters.Sub(before)
			e.publishLocked(false)
			return Outputs{}, e.stepErr(step, "", fmt.Errorf("order after the previous step: %w", err))
		}
	}
	e.trMu.Lock()
	traced := e.mu.tr.Stats
	res, err := e.strat.Run(ctx, s, e.mu.addrs)
	e.trMu.Unlock()
	// Record even after a failure: part of the step may be enqueued, and
	// the next step must still come after it.
	if rerr := e.b.EventRecord(e.mu.done, s); rerr != nil {
		err = errors.Join(err, fmt.Errorf("record step event: %w", rerr))
		// Without the event, later steps, reads and Close would wait only
		// for the step before this one: wait for this one's work here.
		if serr := e.b.StreamSynchronize(s); serr != nil {
			err = errors.Join(err, fmt.Errorf("wait for the step whose event failed: %w", serr))
		}
	} else {
		e.mu.last = s
	}
	e.mu.stats.Counters = e.countersLocked()
	if e.mu.stats.Counters.ProbeSteps != before.ProbeSteps {
		// A probe step: what the tracer did for it counts nowhere either.
		e.mu.probeTrace = e.mu.probeTrace.Plus(e.mu.tr.Stats.Minus(traced))
		e.mu.stats.Counters = e.countersLocked()
	}
	e.mu.stats.Last = e.mu.stats.Counters.Sub(before)
	if err != nil {
		e.publishLocked(e.mu.stats.Last.UpdateFallbacks != 0)
		if res.Lease != nil {
			res.Lease.Release()
		}
		return Outputs{}, e.stepErr(step, e.Strategy(), err)
	}
	e.mu.stats.Steps++
	e.publishLocked(e.mu.stats.Last.UpdateFallbacks != 0)
	outs := Outputs{prog: e.prog, ids: e.classes.Outputs, lease: res.Lease}
	if len(e.classes.Outputs) > outputsInline {
		outs.more = make([]gpu.DevicePtr, len(e.classes.Outputs))
	}
	for i, id := range e.classes.Outputs {
		p := e.mu.addrs[id]
		if res.Outs != nil {
			p = res.Outs[i]
		}
		if outs.more != nil {
			outs.more[i] = p
		} else {
			outs.addrs[i] = p
		}
	}
	return outs, nil
}

// stepErr wraps an error of Run at step (the steps done before it) with
// the executable's name and, when given, the strategy that ran.
func (e *Executable) stepErr(step int64, st Strategy, err error) error {
	if st != "" {
		return fmt.Errorf("stablegraph: executable %s: step %d (%s): %w", e.name, step, st, err)
	}
	return fmt.Errorf("stablegraph: executable %s: step %d: %w", e.name, step, err)
}

// releasedPub reports whether the executable has released everything.
func (e *Executable) releasedPub() bool {
	e.pub.Lock()
	defer e.pub.Unlock()
	return e.pub.released
}

// published is the steps done and whether Close has begun, as published
// (Run reads them before it takes the lock).
func (e *Executable) published() (steps int64, closed bool) {
	e.pub.Lock()
	defer e.pub.Unlock()
	return e.pub.stats.Steps, e.pub.closed
}

// checkStream refuses a stream that is capturing.
func (e *Executable) checkStream(s gpu.Stream) error {
	capturing, err := e.b.StreamIsCapturing(s)
	if err != nil {
		return fmt.Errorf("ask whether stream %#x is capturing: %w", uint64(s), err)
	}
	if capturing {
		return fmt.Errorf("%w: stream %#x is capturing a graph; an executable launches graphs of its own (and records, updates and copies around them), which cannot be captured into the caller's: run the step on a stream that is not capturing, or end the capture first",
			ErrStreamCapturing, uint64(s))
	}
	return nil
}

// publishLocked publishes the counters of the last Run for the read-only
// accessors, with the fallbacks' reasons when they changed and the
// tracer's workspace.
func (e *Executable) publishLocked(fallbacks bool) {
	var f Fallbacks
	if fallbacks {
		f = replay.FallbacksOf(e.strat)
	}
	ws := e.mu.tr.WorkspaceSize()
	e.pub.Lock()
	defer e.pub.Unlock()
	prev := e.pub.stats.Fallbacks
	e.pub.stats = e.mu.stats
	e.pub.stats.Fallbacks = prev
	if fallbacks {
		e.pub.stats.Fallbacks = f
	}
	e.pub.stepped = e.mu.last != 0
	e.pub.mem.Workspace = ws
}

// bindLocked sets the addresses of the params and outputs from b, checking
// that b names each of them, and nothing else, with a non-null address at
// which its whole size lies in one allocation (where the backend can tell),
// and that buffers overlapping in memory are allowed to (checkOverlaps).
func (e *Executable) bindLocked(b Bindings) error {
	e.mu.gen++
	for buf, p := range b {
		d, err := e.owner(buf)
		if err != nil {
			return err
		}
		if d.class != Param && d.class != Output {
			return fmt.Errorf("%w: buffer %q is a %s; only params and outputs are bound per step", ErrInvalidBinding, d.name, d.class)
		}
		if p == 0 {
			return fmt.Errorf("%w: buffer %q is bound to the null address", ErrInvalidBinding, d.name)
		}
		if d.class == Output && e.leased {
			continue // ignored: the strategy gives its own memory
		}
		if err := e.checkExtent(d, p); err != nil {
			return err
		}
		e.mu.boundGen[buf.id] = e.mu.gen
		e.mu.addrs[buf.id] = p
	}
	for _, id := range e.classes.Bound {
		if e.mu.boundGen[id] != e.mu.gen {
			d := &e.bufs[id]
			if d.class == Output && e.leased {
				continue // the strategy gives its own memory
			}
			return fmt.Errorf("%w: %s %q is not bound", ErrInvalidBinding, d.class, d.name)
		}
	}
	return e.checkOverlapsLocked()
}

// checkExtent refuses a binding of d at p that runs past the allocation p
// lies in, or that lies in none (gpu.CheckBinding; a backend that cannot
// tell is not checked).
func (e *Executable) checkExtent(d *bufDecl, p gpu.DevicePtr) error {
	err := gpu.CheckBinding(e.b, p, uint64(d.size))
	if err == nil {
		return nil
	}
	var xe *gpu.ExtentError
	if errors.As(err, &xe) {
		return fmt.Errorf("%w: %s %q needs %d bytes at %#x: %w", ErrInvalidBinding, d.class, d.name, d.size, uint64(p), err)
	}
	return fmt.Errorf("%s %q: check the extent of its binding at %#x: %w", d.class, d.name, uint64(p), err)
}

// checkOverlapsLocked refuses buffers that overlap in memory, one of them
// written by the step, when the strategy does not give eager's results for
// them (replay.AliasSafe), and a param or output overlapping a state bound
// to the caller's memory (BindState), whatever the strategy: stable and pool
// never copy states, so they could not keep eager's semantics there. The
// check sorts the buffers by address (replay.Overlaps) in scratch kept
// between steps; it is skipped when nothing can be refused.
func (e *Executable) checkOverlapsLocked() error {
	if e.aliasSafe && e.mu.rebound == 0 {
		return nil
	}
	ids := e.mu.ids[:0]
	for _, id := range e.classes.Bound {
		if e.mu.boundGen[id] == e.mu.gen {
			ids = append(ids, id)
		}
	}
	if e.mu.rebound > 0 {
		for _, id := range e.classes.States {
			if e.mu.owned[id] == 0 {
				ids = append(ids, id)
			}
		}
	}
	e.mu.ids = ids
	ov := &e.mu.ov
	ov.Find(e.rbufs, ids, e.mu.addrs)
	if !ov.Hazard() {
		return nil
	}
	if e.mu.rebound > 0 {
		if a, b, ok := ov.ConflictWith(func(id int) bool { return e.bufs[id].class == State }); ok {
			return fmt.Errorf("%w: %s overlaps %s; a param or output may not share memory with a state bound with BindState (states are never copied by stable and pool, so no strategy takes such bindings)",
				ErrInvalidBinding, e.describe(a), e.describe(b))
		}
	}
	if !e.aliasSafe {
		a, b, _ := ov.Conflict()
		return fmt.Errorf("%w: %s overlaps %s, and one of them is written by the step: strategy %s does not give eager's results for overlapping bindings; bind them to separate memory or use a strategy that does",
			ErrInvalidBinding, e.describe(a), e.describe(b), e.Strategy())
	}
	return nil
}

// describe names buffer id and where it is bound, for errors.
func (e *Executable) describe(id int) string {
	d := &e.bufs[id]
	return fmt.Sprintf("%s %q (%d bytes at %#x)", d.class, d.name, d.size, uint64(e.mu.addrs[id]))
}

// countersLocked is the executable's counters now: the strategy's, the
// tracer's and its own slot waits.
func (e *Executable) countersLocked() Counters {
	c := e.strat.Counters()
	t := e.mu.tr.Stats.Minus(e.mu.probeTrace)
	c.TracesCaptured = t.Captures
	c.TracesSynthesized = t.Synthesized
	c.TracesMoved = t.Moved
	c.TraceCacheHits = t.Hits
	c.TraceCacheMisses = t.Misses
	c.SlotWaits = e.mu.stats.SlotWaits
	return c
}

// Stats returns the executable's counters since Compile and for the last
// step. It never waits: it reads what the last step published.
func (e *Executable) Stats() Stats {
	e.pub.Lock()
	s, stepped := e.pub.stats, e.pub.stepped
	e.pub.Unlock()
	s.Fallbacks.ByReason = maps.Clone(s.Fallbacks.ByReason)
	st := replay.StatusOf(e.strat, e.opts.Strategy, stepped)
	s.Strategy, s.Ran, s.Probing = st.Running, st.Ran, st.Probing
	return s
}

// Traces describes the traced commands (GEMMs included), in program order;
// nil once Close has begun. It waits at most for a step being enqueued.
func (e *Executable) Traces() []TraceInfo {
	e.pub.Lock()
	closed := e.pub.closed
	e.pub.Unlock()
	if closed {
		return nil
	}
	e.trMu.Lock()
	defer e.trMu.Unlock()
	var out []TraceInfo
	for _, c := range e.cb.Traced() {
		ok, why := c.Patchable()
		info := TraceInfo{Command: c.Name, Patchable: ok, Cached: c.CachedTraces()}
		info.Flattened, info.NotFlatReason = c.Flattened()
		if why != nil {
			info.Reason = why.Error()
		}
		out = append(out, info)
	}
	return out
}

// waitLocked waits until the last step has completed on the device; ctx
// and Close end the wait.
func (e *Executable) waitLocked(ctx context.Context) error {
	if ctx == nil {
		return errNilContext
	}
	if e.mu.last == 0 {
		return nil
	}
	return e.waitEvent(ctx, e.mu.done, e.closing.Done())
}

// waitEvent waits until the work before ev's last record has completed,
// polling with backoff so that ctx (and closing, when not nil: the wait
// then fails with ErrClosed) can end the wait.
func (e *Executable) waitEvent(ctx context.Context, ev gpu.Event, closing <-chan struct{}) error {
	backoff := time.Microsecond
	for {
		done, err := e.b.EventQuery(ev)
		if err != nil && !errors.Is(err, gpu.ErrNotReady) {
			return fmt.Errorf("wait for the last step: %w", err)
		}
		if done {
			return nil
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("wait for the last step: %w (%w)", gpu.ErrTimeout, ctx.Err())
			}
			return fmt.Errorf("wait for the last step: %w", ctx.Err())
		case <-closing:
			t.Stop()
			return ErrClosed
		case <-t.C:
		}
		backoff = min(2*backoff, time.Millisecond)
	}
}

// owner checks that buf is a buffer of this executable (of its program,
// declared before Compile) and returns its declaration.
func (e *Executable) owner(buf Buffer) (*bufDecl, error) {
	if buf.p != e.prog || buf.id < 0 || buf.id >= len(e.bufs) {
		return nil, fmt.Errorf("%w: buffer %s is not a buffer of executable %q", ErrInvalidBinding, buf, e.name)
	}
	return &e.bufs[buf.id], nil
}

// liveOwnerLocked is owner for the calls on one buffer of a live
// executable: ErrClosed once it is closed. e.mu is held.
func (e *Executable) liveOwnerLocked(buf Buffer) (*bufDecl, error) {
	if e.mu.closed {
		return nil, ErrClosed
	}
	return e.owner(buf)
}

// ReadBuffer waits for the last step to complete and returns the contents
// of a state or constant buffer.
func (e *Executable) ReadBuffer(ctx context.Context, buf Buffer) ([]byte, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	d, err := e.liveOwnerLocked(buf)
	if err != nil {
		return nil, err
	}
	if d.class != State && d.class != Constant {
		return nil, fmt.Errorf("%w: ReadBuffer of %s %q; read params and outputs with ReadOutput or from their memory", ErrInvalidBinding, d.class, d.name)
	}
	return e.readLocked(ctx, d, e.mu.addrs[buf.id])
}

// ReadOutput waits for the last step to complete and returns the contents
// of output buf as placed in outs. Outputs whose lease was released are
// ErrReleased: their slot may hold another step's results.
func (e *Executable) ReadOutput(ctx context.Context, outs Outputs, buf Buffer) ([]byte, error) {
	return e.AppendOutput(ctx, nil, outs, buf)
}

// AppendOutput is ReadOutput appending the contents to dst, as strconv's
// Append functions do: a loop that reads an output every step (a decode
// loop's logits) reuses one buffer, dst[:0], and makes no garbage. On
// error dst is returned unchanged.
func (e *Executable) AppendOutput(ctx context.Context, dst []byte, outs Outputs, buf Buffer) ([]byte, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	d, err := e.liveOwnerLocked(buf)
	if err != nil {
		return nil, err
	}
	p, ok := outs.lookup(buf)
	if d.class != Output || !ok {
		return dst, fmt.Errorf("%w: %s %q is not among the outputs given", ErrInvalidBinding, d.class, d.name)
	}
	if outs.lease != nil && outs.lease.Released() {
		return dst, fmt.Errorf("stablegraph: read %q: %w", d.name, ErrReleased)
	}
	return e.appendLocked(ctx, dst, d, p)
}

func (e *Executable) readLocked(ctx context.Context, d *bufDecl, p gpu.DevicePtr) ([]byte, error) {
	return e.appendLocked(ctx, nil, d, p)
}

// appendLocked appends the contents of buffer d, at p, to dst once the
// last step is complete; on error dst is returned unchanged.
func (e *Executable) appendLocked(ctx context.Context, dst []byte, d *bufDecl, p gpu.DevicePtr) ([]byte, error) {
	if err := e.waitLocked(ctx); err != nil {
		return dst, fmt.Errorf("stablegraph: read %q: %w", d.name, err)
	}
	out := slices.Grow(dst, int(d.size))[:len(dst)+int(d.size)]
	if err := e.b.MemcpyDtoH(out[len(dst):], p); err != nil {
		return dst, fmt.Errorf("stablegraph: read %q: %w", d.name, err)
	}
	return out, nil
}

// WriteBuffer waits for the last step to complete and overwrites a state
// buffer with data, which must be exactly its size.
func (e *Executable) WriteBuffer(ctx context.Context, buf Buffer, data []byte) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	d, err := e.liveOwnerLocked(buf)
	if err != nil {
		return err
	}
	if d.class != State {
		return fmt.Errorf("%w: WriteBuffer of %s %q; only states are written from the host", ErrInvalidBinding, d.class, d.name)
	}
	if int64(len(data)) != d.size {
		return fmt.Errorf("%w: WriteBuffer of %d bytes into %q of %d", ErrInvalidBinding, len(data), d.name, d.size)
	}
	if err := e.waitLocked(ctx); err != nil {
		return fmt.Errorf("stablegraph: write %q: %w", d.name, err)
	}
	if err := e.b.MemcpyHtoD(e.mu.addrs[buf.id], data); err != nil {
		return fmt.Errorf("stablegraph: write %q: %w", d.name, err)
	}
	return nil
}

// BindState makes state buffer buf live at p, caller-owned memory of at
// least its size, from the next step on; the executable's own allocation
// for it is freed (and no longer counted by Memory). Its contents are
// whatever p holds. Bind states once: every rebinding moves an address,
// which the strategies pay for. p is checked as Run checks bindings (its
// extent, where the backend can tell), and the steps after refuse params
// and outputs bound over it.
func (e *Executable) BindState(ctx context.Context, buf Buffer, p gpu.DevicePtr) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	d, err := e.liveOwnerLocked(buf)
	if err != nil {
		return err
	}
	if d.class != State || p == 0 {
		return fmt.Errorf("%w: BindState of %s %q at %#x", ErrInvalidBinding, d.class, d.name, uint64(p))
	}
	if err := e.checkExtent(d, p); err != nil {
		return fmt.Errorf("stablegraph: bind %q: %w", d.name, err)
	}
	if err := e.waitLocked(ctx); err != nil {
		return fmt.Errorf("stablegraph: bind %q: %w", d.name, err)
	}
	if own := e.mu.owned[buf.id]; own != 0 {
		if err := e.b.MemFree(own); err != nil {
			return fmt.Errorf("stablegraph: bind %q: free own allocation: %w", d.name, err)
		}
		e.mu.owned[buf.id] = 0
		e.mu.rebound++
		e.pub.Lock()
		e.pub.mem.States -= gpu.RoundUp(uint64(d.size), e.opts.Alignment)
		e.pub.Unlock()
	}
	e.mu.addrs[buf.id] = p
	return nil
}

// Close is CloseContext bounded by Options.CloseWait.
func (e *Executable) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.CloseWait)
	defer cancel()
	return e.CloseContext(ctx)
}

// CloseContext closes the executable: at once every Run waiting for a
// pool slot and every read waiting for the last step wake and fail with
// ErrClosed, and every later call of a method fails with ErrClosed (the
// read-only accessors keep reporting: Stats, Memory, Choice, Strategy; Traces
// returns nil). Then it waits, without holding the executable's lock, for
// the last step to complete on the device, until ctx ends, and releases
// every handle the executable holds: graphs, traces, memory (persistent
// copies and pool slots included), modules, its stream and event,
// reporting every release that fails. Leased outputs become invalid;
// Release on them stays a no-op.
//
// When ctx ends before the last step completes (a stuck stream), nothing
// is released, since the device may still use it: the error wraps
// ctx.Err() (and gpu.ErrTimeout at a deadline) and names what was left,
// and a later Close tries again. A step that failed on the device (a
// fault) is no reason to keep anything: Close releases and reports the
// fault. Close is idempotent once it has released everything: closing a
// closed executable returns nil.
//
// ctx bounds the waits and nothing else: with nothing to wait for (the
// last step complete, no other Close in progress) Close releases
// everything even when ctx has already ended. While another Close is in
// progress it waits for that one until ctx ends, and then returns nil if
// that Close released everything, else an error that says it was waiting
// for another Close. A nil ctx is an error (wrapping gpu.ErrInvalidValue).
func (e *Executable) CloseContext(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("stablegraph: close %q: %w", e.name, errNilContext)
	}
	e.beginClose()
	if e.releasedPub() {
		return nil
	}
	// ctx bounds the waits, and only those: a Close with nothing to wait
	// for closes even when ctx has ended. So the semaphore is taken at once
	// when it is free (a select of it against a done ctx would pick either
	// at random), and ctx is consulted only while another Close holds it.
	select {
	case e.closeSem <- struct{}{}:
	default:
		select {
		case e.closeSem <- struct{}{}:
		case <-ctx.Done():
			if e.releasedPub() {
				return nil // the other Close released everything
			}
			return fmt.Errorf("stablegraph: close %q: waiting for another Close to finish (it waits for the last step to complete on the device, then releases), nothing released by this one: %w", e.name, ctx.Err())
		}
	}
	defer func() { <-e.closeSem }()
	e.mu.Lock()
	if e.mu.released {
		e.mu.Unlock()
		return nil
	}
	e.mu.closed = true
	e.pub.Lock()
	e.pub.closed = true
	e.pub.Unlock()
	last, ev := e.mu.last, e.mu.done
	e.mu.Unlock()
	// No step can start now (closed), so ev is the last step's for good.
	var werr error
	if last != 0 {
		werr = e.waitEvent(ctx, ev, nil)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if werr != nil && ctx.Err() != nil {
		return fmt.Errorf("stablegraph: close %q: the last step has not completed on the device, so nothing was released (the device may still use it); left for a later Close: %s: %w",
			e.name, e.heldLocked(), werr)
	}
	errs := []error{werr}
	e.trMu.Lock()
	errs = append(errs, e.releaseLocked())
	e.trMu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stablegraph: close %q: %w", e.name, err)
	}
	return nil
}

// heldLocked says what the executable holds, for a Close that could not
// release it.
func (e *Executable) heldLocked() string {
	e.pub.Lock()
	mem := e.pub.mem
	e.pub.Unlock()
	sm := replay.MemoryOf(e.strat)
	owned := 0
	for _, p := range e.mu.owned {
		if p != 0 {
			owned++
		}
	}
	return fmt.Sprintf("the %s strategy's graphs and memory (%d bytes of persistent copies, %d bytes in %d pool slots), the traces and %d bytes of library workspace, %d bytes of temps, %d states and constants (%d bytes), %d modules, the capture stream and the step event",
		e.Strategy(), sm.Persistent, sm.Slots, sm.SlotCount, mem.Workspace, mem.Temps, owned, mem.States+mem.Constants, len(e.mu.modules))
}

// releaseLocked releases everything the executable holds, in the reverse
// order of creation, whatever fails; it serves Close and Compile's error
// paths (where fields not yet created are zero).
func (e *Executable) releaseLocked() error {
	e.mu.closed = true
	e.mu.released = true
	if e.beginClose != nil {
		e.beginClose()
	}
	e.pub.Lock()
	e.pub.closed = true
	e.pub.released = true
	e.pub.Unlock()
	var errs []error
	add := func(what string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		}
	}
	if e.strat != nil {
		add("strategy", e.strat.Close())
	}
	if e.mu.tr != nil {
		add("traces", e.mu.tr.Close())
		e.mu.tr = nil
	}
	if e.mu.done != 0 {
		add("destroy step event", e.b.EventDestroy(e.mu.done))
		e.mu.done = 0
	}
	if e.mu.capture != 0 {
		add("destroy capture stream", e.b.StreamDestroy(e.mu.capture))
		e.mu.capture = 0
	}
	if e.mu.arena != 0 {
		add("free temps", e.b.MemFree(e.mu.arena))
		e.mu.arena = 0
	}
	for i, p := range e.mu.owned {
		if p != 0 {
			add(fmt.Sprintf("free %q", e.bufs[i].name), e.b.MemFree(p))
			e.mu.owned[i] = 0
		}
	}
	for _, m := range e.mu.modules {
		add("unload module", e.b.ModuleUnload(m))
	}
	e.mu.modules = nil
	return errors.Join(errs...)
}
