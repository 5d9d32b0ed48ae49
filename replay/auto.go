package stablegraph

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/stablegraph/stablegraph/gpu"
)

// Costs are the per-operation costs, in microseconds of step time, that
// StrategyAuto weighs. The defaults (DefaultCosts) are the H100 figures of
// GPU-MACHINE.md; zero fields of Options.Costs take them.
type Costs struct {
	// NodeUpdateUS is the cost of updating one kernel, memcpy or memset
	// node of an executable graph in place
	// (cuGraphExecKernelNodeSetParams: 0.33).
	NodeUpdateUS float64
	// TracedUpdateUS is the cost of moving one traced node (a GEMM or
	// other library call): building its child graph from the template and
	// setting it on the exec graph. Not measured; estimated at 5 from a
	// capture-sized graph build plus a node update.
	TracedUpdateUS float64
	// CopyLatencyUS and CopyBytesPerUS model one device-to-device copy as
	// CopyLatencyUS + bytes/CopyBytesPerUS of GPU time: the line through
	// the two H100 measurements, 1 MiB in 6.8 and 64 MiB in 51.5 (small
	// copies are latency-bound). Defaults 6.09 and 1.478e6.
	CopyLatencyUS, CopyBytesPerUS float64
	// TimelineWriteUS is the cost of the timeline write that releases a
	// pool slot (cuStreamWriteValue64 enqueue: 1.0).
	TimelineWriteUS float64
	// PoolMemoryFraction is the largest fraction of the device's free
	// memory that the pool's slots may take for auto to consider pool.
	// Default 0.25.
	PoolMemoryFraction float64
}

// DefaultCosts returns the H100 costs (see Costs).
func DefaultCosts() Costs {
	return Costs{
		NodeUpdateUS:       0.33,
		TracedUpdateUS:     5,
		CopyLatencyUS:      6.09,
		CopyBytesPerUS:     1.478e6,
		TimelineWriteUS:    1.0,
		PoolMemoryFraction: 0.25,
	}
}

func (c Costs) withDefaults() (Costs, error) {
	d := DefaultCosts()
	for _, f := range []struct {
		v   *float64
		def float64
		max float64
	}{
		{&c.NodeUpdateUS, d.NodeUpdateUS, math.Inf(1)},
		{&c.TracedUpdateUS, d.TracedUpdateUS, math.Inf(1)},
		{&c.CopyLatencyUS, d.CopyLatencyUS, math.Inf(1)},
		{&c.CopyBytesPerUS, d.CopyBytesPerUS, math.Inf(1)},
		{&c.TimelineWriteUS, d.TimelineWriteUS, math.Inf(1)},
		{&c.PoolMemoryFraction, d.PoolMemoryFraction, 1},
	} {
		switch {
		case *f.v == 0:
			*f.v = f.def
		case *f.v < 0 || *f.v > f.max || math.IsNaN(*f.v):
			return c, fmt.Errorf("stablegraph: cost %g out of range in %+v", *f.v, c)
		}
	}
	return c, nil
}

// copyUS is the modelled GPU time of one copy of size bytes.
func (c Costs) copyUS(size uint64) float64 {
	return c.CopyLatencyUS + float64(size)/c.CopyBytesPerUS
}

// Choice says which strategy an executable runs and why.
type Choice struct {
	// Requested is the strategy Options asked for.
	Requested Strategy
	// Strategy is the one that runs; it differs from Requested only for
	// StrategyAuto.
	Strategy Strategy
	// Reason says why, in words: "requested", or auto's comparison (the
	// measured and modelled costs) and any fallback.
	Reason string
	// Candidates are what auto weighed, the one chosen first, then the
	// others from cheapest (measured, then modelled) to not usable; nil
	// for a strategy asked for by name.
	Candidates []Candidate
	// Probing is true while StrategyAuto is still measuring its candidates
	// (see Options.AutoProbeSteps): steps run each candidate in turn, and
	// Strategy is the model's choice, which runs once the probes are
	// enqueued until their times can be read. It turns false when auto
	// decides.
	Probing bool
}

