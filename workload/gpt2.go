package workload

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/safetensors"
	"github.com/stablegraph/stablegraph/models/gpt2"
)

// gpt2-decode: one decode step of GPT-2 over a batch of sequences, each with
// its own KV cache owned by the caller (docs/WORKLOADS.md has the step;
// docs/WRITING-A-STEP.md walks through how it is written).
//
// The step is package models/gpt2's decode step (gpt2.Step with a cache
// param per row and the logits as output): one builder serves this
// workload and `stablegraph generate`.
//
// # KV caches
//
// Every sequence's cache is one caller buffer holding all layers' keys and
// values for Positions positions, float32, position-major
// (kernels/gpt2.go, KV caches):
//
//	cache[position][layer][k or v][column]   (Positions × layers × 2 × d)
//
// column = head·headDim + j. The program has one cache param per batch row
// (kv0, kv1, …), declared whole (so that every strategy, the copying ones
// included, can run it), bound every step to the cache of the sequence in
// that row: which sequence that is, and where its cache lies, is the
// caller's business (Caller, pattern swap). The inputs below number a
// cache's elements in the order [layer][k or v][position][column] (their
// logical index, which the PyTorch peer computes the same way), whatever
// the layout.
//
// # Tensor parallelism
//
// With a communicator of N > 1 ranks (Config.Comm: --nproc N, torchrun),
// each rank runs its part of the model (gpt2.Shard{Rank, N}: heads/N heads
// and 4d/N MLP columns, sliced from the whole model's weights, and an
// all-reduce after each of a block's two projections, inside the step; the
// embeddings, layer norms and LM head whole on every rank). A rank's caches
// hold its heads' columns only, rank r's being columns [r·d/N, (r+1)·d/N)
// of the whole model's caches at the same logical indices, so that the N
// ranks together hold the single-rank caches and every rank's logits equal
// the single-rank step's within float32 reassociation. The heads must
// divide by N.

// gpt2Shape is the model and batch of a gpt2-decode workload.
type gpt2Shape struct {
	layers, d, heads, vocab, npos, batch int
	// pos is the base decode position: sequence s decodes at
	// max(0, pos - s%4), so sequences of one batch differ in length.
	pos int
}

// The GPT-2 small default and the tiny CI config.
var (
	gpt2Small = gpt2Shape{layers: 12, d: 768, heads: 12, vocab: 50257, npos: 1024, batch: 8, pos: 128}
	gpt2Tiny  = gpt2Shape{layers: 2, d: 64, heads: 4, vocab: 256, npos: 64, batch: 4, pos: 16}
)

// gpt2Eps is GPT-2's layer-norm epsilon.
const gpt2Eps = 1e-5

func (s gpt2Shape) headDim() int { return s.d / s.heads }

// cacheFloats is the size of one sequence's whole cache in floats.
func (s gpt2Shape) cacheFloats() int64 { return int64(s.npos) * int64(s.config().Stride()) }

// cacheFloats is the size of one sequence's cache on this rank in floats:
// its shard's heads.
func (m *gpt2Model) cacheFloats() int64 {
	return int64(m.shape.npos) * int64(m.shard.Stride(m.shape.config()))
}

// seqPos is the position sequence seq decodes at.
func (s gpt2Shape) seqPos(seq int) int { return max(0, s.pos-seq%4) }

func (s gpt2Shape) String() string {
	return fmt.Sprintf("layers=%d d=%d heads=%d vocab=%d positions=%d pos=%d batch=%d",
		s.layers, s.d, s.heads, s.vocab, s.npos, s.pos, s.batch)
}

// gpt2Limits bound the shape so that every size fits the kernels' int32
// arguments and the attention's shared memory.
func (s gpt2Shape) check() error {
	switch {
	case s.layers > 96 || s.d > 8192 || s.heads > s.d || s.vocab > 1<<20 || s.npos > 8192 || s.batch > 1024:
		return fmt.Errorf("shape %s too large (at most 96 layers, d 8192, vocab 2^20, 8192 positions, batch 1024)", s)
	case s.d%s.heads != 0:
		return fmt.Errorf("d=%d is not a multiple of heads=%d", s.d, s.heads)
	case s.pos >= s.npos:
		return fmt.Errorf("decode position %d is outside the cache's %d positions", s.pos, s.npos)
	}
	return nil
}

