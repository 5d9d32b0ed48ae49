package blas_test

// GEMM tests and benchmarks on CUDA (cuBLAS, cuBLASLt): they skip, saying
// why, without a GPU. See docs/GPU-TESTING.md for how to run them.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda"
	"github.com/stablegraph/stablegraph/internal/blas"
	"github.com/stablegraph/stablegraph/internal/trace"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/remappable"
)

func openCUDA(tb testing.TB, cfg cuda.Config) *cuda.Backend {
	tb.Helper()
	b, err := cuda.Open(cfg)
	if errors.Is(err, gpu.ErrUnavailable) {
		tb.Skipf("no CUDA here: %v", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if live := b.LiveHandles(); !live.IsZero() {
			tb.Errorf("leak: %v", live)
		}
		if err := b.Close(); err != nil {
			tb.Error(err)
		}
	})
	if cfg.LibCUBLAS == "" {
		blasPath, lt, err := b.GemmLibraries()
		if blasPath == "" {
			tb.Skipf("cuBLAS not loaded: %v", err)
		}
		tb.Logf("cuBLAS %s, cuBLASLt %s (%v)", blasPath, lt, err)
	}
	return b
}

func devAlloc(tb testing.TB, b gpu.Backend, size uint64) gpu.DevicePtr {
	tb.Helper()
	p, err := b.MemAlloc(0, size)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { b.MemFree(p) })
	return p
}

// TestCUDAGemmFlattened traces the mlp layer's GEMM with its bias through
// the tracer, at a fresh address every step: differential tracing must
// find the library kernels' operand pointers (patchable), the trace must
// flatten into kernel nodes only, and after the first step nothing is
// captured. The GEMM-FLAT line lists the kernels.
func TestCUDAGemmFlattened(t *testing.T) {
	b := openCUDA(t, cuda.Config{})
	m, err := b.ModuleLoad(0, kernels.Module())
	if err != nil {
		t.Fatal(err)
	}
	defer b.ModuleUnload(m)
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.StreamDestroy(s)
	tr := trace.NewTracer(b, 0, s, trace.Options{Kernels: func(name string) (gpu.Function, error) { return b.ModuleFunction(m, name) }})
	defer tr.Close()
	const rows, w = 8, 256
	c := tr.NewLibraryCommand("gemm", blas.Command(blas.Gemm{M: rows, N: w, K: w, Alpha: 1, Bias: true}),
		[]trace.Use{{Operand: 0}, {Operand: 1}, {Operand: 2}, {Operand: 3}},
		[]uint64{4 * rows * w, 4 * rows * w, 4 * w * w, 4 * w})
	for step := range 10 {
		ops := []gpu.DevicePtr{devAlloc(t, b, 4*rows*w), devAlloc(t, b, 4*rows*w), devAlloc(t, b, 4*w*w), devAlloc(t, b, 4*w)}
		fl, err := tr.Flat(c, ops, true)
		if err != nil {
			t.Fatal(err)
		}
		if step == 0 {
			ok, why := c.Patchable()
			var names []string
			for _, n := range fl.Nodes {
				name := n.Type.String()
				if n.Type == gpu.NodeKernel {
					name, _ = b.FuncName(n.Kernel.Func)
				}
				names = append(names, name)
			}
			t.Logf("GEMM-FLAT patchable %v (%v); flattened into %d nodes %v (%s); workspace %d bytes",
				ok, why, len(fl.Nodes), names, fl.Why, tr.WorkspaceSize())
			if !ok {
				t.Fatalf("the GEMM is not patchable: %v", why)
			}
			if fl.Nodes == nil {
				t.Fatalf("the GEMM was not flattened: %s", fl.Why)
			}
			for i, n := range fl.Nodes {
				if n.Type != gpu.NodeKernel {
					t.Errorf("flattened node %d is a %s node", i, n.Type)
				}
			}
		}
	}
	if tr.Stats.Captures != 2 {
		t.Errorf("%d captures over 10 fresh address sets, want 2 (the first trace and its diff)", tr.Stats.Captures)
	}
}

// mlpProgram is the mlp workload, 8 layers at width 256 batch 8: with
// fused, each layer is one GEMM with its bias and a tanh (PyTorch's addmm
// then tanh); without, a GEMM and the fused bias+tanh kernel (the mlp
// workload today).
func mlpProgram(fused bool) (p *sg.Program, x, y sg.Buffer, ws []sg.Buffer, wData [][]float32, bData [][]float32) {
	const layers, rows, width = 8, 8, 256
	p = sg.NewProgram(fmt.Sprintf("mlp-fused-%v", fused))
	r := rand.New(rand.NewPCG(1, 2))
	n := int64(4 * rows * width)
	x, y = p.Param("x", n), p.Output("y", n)
	in := x
	for l := range layers {
		w := p.State(fmt.Sprintf("W%d", l), 4*width*width)
		ws = append(ws, w)
		wData = append(wData, scaled(randF32(r, width*width), 1/16.0))
		bData = append(bData, scaled(randF32(r, width), 0.1))
		b := p.Constant(fmt.Sprintf("b%d", l), gpu.F32ToBytes(bData[l]))
		h := p.Temp(fmt.Sprintf("h%d", l), n)
		out := y
		if l < layers-1 {
			out = p.Temp(fmt.Sprintf("a%d", l), n)
		}
		if fused {
			p.Gemm(h.All(), in.All(), w.All(), sg.GEMM{M: rows, N: width, K: width, Alpha: 1, Bias: b.All()})
			p.Launch(kernels.Tanh, kernels.Elementwise(rows*width), sg.Out(out.All()), sg.In(h.All()), sg.I32(rows*width))
		} else {
			p.Gemm(h.All(), in.All(), w.All(), sg.GEMM{M: rows, N: width, K: width, Alpha: 1})
			p.Launch(kernels.BiasTanh, kernels.Elementwise(rows*width), sg.Out(out.All()), sg.In(h.All()), sg.In(b.All()),
				sg.I32(rows), sg.I32(width))
		}
		in = out
	}
	return p, x, y, ws, wData, bData
}

