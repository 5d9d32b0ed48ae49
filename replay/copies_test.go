package replay_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/internal/steptest"
	"github.com/stablegraph/stablegraph/workload"
)

// persistentVariants are the option sets the persistent-address strategies
// are tested under.
func persistentVariants() []struct {
	name string
	opts stablegraph.Options
} {
	v := []struct {
		name string
		opts stablegraph.Options
	}{
		{"stable", stablegraph.Options{Strategy: stablegraph.StrategyStable}},
		{"stable-stream-copies", stablegraph.Options{Strategy: stablegraph.StrategyStable, StrategyOptions: stablegraph.StrategyOptions{Copies: stablegraph.CopyOptions{OnStream: true}}}},
		{"auto", stablegraph.Options{Strategy: stablegraph.StrategyAuto}},
		{"auto-probe-1", stablegraph.Options{Strategy: stablegraph.StrategyAuto, StrategyOptions: stablegraph.StrategyOptions{Auto: stablegraph.AutoOptions{ProbeSteps: 1}}}},
		{"auto-model", stablegraph.Options{Strategy: stablegraph.StrategyAuto, StrategyOptions: stablegraph.StrategyOptions{Auto: stablegraph.AutoOptions{ProbeSteps: -1}}}},
		{"auto-zero-copy", stablegraph.Options{Strategy: stablegraph.StrategyAuto, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{ZeroCopyOutputs: true}}}},
	}
	for n := 1; n <= 3; n++ {
		v = append(v,
			struct {
				name string
				opts stablegraph.Options
			}{fmt.Sprintf("pool-%d", n), stablegraph.Options{Strategy: stablegraph.StrategyPool, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: n}}}},
			struct {
				name string
				opts stablegraph.Options
			}{fmt.Sprintf("pool-%d-zero-copy", n), stablegraph.Options{Strategy: stablegraph.StrategyPool, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: n, ZeroCopyOutputs: true}}}})
	}
	v = append(v, struct {
		name string
		opts stablegraph.Options
	}{"pool-2-stream-copies", stablegraph.Options{Strategy: stablegraph.StrategyPool, StrategyOptions: stablegraph.StrategyOptions{Copies: stablegraph.CopyOptions{OnStream: true}}}})
	return v
}

// TestPersistentMatchEagerOnWorkloads is the acceptance check of stable,
// pool (1, 2 and 3 slots, copied and zero-copy outputs) and auto: on mlp,
// train and chain, with params and outputs moving every step, every output
// and the final states equal eager's bit for bit, and once warm (each pool
// slot used once) a step records, captures, patches and updates nothing:
// it launches one graph and, when the caller's buffers moved, updates only
// copy nodes.
func TestPersistentMatchEagerOnWorkloads(t *testing.T) {
	// Enough for auto to probe its four candidates (43 steps by default)
	// and then run the one it kept; for stable and pool, every slot used
	// once and then a few steady steps.
	const steps, fewSteps = 48, 7
	workloads := []struct {
		name string
		cfg  workload.Config
	}{
		{"mlp", workload.Config{Layers: 3, Width: 32, Batch: 4}},
		{"train", workload.Config{Layers: 3, Width: 32, Batch: 4}},
		{"chain", workload.Config{K: 40, N: 64}},
	}
	for _, wc := range workloads {
		t.Run(wc.name, func(t *testing.T) {
			w := steptest.MustWorkload(t, wc.name, wc.cfg)
			for _, pattern := range []workload.Pattern{workload.PingPong, workload.Random} {
				t.Run(string(pattern), func(t *testing.T) {
					b := simtest.New(t, 1)
					eager := stablegraph.Options{Strategy: stablegraph.StrategyEager}
					want := steptest.RunWorkload(t, b, w, eager, pattern, steps, false)
					wantFew := steptest.RunWorkload(t, b, w, eager, pattern, fewSteps, false)
					for _, v := range persistentVariants() {
						t.Run(v.name, func(t *testing.T) {
							n, want := steps, want
							if v.opts.Strategy != stablegraph.StrategyAuto {
								n, want = fewSteps, wantFew
							}
							got := steptest.RunWorkload(t, b, w, v.opts, pattern, n, false)
							steptest.SameResults(t, got, want)
							checkSteadyState(t, got, v.opts)
							for i, st := range got.Steps {
								if v.opts.Pool.ZeroCopyOutputs && (st.Stats.Strategy == stablegraph.StrategyPool) != st.Leased {
									t.Fatalf("step %d: leased=%v under %s with zero-copy outputs", i, st.Leased, st.Stats.Strategy)
								}
							}
						})
					}
				})
			}
		})
	}
}

