package replay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
)

// Probing: how auto measures its candidates on the caller's own steps
// before it keeps one.
//
// New builds every usable candidate (newAuto). The first steps then follow
// a plan (probePlan): each candidate in the model's order runs its warm-up
// steps (WarmUpOf: recording its graphs, proving its templates), then
// rounds visit every candidate in turn, each round starting one candidate
// further on, so that noise on the host (a slow phase of the machine, the
// collector) falls on every candidate alike rather than on whichever ran
// then. A visit is one step that brings the candidate back to the caller's
// addresses (the buffers moved while the others ran; not measured), then up
// to probeBlock measured steps, which see the caller's own step-to-step
// movement; the rounds go on until each candidate has AutoOptions.ProbeSteps
// measured steps. Every candidate computes the same bits and shares the
// executable's states, temps and constants (stable and pool copy only params
// and outputs), so switching between steps changes nothing the caller can
// see.
//
// A measured step is timed as stablegraph bench times one (package
// workload, stepTimer): the step's stream waits behind a gate, a word of
// mapped host memory (gpu.StreamWaits), while the candidate enqueues the
// step, timed by the clock (host time); the host then opens the gate, so
// that the events around the step's work time the device's work alone (GPU
// time), whatever the host took to enqueue it and whether the stream was
// idle. Latency is then host + GPU time, and back-to-back steps take the
// larger of the two (Bound). A step whose Run waits on its own stream (a
// device re-record freeing the memory of its earlier graph) would wait for
// ever behind the gate: a watchdog opens it after probeGateWatchdog and the
// step's sample is dropped. Without stream waits (a backend that lacks
// them) the events go around the call itself: on an idle stream the GPU
// time then includes the host's.
//
// After the last planned step a marker event is recorded. Until the device
// passes it, steps run the model's choice; nothing waits. The first step
// that finds it passed (polled without blocking in acquire) reads the
// events and keeps the fastest candidate (pickProbed), which runs from that
// step on. The others may still have work in flight (the model's choice ran
// after the marker), so that step first records a fence event on its
// stream: the executable orders its steps, so once the device passes the
// fence every earlier step is done, and the first step that finds it
// passed closes the others, releasing their memory, and destroys the
// events and the gate.
//
// Errors: a probe step that fails returns its error like any step, ends
// that candidate's probe (its later planned steps are skipped) and counts no
// sample. A failed event record or gate wait fails the step (before the
// candidate runs, for those before it). Errors of the decision itself
// (reading the events, closing a loser) are returned by the next Run before
// it enqueues anything, so a retry is safe. When the ranks decide together
// the plan must take the same steps on every rank: a failed step does not
// move it on, and a failed candidate's planned steps run the model's
// choice instead of being skipped (collective.go).

// Ties: two measured times closer than probeTieFraction of the smaller, or
// than probeTieUS, are equal (the next criterion decides: host time, then
// the model's order).
const (
	probeTieFraction = 0.01
	probeTieUS       = 0.5
)

// probeBlock is how many measured steps a candidate runs per visit, after
// the step that brings it back to the caller's addresses: few, so that the
// rounds interleave the candidates finely, and more than one, so that the
// unmeasured step is not half of the probe.
const probeBlock = 2

// probeGateWatchdog bounds how long a measured step holds its stream behind
// the gate: far longer than a step's host work once warm, so that it fires
// only for a Run that waits on its own stream, which then stalls this long
// once instead of for ever.
const probeGateWatchdog = 200 * time.Millisecond

// probeQueryRetries is how many times in a row reading the marker event may
// fail before auto stops probing and keeps the model's choice.
const probeQueryRetries = 3

// probe is one built candidate and its measurements.
type probe struct {
	strategy Name
	st       Strategy
	cand     int // its index in the model's Candidates

	warm    int
	samples []probeSample
	failed  error   // the error of its failed probe step, if any
	gpuUS   float64 // medians, set at the decision
	hostUS  float64
	n       int // samples measured
	closed  bool
	// skip: not probed, since another rank could not build it (a
	// collective decision; collective.go).
	skip bool
}

// probeSample is one measured step.
type probeSample struct {
	start, end gpu.Event
	host       time.Duration
	ok         bool // the step succeeded and both events were recorded
}

// planStep is one step of the probe plan: the candidate it runs and the
// sample it measures (-1: not measured).
type planStep struct {
	probe, sample int
}

