package cuda

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strings"
	"sync"
	"unsafe"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
	"github.com/stablegraph/stablegraph/kernels"
)

// The CUDA backend's GEMM library (gpu.GEMM) is cuBLAS: cublasLtMatmul,
// with the bias fused as its epilogue (what PyTorch's addmm runs: one
// kernel per product at the launch-bound shapes), and cublasSgemm where it
// measures faster (then a bias is added by the built-in sg_bias_add).
// Compute is float32 throughout (CUBLAS_COMPUTE_32F: no TF32).
//
// For each device, shape and alignment class (gpu.AlignClass of C, A, B
// and the bias), GemmPrepare takes cuBLASLt's heuristic's best few
// algorithms, times each and cublasSgemm on scratch operands of the same
// classes, outside any capture, and keeps the fastest; every later Gemm of
// that key runs it. A key never prepared takes the heuristic's first
// algorithm unmeasured (the heuristic runs on the host, so that is allowed
// in a capture) and keeps it too. Without libcublas, Gemm reports
// gpu.ErrNotSupported and callers fall back to the built-in kernels;
// without libcublasLt, every product is a cublasSgemm.

var _ gpu.GEMM = (*Backend)(nil)

// Measurement of GemmPrepare.
const (
	// ltCandidates is how many of the heuristic's algorithms are timed.
	ltCandidates = 8
	// Each candidate runs warmRuns times eagerly (loading its kernels),
	// then timedRuns calls captured into a graph are replayed graphRuns
	// times and averaged.
	warmRuns  = 3
	timedRuns = 20
	graphRuns = 5
)

// blasLib is cuBLAS and cuBLASLt as loaded (once) by a backend.
type blasLib struct {
	once  sync.Once
	lib   *cu.BLAS
	err   error // why cuBLAS is not used (nil when it is)
	lt    *cu.BLASLt
	ltErr error // why cuBLASLt is not used
}

// gemmImpl is how a kept choice computes.
type gemmImpl uint8

const (
	implSgemm gemmImpl = iota + 1 // cublasSgemm (+ sg_bias_add)
	implLt                        // cublasLtMatmul with the bias epilogue
)

// gemmKey is what a choice is kept for: shape, flags, the alignment class
// (log2) of C, A, B and the bias, and the workspace the caller gives.
type gemmKey struct {
	m, n, k              int32
	transA, transB, bias bool
	class                [4]uint8
	ws                   uint64
}

func keyOf(p gpu.GemmParams) gemmKey {
	cls := func(q gpu.DevicePtr) uint8 { return uint8(bits.TrailingZeros64(gpu.AlignClass(q))) }
	return gemmKey{m: int32(p.M), n: int32(p.N), k: int32(p.K), transA: p.TransA, transB: p.TransB, bias: p.Bias != 0,
		class: [4]uint8{cls(p.C), cls(p.A), cls(p.B), cls(p.Bias)}, ws: p.WorkspaceSize}
}

// gemmChoice is a kept way of computing one key: cublasSgemm, or
// cublasLtMatmul with its descriptors and algorithm (owned: destroyed at
// Close).
type gemmChoice struct {
	impl       gemmImpl
	desc       cu.LtMatmulDesc
	la, lb, lc cu.LtMatrixLayout
	algo       cu.LtMatmulAlgo
	wsNeed     uint64
	how        string // how it was chosen, for logs and GemmChoice
}

// gemmState is one device's GEMM machinery, made at its first use: the
// cuBLAS and cuBLASLt handles, the built-in module (for sg_bias_add after
// cublasSgemm, loaded when first needed) and the kept choices. mu
// serialises all of it: a cuBLAS handle must not be used from two threads
// at once (SetStream and the call must stay together), and the Lt
// descriptors' bias pointer is set per call.
type gemmState struct {
	mu      sync.Mutex
	ready   bool
	handle  cu.BLASHandle
	lt      cu.LtHandle
	module  cu.Module
	biasFn  cu.Function
	choices map[gemmKey]*gemmChoice
	scalars scalarPool
}

// scalarPool holds the alpha and beta that GEMM calls pass the library by
// pointer, interned in pinned host memory for the life of the backend.
// cuBLAS keeps the pointer in the parameters of some kernels it launches
// (gemmSN's, chosen at the launch-bound shapes, measured on the H100): a
// pointer to a fresh Go variable made every capture of the same GEMM
// differ in a word that points into no operand, so differential tracing
// could not prove a template and patch captured the GEMM again at every
// move. Interned, the word is the same in every trace, and the memory it
// names stays valid for as long as a graph may replay it.
type scalarPool struct {
	pages []unsafe.Pointer // pinned pages of scalarPage bytes
	used  int              // pairs used in the last page
	at    map[[2]float32]*[2]float32
}

