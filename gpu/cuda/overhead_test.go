package cuda

import (
	"testing"
	"unsafe"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
	"github.com/stablegraph/stablegraph/kernels"
)

// The safe layer's own cost on the hot paths, measured without a GPU: each
// benchmark runs the call through a Backend over the stub driver ("safe")
// and the bare cu wrapper with the same arguments ("raw"). Both end in the
// same stub, so safe minus raw is what this package adds to a driver call:
// handle lookups, argument checks and packing, making the context current.
// On a real driver the context check also costs one purego call to
// cuCtxGetCurrent (about 0.09 µs on the H100, docs/GPU-MACHINE.md), which the
// stub answers at Go speed.

type overheadEnv struct {
	b     *Backend
	sd    *stubDriver
	s     gpu.Stream
	cs    cu.Stream
	p     gpu.DevicePtr
	fill  gpu.KernelParams
	cfill cu.Function
}

func newOverheadEnv(tb testing.TB) *overheadEnv {
	b, sd := newStubBackend(tb)
	m, err := b.ModuleLoad(0, kernels.Module())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { b.ModuleUnload(m) })
	f, err := b.ModuleFunction(m, kernels.Fill)
	if err != nil {
		tb.Fatal(err)
	}
	p, err := b.MemAlloc(0, 1<<20)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { b.MemFree(p) })
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { b.StreamDestroy(s) })
	_, cs, _ := b.stream("test", s)
	fi, _ := b.funcInfo("test", f)
	return &overheadEnv{b: b, sd: sd, s: s, cs: cs, p: p, cfill: fi.f,
		fill: gpu.KernelParams{Func: f, Config: kernels.Elementwise(256), Args: []gpu.Arg{gpu.Ptr(p), gpu.F32(1), gpu.I32(256)}}}
}

// graph makes a graph of one kernel node and one memcpy node, instantiated.
func (e *overheadEnv) graph(tb testing.TB) (gpu.Graph, gpu.GraphExec, gpu.GraphNode, gpu.GraphNode) {
	g, err := e.b.GraphCreate(0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.b.GraphDestroy(g) })
	kn, err := e.b.GraphAddKernelNode(g, nil, e.fill)
	if err != nil {
		tb.Fatal(err)
	}
	mn, err := e.b.GraphAddMemcpyNode(g, []gpu.GraphNode{kn}, gpu.MemcpyParams{Dst: e.p, Src: e.p + 4096, Size: 4096})
	if err != nil {
		tb.Fatal(err)
	}
	x, err := e.b.GraphInstantiate(g)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.b.GraphExecDestroy(x) })
	return g, x, kn, mn
}

// rawKernelParams is the C view of the fill arguments, built once.
type rawKernelParams struct {
	words [3]uint64
	ptrs  [3]unsafe.Pointer
}

// event makes an event of device 0 with flags, destroyed at cleanup.
func (e *overheadEnv) event(tb testing.TB, flags gpu.EventFlags) gpu.Event {
	tb.Helper()
	ev, err := e.b.EventCreate(0, flags)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.b.EventDestroy(ev) })
	return ev
}

// hostMem allocates 64 bytes of pinned host memory, freed at cleanup.
func (e *overheadEnv) hostMem(tb testing.TB) gpu.HostMem {
	tb.Helper()
	hm, err := e.b.HostAlloc(64)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.b.HostFree(hm.Handle) })
	return hm
}

func (e *overheadEnv) raw() *rawKernelParams {
	r := &rawKernelParams{}
	for i, a := range e.fill.Args {
		a.Encode(unsafe.Slice((*byte)(unsafe.Pointer(&r.words[i])), a.Size()))
		r.ptrs[i] = unsafe.Pointer(&r.words[i])
	}
	return r
}

func BenchmarkLaunchKernelOverhead(bm *testing.B) {
	e := newOverheadEnv(bm)
	cfg := e.fill.Config
	bm.Run("safe", func(bm *testing.B) {
		bm.ReportAllocs()
		for bm.Loop() {
			if err := e.b.LaunchKernel(e.fill.Func, cfg, e.fill.Args, e.s); err != nil {
				bm.Fatal(err)
			}
		}
	})
	bm.Run("raw", func(bm *testing.B) {
		bm.ReportAllocs()
		r := e.raw()
		for bm.Loop() {
			if res := e.b.d.LaunchKernel(e.cfill, cfg.Grid.X, cfg.Grid.Y, cfg.Grid.Z, cfg.Block.X, cfg.Block.Y, cfg.Block.Z,
				cfg.SharedMem, e.cs, &r.ptrs[0]); res != cu.Success {
				bm.Fatal(res)
			}
		}
	})
}

