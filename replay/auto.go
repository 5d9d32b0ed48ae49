package replay

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/stablegraph/stablegraph/gpu"
)

// Choice says which strategy an executable runs and why. The root
// package's Choice is this type.
type Choice struct {
	// Requested is the strategy Options asked for.
	Requested Name
	// Strategy is the one that runs; it differs from Requested only for
	// auto.
	Strategy Name
	// Reason says why, in words: "requested", or auto's comparison (the
	// measured and modelled costs) and any fallback.
	Reason string
	// Candidates are what auto weighed, the one chosen first, then the
	// others from cheapest (measured, then modelled) to not usable; nil
	// for a strategy asked for by name.
	Candidates []Candidate
	// Probing is true while auto is still measuring its candidates
	// (see Options.AutoProbeSteps): steps run each candidate in turn, and
	// Strategy is the model's choice, which runs once the probes are
	// enqueued until their times can be read. It turns false when auto
	// decides.
	Probing bool
	// Agreed is true once the ranks of the step's communicators chose
	// together (a step with collectives; collective.go): every rank ranked
	// the same numbers, each candidate's slowest rank's times, so every
	// rank runs the same strategy.
	Agreed bool
}

// Candidate is one strategy auto weighed. The root package's Candidate is
// this type.
type Candidate struct {
	Strategy Name
	// StepUS is the modelled cost the strategy adds to a step in which
	// every param and output moves, in microseconds (Costs).
	StepUS float64
	// Usable is false when the device cannot run the strategy, or it
	// failed to build; Note then says why.
	Usable bool
	// Note gives the terms of StepUS, or why the strategy is not usable,
	// and, once probed, what the probe saw (a failed step, say).
	Note string
	// Probed is the number of steps auto measured the strategy over, 0
	// when it was not measured (probing disabled or skipped, not yet
	// decided, or no step measured).
	Probed int
	// GPUUS and HostUS are the medians over the probed steps of the GPU
	// time (events around the strategy's work on the step's stream) and
	// the host time (the clock around the strategy enqueueing the step),
	// in microseconds.
	GPUUS, HostUS float64
}

func (c Candidate) String() string {
	if !c.Usable {
		return fmt.Sprintf("%s: not usable: %s", c.Strategy, c.Note)
	}
	if c.Probed > 0 {
		return fmt.Sprintf("%s: measured %.1f us GPU, %.1f us host per step (median of %d); modelled %.1f us (%s)",
			c.Strategy, c.GPUUS, c.HostUS, c.Probed, c.StepUS, c.Note)
	}
	return fmt.Sprintf("%s: %.1f us/step (%s)", c.Strategy, c.StepUS, c.Note)
}

// auto chooses among the strategies that price themselves (the registry
// entries with a model: patch, device, stable, pool) for the program and device,
// from measured costs. The cost model (Options.Costs) rules out what the
// device cannot run and orders the rest; newAuto builds them through the
// registry, cheapest first (falling back past one that runs out of memory
// or lacks a capability), and the first steps run each in turn, timing
// them (probe.go). Auto keeps the fastest and releases the others; all
// compute the same bits over the same states, so the switches are
// invisible. On a step with collectives the ranks agree on the candidates
// and on the choice (collective.go). Without probing
// (Options.AutoProbeSteps < 0, zero-copy outputs, collectives without an
// Agreement) the model decides, and only its choice is built.
// Its Choice says what it chose and why, with the measured and modelled
// figures.

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
	case spec.Options.AutoProbeSteps < 0:
		return "probing disabled (Options.AutoProbeSteps < 0)"
	case spec.Options.ZeroCopyOutputs:
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
