package replay

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/stablegraph/stablegraph/gpu"
)

// Collective decisions: auto on a step that holds collectives.
//
// Launching a graph with NCCL work in it is a collective act: the ranks'
// steps meet in every collective, so a rank's step time is the slowest
// rank's, and a rank that keeps another strategy than its peers sets all
// of them back. Every rank must choose the same strategy. Measured alone,
// each rank's probes see their own device and their own wait for the
// others, and the ranks could each keep another candidate. So when the
// step holds collectives and the executable gives an Agreement (Spec.Agree:
// an elementwise maximum over the ranks of the step's communicators), auto
// decides with the other ranks:
//
//  1. Step 0 runs the model's choice and enqueues, behind it, the plan's
//     agreement: for each strategy the registry models, in the registry's
//     order, whether this rank built it (0) or not (1), and its warm-up
//     steps. At the next step's Acquire the maxima come back: a candidate
//     that some rank could not build is probed by none, and every rank
//     warms each candidate up for the most steps any rank needs. From
//     then on every rank runs the same probe steps, so their collectives
//     stay in the same order, and the agreements are met at the same
//     step on every rank.
//  2. The probes run as on one rank (probe.go).
//  3. The first step after them reads the probes' events (the device has
//     passed them: they precede the step), runs the model's choice and
//     enqueues the times' agreement: each candidate's median GPU and host
//     times, +Inf for one not measured. At the next step's Acquire every
//     rank gets the maxima, the slowest rank's times, and ranks them with
//     pickProbed in the registry's order: every rank ranks the same
//     numbers in the same order, so the choice is the same on every rank
//     by construction. Choice.Agreed says so.
//
// The agreements run eagerly on the step's stream (Agreement.MaxOver) and
// are read one step later, so that no step waits on its own stream: a
// caller that holds the stream behind a gate while it enqueues a step
// (the workload's GPU timing) is never deadlocked by it.
//
// # Failures
//
// The ranks' collectives pair by their order alone, and an agreement is
// not the step's all-reduce: each rank must enqueue each agreement behind
// as many steps' collectives as its peers do, whatever failed on it. So
// the decision moves on only with the steps that succeed:
//
//   - A step that fails (the model's choice, or a probe step's candidate)
//     is taken as one that enqueued none of its collectives, the usual
//     case (a collective that fails to enqueue, or anything failing before
//     it): no agreement is enqueued behind it, and the phase and the
//     plan's position stay where they were, so that the next step, a retry
//     or the caller's next one, runs the planned step, and the agreement
//     behind it, that the peers ran where this one failed, and pairs with
//     theirs as under any other strategy. (A step that fails after
//     enqueuing some of its collectives puts the rank out of step with its
//     peers under every strategy.) The step's error is returned as it is.
//   - A candidate whose probe step failed is not dropped from the plan on
//     this rank alone, as on one rank: its planned steps, the failed one's
//     included, run the model's choice instead, unmeasured, so that the
//     plan takes as many steps as on the peers. What it measured before
//     counts in the times' agreement.
//   - An agreement that fails to enqueue fails its step with its error,
//     and ends the decision: the step's collectives went through, and the
//     peers wait in the agreement, which no later step of this rank can
//     meet. Every later Run fails with that error and enqueues nothing, so
//     that the peers fail in the agreement's collective (their
//     communicator times out or aborts) instead of pairing it with a
//     step's. Close the executable and the communicators.
//   - An agreement that cannot be read (Agreement.MaxOver's done fails) is
//     read again at the next step, and until it is, every Run fails with
//     that error, enqueuing nothing: a rank that went on without it would
//     run another plan than its peers. A device fault or an aborted
//     communicator fails every read: the rank then fails every step, with
//     the reason.
//
// What the ranks must share for this to hold: the same program and the
// same options (AutoOptions.ProbeSteps, the cost model), so that the model orders
// the candidates the same way on every rank. With probing off
// (AutoOptions.ProbeSteps < 0) or zero-copy outputs, auto decides by the model
// alone, as on one rank.

// Agreement combines numbers over the ranks of a step's communicators:
// the executable's, for a step that holds collectives (Spec.Agree).
type Agreement interface {
	// MaxOver enqueues on s the elementwise maximum of v over the ranks
	// and returns a function that waits for it and returns the maxima.
	// Every rank calls MaxOver at the same point of its sequence of
	// collectives, with a v of the same length (at most MaxAgreed).
	// done waits only for work enqueued on s up to MaxOver's return; it
	// is called before the next MaxOver, and again after it returned an
	// error, until it returns the maxima.
	MaxOver(s gpu.Stream, v []float64) (done func() ([]float64, error), err error)
	// Close releases what MaxOver allocated. The stream has passed every
	// agreement.
	Close() error
}

