package gputest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

// Cases of the transformer-decode kernels (kernels/gpt2.go). Kernels whose
// arithmetic is plain float32 adds are compared with the reference bit for
// bit; GELU (tanh in double, which the device's libm and Go's may round
// differently) within f32Tol; the reductions (layer norm, attention), whose
// order differs between device and reference, against a float64 computation
// of their own within an error bound.

func i32Buf(v []int32) kbuf {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return kbuf{init: b}
}

func exactOut(v []float32) kbuf {
	b := out(v)
	b.exact = true
	return b
}

// cacheArgs are the eight cache arguments of a launch over the n caches at
// p[first:first+n]: the unused ones repeat the first cache.
func cacheArgs(p []gpu.DevicePtr, first, n int) []gpu.Arg {
	a := make([]gpu.Arg, kernels.MaxSeqsPerLaunch)
	for i := range a {
		a[i] = gpu.Ptr(p[first])
		if i < n {
			a[i] = gpu.Ptr(p[first+i])
		}
	}
	return a
}

// randPositions are n positions in [0, npos), the last position of the
// cache and the first among them, and with three rows or more an inactive
// one.
func randPositions(r *rand.Rand, n, npos int) []int32 {
	pos := make([]int32, n)
	for i := range pos {
		pos[i] = int32(r.IntN(npos))
	}
	pos[0] = int32(npos - 1)
	if n > 1 {
		pos[1] = 0
	}
	if n > 2 {
		pos[2] = kernels.InactiveRow
	}
	return pos
}

// kvLayers is a random position-major layout (kernels/gpt2.go, KV caches)
// for caches of d columns: the model's layers, the layer a launch sees and
// the stride between positions, in floats.
func kvLayers(r *rand.Rand, d int) (layers, layer, stride int) {
	layers = 1 + r.IntN(3)
	return layers, r.IntN(layers), layers * 2 * d
}

func gpt2KernelCases() []kernelCase {
	cases := []kernelCase{
		{name: kernels.Embed, kernel: kernels.Embed, make: func(r *rand.Rand) kernelInst {
			rows, d, vocab, npos := 1+r.IntN(12), notMultiple(1+r.IntN(100), 16), 2+r.IntN(50), 1+r.IntN(40)
			toks, pos := make([]int32, rows), make([]int32, rows)
			for i := range toks {
				toks[i], pos[i] = int32(r.IntN(vocab)), int32(r.IntN(npos))
			}
			toks[0], pos[0] = int32(vocab-1), int32(npos-1)
			if rows > 1 {
				toks[1], pos[1] = int32(vocab+7), kernels.InactiveRow // zeros: the token is not read
			}
			return kernelInst{
				bufs: []kbuf{exactOut(randF32(r, rows*d)), in(randF32(r, vocab*d)), in(randF32(r, npos*d)), i32Buf(toks), i32Buf(pos)},
				args: func(p []gpu.DevicePtr) []gpu.Arg {
					return append(ptrs(p), gpu.I32(int32(rows)), gpu.I32(int32(d)), gpu.I32(int32(vocab)), gpu.I32(int32(npos)))
				},
				cfg: kernels.Elementwise(rows * d),
			}
		}},
		{name: kernels.LayerNorm, kernel: kernels.LayerNorm, make: makeLayerNorm},
		biasCase(kernels.BiasGelu),
		{name: kernels.BiasResidual, kernel: kernels.BiasResidual, make: func(r *rand.Rand) kernelInst {
			rows, cols := 1+r.IntN(40), notMultiple(1+r.IntN(100), 16)
			return kernelInst{
				bufs: []kbuf{exactOut(randF32(r, rows*cols)), in(randF32(r, rows*cols)), in(randF32(r, cols))},
				args: func(p []gpu.DevicePtr) []gpu.Arg {
					return append(ptrs(p), gpu.I32(int32(rows)), gpu.I32(int32(cols)))
				},
				cfg: kernels.Elementwise(rows * cols),
			}
		}},
	}
	cases = append(cases, kernelCase{name: kernels.Argmax, kernel: kernels.Argmax, make: makeArgmax},
		kernelCase{name: kernels.Sample, kernel: kernels.Sample, make: func(r *rand.Rand) kernelInst {
			return makeSample(r, 1+r.IntN(5), []int{1, 5, 70, 300, 1000, 3001}[r.IntN(6)], []int{1, 7, 64, kernels.SampleMaxK}[r.IntN(4)])
		}},
		// GPT-2's vocabulary and the Batcher's candidates.
		kernelCase{name: kernels.Sample + "_gpt2", kernel: kernels.Sample, make: func(r *rand.Rand) kernelInst {
			return makeSample(r, 4, 50257, 64)
		}})
	for _, nseq := range []int{1, 3, kernels.MaxSeqsPerLaunch} {
		cases = append(cases,
			kernelCase{name: fmt.Sprintf("%s_%dseq", kernels.KVAppend, nseq), kernel: kernels.KVAppend,
				make: func(r *rand.Rand) kernelInst { return makeKVAppend(r, nseq) }},
			kernelCase{name: fmt.Sprintf("%s_%dseq", kernels.DecodeAttention, nseq), kernel: kernels.DecodeAttention,
				make: func(r *rand.Rand) kernelInst { return makeDecodeAttention(r, nseq) }})
	}
	return cases
}