const scalarPage = 4096

// scalarsLocked returns interned copies of alpha and beta; d.gemm.mu is
// held and d's context is current.
func (b *Backend) scalarsLocked(d *device, alpha, beta float32) (*float32, *float32, error) {
	sp := &d.gemm.scalars
	key := [2]float32{alpha, beta}
	if v, ok := sp.at[key]; ok {
		return &v[0], &v[1], nil
	}
	const perPage = scalarPage / 8
	if len(sp.pages) == 0 || sp.used == perPage {
		var page unsafe.Pointer
		if r := b.d.MemHostAlloc(&page, scalarPage, 0); r != cu.Success {
			return nil, nil, b.check("cuMemHostAlloc", r)
		}
		sp.pages, sp.used = append(sp.pages, page), 0
	}
	if sp.at == nil {
		sp.at = map[[2]float32]*[2]float32{}
	}
	v := (*[2]float32)(unsafe.Add(sp.pages[len(sp.pages)-1], 8*sp.used))
	sp.used++
	*v = key
	sp.at[key] = v
	return &v[0], &v[1], nil
}

// workspaceSize is the workspace GEMMs should be given on a device of
// compute capability major: NVIDIA's recommendation for cuBLAS (32 MiB on
// Hopper, 4 MiB before), which also covers every cuBLASLt algorithm the
// heuristic offers at the launch-bound shapes (their workspaceSize is
// logged by TestCUDAGemmWorkspace). The executable allocates it once.
func workspaceSize(major int) uint64 {
	if major >= 9 {
		return 32 << 20
	}
	return 4 << 20
}

// loadBLAS loads cuBLAS and cuBLASLt once; a failure is remembered.
func (b *Backend) loadBLAS() (*cu.BLAS, error) {
	b.blas.once.Do(func() {
		b.blas.lib, b.blas.err = cu.OpenBLAS(b.opts.cublasLibrary)
		if b.blas.err != nil {
			b.opts.log.Debug("cuda: cuBLAS unavailable; GEMMs use the built-in kernels", "err", b.blas.err)
			return
		}
		b.blas.lt, b.blas.ltErr = cu.OpenBLASLt("", b.blas.lib.Path)
		if b.blas.ltErr != nil {
			b.opts.log.Debug("cuda: cuBLASLt unavailable; GEMMs use cublasSgemm", "err", b.blas.ltErr)
		}
	})
	return b.blas.lib, b.blas.err
}

// GemmLibraries reports the cuBLAS and cuBLASLt files in use ("" when not
// loaded, with why).
func (b *Backend) GemmLibraries() (cublas, cublasLt string, err error) {
	if _, err := b.loadBLAS(); err != nil {
		return "", "", err
	}
	if b.blas.lt == nil {
		return b.blas.lib.Path, "", b.blas.ltErr
	}
	return b.blas.lib.Path, b.blas.lt.Path, nil
}

// GemmWorkspaceSize implements gpu.GEMM.
func (b *Backend) GemmWorkspaceSize(dev int) (uint64, error) {
	d, err := b.device("GemmWorkspaceSize", dev)
	if err != nil {
		return 0, err
	}
	return workspaceSize(d.props.ComputeMajor), nil
}

// prepareLocked makes d's handles; d.gemm.mu is held. Without cuBLAS it
// fails with gpu.ErrNotSupported, remembered by loadBLAS.
func (b *Backend) prepareLocked(dev int, d *device) error {
	if d.gemm.ready {
		return nil
	}
	lib, err := b.loadBLAS()
	if err != nil {
		return errf("Gemm", gpu.ErrNotSupported, "no cuBLAS: %v", err)
	}
	err = b.onDevice(dev, func() error {
		var h cu.BLASHandle
		if st := lib.Create(&h); st != cu.BLASSuccess {
			return blasError("cublasCreate_v2", st)
		}
		d.gemm.handle = h
		if lt := b.blas.lt; lt != nil {
			var l cu.LtHandle
			if st := lt.Create(&l); st != cu.BLASSuccess {
				b.opts.log.Debug("cuda: cublasLtCreate failed; GEMMs use cublasSgemm", "status", st.Name())
			} else {
				d.gemm.lt = l
			}
		}
		return nil
	})
	if err != nil {
		return err // not sticky: a later call tries again
	}
	d.gemm.choices = map[gemmKey]*gemmChoice{}
	d.gemm.ready = true
	return nil
}

