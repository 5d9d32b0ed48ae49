package workload

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda"
	"github.com/stablegraph/stablegraph/internal/patchtable"
)

// driverClock is the CUDA backend with a clock around the driver calls a
// replayed step makes on the host: exec updates of kernel nodes (the inline
// patcher's apart), graph launches, and the calls every step makes around
// them (the stream's capture query, the step's event). It embeds the
// backend, so every capability stays visible.
type driverClock struct {
	*cuda.Backend
	update, launch, patcher, other time.Duration
	updates                        int
	// The exec updates (each Apply) of the steps since the last reset,
	// and the last launch, which BenchmarkCUDARunAgainstRaw makes again
	// without Run.
	applies []applyCall
	// idx holds the applies' node indexes: one buffer, reused from step
	// to step, so that the clock allocates nothing inside Run.
	idx   []int32
	lastX gpu.GraphExec
	lastS gpu.Stream
	// words are the pointer words the steps since the last reset set on
	// their node sets with SetWord and, once lent has read them, those
	// Run wrote in place (BenchmarkCUDARunAgainstRaw moves them back and
	// forth without Run).
	words []setWord
}

// applyCall is one KernelNodeSet.Apply call, on cs's set.
type applyCall struct {
	set gpu.KernelNodeSet
	idx []int32
	cs  *clockedSet
}

// setWord is one KernelNodeSet.SetWord call.
type setWord struct {
	set         gpu.KernelNodeSet
	i, arg, off int
	v           uint64
}

// reset zeroes the clocks before a step.
func (d *driverClock) reset() {
	d.update, d.launch, d.patcher, d.other, d.updates = 0, 0, 0, 0, 0
	d.words, d.applies, d.idx = d.words[:0], d.applies[:0], d.idx[:0]
}

func (d *driverClock) StreamIsCapturing(s gpu.Stream) (bool, error) {
	t0 := time.Now()
	c, err := d.Backend.StreamIsCapturing(s)
	d.other += time.Since(t0)
	return c, err
}

func (d *driverClock) EventRecord(e gpu.Event, s gpu.Stream) error {
	t0 := time.Now()
	err := d.Backend.EventRecord(e, s)
	d.other += time.Since(t0)
	return err
}

func (d *driverClock) StreamWaitEvent(s gpu.Stream, e gpu.Event) error {
	t0 := time.Now()
	err := d.Backend.StreamWaitEvent(s, e)
	d.other += time.Since(t0)
	return err
}

func (d *driverClock) GraphExecKernelNodeSetParams(x gpu.GraphExec, n gpu.GraphNode, p gpu.KernelParams) error {
	t0 := time.Now()
	err := d.Backend.GraphExecKernelNodeSetParams(x, n, p)
	d.update += time.Since(t0)
	d.updates++
	return err
}

// PrepareKernelNodes wraps the backend's prepared node sets, through which
// patch and device make their exec updates, in the clock.
func (d *driverClock) PrepareKernelNodes(x gpu.GraphExec, nodes []gpu.GraphNode, params []gpu.KernelParams) (gpu.KernelNodeSet, error) {
	set, err := d.Backend.PrepareKernelNodes(x, nodes, params)
	if err != nil {
		return nil, err
	}
	// The inline patcher's node is prepared alone, and no other kernel
	// takes its arguments (patchtable.Memory.InlineArgs).
	patcher := len(params) == 1 && len(params[0].Args) == 4+patchtable.InlineSize/8
	return &clockedSet{KernelNodeSet: set, d: d, patcher: patcher}, nil
}

// clockedSet times a node set's Apply as exec updates, and also apart when
// the set is the inline patcher's. It lends the set's words
// (gpu.KernelNodeWords) as the set does, so that Run takes its own path.
type clockedSet struct {
	gpu.KernelNodeSet
	d       *driverClock
	patcher bool
	// refs[k] are the words of node k lent through Word: Run writes them
	// with no call to record, and lent reads them after the step.
	refs [][]wordRef
}

// wordRef is a word of a set's node lent through Word: argument arg, byte
// off.
type wordRef struct {
	arg, off int
	w        *uint64
}