// probePlan is the schedule of n candidates with the given warm-up steps
// (warm[i]) and steps measured steps each: the warm-ups in order, then the
// rounds (see the top of the file).
func probePlan(warm []int, steps int) []planStep {
	var plan []planStep
	for i, w := range warm {
		for range w {
			plan = append(plan, planStep{i, -1})
		}
	}
	n := len(warm)
	for r, done := 0, 0; done < steps; r, done = r+1, done+probeBlock {
		m := min(probeBlock, steps-done)
		for j := range n {
			i := (r + j) % n
			plan = append(plan, planStep{i, -1})
			for k := range m {
				plan = append(plan, planStep{i, done + k})
			}
		}
	}
	return plan
}

// probeGate holds a measured step's stream until the host has enqueued the
// step (see the top of the file): a word of mapped host memory the stream
// waits on, raised to the step's ticket when the call returns, or by the
// watchdog.
type probeGate struct {
	waits gpu.StreamWaits
	mem   gpu.StreamMemOps
	word  gpu.HostMem
	// ticket is the last value a stream was told to wait for; only Run
	// writes it, under the executable's lock.
	ticket uint64
	// mu guards the word's value, which the watchdog raises too, and
	// fired, the last ticket the watchdog opened the gate for.
	mu     sync.Mutex
	opened uint64
	fired  uint64
}

// newProbeGate makes the gate on dev, or returns nil, nil when the device
// cannot hold a stream behind one.
func newProbeGate(b gpu.Backend, dev int) (*probeGate, error) {
	waits, err := gpu.StreamWaitsOf(b, dev)
	if err != nil {
		return nil, ignoreNotSupported(err)
	}
	mem, err := gpu.StreamMemOpsOf(b, dev)
	if err != nil {
		return nil, ignoreNotSupported(err)
	}
	word, err := mem.HostAlloc(8)
	if err != nil {
		return nil, ignoreNotSupported(err)
	}
	return &probeGate{waits: waits, mem: mem, word: word}, nil
}

func ignoreNotSupported(err error) error {
	if errors.Is(err, gpu.ErrNotSupported) {
		return nil
	}
	return fmt.Errorf("probe gate: %w", err)
}

// hold makes s wait behind the gate for the next ticket, which it returns.
func (g *probeGate) hold(s gpu.Stream) (uint64, error) {
	k := g.ticket + 1
	if err := g.waits.StreamWaitValue64(s, g.word.Ptr, k); err != nil {
		return 0, fmt.Errorf("hold the stream behind the probe gate: %w", err)
	}
	g.ticket = k
	return k, nil
}

// open raises the gate to ticket k, if it is not there already, for the
// host (dog false) or the watchdog. The gate only rises, so a watchdog that
// fires late cannot hold a later step back.
func (g *probeGate) open(k uint64, dog bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if int64(k-g.opened) <= 0 {
		return
	}
	g.opened = k
	g.word.Store64(0, k)
	if dog {
		g.fired = k
	}
}

// released reports whether the watchdog opened the gate for ticket k.
func (g *probeGate) released(k uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.fired == k
}

// free frees the gate's word: every ticket handed out is opened, and the
// caller knows the streams have passed their waits (the fence, or Close).
func (g *probeGate) free() error {
	g.open(g.ticket, false)
	if err := g.mem.HostFree(g.word.Handle); err != nil {
		return fmt.Errorf("auto: free the probe gate: %w", err)
	}
	return nil
}

