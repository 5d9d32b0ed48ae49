package cuda_test

import (
	"context"
	"fmt"
	"maps"
	"testing"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda"
	"github.com/stablegraph/stablegraph/workload"
)

// The host side of a moving step through the real CUDA backend, with the
// driver stubbed (cuda.OpenHostStub): what Executable.Run costs the host
// and allocates when buffers move, under patch and device, with no GPU.
// On a GPU the driver's own time comes on top (BenchmarkCUDAStepHost in
// package workload; stablegraph bench-driver's per-node rows).

// stubSteps is a compiled workload over the host stub with bindings for
// sets steps prepared ahead (fresh addresses each, for Random).
type stubSteps struct {
	exe   *sg.Executable
	s     gpu.Stream
	binds []sg.Bindings
	calls func(string) int64
}

// sets is how many binding sets a stubSteps cycles through: enough that no
// address set comes back before the tracer's caches have forgotten it.
const sets = 64

func newStubSteps(tb testing.TB, name string, cfg workload.Config, st sg.Strategy, pat workload.Pattern) *stubSteps {
	return newStubStepsWith(tb, name, cfg, sg.Options{Strategy: st}, pat)
}

func newStubStepsWith(tb testing.TB, name string, cfg workload.Config, opts sg.Options, pat workload.Pattern) *stubSteps {
	tb.Helper()
	b, calls := cuda.OpenHostStub(tb)
	ctx := context.Background()
	w, err := workload.New(name, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	c, err := workload.NewCaller(b, 0, w, pat, 1)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := c.Close(); err != nil {
			tb.Error(err)
		}
	})
	exe, err := sg.Compile(ctx, b, w.Program, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := exe.Close(); err != nil {
			tb.Error(err)
		}
	})
	for _, s := range w.States {
		if err := exe.WriteBuffer(ctx, s.Buffer, s.Data); err != nil {
			tb.Fatal(err)
		}
	}
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { b.StreamDestroy(s) })
	e := &stubSteps{exe: exe, s: s, calls: calls}
	for i := range sets {
		bind, err := c.Bind(i)
		if err != nil {
			tb.Fatal(err)
		}
		e.binds = append(e.binds, bind)
	}
	// Warm up: record, prove the templates, prepare the moving nodes.
	for i := range 4 {
		e.step(tb, i)
	}
	return e
}

func (e *stubSteps) step(tb testing.TB, i int) {
	outs, err := e.exe.Run(context.Background(), e.s, e.binds[i%len(e.binds)])
	if err != nil {
		tb.Fatal(err)
	}
	outs.Release()
}

// stubCases are the workloads of the host-path benchmarks and tests.
var stubCases = []struct {
	name string
	cfg  workload.Config
	pat  workload.Pattern
}{
	{"mlp", workload.Config{}, workload.Random},
	{"train", workload.Config{}, workload.Random},
	{"chain-moving", workload.Config{}, workload.Random},
	{"gpt2-decode-tiny", workload.Config{}, workload.Swap},
	{"mlp", workload.Config{}, workload.Fixed},
}

// stubBenchCases are stubCases and GPT-2 small at batch 1 and 8 (the
// bench's gpt2-b1-swap and gpt2-b8-random rows and their floors), too slow
// to build for every test.
var stubBenchCases = append(stubCases[:len(stubCases):len(stubCases)], []struct {
	name string
	cfg  workload.Config
	pat  workload.Pattern
}{
	{"gpt2-decode", workload.Config{Batch: 1}, workload.Swap},
	{"gpt2-decode", workload.Config{Batch: 1}, workload.Fixed},
	{"gpt2-decode", workload.Config{Batch: 8, Positions: 256}, workload.Random},
	{"gpt2-decode", workload.Config{Batch: 8, Positions: 256}, workload.Fixed},
	{"mlp-large", workload.Config{}, workload.Random},
	{"mlp-large", workload.Config{}, workload.Fixed},
}...)

// stubHostWays are the ways the stub benchmarks move a step: patch, and
// device without the ring of tables (device's default), which the stub's
// missing patcher would fill; the cold benchmark takes the first two.
var stubHostWays = []struct {
	name string
	opts sg.Options
}{
	{"patch", sg.Options{Strategy: sg.StrategyPatch}},
	{"device-inline", sg.Options{Strategy: sg.StrategyDevice,
		StrategyOptions: sg.StrategyOptions{DeviceStrategy: sg.DeviceOptions{Inline: true}}}},
	{"device-inline-host-lead", sg.Options{Strategy: sg.StrategyDevice,
		StrategyOptions: sg.StrategyOptions{DeviceStrategy: sg.DeviceOptions{Inline: true, HostLead: true}}}},
}

