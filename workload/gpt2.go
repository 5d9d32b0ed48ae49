package workload

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/workload/internal/safetensors"
)

// gpt2-decode: one decode step of GPT-2 over a batch of sequences, each with
// its own KV cache owned by the caller (docs/WORKLOADS.md has the step;
// docs/WRITING-A-STEP.md walks through how it is written).
//
// # KV caches
//
// Every sequence's cache is one caller buffer holding all layers' keys and
// values, float32:
//
//	cache[layer][k or v][position][column]   (layers × 2 × Positions × d)
//
// column = head·headDim + j. The program has one cache param per batch row
// (kv0, kv1, …), bound every step to the cache of the sequence in that row:
// which sequence that is, and where its cache lies, is the caller's business
// (Caller, pattern swap). Each layer's block of 2·Positions·d floats is what
// kernels.KVAppend and kernels.DecodeAttention see.

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

// cacheFloats is the size of one sequence's cache in floats; layerFloats
// that of one layer's block.
func (s gpt2Shape) cacheFloats() int64 { return int64(s.layers) * s.layerFloats() }
func (s gpt2Shape) layerFloats() int64 { return 2 * int64(s.npos) * int64(s.d) }

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
	shape             gpt2Shape
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
		weights, from, err := gpt2Weights(s, c.Seed, c.Weights)
		if err != nil {
			return nil, fmt.Errorf("workload %s: %w", name, err)
		}
		p := sg.NewProgram(name)
		wl := &Workload{Name: name, Desc: fmt.Sprintf("%s (%s, weights %s)", name, s, from), Program: p}
		m := &gpt2Model{shape: s, seed: c.Seed}
		wl.gpt2 = m
		B := s.batch
		m.tokens = p.Param("tokens", 4*int64(B))
		m.positions = p.Param("positions", 4*int64(B))
		for r := range B {
			m.caches = append(m.caches, p.Param(fmt.Sprintf("kv%d", r), 4*s.cacheFloats()))
		}
		logits := p.Output("logits", f32Bytes(B*s.vocab))
		wl.Params = append([]sg.Buffer{m.tokens, m.positions}, m.caches...)
		wl.Outputs = []sg.Buffer{logits}

		st := map[string]sg.Buffer{}
		for _, t := range weights {
			b := p.State(t.Name, int64(len(t.Data)))
			st[t.Name] = b
			wl.States = append(wl.States, StateInit{b, t.Data})
		}
		m.build(p, st, logits)
		return wl, nil
	}
}