func gpt2Config(c Config, base gpt2Shape) (gpt2Shape, error) {
	s := base
	for _, f := range []struct {
		dst *int
		v   int
	}{{&s.layers, c.Layers}, {&s.d, c.Width}, {&s.batch, c.Batch}, {&s.heads, c.Heads}, {&s.vocab, c.Vocab}, {&s.npos, c.Positions}} {
		if f.v != 0 {
			*f.dst = f.v
		}
	}
	if c.Pos != 0 {
		s.pos = c.Pos
	}
	return s, s.check()
}

// gpt2Model is what the caller of a gpt2-decode workload needs beyond its
// buffers: the shape, the seed of the inputs, and the per-sequence params.
type gpt2Model struct {
	shape gpt2Shape
	// shard is the rank's part of the model: the whole model without a
	// communicator of several ranks.
	shard             gpt2.Shard
	seed              uint64
	tokens, positions sg.Buffer
	caches            []sg.Buffer // per batch row
}

func gpt2Decode(name string, base gpt2Shape) func(Config) (*Workload, error) {
	return func(c Config) (*Workload, error) {
		s, err := gpt2Config(c, base)
		if err != nil {
			return nil, fmt.Errorf("workload %s: %w", name, err)
		}
		var shard gpt2.Shard
		if c.Comm != nil && c.Comm.Size() > 1 {
			shard = gpt2.Shard{Rank: c.Comm.Rank(), Ranks: c.Comm.Size()}
			if err := shard.Check(s.config()); err != nil {
				return nil, fmt.Errorf("workload %s: tensor parallel over %d ranks: %w", name, shard.Ranks, err)
			}
		}
		weights, from, err := gpt2Weights(s, c.Seed, c.Weights, shard)
		if err != nil {
			return nil, fmt.Errorf("workload %s: %w", name, err)
		}
		st := gpt2.Step{Config: s.config(), Rows: s.batch, Shard: shard}
		if !shard.Whole() {
			st.Comm = c.Comm
		}
		step, err := st.Build(name)
		if err != nil {
			return nil, fmt.Errorf("workload %s: %w", name, err)
		}
		p := step.Program
		desc := fmt.Sprintf("%s (%s, weights %s", name, s, from)
		if !shard.Whole() {
			desc += fmt.Sprintf(", tensor-parallel rank %d of %d: %d heads, %d MLP columns", shard.Rank, shard.Ranks,
				shard.Heads(s.config()), shard.Inner(s.config()))
		}
		wl := &Workload{Name: name, Desc: desc + ")", Program: p, Comm: st.Comm}
		m := &gpt2Model{shape: s, shard: shard, seed: c.Seed, tokens: step.Tokens, positions: step.Positions, caches: step.Caches}
		wl.gpt2 = m
		wl.Params = append([]sg.Buffer{m.tokens, m.positions}, m.caches...)
		wl.Outputs = []sg.Buffer{step.Logits}
		for i, t := range weights {
			wl.States = append(wl.States, StateInit{step.Weights[i], t.Data})
		}
		return wl, nil
	}
}

// config is the model shape of s.
func (s gpt2Shape) config() gpt2.Config {
	return gpt2.Config{Layers: s.layers, Width: s.d, Heads: s.heads, Vocab: s.vocab, Positions: s.npos, Eps: gpt2Eps}
}

// ---------------------------------------------------------------- inputs

// The inputs are made by a 32-bit integer hash, so that the PyTorch peer
// (bench/peers/gpt2.py) computes the same cache contents with numpy.

// mix32 is Chris Wellons' lowbias32 integer hash.
func mix32(x uint32) uint32 {
	x ^= x >> 16
	x *= 0x7feb352d
	x ^= x >> 15
	x *= 0x846ca68b
	x ^= x >> 16
	return x
}