func (s *clockedSet) Word(i, arg, off int) (*uint64, error) {
	kw, ok := s.KernelNodeSet.(gpu.KernelNodeWords)
	if !ok {
		return nil, gpu.Errorf("clockedSet.Word", gpu.ErrInvalidValue, "the set lends no words")
	}
	w, err := kw.Word(i, arg, off)
	if err == nil {
		for len(s.refs) <= i {
			s.refs = append(s.refs, nil)
		}
		s.refs[i] = append(s.refs[i], wordRef{arg, off, w})
	}
	return w, err
}

// lent appends to d.words, after a step, the lent words of the nodes the
// step applied, as they are now: the words Run wrote in place.
func (d *driverClock) lent() {
	for _, a := range d.applies {
		for _, k := range a.idx {
			if int(k) >= len(a.cs.refs) {
				continue
			}
			for _, r := range a.cs.refs[k] {
				d.words = append(d.words, setWord{a.set, int(k), r.arg, r.off, *r.w})
			}
		}
	}
}

func (s *clockedSet) SetWord(i, arg, off int, v uint64) error {
	s.d.words = append(s.d.words, setWord{s.KernelNodeSet, i, arg, off, v})
	return s.KernelNodeSet.SetWord(i, arg, off, v)
}

func (s *clockedSet) Apply(idx []int32) (int, error) {
	t0 := time.Now()
	n, err := s.KernelNodeSet.Apply(idx)
	dt := time.Since(t0)
	s.d.update += dt
	if s.patcher {
		s.d.patcher += dt
	}
	s.d.updates += n
	start := len(s.d.idx)
	s.d.idx = append(s.d.idx, idx...)
	s.d.applies = append(s.d.applies, applyCall{s.KernelNodeSet, s.d.idx[start:len(s.d.idx):len(s.d.idx)], s})
	return n, err
}

func (d *driverClock) GraphLaunch(x gpu.GraphExec, s gpu.Stream) error {
	t0 := time.Now()
	err := d.Backend.GraphLaunch(x, s)
	d.launch += time.Since(t0)
	d.lastX, d.lastS = x, s
	return err
}

// BenchmarkCUDAStepHost takes a step's host time apart: for patch (node
// by node, and with whole-graph updates from the host template forced by
// the costs), device (its ring of tables, the inline patcher, each with the
// first command on the device and from the host), fixed
// and fresh addresses, on mlp, mlp-large, train and chain-moving, and on
// gpt2-decode at batch 1 with fixed and swapping caches (fixed/patch is the
// bench's floor), the p50 of Run's host time, of the exec updates it made
// (and how many; the inline patcher's apart), of the graph launch, of the
// other driver calls every step makes (the stream's capture query, the
// step's event), and of the rest: the runtime's own work, with the
// cuCtxGetCurrent of each set of updates and of each call. One iteration
// is one step: inputs bound (not timed), Run, a stream synchronization.
// BENCHMARKS.md section 0 quotes it.
func BenchmarkCUDAStepHost(bm *testing.B) {
	cb := openCUDABench(bm)
	ctx := context.Background()
	for _, c := range stepHostCases() {
		w, err := New(c.workload, c.cfg)
		if err != nil {
			bm.Fatal(err)
		}
		for _, pat := range []Pattern{Fixed, c.moving} {
			for _, v := range hostVariants() {
				bm.Run(fmt.Sprintf("%s/%s/%s", c.name, pat, v.name), func(bm *testing.B) {
					// One thread on one core, as Run holds it.
					defer holdCore()()
					stepHost(ctx, bm, &driverClock{Backend: cb}, w, pat, v.opts)
				})
			}
		}
	}
}

// stepHostCase is a workload of BenchmarkCUDAStepHost and the pattern that
// moves it.
type stepHostCase struct {
	name, workload string
	cfg            Config
	moving         Pattern
}

