package kernels

import (
	"fmt"
	"math"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/f32mem"
)

// The transformer-decode kernels: what a GPT-2 step needs besides its GEMMs
// (package models/gpt2, workload gpt2-decode, docs/WRITING-A-STEP.md).
// float32 data, row-major; token ids and positions are int32 arrays in
// device memory, read by the kernels, so that a step graph does not change
// with them.
//
// # KV caches
//
// Each sequence owns its KV cache, laid out position-major: position t of
// layer l holds the layer's keys then its values for that position, 2·d
// floats, at
//
//	cache + (t·layers + l)·2·d    (keys; values d floats further)
//
// so that the address of a position does not depend on how many positions
// the cache holds: a cache sized to its sequence's need and one of the
// model's whole context have the same layout, and one graph serves both. A
// kernel gets each cache's start, the model's layer count and the layer
// it works on; a cache of npos positions is npos·layers·2·d floats, which
// is what a launch may touch through each cache argument. Within a row the
// heads lie one after another (head h at columns h·headDim..(h+1)·headDim-1),
// as the query and the attention output do.
//
// KVAppend and DecodeAttention serve up to MaxSeqsPerLaunch rows in one
// launch. Their caches are separate typed pointer arguments (c0..c7),
// never an array of pointers in device memory: a runtime that moves buffers
// between steps can patch a kernel's pointer arguments but not pointers
// stored in data. A batch of B rows takes ceil(B/8) launches of each per
// layer; the rows of a launch are rows 0..nseq-1 of its q, qkv, positions
// and out arguments, and the cache arguments from nseq on are ignored (pass
// any valid pointer, e.g. c0 again). Several rows may name one cache (a
// prompt's tokens, each at its own position): KVAppend writes every row's
// keys and values before DecodeAttention, a later launch, reads them, so
// row t attends to positions 0..positions[t] of what the rows before it
// wrote (causal attention over a prompt).
//
// # Inactive rows
//
// A row whose position is InactiveRow (-1) holds no sequence: Embed and
// DecodeAttention write zeros to its output and KVAppend leaves every cache
// alone, so its cache argument may point anywhere valid, and no attention
// work is done for it. A fixed-row step serves a varying number of
// sequences this way (package models/gpt2, Batcher).
//
// # Bad input
//
// A token id outside [0, vocab) or a position outside [0, npos) other than
// InactiveRow cannot be reported by device code. The CUDA kernels then
// write NaN to the row's output (Embed, DecodeAttention) and leave the
// cache alone (KVAppend); the Go references fail the launch with
// gpu.ErrInvalidValue naming the row, as the sim's checked memory would
// fault on the out-of-range access.
const (
	// Embed is (y, wte, wpe, tokens, positions, rows, d, vocab, npos):
	// y[r,c] = wte[tokens[r],c] + wpe[positions[r],c], zeros for an
	// inactive row (its token is not read). Launch Elementwise(rows*d).
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
	// KVAppend is (q, qkv, bias, positions, c0..c7, nseq, d, layers, layer,
	// npos): for each row i < nseq, with qkv's row i = [q | k | v] (3d
	// columns) and bias the 3d biases, q[i] = qkv_q + bias_q, and
	// k + bias_k, v + bias_v are written at position positions[i] of layer
	// layer of cache ci (keys at ci + (positions[i]·layers + layer)·2·d,
	// values d floats further; see KV caches); nothing is written to the
	// cache of an inactive row. Launch Elementwise(nseq*d).
	KVAppend = "sg_kv_append"
	// DecodeAttention is (out, q, positions, c0..c7, nseq, heads, headDim,
	// layers, layer, npos, scale f32): for each row i < nseq and head h,
	// one query q[i] over the first positions[i]+1 keys and values of
	// layer layer of cache ci: s_t = scale·q·k_t, p = softmax(s),
	// out[i] = Σ_t p_t·v_t; zeros for an inactive row, whose cache is not
	// read. npos bounds the positions and sizes the shared memory. Launch
	// DecodeAttentionConfig.
	DecodeAttention = "sg_decode_attention"
	// Argmax is (next, top, logits, rows, vocab): for each row r, next[r]
	// (int32) is the index of the largest of logits[r, 0..vocab-1], the
	// lowest such index on a tie (torch.argmax's rule), and top[r] holds
	// that logit and the second largest (2 floats: the gap says how near a
	// tie greedy decoding was). NaN logits are skipped; a row of NaNs gives
	// index 0. Launch ArgmaxConfig(rows).
	Argmax = "sg_argmax"
)

