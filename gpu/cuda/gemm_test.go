package cuda

// Tests of the GEMM library (gemm.go) that need a GPU; each skips with the
// reason where there is none, or where cuBLAS (or cuBLASLt) is not found.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

// gemmCase is one matrix product of the GEMM tests.
type gemmCase struct {
	m, n, k        int
	transA, transB bool
	alpha, beta    float32
	bias           bool
}

func (c gemmCase) String() string {
	return fmt.Sprintf("m%d_n%d_k%d_tA%v_tB%v_beta%g_bias%v", c.m, c.n, c.k, c.transA, c.transB, c.beta, c.bias)
}

var gemmCases = []gemmCase{
	{m: 8, n: 256, k: 256, alpha: 1, bias: true},    // mlp's layer (PyTorch's addmm)
	{m: 8, n: 256, k: 256, alpha: 1},                // mlp's layer without its bias
	{m: 64, n: 1024, k: 1024, alpha: 1, bias: true}, // mlp-large's layer
	{m: 256, n: 256, k: 8, transA: true, alpha: 1},  // train's dW = hᵀ·dz
	{m: 8, n: 256, k: 256, transB: true, alpha: 1},  // train's dh = dz·Wᵀ
	{m: 64, n: 48, k: 80, alpha: 1},
	{m: 33, n: 65, k: 17, transA: true, alpha: 0.5, beta: 0.25, bias: true},
	{m: 128, n: 96, k: 200, transB: true, alpha: 1.5, beta: 0},
	{m: 7, n: 300, k: 31, transA: true, transB: true, alpha: -1, beta: 1, bias: true},
}

// gemmBufs holds one case's matrices on the device and on the host.
type gemmBufs struct {
	a, b, c0, bias []float32
	A, B, C, Bias  gpu.DevicePtr
	ws             gpu.DevicePtr
	wsSize         uint64
}

func devF32(t testing.TB, b *Backend, v []float32) gpu.DevicePtr {
	t.Helper()
	p, err := b.MemAlloc(0, uint64(4*max(len(v), 1)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.MemFree(p) })
	if len(v) > 0 {
		if err := b.MemcpyHtoD(p, gpu.F32ToBytes(v)); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// newGemmBufs makes c's operands and, when withWorkspace, a workspace of
// the size the backend asks for.
func newGemmBufs(t testing.TB, b *Backend, r *rand.Rand, c gemmCase, withWorkspace bool) *gemmBufs {
	t.Helper()
	g := &gemmBufs{a: randF32(r, c.m*c.k), b: randF32(r, c.k*c.n), c0: randF32(r, c.m*c.n)}
	g.A, g.B, g.C = devF32(t, b, g.a), devF32(t, b, g.b), devF32(t, b, g.c0)
	if c.bias {
		g.bias = randF32(r, c.n)
		g.Bias = devF32(t, b, g.bias)
	}
	if withWorkspace {
		size, err := b.GemmWorkspaceSize(0)
		if err != nil {
			t.Fatal(err)
		}
		ws, err := b.MemAlloc(0, size)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.MemFree(ws) })
		g.ws, g.wsSize = ws, size
	}
	return g
}

func (g *gemmBufs) params(c gemmCase) gpu.GemmParams {
	return gpu.GemmParams{C: g.C, A: g.A, B: g.B, Bias: g.Bias, M: c.m, N: c.n, K: c.k,
		TransA: c.transA, TransB: c.transB, Alpha: c.alpha, Beta: c.beta, Workspace: g.ws, WorkspaceSize: g.wsSize}
}

// reset writes the initial C back (beta != 0 reads it).
func (g *gemmBufs) reset(t *testing.T, b *Backend) {
	t.Helper()
	if err := b.MemcpyHtoD(g.C, gpu.F32ToBytes(g.c0)); err != nil {
		t.Fatal(err)
	}
}