// biasFuncLocked is d's sg_bias_add, loading the built-in module the first
// time (internal: not counted).
func (b *Backend) biasFuncLocked(dev int, d *device) (cu.Function, error) {
	if d.gemm.biasFn != 0 {
		return d.gemm.biasFn, nil
	}
	img := kernels.Module()
	_, ptx, err := img.CodeFor(gpu.Target{Format: gpu.CodePTX, Major: d.props.ComputeMajor, Minor: d.props.ComputeMinor})
	if err != nil {
		return 0, err
	}
	var fn cu.Function
	err = b.onDevice(dev, func() error {
		m, err := b.loadPTX(dev, img, ptx)
		if err != nil {
			return err
		}
		if r := b.d.ModuleGetFunction(&fn, m, cu.CString(kernels.BiasAdd)); r != cu.Success {
			b.d.ModuleUnload(m)
			return b.check("cuModuleGetFunction", r)
		}
		d.gemm.module = m
		return nil
	})
	if err != nil {
		return 0, err
	}
	// Known by its spec, so that captured launches of it read back typed.
	if spec, ok := img.Kernel(kernels.BiasAdd); ok {
		b.mu.Lock()
		b.funcHandleLocked(fn, &funcInfo{dev: dev, f: fn, name: kernels.BiasAdd, spec: &spec})
		b.mu.Unlock()
	}
	d.gemm.biasFn = fn
	return fn, nil
}

// checkGemm validates p: non-negative 32-bit shapes, operands present and
// aligned to their float32 elements, a workspace with a size.
func checkGemm(op string, p gpu.GemmParams) error {
	for _, x := range []int{p.M, p.N, p.K} {
		if x < 0 || x > math.MaxInt32 {
			return errf(op, gpu.ErrInvalidValue, "shape m=%d n=%d k=%d is not non-negative 32-bit", p.M, p.N, p.K)
		}
	}
	if p.M > 0 && p.N > 0 && (p.C == 0 || (p.K > 0 && (p.A == 0 || p.B == 0))) {
		return errf(op, gpu.ErrInvalidValue, "null operand (C %#x, A %#x, B %#x)", uint64(p.C), uint64(p.A), uint64(p.B))
	}
	for i, q := range []gpu.DevicePtr{p.C, p.A, p.B, p.Bias} {
		if q%4 != 0 {
			return errf(op, gpu.ErrInvalidValue, "%s at %#x is not aligned to its 4-byte elements", [...]string{"C", "A", "B", "bias"}[i], uint64(q))
		}
	}
	if (p.Workspace == 0) != (p.WorkspaceSize == 0) {
		return errf(op, gpu.ErrInvalidValue, "workspace %#x of %d bytes", uint64(p.Workspace), p.WorkspaceSize)
	}
	return nil
}

// GemmPrepare implements gpu.GEMM: it measures the candidates for p's key
// (see the top of this file) unless a choice is kept already.
func (b *Backend) GemmPrepare(dev int, p gpu.GemmParams) error {
	const op = "GemmPrepare"
	d, err := b.device(op, dev)
	if err != nil {
		return err
	}
	if err := checkGemm(op, p); err != nil {
		return err
	}
	if p.M == 0 || p.N == 0 {
		return nil
	}
	d.gemm.mu.Lock()
	defer d.gemm.mu.Unlock()
	if err := b.prepareLocked(dev, d); err != nil {
		return err
	}
	key := keyOf(p)
	if _, ok := d.gemm.choices[key]; ok {
		return nil
	}
	c, err := b.measureLocked(dev, d, p)
	if err != nil {
		return err
	}
	d.gemm.choices[key] = c
	b.opts.log.Debug("cuda: GEMM algorithm chosen", "m", p.M, "n", p.N, "k", p.K, "bias", p.Bias != 0, "how", c.how)
	return nil
}

// GemmChoice says how Gemm computes p's key on dev, and whether a choice
// is kept for it.
func (b *Backend) GemmChoice(dev int, p gpu.GemmParams) (string, bool) {
	d, err := b.device("GemmChoice", dev)
	if err != nil {
		return "", false
	}
	d.gemm.mu.Lock()
	defer d.gemm.mu.Unlock()
	c, ok := d.gemm.choices[keyOf(p)]
	if !ok {
		return "", false
	}
	return c.how, true
}

