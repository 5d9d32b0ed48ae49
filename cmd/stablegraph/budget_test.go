package main

import (
	"strings"
	"testing"
	"time"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/workload"
)

// TestFitPlan: the plan bench runs on sim from a measured step cost: the
// defaults when they fit; else the most measured steps that fit, with as
// many back-to-back wall steps in batches of at most the default size and
// a warm-up cut with them (unless given); else the fewest steps, saying
// they do not fit.
func TestFitPlan(t *testing.T) {
	def := planOf(workload.RunOptions{Warmup: 3, Steps: 100})
	if def != (benchPlan{warmup: 3, steps: 100, wallBatches: 10, wallBatchSize: 10}) {
		t.Fatalf("default plan %+v", def)
	}
	runs := benchRuns{full: 10, noWall: 1} // every strategy, the floor, swap's eager floor
	// 11 setups; eager's 203 steps and the eager floor's 103 at 10 ms; the
	// 9 others' 203 each at replayFactor times that.
	want := 11*time.Second + 306*10*time.Millisecond + time.Duration(9*203*replayFactor*float64(10*time.Millisecond))
	if got := (stepCost{setup: time.Second, step: 10 * time.Millisecond}).estimate(runs, def); got != want {
		t.Fatalf("estimate %v, want %v", got, want)
	}

	// A fast step: the defaults, unchanged.
	fast := stepCost{setup: 100 * time.Millisecond, step: time.Millisecond}
	if p, ok := fitPlan(def, runs, fast, 90*time.Second, false); !ok || p != def {
		t.Errorf("fast steps: %+v, %v; want the defaults", p, ok)
	}

	// GPT-2 on sim: half a second a step, seconds of setup per run.
	slow := stepCost{setup: 2 * time.Second, step: 500 * time.Millisecond}
	avail := 90 * time.Second
	p, ok := fitPlan(def, runs, slow, avail, false)
	if !ok || p.steps >= def.steps || p.steps < minBudgetSteps || slow.estimate(runs, p) > avail {
		t.Fatalf("slow steps: %+v, %v (estimate %v of %v)", p, ok, slow.estimate(runs, p), avail)
	}
	if next := def.scaled(p.steps+1, false); slow.estimate(runs, next) <= avail {
		t.Errorf("slow steps: %d steps chosen, but %+v fits too", p.steps, next)
	}
	if p.wallSteps() > p.steps || p.wallSteps() <= p.steps-p.wallBatches || p.wallBatchSize > def.wallBatchSize || p.wallBatches > def.wallBatches || p.warmup != 1 {
		t.Errorf("slow steps: %+v: want as many wall steps as measured ones or a few fewer, batches of at most %d, one warm-up step", p, def.wallBatchSize)
	}
	if w := def.scaled(25, false); w != (benchPlan{warmup: 3, steps: 25, wallBatches: 3, wallBatchSize: 8}) {
		t.Errorf("25 steps: %+v", w)
	}
	if w := def.scaled(40, false); w != (benchPlan{warmup: 3, steps: 40, wallBatches: 4, wallBatchSize: 10}) {
		t.Errorf("40 steps: %+v", w)
	}
	if w := def.scaled(40, true); w.warmup != 3 {
		t.Errorf("40 steps, warm-up given: %+v, want the warm-up kept", w)
	}
	if w := def.scaled(7, false); w != (benchPlan{warmup: 1, steps: 7, wallBatches: 1, wallBatchSize: 7}) {
		t.Errorf("7 steps: %+v", w)
	}

	// A budget nothing fits: the fewest steps, and false.
	if p, ok := fitPlan(def, runs, slow, time.Second, false); ok || p.steps != minBudgetSteps {
		t.Errorf("tiny budget: %+v, %v; want %d steps and false", p, ok, minBudgetSteps)
	}

	// Without wall batches, none are added.
	noWall := def
	noWall.wallBatches = -1
	if p, _ := fitPlan(noWall, runs, slow, avail, false); p.wallSteps() != 0 {
		t.Errorf("no wall batches asked: %+v", p)
	}
}

// TestRunsOf counts a bench's runs as workload.Bench makes them.
func TestRunsOf(t *testing.T) {
	all := len(sg.Strategies())
	for _, c := range []struct {
		strats []sg.Strategy
		pat    workload.Pattern
		want   benchRuns
	}{
		{nil, workload.PingPong, benchRuns{full: all + 1}},
		{nil, workload.Swap, benchRuns{full: all + 1, noWall: 1}},
		{nil, workload.Fixed, benchRuns{full: all}},
		{[]sg.Strategy{sg.StrategyPatch, sg.StrategyEager, sg.StrategyPatch}, workload.Random, benchRuns{full: 3}},
	} {
		if got := runsOf(c.strats, workload.RunOptions{Pattern: c.pat}); got != c.want {
			t.Errorf("%v on %s: %+v, want %+v", c.strats, c.pat, got, c.want)
		}
	}
	if got, want := runsOf(nil, workload.RunOptions{Pattern: workload.PingPong}).full*(3+100+100), benchSteps(nil, workload.RunOptions{Steps: 100, Warmup: 3, Pattern: workload.PingPong})+(all+1)*100; got != want {
		t.Errorf("runsOf and benchSteps disagree: %d and %d steps", got, want)
	}
}

