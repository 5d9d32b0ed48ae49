package sim

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/f32mem"
)

// The GEMM library (gpu.GEMM) is a model of cuBLAS in what stablegraph
// depends on, so that CI meets the behaviours that only a GPU showed:
//
//   - Its kernels take their parameters as opaque structs (gpu.ArgBytes,
//     laid out by FuncParamInfo), in layouts that differ from kernel to
//     kernel, with the operands' pointers inside.
//   - It picks kernels by shape and by pointer alignment. A small output with
//     a long K is split: partial products of K's chunks go to the workspace,
//     and a second kernel reduces them into C (two kernels, and bits that
//     differ from the one-kernel path, as cuBLAS's split-K do). Otherwise one
//     kernel: a vectorised one when every pointer is 16-byte aligned and the
//     dimensions are multiples of 4, which faults on a pointer that is not
//     (as a CUDA kernel's misaligned vector load does), else a scalar one. The
//     two one-kernel paths compute the same bits; only the split changes them.
//   - Without a workspace, an eager call uses the library's own (one per
//     device, kept until Close), while a call on a capturing stream
//     allocates one inside the capture: a mem-alloc node before its kernels
//     and a mem-free node after, at a new address in every capture (what
//     cuBLAS 12.2+ does with cudaMallocAsync). Such a trace can be neither
//     patched nor embedded as a child graph.
//
// Choosing is deterministic, so a shape and alignment class always compute
// alike; GemmPrepare has nothing to measure.

// Sizes of the model.
const (
	// blasWorkspace is what GemmWorkspaceSize asks for, and the size of the
	// library's own workspace: room for the largest split (4 parts of an
	// output of splitMaxOutput float32).
	blasWorkspace = 1 << 20
	// A product is split when M·N ≤ splitMaxOutput and K ≥ splitMinK, into
	// min(splitMaxParts, K/splitChunk) parts, if the workspace holds them.
	splitMaxOutput = 4096
	splitMinK      = 128
	splitChunk     = 64
	splitMaxParts  = 4
	// vecAlign is the alignment the vectorised kernel needs.
	vecAlign = 16
)

// blasKernel names the library's kernels.
type blasKernel uint8

const (
	kernVec4   blasKernel = iota // one kernel, 16-byte vector loads
	kernScalar                   // one kernel, any 4-byte alignment
	kernSplit                    // partial products into the workspace
	kernReduce                   // the parts summed into C, with the epilogue
	numBlasKernels
)

var blasKernelNames = [numBlasKernels]string{
	kernVec4:   "simblas_sgemm_128x32_vec4",
	kernScalar: "simblas_sgemm_64x16",
	kernSplit:  "simblas_sgemm_splitk",
	kernReduce: "simblas_splitk_reduce",
}

// blasLayouts are the kernels' parameters: structs of pointers and scalars,
// each kernel its own (see the encode functions for the fields).
var blasLayouts = [numBlasKernels][]gpu.ParamInfo{
	kernVec4:   {{Offset: 0, Size: 56}},
	kernScalar: {{Offset: 0, Size: 40}, {Offset: 40, Size: 16}},
	kernSplit:  {{Offset: 0, Size: 48}},
	kernReduce: {{Offset: 0, Size: 48}},
}

// blasState is the library's per-backend state: each device's kernels and
// own workspace, made at first use. Guarded by Backend.mu.
type blasState struct {
	fns map[int]*[numBlasKernels]*function
	ws  map[int]gpu.DevicePtr
}

var _ gpu.GEMM = (*Backend)(nil)

// gemmOp is a decoded product, as a kernel sees it.
type gemmOp struct {
	c, a, b, bias, ws gpu.DevicePtr
	m, n, k, parts    int
	transA, transB    bool
	alpha, beta       float32
}

func flagsOf(transA, transB bool) uint32 {
	var f uint32
	if transA {
		f |= 1
	}
	if transB {
		f |= 2
	}
	return f
}

