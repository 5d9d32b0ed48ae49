package main

import (
	"context"
	"fmt"
	"time"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/workload"
)

// bench on sim fits a time budget. sim runs every kernel on this CPU, so a
// step of gpt2-decode or mlp-large takes a good part of a second, and
// bench's defaults (every strategy, the floor, 3 + 100 checked steps and
// 10 batches of 10 back-to-back steps each) would take an hour. Unless
// --steps is given, bench on sim first times a few eager steps of the
// workload, then runs as many steps per strategy as fit --budget, and says
// so; on a GPU it runs what the flags say. A workload with collectives
// cannot fit a budget (each rank would time its own steps and plan apart,
// and its ranks must run the same steps): on sim it takes a fixed plan of
// collectiveSimSteps measured steps instead, derived from the flags alone,
// the same on every rank.

// defaultSimBudget is --budget's default. Besides the budget, bench builds
// the workload and times its steps, and the plan is an estimate from the
// machine's speed while it timed them: on a shared machine that speed
// changes, and a machine twice as busy later takes twice as long. A third
// of 3 minutes leaves room for that.
const defaultSimBudget = time.Minute

// collectiveSimSteps is the measured steps per strategy of bench on sim for
// a workload with collectives, unless --steps is given: a tensor-parallel
// GPT-2 step on sim takes most of a second per rank.
const collectiveSimSteps = 5

// minBudgetSteps is the fewest measured steps a budget cuts a run to.
const minBudgetSteps = 1

// calibrationSteps is how many eager steps calibrate times: the first
// includes the run's setup, the others give a step's cost.
const calibrationSteps = 3

// benchPlan is how many steps each of bench's runs takes.
type benchPlan struct {
	warmup, steps              int
	wallBatches, wallBatchSize int
}

// planOf is o's plan, with workload.RunOptions' defaults for the wall
// batches.
func planOf(o workload.RunOptions) benchPlan {
	p := benchPlan{warmup: o.Warmup, steps: o.Steps, wallBatches: o.WallBatches, wallBatchSize: o.WallBatchSize}
	if p.wallBatches == 0 {
		p.wallBatches = 10
	}
	if p.wallBatchSize <= 0 {
		p.wallBatchSize = 10
	}
	return p
}

// apply sets o's steps to p's.
func (p benchPlan) apply(o workload.RunOptions) workload.RunOptions {
	o.Warmup, o.Steps, o.WallBatches, o.WallBatchSize = p.warmup, p.steps, p.wallBatches, p.wallBatchSize
	return o
}

// wallSteps is the number of back-to-back steps timed for wall time.
func (p benchPlan) wallSteps() int { return max(p.wallBatches, 0) * p.wallBatchSize }

// scaled is def cut to x measured steps: as many back-to-back steps for
// wall time as measured ones or a few fewer (the defaults have 100 of
// each), in up to def's number of batches of up to def's batch size,
// equal batches, and a warm-up of a
// step per 10 measured ones (at least one) up to def's, unless the
// warm-up was given.
func (def benchPlan) scaled(x int, warmupGiven bool) benchPlan {
	p := benchPlan{warmup: def.warmup, steps: x, wallBatches: def.wallBatches, wallBatchSize: def.wallBatchSize}
	if !warmupGiven {
		p.warmup = min(def.warmup, (x+9)/10)
	}
	if def.wallBatches > 0 {
		wall := min(x, def.wallSteps())
		p.wallBatches = min(def.wallBatches, (wall+def.wallBatchSize-1)/def.wallBatchSize)
		p.wallBatchSize = max(1, wall/p.wallBatches)
	}
	return p
}

// benchRuns counts the runs of a bench: full ones (eager first, then each
// other strategy and the floor) and eager ones without wall time (the
// floor's reference under swap).
type benchRuns struct{ full, noWall int }