// checkSteadyState checks what a persistent-address strategy did once warm.
func checkSteadyState(t *testing.T, r steptest.WorkloadRun, opts stablegraph.Options) {
	t.Helper()
	stats := make([]stablegraph.Stats, len(r.Steps))
	for i, st := range r.Steps {
		stats[i] = st.Stats
	}
	final := stats[len(stats)-1]
	warm := 1
	if final.Strategy == stablegraph.StrategyPool {
		warm = opts.Pool.Slots
		if warm == 0 {
			warm = 2 // the default
		}
	}
	if opts.Strategy == stablegraph.StrategyAuto {
		// Probing warmed every candidate: steady state starts at the step
		// that runs the one kept.
		warm = len(stats)
		for i, st := range stats {
			if !st.Probing {
				warm = i
				break
			}
		}
		if warm == 0 && r.First.Probing {
			t.Errorf("auto decided before the first step")
		}
		if warm >= len(stats)-1 {
			t.Errorf("auto still probing after %d steps", len(stats))
			return
		}
		if warm == 0 {
			warm = 1
		}
		// The step that runs the kept one first also counts the graphs it
		// recorded while probing, which it holds: from the next on, a
		// step records nothing.
		if r.First.Probing {
			if last := stats[warm].Last; last.Records < 1 || last.Rerecords != 0 {
				t.Errorf("auto kept %s; the first step it ran counted %+v, not the graphs recorded while probing", final.Strategy, last)
			}
			warm++
		}
	}
	d := final.Counters.Sub(stats[warm-1].Counters)
	n := int64(len(stats) - warm)
	if final.Strategy == stablegraph.StrategyPatch {
		// Auto chose patch (on these small programs the copies cost more
		// than the few nodes to patch): patching is its steady state, but
		// never a record or a capture.
		if d.Records != 0 || d.Rerecords != 0 || d.TracesCaptured != 0 || d.GraphLaunches != n || d.BytesCopied != 0 {
			t.Errorf("auto chose patch; steady state: %+v", d)
		}
		return
	}
	if final.Strategy == stablegraph.StrategyDevice {
		// Auto chose device: pointers move on the device, the first
		// command's from the host (at most a GEMM's two nodes a step);
		// never a record, a capture or an upload.
		if d.Records != 0 || d.Rerecords != 0 || d.TracesCaptured != 0 || d.GraphLaunches != n || d.BytesCopied != 0 ||
			d.PatchedNodes > 2*n || d.GraphUploads != 0 || d.DeviceUpdates == 0 {
			t.Errorf("auto chose device; steady state: %+v", d)
		}
		return
	}
	if d.Records != 0 || d.Rerecords != 0 || d.PatchedNodes != 0 || d.GraphUpdates != 0 || d.UpdateFallbacks != 0 ||
		d.TracesCaptured != 0 || d.TracesSynthesized != 0 || d.GraphLaunches != n {
		t.Errorf("%s, steady state: %+v; want only %d graph launches and copies", final.Strategy, d, n)
	}
	switch final.Strategy {
	case stablegraph.StrategyStable, stablegraph.StrategyPool:
		if d.BytesCopied == 0 {
			t.Errorf("%s copied nothing", final.Strategy)
		}
		if (final.Strategy == stablegraph.StrategyPool) != (d.TimelineWrites == n) {
			t.Errorf("%s: %d timeline writes over %d steps", final.Strategy, d.TimelineWrites, n)
		}
		if opts.Copies.OnStream {
			if d.CopyNodeUpdates != 0 || d.Launches == 0 {
				t.Errorf("stream copies: %d copy node updates, %d copies launched", d.CopyNodeUpdates, d.Launches)
			}
		} else if d.Launches != 0 {
			t.Errorf("copies in the graph, but %d other launches", d.Launches)
		}
	}
}

// TestPersistentDefaultShapes runs stable, pool and auto at the workloads'
// default shapes (chain of 1000 kernels, width 256) for a few steps; train
// at its default width and batch over two of its eight layers, since its
// backward GEMMs at eight made this most of the package's time on sim.
func TestPersistentDefaultShapes(t *testing.T) {
	if testing.Short() {
		t.Skip("default shapes are slow on sim")
	}
	const steps = 4
	for _, name := range []string{"mlp", "train", "chain"} {
		t.Run(name, func(t *testing.T) {
			b := simtest.New(t, 1)
			var cfg workload.Config
			if name == "train" {
				cfg.Layers = 2
			}
			w := steptest.MustWorkload(t, name, cfg)
			want := steptest.RunWorkload(t, b, w, stablegraph.Options{Strategy: stablegraph.StrategyEager}, workload.Random, steps, false)
			for _, st := range []stablegraph.Strategy{stablegraph.StrategyStable, stablegraph.StrategyPool, stablegraph.StrategyAuto} {
				t.Run(string(st), func(t *testing.T) {
					got := steptest.RunWorkload(t, b, w, stablegraph.Options{Strategy: st}, workload.Random, steps, false)
					steptest.SameResults(t, got, want)
					if testing.Verbose() {
						t.Logf("auto: %s", got.Final.Reason)
					}
				})
			}
		})
	}
}

