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

// TestAppendOutput: AppendOutput appends an output's contents after what
// dst holds, reuses dst's storage when it is large enough (a loop reading
// every step's output into dst[:0] allocates no new buffer), and returns
// dst unchanged on an error.
func TestAppendOutput(t *testing.T) {
	ctx := context.Background()
	b := simtest.New(t, 1)
	s := simtest.Stream(t, b, 0)
	p := stablegraph.NewProgram("append")
	in := p.Param("in", 64)
	out := p.Output("out", 64)
	p.Launch(kernels.Fill, kernels.Elementwise(16), stablegraph.Out(out.All()), stablegraph.F32(3), stablegraph.I32(16))
	p.Launch(kernels.Fill, kernels.Elementwise(16), stablegraph.Out(in.All()), stablegraph.F32(1), stablegraph.I32(16))
	exe, err := stablegraph.Compile(ctx, b, p, stablegraph.Options{Strategy: stablegraph.StrategyPatch})
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	res, err := exe.Run(ctx, s, stablegraph.Bindings{in: simtest.Alloc(t, b, 0, 64), out: simtest.Alloc(t, b, 0, 64)})
	if err != nil {
		t.Fatal(err)
	}
	got, err := exe.AppendOutput(ctx, []byte("head"), res, out)
	if err != nil {
		t.Fatal(err)
	}
	if string(got[:4]) != "head" || len(got) != 4+64 {
		t.Fatalf("appended %d bytes after %q", len(got)-4, got[:4])
	}
	if v := gpu.BytesToF32(got[4:]); v[0] != 3 || v[15] != 3 {
		t.Errorf("appended %v, want 3s", v[:2])
	}
	scratch := make([]byte, 0, 64)
	again, err := exe.AppendOutput(ctx, scratch, res, out)
	if err != nil || &again[0] != &scratch[:1][0] || !slices.Equal(again, got[4:]) {
		t.Errorf("into a buffer of room enough: %v, same storage %v, same contents %v", err, err == nil && &again[0] == &scratch[:1][0], slices.Equal(again, got[4:]))
	}
	keep := []byte("kept")
	if r, err := exe.AppendOutput(ctx, keep, res, in); err == nil || string(r) != "kept" {
		t.Errorf("a param read as an output: %q, %v; want an error and dst unchanged", r, err)
	}
}
