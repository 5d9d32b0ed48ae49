package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
)

// plainGemm is the library's arithmetic as its first version computed it,
// one element at a time: the oracle gemmF32 must match bit for bit.
func plainGemm(dst, a, b []float32, m, n, k int, transA, transB bool, k0, k1 int) {
	for i := range m {
		for j := range n {
			var s float32
			for l := k0; l < k1; l++ {
				av := a[i*k+l]
				if transA {
					av = a[l*m+i]
				}
				bv := b[l*n+j]
				if transB {
					bv = b[j*k+l]
				}
				s += av * bv
			}
			dst[i*n+j] = s
		}
	}
}

// plain is what the library computes for d, by the plain loop: the
// product over all of K (parts 0) or over each part's chunk of K summed
// part after part, then alpha·acc + beta·C + bias.
func (d *gemmData) plain(parts int) []float32 {
	p := d.p
	acc := make([]float32, p.M*p.N)
	if parts == 0 {
		plainGemm(acc, d.a, d.b, p.M, p.N, p.K, p.TransA, p.TransB, 0, p.K)
	} else {
		o := gemmOp{k: p.K, parts: parts}
		part := make([]float32, p.M*p.N)
		for q := range parts {
			k0, k1 := o.partRange(q)
			plainGemm(part, d.a, d.b, p.M, p.N, p.K, p.TransA, p.TransB, k0, k1)
			for x := range acc {
				acc[x] += part[x]
			}
		}
	}
	for i := range acc {
		v := p.Alpha * acc[i]
		if p.Beta != 0 {
			v += p.Beta * d.c[i]
		}
		if d.bias != nil {
			v += d.bias[i%p.N]
		}
		acc[i] = v
	}
	return acc
}

// wideVals are values whose products span many orders of magnitude, so
// that a sum taken in another order gives other bits.
func wideVals(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32((r.Float64()*2 - 1) * math.Pow(10, float64(r.IntN(9)-4)))
	}
	return v
}

// bOf is the bSource of B stored k×n, or n×k when transB.
func bOf(b []float32, n, k int, transB bool) bSource {
	if transB {
		return sliceB(b, k)
	}
	return sliceB(b, n)
}

func sameBits(x, y []float32) int {
	for i := range x {
		if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
			return i
		}
	}
	return -1
}