// autoProbe is auto while it measures, and after: it then runs the
// candidate it kept (from the start when it did not probe). It is used,
// like every strategy, under the executable's lock; its Choice and
// memory, read without that lock, have their own (lock order: the
// executable's, then info).
type autoProbe struct {
	b      gpu.Backend
	dev    int
	log    *slog.Logger
	probes []*probe // built, in the model's order
	model  *probe   // the model's choice: runs while the probes' times are pending
	// plan is the probe steps (probePlan); at is the next one, len(plan)
	// once every probe step ran.
	plan []planStep
	at   int
	gate *probeGate // nil: the events go around the call (no stream waits)
	// mark is recorded after the last probe step; marked once it was.
	mark   gpu.Event
	marked bool
	misses int    // reads of mark that failed in a row
	final  *probe // the candidate kept; nil while undecided
	// fence is recorded by the first run of final, before its work; once
	// the device passes it the others are idle and closed (losers says
	// which are still open).
	fence    gpu.Event
	fenced   bool
	losers   []*probe
	deferred error  // the decision's errors, returned by the next run
	fellBack string // "; fell back because ..." of Compile, or ""
	// aliasSafe: every candidate handles overlapping bindings.
	aliasSafe bool
	// bound is what ranks the measured candidates (AutoOptions.Bound).
	bound Bound

	// coll is the collective decision's state (collective.go); nil when
	// the rank decides alone.
	coll *agreeing

	// What the steps did, without the probe steps (Counters): acc holds
	// the steps the model's choice ran while the decision was pending,
	// and final's work since base, its counters when it was kept less the
	// graphs it recorded while probing (still held, so counted), is added
	// to it. probeSteps counts the steps run to measure a candidate, whose
	// work is in no counter.
	acc        Counters
	base       Counters
	probeSteps int64
	// held are the graphs final recorded while probing and holds
	// (heldGraphs), counted from its first step as the one kept, so that
	// they show in that step's Stats.Last; finalRan says it ran.
	held     Counters
	finalRan bool
	// less is what Counters subtracts from final's counters once it is
	// kept: base less acc, and less held once final ran.
	less Counters
	// The same for the refusals (Fallbacks): accFalls holds the model's
	// choice's while the decision was pending (modelFalls: its refusals
	// already taken), baseFalls final's when it was kept.
	accFalls, modelFalls, baseFalls Fallbacks

	info struct {
		sync.Mutex
		choice Choice
		// live are the candidates whose memory counts: every one built
		// while probing, the one kept once the others are closed.
		live    []*probe
		lastRan Name // the candidate that ran the last step
	}
}

// setLastRan records the candidate that runs this step; Status reads it
// without the executable's lock. Only Run writes it, under the
// executable's lock, so Run may read it without info's.
func (a *autoProbe) setLastRan(n Name) {
	if a.info.lastRan == n {
		return
	}
	a.info.Lock()
	a.info.lastRan = n
	a.info.Unlock()
}

// newAutoProbe creates the plan, the gate and the events of the probes of
// built (two or more candidates, in the model's order). On error it has
// released what it made; the caller closes the candidates.
func newAutoProbe(spec Spec, ch Choice, built []*probe, fellBack string) (_ *autoProbe, err error) {
	a := &autoProbe{b: spec.Backend, dev: spec.Ordinal, log: spec.Logger, probes: built, model: built[0], fellBack: fellBack, aliasSafe: allAliasSafe(built),
		bound: spec.Options.Auto.Bound}
	if agreesOn(spec) {
		a.coll = newAgreeing(spec.Agree)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, a.destroyEvents())
		}
	}()
	if a.gate, err = newProbeGate(a.b, spec.Ordinal); err != nil {
		return nil, err
	}
	steps := spec.Options.Auto.ProbeSteps
	warm := make([]int, len(built))
	for i, pr := range built {
		pr.warm = WarmUpOf(pr.st)
		warm[i] = pr.warm
		pr.samples = make([]probeSample, steps)
		for i := range pr.samples {
			for _, ev := range []*gpu.Event{&pr.samples[i].start, &pr.samples[i].end} {
				if *ev, err = a.b.EventCreate(spec.Ordinal, gpu.EventDefault); err != nil {
					return nil, fmt.Errorf("probe events: %w", err)
				}
			}
		}
	}
	a.plan = probePlan(warm, steps)
	if a.mark, err = a.b.EventCreate(spec.Ordinal, gpu.EventDisableTiming); err != nil {
		return nil, fmt.Errorf("probe marker event: %w", err)
	}
	if a.fence, err = a.b.EventCreate(spec.Ordinal, gpu.EventDisableTiming); err != nil {
		return nil, fmt.Errorf("probe fence event: %w", err)
	}
	a.info.choice = ch
	a.info.choice.Strategy = a.model.strategy
	a.info.choice.Probing = true
	a.info.choice.Candidates = modelOrder(ch.Candidates, a.model.cand)
	var plan []string
	for _, pr := range built {
		plan = append(plan, fmt.Sprintf("%s (%d+%d steps)", pr.strategy, pr.warm, steps))
	}
	timing := "GPU time behind a gate, apart from the host's"
	if a.gate == nil {
		timing = "GPU time by events around the call (no stream waits on this device)"
	}
	a.info.live = slices.Clone(built)
	together := ""
	if a.coll != nil {
		together = " with the other ranks (the step holds collectives: the candidates and then the choice are agreed over the ranks)"
	}
	a.info.choice.Reason = fmt.Sprintf("probing %s (warm-up+measured, the measured steps in interleaved rounds, %d steps in all; %s) before choosing%s; until then the cheapest modelled step: %s%s",
		strings.Join(plan, ", "), len(a.plan), timing, together, othersAfter(a.info.choice.Candidates), fellBack)
	a.log.Debug("auto: probing", "candidates", plan, "steps", len(a.plan))
	return a, nil
}

