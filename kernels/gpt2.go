package kernels

import (
	"fmt"
	"math"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/f32mem"
)

// The transformer-decode kernels: what a GPT-2 decode step needs besides its
// GEMMs (workload gpt2-decode, docs/WRITING-A-STEP.md). float32 data,
// row-major; token ids and positions are int32 arrays in device memory, read
// by the kernels, so that a step graph does not change with them.
//
// # KV caches
//
// Each sequence owns its KV cache; a kernel sees one layer of it, a block
// of 2·npos·d floats: the keys of positions 0..npos-1 (npos rows of d), then
// their values (npos rows of d). Within a row the heads lie one after
// another (head h at columns h·headDim..(h+1)·headDim-1), as the query and
// the attention output do. A cache holding every layer of a model is the
// layers' blocks one after another (see package workload).
//
// KVAppend and DecodeAttention serve up to MaxSeqsPerLaunch sequences in
// one launch. Their caches are separate typed pointer arguments (c0..c7),
// never an array of pointers in device memory: a runtime that moves buffers
// between steps can patch a kernel's pointer arguments but not pointers
// stored in data. A batch of B sequences takes ceil(B/8) launches of each
// per layer; the sequences of a launch are rows 0..nseq-1 of its q, qkv,
// positions and out arguments, and the cache arguments from nseq on are
// ignored (pass any valid pointer, e.g. c0 again).
//
// # Bad input
//
// A token id outside [0, vocab) or a position outside [0, npos) cannot be
// reported by device code. The CUDA kernels then write NaN to the row's
// output (Embed, DecodeAttention) and leave the cache alone (KVAppend); the
// Go references fail the launch with gpu.ErrInvalidValue naming the row,
// as the sim's checked memory would fault on the out-of-range access.
const (
	// Embed is (y, wte, wpe, tokens, positions, rows, d, vocab, npos):
	// y[r,c] = wte[tokens[r],c] + wpe[positions[r],c]. Launch
	// Elementwise(rows*d).
	Embed = "sg_embed"
	// LayerNorm is (y, x, gamma, beta, rows, cols, eps f32): per row,
	// y = (x - mean)/sqrt(var + eps)·gamma + beta with the biased variance.
	// Launch LayerNormConfig(rows). y may be x.
	LayerNorm = "sg_layernorm"
	// BiasGelu is (y, x, bias, rows, cols): y[r,c] = gelu(x[r,c] + bias[c]),
	// GELU in its tanh form 0.5·v·(1 + tanh(√(2/π)·(v + 0.044715·v³))).
	// Launch Elementwise(rows*cols).
	BiasGelu = "sg_bias_gelu"
	// BiasResidual is (x, a, bias, rows, cols): x[r,c] += a[r,c] + bias[c],
	// in place (the residual stream of a transformer block). Launch
	// Elementwise(rows*cols).
	BiasResidual = "sg_bias_residual"
	// KVAppend is (q, qkv, bias, positions, c0..c7, nseq, d, npos): for each
	// sequence i < nseq, with qkv's row i = [q | k | v] (3d columns) and
	// bias the 3d biases, q[i] = qkv_q + bias_q, and k + bias_k, v + bias_v
	// are written at row positions[i] of cache ci's keys and values (a
	// layer block, see KV caches). Launch Elementwise(nseq*d).
	KVAppend = "sg_kv_append"
	// DecodeAttention is (out, q, positions, c0..c7, nseq, heads, headDim,
	// npos, scale f32): for each sequence i < nseq and head h, one query
	// q[i] over the first positions[i]+1 keys and values of cache ci:
	// s_t = scale·q·k_t, p = softmax(s), out[i] = Σ_t p_t·v_t. Launch
	// DecodeAttentionConfig.
	DecodeAttention = "sg_decode_attention"
)

// MaxSeqsPerLaunch is how many sequences (caches) one KVAppend or
// DecodeAttention launch serves.
const MaxSeqsPerLaunch = 8

