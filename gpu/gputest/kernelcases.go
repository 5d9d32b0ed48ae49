package gputest

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

// A kernel case is one launch of a built-in kernel on random inputs. The
// subtest runs it on the backend and runs the kernel's Go reference over a
// MapMemory holding the same inputs, then compares the outputs.
type kernelCase struct {
	name   string
	kernel string
	make   func(r *rand.Rand) kernelInst
}

// kernelInst is a case made concrete with random inputs.
type kernelInst struct {
	bufs []kbuf
	args func(p []gpu.DevicePtr) []gpu.Arg
	cfg  gpu.LaunchConfig
	// check compares the outputs; nil compares every output buffer with the
	// reference's, elementwise with f32Tol (or exactly, for exact buffers).
	check func(h *h, in, ref, got [][]byte)
}

type kbuf struct {
	init  []byte
	out   bool // written by the kernel
	exact bool // compared bytewise
}

// Elementwise tolerance: |got - want| <= f32Tol * (1 + |want|).
const f32Tol = 1e-5

// unitRoundoff is float32's unit roundoff, 2^-24.
const unitRoundoff = 1.0 / (1 << 24)

func in(v []float32) kbuf  { return kbuf{init: gpu.F32ToBytes(v)} }
func out(v []float32) kbuf { return kbuf{init: gpu.F32ToBytes(v), out: true} }

func randF32(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.Float64()*4 - 2)
	}
	return v
}

// withZeros sets about a tenth of v to zero (edge cases of relu).
func withZeros(r *rand.Rand, v []float32) []float32 {
	for i := range v {
		if r.IntN(10) == 0 {
			v[i] = 0
		}
	}
	return v
}

// randN is an element count that is not a multiple of any block size.
func randN(r *rand.Rand) int { return notMultiple(1+r.IntN(5000), 16) }

func notMultiple(n, of int) int {
	if n%of == 0 {
		n++
	}
	return n
}

func ptrs(p []gpu.DevicePtr) []gpu.Arg {
	a := make([]gpu.Arg, len(p))
	for i := range p {
		a[i] = gpu.Ptr(p[i])
	}
	return a
}

// unaryCase is (y, x, n).
func unaryCase(name string, gen func(r *rand.Rand, n int) []float32, exact bool) kernelCase {
	return kernelCase{name: name, kernel: name, make: func(r *rand.Rand) kernelInst {
		n := randN(r)
		y := out(randF32(r, n))
		y.exact = exact
		return kernelInst{
			bufs: []kbuf{y, in(gen(r, n))},
			args: func(p []gpu.DevicePtr) []gpu.Arg { return append(ptrs(p), gpu.I32(int32(n))) },
			cfg:  kernels.Elementwise(n),
		}
	}}
}

// binaryCase is (z, x, y, [scalars...], n).
func binaryCase(name string, scalars int) kernelCase {
	return kernelCase{name: name, kernel: name, make: func(r *rand.Rand) kernelInst {
		n := randN(r)
		var sc []gpu.Arg
		for range scalars {
			sc = append(sc, gpu.F32(float32(r.Float64()*6-3)))
		}
		return kernelInst{
			bufs: []kbuf{out(randF32(r, n)), in(withZeros(r, randF32(r, n))), in(withZeros(r, randF32(r, n)))},
			args: func(p []gpu.DevicePtr) []gpu.Arg {
				return append(append(ptrs(p), sc...), gpu.I32(int32(n)))
			},
			cfg: kernels.Elementwise(n),
		}
	}}
}

func biasCase(name string) kernelCase {
	return kernelCase{name: name, kernel: name, make: func(r *rand.Rand) kernelInst {
		rows, cols := 1+r.IntN(40), notMultiple(1+r.IntN(100), 16)
		return kernelInst{
			bufs: []kbuf{out(randF32(r, rows*cols)), in(randF32(r, rows*cols)), in(randF32(r, cols))},
			args: func(p []gpu.DevicePtr) []gpu.Arg {
				return append(ptrs(p), gpu.I32(int32(rows)), gpu.I32(int32(cols)))
			},
			cfg: kernels.Elementwise(rows * cols),
		}
	}}
}