func makeLayerNorm(r *rand.Rand) kernelInst {
	rows, cols := 1+r.IntN(20), notMultiple(1+r.IntN(900), 16)
	const eps = 1e-5
	x := randF32(r, rows*cols)
	for i := range x { // an offset per row: the mean matters
		x[i] += float32(i / cols)
	}
	g, b := randF32(r, cols), randF32(r, cols)
	return kernelInst{
		bufs: []kbuf{out(randF32(r, rows*cols)), in(x), in(g), in(b)},
		args: func(p []gpu.DevicePtr) []gpu.Arg {
			return append(ptrs(p), gpu.I32(int32(rows)), gpu.I32(int32(cols)), gpu.F32(eps))
		},
		cfg: kernels.LayerNormConfig(rows),
		check: func(h *h, in, ref, got [][]byte) {
			want, bound := make([]float64, rows*cols), make([]float64, rows*cols)
			for rr := range rows {
				row := x[rr*cols : (rr+1)*cols]
				var mean, v float64
				for _, e := range row {
					mean += float64(e)
				}
				mean /= float64(cols)
				for _, e := range row {
					v += (float64(e) - mean) * (float64(e) - mean)
				}
				rstd := 1 / math.Sqrt(v/float64(cols)+eps)
				for c, e := range row {
					n := (float64(e) - mean) * rstd
					i := rr*cols + c
					want[i] = n*float64(g[c]) + float64(b[c])
					// float32 sums over cols elements: mean and variance
					// off by about cols·u relative, carried through rstd.
					bound[i] = 4*float64(cols+8)*unitRoundoff*(math.Abs(n)+1)*math.Abs(float64(g[c])) + 4*unitRoundoff*(math.Abs(want[i])+math.Abs(float64(b[c])))
				}
			}
			h.within("reference", gpu.BytesToF32(ref[0]), want, bound)
			h.within("backend", gpu.BytesToF32(got[0]), want, bound)
		},
	}
}

// kvShape is a random cache shape for the cache kernels: heads×headDim
// columns, npos positions.
func kvShape(r *rand.Rand) (heads, hd, npos int) {
	return 1 + r.IntN(4), []int{1, 8, 16, 33, 64}[r.IntN(5)], 1 + r.IntN(300)
}

func makeKVAppend(r *rand.Rand, nseq int) kernelInst {
	heads, hd, npos := kvShape(r)
	d := heads * hd
	layers, layer, stride := kvLayers(r, d)
	pos := randPositions(r, nseq, npos)
	bufs := []kbuf{exactOut(randF32(r, nseq*d)), in(randF32(r, nseq*3*d)), in(randF32(r, 3*d)), i32Buf(pos)}
	for range nseq {
		bufs = append(bufs, exactOut(randF32(r, npos*stride)))
	}
	return kernelInst{
		bufs: bufs,
		args: func(p []gpu.DevicePtr) []gpu.Arg {
			a := append(ptrs(p[:4]), cacheArgs(p, 4, nseq)...)
			return append(a, gpu.I32(int32(nseq)), gpu.I32(int32(d)), gpu.I32(int32(layers)), gpu.I32(int32(layer)), gpu.I32(int32(npos)))
		},
		cfg: kernels.Elementwise(nseq * d),
	}
}

