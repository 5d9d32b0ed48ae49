package replay

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/stablegraph/stablegraph/gpu"
)

// AutoOptions configure auto (Options.Auto).
type AutoOptions struct {
	// ProbeSteps is how many steps auto measures each of its candidates
	// over before it keeps one. New builds every candidate the device can
	// run (the model excludes what it cannot, and pool slots larger than
	// Costs.PoolMemoryFraction of free memory); the first steps run each
	// in turn, the model's cheapest first, for its warm-up steps that
	// record its graphs (patch 2, device 2, stable 1, pool one per slot);
	// then rounds visit every candidate in turn, each round starting one
	// candidate further on, a visit being one step that brings the
	// candidate back to the caller's addresses and up to two measured
	// steps, until each has ProbeSteps measured steps (probe.go has the
	// plan). A measured step is timed as stablegraph bench times one: its
	// stream waits behind a gate while the candidate enqueues it (host
	// time, by the clock), so that events around its work time the
	// device's work alone (GPU time). Once the device has passed the last
	// probe step (polled, never waited for; the model's choice runs
	// meanwhile), auto keeps the candidate with the lowest median step time
	// under Bound, then under the other bound, then host time (times within
	// 1% or 0.5 µs are equal; the model breaks ties), and closes the
	// others, releasing their memory. The probe steps count in no counter
	// but ProbeSteps; the graphs the kept candidate recorded while probing
	// count in Records. Default 6 (with the four candidates of a device
	// that can run them all, 43 probe steps), at most MaxAutoProbeSteps;
	// negative: no probing, the model alone decides at New. Probing is
	// also skipped with zero-copy outputs (Choice.Reason says so). For a
	// step holding collectives the ranks decide together: the first step
	// agrees on the candidates every rank built, and the step after the
	// probes on each candidate's slowest-rank times, read one step later,
	// so that every rank keeps the same strategy (Choice.Agreed;
	// collective.go). Every rank must compile the program with the same
	// options.
	ProbeSteps int
	// Bound is what bounds a step, by which auto ranks the candidates it
	// measured: BoundLatency (host + GPU time, each step awaited before
	// the next, as a decode loop runs them) or BoundThroughput (the larger
	// of the two, steps run back to back, as a training loop runs them).
	// GPU time alone never ranks: a candidate whose host time exceeds its
	// GPU time is bound by its host time (bound.go). Default
	// BoundLatency; Choice.Reason says which applied.
	Bound Bound
}

// MaxAutoProbeSteps bounds AutoOptions.ProbeSteps.
const MaxAutoProbeSteps = 1000

// defaultAutoProbeSteps is AutoOptions.ProbeSteps' default.
const defaultAutoProbeSteps = 6

func (o AutoOptions) withDefaults() (AutoOptions, error) {
	switch {
	case o.ProbeSteps == 0:
		o.ProbeSteps = defaultAutoProbeSteps
	case o.ProbeSteps > MaxAutoProbeSteps:
		return o, fmt.Errorf("%d auto probe steps (at most %d)", o.ProbeSteps, MaxAutoProbeSteps)
	}
	var err error
	o.Bound, err = ParseBound(string(o.Bound))
	return o, err
}

// auto chooses among the strategies that price themselves (the registry
// entries with a model: patch, device, stable, pool) for the program and device,
// from measured costs. The cost model (Spec.Costs) rules out what the
// device cannot run and orders the rest; newAuto builds them through the
// registry, cheapest first (falling back past one that runs out of memory
// or lacks a capability), and the first steps run each in turn, timing
// them (probe.go). Auto keeps the fastest and releases the others; all
// compute the same bits over the same states, so the switches are
// invisible. On a step with collectives the ranks agree on the candidates
// and on the choice (collective.go). Without probing
// (AutoOptions.ProbeSteps < 0, zero-copy outputs, collectives without an
// Agreement) the model decides, and only its choice is built.
// Its Choice says what it chose and why, with the measured and modelled
// figures. Its options are AutoOptions (Options.Auto).
//
// # How it ranks
//
// A step awaited before the next is bound by its latency, about its host
// time then its GPU time; steps back to back by the larger of the two.
// Auto ranks the candidates it measured by the bound AutoOptions.Bound
// names (Bound, bound.go: latency by default), then by the other, then by
// host time, never by GPU time alone: a candidate whose host time exceeds
// its GPU time is bound by its host time (a patch moving a long chain's
// every node has slightly less GPU time than stable and several times its
// host time, and loses). testdata/probe_picks.txt holds the cases. On a
// step with collectives the ranks decide together, each candidate ranked
// by the slowest rank's times (collective.go), so that every rank runs the
// same strategy.
//
// # What it counts
//
// ProbeSteps, the steps it ran to measure a candidate, and nothing else of
// those steps: its Counters are those of the strategy that runs (the one
// kept, from the step it was kept, and the model's choice while the
// decision was pending), and so are its Fallbacks, so that the counting
// rule holds for auto as for the others.