func kernelCases() []kernelCase {
	cases := []kernelCase{
		{name: kernels.Fill, kernel: kernels.Fill, make: func(r *rand.Rand) kernelInst {
			n, v := randN(r), float32(r.Float64()*100-50)
			y := out(randF32(r, n))
			y.exact = true
			return kernelInst{bufs: []kbuf{y}, cfg: kernels.Elementwise(n),
				args: func(p []gpu.DevicePtr) []gpu.Arg { return []gpu.Arg{gpu.Ptr(p[0]), gpu.F32(v), gpu.I32(int32(n))} }}
		}},
		{name: kernels.FillU64, kernel: kernels.FillU64, make: func(r *rand.Rand) kernelInst {
			n, v := randN(r), r.Uint64()
			y := make([]byte, 8*n)
			for i := range y {
				y[i] = byte(r.Uint32())
			}
			return kernelInst{bufs: []kbuf{{init: y, out: true, exact: true}}, cfg: kernels.Elementwise(n),
				args: func(p []gpu.DevicePtr) []gpu.Arg { return []gpu.Arg{gpu.Ptr(p[0]), gpu.U64(v), gpu.I32(int32(n))} }}
		}},
		unaryCase(kernels.Copy, randF32, true),
		{name: kernels.Axpb, kernel: kernels.Axpb, make: func(r *rand.Rand) kernelInst {
			n, a, b := randN(r), float32(r.Float64()*6-3), float32(r.Float64()*6-3)
			return kernelInst{bufs: []kbuf{out(randF32(r, n)), in(randF32(r, n))}, cfg: kernels.Elementwise(n),
				args: func(p []gpu.DevicePtr) []gpu.Arg {
					return []gpu.Arg{gpu.Ptr(p[0]), gpu.Ptr(p[1]), gpu.F32(a), gpu.F32(b), gpu.I32(int32(n))}
				}}
		}},
		{name: kernels.Axpy, kernel: kernels.Axpy, make: func(r *rand.Rand) kernelInst {
			n, a := randN(r), float32(r.Float64()*6-3)
			return kernelInst{bufs: []kbuf{out(randF32(r, n)), in(randF32(r, n))}, cfg: kernels.Elementwise(n),
				args: func(p []gpu.DevicePtr) []gpu.Arg {
					return []gpu.Arg{gpu.Ptr(p[0]), gpu.Ptr(p[1]), gpu.F32(a), gpu.I32(int32(n))}
				}}
		}},
		binaryCase(kernels.Add, 0),
		binaryCase(kernels.SubScale, 1),
		biasCase(kernels.BiasAdd),
		biasCase(kernels.BiasTanh),
		unaryCase(kernels.Tanh, randF32, false),
		unaryCase(kernels.Relu, func(r *rand.Rand, n int) []float32 { return withZeros(r, randF32(r, n)) }, false),
		binaryCase(kernels.TanhBackward, 0),
		binaryCase(kernels.ReluBackward, 0),
		{name: kernels.BiasGrad, kernel: kernels.BiasGrad, make: makeBiasGrad},
	}
	for _, ta := range []int32{0, 1} {
		for _, tb := range []int32{0, 1} {
			for _, beta := range []float32{0, 0.75} {
				name := fmt.Sprintf("%s_%s%s_beta%g", kernels.Gemm, "NT"[ta:ta+1], "NT"[tb:tb+1], beta)
				cases = append(cases, kernelCase{name: name, kernel: kernels.Gemm, make: func(r *rand.Rand) kernelInst {
					// k >= 2: with k = 1 a transposed operand has the same layout.
					m, n, k := notMultiple(17+r.IntN(40), 16), notMultiple(17+r.IntN(40), 16), notMultiple(2+r.IntN(70), 16)
					return makeGemm(r, m, n, k, ta, tb, beta)
				}})
			}
		}
	}
	// A single row and a single column: the edges of the tiling.
	cases = append(cases, kernelCase{name: kernels.Gemm + "_thin", kernel: kernels.Gemm, make: func(r *rand.Rand) kernelInst {
		return makeGemm(r, 1, 33, 19, 0, 1, 1)
	}}, kernelCase{name: kernels.Gemm + "_tall", kernel: kernels.Gemm, make: func(r *rand.Rand) kernelInst {
		return makeGemm(r, 45, 1, 7, 1, 0, 0)
	}})
	return append(cases, gpt2KernelCases()...)
}