func stepHostCases() []stepHostCase {
	return []stepHostCase{
		{"mlp", "mlp", Config{}, Random},
		{"mlp-large", "mlp-large", Config{}, Random},
		{"train", "train", Config{}, Random},
		{"chain-moving", "chain-moving", Config{}, Random},
		// The bench's gpt2-b1-swap row: device's host time there is the
		// furthest over the floor.
		{"gpt2-b1", "gpt2-decode", Config{Batch: 1}, Swap},
		// The bench's gpt2-b8-random row: every cache of eight
		// sequences moves, the most buffers device's table moves.
		{"gpt2-b8", "gpt2-decode", Config{Batch: 8}, Random},
	}
}

// hostVariant is a strategy with the options that select one of its ways.
type hostVariant struct {
	name string
	opts sg.Options
}

// hostVariants are the ways patch and device move a step from the host
// (device: the ring of tables and everything moved on the device;
// -inline: its moves in the patcher's parameters; -host-lead: its first
// command moved from the host).
func hostVariants() []hostVariant {
	return []hostVariant{
		{"patch", sg.Options{Strategy: sg.StrategyPatch}},
		{"patch-whole", sg.Options{Strategy: sg.StrategyPatch, Costs: sg.Costs{NodeUpdateUS: 1000}}},
		{"device", sg.Options{Strategy: sg.StrategyDevice}},
		{"device-inline", sg.Options{Strategy: sg.StrategyDevice, StrategyOptions: sg.StrategyOptions{DeviceStrategy: sg.DeviceOptions{Inline: true}}}},
		{"device-host-lead", sg.Options{Strategy: sg.StrategyDevice, StrategyOptions: sg.StrategyOptions{DeviceStrategy: sg.DeviceOptions{HostLead: true}}}},
		{"device-inline-host-lead", sg.Options{Strategy: sg.StrategyDevice, StrategyOptions: sg.StrategyOptions{DeviceStrategy: sg.DeviceOptions{Inline: true, HostLead: true}}}},
	}
}

func stepHost(ctx context.Context, bm *testing.B, d *driverClock, w *Workload, pat Pattern, opts sg.Options) {
	c, exe, s, done := openRig(ctx, bm, d, w, pat, opts)
	defer done()
	var run, upd, launch, patcher, other []float64
	updates := 0
	var before sg.Counters
	for step := 0; bm.Loop(); step++ {
		host := timedStep(ctx, bm, d, c, exe, s, step)
		if step < 10 { // recording, probing templates
			before = exe.Stats().Counters
			continue
		}
		run = append(run, us(host))
		upd = append(upd, us(d.update))
		launch = append(launch, us(d.launch))
		patcher = append(patcher, us(d.patcher))
		other = append(other, us(d.other))
		updates += d.updates
	}
	if len(run) == 0 {
		return
	}
	st := exe.Stats().Counters.Sub(before)
	r, u, l, o := p50(run), p50(upd), p50(launch), p50(other)
	bm.ReportMetric(r, "run-µs")
	bm.ReportMetric(u, "updates-µs")
	bm.ReportMetric(p50(patcher), "patcher-µs")
	bm.ReportMetric(float64(updates)/float64(len(run)), "updates/step")
	bm.ReportMetric(float64(st.PatchedNodes)/float64(len(run)), "moved/step")
	bm.ReportMetric(float64(st.GraphUpdates)/float64(len(run)), "whole/step")
	bm.ReportMetric(l, "launch-µs")
	bm.ReportMetric(o, "other-µs")
	bm.ReportMetric(r-u-l-o, "rest-µs")
}

