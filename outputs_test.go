package stablegraph_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/kernels"
)

// TestOutputsAddresses: Outputs say where every output is, held inline for
// a few outputs and in a slice for many; a buffer that is no output of the
// step, or of another program, has no address there. (That a step
// allocates nothing for them is TestStubStepAllocatesNothing's, in
// package gpu/cuda.)
func TestOutputsAddresses(t *testing.T) {
	for _, n := range []int{1, 8, 9, 20} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			b := simtest.New(t, 1)
			s := simtest.Stream(t, b, 0)
			p := stablegraph.NewProgram("outputs")
			in := p.Param("in", 64)
			var outs []stablegraph.Buffer
			for i := range n {
				o := p.Output(fmt.Sprintf("out%d", i), 64)
				p.Launch(kernels.Fill, kernels.Elementwise(16), stablegraph.Out(o.All()), stablegraph.F32(float32(i)), stablegraph.I32(16))
				outs = append(outs, o)
			}
			p.Launch(kernels.Fill, kernels.Elementwise(16), stablegraph.Out(in.All()), stablegraph.F32(1), stablegraph.I32(16))
			exe, err := stablegraph.Compile(context.Background(), b, p, stablegraph.Options{Strategy: stablegraph.StrategyPatch})
			if err != nil {
				t.Fatal(err)
			}
			defer exe.Close()
			bind := stablegraph.Bindings{in: simtest.Alloc(t, b, 0, 64)}
			for _, o := range outs {
				bind[o] = simtest.Alloc(t, b, 0, 64)
			}
			res, err := exe.Run(context.Background(), s, bind)
			if err != nil {
				t.Fatal(err)
			}
			for i, o := range outs {
				if res.Addr(o) != bind[o] {
					t.Errorf("output %d at %#x, bound at %#x", i, uint64(res.Addr(o)), uint64(bind[o]))
				}
				got, err := exe.ReadOutput(context.Background(), res, o)
				if err != nil {
					t.Fatal(err)
				}
				if v := gpu.BytesToF32(got); v[0] != float32(i) || v[15] != float32(i) {
					t.Errorf("output %d holds %v", i, v[:2])
				}
			}
			if res.Addr(in) != 0 {
				t.Error("a param has an address among the outputs")
			}
			if other := stablegraph.NewProgram("other").Output("out0", 64); res.Addr(other) != 0 {
				t.Error("another program's buffer has an address among the outputs")
			}
			if got := res.Buffers(); len(got) != n || !slices.Contains(got, outs[n-1]) {
				t.Errorf("Buffers() = %v", got)
			}
			if (stablegraph.Outputs{}).Addr(outs[0]) != 0 || len((stablegraph.Outputs{}).Buffers()) != 0 {
				t.Error("the zero Outputs holds an output")
			}
		})
	}
}