// LayerNormBlock and AttentionBlock are the block sizes of the row
// kernels: one block per row (LayerNorm) or per sequence and head
// (DecodeAttention). Any multiple of 32 up to 1024 works; these are what
// the launch helpers use.
const (
	LayerNormBlock = 256
	AttentionBlock = 256
)

// maxShared is the dynamic shared memory a launch may use without opting
// in per kernel (CUDA's default limit, 48 KiB): DecodeAttention's scores
// take 4 bytes per cache position, so caches of about 12000 positions fit.
const maxShared = 48 << 10

// GELU's constant √(2/π), written out so that the CUDA source and the Go
// reference use the same double.
const geluC = 0.7978845608028654

// LayerNormConfig is the launch of LayerNorm over rows rows.
func LayerNormConfig(rows int) gpu.LaunchConfig {
	return gpu.LaunchConfig{Grid: gpu.Dim3{X: uint32(max(rows, 1)), Y: 1, Z: 1}, Block: gpu.Dim3{X: LayerNormBlock, Y: 1, Z: 1}}
}

// DecodeAttentionConfig is the launch of DecodeAttention: a block per head
// and sequence, with the dynamic shared memory the kernel needs for a
// cache of npos positions.
func DecodeAttentionConfig(nseq, heads, headDim, npos int) gpu.LaunchConfig {
	return gpu.LaunchConfig{
		Grid:      gpu.Dim3{X: uint32(max(heads, 1)), Y: uint32(max(nseq, 1)), Z: 1},
		Block:     gpu.Dim3{X: AttentionBlock, Y: 1, Z: 1},
		SharedMem: attentionShared(AttentionBlock, headDim, npos),
	}
}

// attentionShared is the dynamic shared memory of a DecodeAttention block
// of block threads: the query (headDim), the scores (npos), the partial
// sums of the weighted sum (max(block, headDim)) and 32 floats of
// reduction scratch, as kernels.cu lays them out.
func attentionShared(block, headDim, npos int) uint32 {
	return uint32(4 * (headDim + npos + max(block, headDim) + 32))
}

func gpt2Specs() []gpu.KernelSpec {
	caches := []gpu.ArgKind{p, p, p, p, p, p, p, p}
	return []gpu.KernelSpec{
		{Name: Embed, Params: []gpu.ArgKind{p, p, p, p, p, i32, i32, i32, i32}, Ref: refEmbed},
		{Name: LayerNorm, Params: []gpu.ArgKind{p, p, p, p, i32, i32, f32}, Ref: refLayerNorm},
		{Name: BiasGelu, Params: []gpu.ArgKind{p, p, p, i32, i32}, Ref: bias(gelu32)},
		{Name: BiasResidual, Params: []gpu.ArgKind{p, p, p, i32, i32}, Ref: refBiasResidual},
		{Name: KVAppend, Params: append(append([]gpu.ArgKind{p, p, p, p}, caches...), i32, i32, i32), Ref: refKVAppend},
		{Name: DecodeAttention, Params: append(append([]gpu.ArgKind{p, p, p}, caches...), i32, i32, i32, i32, f32), Ref: refDecodeAttention},
	}
}

// Gelu is the tanh form of GELU computed in float64, as BiasGelu's
// reference and CUDA kernel compute it before rounding to float32.
func Gelu(v float64) float64 {
	return 0.5 * v * (1 + math.Tanh(geluC*(v+0.044715*v*v*v)))
}

func gelu32(x float32) float32 { return float32(Gelu(float64(x))) }

// readI32 reads n int32 values from p.
func readI32(mem gpu.Memory, ptr gpu.DevicePtr, n int) ([]int32, error) {
	b := make([]byte, 4*n)
	if err := mem.Read(ptr, b); err != nil {
		return nil, err
	}
	v := make([]int32, n)
	for i := range v {
		v[i] = int32(uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24)
	}
	return v, nil
}

// size is a named size argument, for positive.
type size struct {
	name string
	v    int
}

