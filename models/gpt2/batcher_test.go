package gpt2

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/streamcache"
)

// openSim opens a sim backend whose streams the process-wide cache gives
// back before the backend's leak check.
func openSim(t *testing.T) *sim.Backend {
	t.Helper()
	b := simtest.New(t, 1)
	t.Cleanup(func() {
		if err := streamcache.Default.Purge(b); err != nil {
			t.Error(err)
		}
	})
	return b
}

func newBatcher(t *testing.T, b gpu.Backend, w *Weights, o Options) *Batcher {
	t.Helper()
	bt, err := NewBatcher(context.Background(), b, w, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bt.Close(); err != nil {
			t.Error(err)
		}
	})
	return bt
}

// mixedRequests are prompts of different lengths (longer than a prefill
// chunk among them) and budgets, so that in a batch of fewer rows
// sequences join and leave at different steps.
func mixedRequests(s Sampling) []Request {
	var rs []Request
	for i, n := range []int{1, 7, 3, 12, 2, 5, 9} {
		p := make([]int32, n)
		for j := range p {
			p[j] = int32((i*13 + j*5 + 1) % micro.Vocab)
		}
		rs = append(rs, Request{Prompt: p, MaxNewTokens: 2 + (i*3)%6, Sampling: s})
	}
	return rs
}

