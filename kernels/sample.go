package kernels

import (
	"cmp"
	le "encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
)

// Sampling on the device (package models/gpt2 uses it; docs/GENERATE.md
// has the design). Sample reads each row's logits where they are and
// writes a few bytes a row, so that a sampling decoder does not copy
// rows×vocab floats back every step:
//
//   - a draw: one token sampled from softmax(logits/T) by the Gumbel-max
//     trick, argmax_j logits[j]/T + G_j, where G_j is standard Gumbel noise
//     from a counter-based generator keyed by (seed, sequence, token index,
//     j) (GumbelNoise). The noise of a token depends on nothing else, so
//     the draw does not depend on the batch, the row or the launch; and
//     the argmax of the same scores over any subset S of the vocabulary is
//     an exact draw from the softmax renormalised over S, which is how the
//     host finishes top-k and top-p from the candidates, or from a whole
//     row of logits, with the same noise and the same result.
//   - candidates: the row's kmax largest logits (ids and values, largest
//     first, the lower id first on a tie; NaNs last), its largest logit
//     and Z = Σ_j exp((logits[j] − max)/T), from which the host knows each
//     candidate's probability and whether the candidates hold a top-k set
//     or a nucleus (top-p) whole.
//
// The noise is computed with + − × ÷ in float64 only (gumbelLog), in the
// same order in the CUDA kernel and here, so the device's draws equal the
// reference's and the host's bit for bit; only Z, a sum whose order
// differs, is not bitwise the same.
const (
	// Sample is (draw, cand, stats, logits, params, rows, vocab, kmax):
	// for each row r with p = params[r] (SampleParamBytes, SampleParams):
	//
	//   - draw[r] (int32): with SampleDraw in p.Flags, the token
	//     argmax_j s_j with s_j = logits[r,j]/p.Temperature +
	//     GumbelNoise(p.Seed, p.Seq, p.Index, j) in float64, NaN scores
	//     skipped, the lowest j on a tie, 0 when every score is NaN; a
	//     temperature that is not positive takes the largest logit instead
	//     (Argmax's rule, the limit T → 0). −1 without the flag.
	//   - cand[r] (kmax pairs of an int32 id and a float32 logit, 8 bytes
	//     each): with SampleCandidates, the min(kmax, vocab) entries of
	//     largest SampleKey, largest first, the slots past vocab id −1 and
	//     −Inf; without the flag every slot id −1 and −Inf.
	//   - stats[r] (2 float64): with SampleCandidates, the largest logit m
	//     (NaNs skipped; −Inf when none) and Z = Σ_j exp((logits[r,j] −
	//     m)/T) over the logits that are not NaN, with T = p.Temperature,
	//     or 1 when that is not positive; (−Inf, 0) without the flag.
	//
	// Launch SampleConfig(rows); kmax is 1 to SampleMaxK.
	Sample = "sg_sample"
)

// Flags of SampleParams.
const (
	// SampleDraw asks for the row's draw.
	SampleDraw uint32 = 1 << iota
	// SampleCandidates asks for the row's candidates and stats.
	SampleCandidates
)

// SampleParamBytes is the size of one row's SampleParams in device memory:
// the seed (uint64), the sequence and the token index (uint32 each), the
// temperature (float64), the flags (uint32) and 4 bytes of zero, little
// endian.
const SampleParamBytes = 32

// SampleMaxK is the most candidates Sample returns a row; SampleBlock its
// block size (one block per row).
const (
	SampleMaxK  = 256
	SampleBlock = 512
)

// SampleConfig is the launch of Sample over rows rows.
func SampleConfig(rows int) gpu.LaunchConfig {
	return gpu.LaunchConfig{Grid: gpu.Dim3{X: uint32(max(rows, 1)), Y: 1, Z: 1}, Block: gpu.Dim3{X: SampleBlock, Y: 1, Z: 1}}
}

// SampleParams is one row's sampling parameters (Sample).
type SampleParams struct {
	Seed        uint64
	Seq, Index  uint32
	Temperature float64
	Flags       uint32
}

// Put writes p into b[:SampleParamBytes].
func (p SampleParams) Put(b []byte) {
	_ = b[SampleParamBytes-1]
	le.LittleEndian.PutUint64(b[0:], p.Seed)
	le.LittleEndian.PutUint32(b[8:], p.Seq)
	le.LittleEndian.PutUint32(b[12:], p.Index)
	le.LittleEndian.PutUint64(b[16:], math.Float64bits(p.Temperature))
	le.LittleEndian.PutUint32(b[24:], p.Flags)
	le.LittleEndian.PutUint32(b[28:], 0)
}

