package sim

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/stablegraph/stablegraph/gpu"

	"github.com/stablegraph/stablegraph/internal/f32mem"
)

// The arithmetic of the GEMM library's kernels (blas.go).
//
// What the library promises, and what the conformance suite, the replay
// tests and bench's bit-for-bit checks rely on, is that one product always
// gives the same bits: eager and replayed, on any stream, whatever else
// runs. The bits are those of the plainest loop: every element of the
// result is its own float32 sum started at +0 and taken over l in
// increasing order, one product and one addition per step, exactly as
//
//	var s float32
//	for l := k0; l < k1; l++ { s += a(i, l) * b(l, j) }
//
// computes it. gemmF32 computes those bits faster: the columns are shared
// out over goroutines (up to GOMAXPROCS), B streams through a small buffer
// per goroutine instead of being copied whole, and the loops are blocked so
// that several sums advance together in registers or in L1; but every
// element still sees its own additions in that one order (a sum carried
// from one block of K to the next is a float32 in memory, exactly what the
// register held), so neither the blocking nor the number of goroutines can
// change a bit. Go's compiler fuses a product and an addition into one FMA
// only on targets that have it for certain (GOAMD64=v3 and up, arm64, ...),
// and then it does so for the plain loop and for these alike: both are
// written acc += x*y.

const (
	// gemmPanel is how many float32s of B a goroutine holds at a time:
	// small enough to stay in its core's L2 while it is used.
	gemmPanel = 64 << 10
	// gemmNC is the width of the chunks of columns the NN kernel
	// accumulates into, four rows at a time: small enough that the
	// accumulators stay in L1 while B's rows stream past.
	gemmNC = 256
	// gemmParMin is the number of multiply-adds below which a product runs
	// on the calling goroutine: handing out work would cost more.
	gemmParMin = 1 << 16
)

// bSource fills dst with columns [c0, c1) of B's stored rows [r0, r1),
// row after row ((r1-r0)·(c1-c0) values).
type bSource func(r0, r1, c0, c1 int, dst []float32) error

// sliceB is the bSource of B held in b, rows of width floats.
func sliceB(b []float32, width int) bSource {
	return func(r0, r1, c0, c1 int, dst []float32) error {
		w := c1 - c0
		for r := r0; r < r1; r++ {
			copy(dst[(r-r0)*w:(r-r0+1)*w], b[r*width+c0:r*width+c1])
		}
		return nil
	}
}

// gemmF32 writes dst[i·n+j] = Σ_{l∈[k0,k1)} op(A)[i,l]·op(B)[l,j] for
// i < m, j < n, each sum in float32 from +0 in increasing l (see above).
// op(A) is m×k: a holds A stored m×k, or k×m when transA. op(B) is k×n,
// read through loadB: B is stored k×n, or n×k when transB. len(dst) ≥ m·n.
// It returns loadB's error, that of the first columns when several fail.
func gemmF32(dst, a []float32, loadB bSource, m, n, k int, transA, transB bool, k0, k1 int) error {
	dst = dst[:m*n]
	kk := k1 - k0
	if m == 0 || n == 0 {
		return nil
	}
	if kk <= 0 {
		clear(dst)
		return nil
	}
	// op(A)'s rows over [k0, k1), contiguous: A's own, or A transposed.
	lda, offA := k, k0
	if transA {
		pa := f32mem.Get(m * kk)
		defer pa.Put()
		for l := range kk {
			for i, v := range a[(k0+l)*m : (k0+l+1)*m] {
				pa.V[i*kk+l] = v
			}
		}
		a, lda, offA = pa.V, kk, 0
	}
	rowA := func(i int) []float32 { return a[i*lda+offA : i*lda+offA+kk] }
	if transB {
		// op(B)'s columns are B's rows: dot products of contiguous rows.
		return parallel(n, 2, m*n*kk, func(j0, j1 int) error {
			return streamNT(dst, rowA, loadB, m, n, kk, k0, k1, j0, j1)
		})
	}
	return parallel(n, 4, m*n*kk, func(j0, j1 int) error {
		return streamNN(dst, rowA, loadB, m, n, k0, k1, j0, j1)
	})
}

