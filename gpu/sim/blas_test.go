package sim

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
)

// gemmData is one product's operands on the device and on the host.
type gemmData struct {
	p             gpu.GemmParams
	a, b, c, bias []float32
}

// newGemm allocates a product's operands at offset off (bytes) past
// 256-byte aligned allocations, so that off sets their alignment class.
func newGemm(t *testing.T, b *Backend, r *rand.Rand, m, n, k int, bias bool, off uint64) *gemmData {
	t.Helper()
	d := &gemmData{a: randVals(r, m*k), b: randVals(r, k*n), c: randVals(r, m*n)}
	put := func(v []float32) gpu.DevicePtr {
		p := alloc(t, b, 0, uint64(4*len(v))+off).Add(off)
		writeF32(t, b, p, v)
		return p
	}
	d.p = gpu.GemmParams{A: put(d.a), B: put(d.b), C: put(d.c), M: m, N: n, K: k, Alpha: 1}
	if bias {
		d.bias = randVals(r, n)
		d.p.Bias = put(d.bias)
	}
	return d
}

func randVals(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.Float64()*2 - 1)
	}
	return v
}

// ref is the product in float64.
func (d *gemmData) ref() []float64 {
	p := d.p
	out := make([]float64, p.M*p.N)
	for i := range p.M {
		for j := range p.N {
			var s float64
			for l := range p.K {
				av, bv := d.a[i*p.K+l], d.b[l*p.N+j]
				if p.TransA {
					av = d.a[l*p.M+i]
				}
				if p.TransB {
					bv = d.b[j*p.K+l]
				}
				s += float64(av) * float64(bv)
			}
			v := float64(p.Alpha)*s + float64(p.Beta)*float64(d.c[i*p.N+j])
			if d.bias != nil {
				v += float64(d.bias[j])
			}
			out[i*p.N+j] = v
		}
	}
	return out
}

func (d *gemmData) check(t *testing.T, got []float32) {
	t.Helper()
	var num, den float64
	for i, r := range d.ref() {
		num += (float64(got[i]) - r) * (float64(got[i]) - r)
		den += r * r
	}
	if e := math.Sqrt(num / den); e > 1e-5 || math.IsNaN(e) {
		t.Fatalf("relative error %.3g against the float64 product", e)
	}
}

// kernelsOf returns the kernel names of a graph's kernel nodes and its
// node types, in order.
func kernelsOf(t *testing.T, b *Backend, g gpu.Graph) (names []string, types []gpu.NodeType) {
	t.Helper()
	nodes, err := b.GraphNodes(g)
	must(t, err)
	for _, n := range nodes {
		typ, err := b.GraphNodeType(n)
		must(t, err)
		types = append(types, typ)
		if typ == gpu.NodeKernel {
			kp, err := b.GraphKernelNodeParams(n)
			must(t, err)
			name, err := b.FuncName(kp.Func)
			must(t, err)
			names = append(names, name)
		}
	}
	return names, types
}

func captureGemm(t *testing.T, b *Backend, s gpu.Stream, p gpu.GemmParams) gpu.Graph {
	t.Helper()
	must(t, b.StreamBeginCapture(s))
	if err := b.Gemm(s, p); err != nil {
		b.StreamEndCapture(s)
		t.Fatal(err)
	}
	g, err := b.StreamEndCapture(s)
	must(t, err)
	t.Cleanup(func() { b.GraphDestroy(g) })
	return g
}