// decided is auto when it does not probe: it runs pr, the model's choice,
// from the first step.
func decided(spec Spec, ch Choice, pr *probe, fellBack, skip string) *autoProbe {
	a := &autoProbe{b: spec.Backend, log: spec.Logger, probes: []*probe{pr}, model: pr, final: pr, fellBack: fellBack,
		aliasSafe: allAliasSafe([]*probe{pr}), bound: spec.Options.Auto.Bound}
	ch.Strategy = pr.strategy
	ch.Candidates = modelOrder(ch.Candidates, pr.cand)
	ch.Reason = fmt.Sprintf("cheapest modelled step: %s", othersAfter(ch.Candidates)) + fellBack + "; not probed: " + skip
	a.info.choice = ch
	a.info.live = []*probe{pr}
	a.log.Debug("auto chose a strategy", "strategy", pr.strategy, "reason", ch.Reason)
	return a
}

// Choice returns the current Choice (a copy).
func (a *autoProbe) Choice() Choice {
	a.info.Lock()
	defer a.info.Unlock()
	c := a.info.choice
	c.Candidates = slices.Clone(c.Candidates)
	return c
}

// Status says what runs, what ran last and whether auto still probes.
func (a *autoProbe) Status() Status {
	a.info.Lock()
	defer a.info.Unlock()
	return Status{Running: a.info.choice.Strategy, Ran: a.info.lastRan, Probing: a.info.choice.Probing}
}

// Memory is what auto holds now: every candidate while probing, the one
// kept after (asked of each, since stable's grows at its first aliased
// step).
func (a *autoProbe) Memory() Memory {
	a.info.Lock()
	defer a.info.Unlock()
	var m Memory
	for _, pr := range a.info.live {
		m = m.plus(MemoryOf(pr.st))
	}
	return m
}

// AliasSafe: every candidate handles overlapping bindings (all of this
// package's do), whichever runs a step.
func (a *autoProbe) AliasSafe() bool { return a.aliasSafe }

func allAliasSafe(ps []*probe) bool {
	for _, pr := range ps {
		if !HandlesAliasing(pr.st) {
			return false
		}
	}
	return true
}

// Fallbacks are the refused updates of the steps auto ran, but for its
// probe steps, as Counters counts them: they sum to UpdateFallbacks.
func (a *autoProbe) Fallbacks() Fallbacks {
	f := a.accFalls.clone()
	if a.final != nil {
		f.merge(FallbacksOf(a.final.st).since(a.baseFalls))
	}
	return f
}

// LeasesOutputs is the model's choice's: auto probes only when no
// candidate leases (probing is skipped with zero-copy outputs), and
// otherwise runs the model's choice alone.
func (a *autoProbe) LeasesOutputs() bool { return LeasesOutputs(a.model.st) }

// Counters are what the steps auto ran did, but for its probe steps, whose
// work counts in no counter but ProbeSteps: a candidate measured and not
// kept leaves no trace in them, and the one kept counts from the step it
// was kept (and while the decision was pending, if it was the model's
// choice), with the graphs it recorded while probing and still holds
// (heldGraphs) counted at its first step as the one kept, so that Records
// is never 0 for a strategy that runs graphs.
func (a *autoProbe) Counters() Counters {
	c := a.acc
	if a.final != nil {
		// One subtraction per call: Executable.Run counts twice a step.
		c = a.final.st.Counters().Sub(a.less)
	} else if a.model != nil {
		// While the decision is pending the model's choice runs the steps
		// that count, on the graphs it recorded in its probe steps: they
		// count as its own, as they will once it is kept, less those its
		// counted steps recorded.
		held := heldGraphs(a.model.st.Counters())
		c.add(Counters{Records: max(held.Records-(c.Records-c.Rerecords), 0)})
	}
	c.ProbeSteps = a.probeSteps
	return c
}