// MaxAgreed bounds the length of the vectors auto agrees on.
const MaxAgreed = 64

// agreePhase is where a collective decision stands.
type agreePhase uint8

const (
	agreePlan       agreePhase = iota // the next step enqueues the plan's agreement
	planPending                       // the plan's agreement is in flight
	agreeProbing                      // the agreed candidates are probed
	decisionPending                   // the times' agreement is in flight
	agreed                            // decided
)

// agreeing is auto's state of a collective decision.
type agreeing struct {
	agree   Agreement
	phase   agreePhase
	pending func() ([]float64, error)
	// failed is why the decision ended: an agreement failed to enqueue, or
	// came back malformed. Every later Run returns it.
	failed error
	// names are the strategies the registry models, in its order: the
	// order of the agreed vectors and of the decision's ties.
	names []Name
}

func newAgreeing(a Agreement) *agreeing {
	g := &agreeing{agree: a}
	for _, e := range registry {
		if e.model != nil {
			g.names = append(g.names, e.name)
		}
	}
	return g
}

// agreesOn reports whether auto on spec decides with the other ranks.
func agreesOn(spec Spec) bool { return spec.Collectives && spec.Agree != nil }

// index is the position of n in the agreed vectors, -1 when the registry
// does not model it.
func (g *agreeing) index(n Name) int {
	for i, m := range g.names {
		if m == n {
			return i
		}
	}
	return -1
}

// collectiveRun runs the steps of a collective decision that are not
// probe steps: the step that enqueues the plan's agreement, and the one
// after the probes that enqueues the times'. Both run the model's choice.
// handled is false for the steps probe.go runs.
func (a *autoProbe) collectiveRun(s gpu.Stream, run func() (Result, error)) (res Result, err error, handled bool) {
	g := a.coll
	switch {
	case g.phase == agreePlan:
		K := len(g.names)
		v := make([]float64, 2*K)
		for i := range K {
			v[i] = 1 // not built here
		}
		for _, pr := range a.probes {
			if i := g.index(pr.strategy); i >= 0 {
				v[i], v[K+i] = 0, float64(pr.warm)
			}
		}
		if res, err = run(); err != nil {
			return res, err, true // no agreement behind a failed step (see the top of the file)
		}
		return res, a.startAgreement(s, v, planPending), true
	case g.phase == agreeProbing && !a.nextPlanned():
		var errs []error
		if !a.marked {
			// Its record failed after the last probe step: the executable
			// orders this step after that one, so a mark recorded now
			// follows every probe.
			errs = append(errs, a.recordMark(s))
		}
		if a.marked {
			if err := a.b.EventSynchronize(a.mark); err != nil {
				errs = append(errs, fmt.Errorf("auto: wait for the end of probing: %w", err))
			}
		}
		errs = append(errs, a.readProbes()...)
		K := len(g.names)
		v := make([]float64, 2*K)
		for i := range v {
			v[i] = math.Inf(1)
		}
		for _, pr := range a.probes {
			if i := g.index(pr.strategy); i >= 0 && pr.n > 0 && !pr.skip {
				v[i], v[K+i] = pr.gpuUS, pr.hostUS
			}
		}
		// The probes' events are the times' only source: one that cannot be
		// read leaves its candidate unmeasured here (+Inf), not the step
		// failed (a failed step would put this rank out of step with the
		// others' agreement).
		if err := errors.Join(errs...); err != nil {
			a.log.Warn("auto: reading the probes", "err", err)
		}
		if res, err = run(); err != nil {
			return res, err, true
		}
		return res, a.startAgreement(s, v, decisionPending), true
	}
	return Result{}, nil, false
}

// startAgreement enqueues v's agreement behind a step that succeeded and
// moves the decision to next; when it cannot, the decision ends (see the
// top of the file) and the error is returned.
func (a *autoProbe) startAgreement(s gpu.Stream, v []float64, next agreePhase) error {
	done, err := a.coll.agree.MaxOver(s, v)
	if err != nil {
		return a.endAgreeing(err)
	}
	a.coll.pending, a.coll.phase = done, next
	return nil
}