// InactiveRow is the position that marks a row holding no sequence (see
// Inactive rows).
const InactiveRow = -1

// ArgmaxBlock is the block size of Argmax: one block per row.
const ArgmaxBlock = 256

// ArgmaxConfig is the launch of Argmax over rows rows.
func ArgmaxConfig(rows int) gpu.LaunchConfig {
	return gpu.LaunchConfig{Grid: gpu.Dim3{X: uint32(max(rows, 1)), Y: 1, Z: 1}, Block: gpu.Dim3{X: ArgmaxBlock, Y: 1, Z: 1}}
}

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
		{Name: KVAppend, Params: append(append([]gpu.ArgKind{p, p, p, p}, caches...), i32, i32, i32, i32, i32), Ref: refKVAppend},
		{Name: DecodeAttention, Params: append(append([]gpu.ArgKind{p, p, p}, caches...), i32, i32, i32, i32, i32, i32, f32), Ref: refDecodeAttention},
		{Name: Argmax, Params: []gpu.ArgKind{p, p, p, i32, i32}, Ref: refArgmax},
		{Name: Sample, Params: []gpu.ArgKind{p, p, p, p, p, i32, i32, i32}, Ref: refSample},
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
		if pos[r] == InactiveRow {
			continue // zeros
		}
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

// checkPositions fails for a position outside [0, npos) other than
// InactiveRow.
func checkPositions(name string, pos []int32, npos int) error {
	for i, ps := range pos {
		if ps != InactiveRow && (ps < 0 || int(ps) >= npos) {
			return fmt.Errorf("kernel %s: row %d: position %d outside the cache's [0, %d): %w", name, i, ps, npos, gpu.ErrInvalidValue)
		}
	}
	return nil
}

// checkLayer fails for a layer outside [0, layers), and returns the
// offset of the layer's keys at position 0 and the stride between
// positions, in floats.
func checkLayer(name string, layers, layer, d int) (off, stride int, err error) {
	if layers <= 0 || layer < 0 || layer >= layers {
		return 0, 0, fmt.Errorf("kernel %s: layer %d outside [0, %d): %w", name, layer, layers, gpu.ErrInvalidValue)
	}
	return layer * 2 * d, layers * 2 * d, nil
}