func scaled(v []float32, s float32) []float32 {
	for i := range v {
		v[i] *= s
	}
	return v
}

// mlpRef is the forward pass in float64.
func mlpRef(x []float32, wData, bData [][]float32) []float64 {
	const rows, width = 8, 256
	h := make([]float64, len(x))
	for i, v := range x {
		h[i] = float64(v)
	}
	for l := range wData {
		next := make([]float64, len(h))
		for i := range rows {
			for j := range width {
				s := float64(bData[l][j])
				for k := range width {
					s += h[i*width+k] * float64(wData[l][k*width+j])
				}
				next[i*width+j] = math.Tanh(s)
			}
		}
		h = next
	}
	return h
}

// runMLP compiles p under strategy and runs steps with x and y at fresh
// addresses every step (fresh) or fixed ones, returning every output and
// the executable's stats and traces.
func runMLP(t *testing.T, b gpu.Backend, fused bool, strategy sg.Strategy, fresh bool, steps int) ([][]byte, []sg.Stats, []sg.TraceInfo) {
	t.Helper()
	ctx := context.Background()
	p, x, y, ws, wData, _ := mlpProgram(fused)
	opts := sg.Options{Strategy: strategy}
	alloc := func(size uint64) gpu.DevicePtr { return devAlloc(t, b, size) }
	if strategy == sg.StrategyRemap {
		// Remap maps the memory behind the caller's buffers: remappable
		// allocations, each its own VMM chunk, freed when the test ends.
		ra, err := remappable.New(b, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := ra.Close(); err != nil {
				t.Error(err)
			}
		})
		opts.Remap.Memory = ra
		alloc = func(size uint64) gpu.DevicePtr {
			p, err := ra.Alloc(size)
			if err != nil {
				t.Fatal(err)
			}
			return p
		}
	}
	exe, err := sg.Compile(ctx, b, p, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	for l, w := range ws {
		if err := exe.WriteBuffer(ctx, w, gpu.F32ToBytes(wData[l])); err != nil {
			t.Fatal(err)
		}
	}
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.StreamDestroy(s)
	bind := sg.Bindings{x: alloc(uint64(x.Size())), y: alloc(uint64(y.Size()))}
	var outs [][]byte
	var stats []sg.Stats
	for i := range steps {
		if fresh && i > 0 {
			bind = sg.Bindings{x: alloc(uint64(x.Size())), y: alloc(uint64(y.Size()))}
		}
		in := randF32(rand.New(rand.NewPCG(uint64(i), 3)), 8*256)
		if err := b.MemcpyHtoD(bind[x], gpu.F32ToBytes(in)); err != nil {
			t.Fatal(err)
		}
		o, err := exe.Run(ctx, s, bind)
		if err != nil {
			t.Fatalf("%s step %d: %v", strategy, i, err)
		}
		data, err := exe.ReadOutput(ctx, o, y)
		if err != nil {
			t.Fatal(err)
		}
		outs, stats = append(outs, data), append(stats, exe.Stats())
	}
	return outs, stats, exe.Traces()
}

