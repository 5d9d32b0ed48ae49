package gpt2

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/commtest"
	"github.com/stablegraph/stablegraph/internal/perrank"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/kernels"
)

// TestShardSlices: every rank's weights have Specs' shapes for its shard,
// and put back together (columns per group, rows in rank order) they are
// the whole model's, bit for bit; the replicated ones are whole on every
// rank. LoadShard of a saved checkpoint gives the same bytes as Shard.
func TestShardSlices(t *testing.T) {
	w := microWeights(t)
	dir := t.TempDir()
	if err := w.Save(dir, nil); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{2, 4} {
		parts := make([]*Weights, n)
		for r := range n {
			s := Shard{Rank: r, Ranks: n}
			var err error
			if parts[r], err = w.Shard(s); err != nil {
				t.Fatal(err)
			}
			specs, err := Specs(micro, s)
			if err != nil {
				t.Fatal(err)
			}
			loaded, err := LoadShard(dir, s)
			if err != nil {
				t.Fatal(err)
			}
			if loaded.Part != s || parts[r].Part != s {
				t.Errorf("%s: parts %v and %v", s, loaded.Part, parts[r].Part)
			}
			for i, tn := range parts[r].Tensors {
				if !slices.Equal(tn.Shape, specs[i].Shape) || int64(len(tn.Data)) != 4*specs[i].Elements() {
					t.Fatalf("%s: %s has shape %v (%d bytes), Specs says %v", s, tn.Name, tn.Shape, len(tn.Data), specs[i].Shape)
				}
				if !slices.Equal(loaded.Tensors[i].Data, tn.Data) {
					t.Fatalf("%s: %s loaded differs from sliced", s, tn.Name)
				}
			}
		}
		for i, whole := range w.Tensors {
			var got []byte
			split, groups := splitOf(whole.Name)
			switch split {
			case Replicated:
				for r := range n {
					if !slices.Equal(parts[r].Tensors[i].Data, whole.Data) {
						t.Fatalf("%d ranks: replicated %s differs on rank %d", n, whole.Name, r)
					}
				}
				continue
			case Rows:
				for r := range n {
					got = append(got, parts[r].Tensors[i].Data...)
				}
			case Columns:
				cols := whole.Shape[len(whole.Shape)-1]
				part := cols / int64(groups) / int64(n)
				for row := range (int64(len(whole.Data)) / 4) / cols {
					for g := range int64(groups) {
						for r := range n {
							from := 4 * (row*int64(groups) + g) * part
							got = append(got, parts[r].Tensors[i].Data[from:from+4*part]...)
						}
					}
				}
			}
			if !slices.Equal(got, whole.Data) {
				t.Fatalf("%d ranks: %s (%s) put back together differs from the whole", n, whole.Name, split)
			}
		}
		if _, err := parts[0].Shard(Shard{Rank: 0, Ranks: 2}); err == nil {
			t.Errorf("a shard was split again")
		}
	}
	for _, s := range []Shard{{Rank: 0, Ranks: 3}, {Rank: 2, Ranks: 2}, {Rank: -1, Ranks: 2}} {
		if _, err := w.Shard(s); !errors.Is(err, ErrTensorParallel) {
			t.Errorf("%+v: %v, want ErrTensorParallel", s, err)
		}
		if _, err := LoadShard(dir, s); !errors.Is(err, ErrTensorParallel) {
			t.Errorf("LoadShard %+v: %v, want ErrTensorParallel", s, err)
		}
	}
}