// TestBenchBudget: on sim, bench without --steps times steps and fits its
// budget, saying so on stderr and under the table; a budget nothing fits
// runs the fewest steps and says that; --steps and --budget 0 turn it off;
// a negative budget is a usage error.
func TestBenchBudget(t *testing.T) {
	needSim(t)
	code, out, errs := runCLI(t, append([]string{"--backend", "sim", "bench", "--budget", "1ns"}, tiny...)...)
	if code != exitOK || !strings.Contains(out, ", 1 steps\n") || strings.Contains(out, "NO") ||
		!strings.Contains(out, "\nsim: 1 steps per strategy (1 warm-up, wall time over 1 batch of 1), the fewest bench runs, take about ") ||
		!strings.Contains(out, "more than --budget 1ns; --steps N runs N") ||
		!strings.Contains(errs, "bench: timing 3 eager steps on sim to fit --budget 1ns") {
		t.Errorf("--budget 1ns: code %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	for _, args := range [][]string{{"--budget", "1ns", "--steps", "3"}, {"--budget", "0", "--steps", "4"}} {
		code, out, errs = runCLI(t, append(append([]string{"--backend", "sim", "bench", "--strategies", "patch"}, args...), tiny...)...)
		if code != exitOK || strings.Contains(out, "sim: ") || strings.Contains(errs, "timing") || !strings.Contains(out, ", "+args[3]+" steps\n") {
			t.Errorf("%v: code %d\nstdout:\n%s\nstderr:\n%s", args, code, out, errs)
		}
	}
	// Room for the defaults: they run, and stderr says they fit.
	code, out, errs = runCLI(t, append([]string{"--backend", "sim", "bench", "--strategies", "patch", "--budget", "1h"}, tiny...)...)
	if code != exitOK || !strings.Contains(out, ", 100 steps\n") || strings.Contains(out, "sim: ") ||
		!strings.Contains(errs, "the 100 steps per strategy fit --budget 1h0m0s") {
		t.Errorf("--budget 1h: code %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	if code, _, errs := runCLI(t, "--backend", "sim", "bench", "--budget", "-1s"); code != exitUsage || !strings.Contains(errs, "--budget must not be negative") {
		t.Errorf("--budget -1s: code %d, stderr %q", code, errs)
	}
}

// TestWallCappedBySteps: on sim, run and bench with --steps N time no
// more than N back-to-back steps for wall time (a --steps 1 asked for one
// step, not a hundred), and say so; with as many measured steps as the
// defaults' wall steps nothing is cut.
func TestWallCappedBySteps(t *testing.T) {
	needSim(t)
	// The cut applies to the defaults (ten batches of ten), which TestMain
	// replaces for every other test.
	saved := wallBatches
	wallBatches.n, wallBatches.size = 0, 0
	t.Cleanup(func() { wallBatches = saved })
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--strategy", "eager", "--steps", "1", "--warmup", "0"}, "run: sim: wall time over 1 batch of 1 back-to-back steps, no more than the 1 measured"},
		{[]string{"run", "--strategy", "patch", "--steps", "25"}, "run: sim: wall time over 3 batches of 8 back-to-back steps, no more than the 25 measured"},
		{[]string{"bench", "--strategies", "patch", "--steps", "7"}, "bench: sim: wall time over 1 batch of 7 back-to-back steps, no more than the 7 measured"},
		{[]string{"bench", "--strategies", "patch", "--steps", "100", "--warmup", "0"}, ""},
	} {
		code, out, errs := runCLI(t, append(append([]string{"--backend", "sim"}, c.args...), tiny...)...)
		if code != exitOK || strings.Contains(out, "NO") {
			t.Errorf("%v: code %d\n%s\n%s", c.args, code, out, errs)
			continue
		}
		if c.want != "" && !strings.Contains(errs, c.want+"\n") || c.want == "" && strings.Contains(errs, "wall time over") {
			t.Errorf("%v: stderr lacks %q:\n%s", c.args, c.want, errs)
		}
	}
}

// TestBenchCollectivesFixedPlanOnSim: a workload with collectives under
// --nproc on sim, without --steps, runs a fixed plan of few steps on every
// rank and says so (it ran the hundred default steps, which for
// tensor-parallel GPT-2 took a quarter of an hour); --steps still runs what
// it says.
func TestBenchCollectivesFixedPlanOnSim(t *testing.T) {
	needSim(t)
	args := []string{"--backend", "sim", "bench", "--workload", "dp", "--nproc", "2", "--strategies", "patch", "--layers", "1", "--width", "16", "--batch-per-rank", "2"}
	code, out, errs := runCLI(t, args...)
	if code != exitOK || strings.Contains(out, "NO") {
		t.Fatalf("%v: code %d\nstdout:\n%s\nstderr:\n%s", args, code, out, errs)
	}
	const says = "sim: 5 steps per strategy (1 warm-up) instead of 100: a workload with collectives takes a fixed plan on sim, the same on every rank"
	if !strings.Contains(errs, "bench: "+says) || !strings.Contains(out, says) || !strings.Contains(out, ", 5 steps") {
		t.Errorf("%v: the plan is not said or not run:\nstdout:\n%s\nstderr:\n%s", args, out, errs)
	}
	args = append(args, "--steps", "3")
	code, out, errs = runCLI(t, args...)
	if code != exitOK || strings.Contains(errs, "fixed plan") || !strings.Contains(out, ", 3 steps") {
		t.Errorf("%v: code %d\nstdout:\n%s\nstderr:\n%s", args, code, out, errs)
	}
}