// checkGemm validates p as cuBLAS would: non-negative 32-bit shapes,
// operands present and float32-aligned, a workspace with a size.
func checkGemm(op string, p gpu.GemmParams) error {
	for _, d := range []int{p.M, p.N, p.K} {
		if d < 0 || d > math.MaxInt32 {
			return gpu.Errorf(op, gpu.ErrInvalidValue, "shape m=%d n=%d k=%d is not non-negative 32-bit", p.M, p.N, p.K)
		}
	}
	if p.M > 0 && p.N > 0 && (p.C == 0 || (p.K > 0 && (p.A == 0 || p.B == 0))) {
		return gpu.Errorf(op, gpu.ErrInvalidValue, "null operand (C %#x, A %#x, B %#x)", uint64(p.C), uint64(p.A), uint64(p.B))
	}
	for _, q := range []struct {
		name string
		p    gpu.DevicePtr
	}{{"C", p.C}, {"A", p.A}, {"B", p.B}, {"bias", p.Bias}} {
		if q.p%4 != 0 {
			return gpu.Errorf(op, gpu.ErrInvalidValue, "%s at %#x is not aligned to its 4-byte elements", q.name, uint64(q.p))
		}
	}
	if (p.Workspace == 0) != (p.WorkspaceSize == 0) {
		return gpu.Errorf(op, gpu.ErrInvalidValue, "workspace %#x of %d bytes", uint64(p.Workspace), p.WorkspaceSize)
	}
	return nil
}

// planGemm picks the kernels for p with wsSize bytes of workspace: the
// split's part count (0: not split) and the one-kernel path otherwise.
func planGemm(p gpu.GemmParams, wsSize uint64) (blasKernel, int) {
	if p.M*p.N <= splitMaxOutput && p.K >= splitMinK {
		parts := min(splitMaxParts, p.K/splitChunk)
		if uint64(parts)*uint64(p.M)*uint64(p.N)*4 <= wsSize {
			return kernSplit, parts
		}
	}
	aligned := gpu.AlignClass(p.C) >= vecAlign && gpu.AlignClass(p.A) >= vecAlign && gpu.AlignClass(p.B) >= vecAlign &&
		(p.Bias == 0 || gpu.AlignClass(p.Bias) >= vecAlign)
	if aligned && p.M%4 == 0 && p.N%4 == 0 && p.K%4 == 0 {
		return kernVec4, 0
	}
	return kernScalar, 0
}

// GemmWorkspaceSize implements gpu.GEMM.
func (b *Backend) GemmWorkspaceSize(dev int) (uint64, error) {
	const op = "GemmWorkspaceSize"
	if err := b.enter(op); err != nil {
		return 0, err
	}
	if err := b.checkDev(op, dev); err != nil {
		return 0, err
	}
	return blasWorkspace, nil
}

// GemmPrepare implements gpu.GEMM: it checks p and makes dev's kernels.
// The sim's choice is a function of shape, alignment and workspace, so
// there is nothing to measure or keep.
func (b *Backend) GemmPrepare(dev int, p gpu.GemmParams) error {
	const op = "GemmPrepare"
	if err := b.enter(op); err != nil {
		return err
	}
	if err := b.checkDev(op, dev); err != nil {
		return err
	}
	if err := checkGemm(op, p); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return errClosed(op)
	}
	b.blasFuncsLocked(dev)
	return nil
}

