package stablegraph_test

import (
	"context"
	"testing"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/internal/steptest"
)

// quietSim is the sim with the calls a step makes on the device (exec
// updates, the launch, the step's event) doing nothing: what is left of a
// step is the runtime's own host work.
type quietSim struct{ *sim.Backend }

func (quietSim) GraphLaunch(gpu.GraphExec, gpu.Stream) error { return nil }
func (quietSim) GraphExecKernelNodeSetParams(gpu.GraphExec, gpu.GraphNode, gpu.KernelParams) error {
	return nil
}
func (quietSim) GraphExecMemcpyNodeSetParams(gpu.GraphExec, gpu.GraphNode, gpu.MemcpyParams) error {
	return nil
}
func (quietSim) GraphExecMemsetNodeSetParams(gpu.GraphExec, gpu.GraphNode, gpu.Memset) error {
	return nil
}
func (quietSim) EventRecord(gpu.Event, gpu.Stream) error        { return nil }
func (quietSim) GraphExecUpdate(gpu.GraphExec, gpu.Graph) error { return nil }
func (quietSim) GraphKernelNodeSetParams(gpu.GraphNode, gpu.KernelParams) error {
	return nil
}

// TestStepHostAllocatesNothing: once warm, Executable.Run of a step whose
// params and outputs are at fresh addresses allocates nothing on the host
// under patch, node by node and by whole-graph updates from its host
// template, and device with its inline patcher, its first command moved on
// the device and from the host (the model's GEMMs flattened and moved
// through their templates, its copies and memsets, the outputs handed
// back), on sim, under -race too. (Not device's ring of tables: the
// launches do nothing here, so no patcher frees a table;
// TestDeviceHostStepAllocatesNothing in package replay frees them by hand.)
// TestStubStepAllocatesNothing (package gpu/cuda) checks the same through
// the CUDA backend's code.
func TestStepHostAllocatesNothing(t *testing.T) {
	for _, c := range []struct {
		name  string
		st    stablegraph.Strategy
		costs stablegraph.Costs
		whole bool
	}{
		// Costs that price each of patch's two ways below the other.
		{"patch", stablegraph.StrategyPatch, stablegraph.Costs{NodeUpdateUS: 0.01}, false},
		{"patch-whole", stablegraph.StrategyPatch, stablegraph.Costs{NodeUpdateUS: 100}, true},
		{"device-inline", stablegraph.StrategyDevice, stablegraph.Costs{}, false},
		{"device-inline-host-lead", stablegraph.StrategyDevice, stablegraph.Costs{}, false},
	} {
		st := c.st
		t.Run(c.name, func(t *testing.T) {
			b := quietSim{simtest.New(t, 1)}
			s := simtest.Stream(t, b, 0)
			w := steptest.NewMLP(4, 32, 3, 100, 6)
			ad := steptest.NewMLPAddresser(t, b, w, steptest.Random)
			opts := stablegraph.Options{Strategy: st, Costs: c.costs}
			opts.DeviceStrategy.Inline = st == stablegraph.StrategyDevice
			opts.DeviceStrategy.HostLead = c.name == "device-inline-host-lead"
			exe := steptest.Compile(t, b, w.P, opts)
			w.InitStates(t, exe)
			var binds []stablegraph.Bindings
			for i := range 32 {
				binds = append(binds, ad.Next(i))
			}
			ctx := context.Background()
			i := 0
			step := func() {
				outs, err := exe.Run(ctx, s, binds[i%len(binds)])
				if err != nil {
					t.Fatal(err)
				}
				outs.Release()
				i++
			}
			for range 4 { // record, prove the templates, prepare the nodes
				step()
			}
			if n := fewestAllocs(step); n != 0 {
				t.Errorf("%v allocations per step", n)
			}
			whole := c.whole
			if c := exe.Stats().Counters; c.Rerecords != 0 || (st == stablegraph.StrategyPatch && c.PatchedNodes == 0) ||
				(st == stablegraph.StrategyDevice && c.DeviceUpdates == 0) || (c.GraphUpdates > 0) != whole {
				t.Errorf("the steps did not move as %s moves (whole-graph updates: %v): %+v", st, whole, c)
			}
		})
	}
}