// runsOf counts the runs of a bench of strats (nil: all) with o.
func runsOf(strats []sg.Strategy, o workload.RunOptions) benchRuns {
	r := benchRuns{full: len(workload.BenchOrder(strats))}
	if o.RunsFloor() {
		r.full++
		if o.Pattern == workload.Swap {
			r.noWall++
		}
	}
	return r
}

// replayFactor is what a step of a strategy other than eager costs on sim,
// in eager steps, as bench's plan counts it. They run the same kernels and
// more besides (recording, updating, copying, remapping, auto's probes);
// on mlp-large and gpt2-decode they took 1.0 to 2.0 eager steps, about 1.4
// on average.
const replayFactor = 1.4

// stepCost is what calibration measured: a run's fixed cost (compiling,
// writing the state, the caller's buffers, closing) and an eager step's.
type stepCost struct{ setup, step time.Duration }

// estimate is the time r's runs take with plan p: each run's setup, the
// eager runs' steps at c.step, the others' at replayFactor times that.
func (c stepCost) estimate(r benchRuns, p benchPlan) time.Duration {
	full, noWall := p.warmup+p.steps+p.wallSteps(), p.warmup+p.steps
	eagerSteps := full + r.noWall*noWall
	otherSteps := max(r.full-1, 0) * full
	return time.Duration(r.full+r.noWall)*c.setup + time.Duration(eagerSteps)*c.step +
		time.Duration(float64(otherSteps)*float64(c.step)*replayFactor)
}

// fitPlan returns def when its runs fit in avail; else the plan of the
// most measured steps (at most def's) that fits, cut as scaled says; else,
// with false, that of minBudgetSteps.
func fitPlan(def benchPlan, r benchRuns, c stepCost, avail time.Duration, warmupGiven bool) (benchPlan, bool) {
	if c.estimate(r, def) <= avail {
		return def, true
	}
	for x := def.steps - 1; x >= minBudgetSteps; x-- {
		if p := def.scaled(x, warmupGiven); c.estimate(r, p) <= avail {
			return p, true
		}
	}
	return def.scaled(min(minBudgetSteps, def.steps), warmupGiven), false
}

// calibrate times calibrationSteps eager steps of w with o's pattern:
// the step's cost from the steps after the first, the rest of the run's
// time as its setup. A step's cost is its wall time or, where larger, the
// CPU time the process spent on it: the sim shares a product out over the
// cores, and a machine that is busier later gives it fewer of them.
func calibrate(ctx context.Context, b gpu.Backend, w *workload.Workload, o workload.RunOptions) (stepCost, error) {
	o.Strategy, o.Warmup, o.Steps, o.WallBatches = sg.StrategyEager, 0, calibrationSteps, -1
	o.Reference, o.Dump, o.NoFloor = nil, "", true
	type mark struct {
		wall time.Time
		cpu  time.Duration
	}
	var done []mark
	o.Progress = func(sg.Strategy, int, int) {
		cpu, _ := processCPU()
		done = append(done, mark{time.Now(), cpu})
	}
	start := time.Now()
	if _, err := workload.Run(ctx, b, w, o); err != nil {
		return stepCost{}, err
	}
	total := time.Since(start)
	if len(done) != calibrationSteps {
		return stepCost{}, fmt.Errorf("timing %d steps: %d reported", calibrationSteps, len(done))
	}
	first, last := done[0], done[len(done)-1]
	n := time.Duration(len(done) - 1)
	wall := last.wall.Sub(first.wall) / n
	step := wall
	if _, ok := processCPU(); ok {
		step = max(step, (last.cpu-first.cpu)/n)
	}
	return stepCost{setup: max(total-time.Duration(len(done))*wall, 0), step: step}, nil
}

