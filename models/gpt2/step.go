package gpt2

import (
	"fmt"
	"math"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

// Caches says how a step's rows map to KV-cache params.
type Caches uint8

const (
	// RowCaches gives every row a cache param of its own (kv0, kv1, …):
	// a decode step, each row a sequence.
	RowCaches Caches = iota
	// SharedCache binds every row to one cache param (kv): a prefill
	// step, the rows a prompt's tokens at consecutive positions.
	SharedCache
)

// Head is what a step outputs.
type Head uint8

const (
	// Logits outputs the rows' logits: an output "logits" of rows×vocab
	// float32, for sampling on the host.
	Logits Head = iota
	// Argmax outputs the logits and, beside them, each row's greedy
	// token, "next" (rows int32), and its two largest logits, "top"
	// (rows×2 float32): a greedy decoder reads 12 bytes a row back
	// instead of 4·vocab, and a sampling one still finds the logits.
	Argmax
	// Sample outputs Argmax's outputs and kernels.Sample's: a param
	// "sampling" (rows × kernels.SampleParamBytes, each row's seed,
	// sequence, token index, temperature and flags, written every step)
	// and outputs "draw" (rows int32: a Gumbel-max draw over the row),
	// "cand" (rows × Candidates × 8 bytes: the row's largest logits) and
	// "stats" (rows × 2 float64: the row's largest logit and Σ exp). A
	// sampling decoder reads a few bytes a row back instead of 4·vocab.
	Sample
)

// DefaultCandidates is the default of Step.Candidates and
// Options.Candidates: top-k up to 64 never reads logits back.
const DefaultCandidates = 64

// Step describes one forward step of the model over Rows rows. Each row
// is a token at a position of a sequence's KV cache: the step embeds it,
// appends its keys and values to the cache at its position and attends over
// the cache's positions up to it, through every layer, then computes the
// row's logits. A row whose position is kernels.InactiveRow does no
// attention work and writes no cache (its logits are meaningless).
type Step struct {
	Config Config
	// Rows is the number of token rows the step computes.
	Rows int
	// Caches says whether every row has its own cache param or all share
	// one.
	Caches Caches
	// MaxPositions bounds the positions the rows may take (positions
	// outside are bad input, kernels/gpt2.go), sizes the attention's
	// shared memory and the cache params: each is declared
	// Config.CacheBytes(MaxPositions), every byte a row may touch, so
	// that every strategy (those that copy or map params included) can run
	// the step. Default Config.Positions; at most that.
	MaxPositions int
	// Head is what the step outputs.
	Head Head
	// Candidates is how many of each row's largest logits the Sample head
	// outputs (kernels.Sample's kmax). Default DefaultCandidates; 1 to
	// kernels.SampleMaxK.
	Candidates int
	// Shard is the tensor-parallel part of the model the step computes
	// (shard.go): its weights are Specs(Config, Shard), its caches hold
	// its heads only (Shard.CacheBytes), and each block all-reduces its
	// two projections over Comm. The zero Shard is the whole model, or,
	// with Comm set, the part of Comm's rank of Comm's size.
	Shard Shard
	// Comm is the tensor-parallel group's communicator: its size must be
	// Shard.Ranks and its rank Shard.Rank, and the step compiles for its
	// device. Needed for a Shard of more than one rank; with the whole
	// model it is ignored (no collective runs).
	Comm *sg.Comm
}

// StepProgram is a step declared in a program: the buffers the caller
// binds or reads.
type StepProgram struct {
	Program *sg.Program
	Step    Step
	// Tokens and Positions are params of Rows int32 each.
	Tokens, Positions sg.Buffer
	// Caches are the cache params: Rows of them (RowCaches) or one
	// (SharedCache).
	Caches []sg.Buffer
	// Logits is the rows' logits (Rows×Vocab float32), an output.
	Logits sg.Buffer
	// Next and Top are Argmax's outputs (zero Buffers with Logits).
	Next, Top sg.Buffer
	// Sampling is Sample's param; Draw, Cand and Stats its outputs (zero
	// Buffers with the other heads).
	Sampling, Draw, Cand, Stats sg.Buffer
	// Weights are the states holding the weights, in Specs order.
	Weights []sg.Buffer
}

// CacheFor returns the cache param row r reads and appends to.
func (sp *StepProgram) CacheFor(r int) sg.Buffer {
	if len(sp.Caches) == 1 {
		return sp.Caches[0]
	}
	return sp.Caches[r]
}

// withDefaults fills the defaults and checks the step.
func (s Step) withDefaults() (Step, error) {
	if err := s.Config.Check(); err != nil {
		return s, err
	}
	if s.Comm != nil && s.Shard == (Shard{}) {
		s.Shard = Shard{Rank: s.Comm.Rank(), Ranks: s.Comm.Size()}
	}
	if err := s.Shard.Check(s.Config); err != nil {
		return s, err
	}
	switch {
	case s.Shard.Whole():
		s.Comm = nil // nothing to reduce
	case s.Comm == nil:
		return s, fmt.Errorf("%w: %s: %w", ErrTensorParallel, s.Shard, errNoComm)
	case s.Comm.Size() != s.Shard.Ranks || s.Comm.Rank() != s.Shard.Rank:
		return s, fmt.Errorf("%w: %s on %s: the communicator's rank and size must be the shard's", ErrTensorParallel, s.Shard, s.Comm)
	}
	if s.MaxPositions == 0 {
		s.MaxPositions = s.Config.Positions
	}
	if s.Head == Sample && s.Candidates == 0 {
		s.Candidates = DefaultCandidates
	}
	switch {
	case s.Rows <= 0 || s.Rows > 1<<16:
		return s, fmt.Errorf("gpt2: step of %d rows (1 to 65536)", s.Rows)
	case s.MaxPositions < 0 || s.MaxPositions > s.Config.Positions:
		return s, fmt.Errorf("gpt2: step's %d positions outside the model's context of %d", s.MaxPositions, s.Config.Positions)
	case s.Caches > SharedCache || s.Head > Sample:
		return s, fmt.Errorf("gpt2: unknown caches %d or head %d", s.Caches, s.Head)
	case s.Head == Sample && (s.Candidates < 1 || s.Candidates > kernels.SampleMaxK):
		return s, fmt.Errorf("gpt2: %d candidates a row (1 to %d)", s.Candidates, kernels.SampleMaxK)
	case int64(s.Rows)*int64(s.Config.Vocab) > 1<<31-1 || int64(s.Rows)*4*int64(s.Config.Width) > 1<<31-1:
		return s, fmt.Errorf("gpt2: %d rows of %s overflow the kernels' int32 sizes", s.Rows, s.Config)
	}
	return s, nil
}

// Build declares the step into a new program called name: the weights as
// states (bind them with Executable.BindState or write them with
// WriteBuffer), tokens, positions and caches as params, and the head's
// outputs. The program's buffer names are stable: "tokens", "positions",
// "kv0".."kvN" or "kv", "logits", "next", "top", "sampling", "draw",
// "cand", "stats", and the weights' names. A tensor-parallel step's
// program holds its all-reduces: compile it for Comm's device, on every
// rank of the group.
func (s Step) Build(name string) (*StepProgram, error) {
	s, err := s.withDefaults()
	if err != nil {
		return nil, err
	}
	specs, err := Specs(s.Config, s.Shard)
	if err != nil {
		return nil, err
	}
	p := sg.NewProgram(name)
	R := int64(s.Rows)
	sp := &StepProgram{Program: p, Step: s, Tokens: p.Param("tokens", 4*R), Positions: p.Param("positions", 4*R)}
	cacheBytes := s.Shard.CacheBytes(s.Config, s.MaxPositions)
	if s.Caches == SharedCache {
		sp.Caches = []sg.Buffer{p.Param("kv", cacheBytes)}
	} else {
		for r := range s.Rows {
			sp.Caches = append(sp.Caches, p.Param(fmt.Sprintf("kv%d", r), cacheBytes))
		}
	}
	sp.Logits = p.Output("logits", 4*R*int64(s.Config.Vocab))
	if s.Head >= Argmax {
		sp.Next, sp.Top = p.Output("next", 4*R), p.Output("top", 8*R)
	}
	if s.Head == Sample {
		sp.Sampling = p.Param("sampling", kernels.SampleParamBytes*R)
		sp.Draw, sp.Cand, sp.Stats = p.Output("draw", 4*R), p.Output("cand", 8*R*int64(s.Candidates)), p.Output("stats", 16*R)
	}
	w := map[string]sg.Buffer{}
	for _, spec := range specs {
		b := p.State(spec.Name, 4*spec.Elements())
		w[spec.Name] = b
		sp.Weights = append(sp.Weights, b)
	}
	sp.declare(w)
	return sp, nil
}

// declare lays out the step: embedding, L pre-norm transformer blocks,
// final layer norm, tied LM head, and the Argmax and Sample heads.
//
// Biases: the GEMMs have none here, so every bias is added by the kernel
// after its GEMM: q/k/v's by KVAppend, the attention and MLP projections'
// by BiasResidual, the MLP's first by BiasGelu. This function is the one
// place that knows it.
//
// Tensor parallelism (shard.go): with R ranks qkv, q and att are d/R wide
// (the rank's heads; its KV caches too) and fc and gelu 4d/R, and the two
// projections (attn.c_proj, mlp.c_proj) produce partial sums that an
// all-reduce (sum, in place over the proj temp, which never moves, so
// every strategy captures it once) adds up before BiasResidual adds the
// bias once. The rest, the residual stream x, is the same on every rank.
func (sp *StepProgram) declare(st map[string]sg.Buffer) {
	s, p := sp.Step, sp.Program
	c := s.Config
	B, d, hd := s.Rows, c.Width, c.HeadDim()
	dl, heads, inner := s.Shard.Width(c), s.Shard.Heads(c), s.Shard.Inner(c)
	rowsF32 := func(name string, cols int) sg.Buffer { return p.Temp(name, 4*int64(B)*int64(cols)) }
	x, h := rowsF32("x", d), rowsF32("h", d)
	qkv, q, att, proj := rowsF32("qkv", 3*dl), rowsF32("q", dl), rowsF32("att", dl), rowsF32("proj", d)
	fc, g := rowsF32("fc", inner), rowsF32("gelu", inner)
	i32 := func(v int) sg.Arg { return sg.I32(int32(v)) }
	w := func(name string) sg.Slice { return st[name].All() }
	layerNorm := func(out sg.Buffer, prefix string) {
		p.Launch(kernels.LayerNorm, kernels.LayerNormConfig(B), sg.Out(out.All()), sg.In(x.All()),
			sg.In(w(prefix+".weight")), sg.In(w(prefix+".bias")), i32(B), i32(d), sg.F32(float32(c.eps())))
	}
	gemm := func(out, a sg.Buffer, b string, n, k int) {
		p.Gemm(out.All(), a.All(), w(b), sg.GEMM{M: B, N: n, K: k, Alpha: 1})
	}
	// reduce sums a projection's partial sums over the ranks.
	reduce := func(b sg.Buffer) {
		if s.Comm != nil {
			p.AllReduce(s.Comm, b.All(), b.All(), gpu.Float32, gpu.Sum)
		}
	}
	// rows is rows [r0, r0+n) of a buffer of B rows of cols 4-byte elements.
	rows := func(b sg.Buffer, r0, n, cols int) sg.Slice { return b.Slice(4*int64(r0*cols), 4*int64(n*cols)) }
	// The kernels take each cache whole and the layer as a scalar
	// (kernels/gpt2.go, KV caches): a launch may touch all of it.
	cache := func(r int) sg.Slice { return sp.CacheFor(r).All() }

	p.Launch(kernels.Embed, kernels.Elementwise(B*d), sg.Out(x.All()), sg.In(w("wte.weight")), sg.In(w("wpe.weight")),
		sg.In(sp.Tokens.All()), sg.In(sp.Positions.All()), i32(B), i32(d), i32(c.Vocab), i32(s.MaxPositions))
	for l := range c.Layers {
		pre := fmt.Sprintf("h.%d.", l)
		layerNorm(h, pre+"ln_1")
		gemm(qkv, h, pre+"attn.c_attn.weight", 3*dl, d)
		// Every row's keys and values are appended before any row attends:
		// rows sharing a cache (a prompt) then see the positions before
		// theirs.
		for r0 := 0; r0 < B; r0 += kernels.MaxSeqsPerLaunch {
			n := min(kernels.MaxSeqsPerLaunch, B-r0)
			args := []sg.Arg{sg.Out(rows(q, r0, n, dl)), sg.In(rows(qkv, r0, n, 3*dl)), sg.In(w(pre + "attn.c_attn.bias")), sg.In(rows(sp.Positions, r0, n, 1))}
			args = append(append(args, cacheArgs(cache, r0, n, sg.InOut)...), i32(n), i32(dl), i32(c.Layers), i32(l), i32(s.MaxPositions))
			p.Launch(kernels.KVAppend, kernels.Elementwise(n*dl), args...)
		}
		for r0 := 0; r0 < B; r0 += kernels.MaxSeqsPerLaunch {
			n := min(kernels.MaxSeqsPerLaunch, B-r0)
			args := []sg.Arg{sg.Out(rows(att, r0, n, dl)), sg.In(rows(q, r0, n, dl)), sg.In(rows(sp.Positions, r0, n, 1))}
			args = append(append(args, cacheArgs(cache, r0, n, sg.In)...),
				i32(n), i32(heads), i32(hd), i32(c.Layers), i32(l), i32(s.MaxPositions), sg.F32(float32(1/math.Sqrt(float64(hd)))))
			p.Launch(kernels.DecodeAttention, kernels.DecodeAttentionConfig(n, heads, hd, s.MaxPositions), args...)
		}
		gemm(proj, att, pre+"attn.c_proj.weight", d, dl)
		reduce(proj)
		p.Launch(kernels.BiasResidual, kernels.Elementwise(B*d), sg.InOut(x.All()), sg.In(proj.All()),
			sg.In(w(pre+"attn.c_proj.bias")), i32(B), i32(d))
		layerNorm(h, pre+"ln_2")
		gemm(fc, h, pre+"mlp.c_fc.weight", inner, d)
		p.Launch(kernels.BiasGelu, kernels.Elementwise(B*inner), sg.Out(g.All()), sg.In(fc.All()),
			sg.In(w(pre+"mlp.c_fc.bias")), i32(B), i32(inner))
		gemm(proj, g, pre+"mlp.c_proj.weight", d, inner)
		reduce(proj)
		p.Launch(kernels.BiasResidual, kernels.Elementwise(B*d), sg.InOut(x.All()), sg.In(proj.All()),
			sg.In(w(pre+"mlp.c_proj.bias")), i32(B), i32(d))
	}
	layerNorm(h, "ln_f")
	// The LM head is the token embedding, transposed: logits = h · wteᵀ.
	p.Gemm(sp.Logits.All(), h.All(), w("wte.weight"), sg.GEMM{M: B, N: c.Vocab, K: d, TransB: true, Alpha: 1})
	if s.Head >= Argmax {
		p.Launch(kernels.Argmax, kernels.ArgmaxConfig(B), sg.Out(sp.Next.All()), sg.Out(sp.Top.All()), sg.In(sp.Logits.All()),
			i32(B), i32(c.Vocab))
	}
	if s.Head == Sample {
		p.Launch(kernels.Sample, kernels.SampleConfig(B), sg.Out(sp.Draw.All()), sg.Out(sp.Cand.All()), sg.Out(sp.Stats.All()),
			sg.In(sp.Logits.All()), sg.In(sp.Sampling.All()), i32(B), i32(c.Vocab), i32(s.Candidates))
	}
}

// cacheArgs are the eight cache arguments of a launch over rows r0..r0+n-1:
// their caches with access acc, then the first one again, read only, for
// the unused slots (the kernel ignores them).
func cacheArgs(cache func(r int) sg.Slice, r0, n int, acc func(sg.Slice) sg.Arg) []sg.Arg {
	a := make([]sg.Arg, kernels.MaxSeqsPerLaunch)
	for i := range a {
		if i < n {
			a[i] = acc(cache(r0 + i))
		} else {
			a[i] = sg.In(cache(r0))
		}
	}
	return a
}
