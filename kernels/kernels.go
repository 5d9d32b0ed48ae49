// Package kernels is stablegraph's built-in kernel set: the kernels every
// backend provides under the same names, with typed signatures and Go
// reference implementations.
//
// The sim backend runs the references directly. The CUDA backend loads the
// PTX compiled from kernels.cu (see the cuda directory) and its tests check
// each kernel against the reference on random inputs.
//
// All kernels work on float32 row-major data unless their name says
// otherwise; the transformer-decode kernels (gpt2.go: embedding, layer norm,
// GELU, residual, KV-cache append, decode attention) also read int32 token
// ids and positions from device memory, and the decoding heads (gpt2.go:
// Argmax; sample.go: Sample, a Gumbel-max draw and top-K candidates whose
// noise the host computes bit for bit alike) read a row of logits and
// write a few bytes. Sizes are int32 (n, rows, cols, m,
// k) as in the CUDA sources. Each kernel has a launch helper (Elementwise,
// GemmConfig, LayerNormConfig, DecodeAttentionConfig) giving the geometry
// the CUDA kernels expect; the references reject a launch whose threads do
// not cover the problem, because device code would silently compute only
// part.
//
// # Extents
//
// Device code cannot tell where a buffer ends, so every built-in kernel but
// the patcher (which runtimes launch themselves, never through a program)
// has a Signature (extents.go): its parameters' names, for each pointer
// parameter the bytes a launch reads or writes through it as element bytes
// times a product of scalar arguments and constants (Extent: sg_axpb's y
// and x are 4·n bytes, sg_gemm's a 4·m·k), and the ranges its scalars must
// lie in (Bound, and at least 0 for every count). Where what a kernel
// touches depends on device data (token ids, positions), the extent is the
// most the scalars that data is checked against allow (vocab, npos), and
// KVAppend's and DecodeAttention's caches past nseq have none (Extent.When).
// Package stablegraph's Compile refuses a launch whose slices are shorter
// than their extents, or whose scalars are out of range, before anything is
// allocated. TestSignaturesMatchReferences holds every extent to its
// reference: a launch with exactly those bytes runs, one a byte short
// faults.
package kernels

import (
	"fmt"
	"math"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/f32mem"
)

// Kernel names.
const (
	Fill         = "sg_fill"          // (y, value f32, n): y[i] = value
	FillU64      = "sg_fill_u64"      // (y, value u64, n): y[i] = value (uint64 elements)
	Copy         = "sg_copy"          // (y, x, n): y[i] = x[i]
	Axpb         = "sg_axpb"          // (y, x, a f32, b f32, n): y[i] = a*x[i] + b
	Axpy         = "sg_axpy"          // (y, x, a f32, n): y[i] += a*x[i]
	Add          = "sg_add"           // (z, x, y, n): z[i] = x[i] + y[i]
	SubScale     = "sg_sub_scale"     // (z, x, y, s f32, n): z[i] = s*(x[i] - y[i])
	BiasAdd      = "sg_bias_add"      // (y, x, bias, rows, cols): y[r,c] = x[r,c] + bias[c]
	BiasTanh     = "sg_bias_tanh"     // (y, x, bias, rows, cols): y[r,c] = tanh(x[r,c] + bias[c])
	Tanh         = "sg_tanh"          // (y, x, n): y[i] = tanh(x[i])
	Relu         = "sg_relu"          // (y, x, n): y[i] = max(x[i], 0)
	TanhBackward = "sg_tanh_backward" // (dx, dy, y, n): dx[i] = dy[i] * (1 - y[i]^2)
	ReluBackward = "sg_relu_backward" // (dx, dy, x, n): dx[i] = x[i] > 0 ? dy[i] : 0
	BiasGrad     = "sg_bias_grad"     // (db, dy, rows, cols): db[c] = sum_r dy[r,c]
	// Gemm is (c, a, b, m, n, k, transA, transB, alpha f32, beta f32):
	// C[m×n] = alpha·op(A)·op(B) + beta·C, row-major. op(A) is m×k: A is
	// stored m×k, or k×m when transA != 0. op(B) is k×n: B is stored k×n,
	// or n×k when transB != 0. When beta is 0, C is not read.
	Gemm = "sg_gemm"
)