// caseName names a stub case in a benchmark: the workload, and its batch
// where the case sets one.
func caseName(name string, cfg workload.Config) string {
	if cfg.Batch > 0 {
		return fmt.Sprintf("%s-b%d", name, cfg.Batch)
	}
	return name
}

// BenchmarkStubStepHost is Executable.Run of a moving step over the stubbed
// driver, per workload, pattern and strategy (device also with its first
// command moved on the device): ns/op and allocs/op are the
// runtime's own host cost; the metrics say how many driver calls a step
// made (node updates, context queries, launches).
func BenchmarkStubStepHost(bm *testing.B) {
	for _, c := range stubBenchCases {
		for _, v := range stubHostWays {
			bm.Run(fmt.Sprintf("%s/%s/%s", caseName(c.name, c.cfg), c.pat, v.name), func(bm *testing.B) {
				e := newStubStepsWith(bm, c.name, c.cfg, v.opts, c.pat)
				upd0, ctx0, launch0 := e.calls("cuGraphExecKernelNodeSetParams_v2"), e.calls("cuCtxGetCurrent"), e.calls("cuGraphLaunch")
				before := e.exe.Stats().Counters
				bm.ReportAllocs()
				i := 0
				for bm.Loop() {
					e.step(bm, i)
					i++
				}
				n := float64(i)
				st := e.exe.Stats().Counters.Sub(before)
				bm.ReportMetric(float64(e.calls("cuGraphExecKernelNodeSetParams_v2")-upd0)/n, "updates/op")
				bm.ReportMetric(float64(st.PatchedNodes)/n, "nodes/op")
				bm.ReportMetric(float64(e.calls("cuCtxGetCurrent")-ctx0)/n, "ctx/op")
				bm.ReportMetric(float64(e.calls("cuGraphLaunch")-launch0)/n, "launches/op")
			})
		}
	}
}

// TestStubStepAllocatesNothing: once warm, a moving step under patch (with
// the default costs, node by node, and by whole-graph updates from its
// template) and device allocates nothing on the host, through the real
// CUDA backend code.
func TestStubStepAllocatesNothing(t *testing.T) {
	if cuda.RaceEnabled {
		t.Skip("allocation counts mean nothing under -race (sync.Pool drops what it is given)")
	}
	for _, c := range stubCases {
		for _, v := range []struct {
			name string
			opts sg.Options
		}{
			{"patch", sg.Options{Strategy: sg.StrategyPatch}},
			{"patch-nodes", sg.Options{Strategy: sg.StrategyPatch, Costs: sg.Costs{NodeUpdateUS: 0.01}}},
			{"patch-whole", sg.Options{Strategy: sg.StrategyPatch, Costs: sg.Costs{NodeUpdateUS: 1000}}},
			// Not the ring of tables (device's default), which the stub's
			// missing patcher would fill; package replay's
			// TestDeviceHostStepAllocatesNothing covers the ring on sim.
			{"device-inline", sg.Options{Strategy: sg.StrategyDevice,
				StrategyOptions: sg.StrategyOptions{DeviceStrategy: sg.DeviceOptions{Inline: true}}}},
			{"device-inline-host-lead", sg.Options{Strategy: sg.StrategyDevice,
				StrategyOptions: sg.StrategyOptions{DeviceStrategy: sg.DeviceOptions{Inline: true, HostLead: true}}}},
		} {
			t.Run(fmt.Sprintf("%s/%s/%s", c.name, c.pat, v.name), func(t *testing.T) {
				cfg := c.cfg
				if c.name == "chain-moving" {
					cfg.K = 64
				}
				e := newStubStepsWith(t, c.name, cfg, v.opts, c.pat)
				i := 0
				if n := testing.AllocsPerRun(2*sets, func() { e.step(t, i); i++ }); n != 0 {
					t.Errorf("%v allocations per step", n)
				}
			})
		}
	}
}

// TestStubPatchOneDriverCallPerMovedNode: a moving patch step node by node
// (the costs price node updates below a whole-graph update) makes one exec
// update per moved node, makes the context current a fixed number of times
// whatever moves, and launches once.
func TestStubPatchOneDriverCallPerMovedNode(t *testing.T) {
	e := newStubStepsWith(t, "chain-moving", workload.Config{K: 64},
		sg.Options{Strategy: sg.StrategyPatch, Costs: sg.Costs{NodeUpdateUS: 0.01}}, workload.Random)
	for i := range 8 {
		upd, ctx, launch := e.calls("cuGraphExecKernelNodeSetParams_v2"), e.calls("cuCtxGetCurrent"), e.calls("cuGraphLaunch")
		e.step(t, 4+i)
		moved := e.exe.Stats().Last.PatchedNodes
		if moved != 64 {
			t.Fatalf("step %d patched %d nodes; every node of the chain moves", i, moved)
		}
		if d := e.calls("cuGraphExecKernelNodeSetParams_v2") - upd; d != moved {
			t.Errorf("step %d: %d exec updates for %d moved nodes", i, d, moved)
		}
		if d := e.calls("cuCtxGetCurrent") - ctx; d > 3 {
			t.Errorf("step %d: the context was made current %d times; want at most 3 (the updates, the launch, the step's event)", i, d)
		}
		if d := e.calls("cuGraphLaunch") - launch; d != 1 {
			t.Errorf("step %d: %d launches", i, d)
		}
	}
}