// current is the candidate the next run runs.
func (a *autoProbe) current() *probe {
	switch {
	case a.final != nil:
		return a.final
	case a.nextPlanned():
		if pr := a.probes[a.plan[a.at].probe]; pr.failed == nil {
			return pr
		}
		// (Ranks deciding together: the model's choice runs in the failed
		// candidate's place.)
	}
	return a.model
}

// nextPlanned skips the planned steps of candidates that the ranks agreed
// to skip, and, on one rank, of those whose probe failed (ranks deciding
// together run the model's choice in their place: collective.go), and
// reports whether a probe step is left.
func (a *autoProbe) nextPlanned() bool {
	for a.at < len(a.plan) {
		pr := a.probes[a.plan[a.at].probe]
		if !pr.skip && (pr.failed == nil || a.coll != nil) {
			break
		}
		a.at++
	}
	return a.at < len(a.plan)
}

// Acquire decides, once the probes' times can be read, and closes the
// candidates not kept once they are idle; then it defers to the candidate
// the next run runs when that one has a resource to wait for (a pool slot).
func (a *autoProbe) Acquire() func(context.Context) error {
	switch {
	case a.deferred != nil:
	case a.coll != nil && a.coll.failed != nil:
		return nil // Run fails at once
	case a.coll != nil && a.final == nil:
		a.deferred = a.collectiveAcquire()
	case a.final == nil && a.marked:
		a.deferred = a.tryDecide()
	case a.fenced && len(a.losers) > 0:
		a.deferred = a.tryCloseLosers()
	}
	return Acquire(a.current().st)
}

func (a *autoProbe) Run(ctx context.Context, s gpu.Stream, addrs []gpu.DevicePtr) (Result, error) {
	if err := a.deferred; err != nil {
		// Nothing of this step is enqueued: a retry runs it.
		a.deferred = nil
		return Result{}, err
	}
	if a.coll != nil && a.coll.failed != nil {
		return Result{}, a.afterAgreeingEnded()
	}
	if a.final != nil {
		if len(a.losers) > 0 && !a.fenced {
			if err := a.b.EventRecord(a.fence, s); err != nil {
				return Result{}, fmt.Errorf("auto: record the fence before closing the candidates not kept: %w", err)
			}
			a.fenced = true
		}
		a.setLastRan(a.final.strategy)
		if !a.finalRan {
			a.finalRan = true
			a.less = a.less.Sub(a.held)
		}
		return a.final.st.Run(ctx, s, addrs)
	}
	if a.coll != nil {
		if res, err, ok := a.collectiveRun(s, func() (Result, error) { return a.runModel(ctx, s, addrs) }); ok {
			return res, err
		}
	}
	if !a.nextPlanned() {
		res, err := a.runModel(ctx, s, addrs)
		if !a.marked {
			err = errors.Join(err, a.recordMark(s))
		}
		return res, err
	}
	ps := a.plan[a.at]
	pr := a.probes[ps.probe]
	if pr.failed != nil {
		// Ranks deciding together: the model's choice runs in the failed
		// candidate's place, and the plan moves on only if it ran.
		res, err := a.runModel(ctx, s, addrs)
		if err == nil {
			a.at++
			if !a.nextPlanned() {
				err = a.recordMark(s)
			}
		}
		return res, err
	}
	if a.coll == nil {
		a.at++
	}
	var smp *probeSample
	if ps.sample >= 0 {
		smp = &pr.samples[ps.sample]
	}
	a.setLastRan(pr.strategy)
	a.probeSteps++
	res, err, ran := a.runProbe(ctx, s, addrs, pr, smp)
	if a.coll != nil && ran {
		a.at++ // its collectives are enqueued: the peers' plan moves on too
	}
	if pr.failed != nil {
		a.log.Debug("auto: probe step failed; its probe ends", "candidate", pr.strategy, "err", pr.failed)
	}
	if !a.nextPlanned() {
		err = errors.Join(err, a.recordMark(s))
	}
	return res, err
}