// TestGemmKernelChoice: the library picks its kernels by shape, alignment
// and workspace, as cuBLAS does, and every path computes the product and
// bias to float32 accuracy, eager and replayed, with the same bits.
func TestGemmKernelChoice(t *testing.T) {
	b := newSim(t, Config{})
	s := newStream(t, b, 0)
	r := rand.New(rand.NewPCG(1, 2))
	ws := alloc(t, b, 0, blasWorkspace)
	for _, c := range []struct {
		name          string
		m, n, k       int
		off           uint64
		workspace     bool
		want          []string
		transA, trans bool
	}{
		{"split-K (mlp's layer)", 8, 256, 256, 0, true, []string{"simblas_sgemm_splitk", "simblas_splitk_reduce"}, false, false},
		{"vectorised", 64, 96, 32, 0, true, []string{"simblas_sgemm_128x32_vec4"}, false, false},
		{"scalar: 8-byte aligned", 64, 96, 32, 8, true, []string{"simblas_sgemm_64x16"}, false, false},
		{"scalar: odd shape", 33, 65, 17, 0, true, []string{"simblas_sgemm_64x16"}, true, true},
		{"no split without room", 8, 256, 256, 0, false, []string{"simblas_sgemm_128x32_vec4"}, false, false},
		// Large enough to be shared out over goroutines and to stream B
		// through several panels.
		{"vectorised, large", 64, 520, 512, 0, true, []string{"simblas_sgemm_128x32_vec4"}, false, false},
		{"scalar, transposed, large", 33, 601, 300, 0, true, []string{"simblas_sgemm_64x16"}, true, true},
		{"split-K, transposed B", 8, 64, 1000, 0, true, []string{"simblas_sgemm_splitk", "simblas_splitk_reduce"}, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := newGemm(t, b, r, c.m, c.n, c.k, true, c.off)
			d.p.TransA, d.p.TransB = c.transA, c.trans
			d.p.Beta = 0.5
			if c.workspace {
				d.p.Workspace, d.p.WorkspaceSize = ws, blasWorkspace
			} else {
				d.p.Workspace, d.p.WorkspaceSize = ws, 1024 // too small to split
			}
			must(t, b.GemmPrepare(0, d.p))
			must(t, b.Gemm(s, d.p))
			must(t, b.StreamSynchronize(s))
			eager := readF32(t, b, d.p.C, c.m*c.n)
			d.check(t, eager)
			parts := 0
			if len(c.want) == 2 {
				parts = min(splitMaxParts, c.k/splitChunk)
			}
			if want := d.plain(parts); sameBits(want, eager) >= 0 {
				t.Fatal("the product's bits are not the plain loop's (each element summed in K order, split by part)")
			}

			writeF32(t, b, d.p.C, d.c)
			g := captureGemm(t, b, s, d.p)
			names, types := kernelsOf(t, b, g)
			if fmt.Sprint(names) != fmt.Sprint(c.want) || len(types) != len(c.want) {
				t.Fatalf("captured %v (%v), want kernels %v", names, types, c.want)
			}
			x := instantiate(t, b, g)
			must(t, b.GraphLaunch(x, s))
			must(t, b.StreamSynchronize(s))
			if got := readF32(t, b, d.p.C, c.m*c.n); fmt.Sprint(got) != fmt.Sprint(eager) {
				t.Fatal("the replay differs in bits from the eager call")
			}
		})
	}
}

// TestGemmPathsBits: the two one-kernel paths give the same bits (only the
// layout of their parameters differs), the split's differ (its sums are
// grouped by part), and all are close to the float64 product.
func TestGemmPathsBits(t *testing.T) {
	b := newSim(t, Config{})
	s := newStream(t, b, 0)
	r := rand.New(rand.NewPCG(3, 4))
	d := newGemm(t, b, r, 16, 64, 512, false, 0)
	place := func(v []float32, off uint64) gpu.DevicePtr {
		p := alloc(t, b, 0, uint64(4*len(v))+off).Add(off)
		writeF32(t, b, p, v)
		return p
	}
	run := func(p gpu.GemmParams) []float32 {
		t.Helper()
		must(t, b.Gemm(s, p))
		must(t, b.StreamSynchronize(s))
		out := readF32(t, b, p.C, p.M*p.N)
		d.check(t, out)
		return out
	}
	// A workspace too small to split: one kernel, vectorised at 256-byte
	// aligned operands, scalar at the same values 8 bytes off.
	small := alloc(t, b, 0, 256)
	vec := d.p
	vec.Workspace, vec.WorkspaceSize = small, 256
	scalar := vec
	scalar.A, scalar.B, scalar.C = place(d.a, 8), place(d.b, 8), place(d.c, 8)
	one, other := run(vec), run(scalar)
	if fmt.Sprint(one) != fmt.Sprint(other) {
		t.Error("the vectorised and scalar kernels differ in bits")
	}
	// No workspace: an eager call takes the library's own, room to split.
	split := run(d.p)
	if fmt.Sprint(split) == fmt.Sprint(one) {
		t.Error("the split-K product has the one-kernel product's bits; its sums are grouped differently")
	}
}