// TestCUDAHostPathMatchesEager: on a GPU, the ways patch and device move a
// step from the host (node by node through prepared node sets, whole-graph
// updates from the host template, the inline patcher and the ring) and
// auto give eager's bits at every step with fresh addresses, on workloads
// with GEMMs (flattened cuBLAS kernels), copies, a long chain and GPT-2
// decode with swapping caches.
func TestCUDAHostPathMatchesEager(t *testing.T) {
	b := openCUDA(t)
	ctx := context.Background()
	for _, c := range []struct {
		name string
		cfg  Config
		pat  Pattern
	}{
		{"mlp", Config{}, Random},
		{"train", Config{}, Random},
		{"chain-moving", Config{K: 64}, Random},
		{"gpt2-decode-tiny", Config{}, Swap},
	} {
		w, err := New(c.name, c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		o := RunOptions{Steps: 12, Warmup: 2, Pattern: c.pat, WallBatches: -1}
		ref, err := Run(ctx, b, w, o)
		if err != nil {
			t.Fatal(err)
		}
		vs := append(hostVariants(), hostVariant{"auto", sg.Options{Strategy: sg.StrategyAuto}},
			hostVariant{"auto-throughput", sg.Options{Strategy: sg.StrategyAuto, StrategyOptions: sg.StrategyOptions{Auto: sg.AutoOptions{Bound: sg.AutoBoundThroughput}}}})
		for _, v := range vs {
			t.Run(c.name+"/"+v.name, func(t *testing.T) {
				ro := o
				ro.Strategy, ro.Reference, ro.Costs, ro.AutoBound = v.opts.Strategy, ref.Digests, v.opts.Costs, v.opts.Auto.Bound
				ro.DeviceInline, ro.DeviceHostLead = v.opts.DeviceStrategy.Inline, v.opts.DeviceStrategy.HostLead
				res, err := Run(ctx, b, w, ro)
				if errors.Is(err, gpu.ErrNotSupported) {
					t.Skipf("not on this device: %v", err)
				}
				if err != nil {
					t.Fatal(err)
				}
				if !res.Result.OutputsMatchEager {
					t.Fatalf("outputs differ from eager from step %d (%s)", res.Mismatch, res.Result.Note)
				}
				if v.name == "patch-whole" && res.Stats.GraphUpdates == 0 {
					t.Errorf("no whole-graph update from the template: %+v (%s)", res.Stats, res.Result.Note)
				}
				t.Logf("%s: %s", v.name, res.Result.Note)
			})
		}
	}
}

// BenchmarkCUDARunAgainstRaw sets a moving patch step's Run beside the
// same driver calls made without it, in one process, on the workloads of
// BenchmarkCUDAStepHost with their moving patterns: whatever Run adds to
// the driver's price of a move shows as the difference of the
// differences. Steps of five kinds take turns, each after its inputs are
// written as the bench's caller writes them:
//
//   - run: Run of the moving step (run-µs; within it its exec updates,
//     run-updates-µs, and its launch, run-launch-µs);
//   - raw: its last exec updates and launch made again through the
//     backend (raw-µs, raw-launch-µs), which set what the exec already
//     holds;
//   - launch: the launch alone (launch-µs);
//   - floor: Run of the same workload on fixed buffers (floor-µs);
//   - move: real moves without Run (move-µs, move-launch-µs): the pointer
//     words of the Run before last set and applied, then launched, then
//     those of the last Run: the driver calls the C probe
//     bench/probes/movelatency makes, on our graph, through our loader
//     (move-after-bind-µs: the first, which follows the inputs' write as
//     Run's step does; move-after-launch-µs: the second).
//
// So run − floor is what a moving step costs through Run, and move −
// launch what the driver charges for the same move. *-lat-µs are each
// kind's latency: from the call to the end of its device work as the host
// sees it (a stream synchronization), one step at a time as a decode loop
// waits. Where the platform has a per-thread CPU clock, *-cpu-µs are the
// thread's CPU time over the same spans and switches/step its context
// switches: CPU time equal to the wall time says the time is spent
// running (in our code or the driver's), not waiting. A CPU profile cannot
// split it: the samples it takes inside the driver are a small fraction of
// the time spent there.
func BenchmarkCUDARunAgainstRaw(bm *testing.B) {
	cb := openCUDABench(bm)
	// RUNRAW_SAME_INPUT=1: every step's inputs are step 0's, made once
	// and written again: what the write costs the driver calls after it,
	// without the making. RUNRAW_PINNED_INPUT=1: the inputs are made in
	// page-locked memory and copied by DMA (CallerOptions.PinnedInputs;
	// not gpt2-decode's, a few bytes).
	sameInput := os.Getenv("RUNRAW_SAME_INPUT") == "1"
	pinned := os.Getenv("RUNRAW_PINNED_INPUT") == "1"
	ctx := context.Background()
	for _, hc := range stepHostCases() {
		w, err := New(hc.workload, hc.cfg)
		if err != nil {
			bm.Fatal(err)
		}
		bm.Run(hc.name, func(bm *testing.B) {
			// The thread clock and switch counts are the thread's: the
			// sub-benchmark's goroutine keeps one, on one core, as Run
			// holds it.
			defer holdCore()()
			d, fd := &driverClock{Backend: cb}, &driverClock{Backend: cb}
			copts := CallerOptions{PinnedInputs: pinned && w.gpt2 == nil}
			c, exe, s, done := openRigWith(ctx, bm, d, w, hc.moving, copts, sg.Options{Strategy: sg.StrategyPatch})
			defer done()
			fc, fexe, fs, fdone := openRigWith(ctx, bm, fd, w, Fixed, copts, sg.Options{Strategy: sg.StrategyPatch})
			defer fdone()
			c.sameInput, fc.sameInput = sameInput, sameInput
			for i := range 30 { // recording, proving the templates, preparing the node sets
				timedStep(ctx, bm, d, c, exe, s, i)
				timedStep(ctx, bm, fd, fc, fexe, fs, i)
			}
			if d.lastX == 0 {
				bm.Fatal("no launch was seen in a moving step")
			}
			kinds := []string{"run", "raw", "launch", "floor", "move"}
			var t [5]spanTimes
			var runUpd, runLaunch, rawLaunch, moveLaunch []float64
			var prev, cur []setWord // the pointer words of the Run before last, and of the last
			var applies []applyCall // the last Run's exec updates
			var after [2][]float64  // move's first and second steps
			// driverStep times the exec updates of applies (none: the
			// launch alone) and the last Run's launch as kind k, and
			// waits for them.
			driverStep := func(k int, applies []applyCall) float64 {
				var l time.Duration
				t0 := time.Now()
				t[k].time(func() {
					for _, a := range applies {
						if _, err := a.set.Apply(a.idx); err != nil {
							bm.Fatal(err)
						}
					}
					t1 := time.Now()
					if err := cb.GraphLaunch(d.lastX, d.lastS); err != nil {
						bm.Fatal(err)
					}
					l = time.Since(t1)
				})
				if err := cb.StreamSynchronize(d.lastS); err != nil {
					bm.Fatal(err)
				}
				t[k].lat = append(t[k].lat, us(time.Since(t0)))
				return us(l)
			}
			for step := 0; bm.Loop(); step++ {
				k := step % len(kinds)
				switch kinds[k] {
				case "run":
					spannedStep(ctx, bm, d, c, exe, s, 30+step, &t[k])
					runUpd, runLaunch = append(runUpd, us(d.update)), append(runLaunch, us(d.launch))
					d.lent()
					prev, cur = append(prev[:0], cur...), append(cur[:0], d.words...)
					applies = append(applies[:0], d.applies...)
				case "floor":
					// An untimed floor step first: each timed step
					// follows one of its own executable, as in a loop
					// of steps (the floor's weights are its own, and
					// mlp-large's two sets do not fit in the card's L2
					// together).
					timedStep(ctx, bm, fd, fc, fexe, fs, 30+step)
					spannedStep(ctx, bm, fd, fc, fexe, fs, 30+step, &t[k])
				case "raw", "launch":
					if kinds[k] == "raw" && len(applies) == 0 {
						continue // moved by whole-graph updates: no exec update to make again
					}
					if _, err := c.Bind(30 + step); err != nil {
						bm.Fatal(err)
					}
					if kinds[k] == "launch" {
						driverStep(k, nil)
						continue
					}
					rawLaunch = append(rawLaunch, driverStep(k, applies))
				case "move":
					// Set back to the Run before's words (freed buffers
					// of the caller's region, its memory still mapped),
					// then forward again: two moving steps, and the
					// exec left as Run knows it. Only when the two Runs
					// moved the same words (swapping caches may not).
					if len(applies) == 0 || !sameWords(prev, cur) {
						continue
					}
					if _, err := c.Bind(30 + step); err != nil {
						bm.Fatal(err)
					}
					// After the floor's step: an untimed launch first.
					if err := cb.GraphLaunch(d.lastX, d.lastS); err != nil {
						bm.Fatal(err)
					}
					if err := cb.StreamSynchronize(d.lastS); err != nil {
						bm.Fatal(err)
					}
					for j, words := range [][]setWord{prev, cur} {
						for _, w := range words {
							if err := w.set.SetWord(w.i, w.arg, w.off, w.v); err != nil {
								bm.Fatal(err)
							}
						}
						moveLaunch = append(moveLaunch, driverStep(k, applies))
						// The first follows the inputs' write, as Run
						// does; the second a launch of the same exec.
						after[j] = append(after[j], t[k].wall[len(t[k].wall)-1])
					}
				}
			}
			if len(t[3].wall) == 0 {
				return
			}
			for k, n := range kinds {
				if len(t[k].wall) == 0 {
					continue
				}
				bm.ReportMetric(p50(t[k].wall), n+"-µs")
				bm.ReportMetric(p50(t[k].lat), n+"-lat-µs")
				if len(t[k].cpu) > 0 {
					bm.ReportMetric(p50(t[k].cpu), n+"-cpu-µs")
					bm.ReportMetric(float64(t[k].switches)/float64(len(t[k].wall)), n+"-switches/step")
				}
			}
			bm.ReportMetric(p50(runUpd), "run-updates-µs")
			bm.ReportMetric(p50(runLaunch), "run-launch-µs")
			for n, v := range map[string][]float64{"raw-launch-µs": rawLaunch, "move-launch-µs": moveLaunch} {
				if len(v) > 0 {
					bm.ReportMetric(p50(v), n)
				}
			}
			if len(after[0]) > 0 {
				bm.ReportMetric(p50(after[0]), "move-after-bind-µs")
				bm.ReportMetric(p50(after[1]), "move-after-launch-µs")
			}
			n := 0
			for _, a := range applies {
				n += len(a.idx)
			}
			bm.ReportMetric(float64(n), "updates/step")
		})
	}
}

// sameWords reports whether two steps set the same pointer words (their
// values aside), and any at all.
func sameWords(a, b []setWord) bool {
	if len(a) == 0 || len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.set != y.set || x.i != y.i || x.arg != y.arg || x.off != y.off {
			return false
		}
	}
	return true
}