// parallel runs f over [0, n) cut into one range per goroutine, up to
// GOMAXPROCS, each a whole multiple of align but the last; or over all of
// it on the caller's goroutine when work (multiply-adds) is small. The
// ranges are disjoint. It returns the error of the lowest failing range. A
// range that panics fails with an error wrapping gpu.ErrDeviceLost (what
// the stream's worker makes of a kernel's panic) once every range is done.
func parallel(n, align, work int, f func(lo, hi int) error) error {
	g := runtime.GOMAXPROCS(0)
	if work < gemmParMin || g < 2 || n <= align {
		return f(0, n)
	}
	per := (n + g - 1) / g
	per = (per + align - 1) / align * align
	errs := make([]error, (n+per-1)/per)
	run := func(r int) {
		lo, hi := r*per, min((r+1)*per, n)
		defer func() {
			if v := recover(); v != nil {
				errs[r] = fmt.Errorf("columns %d to %d panicked: %v: %w", lo, hi, v, gpu.ErrDeviceLost)
			}
		}()
		errs[r] = f(lo, hi)
	}
	var wg sync.WaitGroup
	for r := 1; r < len(errs); r++ {
		wg.Go(func() { run(r) })
	}
	run(0) // nothing returns before every goroutine is done with the buffers
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// streamNT computes columns [j0, j1) of dst with B stored n×k: B's rows
// j0..j1-1 (columns k0..k1-1 of each) come through a panel of gemmPanel
// floats, and gemmNT takes each panel.
func streamNT(dst []float32, rowA func(int) []float32, loadB bSource, m, n, kk, k0, k1, j0, j1 int) error {
	rows := min(max(1, gemmPanel/kk), j1-j0)
	panel := f32mem.Get(rows * kk)
	defer panel.Put()
	for p0 := j0; p0 < j1; p0 += rows {
		p1 := min(p0+rows, j1)
		if err := loadB(p0, p1, k0, k1, panel.V[:(p1-p0)*kk]); err != nil {
			return err
		}
		colB := func(j int) []float32 { return panel.V[(j-p0)*kk : (j-p0+1)*kk] }
		gemmNT(dst, rowA, colB, m, n, p0, p1)
	}
	return nil
}

// gemmNT computes columns [j0, j1) of dst from op(A)'s rows and op(B)'s
// columns, both contiguous in l: four rows by two columns at a time, eight
// independent sums.
func gemmNT(dst []float32, rowA, colB func(int) []float32, m, n, j0, j1 int) {
	i := 0
	for ; i+4 <= m; i += 4 {
		a0, a1, a2, a3 := rowA(i), rowA(i+1), rowA(i+2), rowA(i+3)
		a1, a2, a3 = a1[:len(a0)], a2[:len(a0)], a3[:len(a0)]
		j := j0
		for ; j+2 <= j1; j += 2 {
			b0, b1 := colB(j), colB(j+1)
			b0, b1 = b0[:len(a0)], b1[:len(a0)]
			var s00, s01, s10, s11, s20, s21, s30, s31 float32
			for l, x0 := range a0 {
				y0, y1 := b0[l], b1[l]
				x1, x2, x3 := a1[l], a2[l], a3[l]
				s00 += x0 * y0
				s01 += x0 * y1
				s10 += x1 * y0
				s11 += x1 * y1
				s20 += x2 * y0
				s21 += x2 * y1
				s30 += x3 * y0
				s31 += x3 * y1
			}
			dst[i*n+j], dst[i*n+j+1] = s00, s01
			dst[(i+1)*n+j], dst[(i+1)*n+j+1] = s10, s11
			dst[(i+2)*n+j], dst[(i+2)*n+j+1] = s20, s21
			dst[(i+3)*n+j], dst[(i+3)*n+j+1] = s30, s31
		}
		for ; j < j1; j++ {
			for r := range 4 {
				dst[(i+r)*n+j] = dot(rowA(i+r), colB(j))
			}
		}
	}
	for ; i < m; i++ {
		ar := rowA(i)
		j := j0
		for ; j+4 <= j1; j += 4 {
			b0, b1, b2, b3 := colB(j), colB(j+1), colB(j+2), colB(j+3)
			b0, b1, b2, b3 = b0[:len(ar)], b1[:len(ar)], b2[:len(ar)], b3[:len(ar)]
			var s0, s1, s2, s3 float32
			for l, x := range ar {
				s0 += x * b0[l]
				s1 += x * b1[l]
				s2 += x * b2[l]
				s3 += x * b3[l]
			}
			dst[i*n+j], dst[i*n+j+1], dst[i*n+j+2], dst[i*n+j+3] = s0, s1, s2, s3
		}
		for ; j < j1; j++ {
			dst[i*n+j] = dot(ar, colB(j))
		}
	}
}

// dot is Σ x[l]·y[l] in increasing l, from +0.
func dot(x, y []float32) float32 {
	y = y[:len(x)]
	var s float32
	for l, v := range x {
		s += v * y[l]
	}
	return s
}

// streamNN computes columns [j0, j1) of dst with B stored k×n: columns
// j0..j1-1 of B's rows k0..k1-1 come through a panel of gemmPanel floats,
// in increasing l, and gemmNN adds each panel's products into the sums
// (the first panel starts them from zero).
func streamNN(dst []float32, rowA func(int) []float32, loadB bSource, m, n, k0, k1, j0, j1 int) error {
	w := j1 - j0
	rows := min(max(1, gemmPanel/w), k1-k0)
	panel := f32mem.Get(rows * w)
	defer panel.Put()
	for p0 := k0; p0 < k1; p0 += rows {
		p1 := min(p0+rows, k1)
		if err := loadB(p0, p1, j0, j1, panel.V[:(p1-p0)*w]); err != nil {
			return err
		}
		gemmNN(dst, rowA, panel.V, m, n, w, p0-k0, p1-k0, j0, p0 == k0)
	}
	return nil
}

// gemmNN adds op(A)[i,l]·B[l,j] for l in [l0, l1) of op(A)'s rows (in
// increasing l) into dst's columns [j0, j0+w), B's rows l0..l1-1 being
// panel's rows of w floats; start clears those sums first. It takes chunks
// of gemmNC columns and four rows of A at a time.
func gemmNN(dst []float32, rowA func(int) []float32, panel []float32, m, n, w, l0, l1, j0 int, start bool) {
	for c0 := 0; c0 < w; c0 += gemmNC {
		c1 := min(c0+gemmNC, w)
		i := 0
		for ; i+4 <= m; i += 4 {
			d0 := dst[i*n+j0+c0 : i*n+j0+c1]
			d1 := dst[(i+1)*n+j0+c0 : (i+1)*n+j0+c1]
			d2 := dst[(i+2)*n+j0+c0 : (i+2)*n+j0+c1]
			d3 := dst[(i+3)*n+j0+c0 : (i+3)*n+j0+c1]
			if start {
				clear(d0)
				clear(d1)
				clear(d2)
				clear(d3)
			}
			a0, a1, a2, a3 := rowA(i)[l0:l1], rowA(i + 1)[l0:l1], rowA(i + 2)[l0:l1], rowA(i + 3)[l0:l1]
			a1, a2, a3 = a1[:len(a0)], a2[:len(a0)], a3[:len(a0)]
			for l, x0 := range a0 {
				x1, x2, x3 := a1[l], a2[l], a3[l]
				row := panel[l*w+c0 : l*w+c1]
				d0, d1, d2, d3 = d0[:len(row)], d1[:len(row)], d2[:len(row)], d3[:len(row)]
				for j, y := range row {
					d0[j] += x0 * y
					d1[j] += x1 * y
					d2[j] += x2 * y
					d3[j] += x3 * y
				}
			}
		}
		for ; i < m; i++ {
			d := dst[i*n+j0+c0 : i*n+j0+c1]
			if start {
				clear(d)
			}
			for l, x := range rowA(i)[l0:l1] {
				row := panel[l*w+c0 : l*w+c1]
				d = d[:len(row)]
				for j, y := range row {
					d[j] += x * y
				}
			}
		}
	}
}
