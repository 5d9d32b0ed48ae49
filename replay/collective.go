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
// (the workload's GPU timing) is never deadlocked by it. A rank whose
// agreement fails returns the error; its peers then wait in the
// agreement's collective until their communicator fails or times out, as
// for any collective a rank leaves.
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
	// is called once, before the next MaxOver.
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
		res, err = run()
		if g.pending, err = a.startAgreement(s, v, err); err == nil {
			g.phase = planPending
		}
		return res, err, true
	case g.phase == agreeProbing && !a.nextPlanned():
		var errs []error
		if err := a.b.EventSynchronize(a.mark); err != nil {
			errs = append(errs, fmt.Errorf("auto: wait for the end of probing: %w", err))
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
		res, err = run()
		if g.pending, err = a.startAgreement(s, v, err); err == nil {
			g.phase = decisionPending
		}
		return res, err, true
	}
	return Result{}, nil, false
}

// startAgreement enqueues v's agreement after a step that returned
// stepErr (the agreement is enqueued whatever the step did, so that the
// ranks' collectives stay in step).
func (a *autoProbe) startAgreement(s gpu.Stream, v []float64, stepErr error) (func() ([]float64, error), error) {
	done, err := a.coll.agree.MaxOver(s, v)
	if err != nil {
		return nil, errors.Join(stepErr, fmt.Errorf("auto: agree with the other ranks: %w", err))
	}
	return done, stepErr
}

// collectiveAcquire reads an agreement in flight, at the step after the
// one that enqueued it, and acts on it. It returns the errors met, for the
// next run to report.
func (a *autoProbe) collectiveAcquire() error {
	g := a.coll
	if g.phase != planPending && g.phase != decisionPending {
		return nil
	}
	vals, err := g.pending()
	g.pending = nil
	if err == nil && len(vals) != 2*len(g.names) {
		err = fmt.Errorf("%d values agreed, %d sent", len(vals), 2*len(g.names))
	}
	if err != nil {
		err = fmt.Errorf("auto: agree with the other ranks: %w", err)
		g.phase = agreed
		a.keep(a.model, fmt.Sprintf("the ranks' agreement failed (%v); the model's choice: %s%s",
			err, othersAfter(a.candidatesNow(a.model)), a.fellBack), a.model)
		a.markAgreed()
		return err
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
