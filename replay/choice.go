package replay

import "fmt"

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
	// (see AutoOptions.ProbeSteps): steps run each candidate in turn, and
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