// TestStubDeviceStepDriverCalls: a moving device step makes the driver
// calls of the floor (patch on fixed buffers: the launch, the step's event,
// the context made current for each) and, on top, one exec update per node
// the design moves from the host, all in one set with the context made
// current once, and nothing else: no copy, memset or child-graph update, no
// whole-graph update, no stream write or wait, no event query. By default
// (the ring of tables, the first command on the device) none; with
// HostLead the step's first command's node; with Inline the inline
// patcher's; with both, both. (The stub runs no patcher: 12 steps stay
// within the ring's 16 tables.) On gpt2-decode-tiny with swapping
// caches and on mlp at fresh addresses, through the real CUDA backend code.
func TestStubDeviceStepDriverCalls(t *testing.T) {
	for _, c := range []struct {
		name string
		pat  workload.Pattern
	}{{"gpt2-decode-tiny", workload.Swap}, {"mlp", workload.Random}} {
		// step returns the counted calls one step made, by name.
		step := func(t *testing.T, e *stubSteps, i int) map[string]int64 {
			before := map[string]int64{}
			for _, n := range cuda.HostStubHot {
				before[n] = e.calls(n)
			}
			e.step(t, i)
			d := map[string]int64{}
			for _, n := range cuda.HostStubHot {
				if k := e.calls(n) - before[n]; k != 0 {
					d[n] = k
				}
			}
			return d
		}
		for _, v := range []struct {
			name    string
			opts    sg.DeviceOptions
			updates int64 // exec updates, in one set: one context query
			lead    bool  // the first command moves from the host
		}{
			{"default", sg.DeviceOptions{}, 0, false},
			{"host-lead", sg.DeviceOptions{HostLead: true}, 1, true},
			{"inline", sg.DeviceOptions{Inline: true}, 1, false},
			{"inline-host-lead", sg.DeviceOptions{Inline: true, HostLead: true}, 2, true},
		} {
			t.Run(c.name+"/"+v.name, func(t *testing.T) {
				floor := step(t, newStubSteps(t, c.name, workload.Config{}, sg.StrategyPatch, workload.Fixed), 4)
				want := maps.Clone(floor)
				if v.updates > 0 {
					want["cuGraphExecKernelNodeSetParams_v2"] += v.updates
					want["cuCtxGetCurrent"]++
				}
				e := newStubStepsWith(t, c.name, workload.Config{},
					sg.Options{Strategy: sg.StrategyDevice, StrategyOptions: sg.StrategyOptions{DeviceStrategy: v.opts}}, c.pat)
				for i := range 8 {
					got := step(t, e, 4+i)
					last := e.exe.Stats().Last
					if hosted := last.PatchedNodes == 1; last.DeviceUpdates == 0 || hosted != v.lead || last.PatchedNodes > 1 {
						t.Fatalf("step %d did not move as device moves (the first command from the host: %v, the rest on the device): %+v", i, v.lead, last)
					}
					if !maps.Equal(got, want) {
						t.Errorf("step %d made the driver calls %v; want the floor's %v and %d exec updates: %v", i, got, floor, v.updates, want)
					}
				}
			})
		}
	}
}

// BenchmarkStubStepHostCold is BenchmarkStubStepHost's patch with the
// host's caches cold at every step, as a GPU machine's driver calls (and
// the caller's input writes) leave them between one step and the next:
// before each step, untimed, the benchmark writes coldBytes of memory of
// its own. A step then pays for every cache line it touches, which a warm
// loop over the stub hides; compare a moving step with its fixed one.
func BenchmarkStubStepHostCold(bm *testing.B) {
	const coldBytes = 1 << 20
	evict := make([]byte, coldBytes)
	for _, c := range stubBenchCases {
		for _, v := range stubHostWays[:2] {
			bm.Run(fmt.Sprintf("%s/%s/%s", caseName(c.name, c.cfg), c.pat, v.name), func(bm *testing.B) {
				e := newStubStepsWith(bm, c.name, c.cfg, v.opts, c.pat)
				i := 0
				for bm.Loop() {
					bm.StopTimer()
					for j := 0; j < len(evict); j += 64 {
						evict[j]++
					}
					bm.StartTimer()
					e.step(bm, i)
					i++
				}
			})
		}
	}
}