// positive checks that every size is positive.
func positive(kernel string, sizes ...size) error {
	for _, s := range sizes {
		if s.v <= 0 {
			return fmt.Errorf("kernel %s: %s = %d is not positive: %w", kernel, s.name, s.v, gpu.ErrInvalidValue)
		}
	}
	return nil
}

func refEmbed(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
	rows, d, vocab, npos := int(a[5].AsI32()), int(a[6].AsI32()), int(a[7].AsI32()), int(a[8].AsI32())
	if err := positive(Embed, size{"rows", rows}, size{"d", d}, size{"vocab", vocab}, size{"npos", npos}); err != nil {
		return err
	}
	if err := need(cfg, rows*d, Embed); err != nil {
		return err
	}
	toks, err := readI32(mem, a[3].AsPtr(), rows)
	if err != nil {
		return err
	}
	pos, err := readI32(mem, a[4].AsPtr(), rows)
	if err != nil {
		return err
	}
	y := make([]float32, rows*d)
	te, pe := f32mem.Get(d), f32mem.Get(d)
	defer te.Put()
	defer pe.Put()
	for r := range rows {
		if toks[r] < 0 || int(toks[r]) >= vocab {
			return fmt.Errorf("kernel %s: row %d: token id %d outside [0, %d): %w", Embed, r, toks[r], vocab, gpu.ErrInvalidValue)
		}
		if pos[r] < 0 || int(pos[r]) >= npos {
			return fmt.Errorf("kernel %s: row %d: position %d outside [0, %d): %w", Embed, r, pos[r], npos, gpu.ErrInvalidValue)
		}
		if err := f32mem.ReadInto(mem, a[1].AsPtr().Add(uint64(toks[r])*uint64(4*d)), te.V); err != nil {
			return err
		}
		if err := f32mem.ReadInto(mem, a[2].AsPtr().Add(uint64(pos[r])*uint64(4*d)), pe.V); err != nil {
			return err
		}
		yr := y[r*d : (r+1)*d]
		for c, v := range te.V {
			yr[c] = v + pe.V[c]
		}
	}
	return f32mem.Write(mem, a[0].AsPtr(), y)
}

// checkRowBlocks checks a launch of one block per row (or per row and
// head): at least gx × gy blocks of a whole number of warps.
func checkRowBlocks(name string, cfg gpu.LaunchConfig, gx, gy int) error {
	bx := cfg.Block.X
	if bx < 32 || bx > 1024 || bx%32 != 0 || cfg.Block.Y != 1 || cfg.Block.Z != 1 {
		return fmt.Errorf("kernel %s: block %v is not one dimension of whole warps (32 to 1024 threads): %w", name, cfg.Block, gpu.ErrInvalidValue)
	}
	if uint64(cfg.Grid.X) < uint64(gx) || uint64(cfg.Grid.Y) < uint64(gy) {
		return fmt.Errorf("kernel %s: grid %v does not cover %d×%d blocks: %w", name, cfg.Grid, gx, gy, gpu.ErrInvalidValue)
	}
	return nil
}

// refLayerNorm computes each row's mean and variance and the result in
// float64, rounding once to float32.
func refLayerNorm(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
	rows, cols, eps := int(a[4].AsI32()), int(a[5].AsI32()), float64(a[6].AsF32())
	if err := positive(LayerNorm, size{"rows", rows}, size{"cols", cols}); err != nil {
		return err
	}
	if !(eps >= 0) {
		return fmt.Errorf("kernel %s: eps %g is negative or NaN: %w", LayerNorm, eps, gpu.ErrInvalidValue)
	}
	if err := checkRowBlocks(LayerNorm, cfg, rows, 1); err != nil {
		return err
	}
	xBuf, err := f32mem.Read(mem, a[1].AsPtr(), rows*cols)
	if err != nil {
		return err
	}
	defer xBuf.Put()
	x := xBuf.V
	gBuf, err := f32mem.Read(mem, a[2].AsPtr(), cols)
	if err != nil {
		return err
	}
	defer gBuf.Put()
	g := gBuf.V
	bBuf, err := f32mem.Read(mem, a[3].AsPtr(), cols)
	if err != nil {
		return err
	}
	defer bBuf.Put()
	b := bBuf.V
	y := make([]float32, rows*cols)
	for r := range rows {
		row := x[r*cols : (r+1)*cols]
		var mean, v float64
		for _, e := range row {
			mean += float64(e)
		}
		mean /= float64(cols)
		for _, e := range row {
			dv := float64(e) - mean
			v += dv * dv
		}
		rstd := 1 / math.Sqrt(v/float64(cols)+eps)
		for c, e := range row {
			y[r*cols+c] = float32((float64(e)-mean)*rstd*float64(g[c]) + float64(b[c]))
		}
	}
	return f32mem.Write(mem, a[0].AsPtr(), y)
}

