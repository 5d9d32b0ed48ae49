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
// New builds every usable candidate (newAuto). The first steps
// then run each in turn, in the model's order: a few warm-up steps that
// record its graphs (probeWarmup), then AutoOptions.ProbeSteps measured
// steps, each timed on the host by the clock around the candidate's run and
// on the device by two events around its work on the step's stream. Every
// candidate computes the same bits and shares the executable's states,
// temps and constants (stable and pool copy only params and outputs), so
// switching between steps changes nothing the caller can see.
//
// After the last probe step a marker event is recorded. Until the device
// passes it, steps run the model's choice; nothing waits. The first step
// that finds it passed (polled without blocking in acquire) reads the
// events and keeps the fastest candidate (pickProbed), which runs from that
// step on. The others may still have work in flight (the model's choice ran
// after the marker), so that step first records a fence event on its
// stream: the executable orders its steps, so once the device passes the
// fence every earlier step is done, and the first step that finds it
// passed closes the others, releasing their memory, and destroys the
// events.
//
// Errors: a probe step that fails returns its error like any step, ends
// that candidate's probe and counts no sample. A failed event record fails
// the step (before the candidate runs, for the start event). Errors of the
// decision itself (reading the events, closing a loser) are returned by the
// next Run before it enqueues anything, so a retry is safe.

// Ties: two measured times closer than probeTieFraction of the smaller, or
// than probeTieUS, are equal (the next criterion decides: host time, then
// the model's order).
const (
	probeTieFraction = 0.01
	probeTieUS       = 0.5
)

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
	cur    int      // the probe running; len(probes) once every probe step ran
	ran    int      // steps probes[cur] has run
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
	// and final's work since base, its counters when it was kept, is
	// added to it. probeSteps counts the steps run to measure a
	// candidate, whose work is in no counter.
	acc        Counters
	base       Counters
	probeSteps int64
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

// newAutoProbe creates the events of the probes of built (two or more
// candidates, in the model's order). On error it has released the events;
// the caller closes the candidates.
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
	steps := spec.Options.Auto.ProbeSteps
	for _, pr := range built {
		pr.warm = WarmUpOf(pr.st)
		pr.samples = make([]probeSample, steps)
		for i := range pr.samples {
			for _, ev := range []*gpu.Event{&pr.samples[i].start, &pr.samples[i].end} {
				if *ev, err = a.b.EventCreate(spec.Ordinal, gpu.EventDefault); err != nil {
					return nil, fmt.Errorf("probe events: %w", err)
				}
			}
		}
	}
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
	a.info.live = slices.Clone(built)
	together := ""
	if a.coll != nil {
		together = " with the other ranks (the step holds collectives: the candidates and then the choice are agreed over the ranks)"
	}
	a.info.choice.Reason = fmt.Sprintf("probing %s (warm-up+measured) before choosing%s; until then the cheapest modelled step: %s%s",
		strings.Join(plan, ", "), together, othersAfter(a.info.choice.Candidates), fellBack)
	a.log.Debug("auto: probing", "candidates", plan)
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
// choice).
func (a *autoProbe) Counters() Counters {
	c := a.acc
	if a.final != nil {
		c.add(a.final.st.Counters().Sub(a.base))
	}
	c.ProbeSteps = a.probeSteps
	return c
}

// current is the candidate the next run runs.
func (a *autoProbe) current() *probe {
	switch {
	case a.final != nil:
		return a.final
	case a.cur < len(a.probes):
		return a.probes[a.cur]
	}
	return a.model
}

// Acquire decides, once the probes' times can be read, and closes the
// candidates not kept once they are idle; then it defers to the candidate
// the next run runs when that one has a resource to wait for (a pool slot).
func (a *autoProbe) Acquire() func(context.Context) error {
	switch {
	case a.deferred != nil:
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
	if a.final != nil {
		if len(a.losers) > 0 && !a.fenced {
			if err := a.b.EventRecord(a.fence, s); err != nil {
				return Result{}, fmt.Errorf("auto: record the fence before closing the candidates not kept: %w", err)
			}
			a.fenced = true
		}
		a.setLastRan(a.final.strategy)
		return a.final.st.Run(ctx, s, addrs)
	}
	if a.coll != nil {
		if res, err, ok := a.collectiveRun(s, func() (Result, error) { return a.runModel(ctx, s, addrs) }); ok {
			return res, err
		}
	}
	if a.cur >= len(a.probes) {
		res, err := a.runModel(ctx, s, addrs)
		if !a.marked {
			err = errors.Join(err, a.recordMark(s))
		}
		return res, err
	}
	pr := a.probes[a.cur]
	var smp *probeSample
	if k := a.ran - pr.warm; k >= 0 {
		smp = &pr.samples[k]
	}
	a.ran++
	if smp != nil {
		if rerr := a.b.EventRecord(smp.start, s); rerr != nil {
			// Nothing of the step is enqueued; the step still counts, so
			// that probing ends whatever fails.
			err := fmt.Errorf("auto: probe %s: record the start event: %w", pr.strategy, rerr)
			if a.ran >= pr.warm+len(pr.samples) {
				err = errors.Join(err, a.nextProbe(s))
			}
			return Result{}, err
		}
	}
	a.setLastRan(pr.strategy)
	a.probeSteps++
	t0 := time.Now()
	res, err := pr.st.Run(ctx, s, addrs)
	host := time.Since(t0)
	if err != nil {
		// Its probe ends here; it is kept only if earlier steps measured it.
		pr.failed = err
		a.log.Debug("auto: probe step failed; next candidate", "candidate", pr.strategy, "err", err)
	}
	if smp != nil {
		if rerr := a.b.EventRecord(smp.end, s); rerr != nil {
			err = errors.Join(err, fmt.Errorf("auto: probe %s: record the end event: %w", pr.strategy, rerr))
		} else if err == nil {
			smp.ok, smp.host = true, host
		}
	}
	if pr.failed != nil || a.ran >= pr.warm+len(pr.samples) {
		err = errors.Join(err, a.nextProbe(s))
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

// nextProbe ends the current probe and moves to the next (past those
// skipped); after the last, it records the marker on s.
func (a *autoProbe) nextProbe(s gpu.Stream) error {
	a.cur++
	for a.cur < len(a.probes) && a.probes[a.cur].skip {
		a.cur++
	}
	a.ran = 0
	if a.cur < len(a.probes) {
		return nil
	}
	return a.recordMark(s)
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

// keep makes pr the candidate that runs from now on, the others to be
// closed once idle, and publishes the choice (first: the candidate listed
// first; nil keeps the model's order).
func (a *autoProbe) keep(pr *probe, reason string, first *probe) {
	a.final, a.base, a.baseFalls = pr, pr.st.Counters(), FallbacksOf(pr.st)
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

// destroyEvents destroys the probe events, reporting every failure; an
// event whose destruction failed is forgotten.
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