func refKVAppend(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
	nseq, d, layers, layer, npos := int(a[12].AsI32()), int(a[13].AsI32()), int(a[14].AsI32()), int(a[15].AsI32()), int(a[16].AsI32())
	caches, err := seqCaches(KVAppend, a, 4, nseq)
	if err != nil {
		return err
	}
	if err := positive(KVAppend, size{"d", d}, size{"npos", npos}); err != nil {
		return err
	}
	off, stride, err := checkLayer(KVAppend, layers, layer, d)
	if err != nil {
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
	kv := make([]float32, 2*d)
	for i := range nseq {
		row := qkv[i*3*d : (i+1)*3*d]
		for c := range d {
			q[i*d+c] = row[c] + bias[c]
			kv[c] = row[d+c] + bias[d+c]
			kv[d+c] = row[2*d+c] + bias[2*d+c]
		}
		if pos[i] == InactiveRow {
			continue
		}
		if err := f32mem.Write(mem, caches[i].Add(4*(uint64(pos[i])*uint64(stride)+uint64(off))), kv); err != nil {
			return err
		}
	}
	return f32mem.Write(mem, a[0].AsPtr(), q)
}

// refDecodeAttention computes scores, softmax and the weighted sum in
// float64 and rounds each output once to float32.
func refDecodeAttention(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
	nseq, heads, hd := int(a[11].AsI32()), int(a[12].AsI32()), int(a[13].AsI32())
	layers, layer, npos := int(a[14].AsI32()), int(a[15].AsI32()), int(a[16].AsI32())
	scale := float64(a[17].AsF32())
	caches, err := seqCaches(DecodeAttention, a, 3, nseq)
	if err != nil {
		return err
	}
	if err := positive(DecodeAttention, size{"heads", heads}, size{"headDim", hd}, size{"npos", npos}); err != nil {
		return err
	}
	d := heads * hd
	off, stride, err := checkLayer(DecodeAttention, layers, layer, d)
	if err != nil {
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
	// Each position's keys and values of the layer lie side by side
	// (2·d floats); kv holds a sequence's positions, one such row each.
	kv := f32mem.Get(npos * 2 * d)
	defer kv.Put()
	for i := range nseq {
		if pos[i] == InactiveRow {
			continue // zeros, and the cache is not read
		}
		n := int(pos[i]) + 1
		for t := range n {
			if err := f32mem.ReadInto(mem, caches[i].Add(4*(uint64(t)*uint64(stride)+uint64(off))), kv.V[t*2*d:(t+1)*2*d]); err != nil {
				return err
			}
		}
		for h := range heads {
			qh := q[i*d+h*hd : i*d+(h+1)*hd]
			m := math.Inf(-1)
			for t := range n {
				k := kv.V[t*2*d+h*hd : t*2*d+(h+1)*hd]
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
				v := kv.V[t*2*d+d+h*hd : t*2*d+d+(h+1)*hd]
				v = v[:len(acc)]
				for j := range acc {
					acc[j] += st * float64(v[j])
				}
			}
			for j, v := range acc {
				out[i*d+h*hd+j] = float32(v / sum)
			}
		}
	}
	return f32mem.Write(mem, a[0].AsPtr(), out)
}

// refArgmax scans each row in index order, keeping the first maximum.
func refArgmax(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
	rows, vocab := int(a[3].AsI32()), int(a[4].AsI32())
	if err := positive(Argmax, size{"rows", rows}, size{"vocab", vocab}); err != nil {
		return err
	}
	if err := checkRowBlocks(Argmax, cfg, rows, 1); err != nil {
		return err
	}
	if bx := cfg.Block.X; bx&(bx-1) != 0 {
		// The CUDA kernel halves the block in its reduction.
		return fmt.Errorf("kernel %s: block of %d threads is not a power of two: %w", Argmax, bx, gpu.ErrInvalidValue)
	}
	lb, err := f32mem.Read(mem, a[2].AsPtr(), rows*vocab)
	if err != nil {
		return err
	}
	defer lb.Put()
	logits := lb.V
	next := make([]int32, rows)
	top := make([]float32, 2*rows)
	for r := range rows {
		best, b1, b2 := 0, float32(math.Inf(-1)), float32(math.Inf(-1))
		for j, v := range logits[r*vocab : (r+1)*vocab] {
			switch {
			case v != v: // NaN
			case v > b1:
				best, b1, b2 = j, v, b1
			case v > b2:
				b2 = v
			}
		}
		next[r], top[2*r], top[2*r+1] = int32(best), b1, b2
	}
	if err := mem.Write(a[0].AsPtr(), i32Bytes(next)); err != nil {
		return err
	}
	return f32mem.Write(mem, a[1].AsPtr(), top)
}

func i32Bytes(v []int32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(x), byte(x>>8), byte(x>>16), byte(x>>24)
	}
	return b
}