// Gemm implements gpu.GEMM.
func (b *Backend) Gemm(s gpu.Stream, p gpu.GemmParams) error {
	const op = "Gemm"
	dev, cs, err := b.stream(op, s)
	if err != nil {
		return err
	}
	if err := checkGemm(op, p); err != nil {
		return err
	}
	if p.M == 0 || p.N == 0 {
		return nil
	}
	d := b.devs[dev]
	d.gemm.mu.Lock()
	defer d.gemm.mu.Unlock()
	if err := b.prepareLocked(dev, d); err != nil {
		return err
	}
	key := keyOf(p)
	c, ok := d.gemm.choices[key]
	if !ok {
		// Unprepared: the heuristic's first choice, unmeasured, kept.
		if c, err = b.chooseLocked(dev, d, p); err != nil {
			return err
		}
		d.gemm.choices[key] = c
	}
	return b.runLocked(dev, d, c, cs, p)
}

// runLocked enqueues p on cs the way c computes it.
func (b *Backend) runLocked(dev int, d *device, c *gemmChoice, cs cu.Stream, p gpu.GemmParams) error {
	if c.impl == implLt {
		return b.onDevice(dev, func() error { return b.ltMatmul(d, c, cs, p) })
	}
	err := b.onDevice(dev, func() error { return b.sgemm(d, cs, p) })
	if err != nil || p.Bias == 0 {
		return err
	}
	fn, err := b.biasFuncLocked(dev, d)
	if err != nil {
		return err
	}
	args := []gpu.Arg{gpu.Ptr(p.C), gpu.Ptr(p.C), gpu.Ptr(p.Bias), gpu.I32(int32(p.M)), gpu.I32(int32(p.N))}
	pack := packArgs(args)
	defer pack.release()
	cfg := kernels.Elementwise(p.M * p.N)
	return b.call(dev, "cuLaunchKernel", func() cu.Result {
		return b.d.LaunchKernel(fn, cfg.Grid.X, cfg.Grid.Y, cfg.Grid.Z, cfg.Block.X, cfg.Block.Y, cfg.Block.Z, 0, cs, pack.params())
	})
}

// sgemm runs cublasSgemm on cs with p's workspace (cuBLAS's own when p has
// none); the current context is d's.
//
// Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: B is
// cuBLAS's first operand and A its second, n and m swapped. A row-major
// matrix stored r×c is its transpose in column-major with leading
// dimension c.
func (b *Backend) sgemm(d *device, cs cu.Stream, p gpu.GemmParams) error {
	lib := b.blas.lib
	if st := lib.SetStream(d.gemm.handle, cs); st != cu.BLASSuccess {
		return blasError("cublasSetStream_v2", st)
	}
	// SetStream resets the workspace to cuBLAS's own pool: give the
	// caller's back.
	if p.Workspace != 0 {
		if st := lib.SetWorkspace(d.gemm.handle, cu.DevicePtr(p.Workspace), p.WorkspaceSize); st != cu.BLASSuccess {
			return blasError("cublasSetWorkspace_v2", st)
		}
	}
	opA, lda := cu.BLASOpN, p.N // cuBLAS "A" is our B
	if p.TransB {
		opA, lda = cu.BLASOpT, p.K
	}
	opB, ldb := cu.BLASOpN, p.K // cuBLAS "B" is our A
	if p.TransA {
		opB, ldb = cu.BLASOpT, p.M
	}
	al, be, err := b.scalarsLocked(d, p.Alpha, p.Beta)
	if err != nil {
		return err
	}
	st := lib.Sgemm(d.gemm.handle, opA, opB, int32(p.N), int32(p.M), int32(p.K),
		al, cu.DevicePtr(p.B), int32(max(lda, 1)), cu.DevicePtr(p.A), int32(max(ldb, 1)), be, cu.DevicePtr(p.C), int32(max(p.N, 1)))
	if st != cu.BLASSuccess {
		return blasError("cublasSgemm_v2", st)
	}
	return nil
}