// runModel runs the model's choice while the decision is pending; its
// work counts.
func (a *autoProbe) runModel(ctx context.Context, s gpu.Stream, addrs []gpu.DevicePtr) (Result, error) {
	a.setLastRan(a.model.strategy)
	before := a.model.st.Counters()
	if a.modelFalls.ByReason == nil && before.UpdateFallbacks > 0 {
		a.modelFalls = FallbacksOf(a.model.st) // taken in its probe steps
	}
	res, err := a.model.st.Run(ctx, s, addrs)
	d := a.model.st.Counters().Sub(before)
	a.acc.add(d)
	if d.UpdateFallbacks > 0 {
		f := FallbacksOf(a.model.st)
		a.accFalls.merge(f.since(a.modelFalls))
		a.modelFalls = f
	}
	return res, err
}

// runProbe runs one step of pr on s, timing it into smp when smp is not
// nil (see the top of the file); a failure of the step itself marks pr
// failed. ran says pr's Run returned without error (the step's work, its
// collectives included, is enqueued), whatever failed around it.
func (a *autoProbe) runProbe(ctx context.Context, s gpu.Stream, addrs []gpu.DevicePtr, pr *probe, smp *probeSample) (_ Result, _ error, ran bool) {
	if smp == nil {
		res, err := pr.st.Run(ctx, s, addrs)
		if err != nil {
			pr.failed = err
		}
		return res, err, err == nil
	}
	var ticket uint64
	if a.gate != nil {
		k, err := a.gate.hold(s)
		if err != nil {
			// Nothing of the step is enqueued.
			return Result{}, fmt.Errorf("auto: probe %s: %w", pr.strategy, err), false
		}
		ticket = k
	}
	if err := a.b.EventRecord(smp.start, s); err != nil {
		if a.gate != nil {
			a.gate.open(ticket, false)
		}
		// Nothing of the step is enqueued but the gate's wait.
		return Result{}, fmt.Errorf("auto: probe %s: record the start event: %w", pr.strategy, err), false
	}
	var dog *time.Timer
	if a.gate != nil {
		dog = time.AfterFunc(probeGateWatchdog, func() { a.gate.open(ticket, true) })
	}
	t0 := time.Now()
	res, err := pr.st.Run(ctx, s, addrs)
	host := time.Since(t0)
	released := false
	if a.gate != nil {
		dog.Stop() // if it fired, released says so
		a.gate.open(ticket, false)
		released = a.gate.released(ticket)
	}
	ran = err == nil
	if err != nil {
		// Its probe ends here; it is kept only if earlier steps measured it.
		pr.failed = err
	}
	if rerr := a.b.EventRecord(smp.end, s); rerr != nil {
		err = errors.Join(err, fmt.Errorf("auto: probe %s: record the end event: %w", pr.strategy, rerr))
	} else if err == nil && !released {
		smp.ok, smp.host = true, host
	}
	return res, err, ran
}

// recordMark records the marker after the last probe step (or, when that
// failed, after a later step).
func (a *autoProbe) recordMark(s gpu.Stream) error {
	if err := a.b.EventRecord(a.mark, s); err != nil {
		return fmt.Errorf("auto: record the end of probing: %w", err)
	}
	a.marked = true
	return nil
}

// tryDecide decides when the marker has passed, without waiting. It
// returns the errors met on the way, for the next run to report.
func (a *autoProbe) tryDecide() error {
	done, err := a.b.EventQuery(a.mark)
	if errors.Is(err, gpu.ErrNotReady) {
		done, err = false, nil
	}
	if err != nil {
		a.misses++
		err = fmt.Errorf("auto: read the end of probing: %w", err)
		if a.misses < probeQueryRetries {
			return err
		}
		// The probes' times cannot be read: keep the model's choice.
		a.keep(a.model, fmt.Sprintf("probing abandoned (%v); the model's choice: %s%s", err, othersAfter(a.candidatesNow(nil)), a.fellBack), nil)
		return err
	}
	a.misses = 0
	if !done {
		return nil
	}
	errs := a.readProbes()
	ms := make([]probeResult, len(a.probes))
	for i, pr := range a.probes {
		ms[i] = probeResult{gpuUS: pr.gpuUS, hostUS: pr.hostUS, n: pr.n}
	}
	best := pickProbed(ms, a.bound)
	if best < 0 {
		a.keep(a.model, fmt.Sprintf("no probe step was measured; the model's choice: %s%s",
			othersAfter(a.candidatesNow(a.model)), a.fellBack), a.model)
	} else {
		kept := a.probes[best]
		a.keep(kept, fmt.Sprintf("fastest measured step by %s: %s%s",
			a.bound.says(), othersAfter(a.candidatesNow(kept)), a.fellBack), kept)
	}
	return errors.Join(errs...)
}