// ReadSampleParams reads the SampleParams at b[:SampleParamBytes].
func ReadSampleParams(b []byte) SampleParams {
	_ = b[SampleParamBytes-1]
	return SampleParams{
		Seed: le.LittleEndian.Uint64(b[0:]), Seq: le.LittleEndian.Uint32(b[8:]), Index: le.LittleEndian.Uint32(b[12:]),
		Temperature: math.Float64frombits(le.LittleEndian.Uint64(b[16:])), Flags: le.LittleEndian.Uint32(b[24:]),
	}
}

// Philox4x32 is the Philox4x32-10 block function of Salmon et al. (2011,
// "Parallel random numbers: as easy as 1, 2, 3"): ten rounds over the
// counter with the key bumped between rounds. TestPhiloxKnownAnswers
// checks Random123's published answers.
func Philox4x32(ctr [4]uint32, key [2]uint32) [4]uint32 {
	const (
		m0, m1 = 0xD2511F53, 0xCD9E8D57
		w0, w1 = 0x9E3779B9, 0xBB67AE85
	)
	c, k0, k1 := ctr, key[0], key[1]
	for i := range 10 {
		if i > 0 {
			k0 += w0
			k1 += w1
		}
		p0, p1 := uint64(m0)*uint64(c[0]), uint64(m1)*uint64(c[2])
		c = [4]uint32{uint32(p1>>32) ^ c[1] ^ k0, uint32(p1), uint32(p0>>32) ^ c[3] ^ k1, uint32(p0)}
	}
	return c
}

// GumbelUniform is the uniform variate behind the noise of token id of
// draw (seed, seq, index): Philox4x32 of the counter (id/2, index, seq, 0)
// under the key (low, high word of seed) gives 128 bits, of which an even
// id takes words 0 (low) and 1 (high), an odd id words 2 and 3; their top
// 52 bits b make u = (b + ½)·2⁻⁵², strictly inside (0, 1).
func GumbelUniform(seed uint64, seq, index, id uint32) float64 {
	x := Philox4x32([4]uint32{id >> 1, index, seq, 0}, [2]uint32{uint32(seed), uint32(seed >> 32)})
	lo, hi := x[0], x[1]
	if id&1 != 0 {
		lo, hi = x[2], x[3]
	}
	bits := uint64(hi)<<32 | uint64(lo)
	return math.Ldexp(float64(bits>>12)+0.5, -52)
}

// GumbelNoise is −log(−log(u)) of GumbelUniform, computed by gumbelLog:
// standard Gumbel noise, between about −3.6 and 36.7.
func GumbelNoise(seed uint64, seq, index, id uint32) float64 {
	return -gumbelLog(-gumbelLog(GumbelUniform(seed, seq, index, id)))
}

// gumbelLog is the natural logarithm of a positive, finite, normal x,
// written with + − × ÷ alone (each product and sum rounded on its own, as
// the CUDA kernel's __dmul_rn and __dadd_rn do), so that the device and
// the host compute it bit for bit alike: x = 2^k·m with m in [√½, √2),
// s = (m−1)/(m+1), log m = 2·atanh s = 2s·Σ_{i<12} s^{2i}/(2i+1), and
// k·ln 2 added in two parts. |s| ≤ 0.1716, so the series' tail is below
// 2⁻⁶⁰ of the result: the error is a few units in the last place.
func gumbelLog(x float64) float64 {
	const (
		ln2Hi = 6.93147180369123816490e-01 // ln 2 to 32 bits: k·ln2Hi is exact
		ln2Lo = 1.90821492927058770002e-10 // ln 2 − ln2Hi
	)
	b := math.Float64bits(x)
	k := int64(b>>52&0x7ff) - 1023
	m := math.Float64frombits(b&(1<<52-1) | 1023<<52) // [1, 2)
	if m > math.Sqrt2 {
		m = float64(m * 0.5)
		k++
	}
	s := float64(m-1) / float64(m+1)
	s2 := float64(s * s)
	p := gumbelSeries[len(gumbelSeries)-1]
	for i := len(gumbelSeries) - 2; i >= 0; i-- {
		p = float64(float64(p*s2) + gumbelSeries[i])
	}
	kf := float64(k)
	return float64(float64(kf*ln2Hi) + float64(float64(float64(2*s)*p)+float64(kf*ln2Lo)))
}

// gumbelSeries are 1/(2i+1) for i < 12, each the double nearest (the
// CUDA source lists the same values).
var gumbelSeries = func() [12]float64 {
	var c [12]float64
	for i := range c {
		c[i] = 1 / float64(2*i+1)
	}
	return c
}()

// SampleKey orders a row's logits for Sample's candidates: larger value
// first, then the lower id; NaN below every number. The high word is the
// float's bits made to sort as unsigned integers, the low word ^id.
func SampleKey(v float32, id int) uint64 {
	b := math.Float32bits(v)
	switch {
	case v != v:
		b = 0
	case b&(1<<31) != 0:
		b = ^b
	default:
		b |= 1 << 31
	}
	return uint64(b)<<32 | uint64(^uint32(id))
}