func (g *gemmBufs) read(t *testing.T, b *Backend, c gemmCase) []byte {
	t.Helper()
	out := make([]byte, 4*c.m*c.n)
	if err := b.MemcpyDtoH(out, g.C); err != nil {
		t.Fatal(err)
	}
	return out
}

// check compares C with a float64 reference of the product and bias, to
// float32 accuracy, and returns C's bytes.
func (g *gemmBufs) check(t *testing.T, b *Backend, c gemmCase, what string) []byte {
	t.Helper()
	out := g.read(t, b, c)
	ref := gemmRef(g.a, g.b, g.c0, c.m, c.n, c.k, c.transA, c.transB, c.alpha, c.beta)
	for i := range ref {
		if c.bias {
			ref[i] += float64(g.bias[i%c.n])
		}
	}
	e := relErr(gpu.BytesToF32(out), ref)
	t.Logf("%s %v: ‖C − ref‖/‖ref‖ = %.3g", what, c, e)
	if e > 1e-5 {
		t.Errorf("%s %v: relative error %.3g > 1e-5 (float32 arithmetic)", what, c, e)
	}
	return out
}

func cublasOrSkip(t testing.TB) *Backend {
	t.Helper()
	b := openOrSkip(t, Config{})
	closeClean(t, b)
	blas, lt, err := b.GemmLibraries()
	if blas == "" {
		t.Skipf("cuBLAS not loaded: %v", err)
	}
	t.Logf("cuBLAS: %s; cuBLASLt: %s (%v)", blas, lt, err)
	return b
}

// TestGemmWithoutCUBLAS: without libcublas the library refuses with
// gpu.ErrNotSupported, which is the callers' cue for the built-in kernels
// (package internal/blas's fallback, tested on CUDA in blas's tests).
func TestGemmWithoutCUBLAS(t *testing.T) {
	b := openOrSkip(t, Config{LibCUBLAS: "/nonexistent/libcublas.so"})
	closeClean(t, b)
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.StreamDestroy(s)
	p := gpu.GemmParams{C: 256, A: 512, B: 768, M: 2, N: 2, K: 2, Alpha: 1}
	if err := b.Gemm(s, p); !errors.Is(err, gpu.ErrNotSupported) {
		t.Errorf("Gemm without cuBLAS = %v, want ErrNotSupported", err)
	}
	if err := b.GemmPrepare(0, p); !errors.Is(err, gpu.ErrNotSupported) {
		t.Errorf("GemmPrepare without cuBLAS = %v, want ErrNotSupported", err)
	}
}

// TestGemmBadInput: every kind of bad parameter is ErrInvalidValue before
// anything runs.
func TestGemmBadInput(t *testing.T) {
	b := cublasOrSkip(t)
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.StreamDestroy(s)
	ok := gpu.GemmParams{C: 1 << 20, A: 2 << 20, B: 3 << 20, M: 4, N: 4, K: 4, Alpha: 1}
	for name, mod := range map[string]func(*gpu.GemmParams){
		"negative":          func(p *gpu.GemmParams) { p.K = -1 },
		"too large":         func(p *gpu.GemmParams) { p.M = 1 << 32 },
		"null C":            func(p *gpu.GemmParams) { p.C = 0 },
		"null A":            func(p *gpu.GemmParams) { p.A = 0 },
		"misaligned B":      func(p *gpu.GemmParams) { p.B += 2 },
		"misaligned bias":   func(p *gpu.GemmParams) { p.Bias = 1<<20 + 6 },
		"workspace no size": func(p *gpu.GemmParams) { p.Workspace = 4 << 20 },
		"size no workspace": func(p *gpu.GemmParams) { p.WorkspaceSize = 1024 },
	} {
		p := ok
		mod(&p)
		if err := b.Gemm(s, p); !errors.Is(err, gpu.ErrInvalidValue) {
			t.Errorf("%s: Gemm = %v, want ErrInvalidValue", name, err)
		}
		if err := b.GemmPrepare(0, p); !errors.Is(err, gpu.ErrInvalidValue) {
			t.Errorf("%s: GemmPrepare = %v, want ErrInvalidValue", name, err)
		}
	}
	if err := b.Gemm(0, ok); !errors.Is(err, gpu.ErrInvalidHandle) {
		t.Errorf("Gemm on stream 0 = %v, want ErrInvalidHandle", err)
	}
}