// stepper compiles the MLP with opts on b and returns the executable, a
// step at fresh addresses (cycling through 32 sets) and its stream.
func stepper(t testing.TB, b gpu.Backend, opts stablegraph.Options) (*stablegraph.Executable, func(), gpu.Stream) {
	s := simtest.Stream(t, b, 0)
	w := steptest.NewMLP(4, 32, 3, 100, 6)
	ad := steptest.NewMLPAddresser(t, b, w, steptest.Random)
	exe := steptest.Compile(t, b, w.P, opts)
	w.InitStates(t, exe)
	var binds []stablegraph.Bindings
	for i := range 32 {
		binds = append(binds, ad.Next(i))
	}
	ctx := context.Background()
	i := 0
	return exe, func() {
		outs, err := exe.Run(ctx, s, binds[i%len(binds)])
		if err != nil {
			t.Fatal(err)
		}
		outs.Release()
		i++
	}, s
}

// hushSim is the sim that turns into quietSim once hush is set, counting
// its launches and the events it records and queries (what auto adds
// around a step, where it adds anything): auto probes on the real sim, then
// its steps run quiet.
type hushSim struct {
	*sim.Backend
	hush  *bool
	calls *int
}

func (h hushSim) quiet() bool { return *h.hush }

func (h hushSim) GraphLaunch(x gpu.GraphExec, s gpu.Stream) error {
	if *h.hush {
		*h.calls++
		return nil
	}
	if h.quiet() {
		return nil
	}
	return h.Backend.GraphLaunch(x, s)
}
func (h hushSim) GraphExecKernelNodeSetParams(x gpu.GraphExec, n gpu.GraphNode, p gpu.KernelParams) error {
	if h.quiet() {
		return nil
	}
	return h.Backend.GraphExecKernelNodeSetParams(x, n, p)
}
func (h hushSim) GraphExecMemcpyNodeSetParams(x gpu.GraphExec, n gpu.GraphNode, p gpu.MemcpyParams) error {
	if h.quiet() {
		return nil
	}
	return h.Backend.GraphExecMemcpyNodeSetParams(x, n, p)
}
func (h hushSim) GraphExecMemsetNodeSetParams(x gpu.GraphExec, n gpu.GraphNode, p gpu.Memset) error {
	if h.quiet() {
		return nil
	}
	return h.Backend.GraphExecMemsetNodeSetParams(x, n, p)
}
func (h hushSim) EventRecord(e gpu.Event, s gpu.Stream) error {
	if *h.hush {
		*h.calls++
		return nil
	}
	if h.quiet() {
		return nil
	}
	return h.Backend.EventRecord(e, s)
}
func (h hushSim) GraphExecUpdate(x gpu.GraphExec, g gpu.Graph) error {
	if h.quiet() {
		return nil
	}
	return h.Backend.GraphExecUpdate(x, g)
}
func (h hushSim) GraphKernelNodeSetParams(n gpu.GraphNode, p gpu.KernelParams) error {
	if h.quiet() {
		return nil
	}
	return h.Backend.GraphKernelNodeSetParams(n, p)
}
func (h hushSim) EventQuery(e gpu.Event) (bool, error) {
	if *h.hush {
		*h.calls++
	}
	return h.Backend.EventQuery(e)
}