// capWall is o with no more back-to-back steps timed for wall time than
// measured ones (the defaults have 100 of each), cut as scaled cuts them,
// for run and bench on sim: a --steps 1 asked for one step, not for the
// hundred wall-time steps that would take minutes of CPU on a large
// workload. It says so on stderr when it cuts (lead: the rank that
// reports). Every rank cuts alike.
func capWall(e *env, cmd string, o workload.RunOptions, lead bool) workload.RunOptions {
	p := planOf(o)
	if p.wallSteps() <= o.Steps {
		return o
	}
	q := p.scaled(o.Steps, true)
	if lead {
		batches := fmt.Sprintf("%d batches of %d", q.wallBatches, q.wallBatchSize)
		if q.wallBatches == 1 {
			batches = fmt.Sprintf("1 batch of %d", q.wallBatchSize)
		}
		e.progress("%s: sim: wall time over %s back-to-back steps, no more than the %d measured", cmd, batches, o.Steps)
	}
	return q.apply(o)
}

// fitBudget is bench's budget on sim (see above): it calibrates, plans
// and says what it chose on stderr; the note, when the plan is not o's,
// is for the report's reader too.
func fitBudget(e *env, b gpu.Backend, w *workload.Workload, o workload.RunOptions, strats []sg.Strategy, budget time.Duration, warmupGiven bool) (workload.RunOptions, string, error) {
	start := time.Now()
	e.progress("bench: timing %d eager steps on sim to fit --budget %v", calibrationSteps, budget)
	c, err := calibrate(e.ctx, b, w, o)
	if err != nil {
		return o, "", fmt.Errorf("timing steps for --budget: %w", err)
	}
	def := planOf(o)
	runs := runsOf(strats, o)
	p, fits := fitPlan(def, runs, c, budget-time.Since(start), warmupGiven)
	if p == def {
		e.progress("bench: sim: %v a step here; the %d steps per strategy fit --budget %v (about %v in all)",
			c.step.Round(time.Millisecond), def.steps, budget, c.estimate(runs, p).Round(time.Second))
		return o, "", nil
	}
	wall := "no wall time"
	switch {
	case p.wallBatches == 1:
		wall = fmt.Sprintf("wall time over 1 batch of %d", p.wallBatchSize)
	case p.wallBatches > 1:
		wall = fmt.Sprintf("wall time over %d batches of %d", p.wallBatches, p.wallBatchSize)
	}
	note := fmt.Sprintf("sim: %d steps per strategy (%d warm-up, %s) instead of %d, to fit --budget %v at %v a step here (about %v in all); --steps N runs N, --budget 0 the defaults",
		p.steps, p.warmup, wall, def.steps, budget, c.step.Round(time.Millisecond), c.estimate(runs, p).Round(time.Second))
	if !fits {
		note = fmt.Sprintf("sim: %d steps per strategy (%d warm-up, %s), the fewest bench runs, take about %v at %v a step here, more than --budget %v; --steps N runs N",
			p.steps, p.warmup, wall, c.estimate(runs, p).Round(time.Second), c.step.Round(time.Millisecond), budget)
	}
	e.progress("bench: %s", note)
	return p.apply(o), note, nil
}

// fitCollectives is bench's plan on sim for a workload with collectives
// (see above): o cut to collectiveSimSteps measured steps, with its wall
// time and warm-up cut alike, said on stderr by the rank that reports
// (lead), which alone gets the note for under the table.
func fitCollectives(e *env, o workload.RunOptions, warmupGiven, lead bool) (workload.RunOptions, string) {
	def := planOf(o)
	if def.steps <= collectiveSimSteps {
		return capWall(e, "bench", o, lead), ""
	}
	p := def.scaled(collectiveSimSteps, warmupGiven)
	if !lead {
		return p.apply(o), ""
	}
	note := fmt.Sprintf("sim: %d steps per strategy (%d warm-up) instead of %d: a workload with collectives takes a fixed plan on sim, the same on every rank; --steps N runs N",
		p.steps, p.warmup, def.steps)
	e.progress("bench: %s", note)
	return p.apply(o), note
}