func BenchmarkExecKernelNodeSetParamsOverhead(bm *testing.B) {
	e := newOverheadEnv(bm)
	_, x, kn, _ := e.graph(bm)
	bm.Run("safe", func(bm *testing.B) {
		bm.ReportAllocs()
		p := e.fill
		p.Args = append([]gpu.Arg(nil), e.fill.Args...)
		for i := 0; bm.Loop(); i++ {
			p.Args[1] = gpu.F32(float32(i))
			if err := e.b.GraphExecKernelNodeSetParams(x, kn, p); err != nil {
				bm.Fatal(err)
			}
		}
	})
	bm.Run("raw", func(bm *testing.B) {
		bm.ReportAllocs()
		xi, _ := e.b.exec("test", x)
		ni, _, _ := e.b.nodeDev("test", kn)
		r := e.raw()
		c := e.fill.Config
		kp := &cu.KernelNodeParams{Func: e.cfill, GridDimX: c.Grid.X, GridDimY: c.Grid.Y, GridDimZ: c.Grid.Z,
			BlockDimX: c.Block.X, BlockDimY: c.Block.Y, BlockDimZ: c.Block.Z, KernelParams: unsafe.Pointer(&r.ptrs[0])}
		for bm.Loop() {
			if res := e.b.d.GraphExecKernelNodeSetParams(xi.x, ni.n, kp); res != cu.Success {
				bm.Fatal(res)
			}
		}
	})
}

func BenchmarkExecMemcpyNodeSetParamsOverhead(bm *testing.B) {
	e := newOverheadEnv(bm)
	_, x, _, mn := e.graph(bm)
	bm.Run("safe", func(bm *testing.B) {
		bm.ReportAllocs()
		for i := 0; bm.Loop(); i++ {
			p := gpu.MemcpyParams{Dst: e.p + gpu.DevicePtr(i%2)*8192, Src: e.p + 4096, Size: 4096}
			if err := e.b.GraphExecMemcpyNodeSetParams(x, mn, p); err != nil {
				bm.Fatal(err)
			}
		}
	})
	bm.Run("raw", func(bm *testing.B) {
		bm.ReportAllocs()
		xi, _ := e.b.exec("test", x)
		ni, _, _ := e.b.nodeDev("test", mn)
		cp := memcpyParams(gpu.MemcpyParams{Dst: e.p, Src: e.p + 4096, Size: 4096})
		ctx := e.b.devs[0].ctx
		for bm.Loop() {
			if res := e.b.d.GraphExecMemcpyNodeSetParams(xi.x, ni.n, &cp, ctx); res != cu.Success {
				bm.Fatal(res)
			}
		}
	})
}

func BenchmarkGraphAddKernelNodeOverhead(bm *testing.B) {
	e := newOverheadEnv(bm)
	const perGraph = 1000 // a fresh graph every perGraph nodes, so the tables stay at a realistic size
	bm.Run("safe", func(bm *testing.B) {
		bm.ReportAllocs()
		var g gpu.Graph
		var prev gpu.GraphNode
		for i := 0; bm.Loop(); i++ {
			if i%perGraph == 0 {
				bm.StopTimer()
				if g != 0 {
					e.b.GraphDestroy(g)
				}
				g, _ = e.b.GraphCreate(0)
				prev = 0
				bm.StartTimer()
			}
			var deps []gpu.GraphNode
			if prev != 0 {
				deps = []gpu.GraphNode{prev}
			}
			n, err := e.b.GraphAddKernelNode(g, deps, e.fill)
			if err != nil {
				bm.Fatal(err)
			}
			prev = n
		}
		e.b.GraphDestroy(g)
	})
	bm.Run("raw", func(bm *testing.B) {
		bm.ReportAllocs()
		gi := e.b.mustGraph(bm)
		r := e.raw()
		c := e.fill.Config
		kp := &cu.KernelNodeParams{Func: e.cfill, GridDimX: c.Grid.X, GridDimY: c.Grid.Y, GridDimZ: c.Grid.Z,
			BlockDimX: c.Block.X, BlockDimY: c.Block.Y, BlockDimZ: c.Block.Z, KernelParams: unsafe.Pointer(&r.ptrs[0])}
		deps := make([]cu.GraphNode, 1)
		var n cu.GraphNode
		for bm.Loop() {
			if res := e.b.d.GraphAddKernelNode(&n, gi, deps, kp); res != cu.Success {
				bm.Fatal(res)
			}
			deps[0] = n
		}
	})
}

