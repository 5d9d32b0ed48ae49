package replay_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	_ "github.com/stablegraph/stablegraph/gpu/cuda"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/workload"
)

// The device strategy on a GPU. These tests skip, saying why, where CUDA
// does not open (CI), where the driver has no device-updatable nodes, and
// until the patcher is built for the GPU (kernels/cuda/gen-patcher.sh). On
// the GPU machine (docs/GPU-TESTING.md):
//
//	scripts/gpu-test build ./replay
//	scripts/gpu-test run -test.run 'DeviceCUDA' -test.bench 'DeviceCUDA' -test.benchtime 2000x

// openDeviceCUDA opens CUDA device 0 for the device strategy, or skips.
func openDeviceCUDA(tb testing.TB) gpu.Backend {
	tb.Helper()
	b, _, err := gpu.Open("cuda", gpu.Config{})
	if err != nil {
		tb.Skipf("no CUDA here: %v", err)
	}
	tb.Cleanup(func() {
		if err := b.Close(); err != nil {
			tb.Error(err)
		}
	})
	if _, err := gpu.DeviceUpdatesOf(b, 0); err != nil {
		tb.Skipf("device-side graph updates: %v", err)
	}
	p, err := b.DeviceProps(0)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := kernels.PatcherBinary(p.ComputeMajor, p.ComputeMinor); err != nil {
		tb.Skipf("the patcher: %v", err)
	}
	return b
}

// TestDeviceCUDA: mlp (the GEMMs' cuBLAS kernels flattened and moved on
// the device), chain-moving (1000 kernels, every pointer moving) and train
// with fresh addresses every step, bit for bit against eager; in the
// measured steps nothing is captured, recorded or uploaded, and by default
// nothing moves from the host (on chain-moving the patcher moves all 1000
// nodes' 2000 pointers every step); with DeviceOptions.HostLead the first
// command moves from the host every step, the rest on the device (1998
// pointers). DEVICE-STATS lines give the counters.
func TestDeviceCUDA(t *testing.T) {
	b := openDeviceCUDA(t)
	ctx := context.Background()
	const steps = 20
	for _, c := range []struct {
		name string
		cfg  workload.Config
	}{
		{"mlp", workload.Config{}},
		{"chain-moving", workload.Config{}},
		{"train", workload.Config{}},
	} {
		for _, hostLead := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/host-lead=%v", c.name, hostLead), func(t *testing.T) {
				w, err := workload.New(c.name, c.cfg)
				if err != nil {
					t.Fatal(err)
				}
				o := workload.RunOptions{Strategy: stablegraph.StrategyEager, Steps: steps, Warmup: 2, Pattern: workload.Random, WallBatches: -1}
				ref, err := workload.Run(ctx, b, w, o)
				if err != nil {
					t.Fatal(err)
				}
				o.Strategy, o.Reference, o.DeviceHostLead = stablegraph.StrategyDevice, ref.Digests, hostLead
				res, err := workload.Run(ctx, b, w, o)
				if err != nil {
					t.Fatal(err)
				}
				st := res.Stats
				t.Logf("DEVICE-STATS %s host-lead=%v: %+v; GPU p50 %.1f us, host p50 %.2f us", c.name, hostLead, st, res.Result.StepUS.P50, res.Result.HostUS.P50)
				if res.Mismatch >= 0 {
					t.Fatalf("outputs differ from eager from step %d", res.Mismatch)
				}
				hosted, pointers := int64(0), int64(2*1000*steps)
				if hostLead {
					hosted, pointers = steps, 2*999*steps
				}
				if st.Records != 0 || st.TracesCaptured != 0 || st.PatchedNodes != hosted || st.GraphUploads != 0 || st.DeviceUpdates == 0 {
					t.Errorf("measured steps: %+v; want %d nodes from the host, the rest on the device", st, hosted)
				}
				if c.name == "chain-moving" && st.DeviceUpdates != pointers {
					t.Errorf("chain-moving: %d pointers moved in %d steps, want %d", st.DeviceUpdates, steps, pointers)
				}
			})
		}
	}
}