// TestGemmResults checks every case against a float64 reference, prepared
// (measured) and not, eager and captured: the captured graph holds no
// memory node (the workspace is the caller's), replays to the same bits as
// the eager call, twice. The CUBLAS-PARAMS lines describe the captured
// kernels: names, parameter layouts and where the operands sit in the raw
// parameter bytes.
func TestGemmResults(t *testing.T) {
	b := cublasOrSkip(t)
	r := rand.New(rand.NewPCG(1, 2))
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.StreamDestroy(s)
	for _, prepared := range []bool{true, false} {
		for _, c := range gemmCases {
			t.Run(fmt.Sprintf("prepared=%v/%v", prepared, c), func(t *testing.T) {
				g := newGemmBufs(t, b, r, c, true)
				p := g.params(c)
				if prepared {
					if err := b.GemmPrepare(0, p); err != nil {
						t.Fatal(err)
					}
				}
				if err := b.Gemm(s, p); err != nil {
					t.Fatal(err)
				}
				if err := b.StreamSynchronize(s); err != nil {
					t.Fatal(err)
				}
				how, _ := b.GemmChoice(0, p)
				t.Logf("CUBLAS-CHOICE %v prepared=%v: %s", c, prepared, how)
				eager := g.check(t, b, c, "eager")
				g.reset(t, b)
				if err := b.Gemm(s, p); err != nil {
					t.Fatal(err)
				}
				if err := b.StreamSynchronize(s); err != nil {
					t.Fatal(err)
				}
				if again := g.read(t, b, c); string(again) != string(eager) {
					t.Errorf("a second eager call differs in bits from the first")
				}

				g.reset(t, b)
				graph := captureGemm(t, b, s, p)
				defer b.GraphDestroy(graph)
				counts := nodeCounts(t, b, graph)
				t.Logf("CUBLAS-NODES %v: %v", c, counts)
				if counts[gpu.NodeMemAlloc]+counts[gpu.NodeMemFree] != 0 {
					t.Errorf("captured with a workspace, the GEMM still has memory nodes: %v", counts)
				}
				g.replayTwice(t, b, s, graph, c, eager, "graph")
				logParams(t, b, c, g, graph)
			})
		}
	}
}

func captureGemm(t testing.TB, b *Backend, s gpu.Stream, p gpu.GemmParams) gpu.Graph {
	t.Helper()
	if err := b.StreamBeginCapture(s); err != nil {
		t.Fatal(err)
	}
	if err := b.Gemm(s, p); err != nil {
		b.StreamEndCapture(s)
		t.Fatalf("Gemm while capturing: %v", err)
	}
	g, err := b.StreamEndCapture(s)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// replayTwice instantiates graph and replays it twice on s, each time
// from reset buffers, failing the test where a replay's output differs in
// bits from want (the eager call's).
func (g *gemmBufs) replayTwice(t *testing.T, b *Backend, s gpu.Stream, graph gpu.Graph, c gemmCase, want []byte, name string) {
	t.Helper()
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
		if got := g.read(t, b, c); string(got) != string(want) {
			t.Errorf("%s replay %d differs in bits from the eager call", name, i)
		}
	}
}