// TestGemmCaptureWithoutWorkspace: given no workspace, a captured call
// allocates one inside the capture, at a new address each time, bracketed
// by memory nodes; such a graph runs, but is refused as a child graph (as
// CUDA refuses it), and an exec update cannot move its allocation. With a
// workspace the capture has no memory node and every capture holds the
// same parameters.
func TestGemmCaptureWithoutWorkspace(t *testing.T) {
	b := newSim(t, Config{})
	s := newStream(t, b, 0)
	r := rand.New(rand.NewPCG(5, 6))
	d := newGemm(t, b, r, 8, 256, 256, true, 0)
	must(t, b.Gemm(s, d.p)) // eager, the library's own workspace
	must(t, b.StreamSynchronize(s))
	want := readF32(t, b, d.p.C, 8*256)
	d.check(t, want)

	wsOf := func(g gpu.Graph) uint64 { // the split kernel's workspace (encodeSplit)
		nodes, err := b.GraphNodes(g)
		must(t, err)
		for _, n := range nodes {
			if typ, _ := b.GraphNodeType(n); typ == gpu.NodeKernel {
				kp, err := b.GraphKernelNodeParams(n)
				must(t, err)
				return binary.LittleEndian.Uint64(kp.Args[0].Raw[16:])
			}
		}
		t.Fatal("no kernel node")
		return 0
	}
	g1, g2 := captureGemm(t, b, s, d.p), captureGemm(t, b, s, d.p)
	names, types := kernelsOf(t, b, g1)
	if fmt.Sprint(types) != fmt.Sprint([]gpu.NodeType{gpu.NodeMemAlloc, gpu.NodeKernel, gpu.NodeKernel, gpu.NodeMemFree}) {
		t.Fatalf("captured without a workspace: %v (%v)", types, names)
	}
	if wsOf(g1) == wsOf(g2) {
		t.Fatal("two captures hold the same workspace address; each should allocate its own")
	}
	writeF32(t, b, d.p.C, d.c)
	x := instantiate(t, b, g1)
	must(t, b.GraphLaunch(x, s))
	must(t, b.StreamSynchronize(s))
	if got := readF32(t, b, d.p.C, 8*256); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatal("the replay differs in bits from the eager call")
	}
	parent := newGraph(t, b, 0)
	_, err := b.GraphAddChildGraphNode(parent, nil, g1)
	wantErr(t, err, gpu.ErrInvalidValue)
	wantErr(t, b.GraphExecUpdate(x, g2), gpu.ErrGraphUpdate)

	ws := alloc(t, b, 0, blasWorkspace)
	d.p.Workspace, d.p.WorkspaceSize = ws, blasWorkspace
	h1, h2 := captureGemm(t, b, s, d.p), captureGemm(t, b, s, d.p)
	if _, types := kernelsOf(t, b, h1); fmt.Sprint(types) != fmt.Sprint([]gpu.NodeType{gpu.NodeKernel, gpu.NodeKernel}) {
		t.Fatalf("captured with a workspace: %v", types)
	}
	if wsOf(h1) != uint64(ws) || wsOf(h2) != uint64(ws) {
		t.Fatalf("the kernels use %#x and %#x, not the workspace given (%#x)", wsOf(h1), wsOf(h2), uint64(ws))
	}
	_, err = b.GraphAddChildGraphNode(parent, nil, h1)
	must(t, err)
}

// TestGemmMisalignedVectorFaults: the vectorised kernel moved to an
// address of another alignment class faults, as a misaligned vector load
// does on a GPU; this is what a trace reused across classes would do.
func TestGemmMisalignedVectorFaults(t *testing.T) {
	b := newSim(t, Config{})
	s := newStream(t, b, 0)
	r := rand.New(rand.NewPCG(7, 8))
	d := newGemm(t, b, r, 64, 96, 32, false, 0)
	d.p.Workspace, d.p.WorkspaceSize = alloc(t, b, 0, 4096), 4096
	g := captureGemm(t, b, s, d.p)
	nodes, err := b.GraphNodes(g)
	must(t, err)
	kp, err := b.GraphKernelNodeParams(nodes[0])
	must(t, err)
	x := instantiate(t, b, g)
	binary.LittleEndian.PutUint64(kp.Args[0].Raw[0:], uint64(d.p.C)+4) // C moved by 4 bytes
	must(t, b.GraphExecKernelNodeSetParams(x, nodes[0], kp))
	must(t, b.GraphLaunch(x, s))
	fe := wantFault(t, b.StreamSynchronize(s))
	if fe.Kernel != "simblas_sgemm_128x32_vec4" || fe.Addr != d.p.C+4 {
		t.Errorf("fault %v", fe)
	}
	must(t, b.ResetDevice(0))
}

// TestGemmShortBFaults: a B that runs past its allocation faults as one
// read of all of B would, at the first byte past it, before C is touched
// (the kernel streams B, but checks its whole range first).
func TestGemmShortBFaults(t *testing.T) {
	b := newSim(t, Config{})
	s := newStream(t, b, 0)
	r := rand.New(rand.NewPCG(11, 12))
	for _, transB := range []bool{false, true} {
		const m, n, k = 64, 256, 300 // large enough to stream B in parallel
		d := newGemm(t, b, r, m, n, k, false, 0)
		d.p.TransB = transB
		short := alloc(t, b, 0, 4*k*n-4)
		d.p.B = short
		must(t, b.Gemm(s, d.p))
		fe := wantFault(t, b.StreamSynchronize(s))
		if fe.Addr != short.Add(4*k*n-4) || fe.Size != 4*k*n || fe.Write || fe.Reason != "unmapped" {
			t.Errorf("transB %v: fault %v, want a read of %d bytes at %#x faulting at %#x", transB, fe, 4*k*n, uint64(short), uint64(short.Add(4*k*n-4)))
		}
		must(t, b.ResetDevice(0))
		if got := readF32(t, b, d.p.C, m*n); fmt.Sprint(got) != fmt.Sprint(d.c) {
			t.Errorf("transB %v: C was written by the faulting product", transB)
		}
	}
}