// readProbes reads every probe's events (the device has passed them) into
// its medians, and returns the errors met.
func (a *autoProbe) readProbes() []error {
	var errs []error
	for _, pr := range a.probes {
		var gpuUS, hostUS []float64
		for i := range pr.samples {
			smp := &pr.samples[i]
			if !smp.ok {
				continue
			}
			d, err := a.b.EventElapsed(smp.start, smp.end)
			if err != nil {
				errs = append(errs, fmt.Errorf("auto: probe %s: elapsed time: %w", pr.strategy, err))
				continue
			}
			gpuUS = append(gpuUS, float64(d.Nanoseconds())/1e3)
			hostUS = append(hostUS, float64(smp.host.Nanoseconds())/1e3)
		}
		pr.n, pr.gpuUS, pr.hostUS = len(gpuUS), median(gpuUS), median(hostUS)
		if probeTimesHook != nil && pr.n > 0 {
			pr.gpuUS, pr.hostUS = probeTimesHook(a.dev, pr.strategy, pr.gpuUS, pr.hostUS)
		}
	}
	return errs
}

// probeTimesHook, set by tests only (export_test.go), replaces the
// medians a probe measured on device dev: ranks that measure differently.
var probeTimesHook func(dev int, strategy Name, gpuUS, hostUS float64) (float64, float64)

// heldGraphs are the graphs a candidate with counters c recorded while
// probing and holds when it is kept: its first recordings (those that were
// no re-record) and as many of its uploads. Counted as the strategy's own,
// they make Records say how many graphs the running strategy recorded; the
// re-records and every other piece of the probe steps' work stay out.
func heldGraphs(c Counters) Counters {
	held := c.Records - c.Rerecords
	return Counters{Records: held, GraphUploads: min(c.GraphUploads, held)}
}

// keep makes pr the candidate that runs from now on, the others to be
// closed once idle, and publishes the choice (first: the candidate listed
// first; nil keeps the model's order).
func (a *autoProbe) keep(pr *probe, reason string, first *probe) {
	a.final, a.base, a.baseFalls = pr, pr.st.Counters(), FallbacksOf(pr.st)
	a.held = heldGraphs(a.base)
	a.less = a.base.Sub(a.acc)
	for _, o := range a.probes {
		if o != pr {
			a.losers = append(a.losers, o)
		}
	}
	a.publish(reason, first)
	a.log.Debug("auto chose a strategy", "strategy", pr.strategy, "reason", reason)
}

// tryCloseLosers closes the candidates not kept, and destroys the probe
// events, once the device has passed the fence, without waiting.
func (a *autoProbe) tryCloseLosers() error {
	done, err := a.b.EventQuery(a.fence)
	if errors.Is(err, gpu.ErrNotReady) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("auto: read the fence before closing the candidates not kept: %w", err)
	}
	if !done {
		return nil
	}
	var errs []error
	for _, pr := range a.losers {
		if err := pr.st.Close(); err != nil {
			errs = append(errs, fmt.Errorf("auto: close %s: %w", pr.strategy, err))
		}
		pr.closed = true
	}
	a.losers = nil
	errs = append(errs, a.destroyEvents())
	a.info.Lock()
	a.info.live = []*probe{a.final}
	a.info.Unlock()
	return errors.Join(errs...)
}

