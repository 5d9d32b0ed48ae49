package workload

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/bfc"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/report"
)

// openRaw opens a sim and checks, at the end of the test, that nothing is
// left live and that Close is clean.
func openRaw(t *testing.T) *sim.Backend {
	t.Helper()
	b, err := sim.New(sim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c := b.LiveHandles(); !c.IsZero() {
			t.Errorf("live handles after the test: %v", c)
		}
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

// slowHost is the sim behind a host that spends delay in every launch call
// before the launch: a strategy whose host work precedes its launch (the
// patch strategy's per-node updates, on a GPU).
type slowHost struct {
	*sim.Backend
	delay time.Duration
}

func (b slowHost) LaunchKernel(f gpu.Function, cfg gpu.LaunchConfig, args []gpu.Arg, s gpu.Stream) error {
	time.Sleep(b.delay)
	return b.Backend.LaunchKernel(f, cfg, args, s)
}

func (b slowHost) GraphLaunch(x gpu.GraphExec, s gpu.Stream) error {
	time.Sleep(b.delay)
	return b.Backend.GraphLaunch(x, s)
}

// blockingHost is the sim behind a host that waits for the stream after
// every launch: a strategy that blocks on its stream inside Run, which
// would wait behind the gate for ever but for the watchdog.
type blockingHost struct{ *sim.Backend }

func (b blockingHost) LaunchKernel(f gpu.Function, cfg gpu.LaunchConfig, args []gpu.Arg, s gpu.Stream) error {
	if err := b.Backend.LaunchKernel(f, cfg, args, s); err != nil {
		return err
	}
	return b.StreamSynchronize(s)
}

func (b blockingHost) GraphLaunch(x gpu.GraphExec, s gpu.Stream) error {
	if err := b.Backend.GraphLaunch(x, s); err != nil {
		return err
	}
	return b.StreamSynchronize(s)
}

// noWaits is the sim behind a wrapper that shows only gpu.Backend: no
// stream waits, so no gate.
type noWaits struct{ gpu.Backend }

// TestGatedGPUTimeExcludesHost: with the gate, a step whose host spends
// tens of milliseconds before its launches has a GPU time of the sim's work
// alone, far below its host time, and a latency at least its GPU time and
// about its host time; without it (NoGate) the GPU time is the latency, host
// time included. A host call of 300 ms (three launches of 100 ms: a busy
// machine's) is not released by the watchdog, which used to fire after
// 200 ms and fold the host time into the GPU time.
func TestGatedGPUTimeExcludesHost(t *testing.T) {
	raw := openRaw(t)
	w := small(t, "mlp")
	for _, tc := range []struct {
		strat sg.Strategy
		delay time.Duration
	}{{sg.StrategyEager, 10 * time.Millisecond}, {sg.StrategyPatch, 10 * time.Millisecond}, {sg.StrategyEager, 100 * time.Millisecond}} {
		strat, delay := tc.strat, tc.delay
		b := slowHost{raw, delay}
		t.Run(fmt.Sprintf("%s/%v", strat, delay), func(t *testing.T) {
			res, err := Run(context.Background(), b, w, RunOptions{Strategy: strat, Steps: 3, Warmup: 1, Pattern: Random, WallBatches: -1})
			if err != nil {
				t.Fatal(err)
			}
			r := res.Result
			if r.GPUTiming != report.GPUTimingGated || r.LatencyUS == nil || len(r.LatencySamplesUS) != 3 {
				t.Fatalf("timing %q, latency %v (%d samples); want gated, 3 samples", r.GPUTiming, r.LatencyUS, len(r.LatencySamplesUS))
			}
			for i := range r.StepSamplesUS {
				gpuUS, lat, host := r.StepSamplesUS[i], r.LatencySamplesUS[i], r.HostSamplesUS[i]
				if host < us(delay) || lat < gpuUS || lat < 0.9*host || gpuUS > host/2 {
					t.Errorf("step %d: GPU %.0f µs, latency %.0f µs, host %.0f µs: want GPU ≤ latency, GPU well below host (≥ %v), latency about host or more",
						i, gpuUS, lat, host, delay)
				}
			}
			if strings.Contains(r.Note, "not gated") || strings.Contains(r.Note, "watchdog") {
				t.Errorf("note %q", r.Note)
			}

			ungated, err := Run(context.Background(), b, w, RunOptions{Strategy: strat, Steps: 3, Warmup: 1, Pattern: Random, WallBatches: -1, NoGate: true})
			if err != nil {
				t.Fatal(err)
			}
			u := ungated.Result
			if u.GPUTiming != report.GPUTimingEvents || !strings.Contains(u.Note, "GPU time not gated (RunOptions.NoGate)") {
				t.Errorf("NoGate: timing %q, note %q", u.GPUTiming, u.Note)
			}
			for i := range u.StepSamplesUS {
				if u.StepSamplesUS[i] != u.LatencySamplesUS[i] || u.StepSamplesUS[i] < 0.9*u.HostSamplesUS[i] {
					t.Errorf("NoGate step %d: GPU %.0f µs, latency %.0f µs, host %.0f µs: want GPU = latency ≥ host",
						i, u.StepSamplesUS[i], u.LatencySamplesUS[i], u.HostSamplesUS[i])
				}
			}
		})
	}
}

// TestGatedLatencyOnSim: on the sim's plain model, every step's latency is
// at least its GPU time, in every strategy's row of a bench.
func TestGatedLatencyOnSim(t *testing.T) {
	b := openSim(t)
	rep, err := Bench(context.Background(), b, small(t, "train"), nil, RunOptions{Steps: 4, Warmup: 1, Pattern: Random, WallBatches: 1, WallBatchSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		if r.GPUTiming != report.GPUTimingGated || len(r.LatencySamplesUS) != len(r.StepSamplesUS) {
			t.Errorf("%s: timing %q, %d latency samples for %d steps", r.Strategy, r.GPUTiming, len(r.LatencySamplesUS), len(r.StepSamplesUS))
			continue
		}
		for i, g := range r.StepSamplesUS {
			if l := r.LatencySamplesUS[i]; l < g || g <= 0 {
				t.Errorf("%s step %d: latency %v µs, GPU %v µs", r.Strategy, i, l, g)
			}
		}
	}
}

// TestGateWatchdog: a Run that waits on its own stream behind the gate is
// released by the watchdog, the steps complete with the right outputs, and
// the note counts the measured steps it released.
func TestGateWatchdog(t *testing.T) {
	const dog = 20 * time.Millisecond
	raw := openRaw(t)
	w := small(t, "chain")
	ref, err := Run(context.Background(), raw, w, RunOptions{Steps: 2, Warmup: 1, WallBatches: -1})
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(context.Background(), blockingHost{raw}, w, RunOptions{Strategy: sg.StrategyPatch, Steps: 2, Warmup: 1,
		WallBatches: -1, GateWatchdog: dog, Reference: ref.Digests})
	if err != nil {
		t.Fatal(err)
	}
	r := res.Result
	if !r.OutputsMatchEager || !strings.Contains(r.Note, fmt.Sprintf("2 of 2 measured steps (0, 1) released by the watchdog after %v", dog)) ||
		!strings.Contains(r.Note, "so does the GPU column: every step was released") || !slices.Equal(res.Released, []int{0, 1}) {
		t.Errorf("match %v, released %v, note %q", r.OutputsMatchEager, res.Released, r.Note)
	}
	for i, l := range r.LatencySamplesUS {
		if l < us(dog) {
			t.Errorf("step %d released by the watchdog after %v: latency %v µs", i, dog, l)
		}
	}
}

// blockOnce is the sim behind a host that waits for the stream after
// every launch while block is set: a Run that waits on its stream in one
// chosen step only.
type blockOnce struct {
	*sim.Backend
	block *atomic.Bool
}

func (b blockOnce) LaunchKernel(f gpu.Function, cfg gpu.LaunchConfig, args []gpu.Arg, s gpu.Stream) error {
	if err := b.Backend.LaunchKernel(f, cfg, args, s); err != nil || !b.block.Load() {
		return err
	}
	return b.StreamSynchronize(s)
}

func (b blockOnce) GraphLaunch(x gpu.GraphExec, s gpu.Stream) error {
	if err := b.Backend.GraphLaunch(x, s); err != nil || !b.block.Load() {
		return err
	}
	return b.StreamSynchronize(s)
}

// TestGateWatchdogMarksReleasedSteps: a step that the watchdog (at its
// default, generous room) had to release is not averaged in silently: it
// is marked in RunResult.Released, named in the note, and left out of the
// GPU percentiles, while its GPU sample is kept in the samples; the other
// steps are not marked. The step that blocks is chosen by count (the one
// after the first measured step), so the answer does not depend on timing.
func TestGateWatchdogMarksReleasedSteps(t *testing.T) {
	raw := openRaw(t)
	var block atomic.Bool
	const warmup, steps, blocked = 1, 4, 1 // the measured step that blocks
	res, err := Run(context.Background(), blockOnce{raw, &block}, small(t, "mlp"), RunOptions{Strategy: sg.StrategyPatch,
		Steps: steps, Warmup: warmup, WallBatches: -1,
		Progress: func(_ sg.Strategy, done, _ int) { block.Store(done == warmup+blocked) }})
	if err != nil {
		t.Fatal(err)
	}
	r := res.Result
	if !slices.Equal(res.Released, []int{blocked}) {
		t.Fatalf("released %v, want [%d]; note %q", res.Released, blocked, r.Note)
	}
	want := fmt.Sprintf("1 of %d measured steps (%d) released by the watchdog after %v", steps, blocked, DefaultGateWatchdog)
	if !strings.Contains(r.Note, want) || !strings.Contains(r.Note, "left out of the GPU column") {
		t.Errorf("note %q, want %q", r.Note, want)
	}
	var kept []float64
	for i, v := range r.StepSamplesUS {
		if i != blocked {
			kept = append(kept, v)
		}
	}
	if len(r.StepSamplesUS) != steps || r.StepUS != report.Summarize(kept) {
		t.Errorf("GPU %+v over %d samples, want the percentiles of %v (the released step's left out)", r.StepUS, len(r.StepSamplesUS), kept)
	}
	if l := r.LatencySamplesUS[blocked]; l < us(DefaultGateWatchdog) {
		t.Errorf("the released step's latency %v µs, below the watchdog's %v", l, DefaultGateWatchdog)
	}
}

// TestGateFallback: a backend without stream waits is timed as before,
// and the row says so.
func TestGateFallback(t *testing.T) {
	raw := openRaw(t)
	res, err := Run(context.Background(), noWaits{raw}, small(t, "mlp"), RunOptions{Strategy: sg.StrategyPatch, Steps: 2, WallBatches: -1})
	if err != nil {
		t.Fatal(err)
	}
	r := res.Result
	if r.GPUTiming != report.GPUTimingEvents || !strings.Contains(r.Note, "GPU time not gated (StreamWaitsOf: gpu: not supported: backend sim has no stream waits") {
		t.Errorf("timing %q, note %q", r.GPUTiming, r.Note)
	}
	if r.LatencyUS == nil || *r.LatencyUS != r.StepUS {
		t.Errorf("latency %v, GPU %v: ungated, they are the same measurement", r.LatencyUS, r.StepUS)
	}
}

// TestRunTimingFaults fails, in turn, each call of the timing's entry
// points that Run makes: every failure is an error that wraps it, Run
// never hangs behind a closed gate, and nothing is left live.
func TestRunTimingFaults(t *testing.T) {
	raw := openRaw(t)
	w := small(t, "mlp")
	opts := RunOptions{Strategy: sg.StrategyPatch, Steps: 2, Pattern: Random, WallBatches: 1, WallBatchSize: 2}
	for _, op := range []string{"StreamWaitsSupported", "HostAlloc", "EventCreate", "StreamWaitValue64", "EventRecord",
		"EventSynchronize", "EventElapsed", "StreamSynchronize"} {
		for nth := 0; ; nth++ {
			raw.ClearFaults()
			raw.InjectFault(op, nth, nil)
			before := raw.Calls(op)
			_, err := Run(context.Background(), raw, w, opts)
			calls := raw.Calls(op) - before
			if live := raw.LiveHandles(); !live.IsZero() {
				t.Fatalf("%s call %d failed: live handles %v after Run", op, nth, live)
			}
			if nth >= calls {
				if err != nil {
					t.Fatalf("%s: no fault at call %d of %d, yet: %v", op, nth, calls, err)
				}
				if calls == 0 {
					t.Errorf("Run never calls %s", op)
				}
				break
			}
			if !errors.Is(err, gpu.ErrInjected) {
				t.Errorf("%s call %d failed, Run said %v", op, nth, err)
			}
		}
	}
	raw.ClearFaults()
}

// TestBindBatch: a batch binds every step to buffers of its own, distinct
// from every other step's and from the steps before, with that step's
// inputs written; release frees them all; the next batch moves again. A
// caller that cannot is refused with ErrNoBatch, and a failing input write
// leaves nothing of the batch allocated.
func TestBindBatch(t *testing.T) {
	for _, remap := range []bool{false, true} {
		t.Run(fmt.Sprintf("remappable=%v", remap), func(t *testing.T) {
			raw := openRaw(t)
			w := small(t, "mlp")
			c, err := NewCallerWith(raw, 0, w, Random, 1, CallerOptions{Remappable: remap, BatchSets: 4})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := c.Close(); err != nil {
					t.Error(err)
				}
			}()
			// live is what the caller holds beyond its fillers: bfc
			// allocations, or the sim's chunks for a remappable caller.
			live := func() int {
				if remap {
					return raw.LiveHandles().Chunks
				}
				return c.alloc.(*bfc.Allocator).Stats().Allocations - len(c.filler)
			}
			prev, err := c.Bind(0)
			if err != nil {
				t.Fatal(err)
			}
			seen := map[gpu.DevicePtr]bool{}
			for _, p := range prev {
				seen[p] = true
			}
			for batch := range 3 {
				first := 1 + 4*batch
				binds, release, err := c.BindBatch(first, 4)
				if err != nil {
					t.Fatal(err)
				}
				if got, want := live(), 4*len(w.buffers()); got != want {
					t.Errorf("batch %d: %d live, want the batch's %d buffers alone", batch, got, want)
				}
				inBatch := map[gpu.DevicePtr]bool{}
				for i, bind := range binds {
					for buf, p := range bind {
						if inBatch[p] {
							t.Errorf("batch %d step %d: %s at %#x, an address another step of the batch holds", batch, i, buf.Name(), uint64(p))
						}
						inBatch[p] = true
					}
					for j, buf := range w.Params {
						got := make([]byte, buf.Size())
						if err := raw.MemcpyDtoH(got, bind[buf]); err != nil {
							t.Fatal(err)
						}
						if string(got) != string(w.Input(first+i, j)) {
							t.Errorf("batch %d step %d: %s does not hold the step's input", batch, i, buf.Name())
						}
					}
				}
				moved := 0
				for p := range inBatch {
					if !seen[p] {
						moved++
					}
					seen[p] = true
				}
				if moved == 0 {
					t.Errorf("batch %d: every address was used before", batch)
				}
				if err := release(); err != nil {
					t.Fatal(err)
				}
				if got := live(); got != 0 {
					t.Errorf("batch %d: %d left live after release", batch, got)
				}
			}

			// A failing input write (each in turn) leaves nothing behind.
			for nth := range 3 {
				raw.InjectFault("MemcpyHtoD", nth, nil)
				if _, _, err := c.BindBatch(20, 4); !errors.Is(err, gpu.ErrInjected) {
					t.Errorf("input write %d failing: %v", nth, err)
				}
				raw.ClearFaults()
				if got := live(); got != 0 {
					t.Errorf("input write %d failing: %d left live", nth, got)
				}
			}
			if _, _, err := c.BindBatch(20, 0); err == nil {
				t.Error("a batch of 0 steps was bound")
			}
		})
	}
	raw := openRaw(t)
	pp, err := NewCaller(raw, 0, small(t, "mlp"), PingPong, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer pp.Close()
	if _, _, err := pp.BindBatch(0, 2); !errors.Is(err, ErrNoBatch) {
		t.Errorf("pingpong: %v", err)
	}
	gpt, err := NewCaller(raw, 0, tinyGPT2(t, Config{Batch: 2, Layers: 1}), Random, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer gpt.Close()
	if _, _, err := gpt.BindBatch(0, 2); !errors.Is(err, ErrNoBatch) {
		t.Errorf("gpt2-decode: %v", err)
	}
}

// TestWallAtFreshAddressesGPT2: gpt2-decode's sequences cannot bind a batch
// ahead, so its random rows have no wall time and say why.
func TestWallAtFreshAddressesGPT2(t *testing.T) {
	b := openSim(t)
	res, err := Run(context.Background(), b, tinyGPT2(t, Config{Batch: 2, Layers: 1}), RunOptions{Steps: 2, Pattern: Random})
	if err != nil {
		t.Fatal(err)
	}
	if res.Result.WallUS != nil || !strings.Contains(res.Result.Note, "no wall time at fresh addresses") {
		t.Errorf("wall %v, note %q", res.Result.WallUS, res.Result.Note)
	}
}
