package gpt2

import (
	"context"
	"math"
	"strings"
	"testing"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/kernels"
)

// micro is the shape of the tests: small enough for a float64 forward of
// every token, two layers so that the cache's layer offsets matter.
var micro = Config{Layers: 2, Width: 32, Heads: 4, Vocab: 97, Positions: 40}

func microWeights(t testing.TB) *Weights {
	t.Helper()
	w, err := Generate(micro, 7)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// stepRunner runs one compiled step on sim, eager, its inputs and
// outputs in buffers of its own, on the device of the step's communicator
// (0 without one).
type stepRunner struct {
	t   *testing.T
	b   gpu.Backend
	s   gpu.Stream
	sp  *StepProgram
	exe *sg.Executable
	io  map[sg.Buffer]gpu.DevicePtr
}

func newStepRunner(t *testing.T, b gpu.Backend, w *Weights, st Step) *stepRunner {
	t.Helper()
	sp, err := st.Build("test")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dev := 0
	if st.Comm != nil {
		dev = st.Comm.Device()
	}
	exe, err := sg.Compile(ctx, b, sp.Program, sg.Options{Strategy: sg.StrategyEager, Device: dev})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { exe.Close() })
	for i, buf := range sp.Weights {
		if err := exe.WriteBuffer(ctx, buf, w.Tensors[i].Data); err != nil {
			t.Fatal(err)
		}
	}
	r := &stepRunner{t: t, b: b, s: simtest.Stream(t, b, dev), sp: sp, exe: exe, io: map[sg.Buffer]gpu.DevicePtr{}}
	for _, buf := range []sg.Buffer{sp.Tokens, sp.Positions, sp.Logits} {
		r.io[buf] = simtest.Alloc(t, b, dev, uint64(buf.Size()))
	}
	return r
}

// run runs the step with the rows' tokens, positions (InactiveRow for the
// rows past len(toks)) and caches, and returns the logits of every row.
func (r *stepRunner) run(toks, pos []int32, caches []gpu.DevicePtr) [][]float32 {
	r.t.Helper()
	out, err := r.try(toks, pos, caches)
	if err != nil {
		r.t.Fatal(err)
	}
	return out
}

// try is run returning its error: for the ranks of a tensor-parallel
// step, which run on goroutines of their own.
func (r *stepRunner) try(toks, pos []int32, caches []gpu.DevicePtr) ([][]float32, error) {
	rows := r.sp.Step.Rows
	tk, ps := make([]int32, rows), make([]int32, rows)
	for i := range rows {
		ps[i] = kernels.InactiveRow
		if i < len(toks) {
			tk[i], ps[i] = toks[i], pos[i]
		}
	}
	for buf, v := range map[sg.Buffer][]int32{r.sp.Tokens: tk, r.sp.Positions: ps} {
		if err := r.b.MemcpyHtoD(r.io[buf], i32Bytes(v)); err != nil {
			return nil, err
		}
	}
	bind := sg.Bindings{}
	for buf, p := range r.io {
		bind[buf] = p
	}
	for i, cb := range r.sp.Caches {
		bind[cb] = caches[i]
	}
	if _, err := r.exe.Run(context.Background(), r.s, bind); err != nil {
		return nil, err
	}
	if err := r.b.StreamSynchronize(r.s); err != nil {
		return nil, err
	}
	raw := make([]byte, r.sp.Logits.Size())
	if err := r.b.MemcpyDtoH(raw, r.io[r.sp.Logits]); err != nil {
		return nil, err
	}
	all := gpu.BytesToF32(raw)
	vocab := r.sp.Step.Config.Vocab
	out := make([][]float32, rows)
	for i := range out {
		out[i] = all[i*vocab : (i+1)*vocab]
	}
	return out, nil
}

// near checks got against the float64 want within tol·(1 + |want|).
func near(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	for i, w := range want {
		if d := math.Abs(float64(got[i]) - w); !(d <= tol*(1+math.Abs(w))) {
			t.Fatalf("%s: logit %d = %v, float64 forward %v (off by %.3g)", what, i, got[i], w, d)
		}
	}
}