// TestTensorParallelMatchesWholeModel runs prompts through the prefill
// step and then decode steps (rows holding different sequences, one
// inactive, then joining) on 2 and 4 ranks of one sim, each rank with its
// heads' caches: every rank's logits are the same, bit for bit (the
// all-reduce gives every rank the same sums), and equal the whole model's
// step on one device within 1e-4 (the projections' sums are added in
// another order).
func TestTensorParallelMatchesWholeModel(t *testing.T) {
	w := microWeights(t)
	prompts := [][]int32{{5, 17, 3, 90, 44, 2}, {61}, {8, 8, 8, 1, 96}}
	const maxPos, steps = 16, 3
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("%d ranks", n), func(t *testing.T) {
			b := simtest.New(t, n)
			comms := commtest.Comms(t, b, n)
			type side struct {
				prefill, decode *stepRunner
				caches          []gpu.DevicePtr
			}
			newSide := func(w *Weights, st Step, dev int, bytes int64) side {
				pre, dec := st, st
				pre.Rows, pre.Caches = 4, SharedCache
				dec.Rows, dec.Caches = 3, RowCaches
				sd := side{prefill: newStepRunner(t, b, w, pre), decode: newStepRunner(t, b, w, dec)}
				for range prompts {
					sd.caches = append(sd.caches, simtest.Alloc(t, b, dev, uint64(bytes)))
				}
				return sd
			}
			whole := newSide(w, Step{Config: micro, MaxPositions: maxPos}, 0, micro.CacheBytes(maxPos))
			ranks := make([]side, n)
			for r := range n {
				s := Shard{Rank: r, Ranks: n}
				part, err := w.Shard(s)
				if err != nil {
					t.Fatal(err)
				}
				ranks[r] = newSide(part, Step{Config: micro, MaxPositions: maxPos, Comm: comms[r]}, r, s.CacheBytes(micro, maxPos))
				if got, want := ranks[r].decode.sp.Step.Shard, s; got != want {
					t.Fatalf("the step's shard is %+v, want %+v from its communicator", got, want)
				}
			}
			// compare runs one step on the whole model and on the ranks
			// (rows bound to the caches of seqs, -1 inactive) and checks
			// the rows of active sequences.
			compare := func(what string, pick func(sd side) *stepRunner, toks, pos []int32, seqs []int) {
				t.Helper()
				bound := func(sd side) []gpu.DevicePtr {
					var out []gpu.DevicePtr
					for _, q := range seqs {
						out = append(out, sd.caches[max(q, 0)])
					}
					return out
				}
				want := pick(whole).run(toks, pos, bound(whole))
				got := make([][][]float32, n)
				if err := perrank.Each(n, func(r int) error {
					var err error
					got[r], err = pick(ranks[r]).try(toks, pos, bound(ranks[r]))
					return err
				}); err != nil {
					t.Fatal(err)
				}
				for row, q := range seqs {
					if q < 0 || row >= len(toks) {
						continue
					}
					for r := range n {
						for v, x := range got[r][row] {
							if math.Float32bits(x) != math.Float32bits(got[0][row][v]) {
								t.Fatalf("%s: row %d logit %d: rank %d has %v, rank 0 %v", what, row, v, r, x, got[0][row][v])
							}
						}
					}
					for v, x := range want[row] {
						if d := math.Abs(float64(got[0][row][v]) - float64(x)); !(d <= 1e-4) {
							t.Fatalf("%s: row %d logit %d = %v on %d ranks, %v on one (off by %.3g)", what, row, v, got[0][row][v], n, x, d)
						}
					}
				}
			}
			seqs := make([][]int32, len(prompts))
			for i, pr := range prompts {
				for p0 := 0; p0 < len(pr); p0 += 4 {
					k := min(4, len(pr)-p0)
					pos := make([]int32, k)
					for j := range pos {
						pos[j] = int32(p0 + j)
					}
					compare("prefill", func(sd side) *stepRunner { return sd.prefill }, pr[p0:p0+k], pos, []int{i, i, i, i})
				}
				seqs[i] = slices.Clone(pr)
			}
			for step := range steps {
				order := []int{2, -1, 0}
				if step > 0 {
					order[1] = 1
				}
				var toks, pos []int32
				for _, q := range order {
					if q < 0 {
						toks, pos = append(toks, 0), append(pos, kernels.InactiveRow)
						continue
					}
					tok := int32((step*31 + q*7) % micro.Vocab)
					toks, pos = append(toks, tok), append(pos, int32(len(seqs[q])))
					seqs[q] = append(seqs[q], tok)
				}
				compare(fmt.Sprintf("decode step %d", step), func(sd side) *stepRunner { return sd.decode }, toks, pos, order)
			}
		})
	}
}
