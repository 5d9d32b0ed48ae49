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
// template, and device (the model's GEMMs flattened and moved through their
// templates, its copies and memsets, the outputs handed back), on sim, under
// -race too. TestStubStepAllocatesNothing (package gpu/cuda)
// checks the same through the CUDA backend's code.
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
		{"device", stablegraph.StrategyDevice, stablegraph.Costs{}, false},
	} {
		st := c.st
		t.Run(c.name, func(t *testing.T) {
			b := quietSim{simtest.New(t, 1)}
			s := simtest.Stream(t, b, 0)
			w := steptest.NewMLP(4, 32, 3, 100, 6)
			ad := steptest.NewMLPAddresser(t, b, w, steptest.Random)
			exe := steptest.Compile(t, b, w.P, stablegraph.Options{Strategy: st, Costs: c.costs})
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
			if n := testing.AllocsPerRun(64, step); n != 0 {
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