// Gemm implements gpu.GEMM: see the model above.
func (b *Backend) Gemm(s gpu.Stream, p gpu.GemmParams) error {
	const op = "Gemm"
	if err := b.enter(op); err != nil {
		return err
	}
	if err := checkGemm(op, p); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	st, err := getLocked(b, op, "stream", b.mu.streams, s)
	if err != nil {
		return err
	}
	if err := b.stickyErr(op, st.dev); err != nil {
		return err
	}
	if p.M == 0 || p.N == 0 {
		return nil
	}
	capturing := st.cap != nil
	submit := func(c cmd) error {
		build := func(*stream) (cmd, error) { return c, nil }
		if capturing {
			return b.captureLocked(op, st, capNode, build)
		}
		return b.queueLocked(op, st, build)
	}
	ws, wsSize := p.Workspace, p.WorkspaceSize
	var own *region
	if ws == 0 {
		wsSize = blasWorkspace
		if capturing {
			// The library's own workspace, allocated in the capture.
			if own, err = b.internalAllocLocked(op, st.dev, wsSize); err != nil {
				return err
			}
			ws = gpu.DevicePtr(own.start)
			if err := submit(cmd{kind: cmdMemAlloc, p: params{ga: graphAlloc{ptr: ws, size: wsSize}}}); err != nil {
				return err
			}
		} else if ws, err = b.defaultWorkspaceLocked(op, st.dev); err != nil {
			return err
		}
	}
	fns := b.blasFuncsLocked(st.dev)
	o := gemmOp{c: p.C, a: p.A, b: p.B, bias: p.Bias, ws: ws, m: p.M, n: p.N, k: p.K,
		transA: p.TransA, transB: p.TransB, alpha: p.Alpha, beta: p.Beta}
	kern, parts := planGemm(p, wsSize)
	o.parts = parts
	launch := func(k blasKernel, cfg gpu.LaunchConfig, args []gpu.Arg) error {
		return submit(cmd{kind: cmdKernel, p: params{kern: kernelParams{fn: fns[k], cfg: cfg, args: args}}})
	}
	tiles := func(rows, cols int) gpu.LaunchConfig {
		return gpu.LaunchConfig{Grid: gpu.Dim3{X: uint32((p.N + cols - 1) / cols), Y: uint32((p.M + rows - 1) / rows), Z: 1},
			Block: gpu.Dim3{X: 256, Y: 1, Z: 1}}
	}
	switch kern {
	case kernSplit:
		cfg := tiles(32, 32)
		cfg.Grid.Z = uint32(parts)
		if err = launch(kernSplit, cfg, encodeSplit(&o)); err == nil {
			err = launch(kernReduce, gpu.Linear(p.M*p.N, 256), encodeReduce(&o))
		}
	case kernVec4:
		err = launch(kernVec4, tiles(32, 128), encodeVec4(&o))
	default:
		err = launch(kernScalar, tiles(16, 64), encodeScalar(&o))
	}
	if err != nil {
		return err
	}
	if own != nil {
		return submit(cmd{kind: cmdMemFree, p: params{ga: graphAlloc{ptr: ws, size: wsSize}}})
	}
	return nil
}

// graphAlloc is a mem-alloc or mem-free node's allocation.
type graphAlloc struct {
	ptr  gpu.DevicePtr
	size uint64
}

// internalAllocLocked maps size bytes on dev that no handle counts: the
// library's own memory. It lives until Close (the address space is never
// reused), as graph memory stays reserved for its graph's life on CUDA.
func (b *Backend) internalAllocLocked(op string, dev int, size uint64) (*region, error) {
	as := &b.mu.as
	start, ok := as.carve(size, allocAlign, allocGuard)
	if !ok {
		return nil, gpu.Errorf(op, gpu.ErrOutOfMemory, "virtual address space exhausted")
	}
	r := &region{kind: regAlloc, start: start, size: size, dev: dev, mem: newBacking(size)}
	as.insert(r)
	return r, nil
}

// defaultWorkspaceLocked is dev's library-owned workspace, made at first
// use.
func (b *Backend) defaultWorkspaceLocked(op string, dev int) (gpu.DevicePtr, error) {
	if ws, ok := b.blas.ws[dev]; ok {
		return ws, nil
	}
	r, err := b.internalAllocLocked(op, dev, blasWorkspace)
	if err != nil {
		return 0, err
	}
	if b.blas.ws == nil {
		b.blas.ws = map[int]gpu.DevicePtr{}
	}
	b.blas.ws[dev] = gpu.DevicePtr(r.start)
	return b.blas.ws[dev], nil
}