// SampleScore is the Gumbel-max score of a logit v at temperature t with
// noise g: v/t + g in float64.
func SampleScore(v float32, t, g float64) float64 {
	return float64(float64(v)/t) + g
}

// refSample draws, and selects candidates by sorting SampleKey.
func refSample(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
	rows, vocab, kmax := int(a[5].AsI32()), int(a[6].AsI32()), int(a[7].AsI32())
	if err := positive(Sample, size{"rows", rows}, size{"vocab", vocab}); err != nil {
		return err
	}
	if kmax < 1 || kmax > SampleMaxK {
		return fmt.Errorf("kernel %s: kmax = %d is not 1 to %d: %w", Sample, kmax, SampleMaxK, gpu.ErrInvalidValue)
	}
	if err := checkRowBlocks(Sample, cfg, rows, 1); err != nil {
		return err
	}
	if bx := cfg.Block.X; bx&(bx-1) != 0 {
		return fmt.Errorf("kernel %s: block of %d threads is not a power of two: %w", Sample, bx, gpu.ErrInvalidValue)
	}
	logits, err := gpu.ReadF32(mem, a[3].AsPtr(), rows*vocab)
	if err != nil {
		return err
	}
	raw := make([]byte, rows*SampleParamBytes)
	if err := mem.Read(a[4].AsPtr(), raw); err != nil {
		return err
	}
	draw := make([]int32, rows)
	cand := make([]byte, 8*rows*kmax)
	stats := make([]byte, 16*rows)
	keys := make([]uint64, 0, vocab)
	for r := range rows {
		p := ReadSampleParams(raw[r*SampleParamBytes:])
		row := logits[r*vocab : (r+1)*vocab]
		draw[r] = -1
		if p.Flags&SampleDraw != 0 {
			draw[r] = SampleDrawRow(row, p)
		}
		c := cand[8*r*kmax : 8*(r+1)*kmax]
		for i := range kmax {
			le.LittleEndian.PutUint32(c[8*i:], math.MaxUint32) // −1
			le.LittleEndian.PutUint32(c[8*i+4:], math.Float32bits(float32(math.Inf(-1))))
		}
		m, z := math.Inf(-1), 0.0
		if p.Flags&SampleCandidates != 0 {
			keys = keys[:0]
			for j, v := range row {
				keys = append(keys, SampleKey(v, j))
			}
			slices.SortFunc(keys, func(x, y uint64) int { return cmp.Compare(y, x) })
			for i := range min(kmax, vocab) {
				id := ^uint32(keys[i])
				le.LittleEndian.PutUint32(c[8*i:], id)
				le.LittleEndian.PutUint32(c[8*i+4:], math.Float32bits(row[id]))
			}
			m, z = SampleStats(row, p.Temperature)
		}
		le.LittleEndian.PutUint64(stats[16*r:], math.Float64bits(m))
		le.LittleEndian.PutUint64(stats[16*r+8:], math.Float64bits(z))
	}
	if err := mem.Write(a[0].AsPtr(), i32Bytes(draw)); err != nil {
		return err
	}
	if err := mem.Write(a[1].AsPtr(), cand); err != nil {
		return err
	}
	return mem.Write(a[2].AsPtr(), stats)
}

// SampleDrawRow is Sample's draw over one row of logits.
func SampleDrawRow(row []float32, p SampleParams) int32 {
	t := p.Temperature
	best, bs := -1, 0.0
	for j, v := range row {
		var s float64
		if t > 0 {
			s = SampleScore(v, t, GumbelNoise(p.Seed, p.Seq, p.Index, uint32(j)))
		} else {
			s = float64(v)
		}
		if s != s {
			continue
		}
		if best < 0 || s > bs {
			best, bs = j, s
		}
	}
	return int32(max(best, 0))
}

// SampleStats is Sample's stats of one row: the largest logit m that is
// not NaN (−Inf when none) and Σ exp((v − m)/t) over the logits v that
// are not NaN, t taken as 1 when not positive; summed in float64, in index
// order (the kernel's order differs: Z agrees to rounding, not bitwise).
func SampleStats(row []float32, t float64) (m, z float64) {
	if !(t > 0) {
		t = 1
	}
	m = math.Inf(-1)
	for _, v := range row {
		if v == v {
			m = max(m, float64(v))
		}
	}
	if math.IsInf(m, -1) {
		return m, 0
	}
	for _, v := range row {
		if v == v {
			z += math.Exp((float64(v) - m) / t)
		}
	}
	return m, z
}