// ltMatmul runs cublasLtMatmul with c's descriptors and algorithm on cs;
// the current context is d's.
func (b *Backend) ltMatmul(d *device, c *gemmChoice, cs cu.Stream, p gpu.GemmParams) error {
	lt := b.blas.lt
	if p.Bias != 0 {
		bias := cu.DevicePtr(p.Bias)
		if st := lt.MatmulDescSetAttribute(c.desc, cu.LtDescBiasPointer, unsafe.Pointer(&bias), unsafe.Sizeof(bias)); st != cu.BLASSuccess {
			return blasError("cublasLtMatmulDescSetAttribute(BIAS_POINTER)", st)
		}
	}
	al, be, err := b.scalarsLocked(d, p.Alpha, p.Beta)
	if err != nil {
		return err
	}
	st := lt.Matmul(d.gemm.lt, c.desc, al, cu.DevicePtr(p.B), c.la, cu.DevicePtr(p.A), c.lb, be,
		cu.DevicePtr(p.C), c.lc, cu.DevicePtr(p.C), c.lc, &c.algo, cu.DevicePtr(p.Workspace), p.WorkspaceSize, cs)
	if st != cu.BLASSuccess {
		return blasError("cublasLtMatmul", st)
	}
	return nil
}

// ltDescs makes the Lt descriptors of p's key (the same transposition as
// sgemm's: cuBLAS's A is our B) into c, with the bias pointer set to
// p.Bias, whose alignment the heuristic reads.
func (b *Backend) ltDescs(c *gemmChoice, p gpu.GemmParams) error {
	lt := b.blas.lt
	if st := lt.MatmulDescCreate(&c.desc, cu.LtCompute32F, cu.LtR32F); st != cu.BLASSuccess {
		return blasError("cublasLtMatmulDescCreate", st)
	}
	set := func(attr int, v int32) error {
		if st := lt.MatmulDescSetAttribute(c.desc, attr, unsafe.Pointer(&v), unsafe.Sizeof(v)); st != cu.BLASSuccess {
			return blasError(fmt.Sprintf("cublasLtMatmulDescSetAttribute(%d)", attr), st)
		}
		return nil
	}
	opA, opB := cu.BLASOpN, cu.BLASOpN
	if p.TransB {
		opA = cu.BLASOpT
	}
	if p.TransA {
		opB = cu.BLASOpT
	}
	epi := int32(cu.LtEpilogueDefault)
	if p.Bias != 0 {
		epi = int32(cu.LtEpilogueBias)
	}
	if err := set(cu.LtDescTransA, int32(opA)); err != nil {
		return err
	}
	if err := set(cu.LtDescTransB, int32(opB)); err != nil {
		return err
	}
	if err := set(cu.LtDescEpilogue, epi); err != nil {
		return err
	}
	if p.Bias != 0 {
		bias := cu.DevicePtr(p.Bias)
		if st := lt.MatmulDescSetAttribute(c.desc, cu.LtDescBiasPointer, unsafe.Pointer(&bias), unsafe.Sizeof(bias)); st != cu.BLASSuccess {
			return blasError("cublasLtMatmulDescSetAttribute(BIAS_POINTER)", st)
		}
	}
	n, m, k := uint64(p.N), uint64(p.M), uint64(p.K)
	layout := func(l *cu.LtMatrixLayout, rows, cols uint64) error {
		if st := lt.MatrixLayoutCreate(l, cu.LtR32F, rows, cols, int64(max(rows, 1))); st != cu.BLASSuccess {
			return blasError("cublasLtMatrixLayoutCreate", st)
		}
		return nil
	}
	ar, ac := n, k // our B, stored K×N row-major: N×K column-major
	if p.TransB {
		ar, ac = k, n
	}
	br, bc := k, m // our A
	if p.TransA {
		br, bc = m, k
	}
	if err := layout(&c.la, ar, ac); err != nil {
		return err
	}
	if err := layout(&c.lb, br, bc); err != nil {
		return err
	}
	return layout(&c.lc, n, m)
}

// destroyLt releases c's descriptors (those made).
func (b *Backend) destroyLt(c *gemmChoice) {
	lt := b.blas.lt
	for _, l := range []cu.LtMatrixLayout{c.la, c.lb, c.lc} {
		if l != 0 {
			lt.MatrixLayoutDestroy(l)
		}
	}
	if c.desc != 0 {
		lt.MatmulDescDestroy(c.desc)
	}
	c.la, c.lb, c.lc, c.desc = 0, 0, 0, 0
}