// blasFuncsLocked returns dev's library kernels, making them the first
// time (internal functions: no module, not counted).
func (b *Backend) blasFuncsLocked(dev int) *[numBlasKernels]*function {
	if fs, ok := b.blas.fns[dev]; ok {
		return fs
	}
	fs := new([numBlasKernels]*function)
	for k := range numBlasKernels {
		layout := blasLayouts[k]
		kinds := make([]gpu.ArgKind, len(layout))
		for i := range kinds {
			kinds[i] = gpu.ArgBytes
		}
		spec := gpu.KernelSpec{Name: blasKernelNames[k], Params: kinds, Ref: b.blasRef(dev, k)}
		f := &function{handle: gpu.Function(b.newHandleLocked()), dev: dev, spec: spec, params: layout}
		b.mu.funcs[f.handle] = f
		fs[k] = f
	}
	if b.blas.fns == nil {
		b.blas.fns = map[int]*[numBlasKernels]*function{}
	}
	b.blas.fns[dev] = fs
	return fs
}

// ---- parameter structs ----

type fields []byte

func (f fields) ptr(off int, p gpu.DevicePtr) { binary.LittleEndian.PutUint64(f[off:], uint64(p)) }
func (f fields) u32(off int, v uint32)        { binary.LittleEndian.PutUint32(f[off:], v) }
func (f fields) f32(off int, v float32)       { f.u32(off, math.Float32bits(v)) }
func (f fields) getPtr(off int) gpu.DevicePtr {
	return gpu.DevicePtr(binary.LittleEndian.Uint64(f[off:]))
}
func (f fields) getU32(off int) uint32  { return binary.LittleEndian.Uint32(f[off:]) }
func (f fields) getI(off int) int       { return int(int32(f.getU32(off))) }
func (f fields) getF32(off int) float32 { return math.Float32frombits(f.getU32(off)) }

// encodeVec4: {C, A, B, bias ptr; M, N, K, flags i32; alpha, beta f32}.
func encodeVec4(o *gemmOp) []gpu.Arg {
	f := make(fields, 56)
	f.ptr(0, o.c)
	f.ptr(8, o.a)
	f.ptr(16, o.b)
	f.ptr(24, o.bias)
	f.u32(32, uint32(o.m))
	f.u32(36, uint32(o.n))
	f.u32(40, uint32(o.k))
	f.u32(44, flagsOf(o.transA, o.transB))
	f.f32(48, o.alpha)
	f.f32(52, o.beta)
	return []gpu.Arg{{Kind: gpu.ArgBytes, Raw: f}}
}

func decodeVec4(f fields) gemmOp {
	fl := f.getU32(44)
	return gemmOp{c: f.getPtr(0), a: f.getPtr(8), b: f.getPtr(16), bias: f.getPtr(24),
		m: f.getI(32), n: f.getI(36), k: f.getI(40), transA: fl&1 != 0, transB: fl&2 != 0,
		alpha: f.getF32(48), beta: f.getF32(52)}
}

// encodeScalar: {alpha, beta f32; M, N, K, flags i32; A, B ptr} and
// {C, bias ptr}.
func encodeScalar(o *gemmOp) []gpu.Arg {
	f, g := make(fields, 40), make(fields, 16)
	f.f32(0, o.alpha)
	f.f32(4, o.beta)
	f.u32(8, uint32(o.m))
	f.u32(12, uint32(o.n))
	f.u32(16, uint32(o.k))
	f.u32(20, flagsOf(o.transA, o.transB))
	f.ptr(24, o.a)
	f.ptr(32, o.b)
	g.ptr(0, o.c)
	g.ptr(8, o.bias)
	return []gpu.Arg{{Kind: gpu.ArgBytes, Raw: f}, {Kind: gpu.ArgBytes, Raw: g}}
}