// GemmTile is the block edge of the gemm kernel: blocks of GemmTile×GemmTile
// threads, one thread per element of C.
const GemmTile = 16

// Elementwise is the launch for an n-element kernel (and for BiasGrad, with
// n = cols; for BiasAdd/BiasTanh, n = rows*cols).
func Elementwise(n int) gpu.LaunchConfig { return gpu.Linear(n, 256) }

// GemmConfig is the launch for an m×n gemm: x covers columns, y rows.
func GemmConfig(m, n int) gpu.LaunchConfig {
	t := uint32(GemmTile)
	return gpu.LaunchConfig{
		Grid:  gpu.Dim3{X: (uint32(n) + t - 1) / t, Y: (uint32(m) + t - 1) / t, Z: 1},
		Block: gpu.Dim3{X: t, Y: t, Z: 1},
	}
}

var (
	p   = gpu.ArgPtr
	i32 = gpu.ArgI32
	f32 = gpu.ArgF32
	u64 = gpu.ArgU64
)

// Specs returns the kernel set's specs, in a stable order.
func Specs() []gpu.KernelSpec {
	return append([]gpu.KernelSpec{
		{Name: Fill, Params: []gpu.ArgKind{p, f32, i32}, Ref: refFill},
		{Name: FillU64, Params: []gpu.ArgKind{p, u64, i32}, Ref: refFillU64},
		{Name: Copy, Params: []gpu.ArgKind{p, p, i32}, Ref: unary(func(x float32) float32 { return x })},
		{Name: Axpb, Params: []gpu.ArgKind{p, p, f32, f32, i32}, Ref: refAxpb},
		{Name: Axpy, Params: []gpu.ArgKind{p, p, f32, i32}, Ref: refAxpy},
		{Name: Add, Params: []gpu.ArgKind{p, p, p, i32}, Ref: refAdd},
		{Name: SubScale, Params: []gpu.ArgKind{p, p, p, f32, i32}, Ref: refSubScale},
		{Name: BiasAdd, Params: []gpu.ArgKind{p, p, p, i32, i32}, Ref: bias(func(x float32) float32 { return x })},
		{Name: BiasTanh, Params: []gpu.ArgKind{p, p, p, i32, i32}, Ref: bias(tanh32)},
		{Name: Tanh, Params: []gpu.ArgKind{p, p, i32}, Ref: unary(tanh32)},
		{Name: Relu, Params: []gpu.ArgKind{p, p, i32}, Ref: unary(func(x float32) float32 { return max(x, 0) })},
		{Name: TanhBackward, Params: []gpu.ArgKind{p, p, p, i32}, Ref: binary(func(dy, y float32) float32 { return dy * (1 - y*y) })},
		{Name: ReluBackward, Params: []gpu.ArgKind{p, p, p, i32}, Ref: binary(func(dy, x float32) float32 {
			if x > 0 {
				return dy
			}
			return 0
		})},
		{Name: BiasGrad, Params: []gpu.ArgKind{p, p, i32, i32}, Ref: refBiasGrad},
		{Name: Gemm, Params: []gpu.ArgKind{p, p, p, i32, i32, i32, i32, i32, f32, f32}, Ref: refGemm},
	}, gpt2Specs()...)
}

// Module returns the built-in module image: the specs and their PTX (the
// sm_90 build for Hopper, a portable one for the rest).
func Module() *gpu.ModuleImage {
	return &gpu.ModuleImage{Name: "stablegraph-builtin", Kernels: Specs(), Code: moduleCode}
}

// ptx is set by the file that embeds the compiled PTX, when present.
var ptx []byte

func tanh32(x float32) float32 { return float32(math.Tanh(float64(x))) }

