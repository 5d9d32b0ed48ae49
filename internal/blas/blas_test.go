package blas_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/blas"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/internal/trace"
	"github.com/stablegraph/stablegraph/kernels"
)

// noLibrary hides a backend's GEMM library: only gpu.Backend's methods.
type noLibrary struct{ gpu.Backend }

// refusing is a backend whose library refuses every product, as CUDA's
// does without libcublas.
type refusing struct {
	gpu.Backend
	calls int
}

func (r *refusing) GemmWorkspaceSize(int) (uint64, error) { return 0, nil }
func (r *refusing) GemmPrepare(int, gpu.GemmParams) error { return gpu.ErrNotSupported }
func (r *refusing) Gemm(gpu.Stream, gpu.GemmParams) error {
	r.calls++
	return &gpu.Error{Op: "Gemm", Err: gpu.ErrNotSupported}
}
func (r *refusing) Name() string { return "refusing" }

type setup struct {
	t   *testing.T
	b   *sim.Backend
	mod gpu.Module
	s   gpu.Stream
}

func newSetup(t *testing.T) *setup {
	t.Helper()
	b := simtest.New(t, 1)
	d := simtest.OpenDev(t, b, 0)
	return &setup{t: t, b: b, mod: d.Mod, s: d.Stream}
}

func (x *setup) upload(v []float32) gpu.DevicePtr {
	x.t.Helper()
	p, err := x.b.MemAlloc(0, uint64(4*len(v)))
	if err != nil {
		x.t.Fatal(err)
	}
	x.t.Cleanup(func() { x.b.MemFree(p) })
	if err := x.b.MemcpyHtoD(p, gpu.F32ToBytes(v)); err != nil {
		x.t.Fatal(err)
	}
	return p
}

func randF32(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.Float64()*2 - 1)
	}
	return v
}

// TestGemmCommand runs the command through the library (sim's), through
// the fallback where the backend has none, and where its library refuses:
// all three compute C = alpha·A·Bᵀ + beta·C + bias to float32 accuracy,
// eager and captured.
func TestGemmCommand(t *testing.T) {
	x := newSetup(t)
	const m, n, k = 5, 7, 9
	r := rand.New(rand.NewPCG(1, 2))
	a, bm, c0, bias := randF32(r, m*k), randF32(r, n*k), randF32(r, m*n), randF32(r, n)
	g := blas.Gemm{M: m, N: n, K: k, TransB: true, Alpha: 0.5, Beta: 2, Bias: true}
	want := make([]float64, m*n)
	for i := range m {
		for j := range n {
			var s float64
			for l := range k {
				s += float64(a[i*k+l]) * float64(bm[j*k+l])
			}
			want[i*n+j] = 0.5*s + 2*float64(c0[i*n+j]) + float64(bias[j])
		}
	}
	ref := &refusing{Backend: x.b}
	for _, c := range []struct {
		name    string
		b       gpu.Backend
		kernels []string
	}{
		{"library", x.b, []string{"simblas_sgemm_64x16"}},
		{"no library", noLibrary{x.b}, []string{kernels.Gemm, kernels.BiasAdd}},
		{"library refuses", ref, []string{kernels.Gemm, kernels.BiasAdd}},
	} {
		t.Run(c.name, func(t *testing.T) {
			A, B, bi := x.upload(a), x.upload(bm), x.upload(bias)
			C := x.upload(c0)
			lookup := func(name string) (gpu.Function, error) { return x.b.ModuleFunction(x.mod, name) }
			capture, err := x.b.StreamCreate(0, gpu.StreamNonBlocking, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer x.b.StreamDestroy(capture)
			tr := trace.NewTracer(c.b, 0, capture, trace.Options{Kernels: lookup})
			defer tr.Close()
			cmd := tr.NewLibraryCommand("gemm", blas.Command(g), []trace.Use{{Operand: 0}, {Operand: 1}, {Operand: 2}, {Operand: 3}},
				[]uint64{4 * m * n, 4 * m * k, 4 * n * k, 4 * n})
			ops := []gpu.DevicePtr{C, A, B, bi}
			check := func(what string) {
				t.Helper()
				if err := x.b.StreamSynchronize(x.s); err != nil {
					t.Fatal(err)
				}
				out := make([]byte, 4*m*n)
				if err := x.b.MemcpyDtoH(out, C); err != nil {
					t.Fatal(err)
				}
				var num, den float64
				for i, v := range gpu.BytesToF32(out) {
					num += (float64(v) - want[i]) * (float64(v) - want[i])
					den += want[i] * want[i]
				}
				if e := math.Sqrt(num / den); e > 1e-5 || math.IsNaN(e) {
					t.Fatalf("%s: relative error %.3g", what, e)
				}
				if err := x.b.MemcpyHtoD(C, gpu.F32ToBytes(c0)); err != nil {
					t.Fatal(err)
				}
			}
			if err := tr.Run(cmd, ops, x.s); err != nil {
				t.Fatal(err)
			}
			check("eager")
			graph, err := tr.Trace(cmd, ops, false)
			if err != nil {
				t.Fatal(err)
			}
			nodes, err := x.b.GraphNodes(graph)
			if err != nil || len(nodes) != len(c.kernels) {
				t.Fatalf("captured %d nodes (%v), want %v", len(nodes), err, c.kernels)
			}
			for i, nd := range nodes {
				kp, err := x.b.GraphKernelNodeParams(nd)
				if err != nil {
					t.Fatal(err)
				}
				if name, _ := x.b.FuncName(kp.Func); name != c.kernels[i] {
					t.Errorf("node %d launches %s, want %s", i, name, c.kernels[i])
				}
			}
			ex, err := x.b.GraphInstantiate(graph)
			if err != nil {
				t.Fatal(err)
			}
			defer x.b.GraphExecDestroy(ex)
			if err := x.b.GraphLaunch(ex, x.s); err != nil {
				t.Fatal(err)
			}
			check("replayed")
		})
	}
	if ref.calls == 0 {
		t.Error("the refusing library was never asked")
	}
}

// TestGemmCommandPointers: a command given the wrong number of pointers
// fails with ErrInvalidValue and enqueues nothing.
func TestGemmCommandPointers(t *testing.T) {
	x := newSetup(t)
	lib := blas.Command(blas.Gemm{M: 2, N: 2, K: 2, Alpha: 1, Bias: true})
	env := &trace.Env{Backend: x.b, Stream: x.s, Ptrs: []gpu.DevicePtr{256, 512, 768}}
	if err := lib.Run(env); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("Run with 3 pointers for a GEMM with a bias: %v", err)
	}
	if err := lib.Prepare(env); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("Prepare with 3 pointers for a GEMM with a bias: %v", err)
	}
	if n, err := lib.Workspace(noLibrary{x.b}, 0); n != 0 || err != nil {
		t.Errorf("Workspace without a library = %d, %v; want none", n, err)
	}
	if n, err := lib.Workspace(x.b, 0); n == 0 || err != nil {
		t.Errorf("Workspace with sim's library = %d, %v", n, err)
	}
	if g := (blas.Gemm{Bias: true}); g.Pointers() != 4 {
		t.Errorf("Pointers = %d", g.Pointers())
	}
}