// spanTimes collects the wall time of spans, and where the platform has a
// per-thread CPU clock (threadclock_linux_test.go) their CPU time and the
// thread's context switches.
type spanTimes struct {
	wall, cpu, lat []float64
	switches       int64
}

// time runs f, which must not leave the thread, and records its span.
func (t *spanTimes) time(f func()) time.Duration {
	sw0, swok := threadSwitches()
	c0, cok := threadCPU()
	t0 := time.Now()
	f()
	wall := time.Since(t0)
	c1, _ := threadCPU()
	sw1, _ := threadSwitches()
	t.wall = append(t.wall, us(wall))
	if cok && swok {
		t.cpu = append(t.cpu, us(c1-c0))
		t.switches += sw1 - sw0
	}
	return wall
}

func p50(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

// BenchmarkCUDAAutoStepHost: on a GPU, fresh addresses, auto's host time
// per step once it has kept a candidate (and closed the others) against
// the kept strategy's own, compiled alone in the same process: Run's p50,
// its exec updates and its launch, each for auto and for the kept
// strategy (kept-…). Whatever auto adds after its choice shows as the
// difference. One iteration runs both, 100 measured steps each.
func BenchmarkCUDAAutoStepHost(bm *testing.B) {
	cb := openCUDABench(bm)
	ctx := context.Background()
	for _, name := range []string{"mlp", "mlp-large", "chain-moving"} {
		bm.Run(name, func(bm *testing.B) {
			defer holdCore()()
			d := &driverClock{Backend: cb}
			for bm.Loop() {
				kept, r, u, l := hostSteps(ctx, bm, d, name, sg.Options{Strategy: sg.StrategyAuto}, 100)
				_, kr, ku, kl := hostSteps(ctx, bm, d, name, sg.Options{Strategy: kept}, 100)
				bm.ReportMetric(r, "run-µs")
				bm.ReportMetric(u, "updates-µs")
				bm.ReportMetric(l, "launch-µs")
				bm.ReportMetric(kr, "kept-run-µs")
				bm.ReportMetric(ku, "kept-updates-µs")
				bm.ReportMetric(kl, "kept-launch-µs")
				bm.Logf("%s: auto kept %s", name, kept)
			}
		})
	}
}

// hostSteps compiles name with opts, runs it at fresh addresses until it
// is no longer probing and 10 steps more, then n measured steps, and
// returns the strategy that ran them and the p50s of Run's host time, its
// exec updates and its launch.
func hostSteps(ctx context.Context, bm *testing.B, d *driverClock, name string, opts sg.Options, n int) (sg.Strategy, float64, float64, float64) {
	w, err := New(name, Config{})
	if err != nil {
		bm.Fatal(err)
	}
	c, exe, s, done := openRig(ctx, bm, d, w, Random, opts)
	defer done()
	var run, upd, launch []float64
	warm := -1
	for step := 0; len(run) < n; step++ {
		if step > 1000 {
			bm.Fatalf("%s: still probing after %d steps", name, step)
		}
		host := timedStep(ctx, bm, d, c, exe, s, step)
		if warm < 0 && !exe.Stats().Probing {
			warm = step + 10
		}
		if warm < 0 || step < warm {
			continue
		}
		run = append(run, us(host))
		upd = append(upd, us(d.update))
		launch = append(launch, us(d.launch))
	}
	return exe.Stats().Strategy, p50(run), p50(upd), p50(launch)
}

// openCUDABench opens the CUDA backend for a benchmark, closed when it
// ends, or skips it.
func openCUDABench(bm *testing.B) *cuda.Backend {
	b, _, err := gpu.Open("cuda", gpu.Config{})
	if err != nil {
		bm.Skipf("no CUDA here: %v", err)
	}
	bm.Cleanup(func() { b.Close() })
	cb, ok := b.(*cuda.Backend)
	if !ok {
		bm.Skipf("backend %T is not the CUDA backend", b)
	}
	return cb
}

// openRig is what the host benchmarks step: a caller of w at pat, w
// compiled with opts, its states written, and a stream; done releases them
// (the caller benchmarks two rigs in turn, not at once).
func openRig(ctx context.Context, bm *testing.B, d *driverClock, w *Workload, pat Pattern, opts sg.Options) (*Caller, *sg.Executable, gpu.Stream, func()) {
	return openRigWith(ctx, bm, d, w, pat, CallerOptions{}, opts)
}

// openRigWith is openRig with a caller made with copts.
func openRigWith(ctx context.Context, bm *testing.B, d *driverClock, w *Workload, pat Pattern, copts CallerOptions, opts sg.Options) (*Caller, *sg.Executable, gpu.Stream, func()) {
	c, err := NewCallerWith(d, 0, w, pat, 1, copts)
	if err != nil {
		bm.Fatal(err)
	}
	exe, err := compileWorkload(ctx, d, w, opts)
	if err != nil {
		c.Close()
		bm.Fatal(err)
	}
	s, err := d.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		exe.Close()
		c.Close()
		bm.Fatal(err)
	}
	return c, exe, s, func() {
		d.StreamDestroy(s)
		exe.Close()
		c.Close()
	}
}