func makeDecodeAttention(r *rand.Rand, nseq int) kernelInst {
	heads, hd, npos := kvShape(r)
	// A head dimension of 1 makes the scale 1, and a single position makes
	// every softmax 1 whatever the scale: either would hide a kernel that
	// ignores it.
	hd, npos = max(hd, 2), max(npos, 2)
	d := heads * hd
	layers, layer, stride := kvLayers(r, d)
	pos := randPositions(r, nseq, npos)
	q := randF32(r, nseq*d)
	scale := float32(1 / math.Sqrt(float64(hd)))
	caches := make([][]float32, nseq)
	bufs := []kbuf{out(randF32(r, nseq*d)), in(q), i32Buf(pos)}
	for i := range caches {
		caches[i] = randF32(r, npos*stride)
		bufs = append(bufs, in(caches[i]))
	}
	return kernelInst{
		bufs: bufs,
		args: func(p []gpu.DevicePtr) []gpu.Arg {
			a := append(ptrs(p[:3]), cacheArgs(p, 3, nseq)...)
			return append(a, gpu.I32(int32(nseq)), gpu.I32(int32(heads)), gpu.I32(int32(hd)), gpu.I32(int32(layers)), gpu.I32(int32(layer)), gpu.I32(int32(npos)), gpu.F32(scale))
		},
		cfg: kernels.DecodeAttentionConfig(nseq, heads, hd, npos),
		check: func(h *h, in, ref, got [][]byte) {
			h.Logf("attention nseq=%d heads=%d headDim=%d npos=%d positions=%v", nseq, heads, hd, npos, pos)
			want, bound := make([]float64, nseq*d), make([]float64, nseq*d)
			for i := range nseq {
				if pos[i] == kernels.InactiveRow {
					continue // zeros, exactly
				}
				n := int(pos[i]) + 1
				keys, vals := make([]float32, n*d), make([]float32, n*d)
				for t := range n {
					row := caches[i][t*stride+layer*2*d:]
					copy(keys[t*d:], row[:d])
					copy(vals[t*d:], row[d:2*d])
				}
				for hh := range heads {
					s := make([]float64, n)
					m, maxDs := math.Inf(-1), 0.0
					for t := range s {
						var abs float64
						for j := range hd {
							qk := float64(q[i*d+hh*hd+j]) * float64(keys[t*d+hh*hd+j])
							s[t] += qk
							abs += math.Abs(qk)
						}
						s[t] *= float64(scale)
						m = max(m, s[t])
						maxDs = max(maxDs, float64(hd+8)*unitRoundoff*float64(scale)*abs)
					}
					var sum float64
					for t := range s {
						s[t] = math.Exp(s[t] - m)
						sum += s[t]
					}
					for j := range hd {
						var acc, abs float64
						for t := range s {
							v := float64(vals[t*d+hh*hd+j])
							acc += s[t] * v
							abs += s[t] * math.Abs(v)
						}
						k := i*d + hh*hd + j
						want[k] = acc / sum
						// A float32 score is off by at most maxDs, which
						// scales its softmax weight by about 1 ± 2·maxDs;
						// exp, the sums and the division add (n+8)·u.
						bound[k] = (4*maxDs+4*float64(n+8)*unitRoundoff)*abs/sum + 1e-7
					}
				}
			}
			h.within("reference", gpu.BytesToF32(ref[0]), want, bound)
			h.within("backend", gpu.BytesToF32(got[0]), want, bound)
		},
	}
}