// build declares the step (docs/WORKLOADS.md, gpt2-decode): embedding, L
// pre-norm transformer blocks, final layer norm, tied LM head.
//
// Biases: the GEMMs have none here, so every bias is added by the kernel
// after its GEMM: q/k/v's by KVAppend, the attention and MLP projections'
// by BiasResidual, the MLP's first by BiasGelu. This function is the one
// place that knows it; with a GEMM bias, pass zeros to those kernels (or
// drop their bias arguments) here.
func (m *gpt2Model) build(p *sg.Program, st map[string]sg.Buffer, logits sg.Buffer) {
	s := m.shape
	B, d, hd := s.batch, s.d, s.headDim()
	rowsF32 := func(name string, cols int) sg.Buffer { return p.Temp(name, f32Bytes(B*cols)) }
	x, h := rowsF32("x", d), rowsF32("h", d)
	qkv, q, att, proj := rowsF32("qkv", 3*d), rowsF32("q", d), rowsF32("att", d), rowsF32("proj", d)
	fc, g := rowsF32("fc", 4*d), rowsF32("gelu", 4*d)
	i32 := func(v int) sg.Arg { return sg.I32(int32(v)) }
	w := func(name string) sg.Slice { return st[name].All() }
	layerNorm := func(out sg.Buffer, prefix string) {
		p.Launch(kernels.LayerNorm, kernels.LayerNormConfig(B), sg.Out(out.All()), sg.In(x.All()),
			sg.In(w(prefix+".weight")), sg.In(w(prefix+".bias")), i32(B), i32(d), sg.F32(gpt2Eps))
	}
	gemm := func(c, a sg.Buffer, b string, n, k int) {
		p.Gemm(c.All(), a.All(), w(b), sg.GEMM{M: B, N: n, K: k, Alpha: 1})
	}
	// rows is rows [r0, r0+n) of a buffer of B rows of cols elements of 4 bytes.
	rows := func(b sg.Buffer, r0, n, cols int) sg.Slice { return b.Slice(4*int64(r0*cols), 4*int64(n*cols)) }

	p.Launch(kernels.Embed, kernels.Elementwise(B*d), sg.Out(x.All()), sg.In(w("wte.weight")), sg.In(w("wpe.weight")),
		sg.In(m.tokens.All()), sg.In(m.positions.All()), i32(B), i32(d), i32(s.vocab), i32(s.npos))
	for l := range s.layers {
		pre := fmt.Sprintf("h.%d.", l)
		layerNorm(h, pre+"ln_1")
		gemm(qkv, h, pre+"attn.c_attn.weight", 3*d, d)
		// KV caches: ceil(B/8) launches each of append and attention, each
		// over up to eight caches' layer-l blocks.
		layer := func(r int) sg.Slice {
			return m.caches[r].Slice(4*int64(l)*s.layerFloats(), 4*s.layerFloats())
		}
		for r0 := 0; r0 < B; r0 += kernels.MaxSeqsPerLaunch {
			n := min(kernels.MaxSeqsPerLaunch, B-r0)
			args := []sg.Arg{sg.Out(rows(q, r0, n, d)), sg.In(rows(qkv, r0, n, 3*d)), sg.In(w(pre + "attn.c_attn.bias")), sg.In(rows(m.positions, r0, n, 1))}
			args = append(append(args, cacheArgs(layer, r0, n, sg.InOut)...), i32(n), i32(d), i32(s.npos))
			p.Launch(kernels.KVAppend, kernels.Elementwise(n*d), args...)
		}
		for r0 := 0; r0 < B; r0 += kernels.MaxSeqsPerLaunch {
			n := min(kernels.MaxSeqsPerLaunch, B-r0)
			args := []sg.Arg{sg.Out(rows(att, r0, n, d)), sg.In(rows(q, r0, n, d)), sg.In(rows(m.positions, r0, n, 1))}
			args = append(append(args, cacheArgs(layer, r0, n, sg.In)...),
				i32(n), i32(s.heads), i32(hd), i32(s.npos), sg.F32(float32(1/math.Sqrt(float64(hd)))))
			p.Launch(kernels.DecodeAttention, kernels.DecodeAttentionConfig(n, s.heads, hd, s.npos), args...)
		}
		gemm(proj, att, pre+"attn.c_proj.weight", d, d)
		p.Launch(kernels.BiasResidual, kernels.Elementwise(B*d), sg.InOut(x.All()), sg.In(proj.All()),
			sg.In(w(pre+"attn.c_proj.bias")), i32(B), i32(d))
		layerNorm(h, pre+"ln_2")
		gemm(fc, h, pre+"mlp.c_fc.weight", 4*d, d)
		p.Launch(kernels.BiasGelu, kernels.Elementwise(B*4*d), sg.Out(g.All()), sg.In(fc.All()),
			sg.In(w(pre+"mlp.c_fc.bias")), i32(B), i32(4*d))
		gemm(proj, g, pre+"mlp.c_proj.weight", d, 4*d)
		p.Launch(kernels.BiasResidual, kernels.Elementwise(B*d), sg.InOut(x.All()), sg.In(proj.All()),
			sg.In(w(pre+"mlp.c_proj.bias")), i32(B), i32(d))
	}
	layerNorm(h, "ln_f")
	// The LM head is the token embedding, transposed: logits = h · wteᵀ.
	p.Gemm(logits.All(), h.All(), w("wte.weight"), sg.GEMM{M: B, N: s.vocab, K: d, TransB: true, Alpha: 1})
}