// timedStep binds and runs step on s with d's clocks reset, waits for it,
// and returns Run's host time.
func timedStep(ctx context.Context, bm *testing.B, d *driverClock, c *Caller, exe *sg.Executable, s gpu.Stream, step int) time.Duration {
	return spannedStep(ctx, bm, d, c, exe, s, step, nil)
}

// spannedStep is timedStep with Run's span also recorded in span, when not
// nil (with the thread's clock read around it).
func spannedStep(ctx context.Context, bm *testing.B, d *driverClock, c *Caller, exe *sg.Executable, s gpu.Stream, step int, span *spanTimes) time.Duration {
	bind, err := c.Bind(step)
	if err != nil {
		bm.Fatal(err)
	}
	d.reset()
	var outs sg.Outputs
	run := func() { outs, err = exe.Run(ctx, s, bind) }
	var host time.Duration
	t0 := time.Now()
	if span != nil {
		host = span.time(run)
	} else {
		run()
		host = time.Since(t0)
	}
	if err != nil {
		bm.Fatal(err)
	}
	if err := d.StreamSynchronize(s); err != nil {
		bm.Fatal(err)
	}
	if span != nil {
		span.lat = append(span.lat, us(time.Since(t0)))
	}
	outs.Release()
	return host
}

// BenchmarkCUDAHarness times the same moving step (patch at fresh
// addresses or swapping caches) and its floor (patch, fixed buffers) under
// the ways a harness may wrap Run, from the bare one (Run, then a stream
// synchronization: BenchmarkCUDAStepHost's) to bench's own (the step timer
// gated, the outputs read back and hashed after the step), each element
// added in turn: run-µs is Run's host p50, updates-µs and launch-µs its
// exec updates and launch. Whatever bench adds to a moving step's host
// time and not to the floor's shows as a mode whose difference grows.
func BenchmarkCUDAHarness(bm *testing.B) {
	cb := openCUDABench(bm)
	ctx := context.Background()
	modes := []string{"sync", "events", "gated", "gated-digest", "gated-digest-batchsets"}
	for _, c := range []stepHostCase{{"train", "train", Config{}, Random}, {"gpt2-b1", "gpt2-decode", Config{Batch: 1}, Swap}} {
		w, err := New(c.workload, c.cfg)
		if err != nil {
			bm.Fatal(err)
		}
		for _, pat := range []Pattern{Fixed, c.moving} {
			for _, mode := range modes {
				bm.Run(fmt.Sprintf("%s/%s/%s", c.name, pat, mode), func(bm *testing.B) {
					harnessSteps(ctx, bm, &driverClock{Backend: cb}, w, pat, mode)
				})
			}
		}
	}
}