// TestGemmF32MatchesPlainLoop: the blocked, parallel product gives the
// plain loop's bits for every layout, every edge of its blocking (shapes
// around multiples of its tiles), a range of K (split-K's parts) and any
// GOMAXPROCS.
func TestGemmF32MatchesPlainLoop(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	dims := []int{1, 2, 3, 4, 5, 7, 8, 9, 17, 33}
	type shape struct{ m, n, k int }
	var shapes []shape
	for range 60 {
		shapes = append(shapes, shape{dims[r.IntN(len(dims))], dims[r.IntN(len(dims))], dims[r.IntN(len(dims))]})
	}
	// Past the NN kernel's column chunk, big enough to run in parallel,
	// and through several panels of B.
	shapes = append(shapes, shape{9, gemmNC + 37, 70}, shape{64, 300, 40}, shape{5, 2*gemmNC + 1, 129},
		shape{6, 3, gemmPanel/2 + 5}, shape{5, 2*gemmPanel/1000 + 3, 1000})
	for _, procs := range []int{1, 3} {
		prev := runtime.GOMAXPROCS(procs)
		for _, s := range shapes {
			a, b := wideVals(r, s.m*s.k), wideVals(r, s.k*s.n)
			k0, k1 := 0, s.k
			if s.k > 2 && r.IntN(2) == 0 {
				k0 = r.IntN(s.k / 2)
				k1 = k0 + 1 + r.IntN(s.k-k0)
			}
			for _, ta := range []bool{false, true} {
				for _, tb := range []bool{false, true} {
					want := make([]float32, s.m*s.n)
					plainGemm(want, a, b, s.m, s.n, s.k, ta, tb, k0, k1)
					got := wideVals(r, s.m*s.n) // stale contents must not leak in
					must(t, gemmF32(got, a, bOf(b, s.n, s.k, tb), s.m, s.n, s.k, ta, tb, k0, k1))
					if i := sameBits(want, got); i >= 0 {
						t.Fatalf("GOMAXPROCS %d, m=%d n=%d k=%d [%d,%d) transA=%v transB=%v: element %d is %g (%#x), the plain loop's %g (%#x)",
							procs, s.m, s.n, s.k, k0, k1, ta, tb, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
					}
				}
			}
		}
		runtime.GOMAXPROCS(prev)
	}
}

// TestGemmF32OrderMatters checks that TestGemmF32MatchesPlainLoop can fail:
// on its kind of data, the same sums taken in another order (K reversed)
// give other bits.
func TestGemmF32OrderMatters(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	m, n, k := 8, 40, 64
	a, b := wideVals(r, m*k), wideVals(r, k*n)
	ra, rb := make([]float32, m*k), make([]float32, k*n)
	for l := range k {
		for i := range m {
			ra[i*k+l] = a[i*k+k-1-l]
		}
		copy(rb[l*n:(l+1)*n], b[(k-1-l)*n:(k-l)*n])
	}
	fwd, rev := make([]float32, m*n), make([]float32, m*n)
	must(t, gemmF32(fwd, a, sliceB(b, n), m, n, k, false, false, 0, k))
	must(t, gemmF32(rev, ra, sliceB(rb, n), m, n, k, false, false, 0, k))
	if sameBits(fwd, rev) < 0 {
		t.Fatal("reversing K gave the same bits: the data cannot tell summation orders apart")
	}
}

// BenchmarkSimGEMM is the sim's GEMM arithmetic on the host CPU (not GPU
// time) at the workloads' shapes: mlp-large's layer, GPT-2 small decode's
// MLP and LM head at batch 8.
func BenchmarkSimGEMM(bm *testing.B) {
	for _, c := range []struct {
		name    string
		m, n, k int
		transB  bool
	}{
		{"mlp-large_64x1024x1024", 64, 1024, 1024, false},
		{"gpt2-fc_8x3072x768", 8, 3072, 768, false},
		{"gpt2-lmhead_8x50257x768_NT", 8, 50257, 768, true},
	} {
		r := rand.New(rand.NewPCG(5, 6))
		a, b := wideVals(r, c.m*c.k), wideVals(r, c.k*c.n)
		dst := make([]float32, c.m*c.n)
		run := func(name string, f func()) {
			bm.Run(name, func(bm *testing.B) {
				for bm.Loop() {
					f()
				}
				bm.ReportMetric(float64(c.m*c.n*c.k)*float64(bm.N)/bm.Elapsed().Seconds()/1e9, "GMAC/s")
			})
		}
		run(c.name, func() { gemmF32(dst, a, bOf(b, c.n, c.k, c.transB), c.m, c.n, c.k, false, c.transB, 0, c.k) })
		if c.m*c.n*c.k <= 64<<20 {
			run(fmt.Sprintf("%s_plain", c.name), func() { plainGemm(dst, a, b, c.m, c.n, c.k, false, c.transB, 0, c.k) })
		}
	}
}

// TestParallelPanics: a range that panics, on the caller's goroutine or
// another, fails the product with gpu.ErrDeviceLost once every range is
// done; errors come back from the lowest failing range.
func TestParallelPanics(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(3))
	for _, bad := range []int{0, 1, 2} {
		var done atomic.Int32
		err := parallel(90, 2, gemmParMin, func(lo, hi int) error {
			defer done.Add(1)
			if lo/30 == bad {
				panic("index out of range")
			}
			return nil
		})
		if !errors.Is(err, gpu.ErrDeviceLost) || !strings.Contains(err.Error(), "index out of range") || done.Load() != 3 {
			t.Errorf("range %d panics: %v after %d ranges, want gpu.ErrDeviceLost after 3", bad, err, done.Load())
		}
	}
	errAt := func(lo int) error { return fmt.Errorf("range at %d", lo) }
	if err := parallel(90, 2, gemmParMin, func(lo, hi int) error { return errAt(lo) }); err == nil || err.Error() != "range at 0" {
		t.Errorf("every range fails: %v, want the first range's error", err)
	}
}