// refBiasResidual is x += a + bias, summed as x + (a + bias) in float32,
// the CUDA kernel's order.
func refBiasResidual(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
	rows, cols := int(a[3].AsI32()), int(a[4].AsI32())
	if rows < 0 || cols < 0 {
		return fmt.Errorf("kernel %s: negative shape %dx%d: %w", BiasResidual, rows, cols, gpu.ErrInvalidValue)
	}
	if err := need(cfg, rows*cols, BiasResidual); err != nil {
		return err
	}
	xBuf, err := f32mem.Read(mem, a[0].AsPtr(), rows*cols)
	if err != nil {
		return err
	}
	defer xBuf.Put()
	x := xBuf.V
	avBuf, err := f32mem.Read(mem, a[1].AsPtr(), rows*cols)
	if err != nil {
		return err
	}
	defer avBuf.Put()
	av := avBuf.V
	bvBuf, err := f32mem.Read(mem, a[2].AsPtr(), cols)
	if err != nil {
		return err
	}
	defer bvBuf.Put()
	bv := bvBuf.V
	for i := range x {
		x[i] += av[i] + bv[i%cols]
	}
	return f32mem.Write(mem, a[0].AsPtr(), x)
}

// seqCaches returns the first nseq cache pointers of a launch whose cache
// arguments start at a[first], checking nseq.
func seqCaches(name string, a []gpu.Arg, first, nseq int) ([]gpu.DevicePtr, error) {
	if nseq < 1 || nseq > MaxSeqsPerLaunch {
		return nil, fmt.Errorf("kernel %s: nseq = %d is not 1 to %d: %w", name, nseq, MaxSeqsPerLaunch, gpu.ErrInvalidValue)
	}
	c := make([]gpu.DevicePtr, nseq)
	for i := range c {
		c[i] = a[first+i].AsPtr()
	}
	return c, nil
}

// checkPositions fails for a position outside [0, npos).
func checkPositions(name string, pos []int32, npos int) error {
	for i, ps := range pos {
		if ps < 0 || int(ps) >= npos {
			return fmt.Errorf("kernel %s: sequence %d: position %d outside the cache's [0, %d): %w", name, i, ps, npos, gpu.ErrInvalidValue)
		}
	}
	return nil
}

func refKVAppend(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
	nseq, d, npos := int(a[12].AsI32()), int(a[13].AsI32()), int(a[14].AsI32())
	caches, err := seqCaches(KVAppend, a, 4, nseq)
	if err != nil {
		return err
	}
	if err := positive(KVAppend, size{"d", d}, size{"npos", npos}); err != nil {
		return err
	}
	if err := need(cfg, nseq*d, KVAppend); err != nil {
		return err
	}
	qkvBuf, err := f32mem.Read(mem, a[1].AsPtr(), nseq*3*d)
	if err != nil {
		return err
	}
	defer qkvBuf.Put()
	qkv := qkvBuf.V
	biasBuf, err := f32mem.Read(mem, a[2].AsPtr(), 3*d)
	if err != nil {
		return err
	}
	defer biasBuf.Put()
	bias := biasBuf.V
	pos, err := readI32(mem, a[3].AsPtr(), nseq)
	if err != nil {
		return err
	}
	if err := checkPositions(KVAppend, pos, npos); err != nil {
		return err
	}
	q := make([]float32, nseq*d)
	k, v := make([]float32, d), make([]float32, d)
	for i := range nseq {
		row := qkv[i*3*d : (i+1)*3*d]
		for c := range d {
			q[i*d+c] = row[c] + bias[c]
			k[c] = row[d+c] + bias[d+c]
			v[c] = row[2*d+c] + bias[2*d+c]
		}
		row4 := uint64(4 * d)
		if err := f32mem.Write(mem, caches[i].Add(uint64(pos[i])*row4), k); err != nil {
			return err
		}
		if err := f32mem.Write(mem, caches[i].Add(uint64(npos+int(pos[i]))*row4), v); err != nil {
			return err
		}
	}
	return f32mem.Write(mem, a[0].AsPtr(), q)
}