func generate(t *testing.T, bt *Batcher, reqs []Request) []Result {
	t.Helper()
	res, err := bt.Generate(context.Background(), reqs, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestGreedyMatchesReference: greedy tokens from a batch of 3 rows equal
// the float64 forward's greedy tokens, where no near-tie could flip them.
func TestGreedyMatchesReference(t *testing.T) {
	b := openSim(t)
	w := microWeights(t)
	ref := newRef(w)
	reqs := mixedRequests(Sampling{})
	for _, host := range []bool{false, true} {
		bt := newBatcher(t, b, w, Options{Rows: 3, PrefillRows: 4, HostArgmax: host})
		for i, r := range generate(t, bt, reqs) {
			want, gaps := ref.greedy(reqs[i].Prompt, reqs[i].MaxNewTokens)
			for j, tok := range r.Tokens {
				if gaps[j] < 1e-4 {
					t.Logf("sequence %d token %d: near-tie (gap %.2g), not compared further", i, j, gaps[j])
					break
				}
				if tok != want[j] {
					t.Fatalf("host argmax %v: sequence %d: tokens %v, float64 forward %v", host, i, r.Tokens, want)
				}
				if d := float64(r.Gaps[j]) - gaps[j]; d > 1e-4 || d < -1e-4 {
					t.Errorf("sequence %d token %d: top-2 gap %v, float64 %v", i, j, r.Gaps[j], gaps[j])
				}
			}
			if len(r.Tokens) != reqs[i].MaxNewTokens || r.Reason != StopBudget {
				t.Errorf("sequence %d: %d tokens, %s; want %d, budget", i, len(r.Tokens), r.Reason, reqs[i].MaxNewTokens)
			}
		}
	}
}

// TestAloneOrBatched: every sequence's tokens are the same whether it runs
// alone (one row) or among others joining and leaving a batch of 3 rows,
// as buckets or masked rows, under every strategy the Batcher runs, greedy
// and sampled.
func TestAloneOrBatched(t *testing.T) {
	b := openSim(t)
	w := microWeights(t)
	for _, s := range []Sampling{{}, {Temperature: 0.9, TopK: 20, TopP: 0.9, Seed: 3}, {Temperature: 1.3, Seed: 4}} {
		reqs := mixedRequests(s)
		// One row: every sequence runs alone in its steps, one after the
		// other (its sampling stream keyed by its index, as in the batch).
		alone := make([][]int32, len(reqs))
		for i, r := range generate(t, newBatcher(t, b, w, Options{Rows: 1, PrefillRows: 4}), reqs) {
			alone[i] = r.Tokens
		}
		if s.Greedy() {
			// And alone in a request list of its own.
			bt := newBatcher(t, b, w, Options{Rows: 1, PrefillRows: 4})
			for i, r := range reqs {
				if got := generate(t, bt, []Request{r})[0].Tokens; !slices.Equal(got, alone[i]) {
					t.Errorf("sequence %d: %v alone, %v in a list of one", i, alone[i], got)
				}
			}
		}
		opts := []Options{
			{Rows: 3, PrefillRows: 4},
			{Buckets: []int{1, 2, 3}, PrefillRows: 4},
			{Rows: 3, PrefillRows: 5, Strategy: sg.StrategyEager},
			{Rows: 3, PrefillRows: 4, Strategy: sg.StrategyDevice},
			{Rows: 8, PrefillRows: 16, Strategy: sg.StrategyUpdate},
			{Rows: 3, PrefillRows: 4, Strategy: sg.StrategyStable, MaxPositions: 24},
			{Rows: 2, PrefillRows: 4, Strategy: sg.StrategyPool},
			{Rows: 3, PrefillRows: 4, Strategy: sg.StrategyPatch},
		}
		if !s.Greedy() {
			opts = opts[:2] // the strategies and shapes are covered greedy
		}
		for _, o := range opts {
			if o.Strategy == "" || o.Strategy == sg.StrategyAuto {
				o.Strategy = sg.StrategyAuto
			}
			bt := newBatcher(t, b, w, o)
			res := generate(t, bt, reqs)
			for i := range reqs {
				if !slices.Equal(res[i].Tokens, alone[i]) {
					t.Errorf("sampling %+v, options %+v: sequence %d: %v in the batch, %v alone", s, o, i, res[i].Tokens, alone[i])
				}
			}
			st := bt.Stats()
			if st.Rerecords != 0 {
				t.Errorf("options %+v: %d graphs recorded for %d steps, %d re-recorded; want none again", o, st.Records, st.Graphs, st.Rerecords)
			}
		}
	}
}

// TestGraphsRecordedUnderAuto: under StrategyAuto the summary's graphs
// recorded are those of the strategy auto kept, which recorded them while
// auto measured it: as many as that strategy asked for by name records,
// not 0.
func TestGraphsRecordedUnderAuto(t *testing.T) {
	b := openSim(t)
	w := microWeights(t)
	reqs := mixedRequests(Sampling{})
	auto := newBatcher(t, b, w, Options{Rows: 3, PrefillRows: 4})
	generate(t, auto, reqs)
	st := auto.Stats()
	if st.Strategy == sg.StrategyEager || st.Strategy == sg.StrategyAuto || st.Strategy == "" {
		t.Skipf("auto ran %q: no graph to count", st.Strategy)
	}
	named := newBatcher(t, b, w, Options{Rows: 3, PrefillRows: 4, Strategy: st.Strategy})
	generate(t, named, reqs)
	want := named.Stats()
	if st.Records < st.Graphs || st.Records != want.Records {
		t.Errorf("auto (ran %s): %d graphs recorded for %d step programs; %s by name records %d", st.Strategy, st.Records, st.Graphs,
			st.Strategy, want.Records)
	}
}

// TestCachesSizedAndRetired: each sequence's cache is sized to its need,
// at most Rows of them live at once, and each is freed through the
// client's retirement queue; the region is empty after Generate.
func TestCachesSizedAndRetired(t *testing.T) {
	b := openSim(t)
	w := microWeights(t)
	reqs := mixedRequests(Sampling{})
	var need uint64
	for _, r := range reqs {
		need = max(need, uint64(micro.CacheBytes(r.Positions())))
	}
	bt := newBatcher(t, b, w, Options{Rows: 2, PrefillRows: 4})
	before, err := bt.cl.RetireStats(0)
	if err != nil {
		t.Fatal(err)
	}
	generate(t, bt, reqs)
	st := bt.Stats()
	if st.CachePeak == 0 || st.CachePeak > 2*need {
		t.Errorf("cache peak %d bytes, want at most two sequences' need (%d each at most)", st.CachePeak, need)
	}
	if full := uint64(micro.CacheBytes(micro.Positions)); st.CachePeak >= full {
		t.Errorf("cache peak %d bytes: not sized to need (one whole-context cache is %d)", st.CachePeak, full)
	}
	after, err := bt.cl.RetireStats(0)
	if err != nil {
		t.Fatal(err)
	}
	if got := after.Released() - before.Released(); got != uint64(len(reqs)) {
		t.Errorf("%d batches released by the retirement queue, want one per sequence (%d)", got, len(reqs))
	}
	if a := bt.alloc.Stats(); a.Allocations != 0 {
		t.Errorf("%d caches still allocated after Generate", a.Allocations)
	}
	if st.DecodeSteps == 0 || st.RowsActive > 2*st.DecodeSteps {
		t.Errorf("%d decode steps with %d active rows in all, two rows", st.DecodeSteps, st.RowsActive)
	}
}

// TestCacheRegionTooSmall: a cache that cannot fit even alone is an error
// naming the sequence; one that fits only once others end waits.
func TestCacheRegionTooSmall(t *testing.T) {
	b := openSim(t)
	w := microWeights(t)
	reqs := mixedRequests(Sampling{})
	one := uint64(micro.CacheBytes(reqs[3].Positions())) // the largest
	bt := newBatcher(t, b, w, Options{Rows: 3, PrefillRows: 4, CacheMemory: one + 256})
	res, err := bt.Generate(context.Background(), reqs, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if len(r.Tokens) != reqs[i].MaxNewTokens {
			t.Errorf("sequence %d: %d tokens", i, len(r.Tokens))
		}
	}
	small := newBatcher(t, b, w, Options{Rows: 3, PrefillRows: 4, CacheMemory: one / 2})
	_, err = small.Generate(context.Background(), reqs, nil)
	if err == nil || !strings.Contains(err.Error(), "does not fit") {
		t.Errorf("a region smaller than one cache: %v", err)
	}
}

// TestStops: a stop token ends a sequence without being part of it, a
// callback returning false ends it, and a canceled context ends Generate
// with what was generated and every cache freed.
func TestStops(t *testing.T) {
	b := openSim(t)
	w := microWeights(t)
	bt := newBatcher(t, b, w, Options{Rows: 2, PrefillRows: 4})
	reqs := mixedRequests(Sampling{Temperature: 1.5, Seed: 9}) // varied tokens
	base := generate(t, bt, reqs)
	// The first token of sequence 3 not generated before it.
	r, toks := reqs[3], base[3].Tokens
	j := 1
	for j < len(toks) && slices.Contains(toks[:j], toks[j]) {
		j++
	}
	if j == len(toks) {
		t.Fatalf("sequence 3 repeats one token: %v", toks)
	}
	r.StopTokens = []int32{toks[j]}
	one := slices.Clone(reqs[:4]) // index 3, its sampling stream
	one[3] = r
	res := generate(t, bt, one)[3]
	if res.Reason != StopToken || !slices.Equal(res.Tokens, toks[:j]) {
		t.Errorf("stop token %d: %v (%s), want %v", r.StopTokens[0], res.Tokens, res.Reason, toks[:j])
	}
	var seen int
	res2, err := bt.Generate(context.Background(), reqs[3:4], func(ev Event) bool { seen++; return seen < 2 })
	if err != nil || res2[0].Reason != StopCallback || len(res2[0].Tokens) != 2 {
		t.Errorf("callback stop: %+v, %v", res2[0], err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	res3, err := bt.Generate(ctx, reqs, func(ev Event) bool {
		if n++; n == 5 {
			cancel()
		}
		return true
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled: %v", err)
	}
	var got int
	for _, r := range res3 {
		got += len(r.Tokens)
	}
	if got != 5 {
		t.Errorf("%d tokens kept after the cancel at the fifth", got)
	}
	if err := bt.cl.Synchronize(context.Background()); err != nil {
		t.Fatal(err)
	}
	if a := bt.alloc.Stats(); a.Allocations != 0 {
		t.Errorf("%d caches still allocated after a cancel", a.Allocations)
	}
}

// TestBadRequests: every bad request is refused before any step runs,
// naming it and what is wrong.
func TestBadRequests(t *testing.T) {
	b := openSim(t)
	w := microWeights(t)
	bt := newBatcher(t, b, w, Options{Rows: 2, PrefillRows: 4, MaxPositions: 20})
	ok := Request{Prompt: []int32{1}, MaxNewTokens: 2}
	for _, c := range []struct {
		r    Request
		want string
	}{
		{Request{MaxNewTokens: 2}, "empty prompt"},
		{Request{Prompt: make([]int32, 21), MaxNewTokens: 1}, "longer than the context of 20"},
		{Request{Prompt: make([]int32, 10), MaxNewTokens: 11}, "past the context of 20"},
		{Request{Prompt: []int32{97}, MaxNewTokens: 1}, "outside the vocabulary"},
		{Request{Prompt: []int32{1}}, "at least one"},
		{Request{Prompt: []int32{1}, MaxNewTokens: 1, Sampling: Sampling{Temperature: -1}}, "temperature"},
		{Request{Prompt: []int32{1}, MaxNewTokens: 1, Sampling: Sampling{TopP: 2}}, "top-p 2 outside (0, 1]"},
		{Request{Prompt: []int32{1}, MaxNewTokens: 1, Sampling: Sampling{Temperature: 1, TopK: -3}}, "top-k -3 is negative"},
		{Request{Prompt: []int32{1}, MaxNewTokens: 1, Sampling: Sampling{Temperature: 1, TopK: micro.Vocab + 1}}, "more than the vocabulary"},
	} {
		before := bt.Stats()
		_, err := bt.Generate(context.Background(), []Request{ok, c.r}, nil)
		if err == nil || !strings.Contains(err.Error(), "request 1") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming request 1 and saying %q", c.r, err, c.want)
		}
		if after := bt.Stats(); after.PrefillSteps != before.PrefillSteps {
			t.Errorf("%+v: a step ran before the request was refused", c.r)
		}
	}
	if _, err := bt.Generate(context.Background(), nil, nil); err == nil {
		t.Error("no requests: no error")
	}
	if _, err := NewBatcher(context.Background(), b, w, Options{Strategy: "bogus"}); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Errorf("strategy bogus: %v, want a refusal naming it", err)
	}
}

// TestBatcherFaults fails each driver call of a kind in turn, through
// NewBatcher and Generate: every failure is an error wrapping the injected
// one (or, where the runtime falls back past it, the right tokens), Close
// releases everything (the sim's live handles return to zero) and no cache
// stays allocated.
func TestBatcherFaults(t *testing.T) {
	b := openSim(t)
	w := microWeights(t)
	reqs := []Request{{Prompt: []int32{3, 1, 4, 1, 5}, MaxNewTokens: 3}, {Prompt: []int32{9}, MaxNewTokens: 2}}
	want := generate(t, newBatcher(t, b, w, Options{Rows: 1, PrefillRows: 4}), reqs)
	for _, op := range []string{"MemAlloc", "MemcpyHtoD", "MemcpyHtoDAsync", "MemcpyDtoHAsync", "GraphLaunch"} {
		for nth := 0; ; nth++ {
			b.ClearFaults()
			b.InjectFault(op, nth, gpu.ErrOutOfMemory)
			before := b.Calls(op)
			bt, err := NewBatcher(context.Background(), b, w, Options{Rows: 1, PrefillRows: 4})
			absorbed := false
			if err == nil {
				var res []Result
				res, err = bt.Generate(context.Background(), reqs, nil)
				absorbed = err == nil && slices.EqualFunc(res, want, func(a, b Result) bool { return slices.Equal(a.Tokens, b.Tokens) })
				b.ClearFaults()
				if bt.alloc != nil && err != nil {
					if serr := bt.cl.Synchronize(context.Background()); serr != nil {
						t.Fatal(serr)
					}
					if a := bt.alloc.Stats(); a.Allocations != 0 {
						t.Errorf("%s call %d failed: %d caches left allocated", op, nth, a.Allocations)
					}
				}
				if cerr := bt.Close(); cerr != nil {
					t.Fatalf("%s call %d: close: %v", op, nth, cerr)
				}
			}
			calls := b.Calls(op) - before
			if nth >= calls {
				if err != nil {
					t.Fatalf("%s: no fault injected at call %d of %d, yet: %v", op, nth, calls, err)
				}
				if calls == 0 {
					t.Errorf("the Batcher never calls %s", op)
				}
				break
			}
			if !errors.Is(err, gpu.ErrInjected) && !absorbed {
				t.Errorf("%s call %d failed, the Batcher said %v", op, nth, err)
			}
		}
	}
	b.ClearFaults() // openSim's cleanup checks that nothing leaked
}

// TestEndOfTextStops: with GPT-2's vocabulary and no stop tokens given, a
// sequence ends at the end-of-text token, greedy or sampled on the device,
// without it among its tokens; an empty, non-nil StopTokens does not stop
// there. The model is made to prefer the token: ln_f gives every row the
// same hidden vector, and the tied LM head's row of EndOfText points along
// it.
func TestEndOfTextStops(t *testing.T) {
	b := openSim(t)
	c := Config{Layers: 1, Width: 16, Heads: 2, Vocab: EndOfText + 1, Positions: 16}
	w, err := Generate(c, 3)
	if err != nil {
		t.Fatal(err)
	}
	for i := range w.Tensors {
		tn := &w.Tensors[i]
		f := gpu.BytesToF32(tn.Data)
		switch tn.Name {
		case "ln_f.weight":
			clear(f)
		case "ln_f.bias":
			for j := range f {
				f[j] = 1
			}
		case "wte.weight":
			for j := range c.Width {
				f[EndOfText*c.Width+j] = 1
			}
		default:
			continue
		}
		tn.Data = gpu.F32ToBytes(f)
	}
	bt := newBatcher(t, b, w, Options{Rows: 2, PrefillRows: 4})
	p := []int32{5, 9, 2}
	res := generate(t, bt, []Request{
		{Prompt: p, MaxNewTokens: 4},
		{Prompt: p, MaxNewTokens: 4, Sampling: Sampling{Temperature: 0.5, Seed: 1}},
		{Prompt: p, MaxNewTokens: 4, StopTokens: []int32{}},
	})
	for i, r := range res[:2] {
		if r.Reason != StopToken || len(r.Tokens) != 0 {
			t.Errorf("sequence %d: %v (%s), want no tokens, ended by the end-of-text token", i, r.Tokens, r.Reason)
		}
	}
	if r := res[2]; r.Reason != StopBudget || !slices.Equal(r.Tokens, []int32{EndOfText, EndOfText, EndOfText, EndOfText}) {
		t.Errorf("no stop tokens: %v (%s), want the end-of-text token 4 times, to the budget", r.Tokens, r.Reason)
	}
}