// gpt2Key is the hash of element idx of sequence seq's data under seed.
func gpt2Key(seed uint64, seq, idx uint32) uint32 {
	return mix32(mix32(mix32(uint32(seed))^seq) + idx)
}

// tokenIdx is the idx of a step's token in gpt2Key (cache indices stay below).
const tokenIdx = 1 << 31

// token is the token sequence seq decodes at step.
func (m *gpt2Model) token(step, seq int) int32 {
	return int32(gpt2Key(m.seed, uint32(seq), tokenIdx|uint32(step)&(tokenIdx-1)) % uint32(m.shape.vocab))
}

// cacheValue is element idx of sequence seq's initial cache: the top 24
// bits of its key as a float32 in [-0.5, 0.5), exactly.
func cacheValue(seed uint64, seq, idx uint32) float32 {
	return float32(int32(gpt2Key(seed, seq, idx)>>8)-1<<23) / (1 << 24)
}

// initialCache is sequence seq's cache before its first step: positions
// 0..seqPos(seq)-1 of every layer's keys and values hold cacheValue (a
// prefix the sequence has "seen"), the rest is zero.
func (m *gpt2Model) initialCache(seq int) []byte {
	out := make([]byte, 4*m.cacheFloats())
	for _, blk := range m.prefixBlocks(seq) {
		copy(out[4*blk.off:], blk.data)
	}
	return out
}

// cacheBlock is a run of a cache's initial contents, off floats into it.
type cacheBlock struct {
	off  int64
	data []byte
}

// prefixBlocks are the non-zero runs of sequence seq's initial cache: for
// each of its first seqPos(seq) positions, every layer's keys and values
// (one run per position, position-major). Element (l, kv, t, c) of the
// whole model's cache holds cacheValue of its logical index
// ((l·2 + kv)·Positions + t)·d + c; a tensor-parallel rank's cache holds
// its columns c of that, at its own stride.
func (m *gpt2Model) prefixBlocks(seq int) []cacheBlock {
	s := m.shape
	d, dl := int64(s.d), int64(m.shard.Width(s.config()))
	c0, stride := int64(m.shard.Rank)*dl, int64(m.shard.Stride(s.config()))
	var blks []cacheBlock
	for t := range int64(s.seqPos(seq)) {
		v := make([]float32, stride)
		for lk := range int64(2 * s.layers) {
			logical := (lk*int64(s.npos)+t)*d + c0
			for c := range dl {
				v[lk*dl+c] = cacheValue(m.seed, uint32(seq), uint32(logical+c))
			}
		}
		blks = append(blks, cacheBlock{t * stride, gpu.F32ToBytes(v)})
	}
	return blks
}

// input is Workload.Input's param i at step with row r holding sequence r
// (the fixed pattern): tokens, positions, or the initial cache of row i-2.
func (m *gpt2Model) input(step, i int) []byte {
	switch rows := m.identityRows(); {
	case i == 0:
		return m.tokenBytes(step, rows)
	case i == 1:
		return m.positionBytes(rows)
	default:
		return m.initialCache(i - 2)
	}
}

func (m *gpt2Model) identityRows() []int {
	rows := make([]int, m.shape.batch)
	for i := range rows {
		rows[i] = i
	}
	return rows
}

func i32Bytes(v []int32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(x), byte(x>>8), byte(x>>16), byte(x>>24)
	}
	return b
}

// tokenBytes and positionBytes are the tokens and positions params of a
// step whose batch rows hold the sequences rows.
func (m *gpt2Model) tokenBytes(step int, rows []int) []byte {
	v := make([]int32, len(rows))
	for r, seq := range rows {
		v[r] = m.token(step, seq)
	}
	return i32Bytes(v)
}

func (m *gpt2Model) positionBytes(rows []int) []byte {
	v := make([]int32, len(rows))
	for r, seq := range rows {
		v[r] = int32(m.shape.seqPos(seq))
	}
	return i32Bytes(v)
}

