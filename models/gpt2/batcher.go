package gpt2

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/bfc"
	"github.com/stablegraph/stablegraph/client"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/retire"
)

// Options configure NewBatcher. The zero value is valid; each field's
// default is given with it and applied in one place, withDefaults.
type Options struct {
	// Rows is the most sequences decoded at once: the rows of the decode
	// step. Default 8.
	Rows int
	// Buckets, when set, replaces the one decode step of Rows rows by one
	// step per row count listed (ascending; Rows is then the largest):
	// each step runs the smallest that holds the sequences, packed into
	// its first rows, as frameworks that capture a graph per batch size
	// do. Default nil: one step of Rows rows, the rows without a sequence
	// inactive (kernels/gpt2.go, Inactive rows). doc.go compares the two.
	Buckets []int
	// PrefillRows is the rows of the prefill step: a prompt is computed
	// in chunks of that many tokens. Default 32 (at most MaxPositions).
	PrefillRows int
	// MaxPositions is the most positions a sequence may take, prompt and
	// new tokens: the steps' bound. Default Config.Positions.
	MaxPositions int
	// Strategy replays the steps (every strategy can: see doc.go, KV
	// caches). Default StrategyAuto, which measures its candidates on the
	// first steps of the first Generate.
	Strategy sg.Strategy
	// Device is the device ordinal. Default 0.
	Device int
	// CacheMemory is the size of the region the KV caches are allocated
	// from (a bfc allocator over one device allocation, which holds one
	// cache of MaxPositions more as a tail: see doc.go). Default room for
	// Rows + Rows/2 + 2 caches of MaxPositions: the running sequences'
	// caches are sized to their need, and those just freed wait in the
	// retirement queue until the device is done with them.
	CacheMemory uint64
	// HostArgmax makes greedy sequences read their logits back and take
	// the argmax on the host. Default false: the steps compute it on the
	// device (kernels.Argmax) and greedy rows read 12 bytes back instead
	// of 4·Vocab.
	HostArgmax bool
	// HostSampling makes sampled sequences (temperature above 0) read
	// their logits back and draw on the host. Default false: the steps
	// sample on the device (kernels.Sample): temperature alone is drawn
	// there (4 bytes back a row), top-k and top-p from the row's
	// Candidates largest logits (8 bytes each), the whole row read back
	// only when those do not hold the tokens kept (a fallback, counted in
	// Stats). Both ways give the same tokens (doc.go, Sampling).
	HostSampling bool
	// Candidates is how many of a row's largest logits the device returns
	// for top-k and top-p: a top-k up to it never reads logits back.
	// Default DefaultCandidates; 1 to kernels.SampleMaxK.
	Candidates int
	// Client supplies the stream (from the stream cache) and the
	// retirement queue the caches are freed through. Default: one opened
	// on Device with the process-wide stream cache, closed by Close.
	Client *client.Client
	// Logger receives debug logs. Default slog.Default().
	Logger *slog.Logger
}

// DefaultRows and DefaultPrefillRows are the defaults of Options.Rows and
// Options.PrefillRows.
const (
	DefaultRows        = 8
	DefaultPrefillRows = 32
)

// Validate reports options NewBatcher would refuse for a model of shape
// c, without touching a device.
func (o Options) Validate(c Config) error {
	_, err := o.withDefaults(c)
	return err
}