// Candidate is one strategy auto weighed.
type Candidate struct {
	Strategy Strategy
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

// candidates models patch, stable and pool for e, cheapest first (ties go
// to the one holding less memory: patch, stable, pool). Nothing is
// allocated.
func candidates(e *Executable) []Candidate {
	c := e.opts.Costs
	nodes, traced := e.cb.Users(e.bound)
	cands := []Candidate{{
		Strategy: StrategyPatch, Usable: true,
		StepUS: float64(nodes-traced)*c.NodeUpdateUS + float64(traced)*c.TracedUpdateUS,
		Note:   fmt.Sprintf("%d nodes to patch, %d of them traced", nodes, traced),
	}}
	copyCost := func(pl *copyPlan) (float64, string) {
		var us float64
		for _, cs := range slices.Concat(pl.in, pl.out) {
			us += c.copyUS(cs.size)
		}
		if pl.inGraph {
			us += float64(pl.copies()) * c.NodeUpdateUS
		}
		return us, fmt.Sprintf("%d copies of %d bytes in all", pl.copies(), pl.bytes)
	}
	if pl, err := newCopyPlan(e, false, !e.opts.StreamCopies); err != nil {
		cands = append(cands, Candidate{Strategy: StrategyStable, Note: err.Error()})
	} else {
		us, note := copyCost(pl)
		cands = append(cands, Candidate{Strategy: StrategyStable, Usable: true, StepUS: us, Note: note})
	}
	cands = append(cands, poolCandidate(e, copyCost))
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

// poolCandidate models pool, or says why the device cannot run it.
func poolCandidate(e *Executable, copyCost func(*copyPlan) (float64, string)) Candidate {
	cand := Candidate{Strategy: StrategyPool}
	_, gran, err := gpu.VirtualMemoryOf(e.b, e.dev)
	if err != nil {
		cand.Note = err.Error()
		return cand
	}
	if _, err := gpu.StreamMemOpsOf(e.b, e.dev); err != nil {
		cand.Note = err.Error()
		return cand
	}
	pl, err := newCopyPlan(e, e.opts.ZeroCopyOutputs, !e.opts.StreamCopies)
	if err != nil {
		cand.Note = err.Error()
		return cand
	}
	_, size := pl.layout(e.bufs, e.opts.Alignment)
	slots := uint64(e.opts.PoolSlots) * gpu.RoundUp(max(size, 1), gran)
	free, _, err := e.b.MemGetInfo(e.dev)
	if err != nil {
		cand.Note = fmt.Sprintf("free device memory unknown: %v", err)
		return cand
	}
	if budget := e.opts.Costs.PoolMemoryFraction * float64(free); float64(slots) > budget {
		cand.Note = fmt.Sprintf("%d slots would take %d bytes, more than %.0f%% of the %d bytes free",
			e.opts.PoolSlots, slots, 100*e.opts.Costs.PoolMemoryFraction, free)
		return cand
	}
	us, note := copyCost(pl)
	cand.Usable, cand.StepUS = true, us+e.opts.Costs.TimelineWriteUS
	cand.Note = fmt.Sprintf("%s, a timeline write, %d bytes of slots", note, slots)
	if e.opts.ZeroCopyOutputs {
		cand.Note += ", outputs leased"
	}
	return cand
}

// chooseStrategy is StrategyAuto. It models the candidates (candidates)
// and builds the usable ones, cheapest first; when building one fails
// because the device lacks memory or a capability it records why and moves
// on. Other failures are returned, after releasing what was built. Unless
// probing is skipped (probeSkipped) and when two or more candidates were
// built, it returns an autoProbe that measures them over the first steps
// (autoprobe.go); otherwise the cheapest modelled candidate that could be
// built, and only that one is built.
func chooseStrategy(e *Executable) (strategy, Choice, error) {
	ch := Choice{Requested: StrategyAuto, Candidates: candidates(e)}
	skip := probeSkipped(e)
	var (
		built     []*probe
		fallbacks []string
		errs      []error
	)
	closeBuilt := func() error {
		var cerrs []error
		for _, pr := range built {
			cerrs = append(cerrs, pr.st.close())
		}
		return errors.Join(cerrs...)
	}
	for i := range ch.Candidates {
		c := &ch.Candidates[i]
		if !c.Usable {
			continue
		}
		before := e.mem
		st, err := buildStrategy(e, c.Strategy)
		if err != nil {
			if !errors.Is(err, gpu.ErrOutOfMemory) && !errors.Is(err, gpu.ErrNotSupported) {
				return nil, Choice{}, errors.Join(fmt.Errorf("auto: %s: %w", c.Strategy, err), closeBuilt())
			}
			errs = append(errs, err)
			c.Usable, c.Note = false, "failed to build: "+err.Error()
			fallbacks = append(fallbacks, fmt.Sprintf("%s failed to build (%v)", c.Strategy, err))
			e.log.Debug("auto: candidate failed; falling back", "candidate", c.Strategy, "err", err)
			continue
		}
		built = append(built, &probe{strategy: c.Strategy, st: st, cand: i,
			persistent: e.mem.Persistent - before.Persistent, slots: e.mem.Slots - before.Slots,
			slotCount: e.mem.SlotCount - before.SlotCount})
		if skip != "" {
			break
		}
	}
	if len(built) == 0 {
		return nil, Choice{}, fmt.Errorf("auto: no candidate could be built: %w", errors.Join(errs...))
	}
	fellBack := ""
	if len(fallbacks) > 0 {
		fellBack = "; fell back because " + strings.Join(fallbacks, ", ")
	}
	if skip == "" && len(built) == 1 {
		skip = "no other candidate could be built"
	}
	if skip != "" {
		pr := built[0]
		ch.Strategy = pr.strategy
		ch.Candidates = modelOrder(ch.Candidates, pr.cand)
		ch.Reason = fmt.Sprintf("cheapest modelled step: %s", othersAfter(ch.Candidates)) + fellBack + "; not probed: " + skip
		e.log.Debug("auto chose a strategy", "strategy", pr.strategy, "reason", ch.Reason)
		return pr.st, ch, nil
	}
	a, err := newAutoProbe(e, ch, built, fellBack)
	if err != nil {
		return nil, Choice{}, errors.Join(fmt.Errorf("auto: %w", err), closeBuilt())
	}
	e.auto = a
	return a, a.choice(), nil
}

// probeSkipped says why auto decides by the model alone, "" when it
// measures.
func probeSkipped(e *Executable) string {
	switch {
	case e.opts.AutoProbeSteps < 0:
		return "probing disabled (Options.AutoProbeSteps < 0)"
	case e.opts.ZeroCopyOutputs:
		// Only pool leases its outputs: the candidates would not agree on
		// whether the caller must bind them.
		return "zero-copy outputs (only pool leases its outputs)"
	}
	for i := range e.prog.cmds {
		if e.prog.cmds[i].coll != nil {
			// A rank's step waits for its peers: its probe would measure
			// them, and the ranks would each decide from noise.
			return "the program holds collectives, whose step time is set by the peers"
		}
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
