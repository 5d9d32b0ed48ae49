package cuda

import (
	"errors"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

// Host-side costs of the hot calls through this backend (purego call,
// context check, handle tables, argument packing). Each skips without a GPU.

type benchEnv struct {
	b    *Backend
	s    gpu.Stream
	fill gpu.KernelParams
}

func newBenchEnv(tb testing.TB) *benchEnv {
	b, err := Open(Config{})
	if errors.Is(err, gpu.ErrUnavailable) {
		tb.Skipf("no CUDA here: %v", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { b.Close() })
	m, err := b.ModuleLoad(0, kernels.Module())
	if err != nil {
		tb.Fatal(err)
	}
	f, err := b.ModuleFunction(m, kernels.Fill)
	if err != nil {
		tb.Fatal(err)
	}
	p, err := b.MemAlloc(0, 1024)
	if err != nil {
		tb.Fatal(err)
	}
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		tb.Fatal(err)
	}
	return &benchEnv{b: b, s: s, fill: gpu.KernelParams{Func: f, Config: kernels.Elementwise(256),
		Args: []gpu.Arg{gpu.Ptr(p), gpu.F32(1), gpu.I32(256)}}}
}

func BenchmarkStreamQuery(bm *testing.B) {
	e := newBenchEnv(bm)
	for bm.Loop() {
		if _, err := e.b.StreamQuery(e.s); err != nil {
			bm.Fatal(err)
		}
	}
}

func BenchmarkLaunchKernel(bm *testing.B) {
	e := newBenchEnv(bm)
	for i := 0; bm.Loop(); i++ {
		if err := e.b.LaunchKernel(e.fill.Func, e.fill.Config, e.fill.Args, e.s); err != nil {
			bm.Fatal(err)
		}
		if i%1024 == 1023 {
			e.b.StreamSynchronize(e.s)
		}
	}
	e.b.StreamSynchronize(e.s)
}

func BenchmarkGraphExecKernelNodeSetParams(bm *testing.B) {
	e := newBenchEnv(bm)
	g, err := e.b.GraphCreate(0)
	if err != nil {
		bm.Fatal(err)
	}
	n, err := e.b.GraphAddKernelNode(g, nil, e.fill)
	if err != nil {
		bm.Fatal(err)
	}
	x, err := e.b.GraphInstantiate(g)
	if err != nil {
		bm.Fatal(err)
	}
	p := e.fill
	for i := 0; bm.Loop(); i++ {
		p.Args[1] = gpu.F32(float32(i))
		if err := e.b.GraphExecKernelNodeSetParams(x, n, p); err != nil {
			bm.Fatal(err)
		}
	}
}

func BenchmarkGraphLaunch(bm *testing.B) {
	e := newBenchEnv(bm)
	g, err := e.b.GraphCreate(0)
	if err != nil {
		bm.Fatal(err)
	}
	if _, err := e.b.GraphAddKernelNode(g, nil, e.fill); err != nil {
		bm.Fatal(err)
	}
	x, err := e.b.GraphInstantiate(g)
	if err != nil {
		bm.Fatal(err)
	}
	for i := 0; bm.Loop(); i++ {
		if err := e.b.GraphLaunch(x, e.s); err != nil {
			bm.Fatal(err)
		}
		if i%1024 == 1023 {
			e.b.StreamSynchronize(e.s)
		}
	}
	e.b.StreamSynchronize(e.s)
}