// endAgreeing ends the decision for err: every later Run returns it.
func (a *autoProbe) endAgreeing(err error) error {
	g := a.coll
	g.failed = fmt.Errorf("auto: agree with the other ranks: %w", err)
	a.info.Lock()
	a.info.choice.Reason = fmt.Sprintf("the ranks' agreement failed (%v): this rank's collectives would no longer pair with its peers', so every later step fails; close the executable and its communicators", err)
	a.info.Unlock()
	a.log.Warn("auto: the ranks' agreement failed; no later step runs", "err", err)
	return g.failed
}

// afterAgreeingEnded is a Run's error once the decision ended.
func (a *autoProbe) afterAgreeingEnded() error {
	return fmt.Errorf("auto: no step runs after the ranks' agreement failed (this rank's collectives would pair wrongly with its peers'): %w", a.coll.failed)
}

// collectiveAcquire reads an agreement in flight, at the step after the
// one that enqueued it, and acts on it. It returns the errors met, for the
// next run to report.
func (a *autoProbe) collectiveAcquire() error {
	g := a.coll
	if g.failed != nil || (g.phase != planPending && g.phase != decisionPending) {
		return nil
	}
	vals, err := g.pending()
	if err != nil {
		// Read again at the next step (see the top of the file).
		return fmt.Errorf("auto: read the agreement with the other ranks (read again at the next step): %w", err)
	}
	g.pending = nil
	if len(vals) != 2*len(g.names) {
		return a.endAgreeing(fmt.Errorf("%d values agreed, %d sent", len(vals), 2*len(g.names)))
	}
	K := len(g.names)
	if g.phase == planPending {
		var common []*probe
		for _, pr := range a.probes {
			i := g.index(pr.strategy)
			if i < 0 || vals[i] > 0 {
				pr.skip = true
				continue
			}
			pr.warm = int(vals[K+i])
			common = append(common, pr)
		}
		switch len(common) {
		case 0:
			g.phase = agreed
			a.keep(a.model, "no candidate was built on every rank; the model's choice, not agreed: "+
				othersAfter(a.candidatesNow(a.model))+a.fellBack, a.model)
		case 1:
			g.phase = agreed
			a.keep(common[0], fmt.Sprintf("the only candidate built on every rank (agreed over the ranks): %s%s",
				othersAfter(a.candidatesNow(common[0])), a.fellBack), common[0])
			a.markAgreed()
		default:
			g.phase = agreeProbing
			// The plan again, with the agreed warm-ups: the same on every
			// rank, the skipped candidates' steps passed over.
			warm := make([]int, len(a.probes))
			for i, pr := range a.probes {
				warm[i] = pr.warm
			}
			a.plan, a.at = probePlan(warm, len(a.probes[0].samples)), 0
		}
		return nil
	}
	g.phase = agreed
	ms := make([]probeResult, K)
	for _, pr := range a.probes {
		if i := g.index(pr.strategy); i >= 0 && !math.IsInf(vals[i], 1) && !math.IsInf(vals[K+i], 1) {
			pr.gpuUS, pr.hostUS = vals[i], vals[K+i]
			ms[i] = probeResult{gpuUS: pr.gpuUS, hostUS: pr.hostUS, n: max(pr.n, 1)}
		} else {
			pr.n = 0
		}
	}
	best := pickProbed(ms, a.bound)
	var kept *probe
	for _, pr := range a.probes {
		if best >= 0 && pr.strategy == g.names[best] {
			kept = pr
		}
	}
	if kept == nil {
		a.keep(a.model, fmt.Sprintf("no rank measured every probe; the model's choice: %s%s",
			othersAfter(a.candidatesNow(a.model)), a.fellBack), a.model)
	} else {
		a.keep(kept, fmt.Sprintf("fastest measured step by %s, each candidate's time the slowest rank's (agreed over the ranks: the step holds collectives): %s%s",
			a.bound.says(), othersAfter(a.candidatesNow(kept)), a.fellBack), kept)
	}
	a.markAgreed()
	return nil
}

// markAgreed records in the choice that the ranks chose together.
func (a *autoProbe) markAgreed() {
	a.info.Lock()
	a.info.choice.Agreed = true
	a.info.choice.Candidates = agreedNotes(a.info.choice.Candidates)
	a.info.Unlock()
}

// agreedNotes marks the measured candidates' times as the ranks' maxima.
func agreedNotes(cs []Candidate) []Candidate {
	for i := range cs {
		if cs[i].Probed > 0 && !strings.Contains(cs[i].Note, "slowest rank") {
			cs[i].Note += "; times are the slowest rank's"
		}
	}
	return cs
}