// need checks that a launch has at least n threads and that sizes are sane.
func need(cfg gpu.LaunchConfig, n int, name string) error {
	if n < 0 {
		return fmt.Errorf("kernel %s: negative size %d: %w", name, n, gpu.ErrInvalidValue)
	}
	threads := uint64(cfg.Grid.X) * uint64(cfg.Grid.Y) * uint64(cfg.Grid.Z) *
		uint64(cfg.Block.X) * uint64(cfg.Block.Y) * uint64(cfg.Block.Z)
	if threads < uint64(n) {
		return fmt.Errorf("kernel %s: launch of %d threads does not cover %d elements: %w", name, threads, n, gpu.ErrInvalidValue)
	}
	return nil
}

func refFill(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
	n := int(a[2].AsI32())
	if err := need(cfg, n, Fill); err != nil {
		return err
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = a[1].AsF32()
	}
	return f32mem.Write(mem, a[0].AsPtr(), v)
}

func refFillU64(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
	n := int(a[2].AsI32())
	if err := need(cfg, n, FillU64); err != nil {
		return err
	}
	b := make([]byte, 8*n)
	for i := 0; i < n; i++ {
		gpu.U64(a[1].AsU64()).Encode(b[8*i:])
	}
	return mem.Write(a[0].AsPtr(), b)
}

// unary builds (y, x, n): y[i] = f(x[i]).
func unary(f func(float32) float32) gpu.KernelFunc {
	return func(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
		n := int(a[2].AsI32())
		if err := need(cfg, n, "unary"); err != nil {
			return err
		}
		xBuf, err := f32mem.Read(mem, a[1].AsPtr(), n)
		if err != nil {
			return err
		}
		defer xBuf.Put()
		x := xBuf.V
		for i := range x {
			x[i] = f(x[i])
		}
		return f32mem.Write(mem, a[0].AsPtr(), x)
	}
}

// binary builds (z, x, y, n): z[i] = f(x[i], y[i]).
func binary(f func(x, y float32) float32) gpu.KernelFunc {
	return func(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
		n := int(a[3].AsI32())
		if err := need(cfg, n, "binary"); err != nil {
			return err
		}
		xBuf, err := f32mem.Read(mem, a[1].AsPtr(), n)
		if err != nil {
			return err
		}
		defer xBuf.Put()
		x := xBuf.V
		yBuf, err := f32mem.Read(mem, a[2].AsPtr(), n)
		if err != nil {
			return err
		}
		defer yBuf.Put()
		y := yBuf.V
		for i := range x {
			x[i] = f(x[i], y[i])
		}
		return f32mem.Write(mem, a[0].AsPtr(), x)
	}
}

var refAdd = binary(func(x, y float32) float32 { return x + y })

func refSubScale(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
	s := a[3].AsF32()
	return binary(func(x, y float32) float32 { return s * (x - y) })(mem, cfg, []gpu.Arg{a[0], a[1], a[2], a[4]})
}

func refAxpb(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
	n := int(a[4].AsI32())
	if err := need(cfg, n, Axpb); err != nil {
		return err
	}
	xBuf, err := f32mem.Read(mem, a[1].AsPtr(), n)
	if err != nil {
		return err
	}
	defer xBuf.Put()
	x := xBuf.V
	ca, cb := a[2].AsF32(), a[3].AsF32()
	for i := range x {
		x[i] = ca*x[i] + cb
	}
	return f32mem.Write(mem, a[0].AsPtr(), x)
}

func refAxpy(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
	n := int(a[3].AsI32())
	if err := need(cfg, n, Axpy); err != nil {
		return err
	}
	yBuf, err := f32mem.Read(mem, a[0].AsPtr(), n)
	if err != nil {
		return err
	}
	defer yBuf.Put()
	y := yBuf.V
	xBuf, err := f32mem.Read(mem, a[1].AsPtr(), n)
	if err != nil {
		return err
	}
	defer xBuf.Put()
	x := xBuf.V
	s := a[2].AsF32()
	for i := range y {
		y[i] += s * x[i]
	}
	return f32mem.Write(mem, a[0].AsPtr(), y)
}