// heuristic returns up to want of cuBLASLt's algorithms for c's
// descriptors, best first, each needing at most p's workspace and working
// at the alignment classes of p's pointers.
func (b *Backend) heuristic(d *device, c *gemmChoice, p gpu.GemmParams, want int) ([]cu.LtHeuristicResult, error) {
	lt := b.blas.lt
	var pref cu.LtMatmulPreference
	if st := lt.MatmulPreferenceCreate(&pref); st != cu.BLASSuccess {
		return nil, blasError("cublasLtMatmulPreferenceCreate", st)
	}
	defer lt.MatmulPreferenceDestroy(pref)
	ws := p.WorkspaceSize
	if st := lt.MatmulPreferenceSetAttribute(pref, cu.LtPrefMaxWorkspaceBytes, unsafe.Pointer(&ws), unsafe.Sizeof(ws)); st != cu.BLASSuccess {
		return nil, blasError("cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)", st)
	}
	for _, a := range []struct {
		attr int
		p    gpu.DevicePtr
	}{{cu.LtPrefMinAlignA, p.B}, {cu.LtPrefMinAlignB, p.A}, {cu.LtPrefMinAlignC, p.C}, {cu.LtPrefMinAlignD, p.C}} {
		v := uint32(gpu.AlignClass(a.p))
		if st := lt.MatmulPreferenceSetAttribute(pref, a.attr, unsafe.Pointer(&v), unsafe.Sizeof(v)); st != cu.BLASSuccess {
			return nil, blasError("cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)", st)
		}
	}
	res := make([]cu.LtHeuristicResult, 2*want)
	var n int32
	st := lt.MatmulAlgoGetHeuristic(d.gemm.lt, c.desc, c.la, c.lb, c.lc, c.lc, pref, res, &n)
	if st == cu.BLASNotSupported {
		return nil, nil
	}
	if st != cu.BLASSuccess {
		return nil, blasError("cublasLtMatmulAlgoGetHeuristic", st)
	}
	var out []cu.LtHeuristicResult
	for _, r := range res[:n] {
		if r.State == cu.BLASSuccess && r.WorkspaceSize <= p.WorkspaceSize && len(out) < want {
			out = append(out, r)
		}
	}
	return out, nil
}

// chooseLocked makes the unmeasured choice for p: the heuristic's first
// algorithm, or cublasSgemm without cuBLASLt (or without an algorithm).
func (b *Backend) chooseLocked(dev int, d *device, p gpu.GemmParams) (*gemmChoice, error) {
	if d.gemm.lt == 0 || p.K == 0 {
		return &gemmChoice{impl: implSgemm, how: "cublasSgemm (no cuBLASLt, or K=0)"}, nil
	}
	c := &gemmChoice{impl: implLt}
	var res []cu.LtHeuristicResult
	err := b.onDevice(dev, func() error {
		if err := b.ltDescs(c, p); err != nil {
			return err
		}
		var err error
		res, err = b.heuristic(d, c, p, 1)
		return err
	})
	if err != nil || len(res) == 0 {
		b.destroyLt(c)
		if err != nil {
			return nil, err
		}
		return &gemmChoice{impl: implSgemm, how: "cublasSgemm (cuBLASLt offers no algorithm)"}, nil
	}
	c.algo, c.wsNeed = res[0].Algo, res[0].WorkspaceSize
	c.how = "cublasLtMatmul, heuristic's first algorithm (unmeasured: not prepared)"
	return c, nil
}

// scratch is device memory for GemmPrepare's timing: operands at the
// alignment classes of the real ones, a workspace of the real size.
type scratch struct {
	p     gpu.GemmParams
	alloc []cu.DevicePtr
}

// at places n bytes at an address of class cls (a base is 256-aligned,
// cls ≤ 256) and returns it.
func (sc *scratch) at(b *Backend, n, cls uint64) (gpu.DevicePtr, error) {
	var base cu.DevicePtr
	size := n + gpu.MaxAlignClass
	if r := b.d.MemAlloc(&base, size); r != cu.Success {
		return 0, b.check("cuMemAlloc_v2", r)
	}
	sc.alloc = append(sc.alloc, base)
	if r := b.d.MemsetD8(base, 0, size); r != cu.Success {
		return 0, b.check("cuMemsetD8_v2", r)
	}
	off := cls % gpu.MaxAlignClass
	return gpu.DevicePtr(uint64(base) + off), nil
}

func (sc *scratch) free(b *Backend) {
	for _, p := range sc.alloc {
		b.d.MemFree(p)
	}
}