// candidates models every strategy of the registry that has a model,
// cheapest first (ties keep the registry's order: the ones holding less
// memory first). Nothing is allocated.
func candidates(spec Spec) []Candidate {
	var cands []Candidate
	for _, e := range registry {
		if e.model != nil {
			cands = append(cands, e.model(spec))
		}
	}
	slices.SortStableFunc(cands, func(a, b Candidate) int {
		switch {
		case a.Usable != b.Usable:
			if a.Usable {
				return -1
			}
			return 1
		case a.StepUS < b.StepUS:
			return -1
		case a.StepUS > b.StepUS:
			return 1
		}
		return 0
	})
	return cands
}

// newAuto models the candidates (candidates) and builds the usable ones
// through the registry, cheapest first; when building one fails because
// the device lacks memory or a capability it records why and moves on.
// Other failures are returned, after releasing what was built. Unless
// probing is skipped (probeSkipped) and when two or more candidates were
// built, the autoProbe it returns measures them over the first steps
// (probe.go); otherwise it runs the cheapest modelled candidate that could
// be built, and only that one is built.
func newAuto(spec Spec) (Strategy, error) {
	ch := Choice{Requested: Auto, Candidates: candidates(spec)}
	skip := probeSkipped(spec)
	var (
		built     []*probe
		fallbacks []string
		errs      []error
	)
	closeBuilt := func() error {
		var cerrs []error
		for _, pr := range built {
			cerrs = append(cerrs, pr.st.Close())
		}
		return errors.Join(cerrs...)
	}
	for i := range ch.Candidates {
		c := &ch.Candidates[i]
		if !c.Usable {
			continue
		}
		e, _ := lookup(c.Strategy)
		st, err := e.build(spec)
		if err != nil {
			if !errors.Is(err, gpu.ErrOutOfMemory) && !errors.Is(err, gpu.ErrNotSupported) {
				return nil, errors.Join(fmt.Errorf("auto: %s: %w", c.Strategy, err), closeBuilt())
			}
			errs = append(errs, err)
			c.Usable, c.Note = false, "failed to build: "+err.Error()
			fallbacks = append(fallbacks, fmt.Sprintf("%s failed to build (%v)", c.Strategy, err))
			spec.Logger.Debug("auto: candidate failed; falling back", "candidate", c.Strategy, "err", err)
			continue
		}
		built = append(built, &probe{strategy: c.Strategy, st: st, cand: i})
		if skip != "" {
			break
		}
	}
	if len(built) == 0 {
		return nil, fmt.Errorf("auto: no candidate could be built: %w", errors.Join(errs...))
	}
	fellBack := ""
	if len(fallbacks) > 0 {
		fellBack = "; fell back because " + strings.Join(fallbacks, ", ")
	}
	if skip == "" && len(built) == 1 && !agreesOn(spec) {
		// (With collectives the ranks still agree: another rank may have
		// built more, and runs the agreement's collectives.)
		skip = "no other candidate could be built"
	}
	if skip != "" {
		return decided(spec, ch, built[0], fellBack, skip), nil
	}
	a, err := newAutoProbe(spec, ch, built, fellBack)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("auto: %w", err), closeBuilt())
	}
	return a, nil
}

// probeSkipped says why auto decides by the model alone, "" when it
// measures.
func probeSkipped(spec Spec) string {
	switch {
	case spec.Options.Auto.ProbeSteps < 0:
		return "probing disabled (Options.Auto.ProbeSteps < 0)"
	case spec.Options.Pool.ZeroCopyOutputs:
		// Only pool leases its outputs: the candidates would not agree on
		// whether the caller must bind them.
		return "zero-copy outputs (only pool leases its outputs)"
	case spec.Collectives && spec.Agree == nil:
		// A rank's step waits for its peers: its probe would measure
		// them, and the ranks, each deciding alone, could choose apart.
		// With an Agreement they decide together (collective.go).
		return "the program holds collectives, whose step time is set by the peers, and no agreement over the ranks"
	}
	return ""
}

// modelOrder returns cands with cands[first] moved to the front, the rest
// in their order.
func modelOrder(cands []Candidate, first int) []Candidate {
	out := make([]Candidate, 0, len(cands))
	out = append(out, cands[first])
	out = append(out, cands[:first]...)
	return append(out, cands[first+1:]...)
}

// othersAfter says cands[0], then the others: "A; then B; C".
func othersAfter(cands []Candidate) string {
	var others []string
	for _, o := range cands[1:] {
		others = append(others, o.String())
	}
	if len(others) == 0 {
		return cands[0].String()
	}
	return fmt.Sprintf("%s; then %s", cands[0], strings.Join(others, "; "))
}