// makeArgmax: rows of random logits, one with its maximum twice (the lower
// index wins) and one with NaNs, compared with the reference bit for bit.
func makeArgmax(r *rand.Rand) kernelInst {
	rows, vocab := 1+r.IntN(6), 1+r.IntN(3000)
	x := randF32(r, rows*vocab)
	if vocab > 2 {
		x[vocab-1], x[1] = 9, 9
		if rows > 1 {
			x[vocab] = float32(math.NaN())
		}
	}
	return kernelInst{
		bufs: []kbuf{{init: make([]byte, 4*rows), out: true, exact: true}, exactOut(randF32(r, 2*rows)), in(x)},
		args: func(p []gpu.DevicePtr) []gpu.Arg {
			return append(ptrs(p), gpu.I32(int32(rows)), gpu.I32(int32(vocab)))
		},
		cfg: kernels.ArgmaxConfig(rows),
	}
}

// makeSample: rows of random logits with NaNs, −Infs and ties; row 0
// draws at a positive temperature, row 1 draws at temperature 0 (the
// argmax, its maximum at two indices far apart: the lower wins) and gives
// candidates, row 2 does neither, the rest at random. The draws and the
// candidates must equal the reference's bit for bit (the noise is computed
// alike, kernels/sample.go); Z, a sum in another order, within 1e-12.
func makeSample(r *rand.Rand, rows, vocab, kmax int) kernelInst {
	x := randF32(r, rows*vocab)
	for i := range x {
		switch r.IntN(50) {
		case 0:
			x[i] = float32(math.NaN())
		case 1:
			x[i] = float32(math.Inf(-1))
		case 2:
			x[i] = 1.25
		}
	}
	params := make([]byte, rows*kernels.SampleParamBytes)
	for q := range rows {
		p := kernels.SampleParams{Seed: r.Uint64(), Seq: r.Uint32(), Index: r.Uint32(),
			Temperature: []float64{0.3, 0.8, 1, 2.5}[r.IntN(4)], Flags: uint32(r.IntN(4))}
		switch q {
		case 0:
			p.Flags = kernels.SampleDraw
		case 1:
			p.Temperature, p.Flags = 0, kernels.SampleDraw|kernels.SampleCandidates
			if vocab > 2 {
				x[vocab+1], x[2*vocab-1] = 9, 9
			}
		case 2:
			p.Flags = 0
		}
		p.Put(params[q*kernels.SampleParamBytes:])
	}
	return kernelInst{
		bufs: []kbuf{{init: make([]byte, 4*rows), out: true}, {init: make([]byte, 8*rows*kmax), out: true},
			{init: make([]byte, 16*rows), out: true}, in(x), {init: params}},
		args: func(p []gpu.DevicePtr) []gpu.Arg {
			return append(ptrs(p), gpu.I32(int32(rows)), gpu.I32(int32(vocab)), gpu.I32(int32(kmax)))
		},
		cfg: kernels.SampleConfig(rows),
		check: func(h *h, in, ref, got [][]byte) {
			h.Logf("sample rows=%d vocab=%d kmax=%d", rows, vocab, kmax)
			if !bytes.Equal(got[0], ref[0]) {
				h.Errorf("draws %v, reference %v", i32s(got[0]), i32s(ref[0]))
			}
			for i := 0; i < len(ref[1]); i += 8 {
				if !bytes.Equal(got[1][i:i+8], ref[1][i:i+8]) {
					h.Errorf("candidate %d of row %d: %x, reference %x", i/8%kmax, i/8/kmax, got[1][i:i+8], ref[1][i:i+8])
					break
				}
			}
			for i := 0; i < len(ref[2]); i += 8 {
				g := math.Float64frombits(binary.LittleEndian.Uint64(got[2][i:]))
				w := math.Float64frombits(binary.LittleEndian.Uint64(ref[2][i:]))
				if !(g == w || math.Abs(g-w) <= 1e-12*math.Abs(w)) {
					h.Errorf("stats[%d] of row %d = %v, reference %v", i/8%2, i/16, g, w)
				}
			}
		},
	}
}

func i32s(b []byte) []int32 {
	v := make([]int32, len(b)/4)
	for i := range v {
		v[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}