// refDecodeAttention computes scores, softmax and the weighted sum in
// float64 and rounds each output once to float32.
func refDecodeAttention(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
	nseq, heads, hd, npos := int(a[11].AsI32()), int(a[12].AsI32()), int(a[13].AsI32()), int(a[14].AsI32())
	scale := float64(a[15].AsF32())
	caches, err := seqCaches(DecodeAttention, a, 3, nseq)
	if err != nil {
		return err
	}
	if err := positive(DecodeAttention, size{"heads", heads}, size{"headDim", hd}, size{"npos", npos}); err != nil {
		return err
	}
	if err := checkRowBlocks(DecodeAttention, cfg, heads, nseq); err != nil {
		return err
	}
	switch want := attentionShared(int(cfg.Block.X), hd, npos); {
	case want > maxShared:
		return fmt.Errorf("kernel %s: %d positions of head dim %d need %d bytes of shared memory, more than the %d a launch gets: %w", DecodeAttention, npos, hd, want, maxShared, gpu.ErrInvalidValue)
	case cfg.SharedMem < want:
		return fmt.Errorf("kernel %s: %d bytes of shared memory, the kernel needs %d for %d positions: %w", DecodeAttention, cfg.SharedMem, want, npos, gpu.ErrInvalidValue)
	}
	d := heads * hd
	qBuf, err := f32mem.Read(mem, a[1].AsPtr(), nseq*d)
	if err != nil {
		return err
	}
	defer qBuf.Put()
	q := qBuf.V
	pos, err := readI32(mem, a[2].AsPtr(), nseq)
	if err != nil {
		return err
	}
	if err := checkPositions(DecodeAttention, pos, npos); err != nil {
		return err
	}
	out := make([]float32, nseq*d)
	s := make([]float64, npos)
	acc := make([]float64, hd)
	for i := range nseq {
		n := int(pos[i]) + 1
		keys, err := f32mem.Read(mem, caches[i], n*d)
		if err != nil {
			return err
		}
		vals, err := f32mem.Read(mem, caches[i].Add(uint64(4*npos*d)), n*d)
		if err != nil {
			keys.Put()
			return err
		}
		for h := range heads {
			qh := q[i*d+h*hd : i*d+(h+1)*hd]
			m := math.Inf(-1)
			for t := range n {
				k := keys.V[t*d+h*hd : t*d+(h+1)*hd]
				k = k[:len(qh)]
				var dot float64
				for j, qv := range qh {
					dot += float64(qv) * float64(k[j])
				}
				s[t] = scale * dot
				m = max(m, s[t])
			}
			var sum float64
			for t := range n {
				s[t] = math.Exp(s[t] - m)
				sum += s[t]
			}
			clear(acc)
			for t, st := range s[:n] {
				v := vals.V[t*d+h*hd : t*d+(h+1)*hd]
				v = v[:len(acc)]
				for j := range acc {
					acc[j] += st * float64(v[j])
				}
			}
			for j, v := range acc {
				out[i*d+h*hd+j] = float32(v / sum)
			}
		}
		keys.Put()
		vals.Put()
	}
	return f32mem.Write(mem, a[0].AsPtr(), out)
}