func decodeScalar(f, g fields) gemmOp {
	fl := f.getU32(20)
	return gemmOp{alpha: f.getF32(0), beta: f.getF32(4), m: f.getI(8), n: f.getI(12), k: f.getI(16),
		transA: fl&1 != 0, transB: fl&2 != 0, a: f.getPtr(24), b: f.getPtr(32), c: g.getPtr(0), bias: g.getPtr(8)}
}

// encodeSplit: {A, B, workspace ptr; M, N, K, flags, parts i32; 4 bytes
// of padding}.
func encodeSplit(o *gemmOp) []gpu.Arg {
	f := make(fields, 48)
	f.ptr(0, o.a)
	f.ptr(8, o.b)
	f.ptr(16, o.ws)
	f.u32(24, uint32(o.m))
	f.u32(28, uint32(o.n))
	f.u32(32, uint32(o.k))
	f.u32(36, flagsOf(o.transA, o.transB))
	f.u32(40, uint32(o.parts))
	return []gpu.Arg{{Kind: gpu.ArgBytes, Raw: f}}
}

func decodeSplit(f fields) gemmOp {
	fl := f.getU32(36)
	return gemmOp{a: f.getPtr(0), b: f.getPtr(8), ws: f.getPtr(16), m: f.getI(24), n: f.getI(28), k: f.getI(32),
		transA: fl&1 != 0, transB: fl&2 != 0, parts: f.getI(40)}
}

// encodeReduce: {workspace, C, bias ptr; M, N, parts i32; 4 bytes of
// padding; alpha, beta f32}.
func encodeReduce(o *gemmOp) []gpu.Arg {
	f := make(fields, 48)
	f.ptr(0, o.ws)
	f.ptr(8, o.c)
	f.ptr(16, o.bias)
	f.u32(24, uint32(o.m))
	f.u32(28, uint32(o.n))
	f.u32(32, uint32(o.parts))
	f.f32(40, o.alpha)
	f.f32(44, o.beta)
	return []gpu.Arg{{Kind: gpu.ArgBytes, Raw: f}}
}

func decodeReduce(f fields) gemmOp {
	return gemmOp{ws: f.getPtr(0), c: f.getPtr(8), bias: f.getPtr(16), m: f.getI(24), n: f.getI(28), parts: f.getI(32),
		alpha: f.getF32(40), beta: f.getF32(44)}
}

// ---- the kernels' references ----

// blasRef is kernel k's reference on dev.
func (b *Backend) blasRef(dev int, k blasKernel) gpu.KernelFunc {
	name := blasKernelNames[k]
	return func(mem gpu.Memory, _ gpu.LaunchConfig, args []gpu.Arg) error {
		switch k {
		case kernVec4:
			o := decodeVec4(args[0].Raw)
			for _, p := range []gpu.DevicePtr{o.c, o.a, o.b, o.bias} {
				if p%vecAlign != 0 {
					fe := &gpu.FaultError{Device: dev, Kernel: name, Addr: p, Size: vecAlign,
						Reason: fmt.Sprintf("misaligned address: the kernel loads %d-byte vectors", vecAlign)}
					b.stick(dev, fe)
					return fe
				}
			}
			return o.direct(mem)
		case kernScalar:
			o := decodeScalar(args[0].Raw, args[1].Raw)
			return o.direct(mem)
		case kernSplit:
			o := decodeSplit(args[0].Raw)
			return o.split(mem)
		default:
			o := decodeReduce(args[0].Raw)
			return o.reduce(mem)
		}
	}
}

// operands reads A into a pooled buffer (the caller puts it back) and
// returns B's source: B streams through the product (gemmF32) rather than
// being read whole, but its whole range is checked first, so that a bad B
// faults as a read of all of it would, before anything is computed.
func (o *gemmOp) operands(mem gpu.Memory) (*f32mem.Buf, bSource, error) {
	a, err := f32mem.Read(mem, o.a, o.m*o.k)
	if err != nil {
		return nil, nil, err
	}
	width := o.n
	if o.transB {
		width = o.k
	}
	if v, ok := mem.(memView); ok {
		if err := v.b.check(v.a, o.b, uint64(4*o.k*o.n), false); err != nil {
			a.Put()
			return nil, nil, err
		}
	}
	return a, memB(mem, o.b, width), nil
}