// candidatesNow returns the candidates with what was measured, first the
// one kept (nil: the model's order), then the measured ones fastest first,
// the modelled ones cheapest first, and those not usable.
func (a *autoProbe) candidatesNow(kept *probe) []Candidate {
	a.info.Lock()
	base := slices.Clone(a.info.choice.Candidates)
	a.info.Unlock()
	byStrategy := map[Name]*probe{}
	for _, pr := range a.probes {
		byStrategy[pr.strategy] = pr
	}
	for i := range base {
		c := &base[i]
		pr := byStrategy[c.Strategy]
		if pr == nil {
			continue
		}
		c.Probed, c.GPUUS, c.HostUS = pr.n, pr.gpuUS, pr.hostUS
		if pr.failed != nil {
			c.Note += "; a probe step failed: " + pr.failed.Error()
		}
		if pr.n == 0 {
			c.Note += "; not measured"
		}
	}
	rank := func(c Candidate) int {
		switch {
		case kept != nil && c.Strategy == kept.strategy:
			return 0
		case c.Usable && c.Probed > 0:
			return 1
		case c.Usable:
			return 2
		}
		return 3
	}
	slices.SortStableFunc(base, func(x, y Candidate) int {
		if rx, ry := rank(x), rank(y); rx != ry {
			return rx - ry
		}
		if rank(x) == 1 {
			px, py := probeResult{x.GPUUS, x.HostUS, x.Probed}, probeResult{y.GPUUS, y.HostUS, y.Probed}
			switch {
			case px.faster(py, a.bound):
				return -1
			case py.faster(px, a.bound):
				return 1
			}
		}
		return 0 // the model's order
	})
	return base
}

// publish records the decision (first: the candidate listed first; nil
// keeps the model's order).
func (a *autoProbe) publish(reason string, first *probe) {
	cands := a.candidatesNow(first)
	a.info.Lock()
	defer a.info.Unlock()
	a.info.choice.Candidates = cands
	a.info.choice.Strategy = a.final.strategy
	a.info.choice.Probing = false
	a.info.choice.Reason = reason
}

// destroyEvents destroys the probe events and frees the gate, reporting
// every failure; what could not be released is forgotten. The streams have
// passed every probe step (the fence, or Close).
func (a *autoProbe) destroyEvents() error {
	var errs []error
	destroy := func(ev *gpu.Event) {
		if *ev != 0 {
			if err := a.b.EventDestroy(*ev); err != nil {
				errs = append(errs, fmt.Errorf("auto: destroy a probe event: %w", err))
			}
			*ev = 0
		}
	}
	for _, pr := range a.probes {
		for i := range pr.samples {
			destroy(&pr.samples[i].start)
			destroy(&pr.samples[i].end)
		}
	}
	destroy(&a.mark)
	destroy(&a.fence)
	if a.gate != nil {
		errs = append(errs, a.gate.free())
		a.gate = nil
	}
	return errors.Join(errs...)
}

// Close releases every candidate still open and the events. The executable
// has waited for its last step.
func (a *autoProbe) Close() error {
	var errs []error
	for _, pr := range a.probes {
		if !pr.closed {
			if err := pr.st.Close(); err != nil {
				errs = append(errs, fmt.Errorf("auto: close %s: %w", pr.strategy, err))
			}
			pr.closed = true
		}
	}
	errs = append(errs, a.destroyEvents())
	if a.coll != nil {
		errs = append(errs, a.coll.agree.Close())
	}
	return errors.Join(errs...)
}

// probeResult is what the probes measured of one candidate: medians over n
// steps (n = 0: not measured).
type probeResult struct {
	gpuUS, hostUS float64
	n             int
}

// faster reports whether r is faster than o by more than a tie under bound:
// by the bound's cost, then by the other bound's, then by host time.
func (r probeResult) faster(o probeResult, bound Bound) bool {
	for _, b := range []Bound{bound, bound.other()} {
		if x, y := b.cost(r.gpuUS, r.hostUS), b.cost(o.gpuUS, o.hostUS); !near(x, y) {
			return x < y
		}
	}
	if !near(r.hostUS, o.hostUS) {
		return r.hostUS < o.hostUS
	}
	return false
}

func near(x, y float64) bool {
	return math.Abs(x-y) <= max(probeTieFraction*min(x, y), probeTieUS)
}

// pickProbed returns the index of the fastest measured candidate of ms
// under bound (given in the model's order, which breaks ties), -1 when
// none was measured.
func pickProbed(ms []probeResult, bound Bound) int {
	best := -1
	for i, m := range ms {
		if m.n == 0 {
			continue
		}
		if best < 0 || m.faster(ms[best], bound) {
			best = i
		}
	}
	return best
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	if n := len(v); n%2 == 0 {
		return (v[n/2-1] + v[n/2]) / 2
	}
	return v[len(v)/2]
}