func harnessSteps(ctx context.Context, bm *testing.B, d *driverClock, w *Workload, pat Pattern, mode string) {
	copts := CallerOptions{}
	if mode == "gated-digest-batchsets" && pat == Random {
		copts.BatchSets = 10
	}
	c, exe, s, done := openRigWith(ctx, bm, d, w, pat, copts, sg.Options{Strategy: sg.StrategyPatch})
	defer done()
	timer, release, err := newStepTimer(d, 0, s, RunOptions{NoGate: mode == "events", GateWatchdog: DefaultGateWatchdog}, nil)
	if err != nil {
		bm.Fatal(err)
	}
	defer release()
	var run, upd, launch []float64
	for step := 0; bm.Loop(); step++ {
		bind, err := c.Bind(step)
		if err != nil {
			bm.Fatal(err)
		}
		var outs sg.Outputs
		d.reset()
		var host time.Duration
		if mode == "sync" {
			t0 := time.Now()
			outs, err = exe.Run(ctx, s, bind)
			host = time.Since(t0)
			if err == nil {
				err = d.StreamSynchronize(s)
			}
		} else {
			var times stepTimes
			times, err = timer.step(func() error {
				var err error
				outs, err = exe.Run(ctx, s, bind)
				return err
			})
			host = times.host
		}
		if err != nil {
			bm.Fatal(err)
		}
		u, l := d.update, d.launch
		if strings.HasPrefix(mode, "gated-digest") {
			if _, _, err := digest(ctx, exe, w, outs, nil); err != nil {
				bm.Fatal(err)
			}
		}
		outs.Release()
		if step < 10 {
			continue
		}
		run, upd, launch = append(run, us(host)), append(upd, us(u)), append(launch, us(l))
	}
	if len(run) == 0 {
		return
	}
	bm.ReportMetric(p50(run), "run-µs")
	bm.ReportMetric(p50(upd), "updates-µs")
	bm.ReportMetric(p50(launch), "launch-µs")
}