// TestWorkloadBenchIncludesNewStrategies runs the bench driver's path
// (workload.Bench over stablegraph.Strategies()) and expects the new
// strategies in the report, matching eager, with their memory visible.
func TestWorkloadBenchIncludesNewStrategies(t *testing.T) {
	b := simtest.New(t, 1)
	w := steptest.MustWorkload(t, "mlp", workload.Config{Layers: 2, Width: 16, Batch: 2})
	rep, err := workload.Bench(context.Background(), b, w, nil, workload.RunOptions{Steps: 4, Pattern: workload.Random, WallBatches: 1, WallBatchSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var patchPeak, poolPeak uint64
	for _, r := range rep.Results {
		seen[r.Strategy] = true
		if !r.OutputsMatchEager {
			t.Errorf("%s: outputs do not match eager (%s)", r.Strategy, r.Note)
		}
		switch r.Strategy {
		case "patch":
			patchPeak = r.PeakDeviceBytes
		case "pool":
			poolPeak = r.PeakDeviceBytes
		}
	}
	for _, st := range []string{"stable", "pool", "auto"} {
		if !seen[st] {
			t.Errorf("bench has no %s row", st)
		}
	}
	// Two 2 MiB slots: the pool's memory price must show.
	if poolPeak < patchPeak+2*(2<<20) {
		t.Errorf("peak device bytes: pool %d, patch %d; the slots are not counted", poolPeak, patchPeak)
	}
}

// TestMemoryAccounting: stable counts its persistent copies, pool its
// slots, and Total sums everything.
func TestMemoryAccounting(t *testing.T) {
	ctx := context.Background()
	b := simtest.New(t, 1)
	w := steptest.NewMLP(2, 8, 2, 10, 3)
	for _, c := range []struct {
		opts       stablegraph.Options
		persistent uint64
		slots      uint64
	}{
		{stablegraph.Options{Strategy: stablegraph.StrategyPatch}, 0, 0},
		// x, x2, y, z, m, ycopy, each rounded to 256.
		{stablegraph.Options{Strategy: stablegraph.StrategyStable}, 6 * 256, 0},
		{stablegraph.Options{Strategy: stablegraph.StrategyPool, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: 3}}}, 0, 3 * (2 << 20)},
	} {
		exe, err := stablegraph.Compile(ctx, b, w.P, c.opts)
		if err != nil {
			t.Fatal(err)
		}
		m := exe.Memory()
		if m.Persistent != c.persistent || m.Slots != c.slots || m.Total() != m.States+m.Constants+m.Temps+c.persistent+c.slots {
			t.Errorf("%s: %+v (total %d); want persistent %d, slots %d", c.opts.Strategy, m, m.Total(), c.persistent, c.slots)
		}
		if c.opts.Strategy == stablegraph.StrategyPool && m.SlotCount != 3 {
			t.Errorf("%d slots", m.SlotCount)
		}
		if err := exe.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStableCloseReportsFailedFree: a free that fails at Close is reported,
// not swallowed, and the other frees still happen.
func TestStableCloseReportsFailedFree(t *testing.T) {
	ctx := context.Background()
	// Not simtest.New: the allocation whose free fails stays live by
	// definition.
	b, err := sim.New(sim.Config{Devices: 1, DeviceMemory: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	w := steptest.NewMLP(2, 8, 1, 8, 2)
	exe, err := stablegraph.Compile(ctx, b, w.P, stablegraph.Options{Strategy: stablegraph.StrategyStable})
	if err != nil {
		t.Fatal(err)
	}
	b.InjectFault("MemFree", 0, nil)
	if err := exe.Close(); !errors.Is(err, gpu.ErrInjected) {
		t.Fatalf("Close with a failing free = %v", err)
	}
	b.ClearFaults()
	if live := b.LiveHandles(); live != (gpu.HandleCounts{Allocations: 1}) {
		t.Fatalf("live after one failed free: %s; want exactly that allocation", live)
	}
}