// measureLocked times the candidates for p (cuBLASLt's best algorithms and
// cublasSgemm) on scratch operands and returns the fastest, with its
// descriptors.
func (b *Backend) measureLocked(dev int, d *device, p gpu.GemmParams) (*gemmChoice, error) {
	var cands []*gemmChoice
	keep := -1
	defer func() {
		for i, c := range cands {
			if i != keep && c.impl == implLt {
				b.destroyLt(c)
			}
		}
	}()
	var sc scratch
	var times []float64
	err := b.onDevice(dev, func() error {
		defer sc.free(b)
		q := p
		var err error
		if q.C, err = sc.at(b, uint64(4*p.M*p.N), gpu.AlignClass(p.C)); err != nil {
			return err
		}
		if q.A, err = sc.at(b, uint64(4*p.M*p.K), gpu.AlignClass(p.A)); err != nil {
			return err
		}
		if q.B, err = sc.at(b, uint64(4*p.K*p.N), gpu.AlignClass(p.B)); err != nil {
			return err
		}
		if p.Bias != 0 {
			if q.Bias, err = sc.at(b, uint64(4*p.N), gpu.AlignClass(p.Bias)); err != nil {
				return err
			}
		}
		if p.WorkspaceSize != 0 {
			if q.Workspace, err = sc.at(b, p.WorkspaceSize, gpu.MaxAlignClass); err != nil {
				return err
			}
		}
		if d.gemm.lt != 0 && p.K > 0 {
			proto := &gemmChoice{impl: implLt}
			if err := b.ltDescs(proto, q); err != nil {
				b.destroyLt(proto)
				return err
			}
			res, err := b.heuristic(d, proto, q, ltCandidates)
			b.destroyLt(proto)
			if err != nil {
				return err
			}
			for i, r := range res {
				c := &gemmChoice{impl: implLt, algo: r.Algo, wsNeed: r.WorkspaceSize, how: fmt.Sprintf("cublasLtMatmul heuristic #%d", i)}
				cands = append(cands, c)
				if err := b.ltDescs(c, q); err != nil {
					return err
				}
			}
		}
		cands = append(cands, &gemmChoice{impl: implSgemm, how: "cublasSgemm"})
		times, err = b.timeAll(dev, d, cands, q)
		return err
	})
	if err != nil {
		return nil, err
	}
	best := -1
	var parts []string
	for i, t := range times {
		if t < 0 {
			parts = append(parts, cands[i].how+": failed")
			continue
		}
		parts = append(parts, fmt.Sprintf("%s: %.2f us", cands[i].how, t))
		if best < 0 || t < times[best] {
			best = i
		}
	}
	if best < 0 {
		return nil, errf("GemmPrepare", gpu.ErrNotSupported, "no candidate ran for m=%d n=%d k=%d: %s", p.M, p.N, p.K, strings.Join(parts, "; "))
	}
	keep = best
	// An Lt choice's descriptors hold the scratch bias pointer until the
	// first call sets the real one (every call does).
	c := cands[best]
	c.how = fmt.Sprintf("measured, %s fastest (%s)", c.how, strings.Join(parts, "; "))
	return c, nil
}

// timeAll times each candidate on q, on a private stream: warmRuns, then
// the mean of timedRuns between two events. A candidate whose call fails
// gets -1. The current context is d's.
func (b *Backend) timeAll(dev int, d *device, cands []*gemmChoice, q gpu.GemmParams) ([]float64, error) {
	var s cu.Stream
	if r := b.d.StreamCreateWithPriority(&s, 1, 0); r != cu.Success {
		return nil, b.check("cuStreamCreateWithPriority", r)
	}
	defer b.d.StreamDestroy(s)
	var e0, e1 cu.Event
	if r := b.d.EventCreate(&e0, 0); r != cu.Success {
		return nil, b.check("cuEventCreate", r)
	}
	defer b.d.EventDestroy(e0)
	if r := b.d.EventCreate(&e1, 0); r != cu.Success {
		return nil, b.check("cuEventCreate", r)
	}
	defer b.d.EventDestroy(e1)
	times := make([]float64, len(cands))
	for i, c := range cands {
		run := func() error {
			if c.impl == implLt {
				return b.ltMatmul(d, c, s, q)
			}
			if err := b.sgemm(d, s, q); err != nil || q.Bias == 0 {
				return err
			}
			fn, err := b.biasFuncLocked(dev, d)
			if err != nil {
				return err
			}
			args := []gpu.Arg{gpu.Ptr(q.C), gpu.Ptr(q.C), gpu.Ptr(q.Bias), gpu.I32(int32(q.M)), gpu.I32(int32(q.N))}
			pack := packArgs(args)
			defer pack.release()
			cfg := kernels.Elementwise(q.M * q.N)
			return b.check("cuLaunchKernel", b.d.LaunchKernel(fn, cfg.Grid.X, cfg.Grid.Y, cfg.Grid.Z, cfg.Block.X, cfg.Block.Y, cfg.Block.Z, 0, s, pack.params()))
		}
		ok := true
		for range warmRuns {
			if err := run(); err != nil {
				b.opts.log.Debug("cuda: GEMM candidate failed", "candidate", c.how, "err", err)
				ok = false
				break
			}
		}
		if !ok {
			times[i] = -1
			if r := b.d.StreamSynchronize(s); r != cu.Success {
				return nil, b.check("cuStreamSynchronize", r)
			}
			continue
		}
		// Timed as the step runs them: timedRuns calls captured into a
		// graph and replayed, so that what is compared is the kernels'
		// device time back to back, not the host's cost of enqueueing a
		// call (which dominates eager calls of this size and made the
		// choice noise).
		us, err := b.timeInGraph(s, e0, e1, run)
		if err != nil {
			b.opts.log.Debug("cuda: GEMM candidate failed in a graph", "candidate", c.how, "err", err)
			times[i] = -1
			continue
		}
		times[i] = us
	}
	return times, nil
}