func makeBiasGrad(r *rand.Rand) kernelInst {
	rows, cols := 1+r.IntN(60), notMultiple(1+r.IntN(300), 16)
	dy := randF32(r, rows*cols)
	return kernelInst{
		bufs: []kbuf{out(randF32(r, cols)), in(dy)},
		args: func(p []gpu.DevicePtr) []gpu.Arg {
			return append(ptrs(p), gpu.I32(int32(rows)), gpu.I32(int32(cols)))
		},
		cfg: kernels.Elementwise(cols),
		check: func(h *h, in, ref, got [][]byte) {
			want, bound := make([]float64, cols), make([]float64, cols)
			for c := range cols {
				var s, abs float64
				for r := range rows {
					v := float64(dy[r*cols+c])
					s += v
					abs += math.Abs(v)
				}
				want[c], bound[c] = s, 2*float64(rows+1)*unitRoundoff*abs
			}
			h.within("reference", gpu.BytesToF32(ref[0]), want, bound)
			h.within("backend", gpu.BytesToF32(got[0]), want, bound)
		},
	}
}

// makeGemm is C[m×n] = alpha·op(A)·op(B) + beta·C with random data. When
// beta is 0 the initial C is all NaN: a kernel that reads it fails.
func makeGemm(r *rand.Rand, m, n, k int, ta, tb int32, beta float32) kernelInst {
	alpha := float32(r.Float64()*2 + 0.5)
	A, B := randF32(r, m*k), randF32(r, k*n)
	C := randF32(r, m*n)
	if beta == 0 {
		for i := range C {
			C[i] = float32(math.NaN())
		}
	}
	a := func(i, l int) float64 {
		if ta != 0 {
			return float64(A[l*m+i])
		}
		return float64(A[i*k+l])
	}
	b := func(l, j int) float64 {
		if tb != 0 {
			return float64(B[j*k+l])
		}
		return float64(B[l*n+j])
	}
	return kernelInst{
		bufs: []kbuf{out(C), in(A), in(B)},
		args: func(p []gpu.DevicePtr) []gpu.Arg {
			return append(ptrs(p), gpu.I32(int32(m)), gpu.I32(int32(n)), gpu.I32(int32(k)),
				gpu.I32(ta), gpu.I32(tb), gpu.F32(alpha), gpu.F32(beta))
		},
		cfg: kernels.GemmConfig(m, n),
		check: func(h *h, in, ref, got [][]byte) {
			h.Logf("gemm m=%d n=%d k=%d transA=%d transB=%d alpha=%g beta=%g", m, n, k, ta, tb, alpha, beta)
			want, bound := make([]float64, m*n), make([]float64, m*n)
			for i := range m {
				for j := range n {
					var s, abs float64
					for l := range k {
						s += a(i, l) * b(l, j)
						abs += math.Abs(a(i, l) * b(l, j))
					}
					s *= float64(alpha)
					abs *= math.Abs(float64(alpha))
					if beta != 0 {
						c := float64(beta) * float64(C[i*n+j])
						s += c
						abs += math.Abs(c)
					}
					want[i*n+j], bound[i*n+j] = s, 2*float64(k+2)*unitRoundoff*abs
				}
			}
			h.within("reference", gpu.BytesToF32(ref[0]), want, bound)
			h.within("backend", gpu.BytesToF32(got[0]), want, bound)
		},
	}
}