// mustGraph makes a driver graph owned by the test (raw benchmarks).
func (b *Backend) mustGraph(tb testing.TB) cu.Graph {
	g, err := b.GraphCreate(0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { b.GraphDestroy(g) })
	gi, _ := b.graphInfo("test", g)
	return gi.g
}

func BenchmarkGraphLaunchOverhead(bm *testing.B) {
	e := newOverheadEnv(bm)
	_, x, _, _ := e.graph(bm)
	bm.Run("safe", func(bm *testing.B) {
		bm.ReportAllocs()
		for bm.Loop() {
			if err := e.b.GraphLaunch(x, e.s); err != nil {
				bm.Fatal(err)
			}
		}
	})
	bm.Run("raw", func(bm *testing.B) {
		bm.ReportAllocs()
		xi, _ := e.b.exec("test", x)
		for bm.Loop() {
			if res := e.b.d.GraphLaunch(xi.x, e.cs); res != cu.Success {
				bm.Fatal(res)
			}
		}
	})
}

func BenchmarkStreamWriteValue64Overhead(bm *testing.B) {
	e := newOverheadEnv(bm)
	hm := e.hostMem(bm)
	bm.Run("safe", func(bm *testing.B) {
		bm.ReportAllocs()
		for i := 0; bm.Loop(); i++ {
			if err := e.b.StreamWriteValue64(e.s, hm.Ptr, uint64(i)); err != nil {
				bm.Fatal(err)
			}
		}
	})
	bm.Run("raw", func(bm *testing.B) {
		bm.ReportAllocs()
		for i := 0; bm.Loop(); i++ {
			if res := e.b.d.StreamWriteValue64(e.cs, cu.DevicePtr(hm.Ptr), uint64(i), 0); res != cu.Success {
				bm.Fatal(res)
			}
		}
	})
}

func BenchmarkEventRecordOverhead(bm *testing.B) {
	e := newOverheadEnv(bm)
	ev := e.event(bm, gpu.EventDisableTiming)
	bm.Run("safe", func(bm *testing.B) {
		bm.ReportAllocs()
		for bm.Loop() {
			if err := e.b.EventRecord(ev, e.s); err != nil {
				bm.Fatal(err)
			}
		}
	})
	bm.Run("raw", func(bm *testing.B) {
		bm.ReportAllocs()
		_, ce, _ := e.b.event("test", ev)
		for bm.Loop() {
			if res := e.b.d.EventRecord(ce, e.cs); res != cu.Success {
				bm.Fatal(res)
			}
		}
	})
}

func BenchmarkMemcpyDtoDAsyncOverhead(bm *testing.B) {
	e := newOverheadEnv(bm)
	bm.Run("safe", func(bm *testing.B) {
		bm.ReportAllocs()
		for bm.Loop() {
			if err := e.b.MemcpyDtoDAsync(e.p, e.p+4096, 4096, e.s); err != nil {
				bm.Fatal(err)
			}
		}
	})
	bm.Run("raw", func(bm *testing.B) {
		bm.ReportAllocs()
		for bm.Loop() {
			if res := e.b.d.MemcpyDtoDAsync(cu.DevicePtr(e.p), cu.DevicePtr(e.p+4096), 4096, e.cs); res != cu.Success {
				bm.Fatal(res)
			}
		}
	})
}

func BenchmarkEventCreateDestroyOverhead(bm *testing.B) {
	e := newOverheadEnv(bm)
	bm.Run("safe", func(bm *testing.B) {
		bm.ReportAllocs()
		for bm.Loop() {
			ev, err := e.b.EventCreate(0, gpu.EventDisableTiming)
			if err != nil {
				bm.Fatal(err)
			}
			if err := e.b.EventDestroy(ev); err != nil {
				bm.Fatal(err)
			}
		}
	})
	bm.Run("raw", func(bm *testing.B) {
		bm.ReportAllocs()
		var ce cu.Event
		for bm.Loop() {
			if res := e.b.d.EventCreate(&ce, uint32(gpu.EventDisableTiming)); res != cu.Success {
				bm.Fatal(res)
			}
			if res := e.b.d.EventDestroy(ce); res != cu.Success {
				bm.Fatal(res)
			}
		}
	})
}