// BenchmarkDeviceCUDA is a step of chain-moving (1000 kernels, every
// pointer moving) back to back, the buffers cycling through 64 sets
// allocated beforehand (fresh to the 16-table ring, and to any cache),
// under the device strategy and, for the floor, patch with nothing moving.
// It reports host time per step (ns/op; the allocations are the
// executable's Outputs, not the strategy's) and the GPU time per step from
// events around the batch (gpu-us/step).
//
//	.gpu/replay.test -test.run '^$' -test.bench DeviceCUDA -test.benchtime 2000x -test.count 3 -test.benchmem
func BenchmarkDeviceCUDA(bm *testing.B) {
	b := openDeviceCUDA(bm)
	ctx := context.Background()
	w, err := workload.New("chain-moving", workload.Config{})
	if err != nil {
		bm.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		strat stablegraph.Strategy
		sets  int
	}{
		{"device/fresh", stablegraph.StrategyDevice, 64},
		{"floor/fixed", stablegraph.StrategyPatch, 1},
	} {
		bm.Run(c.name, func(bm *testing.B) {
			sets := freshSets(bm, b, w, c.sets)
			s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
			if err != nil {
				bm.Fatal(err)
			}
			defer b.StreamDestroy(s)
			exe, err := stablegraph.Compile(ctx, b, w.Program, stablegraph.Options{Strategy: c.strat})
			if err != nil {
				bm.Fatal(err)
			}
			defer exe.Close()
			for i := range 3 * len(sets) { // warm up: record, every set seen
				if _, err := exe.Run(ctx, s, sets[i%len(sets)]); err != nil {
					bm.Fatal(err)
				}
			}
			var ev [2]gpu.Event
			for i := range ev {
				if ev[i], err = b.EventCreate(0, gpu.EventDefault); err != nil {
					bm.Fatal(err)
				}
				defer b.EventDestroy(ev[i])
			}
			if err := b.StreamSynchronize(s); err != nil {
				bm.Fatal(err)
			}
			if err := b.EventRecord(ev[0], s); err != nil {
				bm.Fatal(err)
			}
			bm.ReportAllocs()
			i := 0
			for bm.Loop() {
				if _, err := exe.Run(ctx, s, sets[i%len(sets)]); err != nil {
					bm.Fatal(err)
				}
				i++
			}
			if err := b.EventRecord(ev[1], s); err != nil {
				bm.Fatal(err)
			}
			if err := b.EventSynchronize(ev[1]); err != nil {
				bm.Fatal(err)
			}
			d, err := b.EventElapsed(ev[0], ev[1])
			if err != nil {
				bm.Fatal(err)
			}
			bm.ReportMetric(float64(d.Nanoseconds())/1e3/float64(i), "gpu-us/step")
		})
	}
}

// freshSets allocates n sets of w's params and outputs, each buffer at its
// own address, freed at cleanup.
func freshSets(tb testing.TB, b gpu.Backend, w *workload.Workload, n int) []stablegraph.Bindings {
	tb.Helper()
	var sets []stablegraph.Bindings
	for i := range n {
		set := stablegraph.Bindings{}
		for _, buf := range append(append([]stablegraph.Buffer(nil), w.Params...), w.Outputs...) {
			p, err := b.MemAlloc(0, uint64(buf.Size()))
			if err != nil {
				tb.Fatalf("set %d: %v", i, err)
			}
			tb.Cleanup(func() { b.MemFree(p) })
			set[buf] = p
		}
		sets = append(sets, set)
	}
	return sets
}

// TestDevicePartialMovesCUDA is TestDevicePartialMoves on the GPU: by
// default, and with a host-side exec update of the first command's nodes
// (HostLead: not device-updatable), which leaves what the patcher set in
// the others, with no upload.
func TestDevicePartialMovesCUDA(t *testing.T) {
	devicePartialMoves(t, openDeviceCUDA(t))
}