// TestGemmErrors: bad parameters are refused before anything runs, and a
// wrong-sized struct is refused by the node update.
func TestGemmErrors(t *testing.T) {
	b := newSim(t, Config{})
	s := newStream(t, b, 0)
	ok := gpu.GemmParams{C: 1 << 40, A: 1 << 41, B: 1 << 42, M: 2, N: 2, K: 2, Alpha: 1}
	for name, mod := range map[string]func(*gpu.GemmParams){
		"negative":          func(p *gpu.GemmParams) { p.N = -1 },
		"too large":         func(p *gpu.GemmParams) { p.K = math.MaxInt32 + 1 },
		"null C":            func(p *gpu.GemmParams) { p.C = 0 },
		"null B":            func(p *gpu.GemmParams) { p.B = 0 },
		"misaligned A":      func(p *gpu.GemmParams) { p.A++ },
		"misaligned bias":   func(p *gpu.GemmParams) { p.Bias = 2 },
		"workspace no size": func(p *gpu.GemmParams) { p.Workspace = 1 << 43 },
		"size no workspace": func(p *gpu.GemmParams) { p.WorkspaceSize = 8 },
	} {
		p := ok
		mod(&p)
		if err := b.Gemm(s, p); err == nil {
			t.Errorf("%s: Gemm accepted it", name)
		} else {
			wantErr(t, err, gpu.ErrInvalidValue)
		}
		wantErr(t, b.GemmPrepare(0, p), gpu.ErrInvalidValue)
	}
	wantErr(t, b.Gemm(0, ok), gpu.ErrInvalidHandle)
	wantErr(t, b.GemmPrepare(3, ok), gpu.ErrInvalidValue)
	_, err := b.GemmWorkspaceSize(-1)
	wantErr(t, err, gpu.ErrInvalidValue)
	if n, err := b.GemmWorkspaceSize(0); err != nil || n != blasWorkspace {
		t.Errorf("GemmWorkspaceSize = %d, %v", n, err)
	}
	// An empty product enqueues nothing.
	empty := ok
	empty.M = 0
	must(t, b.Gemm(s, empty))

	// A library kernel's struct of the wrong size is refused.
	r := rand.New(rand.NewPCG(9, 10))
	d := newGemm(t, b, r, 4, 4, 4, false, 0)
	d.p.Workspace, d.p.WorkspaceSize = alloc(t, b, 0, 4096), 4096
	g := captureGemm(t, b, s, d.p)
	nodes, err := b.GraphNodes(g)
	must(t, err)
	kp, err := b.GraphKernelNodeParams(nodes[0])
	must(t, err)
	info, err := b.FuncParamInfo(kp.Func)
	must(t, err)
	if len(info) != len(kp.Args) || info[0].Size != uint64(len(kp.Args[0].Raw)) {
		t.Fatalf("layout %v does not describe the arguments %v", info, kp.Args)
	}
	x := instantiate(t, b, g)
	kp.Args[0].Raw = kp.Args[0].Raw[:8]
	wantErr(t, b.GraphExecKernelNodeSetParams(x, nodes[0], kp), gpu.ErrInvalidValue)
}

// TestGraphNodeReader reads memcpy and memset nodes back, and refuses
// nodes of another type.
func TestGraphNodeReader(t *testing.T) {
	b := newSim(t, Config{})
	g := newGraph(t, b, 0)
	cp := gpu.MemcpyParams{Dst: 1 << 40, Src: 1 << 41, Size: 64}
	ms := gpu.Memset{Dst: 1 << 42, Value: 7, ElemSize: 4, Count: 16}
	nc, err := b.GraphAddMemcpyNode(g, nil, cp)
	must(t, err)
	ns, err := b.GraphAddMemsetNode(g, []gpu.GraphNode{nc}, ms)
	must(t, err)
	if got, err := b.GraphMemcpyNodeParams(nc); err != nil || got != cp {
		t.Errorf("memcpy params %+v, %v", got, err)
	}
	if got, err := b.GraphMemsetNodeParams(ns); err != nil || got != ms {
		t.Errorf("memset params %+v, %v", got, err)
	}
	_, err = b.GraphMemcpyNodeParams(ns)
	wantErr(t, err, gpu.ErrInvalidValue)
	_, err = b.GraphMemsetNodeParams(0)
	wantErr(t, err, gpu.ErrInvalidHandle)
}