// ---------------------------------------------------------------- weights

// gpt2Weights returns the weights in checkpoint order (gpt2.Specs) of
// shard and where they came from: read from the safetensors file at path
// when it exists, else generated from seed (gpt2.Generate; and written to
// path when path is set). The file holds the whole model, whatever the
// shard: a rank's part is sliced from it (gpt2.Weights.Shard).
func gpt2Weights(s gpt2Shape, seed uint64, path string, shard gpt2.Shard) ([]safetensors.Tensor, string, error) {
	ts, from, err := wholeGPT2Weights(s, seed, path)
	if err != nil || shard.Whole() {
		return ts, from, err
	}
	w := &gpt2.Weights{Config: s.config()}
	for _, t := range ts {
		w.Tensors = append(w.Tensors, gpt2.Tensor{Name: t.Name, Shape: t.Shape, Data: t.Data})
	}
	part, err := w.Shard(shard)
	if err != nil {
		return nil, "", err
	}
	out := make([]safetensors.Tensor, len(part.Tensors))
	for i, t := range part.Tensors {
		out[i] = safetensors.Tensor{Name: t.Name, DType: "F32", Shape: t.Shape, Data: t.Data}
	}
	return out, from, nil
}

// wholeGPT2Weights is gpt2Weights of the whole model.
func wholeGPT2Weights(s gpt2Shape, seed uint64, path string) ([]safetensors.Tensor, string, error) {
	specs, err := gpt2.Specs(s.config(), gpt2.Shard{})
	if err != nil {
		return nil, "", err
	}
	if path != "" {
		f, err := safetensors.Open(path)
		switch {
		case err == nil:
			ts, err := readGPT2Weights(f, specs)
			err = errors.Join(err, f.Close())
			if err != nil {
				return nil, "", fmt.Errorf("weights %s: %w", path, err)
			}
			return ts, "from " + path, nil
		case !errors.Is(err, fs.ErrNotExist):
			return nil, "", fmt.Errorf("weights: %w", err)
		}
	}
	w, err := gpt2.Generate(s.config(), seed)
	if err != nil {
		return nil, "", err
	}
	ts := make([]safetensors.Tensor, len(w.Tensors))
	for i, t := range w.Tensors {
		ts[i] = safetensors.Tensor{Name: t.Name, DType: "F32", Shape: t.Shape, Data: t.Data}
	}
	if path == "" {
		return ts, "generated from seed " + strconv.FormatUint(seed, 10), nil
	}
	meta := map[string]string{"format": "pt", "generator": "stablegraph workload gpt2-decode",
		"seed": strconv.FormatUint(seed, 10), "shape": s.String()}
	if err := safetensors.WriteFile(path, ts, meta); err != nil {
		return nil, "", fmt.Errorf("weights: %w", err)
	}
	return ts, fmt.Sprintf("generated from seed %d, written to %s", seed, path), nil
}

// readGPT2Weights reads every tensor of specs from f, checking dtype and
// shape; other tensors of f (a checkpoint's attention masks) are ignored.
func readGPT2Weights(f *safetensors.File, specs []gpt2.Spec) ([]safetensors.Tensor, error) {
	var ts []safetensors.Tensor
	for _, sp := range specs {
		in, ok := f.Info(sp.Name)
		switch {
		case !ok:
			return nil, fmt.Errorf("no tensor %q", sp.Name)
		case in.DType != "F32":
			return nil, fmt.Errorf("tensor %q is %s, the workload runs float32 (F32)", sp.Name, in.DType)
		case !slices.Equal(in.Shape, sp.Shape):
			return nil, fmt.Errorf("tensor %q has shape %s, the config needs %s", sp.Name,
				safetensors.ShapeString(in.Shape), safetensors.ShapeString(sp.Shape))
		}
		t, err := f.ReadTensor(sp.Name)
		if err != nil {
			return nil, err
		}
		ts = append(ts, t)
	}
	return ts, nil
}