// TestCUDAMLPStrategies runs the 8-layer mlp, its biases fused into the
// GEMMs and not, under every strategy with fresh addresses every step:
// each output equals eager's bit for bit, eager's equals the float64
// forward pass to float32 accuracy, and patch captures nothing after its
// first step, its GEMMs patchable and flattened. MLP-STATS lines give
// each strategy's counters.
func TestCUDAMLPStrategies(t *testing.T) {
	b := openCUDA(t, cuda.Config{})
	const steps = 12
	for _, fused := range []bool{true, false} {
		t.Run(fmt.Sprintf("fused=%v", fused), func(t *testing.T) {
			want, _, _ := runMLP(t, b, fused, sg.StrategyEager, true, steps)
			_, _, _, _, wData, bData := mlpProgram(fused)
			ref := mlpRef(randF32(rand.New(rand.NewPCG(0, 3)), 8*256), wData, bData)
			var num, den float64
			for i, v := range gpu.BytesToF32(want[0]) {
				num += (float64(v) - ref[i]) * (float64(v) - ref[i])
				den += ref[i] * ref[i]
			}
			if e := math.Sqrt(num / den); e > 1e-5 || math.IsNaN(e) {
				t.Fatalf("eager against the float64 forward pass: relative error %.3g", e)
			}
			for _, st := range sg.Strategies()[1:] {
				t.Run(string(st), func(t *testing.T) {
					got, stats, traces := runMLP(t, b, fused, st, true, steps)
					for i := range got {
						if !bytes.Equal(got[i], want[i]) {
							t.Fatalf("step %d differs from eager", i)
						}
					}
					d := stats[steps-1].Counters.Sub(stats[0].Counters)
					t.Logf("MLP-STATS fused=%v %s after step 0: %+v", fused, st, d)
					if st != sg.StrategyPatch {
						return
					}
					if d.TracesCaptured != 0 || d.Rerecords != 0 {
						t.Errorf("patch after its first step: %d captured, %d re-records", d.TracesCaptured, d.Rerecords)
					}
					for _, info := range traces {
						if !info.Patchable || !info.Flattened {
							t.Errorf("%s: patchable %v (%s), flattened %v (%s)", info.Command, info.Patchable, info.Reason, info.Flattened, info.NotFlatReason)
						}
					}
				})
			}
		})
	}
}

// TestCUDAGemmFallback: without cuBLAS the program's GEMMs (biases
// included) run on the built-in kernels and still match the float64
// forward pass, under patch too.
func TestCUDAGemmFallback(t *testing.T) {
	b := openCUDA(t, cuda.Config{LibCUBLAS: "/nonexistent/libcublas.so"})
	_, _, _, _, wData, bData := mlpProgram(true)
	ref := mlpRef(randF32(rand.New(rand.NewPCG(0, 3)), 8*256), wData, bData)
	eager, _, _ := runMLP(t, b, true, sg.StrategyEager, true, 3)
	patch, _, traces := runMLP(t, b, true, sg.StrategyPatch, true, 3)
	var num, den float64
	for i, v := range gpu.BytesToF32(eager[0]) {
		num += (float64(v) - ref[i]) * (float64(v) - ref[i])
		den += ref[i] * ref[i]
	}
	if e := math.Sqrt(num / den); e > 1e-5 {
		t.Errorf("fallback against the float64 forward pass: relative error %.3g", e)
	}
	for i := range eager {
		if !bytes.Equal(eager[i], patch[i]) {
			t.Errorf("step %d: patch differs from eager", i)
		}
	}
	for _, info := range traces {
		if !info.Flattened || !strings.Contains(info.Command, "gemm") {
			t.Errorf("%+v", info)
		}
	}
}

// BenchmarkCUDAMLP is the mlp step on the GPU: 8 layers of GEMM (bias
// fused, as PyTorch's addmm; or not, with the fused bias+tanh kernel) and
// tanh, width 256 batch 8, wall time per step (Run and a stream
// synchronize), under patch with x and y fixed (the replay floor) and at a
// new address every step (64 address sets in turn, more than the trace
// cache holds), to compare with bench/compare's PyTorch rows.
func BenchmarkCUDAMLP(bm *testing.B) {
	b := openCUDA(bm, cuda.Config{})
	ctx := context.Background()
	for _, fused := range []bool{true, false} {
		for _, fresh := range []bool{false, true} {
			name := fmt.Sprintf("fused=%v/addresses=%s", fused, map[bool]string{false: "fixed", true: "fresh"}[fresh])
			bm.Run(name, func(bm *testing.B) {
				p, x, y, ws, wData, _ := mlpProgram(fused)
				exe, err := sg.Compile(ctx, b, p, sg.Options{Strategy: sg.StrategyPatch})
				if err != nil {
					bm.Fatal(err)
				}
				defer exe.Close()
				for l, w := range ws {
					if err := exe.WriteBuffer(ctx, w, gpu.F32ToBytes(wData[l])); err != nil {
						bm.Fatal(err)
					}
				}
				s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
				if err != nil {
					bm.Fatal(err)
				}
				defer b.StreamDestroy(s)
				sets := 1
				if fresh {
					sets = 64
				}
				binds := make([]sg.Bindings, sets)
				for i := range binds {
					binds[i] = sg.Bindings{x: devAlloc(bm, b, uint64(x.Size())), y: devAlloc(bm, b, uint64(y.Size()))}
				}
				for i := range 2 * sets { // warm: every set traced or moved once
					if _, err := exe.Run(ctx, s, binds[i%sets]); err != nil {
						bm.Fatal(err)
					}
				}
				if err := b.StreamSynchronize(s); err != nil {
					bm.Fatal(err)
				}
				before := exe.Stats()
				i := 0
				for bm.Loop() {
					if _, err := exe.Run(ctx, s, binds[i%sets]); err != nil {
						bm.Fatal(err)
					}
					if err := b.StreamSynchronize(s); err != nil {
						bm.Fatal(err)
					}
					i++
				}
				d := exe.Stats().Counters.Sub(before.Counters)
				bm.ReportMetric(float64(d.TracesCaptured)/float64(i), "captures/step")
				bm.ReportMetric(float64(d.PatchedNodes)/float64(i), "patched-nodes/step")
			})
		}
	}
}