// TestPrefillAndDecodeMatchReference runs prompts through the prefill step
// in chunks (the last chunk part inactive), then decodes from the caches it
// wrote with a decode step whose rows hold different sequences and an
// inactive row; every row's logits must equal the float64 forward of its
// sequence.
func TestPrefillAndDecodeMatchReference(t *testing.T) {
	b := simtest.New(t, 1)
	w := microWeights(t)
	ref := newRef(w)
	// Steps bounded at 16 positions, fewer than the model's 40.
	prefill := newStepRunner(t, b, w, Step{Config: micro, Rows: 4, Caches: SharedCache, MaxPositions: 16})
	decode := newStepRunner(t, b, w, Step{Config: micro, Rows: 3, Caches: RowCaches, MaxPositions: 16})

	prompts := [][]int32{{5, 17, 3, 90, 44, 2}, {61}, {8, 8, 8, 1, 96}}
	const steps = 3
	caches := make([]gpu.DevicePtr, len(prompts))
	seqs := make([][]int32, len(prompts))
	for i, pr := range prompts {
		caches[i] = simtest.Alloc(t, b, 0, uint64(micro.CacheBytes(16)))
		want := ref.forward(pr)
		for p0 := 0; p0 < len(pr); p0 += 4 {
			n := min(4, len(pr)-p0)
			pos := make([]int32, n)
			for j := range pos {
				pos[j] = int32(p0 + j)
			}
			got := prefill.run(pr[p0:p0+n], pos, caches[i:i+1])
			for j := range n {
				near(t, "prefill", got[j], want[p0+j], 1e-4)
			}
		}
		seqs[i] = append([]int32(nil), pr...)
	}
	// Decode: rows 0 and 2 hold sequences 2 and 0, row 1 is inactive,
	// then sequence 1 joins in row 1.
	for step := range steps {
		order := []int{2, -1, 0}
		if step > 0 {
			order[1] = 1
		}
		var toks, pos []int32
		bound := make([]gpu.DevicePtr, 3)
		for r, seq := range order {
			if seq < 0 {
				toks, pos = append(toks, 0), append(pos, kernels.InactiveRow)
				bound[r] = caches[0] // not read: any valid memory
				continue
			}
			tok := int32((step*31 + seq*7) % micro.Vocab)
			toks, pos = append(toks, tok), append(pos, int32(len(seqs[seq])))
			seqs[seq] = append(seqs[seq], tok)
			bound[r] = caches[seq]
		}
		got := decode.run(toks, pos, bound)
		for r, seq := range order {
			if seq < 0 {
				continue
			}
			want := ref.forward(seqs[seq])
			near(t, "decode", got[r], want[len(want)-1], 1e-4)
		}
	}
}

// TestStepRejects: bad steps fail at Build, saying what is wrong.
func TestStepRejects(t *testing.T) {
	for _, c := range []struct {
		st   Step
		want string
	}{
		{Step{Config: micro, Rows: 0}, "0 rows"},
		{Step{Config: micro, Rows: 1, MaxPositions: 41}, "outside the model's context"},
		{Step{Config: micro, Rows: 1, Shard: Shard{Rank: 1, Ranks: 2}}, "needs its group's communicator"},
		{Step{Config: micro, Rows: 1, Shard: Shard{Rank: 0, Ranks: 3}}, "4 heads do not split over 3 ranks"},
		{Step{Config: micro, Rows: 1, Shard: Shard{Rank: 2, Ranks: 2}}, "rank 2 of 2"},
		{Step{Config: Config{Layers: 1, Width: 30, Heads: 4, Vocab: 5, Positions: 4}, Rows: 1}, "not a multiple"},
	} {
		if _, err := c.st.Build("x"); err == nil || !contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error saying %q", c.st, err, c.want)
		}
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