// autoKept compiles the MLP under auto on a hushSim and steps it until it
// has kept a candidate and closed the others; then the backend is hushed.
// It returns auto's step, the kept strategy's own executable's step on the
// same backend, and the backend.
func autoKept(t testing.TB) (auto, alone func(), kept stablegraph.Strategy, h hushSim, drain func()) {
	h = hushSim{simtest.New(t, 1), new(bool), new(int)}
	// Hushed launches run no patcher, so device's ring of tables would
	// fill: its candidate takes the inline patcher here, which needs none.
	var opts stablegraph.Options
	opts.DeviceStrategy.Inline = true
	opts.Strategy = stablegraph.StrategyAuto
	exe, auto, s := stepper(t, h, opts)
	for range 200 {
		auto()
		if err := h.StreamSynchronize(s); err != nil {
			t.Fatal(err)
		}
		if !exe.Choice().Probing {
			break
		}
	}
	kept = exe.Choice().Strategy
	if kept == stablegraph.StrategyAuto || exe.Choice().Probing {
		t.Fatalf("auto did not decide: %+v", exe.Choice())
	}
	for range 4 { // the fence passes; the others are closed
		auto()
		if err := h.StreamSynchronize(s); err != nil {
			t.Fatal(err)
		}
	}
	opts.Strategy = kept
	_, alone, sAlone := stepper(t, h, opts)
	for range 4 {
		alone()
	}
	*h.hush = true
	// Hushed, a step records no event, so the executables' Close would not
	// wait for the work the hushed steps still enqueue (pool's timeline
	// writes): the streams drain first (cleanups run newest first).
	t.Cleanup(func() {
		*h.hush = false
		for _, st := range []gpu.Stream{s, sAlone} {
			if err := h.StreamSynchronize(st); err != nil {
				t.Error(err)
			}
		}
	})
	// drain waits for what both executables' hushed steps still enqueue.
	drain = func() {
		for _, st := range []gpu.Stream{s, sAlone} {
			if err := h.StreamSynchronize(st); err != nil {
				t.Fatal(err)
			}
		}
	}
	return auto, alone, kept, h, drain
}

// TestAutoStepHostAsKept: once auto has kept a candidate, its step is the
// kept strategy's and nothing more on the host: no allocation beyond the
// kept strategy's own, and the
// same launches and events recorded and queried as that strategy compiled
// alone.
func TestAutoStepHostAsKept(t *testing.T) {
	auto, alone, kept, h, drain := autoKept(t)
	// Which candidate auto keeps depends on what it measured: auto's step
	// must allocate no more than the kept strategy's alone. pool's step
	// allocates when its slot's last step is not done (a wait, bounded by
	// a deadline), which depends on how far the sim's stream got, so each
	// counted step starts with the streams drained: both take the same
	// path, whatever the machine's load.
	drained := func(step func()) func() { return func() { drain(); step() } }
	if a, k := fewestAllocs(drained(auto)), fewestAllocs(drained(alone)); a > k {
		t.Errorf("auto running %s: %v allocations per step, %s alone %v", kept, a, kept, k)
	}
	count := func(step func()) int {
		*h.calls = 0
		for range 16 {
			step()
		}
		return *h.calls
	}
	if a, k := count(auto), count(alone); a != k {
		t.Errorf("16 steps of auto running %s made %d calls on the device, %s alone %d", kept, a, kept, k)
	}
}

func BenchmarkAutoStepHost(bm *testing.B) {
	step, alone, kept, _, _ := autoKept(bm)
	bm.Run("auto", func(bm *testing.B) {
		for bm.Loop() {
			step()
		}
	})
	bm.Run(string(kept), func(bm *testing.B) {
		for bm.Loop() {
			alone()
		}
	})
}

// BenchmarkStepHost is Executable.Run's host work on the sim with the
// device calls doing nothing (quietSim), the MLP at fresh addresses every
// step: patch node by node and device. Run with -cpuprofile to see where a
// step's host time goes; only the ratios mean anything.
func BenchmarkStepHost(bm *testing.B) {
	for _, st := range []stablegraph.Strategy{stablegraph.StrategyPatch, stablegraph.StrategyDevice, stablegraph.StrategyStable} {
		bm.Run(string(st), func(bm *testing.B) {
			b := quietSim{simtest.New(bm, 1)}
			_, step, _ := stepper(bm, b, stablegraph.Options{Strategy: st, Costs: stablegraph.Costs{NodeUpdateUS: 0.01}})
			for range 4 {
				step()
			}
			bm.ReportAllocs()
			for bm.Loop() {
				step()
			}
		})
	}
}

// fewestAllocs is the fewest allocations per call of step over three
// counts of 64 calls. testing.AllocsPerRun counts every goroutine's
// allocations, the sim's stream workers and the race detector's included,
// and on a loaded machine some of theirs land in a count now and then;
// the step's own are in every count.
func fewestAllocs(step func()) float64 {
	n := testing.AllocsPerRun(64, step)
	for range 2 {
		n = min(n, testing.AllocsPerRun(64, step))
	}
	return n
}