// bias builds (y, x, bias, rows, cols): y[r,c] = f(x[r,c] + bias[c]).
func bias(f func(float32) float32) gpu.KernelFunc {
	return func(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
		rows, cols := int(a[3].AsI32()), int(a[4].AsI32())
		if rows < 0 || cols < 0 {
			return fmt.Errorf("kernel bias: negative shape %dx%d: %w", rows, cols, gpu.ErrInvalidValue)
		}
		if err := need(cfg, rows*cols, "bias"); err != nil {
			return err
		}
		xBuf, err := f32mem.Read(mem, a[1].AsPtr(), rows*cols)
		if err != nil {
			return err
		}
		defer xBuf.Put()
		x := xBuf.V
		bBuf, err := f32mem.Read(mem, a[2].AsPtr(), cols)
		if err != nil {
			return err
		}
		defer bBuf.Put()
		b := bBuf.V
		for i := range x {
			x[i] = f(x[i] + b[i%cols])
		}
		return f32mem.Write(mem, a[0].AsPtr(), x)
	}
}

func refBiasGrad(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
	rows, cols := int(a[2].AsI32()), int(a[3].AsI32())
	if rows < 0 {
		return fmt.Errorf("kernel %s: negative rows %d: %w", BiasGrad, rows, gpu.ErrInvalidValue)
	}
	if err := need(cfg, cols, BiasGrad); err != nil {
		return err
	}
	dyBuf, err := f32mem.Read(mem, a[1].AsPtr(), rows*cols)
	if err != nil {
		return err
	}
	defer dyBuf.Put()
	dy := dyBuf.V
	db := make([]float32, cols)
	for c := range db {
		var s float32
		for r := 0; r < rows; r++ {
			s += dy[r*cols+c]
		}
		db[c] = s
	}
	return f32mem.Write(mem, a[0].AsPtr(), db)
}

func refGemm(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
	m, n, k := int(a[3].AsI32()), int(a[4].AsI32()), int(a[5].AsI32())
	transA, transB := a[6].AsI32() != 0, a[7].AsI32() != 0
	alpha, beta := a[8].AsF32(), a[9].AsF32()
	if m < 0 || n < 0 || k < 0 {
		return fmt.Errorf("kernel %s: negative shape m=%d n=%d k=%d: %w", Gemm, m, n, k, gpu.ErrInvalidValue)
	}
	if uint64(cfg.Grid.X)*uint64(cfg.Block.X) < uint64(n) || uint64(cfg.Grid.Y)*uint64(cfg.Block.Y) < uint64(m) {
		return fmt.Errorf("kernel %s: launch %v×%v does not cover %dx%d: %w", Gemm, cfg.Grid, cfg.Block, m, n, gpu.ErrInvalidValue)
	}
	ABuf, err := f32mem.Read(mem, a[1].AsPtr(), m*k)
	if err != nil {
		return err
	}
	defer ABuf.Put()
	A := ABuf.V
	BBuf, err := f32mem.Read(mem, a[2].AsPtr(), k*n)
	if err != nil {
		return err
	}
	defer BBuf.Put()
	B := BBuf.V
	var C []float32
	if beta != 0 {
		if C, err = gpu.ReadF32(mem, a[0].AsPtr(), m*n); err != nil {
			return err
		}
	} else {
		C = make([]float32, m*n)
	}
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float32
			for l := 0; l < k; l++ {
				av := A[i*k+l]
				if transA {
					av = A[l*m+i]
				}
				bv := B[l*n+j]
				if transB {
					bv = B[j*k+l]
				}
				s += av * bv
			}
			if beta != 0 {
				C[i*n+j] = alpha*s + beta*C[i*n+j]
			} else {
				C[i*n+j] = alpha * s
			}
		}
	}
	return f32mem.Write(mem, a[0].AsPtr(), C)
}