func nodeCounts(t *testing.T, b *Backend, g gpu.Graph) map[gpu.NodeType]int {
	t.Helper()
	nodes, err := b.GraphNodes(g)
	if err != nil {
		t.Fatal(err)
	}
	out := map[gpu.NodeType]int{}
	for _, n := range nodes {
		typ, err := b.GraphNodeType(n)
		if err != nil {
			t.Fatal(err)
		}
		out[typ]++
	}
	return out
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

// logParams logs the captured graph's kernel nodes: name, launch shape,
// parameter layout, and every 8-byte word that holds an address of A, B,
// C, the bias or the workspace.
func logParams(t *testing.T, b *Backend, c gemmCase, g *gemmBufs, graph gpu.Graph) {
	nodes, err := b.GraphNodes(graph)
	if err != nil {
		t.Fatal(err)
	}
	ranges := []ptrRange{
		{"A", g.A, uint64(4 * c.m * c.k)}, {"B", g.B, uint64(4 * c.k * c.n)}, {"C", g.C, uint64(4 * c.m * c.n)},
		{"workspace", g.ws, g.wsSize},
	}
	if c.bias {
		ranges = append(ranges, ptrRange{"bias", g.Bias, uint64(4 * c.n)})
	}
	for i, n := range nodes {
		typ, err := b.GraphNodeType(n)
		if err != nil {
			t.Fatal(err)
		}
		if typ != gpu.NodeKernel {
			t.Logf("CUBLAS-PARAMS %v node %d: %v", c, i, typ)
			continue
		}
		kp, err := b.GraphKernelNodeParams(n)
		if err != nil {
			t.Fatal(err)
		}
		name, _ := b.FuncName(kp.Func)
		layout, err := b.FuncParamInfo(kp.Func)
		if err != nil {
			t.Fatal(err)
		}
		var found []string
		for j, a := range kp.Args {
			raw := argBytes(a)
			for off := 0; off+8 <= len(raw); off += 8 {
				if what, ok := find(binary.LittleEndian.Uint64(raw[off:]), ranges); ok {
					found = append(found, fmt.Sprintf("param %d +%d = %s", j, off, what))
				}
			}
		}
		t.Logf("CUBLAS-PARAMS %v node %d: kernel %s grid %v block %v smem %d; layout %v; pointers: %s",
			c, i, name, kp.Config.Grid, kp.Config.Block, kp.Config.SharedMem, layout, strings.Join(found, "; "))
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

// TestGemmPathsBitStable runs each implementation (cublasSgemm, and
// cublasLtMatmul with the heuristic's first algorithm) on the mlp layer
// with its bias three times eager and twice replayed: every run must give
// the same bits, and both must match the float64 reference.
func TestGemmPathsBitStable(t *testing.T) {
	b := cublasOrSkip(t)
	r := rand.New(rand.NewPCG(3, 4))
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.StreamDestroy(s)
	c := gemmCase{m: 8, n: 256, k: 256, alpha: 1, bias: true}
	g := newGemmBufs(t, b, r, c, true)
	p := g.params(c)
	d := b.devs[0]
	d.gemm.mu.Lock()
	err = b.prepareLocked(0, d)
	var lt *gemmChoice
	if err == nil && d.gemm.lt != 0 {
		lt, err = b.chooseLocked(0, d, p)
	}
	d.gemm.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	paths := map[string]*gemmChoice{"sgemm": {impl: implSgemm}}
	if lt != nil && lt.impl == implLt {
		paths["lt"] = lt
		defer b.destroyLt(lt)
	} else {
		t.Logf("no cuBLASLt algorithm; testing cublasSgemm only")
	}
	_, cs, err := b.stream("test", s)
	if err != nil {
		t.Fatal(err)
	}
	for name, ch := range paths {
		t.Run(name, func(t *testing.T) {
			run := func() error {
				d.gemm.mu.Lock()
				defer d.gemm.mu.Unlock()
				return b.runLocked(0, d, ch, cs, p)
			}
			var first []byte
			for i := range 3 {
				g.reset(t, b)
				if err := run(); err != nil {
					t.Fatal(err)
				}
				if err := b.StreamSynchronize(s); err != nil {
					t.Fatal(err)
				}
				out := g.check(t, b, c, fmt.Sprintf("%s eager %d", name, i))
				if first == nil {
					first = out
				} else if string(out) != string(first) {
					t.Errorf("%s eager run %d differs in bits from the first", name, i)
				}
			}
			if err := b.StreamBeginCapture(s); err != nil {
				t.Fatal(err)
			}
			if err := run(); err != nil {
				b.StreamEndCapture(s)
				t.Fatal(err)
			}
			graph, err := b.StreamEndCapture(s)
			if err != nil {
				t.Fatal(err)
			}
			defer b.GraphDestroy(graph)
			t.Logf("%s captured: %v", name, nodeCounts(t, b, graph))
			g.replayTwice(t, b, s, graph, c, first, name)
		})
	}
}

// TestGemmWorkspace is the measurement behind GemmWorkspaceSize and the
// H100 report's memory nodes: 8 layers of the mlp GEMM (with and without
// the bias) plus a tanh, captured flat with no workspace (cuBLAS's own,
// which it allocates inside the capture) and with workspaces of several
// sizes; for each, the node counts, the algorithm kept and the heuristic's
// workspace needs. Only the owned workspace's absence of memory nodes is
// asserted; the rest is logged (GEMM-WS lines) to size the workspace.
func TestGemmWorkspace(t *testing.T) {
	b := cublasOrSkip(t)
	r := rand.New(rand.NewPCG(5, 6))
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.StreamDestroy(s)
	m, err := b.ModuleLoad(0, kernels.Module())
	if err != nil {
		t.Fatal(err)
	}
	defer b.ModuleUnload(m)
	tanh, err := b.ModuleFunction(m, kernels.Tanh)
	if err != nil {
		t.Fatal(err)
	}
	for _, bias := range []bool{false, true} {
		c := gemmCase{m: 8, n: 256, k: 256, alpha: 1, bias: bias}
		g := newGemmBufs(t, b, r, c, false)
		for _, size := range []uint64{0, 64 << 10, 1 << 20, 4 << 20, 32 << 20} {
			p := g.params(c)
			if size > 0 {
				ws, err := b.MemAlloc(0, size)
				if err != nil {
					t.Fatal(err)
				}
				defer b.MemFree(ws)
				p.Workspace, p.WorkspaceSize = ws, size
				if err := b.GemmPrepare(0, p); err != nil {
					t.Fatal(err)
				}
			}
			if err := b.StreamBeginCapture(s); err != nil {
				t.Fatal(err)
			}
			for range 8 {
				if err := b.Gemm(s, p); err != nil {
					b.StreamEndCapture(s)
					t.Fatal(err)
				}
				if err := b.LaunchKernel(tanh, kernels.Elementwise(c.m*c.n), []gpu.Arg{gpu.Ptr(g.C), gpu.Ptr(g.C), gpu.I32(int32(c.m * c.n))}, s); err != nil {
					b.StreamEndCapture(s)
					t.Fatal(err)
				}
			}
			graph, err := b.StreamEndCapture(s)
			if err != nil {
				t.Fatal(err)
			}
			counts := nodeCounts(t, b, graph)
			b.GraphDestroy(graph)
			how, _ := b.GemmChoice(0, p)
			t.Logf("GEMM-WS bias=%v workspace=%d: nodes %v; kept: %s", bias, size, counts, how)
			if size > 0 && counts[gpu.NodeMemAlloc]+counts[gpu.NodeMemFree] != 0 {
				t.Errorf("bias=%v workspace=%d: memory nodes in the capture: %v", bias, size, counts)
			}
			if size > 0 && counts[gpu.NodeKernel] < 16 {
				t.Errorf("bias=%v workspace=%d: %d kernel nodes for 8 GEMMs and 8 tanh", bias, size, counts[gpu.NodeKernel])
			}
		}
	}
}

// BenchmarkGemmNodeUpdate is what patch pays on the host to move a GEMM:
// one exec update (cuGraphExecKernelNodeSetParams_v2) of each kernel node
// of a captured GEMM, at the shapes of mlp's and mlp-large's layers, with
// the node's own parameters (the driver does the same work whatever the
// values), through GraphExecKernelNodeSetParams and through a prepared node
// set (naming the node's function, or the library's context-independent
// kernel), and the graph launch that follows an update against one that
// follows none. Sub-benchmarks are named by shape, node and kernel; the
// metrics are host microseconds per update and per launch.
func BenchmarkGemmNodeUpdate(bm *testing.B) {
	b := cublasOrSkip(bm)
	r := rand.New(rand.NewPCG(7, 8))
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		bm.Fatal(err)
	}
	defer b.StreamDestroy(s)
	for _, c := range []gemmCase{gemmCases[0], gemmCases[2]} {
		g := newGemmBufs(bm, b, r, c, true)
		p := g.params(c)
		if err := b.GemmPrepare(0, p); err != nil {
			bm.Fatal(err)
		}
		graph := captureGemm(bm, b, s, p)
		defer b.GraphDestroy(graph)
		x, err := b.GraphInstantiate(graph)
		if err != nil {
			bm.Fatal(err)
		}
		defer b.GraphExecDestroy(x)
		nodes, err := b.GraphNodes(graph)
		if err != nil {
			bm.Fatal(err)
		}
		for i, n := range nodes {
			if typ, err := b.GraphNodeType(n); err != nil || typ != gpu.NodeKernel {
				continue
			}
			kp, err := b.GraphKernelNodeParams(n)
			if err != nil {
				bm.Fatal(err)
			}
			name, _ := b.FuncName(kp.Func)
			size := 0
			for _, a := range kp.Args {
				size += len(argBytes(a))
			}
			short := name
			if len(short) > 24 {
				short = short[:24]
			}
			label := fmt.Sprintf("m%d_n%d_k%d/node%d_%s_%dB", c.m, c.n, c.k, i, short, size)
			bm.Run(label+"/update", func(bm *testing.B) {
				for bm.Loop() {
					if err := b.GraphExecKernelNodeSetParams(x, n, kp); err != nil {
						bm.Fatal(err)
					}
				}
			})
			// The prepared node set patch uses: one driver call, the node
			// named by its function in the context, or (kern) by the
			// context-independent kernel the library launched.
			for _, byKernel := range []bool{false, true} {
				bm.Run(fmt.Sprintf("%s/update-set-kern=%v", label, byKernel), func(bm *testing.B) {
					b.setByKernel = byKernel
					defer func() { b.setByKernel = false }()
					set, err := b.PrepareKernelNodes(x, []gpu.GraphNode{n}, []gpu.KernelParams{kp})
					if err != nil {
						bm.Fatal(err)
					}
					defer set.Close()
					idx := []int32{0}
					for bm.Loop() {
						if _, err := set.Apply(idx); err != nil {
							bm.Fatal(err)
						}
					}
				})
			}
			for _, update := range []bool{false, true} {
				bm.Run(fmt.Sprintf("%s/launch-after-update=%v", label, update), func(bm *testing.B) {
					var host time.Duration
					steps := 0
					for bm.Loop() {
						if update {
							if err := b.GraphExecKernelNodeSetParams(x, n, kp); err != nil {
								bm.Fatal(err)
							}
						}
						t0 := time.Now()
						if err := b.GraphLaunch(x, s); err != nil {
							bm.Fatal(err)
						}
						host += time.Since(t0)
						if err := b.StreamSynchronize(s); err != nil {
							bm.Fatal(err)
						}
						steps++
					}
					bm.ReportMetric(float64(host.Nanoseconds())/1e3/float64(max(steps, 1)), "launch-host-µs")
				})
			}
		}
	}
}