func (o Options) withDefaults(c Config) (Options, error) {
	if o.MaxPositions == 0 {
		o.MaxPositions = c.Positions
	}
	if o.MaxPositions < 2 || o.MaxPositions > c.Positions {
		return o, fmt.Errorf("gpt2: MaxPositions %d outside [2, %d], the model's context", o.MaxPositions, c.Positions)
	}
	if len(o.Buckets) > 0 {
		if !slices.IsSorted(o.Buckets) || o.Buckets[0] < 1 || slices.Compact(slices.Clone(o.Buckets))[0] != o.Buckets[0] || len(slices.Compact(slices.Clone(o.Buckets))) != len(o.Buckets) {
			return o, fmt.Errorf("gpt2: buckets %v: must be ascending, distinct and positive", o.Buckets)
		}
		if o.Rows != 0 && o.Rows != o.Buckets[len(o.Buckets)-1] {
			return o, fmt.Errorf("gpt2: %d rows but the largest bucket is %d", o.Rows, o.Buckets[len(o.Buckets)-1])
		}
		o.Rows = o.Buckets[len(o.Buckets)-1]
		o.Buckets = slices.Clone(o.Buckets)
	}
	if o.Rows == 0 {
		o.Rows = DefaultRows
	}
	if o.PrefillRows == 0 {
		o.PrefillRows = min(DefaultPrefillRows, o.MaxPositions)
	}
	if o.Rows < 1 || o.Rows > 4096 || o.PrefillRows < 1 || o.PrefillRows > 4096 {
		return o, fmt.Errorf("gpt2: %d rows and %d prefill rows (1 to 4096)", o.Rows, o.PrefillRows)
	}
	if o.Candidates == 0 {
		o.Candidates = DefaultCandidates
	}
	if o.Candidates < 1 || o.Candidates > kernels.SampleMaxK {
		return o, fmt.Errorf("gpt2: %d candidates a row (1 to %d)", o.Candidates, kernels.SampleMaxK)
	}
	if o.Strategy == "" {
		o.Strategy = sg.StrategyAuto
	}
	if _, err := sg.ParseStrategy(string(o.Strategy)); err != nil {
		return o, fmt.Errorf("gpt2: %w", err)
	}
	if o.CacheMemory == 0 {
		o.CacheMemory = uint64(o.Rows+o.Rows/2+2) * uint64(c.CacheBytes(o.MaxPositions))
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

// Request is one sequence to generate.
type Request struct {
	// Prompt is the prompt's token ids, at least one.
	Prompt []int32
	// MaxNewTokens is the budget of tokens to generate, at least one.
	MaxNewTokens int
	Sampling     Sampling
	// StopTokens end the sequence when generated; they are not part of
	// its tokens. nil means EndOfText (when the vocabulary has it); an
	// empty, non-nil slice means none.
	StopTokens []int32
}

// Positions is the cache positions r needs: every token but the last
// generated one is appended to it.
func (r Request) Positions() int { return len(r.Prompt) + r.MaxNewTokens - 1 }

// CheckRequest reports a request the model cannot serve within
// maxPositions positions, saying why: an empty prompt, a token outside the
// vocabulary, a prompt longer than the context, a budget past it, bad
// sampling settings.
func CheckRequest(c Config, maxPositions int, r Request) error {
	switch {
	case len(r.Prompt) == 0:
		return errors.New("empty prompt")
	case len(r.Prompt) > maxPositions:
		return fmt.Errorf("prompt of %d tokens is longer than the context of %d positions", len(r.Prompt), maxPositions)
	case r.MaxNewTokens < 1:
		return fmt.Errorf("budget of %d new tokens: at least one", r.MaxNewTokens)
	case len(r.Prompt)+r.MaxNewTokens > maxPositions:
		return fmt.Errorf("prompt of %d tokens + %d new tokens = %d, past the context of %d positions", len(r.Prompt), r.MaxNewTokens, len(r.Prompt)+r.MaxNewTokens, maxPositions)
	}
	for i, t := range r.Prompt {
		if t < 0 || int(t) >= c.Vocab {
			return fmt.Errorf("prompt token %d is id %d, outside the vocabulary of %d", i, t, c.Vocab)
		}
	}
	return r.Sampling.checkVocab(c.Vocab)
}

// StopReason says why a sequence ended.
type StopReason string

const (
	StopBudget   StopReason = "budget"     // MaxNewTokens generated
	StopToken    StopReason = "stop_token" // a stop token (end of text) generated
	StopCallback StopReason = "callback"   // the event callback asked (a stop string)
	StopCanceled StopReason = "canceled"   // the context ended first
)

// Event is one generated token of one sequence, as it comes.
type Event struct {
	Seq   int   // index of the request
	Token int32 // the token (a stop token when Reason is StopToken)
	// Gap is the gap between the two largest logits the token was chosen
	// from: how near a tie greedy decoding was.
	Gap  float32
	Done bool       // the sequence ended with this event
	Why  StopReason // why, when Done
}

// Result is one sequence's outcome.
type Result struct {
	Tokens []int32 // generated, stop token excluded
	Reason StopReason
	// Gaps are the gaps between the two largest logits at each generated
	// token.
	Gaps []float32
	// TTFT is the time from the start of Generate to the first token (a
	// sequence that waited for a row waited within it); TPOT the mean
	// time per token after the first (0 with one token).
	TTFT, TPOT time.Duration
}

// Stats are a Batcher's counters.
type Stats struct {
	// Startup is how long NewBatcher took: weights uploaded, steps
	// compiled and their graphs recorded (a warm-up step of each).
	Startup time.Duration
	// Graphs is the number of executables (one prefill step, one decode
	// step or one per bucket); Records the graphs recorded over their
	// lives and Rerecords those recorded again (0 in steady state); under
	// StrategyAuto, those of the strategy it kept, not of the candidates
	// it measured and dropped.
	Graphs, Records, Rerecords int64
	// PatchedNodes counts node updates (patch) as sequences joined.
	PatchedNodes int64
	// DecodeSteps and PrefillSteps count steps run; RowsActive the sum
	// over decode steps of the rows holding a sequence.
	DecodeSteps, PrefillSteps, RowsActive int64
	// Where the tokens of sampled sequences were drawn: DeviceDraws on the
	// device over the whole row (temperature alone), CandidateDraws on the
	// host from the device's candidates (top-k, top-p), HostDraws on the
	// host from the row's logits read back (Options.HostSampling), and
	// Fallbacks from the row's logits read back because the candidates did
	// not hold the tokens kept (a nucleus beyond them, or a top-k above
	// Options.Candidates).
	DeviceDraws, CandidateDraws, HostDraws, Fallbacks int64
	// ReadbackBytes is what choosing tokens copied from the device to the
	// host, over all steps.
	ReadbackBytes uint64
	// Memory: the weights, the executables' own memory (temps,
	// workspaces), the KV-cache region and the most of it in use, and
	// the inputs and outputs the Batcher binds.
	WeightBytes, ExecutableBytes, CacheRegion, CachePeak, IOBytes uint64
	// Strategy is what the decode step runs (auto's choice, once made:
	// auto measures its candidates over the first steps); Requested what
	// Options asked for.
	Strategy, Requested sg.Strategy
}

// DeviceBytes is all the device memory the Batcher holds.
func (s Stats) DeviceBytes() uint64 {
	return s.WeightBytes + s.ExecutableBytes + s.CacheRegion + s.IOBytes
}

// stepExe is one compiled step and the buffers bound to it every step.
type stepExe struct {
	sp                       *StepProgram
	exe                      *sg.Executable
	tokens, positions        gpu.DevicePtr
	logits, next, top        gpu.DevicePtr
	sampling, draw, cand, st gpu.DevicePtr // the Sample head's
	// params is what the sampling param holds (nil: not written yet): a
	// step whose rows sample as the last did does not write it again.
	params []byte
}

// Batcher generates many sequences at once on one device with continuous
// batching: a waiting prompt takes a free row as soon as one frees. Its
// steps are compiled once (a prefill step and a decode step, or a decode
// step per bucket) and their graphs recorded at start-up; every sequence's
// KV cache is allocated from a bfc allocator when it starts, sized to its
// need (Request.Positions), bound to its row for its life, and freed
// through the client's retirement queue once the device is done with the
// last step that used it. doc.go describes the design.
//
// A Batcher is not safe for concurrent use: one Generate at a time.
type Batcher struct {
	b       gpu.Backend
	cfg     Config
	opts    Options
	cl      *client.Client
	ownCl   bool
	dev     int
	stream  gpu.Stream
	weights []gpu.DevicePtr // per tensor, Specs order
	prefill *stepExe
	decode  []*stepExe // one, or one per bucket
	// region holds the caches: bfc manages its first CacheMemory bytes;
	// the tail of one whole cache keeps every cache's declared range
	// (MaxPositions) inside the allocation. Inactive rows are bound to its
	// start.
	region gpu.DevicePtr
	alloc  *bfc.Allocator
	io     []gpu.DevicePtr
	stats  Stats
}

// NewBatcher uploads w to device opts.Device of b, compiles the steps and
// records their graphs. Close releases everything. It runs the whole
// model on one device: weights of a tensor-parallel shard are refused.
func NewBatcher(ctx context.Context, b gpu.Backend, w *Weights, opts Options) (_ *Batcher, err error) {
	start := time.Now()
	c := w.Config
	if err := c.Check(); err != nil {
		return nil, err
	}
	if !w.Part.Whole() {
		return nil, fmt.Errorf("%w: a Batcher runs the whole model on one device; these weights are %s", ErrTensorParallel, w.Part)
	}
	if opts, err = opts.withDefaults(c); err != nil {
		return nil, err
	}
	bt := &Batcher{b: b, cfg: c, opts: opts, dev: opts.Device, cl: opts.Client}
	defer func() {
		if err != nil {
			err = errors.Join(err, bt.Close())
		}
	}()
	if bt.cl == nil {
		if bt.cl, err = client.Open(b, client.Options{Devices: []int{opts.Device}, Logger: opts.Logger}); err != nil {
			return nil, fmt.Errorf("gpt2: %w", err)
		}
		bt.ownCl = true
	}
	if bt.stream, err = bt.cl.Stream(opts.Device, 0); err != nil {
		return nil, fmt.Errorf("gpt2: %w", err)
	}
	for _, t := range w.Tensors {
		p, err := bt.devAlloc(uint64(len(t.Data)))
		if err != nil {
			return nil, fmt.Errorf("gpt2: weight %s: %w", t.Name, err)
		}
		bt.weights = append(bt.weights, p)
		if err := b.MemcpyHtoD(p, t.Data); err != nil {
			return nil, fmt.Errorf("gpt2: upload weight %s: %w", t.Name, err)
		}
		bt.stats.WeightBytes += uint64(len(t.Data))
	}
	tail := uint64(c.CacheBytes(opts.MaxPositions))
	if bt.region, err = b.MemAlloc(bt.dev, opts.CacheMemory+tail); err != nil {
		return nil, fmt.Errorf("gpt2: KV-cache region of %d bytes: %w", opts.CacheMemory+tail, err)
	}
	bt.stats.CacheRegion = opts.CacheMemory + tail
	// Zeroed once: strategies that copy params copy the declared ranges,
	// and the sim checks reads of memory never written.
	if err := b.Memset(gpu.Memset{Dst: bt.region, ElemSize: 4, Count: (opts.CacheMemory + tail) / 4}); err != nil {
		return nil, fmt.Errorf("gpt2: clear the KV-cache region: %w", err)
	}
	if bt.alloc, err = bfc.New(bt.region, opts.CacheMemory, bfc.Options{Name: "gpt2 KV caches"}); err != nil {
		return nil, fmt.Errorf("gpt2: %w", err)
	}
	// The Sample head unless sampling is on the host: its kernel costs
	// next to nothing on rows that do not sample (doc.go, Sampling).
	head := Sample
	if opts.HostSampling {
		head = Argmax
	}
	if bt.prefill, err = bt.compile(ctx, "gpt2-prefill", Step{Config: c, Rows: opts.PrefillRows, Caches: SharedCache,
		MaxPositions: opts.MaxPositions, Head: head, Candidates: opts.Candidates}); err != nil {
		return nil, err
	}
	sizes := opts.Buckets
	if len(sizes) == 0 {
		sizes = []int{opts.Rows}
	}
	for _, rows := range sizes {
		se, err := bt.compile(ctx, fmt.Sprintf("gpt2-decode-%d", rows), Step{Config: c, Rows: rows, Caches: RowCaches,
			MaxPositions: opts.MaxPositions, Head: head, Candidates: opts.Candidates})
		if err != nil {
			return nil, err
		}
		bt.decode = append(bt.decode, se)
	}
	// Warm-up: one step of each, every row inactive, records the graphs
	// now rather than at the first request.
	for _, se := range append([]*stepExe{bt.prefill}, bt.decode...) {
		if err := bt.run(ctx, se, nil, nil, nil, nil); err != nil {
			return nil, fmt.Errorf("gpt2: warm-up of %s: %w", se.sp.Program.Name(), err)
		}
	}
	if err := bt.cl.Synchronize(ctx); err != nil {
		return nil, fmt.Errorf("gpt2: warm-up: %w", err)
	}
	bt.stats.Requested = opts.Strategy
	bt.stats.Graphs = int64(1 + len(bt.decode))
	bt.stats.Startup = time.Since(start)
	return bt, nil
}

func (bt *Batcher) devAlloc(n uint64) (gpu.DevicePtr, error) {
	return bt.b.MemAlloc(bt.dev, max(n, 4))
}

// ioAlloc allocates a buffer the Batcher binds, freed by Close.
func (bt *Batcher) ioAlloc(n uint64) (gpu.DevicePtr, error) {
	p, err := bt.devAlloc(n)
	if err != nil {
		return 0, fmt.Errorf("gpt2: %d bytes for the steps' inputs and outputs: %w", n, err)
	}
	bt.io = append(bt.io, p)
	bt.stats.IOBytes += n
	return p, nil
}

// compile builds and compiles a step, binds its weights and allocates its
// inputs and outputs.
func (bt *Batcher) compile(ctx context.Context, name string, st Step) (_ *stepExe, err error) {
	sp, err := st.Build(name)
	if err != nil {
		return nil, err
	}
	exe, err := sg.Compile(ctx, bt.b, sp.Program, sg.Options{Strategy: bt.opts.Strategy, Device: bt.dev, Logger: bt.opts.Logger})
	if err != nil {
		return nil, fmt.Errorf("gpt2: compile %s: %w", name, err)
	}
	se := &stepExe{sp: sp, exe: exe}
	defer func() {
		if err != nil {
			err = errors.Join(err, exe.Close())
		}
	}()
	for i, buf := range sp.Weights {
		if err := exe.BindState(ctx, buf, bt.weights[i]); err != nil {
			return nil, fmt.Errorf("gpt2: %s: %w", name, err)
		}
	}
	rows := uint64(sp.Step.Rows)
	type buf struct {
		dst *gpu.DevicePtr
		n   uint64
	}
	bufs := []buf{{&se.tokens, 4 * rows}, {&se.positions, 4 * rows}, {&se.logits, 4 * rows * uint64(bt.cfg.Vocab)}, {&se.next, 4 * rows}, {&se.top, 8 * rows}}
	if st.Head == Sample {
		bufs = append(bufs, buf{&se.sampling, kernels.SampleParamBytes * rows}, buf{&se.draw, 4 * rows},
			buf{&se.cand, 8 * rows * uint64(sp.Step.Candidates)}, buf{&se.st, 16 * rows})
	}
	for _, a := range bufs {
		if *a.dst, err = bt.ioAlloc(a.n); err != nil {
			return nil, err
		}
	}
	return se, nil
}

// run writes the rows' tokens and positions (rows past len(toks) are
// inactive) and, with the Sample head, their sampling params (samp: nil
// when no row samples on the device), and runs se with caches bound per row
// (0: the region's start), then marks the submission on the client's
// timeline.
func (bt *Batcher) run(ctx context.Context, se *stepExe, toks, pos []int32, caches []gpu.DevicePtr, samp []byte) error {
	rows := se.sp.Step.Rows
	t, p := make([]int32, rows), make([]int32, rows)
	for r := range rows {
		if r < len(toks) {
			t[r], p[r] = toks[r], pos[r]
		} else {
			p[r] = kernels.InactiveRow
		}
	}
	if err := bt.b.MemcpyHtoDAsync(se.tokens, i32Bytes(t), bt.stream); err != nil {
		return fmt.Errorf("write tokens: %w", err)
	}
	if err := bt.b.MemcpyHtoDAsync(se.positions, i32Bytes(p), bt.stream); err != nil {
		return fmt.Errorf("write positions: %w", err)
	}
	bind := sg.Bindings{se.sp.Tokens: se.tokens, se.sp.Positions: se.positions, se.sp.Logits: se.logits,
		se.sp.Next: se.next, se.sp.Top: se.top}
	if se.sp.Step.Head == Sample {
		if samp == nil {
			samp = make([]byte, kernels.SampleParamBytes*rows)
		}
		if !bytes.Equal(samp, se.params) {
			se.params = nil // unknown until the write is queued
			if err := bt.b.MemcpyHtoDAsync(se.sampling, samp, bt.stream); err != nil {
				return fmt.Errorf("write sampling params: %w", err)
			}
			se.params = samp
		}
		bind[se.sp.Sampling], bind[se.sp.Draw], bind[se.sp.Cand], bind[se.sp.Stats] = se.sampling, se.draw, se.cand, se.st
	}
	for i, cb := range se.sp.Caches {
		bind[cb] = bt.region
		if i < len(caches) && caches[i] != 0 {
			bind[cb] = caches[i]
		}
	}
	outs, err := se.exe.Run(ctx, bt.stream, bind)
	if err != nil {
		return err
	}
	outs.Release()
	if _, err := bt.cl.Submitted(bt.dev, 0); err != nil {
		return err
	}
	return nil
}

// seqState is a sequence being generated.
type seqState struct {
	idx   int
	req   Request
	mode  rowMode // how its tokens are picked
	sc    scratch // host draws' memory
	cache gpu.DevicePtr
	size  uint64
	pos   int   // the position the next fed token takes
	last  int32 // the last token, fed at the next step
	res   *Result
	first time.Time
	lastT time.Time
	stop  []int32
	done  bool
}

// rowMode is how a sequence's tokens are picked, and so what its row
// reads back.
type rowMode uint8

const (
	// rowArgmax: greedy, the device's argmax (next, top).
	rowArgmax rowMode = iota
	// rowDraw: temperature alone, the device's draw (draw).
	rowDraw
	// rowCandidates: top-k or top-p, drawn on the host from the device's
	// candidates (cand, stats), from the logits when they fall short.
	rowCandidates
	// rowLogits: the whole row of logits, argmax or draw on the host.
	rowLogits
)

// modeOf is how the tokens of a sequence sampling with smp are picked.
func (bt *Batcher) modeOf(smp Sampling) rowMode {
	if smp.Greedy() {
		if bt.opts.HostArgmax {
			return rowLogits
		}
		return rowArgmax
	}
	if bt.opts.HostSampling {
		return rowLogits
	}
	switch k, p := smp.cut(bt.cfg.Vocab); {
	case k == 0 && p == 0:
		return rowDraw
	case k > bt.opts.Candidates:
		return rowLogits // a fallback, known before the step
	}
	return rowCandidates
}

// params is the sampling param row of s for its next token.
func (s *seqState) params() kernels.SampleParams {
	p := kernels.SampleParams{Seed: s.req.Sampling.Seed, Seq: uint32(s.idx), Index: uint32(len(s.res.Tokens)),
		Temperature: s.req.Sampling.Temperature}
	switch s.mode {
	case rowDraw:
		p.Flags = kernels.SampleDraw
	case rowCandidates:
		p.Flags = kernels.SampleCandidates
	}
	return p
}

// sampleParams are the sampling params of a step whose row r holds
// order[r] (nil: none), or nil when no row samples on the device.
func sampleParams(rows int, order []*seqState) []byte {
	var b []byte
	for r, s := range order {
		if s == nil || (s.mode != rowDraw && s.mode != rowCandidates) {
			continue
		}
		if b == nil {
			b = make([]byte, kernels.SampleParamBytes*rows)
		}
		s.params().Put(b[r*kernels.SampleParamBytes:])
	}
	return b
}

// Generate generates every request, streaming each token to on (which may
// be nil; returning false ends that sequence), and returns the results in
// request order. Requests are checked first (CheckRequest), before any
// device work. When ctx ends, Generate stops at the next step and returns
// what was generated with the context's error; the Batcher stays usable.
func (bt *Batcher) Generate(ctx context.Context, reqs []Request, on func(Event) bool) ([]Result, error) {
	if len(reqs) == 0 {
		return nil, errors.New("gpt2: no requests")
	}
	for i, r := range reqs {
		if err := CheckRequest(bt.cfg, bt.opts.MaxPositions, r); err != nil {
			return nil, fmt.Errorf("gpt2: request %d: %w", i, err)
		}
	}
	start := time.Now()
	results := make([]Result, len(reqs))
	waiting := make([]*seqState, len(reqs))
	for i, r := range reqs {
		stop := r.StopTokens
		if stop == nil && EndOfText < bt.cfg.Vocab {
			stop = []int32{EndOfText}
		}
		waiting[i] = &seqState{idx: i, req: r, mode: bt.modeOf(r.Sampling), res: &results[i], stop: stop}
	}
	rows := make([]*seqState, bt.opts.Rows) // the fixed step's rows; packed for buckets
	var errs []error
	emit := func(s *seqState, tok int32, gap float32) {
		now := time.Now()
		ev := Event{Seq: s.idx, Token: tok, Gap: gap}
		switch {
		case slices.Contains(s.stop, tok):
			ev.Done, ev.Why = true, StopToken
		default:
			s.res.Tokens = append(s.res.Tokens, tok)
			s.res.Gaps = append(s.res.Gaps, gap)
			if len(s.res.Tokens) == 1 {
				s.first = now
				s.res.TTFT = now.Sub(start)
			}
			s.lastT = now
			if len(s.res.Tokens) >= s.req.MaxNewTokens {
				ev.Done, ev.Why = true, StopBudget
			}
		}
		if on != nil && !on(ev) && !ev.Done {
			ev.Done, ev.Why = true, StopCallback
		}
		if ev.Done {
			s.done, s.res.Reason = true, ev.Why
			if n := len(s.res.Tokens); n > 1 {
				s.res.TPOT = s.lastT.Sub(s.first) / time.Duration(n-1)
			}
		}
		s.last = tok
	}
	// finish retires s's cache after the submission at point: released
	// once the device has passed it.
	finish := func(s *seqState, point uint64) {
		if s.cache == 0 {
			return
		}
		p, size := s.cache, s.size
		s.cache = 0
		item := retire.Item{Bytes: size, Release: func() error { return bt.alloc.Free(p) }}
		if err := bt.cl.Retire(ctx, bt.dev, retire.Batch{item}, point); err != nil {
			errs = append(errs, fmt.Errorf("gpt2: free the KV cache of sequence %d: %w", s.idx, err))
		}
	}
	// abandon retires the caches of the sequences a failure or a
	// cancellation leaves behind, after whatever was submitted last.
	abandon := func(ss ...*seqState) {
		point, err := bt.cl.Submitted(bt.dev, 0)
		if err != nil {
			// No point to wait for: the device may still read the caches,
			// so they are left allocated (Close reports them).
			errs = append(errs, fmt.Errorf("gpt2: the KV caches of the sequences left are not freed: %w", err))
			return
		}
		for _, s := range ss {
			if s != nil {
				finish(s, point)
			}
		}
	}
	defer func() { abandon(rows...) }()
	for {
		if err := ctx.Err(); err != nil {
			bt.cancelAll(rows, waiting)
			return results, errors.Join(append(errs, err)...)
		}
		// Admit waiting prompts into free rows, prefilling each.
		for len(waiting) > 0 {
			r := slices.Index(rows, nil)
			if r < 0 {
				break
			}
			s := waiting[0]
			ok, err := bt.admit(ctx, s)
			if err != nil {
				return results, errors.Join(append(errs, err)...)
			}
			if !ok {
				break // no room for its cache until a sequence ends
			}
			waiting = waiting[1:]
			tok, gap, err := bt.prefillSeq(ctx, s)
			if err != nil {
				abandon(s)
				return results, errors.Join(append(errs, fmt.Errorf("gpt2: prefill of sequence %d: %w", s.idx, err))...)
			}
			emit(s, tok, gap)
			if s.done {
				point, err := bt.cl.Submitted(bt.dev, 0)
				if err != nil {
					errs = append(errs, err)
				}
				finish(s, point)
				continue
			}
			rows[r] = s
		}
		active := len(rows) - countNil(rows)
		if active == 0 {
			if len(waiting) == 0 {
				bt.stats.CachePeak = max(bt.stats.CachePeak, bt.alloc.Stats().Peak)
				return results, errors.Join(errs...)
			}
			return results, errors.Join(append(errs, fmt.Errorf("gpt2: the KV cache of sequence %d (%d bytes) does not fit in the cache region of %d bytes (Options.CacheMemory)",
				waiting[0].idx, bt.cfg.CacheBytes(waiting[0].req.Positions()), bt.opts.CacheMemory))...)
		}
		// One decode step over the rows.
		se, order := bt.decodeStep(rows)
		toks, pos, caches := make([]int32, len(order)), make([]int32, len(order)), make([]gpu.DevicePtr, len(order))
		for i, s := range order {
			if s != nil {
				toks[i], pos[i], caches[i] = s.last, int32(s.pos), s.cache
			} else {
				pos[i] = kernels.InactiveRow
			}
		}
		if err := bt.run(ctx, se, toks, pos, caches, sampleParams(len(order), order)); err != nil {
			return results, errors.Join(append(errs, fmt.Errorf("gpt2: decode step: %w", err))...)
		}
		point, err := bt.cl.Submitted(bt.dev, 0)
		if err != nil {
			return results, errors.Join(append(errs, err)...)
		}
		bt.stats.DecodeSteps++
		bt.stats.RowsActive += int64(active)
		picks, err := bt.readRows(ctx, se, order)
		if err != nil {
			return results, errors.Join(append(errs, fmt.Errorf("gpt2: decode step: %w", err))...)
		}
		for i, s := range order {
			if s == nil {
				continue
			}
			s.pos++
			emit(s, picks[i].tok, picks[i].gap)
			if s.done {
				finish(s, point)
				rows[slices.Index(rows, s)] = nil
			}
		}
	}
}

func countNil(rows []*seqState) int {
	n := 0
	for _, s := range rows {
		if s == nil {
			n++
		}
	}
	return n
}

// cancelAll marks every unfinished sequence canceled.
func (bt *Batcher) cancelAll(rows, waiting []*seqState) {
	for _, s := range append(slices.Clone(rows), waiting...) {
		if s != nil && !s.done {
			s.done, s.res.Reason = true, StopCanceled
		}
	}
}

// admit allocates s's cache, sized to its need, draining the retirement
// queue once when the region is full. It returns false, with nothing
// allocated, when the region has no room even so: a running sequence must
// end first.
func (bt *Batcher) admit(ctx context.Context, s *seqState) (bool, error) {
	size := uint64(bt.cfg.CacheBytes(s.req.Positions()))
	for attempt := 0; ; attempt++ {
		p, err := bt.alloc.Alloc(size)
		if err == nil {
			s.cache, s.size, s.pos = p, size, 0
			bt.stats.CachePeak = max(bt.stats.CachePeak, bt.alloc.Stats().Peak)
			return true, nil
		}
		if !errors.Is(err, gpu.ErrOutOfMemory) {
			return false, fmt.Errorf("gpt2: KV cache of sequence %d: %w", s.idx, err)
		}
		if attempt > 0 {
			return false, nil
		}
		// Caches retired but not yet released hold room: a drain frees
		// them once the device is past their last step.
		if err := bt.cl.Synchronize(ctx); err != nil {
			return false, fmt.Errorf("gpt2: KV cache of sequence %d: %w", s.idx, err)
		}
	}
}

// pick is a row's chosen token and the gap of its two largest logits.
type pick struct {
	tok int32
	gap float32
}

// prefillSeq runs s's prompt through the prefill step, a chunk of
// PrefillRows tokens at a time, and picks its first token.
func (bt *Batcher) prefillSeq(ctx context.Context, s *seqState) (int32, float32, error) {
	se := bt.prefill
	C, T := se.sp.Step.Rows, len(s.req.Prompt)
	var order []*seqState
	for p0 := 0; p0 < T; p0 += C {
		n := min(C, T-p0)
		pos := make([]int32, n)
		for i := range pos {
			pos[i] = int32(p0 + i)
		}
		// The last chunk's last row gives the first token.
		order = make([]*seqState, n)
		if p0+n == T {
			order[n-1] = s
		}
		if err := bt.run(ctx, se, s.req.Prompt[p0:p0+n], pos, []gpu.DevicePtr{s.cache}, sampleParams(C, order)); err != nil {
			return 0, 0, err
		}
		bt.stats.PrefillSteps++
	}
	s.pos = T
	last := len(order) - 1
	picks, err := bt.readRows(ctx, se, order)
	if err != nil {
		return 0, 0, err
	}
	return picks[last].tok, picks[last].gap, nil
}

// decodeStep returns the decode step to run and the sequence in each of
// its rows: the fixed step and rows as they are, or the smallest bucket
// holding the sequences, packed into its first rows in row order.
func (bt *Batcher) decodeStep(rows []*seqState) (*stepExe, []*seqState) {
	if len(bt.decode) == 1 {
		return bt.decode[0], rows
	}
	var packed []*seqState
	for _, s := range rows {
		if s != nil {
			packed = append(packed, s)
		}
	}
	// The largest bucket is Rows, and at most Rows sequences run.
	se := bt.decode[len(bt.decode)-1]
	for _, b := range bt.decode {
		if b.sp.Step.Rows >= len(packed) {
			se = b
			break
		}
	}
	out := make([]*seqState, se.sp.Step.Rows)
	copy(out, packed)
	return se, out
}

// readRows reads back what the sequences of order need from se's last
// step (waiting for it) and picks their tokens (rowMode): the device's
// argmax or draw, a draw on the host from the device's candidates or, when
// those fall short, from the row's logits read back then, or a pick from
// the row's logits. Host draws from whole rows run in parallel.
func (bt *Batcher) readRows(ctx context.Context, se *stepExe, order []*seqState) ([]pick, error) {
	n, V := len(order), bt.cfg.Vocab
	K := se.sp.Step.Candidates
	picks := make([]pick, n)
	var logitRows, candRows []int
	drawRows := false
	for i, s := range order {
		switch {
		case s == nil:
		case s.mode == rowLogits:
			logitRows = append(logitRows, i)
		case s.mode == rowCandidates:
			candRows = append(candRows, i)
		case s.mode == rowDraw:
			drawRows = true
		}
	}
	rd := readback{bt: bt}
	next, top := make([]byte, 4*n), make([]byte, 8*n)
	rd.copy(top, se.top)
	var draws, cand, stats []byte
	var c0 int
	if drawRows {
		draws = make([]byte, 4*n)
		rd.copy(draws, se.draw)
	}
	if len(candRows) > 0 {
		c0 = candRows[0]
		span := candRows[len(candRows)-1] + 1 - c0
		cand, stats = make([]byte, 8*K*span), make([]byte, 16*span)
		rd.copy(cand, se.cand.Add(uint64(8*K*c0)))
		rd.copy(stats, se.st.Add(uint64(16*c0)))
	}
	logits := rd.rows(se, logitRows)
	// Readback copies the last, synchronizes the stream and drains the
	// retirement queue: the caches retired after earlier steps are freed.
	if err := rd.finish(ctx, next, se.next); err != nil {
		return nil, err
	}
	gap := func(i int) float32 {
		t := gpu.BytesToF32(top[8*i : 8*i+8])
		return t[0] - t[1]
	}
	var fallback []int
	for i, s := range order {
		if s == nil {
			continue
		}
		switch s.mode {
		case rowArgmax:
			picks[i] = pick{int32(binary.LittleEndian.Uint32(next[4*i:])), gap(i)}
		case rowDraw:
			picks[i] = pick{int32(binary.LittleEndian.Uint32(draws[4*i:])), gap(i)}
			bt.stats.DeviceDraws++
		case rowCandidates:
			j := i - c0
			c := s.sc.cand[:0]
			for q := range K {
				e := cand[8*(j*K+q):]
				id, v := int32(binary.LittleEndian.Uint32(e)), math.Float32frombits(binary.LittleEndian.Uint32(e[4:]))
				if id >= 0 && v == v {
					c = append(c, candidate{id, v})
				}
			}
			s.sc.cand = c
			z := math.Float64frombits(binary.LittleEndian.Uint64(stats[16*j+8:]))
			tok, ok := s.req.Sampling.drawSorted(c, V <= K, z, s.idx, len(s.res.Tokens))
			if !ok {
				fallback = append(fallback, i)
				continue
			}
			picks[i] = pick{tok, gap(i)}
			bt.stats.CandidateDraws++
		}
	}
	bt.pickFromLogits(order, logitRows, logits, picks)
	if len(fallback) > 0 {
		// The logits of the step are still in place: the next step has
		// not been submitted.
		rd = readback{bt: bt}
		logits := rd.rows(se, fallback)
		if err := rd.finish(ctx, nil, 0); err != nil {
			return nil, err
		}
		bt.pickFromLogits(order, fallback, logits, picks)
		for _, i := range fallback {
			picks[i].gap = gap(i)
		}
	}
	return picks, nil
}

// pickFromLogits picks the tokens of rows from their logits (logits[k] of
// rows[k]) on the host: the argmax of greedy rows, the draw of the
// others, in parallel.
func (bt *Batcher) pickFromLogits(order []*seqState, rows []int, logits [][]byte, picks []pick) {
	var wg sync.WaitGroup
	for k, i := range rows {
		s, lg := order[i], gpu.BytesToF32(logits[k])
		switch {
		case s.req.Sampling.Greedy():
			id, gap := ArgmaxLogits(lg)
			picks[i] = pick{id, gap}
			continue
		case s.mode == rowCandidates || !bt.opts.HostSampling:
			bt.stats.Fallbacks++
		default:
			bt.stats.HostDraws++
		}
		_, gap := ArgmaxLogits(lg)
		picks[i].gap = gap
		wg.Go(func() { picks[i].tok = s.req.Sampling.drawLogits(lg, s.idx, len(s.res.Tokens), &s.sc) })
	}
	wg.Wait()
}

// readback queues device-to-host copies on the Batcher's stream; finish
// queues the last through Client.Readback, which waits for them all.
type readback struct {
	bt  *Batcher
	err error
}

func (rd *readback) copy(dst []byte, src gpu.DevicePtr) {
	if rd.err == nil {
		rd.err = rd.bt.b.MemcpyDtoHAsync(dst, src, rd.bt.stream)
		rd.bt.stats.ReadbackBytes += uint64(len(dst))
	}
}

// rows queues the logits of rows (ascending) of se, one copy per run of
// consecutive rows, and returns each row's bytes.
func (rd *readback) rows(se *stepExe, rows []int) [][]byte {
	row := 4 * rd.bt.cfg.Vocab
	out := make([][]byte, len(rows))
	for a := 0; a < len(rows); {
		b := a + 1
		for b < len(rows) && rows[b] == rows[b-1]+1 {
			b++
		}
		buf := make([]byte, row*(b-a))
		rd.copy(buf, se.logits.Add(uint64(row*rows[a])))
		for k := a; k < b; k++ {
			out[k] = buf[row*(k-a) : row*(k-a+1)]
		}
		a = b
	}
	return out
}

// finish copies src into dst (none when dst is nil) and waits for every
// copy queued.
func (rd *readback) finish(ctx context.Context, dst []byte, src gpu.DevicePtr) error {
	if rd.err != nil {
		return fmt.Errorf("read back: %w", rd.err)
	}
	if dst == nil {
		if err := rd.bt.cl.Synchronize(ctx); err != nil {
			return fmt.Errorf("read back: %w", err)
		}
		return nil
	}
	rd.bt.stats.ReadbackBytes += uint64(len(dst))
	if err := rd.bt.cl.Readback(ctx, rd.bt.dev, dst, src); err != nil {
		return fmt.Errorf("read back: %w", err)
	}
	return nil
}

// Stats returns the Batcher's counters, with the executables' graph
// counts and memory read now.
func (bt *Batcher) Stats() Stats {
	st := bt.stats
	st.Records, st.Rerecords, st.PatchedNodes, st.ExecutableBytes = 0, 0, 0, 0
	for _, se := range append([]*stepExe{bt.prefill}, bt.decode...) {
		if se == nil || se.exe == nil {
			continue
		}
		x := se.exe.Stats()
		st.Records += x.Records
		st.Rerecords += x.Rerecords
		st.PatchedNodes += x.PatchedNodes
		st.ExecutableBytes += se.exe.Memory().Total()
	}
	if bt.alloc != nil {
		st.CachePeak = max(st.CachePeak, bt.alloc.Stats().Peak)
	}
	if len(bt.decode) > 0 && bt.decode[0].exe != nil {
		st.Strategy = bt.decode[0].exe.Stats().Strategy
	}
	return st
}

// Config is the model's shape.
func (bt *Batcher) Config() Config { return bt.cfg }

// Options are the options in force, defaults applied.
func (bt *Batcher) Options() Options { return bt.opts }

// Close waits for the device, then releases the executables, the buffers,
// the weights and the client it opened, reporting every failure.
func (bt *Batcher) Close() error {
	var errs []error
	if bt.cl != nil {
		errs = append(errs, bt.cl.Synchronize(context.Background()))
	}
	for _, se := range append([]*stepExe{bt.prefill}, bt.decode...) {
		if se != nil && se.exe != nil {
			errs = append(errs, se.exe.Close())
			se.exe = nil
		}
	}
	bt.prefill, bt.decode = nil, nil
	for _, p := range append(bt.io, bt.weights...) {
		errs = append(errs, bt.b.MemFree(p))
	}
	bt.io, bt.weights = nil, nil
	if bt.alloc != nil {
		if st := bt.alloc.Stats(); st.Allocations > 0 {
			errs = append(errs, fmt.Errorf("gpt2: %d KV caches (%d bytes) still allocated at Close", st.Allocations, st.InUse))
		}
		bt.alloc = nil
	}
	if bt.region != 0 {
		errs = append(errs, bt.b.MemFree(bt.region))
		bt.region = 0
	}
	if bt.ownCl && bt.cl != nil {
		errs = append(errs, bt.cl.Close())
	}
	bt.cl = nil
	return errors.Join(errs...)
}

func i32Bytes(v []int32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(x), byte(x>>8), byte(x>>16), byte(x>>24)
	}
	return b
}