// timeInGraph captures timedRuns calls of run on s into a graph, replays it
// graphRuns times between e0 and e1 after one warm replay, and returns the
// microseconds per call. Every handle it made is released.
func (b *Backend) timeInGraph(s cu.Stream, e0, e1 cu.Event, run func() error) (float64, error) {
	if r := b.d.StreamBeginCapture(s, cu.StreamCaptureModeThreadLocal); r != cu.Success {
		return 0, b.check("cuStreamBeginCapture_v2", r)
	}
	var runErr error
	for range timedRuns {
		if runErr = run(); runErr != nil {
			break
		}
	}
	var g cu.Graph
	r := b.d.StreamEndCapture(s, &g)
	if runErr != nil || r != cu.Success {
		if g != 0 {
			b.d.GraphDestroy(g)
		}
		return 0, errors.Join(runErr, b.check("cuStreamEndCapture", r))
	}
	defer b.d.GraphDestroy(g)
	var x cu.GraphExec
	if r := b.d.GraphInstantiate(&x, g, 0); r != cu.Success {
		return 0, b.check("cuGraphInstantiateWithFlags", r)
	}
	defer b.d.GraphExecDestroy(x)
	if r := b.d.GraphLaunch(x, s); r != cu.Success {
		return 0, b.check("cuGraphLaunch", r)
	}
	if r := b.d.EventRecord(e0, s); r != cu.Success {
		return 0, b.check("cuEventRecord", r)
	}
	for range graphRuns {
		if r := b.d.GraphLaunch(x, s); r != cu.Success {
			return 0, b.check("cuGraphLaunch", r)
		}
	}
	if r := b.d.EventRecord(e1, s); r != cu.Success {
		return 0, b.check("cuEventRecord", r)
	}
	if r := b.d.EventSynchronize(e1); r != cu.Success {
		return 0, b.check("cuEventSynchronize", r)
	}
	var ms float32
	if r := b.d.EventElapsedTime(&ms, e0, e1); r != cu.Success {
		return 0, b.check("cuEventElapsedTime", r)
	}
	return float64(ms) * 1000 / (timedRuns * graphRuns), nil
}

// closeGemm releases dev's GEMM machinery (at Close).
func (b *Backend) closeGemm(dev int) error {
	d := b.devs[dev]
	d.gemm.mu.Lock()
	defer d.gemm.mu.Unlock()
	if !d.gemm.ready {
		return nil
	}
	d.gemm.ready = false
	return b.onDevice(dev, func() error {
		var err error
		for _, c := range d.gemm.choices {
			if c.impl == implLt {
				b.destroyLt(c)
			}
		}
		d.gemm.choices = nil
		if d.gemm.lt != 0 {
			if st := b.blas.lt.Destroy(d.gemm.lt); st != cu.BLASSuccess {
				err = blasError("cublasLtDestroy", st)
			}
		}
		if st := b.blas.lib.Destroy(d.gemm.handle); st != cu.BLASSuccess && err == nil {
			err = blasError("cublasDestroy_v2", st)
		}
		if d.gemm.module != 0 {
			if r := b.d.ModuleUnload(d.gemm.module); r != cu.Success && err == nil {
				err = b.check("cuModuleUnload", r)
			}
		}
		for _, page := range d.gemm.scalars.pages {
			if r := b.d.MemFreeHost(page); r != cu.Success && err == nil {
				err = b.check("cuMemFreeHost", r)
			}
		}
		d.gemm.scalars = scalarPool{}
		d.gemm.handle, d.gemm.lt, d.gemm.module, d.gemm.biasFn = 0, 0, 0, 0
		return err
	})
}
