package cuda

// Tests that need a GPU; each skips with the reason where there is none.

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
	"github.com/stablegraph/stablegraph/kernels"
)

// TestContextFromAnyThread makes calls from goroutines locked to threads
// whose current context was cleared: every call must make its handle's
// context current itself, including queries and destruction of handles
// created elsewhere.
func TestContextFromAnyThread(t *testing.T) {
	b := openOrSkip(t, gpu.Config{})
	closeClean(t, b)
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	const n = 1 << 12
	p, err := b.MemAlloc(0, 4*n)
	if err != nil {
		t.Fatal(err)
	}
	events := make([]gpu.Event, 8)
	for i := range events {
		if events[i], err = b.EventCreate(0, gpu.EventDisableTiming); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range events {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if r := b.d.CtxSetCurrent(0); r != cu.Success { // no context on this thread
				errs <- fmt.Errorf("cuCtxSetCurrent(NULL): %v", r)
				return
			}
			steps := []func() error{
				func() error { return b.MemsetAsync(gpu.Memset{Dst: p, Value: uint32(i), ElemSize: 4, Count: n}, s) },
				func() error { return b.EventRecord(events[i], s) },
				func() error { return b.EventSynchronize(events[i]) },
				func() error { _, err := b.StreamQuery(s); return err },
				func() error { _, _, err := b.MemGetInfo(0); return err },
				func() error { return b.EventDestroy(events[i]) }, // made on another goroutine
			}
			for j, f := range steps {
				if r := b.d.CtxSetCurrent(0); r != cu.Success {
					errs <- fmt.Errorf("cuCtxSetCurrent(NULL): %v", r)
					return
				}
				if err := f(); err != nil {
					errs <- fmt.Errorf("goroutine %d step %d: %w", i, j, err)
					return
				}
				var cur cu.Context
				if b.d.CtxGetCurrent(&cur); cur != b.devs[0].ctx {
					errs <- fmt.Errorf("goroutine %d step %d: context %#x current after the call, want device 0's %#x", i, j, cur, b.devs[0].ctx)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Destruction from yet another goroutine.
	done := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		b.d.CtxSetCurrent(0)
		if err := b.StreamSynchronize(s); err != nil {
			done <- err
			return
		}
		if err := b.MemFree(p); err != nil {
			done <- err
			return
		}
		done <- b.StreamDestroy(s)
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// gemmCase is one matrix product of the GEMM tests.
type gemmCase struct {
	m, n, k        int
	transA, transB bool
	alpha, beta    float32
}

func (c gemmCase) String() string {
	return fmt.Sprintf("m%d_n%d_k%d_tA%v_tB%v_beta%g", c.m, c.n, c.k, c.transA, c.transB, c.beta)
}

var gemmCases = []gemmCase{
	{m: 64, n: 48, k: 80, alpha: 1},
	{m: 33, n: 65, k: 17, transA: true, alpha: 0.5, beta: 0.25},
	{m: 128, n: 96, k: 200, transB: true, alpha: 1.5, beta: 0},
	{m: 7, n: 300, k: 31, transA: true, transB: true, alpha: -1, beta: 1},
	{m: 256, n: 256, k: 256, alpha: 1, beta: 0},
}

// gemmBufs holds one case's matrices on the device and on the host.
type gemmBufs struct {
	a, b, c, c0 []float32
	A, B, C     gpu.DevicePtr
}

func newGemmBufs(t *testing.T, b *Backend, r *rand.Rand, c gemmCase) *gemmBufs {
	t.Helper()
	g := &gemmBufs{a: randF32(r, c.m*c.k), b: randF32(r, c.k*c.n), c0: randF32(r, c.m*c.n)}
	for _, x := range []struct {
		dst *gpu.DevicePtr
		v   []float32
	}{{&g.A, g.a}, {&g.B, g.b}, {&g.C, g.c0}} {
		p, err := b.MemAlloc(0, uint64(4*len(x.v)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.MemFree(p) })
		if err := b.MemcpyHtoD(p, gpu.F32ToBytes(x.v)); err != nil {
			t.Fatal(err)
		}
		*x.dst = p
	}
	return g
}

// reset writes the initial C back (beta != 0 reads it).
func (g *gemmBufs) reset(t *testing.T, b *Backend) {
	t.Helper()
	if err := b.MemcpyHtoD(g.C, gpu.F32ToBytes(g.c0)); err != nil {
		t.Fatal(err)
	}
}

func (g *gemmBufs) check(t *testing.T, b *Backend, c gemmCase, what string) {
	t.Helper()
	out := make([]byte, 4*c.m*c.n)
	if err := b.MemcpyDtoH(out, g.C); err != nil {
		t.Fatal(err)
	}
	ref := gemmRef(g.a, g.b, g.c0, c.m, c.n, c.k, c.transA, c.transB, c.alpha, c.beta)
	e := relErr(gpu.BytesToF32(out), ref)
	t.Logf("%s %v: ‖C − ref‖/‖ref‖ = %.3g", what, c, e)
	if e > 1e-5 {
		t.Errorf("%s %v: relative error %.3g > 1e-5 (float32 arithmetic)", what, c, e)
	}
}

func (c gemmCase) run(b *Backend, s gpu.Stream, g *gemmBufs) error {
	return b.Gemm(s, g.C, g.A, g.B, c.m, c.n, c.k, c.transA, c.transB, c.alpha, c.beta)
}

// TestGemmPTX checks the fallback path (cuBLAS made unavailable), eager
// and captured.
func TestGemmPTX(t *testing.T) {
	b := openOrSkip(t, gpu.Config{CUBLASLibrary: "/nonexistent/libcublas.so"})
	closeClean(t, b)
	impl, err := b.GemmImpl(0)
	if err != nil || impl != "ptx" {
		t.Fatalf("GemmImpl = %q, %v; want ptx without cuBLAS", impl, err)
	}
	testGemm(t, b)
}

// TestGemmCUBLAS checks cuBLAS GEMMs eager and captured into a graph and
// replayed, then inspects the captured kernel nodes: the layout
// cuFuncGetParamInfo reports and where A, B and C sit in the raw parameter
// bytes (logged as CUBLAS-PARAMS lines), and patches those slots to move
// the product to new buffers.
func TestGemmCUBLAS(t *testing.T) {
	b := openOrSkip(t, gpu.Config{})
	closeClean(t, b)
	impl, err := b.GemmImpl(0)
	if err != nil {
		t.Fatal(err)
	}
	if impl != "cublas" {
		t.Skipf("cuBLAS not loaded: %v", b.blas.err)
	}
	t.Logf("cuBLAS: %s", b.blas.lib.Path)
	testGemm(t, b)
}

func testGemm(t *testing.T, b *Backend) {
	r := rand.New(rand.NewPCG(1, 2))
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.StreamDestroy(s)
	for _, c := range gemmCases {
		t.Run(c.String(), func(t *testing.T) {
			g := newGemmBufs(t, b, r, c)
			if err := c.run(b, s, g); err != nil {
				t.Fatal(err)
			}
			if err := b.StreamSynchronize(s); err != nil {
				t.Fatal(err)
			}
			g.check(t, b, c, "eager")

			// Captured: the GEMM becomes graph nodes, replayed twice.
			g.reset(t, b)
			if err := b.StreamBeginCapture(s); err != nil {
				t.Fatal(err)
			}
			if err := c.run(b, s, g); err != nil {
				b.StreamEndCapture(s)
				t.Fatalf("Gemm while capturing: %v", err)
			}
			graph, err := b.StreamEndCapture(s)
			if err != nil {
				t.Fatal(err)
			}
			defer b.GraphDestroy(graph)
			x, err := b.GraphInstantiate(graph)
			if err != nil {
				t.Fatal(err)
			}
			defer b.GraphExecDestroy(x)
			for i := range 2 {
				g.reset(t, b)
				if err := b.GraphLaunch(x, s); err != nil {
					t.Fatal(err)
				}
				if err := b.StreamSynchronize(s); err != nil {
					t.Fatal(err)
				}
				g.check(t, b, c, fmt.Sprintf("graph replay %d", i))
			}
			inspectAndPatch(t, b, r, s, c, g, graph, x)
		})
	}
}

// ptrRange is a device buffer to look for in parameter bytes.
type ptrRange struct {
	name string
	p    gpu.DevicePtr
	size uint64
}

// find names the buffer holding v, with the offset into it.
func find(v uint64, ranges []ptrRange) (string, bool) {
	for _, r := range ranges {
		if v >= uint64(r.p) && v < uint64(r.p)+r.size {
			if off := v - uint64(r.p); off != 0 {
				return fmt.Sprintf("%s+%d", r.name, off), true
			}
			return r.name, true
		}
	}
	return "", false
}

// inspectAndPatch logs the captured graph's kernel nodes (name, layout,
// pointer slots) and then moves the exec to new A, B, C buffers by
// rewriting the slots found (test-only: it rewrites words because they
// point into known buffers, which is exactly the layout knowledge the
// patching engine must get from FuncParamInfo plus recorded values).
func inspectAndPatch(t *testing.T, b *Backend, r *rand.Rand, s gpu.Stream, c gemmCase, g *gemmBufs, graph gpu.Graph, x gpu.GraphExec) {
	nodes, err := b.GraphNodes(graph)
	if err != nil {
		t.Fatal(err)
	}
	ranges := []ptrRange{
		{"A", g.A, uint64(4 * c.m * c.k)}, {"B", g.B, uint64(4 * c.k * c.n)}, {"C", g.C, uint64(4 * c.m * c.n)},
	}
	if ws := b.devs[0].gemm.ws; ws != 0 {
		ranges = append(ranges, ptrRange{"workspace", gpu.DevicePtr(ws), b.devs[0].gemm.wsSize})
	}
	g2 := newGemmBufs(t, b, r, c)
	move := map[string]gpu.DevicePtr{"A": g2.A, "B": g2.B, "C": g2.C}
	kernelsSeen := 0
	for i, n := range nodes {
		typ, err := b.GraphNodeType(n)
		if err != nil {
			t.Fatal(err)
		}
		deps, err := b.GraphNodeDeps(n)
		if err != nil {
			t.Fatal(err)
		}
		if typ != gpu.NodeKernel {
			t.Logf("CUBLAS-PARAMS %v node %d: %v, %d deps", c, i, typ, len(deps))
			continue
		}
		kernelsSeen++
		kp, err := b.GraphKernelNodeParams(n)
		if err != nil {
			t.Fatal(err)
		}
		name, err := b.FuncName(kp.Func)
		if err != nil {
			t.Fatal(err)
		}
		layout, err := b.FuncParamInfo(kp.Func)
		if err != nil {
			t.Fatal(err)
		}
		var total uint64
		for _, p := range layout {
			total = max(total, p.Offset+p.Size)
		}
		t.Logf("CUBLAS-PARAMS %v node %d: kernel %s grid %v block %v smem %d, %d deps; %d params, %d bytes: %v",
			c, i, name, kp.Config.Grid, kp.Config.Block, kp.Config.SharedMem, len(deps), len(layout), total, layout)
		if len(kp.Args) != len(layout) {
			t.Errorf("node %d: %d args for %d params", i, len(kp.Args), len(layout))
			continue
		}
		patched := make([]gpu.Arg, len(kp.Args))
		var found []string
		for j, a := range kp.Args {
			raw := argBytes(a)
			for off := uint64(0); off+8 <= uint64(len(raw)); off++ {
				if (layout[j].Offset+off)%8 != 0 {
					continue
				}
				v := binary.LittleEndian.Uint64(raw[off:])
				if what, ok := find(v, ranges); ok {
					found = append(found, fmt.Sprintf("param %d (offset %d, size %d) +%d = %s [abs offset %d]",
						j, layout[j].Offset, layout[j].Size, off, what, layout[j].Offset+off))
					base := strings.SplitN(what, "+", 2)[0]
					if to, ok := move[base]; ok {
						var old gpu.DevicePtr
						for _, rg := range ranges {
							if rg.name == base {
								old = rg.p
							}
						}
						binary.LittleEndian.PutUint64(raw[off:], v-uint64(old)+uint64(to))
					}
				}
			}
			if a.Kind == gpu.ArgBytes {
				patched[j] = gpu.Bytes(raw)
			} else {
				patched[j] = decodeTyped(a.Kind, raw)
			}
		}
		t.Logf("CUBLAS-PARAMS %v node %d pointer slots: %s", c, i, strings.Join(found, "; "))
		if len(found) == 0 {
			t.Errorf("node %d (%s): no A, B or C pointer found in its parameters", i, name)
		}
		kp.Args = patched
		if err := b.GraphExecKernelNodeSetParams(x, n, kp); err != nil {
			t.Fatalf("GraphExecKernelNodeSetParams(node %d): %v", i, err)
		}
	}
	if kernelsSeen == 0 {
		t.Fatalf("captured GEMM has no kernel node (%d nodes)", len(nodes))
	}
	// Replay into the new buffers; the old C must stay as it was.
	poison := make([]float32, c.m*c.n)
	for i := range poison {
		poison[i] = 12345
	}
	if err := b.MemcpyHtoD(g.C, gpu.F32ToBytes(poison)); err != nil {
		t.Fatal(err)
	}
	g2.reset(t, b)
	if err := b.GraphLaunch(x, s); err != nil {
		t.Fatal(err)
	}
	if err := b.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
	g2.check(t, b, c, "patched replay, new buffers")
	old := make([]byte, 4*c.m*c.n)
	if err := b.MemcpyDtoH(old, g.C); err != nil {
		t.Fatal(err)
	}
	for i, v := range gpu.BytesToF32(old) {
		if v != 12345 {
			t.Errorf("patched replay wrote the old C at [%d] = %v", i, v)
			break
		}
	}
}

// argBytes returns a copy of an argument's bytes.
func argBytes(a gpu.Arg) []byte {
	if a.Kind == gpu.ArgBytes {
		return append([]byte(nil), a.Raw...)
	}
	out := make([]byte, a.Size())
	a.Encode(out)
	return out
}

// TestCapturedOwnKernelIsTyped: a captured launch of one of our kernels
// reads back with typed arguments (its spec is known).
func TestCapturedOwnKernelIsTyped(t *testing.T) {
	b := openOrSkip(t, gpu.Config{})
	closeClean(t, b)
	m, err := b.ModuleLoad(0, kernels.Module())
	if err != nil {
		t.Fatal(err)
	}
	defer b.ModuleUnload(m)
	f, err := b.ModuleFunction(m, kernels.Axpb)
	if err != nil {
		t.Fatal(err)
	}
	const n = 1000
	y, err := b.MemAlloc(0, 4*n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.MemFree(y)
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.StreamDestroy(s)
	args := []gpu.Arg{gpu.Ptr(y), gpu.Ptr(y), gpu.F32(2), gpu.F32(3), gpu.I32(n)}
	if err := b.StreamBeginCapture(s); err != nil {
		t.Fatal(err)
	}
	if err := b.LaunchKernel(f, kernels.Elementwise(n), args, s); err != nil {
		t.Fatal(err)
	}
	g, err := b.StreamEndCapture(s)
	if err != nil {
		t.Fatal(err)
	}
	defer b.GraphDestroy(g)
	nodes, err := b.GraphNodes(g)
	if err != nil || len(nodes) != 1 {
		t.Fatalf("GraphNodes = %v, %v", nodes, err)
	}
	kp, err := b.GraphKernelNodeParams(nodes[0])
	if err != nil {
		t.Fatal(err)
	}
	if kp.Func != f || len(kp.Args) != len(args) {
		t.Fatalf("params %+v, want function %#x and %d args", kp, f, len(args))
	}
	for i := range args {
		if kp.Args[i].Kind != args[i].Kind || kp.Args[i].Bits != args[i].Bits {
			t.Errorf("arg %d = %v, want %v", i, kp.Args[i], args[i])
		}
	}
}