// cacheArgs are the eight cache arguments of a launch over rows r0..r0+n-1:
// their layer blocks with access acc, then the first one again, read only,
// for the unused slots (the kernel ignores them).
func cacheArgs(layer func(r int) sg.Slice, r0, n int, acc func(sg.Slice) sg.Arg) []sg.Arg {
	a := make([]sg.Arg, kernels.MaxSeqsPerLaunch)
	for i := range a {
		if i < n {
			a[i] = acc(layer(r0 + i))
		} else {
			a[i] = sg.In(layer(r0))
		}
	}
	return a
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
	s := m.shape
	out := make([]byte, 4*s.cacheFloats())
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

// prefixBlocks are the non-zero runs of sequence seq's initial cache: the
// first seqPos(seq) rows of each layer's keys and of its values.
func (m *gpt2Model) prefixBlocks(seq int) []cacheBlock {
	s := m.shape
	n := int64(s.seqPos(seq)) * int64(s.d)
	var blks []cacheBlock
	for kv := range 2 * s.layers {
		off := int64(kv) * int64(s.npos) * int64(s.d)
		v := make([]float32, n)
		for i := range v {
			v[i] = cacheValue(m.seed, uint32(seq), uint32(off+int64(i)))
		}
		blks = append(blks, cacheBlock{off, gpu.F32ToBytes(v)})
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

// gpt2Tensor is one weight: its name and shape as in GPT-2's safetensors
// checkpoints, and how generated values are drawn.
type gpt2Tensor struct {
	name  string
	shape []int64
	// Generated values: center + uniform in [-spread, spread].
	center, spread float64
}

// gpt2Tensors lists the weights of shape s in checkpoint order. Matrices
// are stored [in, out], as GPT-2's Conv1D keeps them, so that x·W needs no
// transpose. Generated ones have GPT-2's initial scales: standard deviation
// 0.02 (0.02/√(2L) for the projections into the residual stream),
// uniform rather than normal.
func gpt2Tensors(s gpt2Shape) []gpt2Tensor {
	d, L := int64(s.d), s.layers
	u := math.Sqrt(3) // uniform spread of standard deviation 1
	std := 0.02 * u
	resid := 0.02 / math.Sqrt(2*float64(L)) * u
	ln := func(name string) []gpt2Tensor {
		return []gpt2Tensor{{name + ".weight", []int64{d}, 1, 0.1}, {name + ".bias", []int64{d}, 0, 0.02}}
	}
	ts := []gpt2Tensor{
		{"wte.weight", []int64{int64(s.vocab), d}, 0, std},
		{"wpe.weight", []int64{int64(s.npos), d}, 0, 0.01 * u},
	}
	for l := range L {
		pre := fmt.Sprintf("h.%d.", l)
		ts = append(ts, ln(pre+"ln_1")...)
		ts = append(ts,
			gpt2Tensor{pre + "attn.c_attn.weight", []int64{d, 3 * d}, 0, std},
			gpt2Tensor{pre + "attn.c_attn.bias", []int64{3 * d}, 0, 0.02},
			gpt2Tensor{pre + "attn.c_proj.weight", []int64{d, d}, 0, resid},
			gpt2Tensor{pre + "attn.c_proj.bias", []int64{d}, 0, 0.02})
		ts = append(ts, ln(pre+"ln_2")...)
		ts = append(ts,
			gpt2Tensor{pre + "mlp.c_fc.weight", []int64{d, 4 * d}, 0, std},
			gpt2Tensor{pre + "mlp.c_fc.bias", []int64{4 * d}, 0, 0.02},
			gpt2Tensor{pre + "mlp.c_proj.weight", []int64{4 * d, d}, 0, resid},
			gpt2Tensor{pre + "mlp.c_proj.bias", []int64{d}, 0, 0.02})
	}
	return append(ts, ln("ln_f")...)
}

func (t gpt2Tensor) elements() int64 {
	n := int64(1)
	for _, d := range t.shape {
		n *= d
	}
	return n
}

// gpt2Weights returns the weights in checkpoint order and where they came
// from: read from the safetensors file at path when it exists, else
// generated from seed (and written to path when path is set).
func gpt2Weights(s gpt2Shape, seed uint64, path string) ([]safetensors.Tensor, string, error) {
	specs := gpt2Tensors(s)
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
	ts := generateGPT2Weights(specs, seed)
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
func readGPT2Weights(f *safetensors.File, specs []gpt2Tensor) ([]safetensors.Tensor, error) {
	var ts []safetensors.Tensor
	for _, sp := range specs {
		in, ok := f.Info(sp.name)
		switch {
		case !ok:
			return nil, fmt.Errorf("no tensor %q", sp.name)
		case in.DType != "F32":
			return nil, fmt.Errorf("tensor %q is %s, the workload runs float32 (F32)", sp.name, in.DType)
		case !slices.Equal(in.Shape, sp.shape):
			return nil, fmt.Errorf("tensor %q has shape %s, the config needs %s", sp.name,
				safetensors.ShapeString(in.Shape), safetensors.ShapeString(sp.shape))
		}
		t, err := f.ReadTensor(sp.name)
		if err != nil {
			return nil, err
		}
		ts = append(ts, t)
	}
	return ts, nil
}

// genChunk is the number of elements drawn from one generator: chunks are
// generated in parallel and each has its own stream, so the values do not
// depend on how many goroutines made them.
const genChunk = 1 << 16

// generateGPT2Weights draws every tensor of specs from seed.
func generateGPT2Weights(specs []gpt2Tensor, seed uint64) []safetensors.Tensor {
	ts := make([]safetensors.Tensor, len(specs))
	type job struct{ t, chunk int }
	var jobs []job
	for i, sp := range specs {
		ts[i] = safetensors.Tensor{Name: sp.name, DType: "F32", Shape: sp.shape, Data: make([]byte, 4*sp.elements())}
		for c := int64(0); c*genChunk < sp.elements(); c++ {
			jobs = append(jobs, job{i, int(c)})
		}
	}
	work := make(chan job)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for j := range work {
				sp, data := specs[j.t], ts[j.t].Data
				h := fnv.New64a()
				h.Write([]byte(sp.name))
				r := rand.New(rand.NewPCG(seed, h.Sum64()^uint64(j.chunk)<<40))
				lo := j.chunk * genChunk
				hi := min(lo+genChunk, int(sp.elements()))
				v := make([]float32, hi-lo)
				for i := range v {
					v[i] = float32(sp.center + (2*r.Float64()-1)*sp.spread)
				}
				copy(data[4*lo:], gpu.F32ToBytes(v))
			}
		})
	}
	for _, j := range jobs {
		work <- j
	}
	close(work)
	wg.Wait()
	return ts
}