// within checks |got[i] - want[i]| <= bound[i] (+ a hair for zero bounds).
func (h *h) within(what string, got []float32, want, bound []float64) {
	h.Helper()
	bad := 0
	for i := range want {
		if d := math.Abs(float64(got[i]) - want[i]); !(d <= bound[i]+1e-30) {
			if bad < 5 {
				h.Errorf("%s: [%d] = %v, float64 reference %v, error %.3g > bound %.3g", what, i, got[i], want[i], d, bound[i])
			}
			bad++
		}
	}
	if bad > 0 {
		h.Errorf("%s: %d of %d values out of bounds", what, bad, len(want))
	}
}

// kernelTests are the Kernels group: one subtest per case, and one that
// checks every kernel of kernels.Specs() has a case.
func kernelTests() []test {
	tests := []test{{name: "EverySpecHasACase", raw: func(t *testing.T, _ opener) {
		has := map[string]bool{}
		for _, c := range kernelCases() {
			has[c.kernel] = true
		}
		for _, spec := range kernels.Specs() {
			if !has[spec.Name] {
				t.Errorf("kernel %s has no conformance case in gputest", spec.Name)
			}
			delete(has, spec.Name)
		}
		for name := range has {
			t.Errorf("gputest has cases for %s, which kernels.Specs() does not list", name)
		}
	}}}
	for _, c := range kernelCases() {
		tests = append(tests, test{name: c.name, run: func(h *h) { runKernelCase(h, c) }})
	}
	return tests
}

func runKernelCase(h *h, c kernelCase) {
	spec, ok := kernels.Module().Kernel(c.kernel)
	if !ok {
		h.Fatalf("no kernel %s in kernels.Module()", c.kernel)
	}
	f := h.fn(0, c.kernel)
	inst := c.make(h.random())

	ref := NewMapMemory()
	fake := make([]gpu.DevicePtr, len(inst.bufs))
	dev := make([]gpu.DevicePtr, len(inst.bufs))
	for i, b := range inst.bufs {
		fake[i] = ref.Alloc(b.init)
		dev[i] = h.upload(0, b.init)
	}
	if err := spec.Ref(ref, inst.cfg, inst.args(fake)); err != nil {
		h.Fatalf("the Go reference of %s failed on the test's inputs: %v", c.kernel, err)
	}
	s := h.stream(0)
	h.ok("LaunchKernel("+c.kernel+")", h.b.LaunchKernel(f, inst.cfg, inst.args(dev), s))
	h.sync(s)

	var ins, refs, gots [][]byte
	for i, b := range inst.bufs {
		got := h.download(dev[i], len(b.init))
		want := ref.Bytes(fake[i])
		ins, refs, gots = append(ins, b.init), append(refs, want), append(gots, got)
		switch {
		case !b.out:
			if !bytes.Equal(got, b.init) {
				h.Errorf("%s changed its input buffer %d", c.kernel, i)
			}
		case inst.check != nil:
		case b.exact:
			if !bytes.Equal(got, want) {
				h.Errorf("%s output buffer %d differs from the reference (exact comparison)", c.kernel, i)
			}
		default:
			h.closeF32(fmt.Sprintf("%s output buffer %d", c.kernel, i), gpu.BytesToF32(got), gpu.BytesToF32(want))
		}
	}
	if inst.check != nil {
		inst.check(h, ins, refs, gots)
	}
}

// closeF32 checks got against want elementwise with f32Tol.
func (h *h) closeF32(what string, got, want []float32) {
	h.Helper()
	bad := 0
	for i := range want {
		g, w := float64(got[i]), float64(want[i])
		ok := math.Abs(g-w) <= f32Tol*(1+math.Abs(w)) || math.IsNaN(g) && math.IsNaN(w)
		if !ok {
			if bad < 5 {
				h.Errorf("%s: [%d] = %v, reference %v", what, i, got[i], want[i])
			}
			bad++
		}
	}
	if bad > 0 {
		h.Errorf("%s: %d of %d values differ beyond %g", what, bad, len(want), f32Tol)
	}
}