// memB is the bSource of B at p in device memory, stored in rows of width
// floats.
func memB(mem gpu.Memory, p gpu.DevicePtr, width int) bSource {
	return func(r0, r1, c0, c1 int, dst []float32) error {
		if c0 == 0 && c1 == width {
			return f32mem.ReadInto(mem, p.Add(uint64(4*r0*width)), dst)
		}
		w := c1 - c0
		for r := r0; r < r1; r++ {
			if err := f32mem.ReadInto(mem, p.Add(uint64(4*(r*width+c0))), dst[(r-r0)*w:(r-r0+1)*w]); err != nil {
				return err
			}
		}
		return nil
	}
}

// epilogue writes C = alpha·acc + beta·C + bias, in that order.
func (o *gemmOp) epilogue(mem gpu.Memory, acc []float32) error {
	var c, bias []float32
	if o.beta != 0 {
		cb, err := f32mem.Read(mem, o.c, o.m*o.n)
		if err != nil {
			return err
		}
		defer cb.Put()
		c = cb.V
	}
	if o.bias != 0 {
		bb, err := f32mem.Read(mem, o.bias, o.n)
		if err != nil {
			return err
		}
		defer bb.Put()
		bias = bb.V
	}
	for i := range acc {
		v := o.alpha * acc[i]
		if c != nil {
			v += o.beta * c[i]
		}
		if bias != nil {
			v += bias[i%o.n]
		}
		acc[i] = v
	}
	return f32mem.Write(mem, o.c, acc)
}

// direct is the one-kernel product.
func (o *gemmOp) direct(mem gpu.Memory) error {
	a, b, err := o.operands(mem)
	if err != nil {
		return err
	}
	defer a.Put()
	acc := f32mem.Get(o.m * o.n)
	defer acc.Put()
	if err := gemmF32(acc.V, a.V, b, o.m, o.n, o.k, o.transA, o.transB, 0, o.k); err != nil {
		return err
	}
	return o.epilogue(mem, acc.V)
}

// partRange is part p's chunk of K.
func (o *gemmOp) partRange(p int) (int, int) {
	per := (o.k + o.parts - 1) / o.parts
	return min(p*per, o.k), min((p+1)*per, o.k)
}

// split writes each part's partial products into the workspace, part p's
// M×N block at p·M·N.
func (o *gemmOp) split(mem gpu.Memory) error {
	if o.parts <= 0 {
		return fmt.Errorf("split-K with %d parts: %w", o.parts, gpu.ErrInvalidValue)
	}
	a, b, err := o.operands(mem)
	if err != nil {
		return err
	}
	defer a.Put()
	part := f32mem.Get(o.parts * o.m * o.n)
	defer part.Put()
	for p := range o.parts {
		k0, k1 := o.partRange(p)
		if err := gemmF32(part.V[p*o.m*o.n:], a.V, b, o.m, o.n, o.k, o.transA, o.transB, k0, k1); err != nil {
			return err
		}
	}
	return f32mem.Write(mem, o.ws, part.V)
}

// reduce sums the parts in order and applies the epilogue.
func (o *gemmOp) reduce(mem gpu.Memory) error {
	part, err := f32mem.Read(mem, o.ws, o.parts*o.m*o.n)
	if err != nil {
		return err
	}
	defer part.Put()
	acc := f32mem.Get(o.m * o.n)
	defer acc.Put()
	clear(acc.V)
	for p := range o.parts {
		for x := range acc.V {
			acc.V[x] += part.V[p*o.m*o.n+x]
		}
	}
	return o.epilogue(mem, acc.V)
}
