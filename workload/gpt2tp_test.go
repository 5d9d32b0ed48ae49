package workload

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/commtest"
	"github.com/stablegraph/stablegraph/internal/perrank"
	"github.com/stablegraph/stablegraph/internal/safetensors"
	"github.com/stablegraph/stablegraph/models/gpt2"
	"github.com/stablegraph/stablegraph/report"
)

// tpShape is gpt2-decode-tiny (4 heads, d 64) with one layer and five
// sequences, so that swap moves one row a step: small enough for four
// ranks under the race detector.
var tpShape = Config{Layers: 1, Batch: 5, Seed: 3}

// dumpLogits runs three steps of w under pattern and returns the last
// step's logits and the sequence in each row, from Run's dump.
func dumpLogits(ctx context.Context, b gpu.Backend, w *Workload, pattern Pattern, path string) ([]float32, []int32, error) {
	if _, err := Run(ctx, b, w, RunOptions{Steps: 3, Warmup: 1, Pattern: pattern, Dump: path, WallBatches: -1}); err != nil {
		return nil, nil, err
	}
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	logits, err := f.ReadTensor("logits")
	if err != nil {
		return nil, nil, err
	}
	seqs, err := f.ReadTensor("sequences")
	if err != nil {
		return nil, nil, err
	}
	return gpu.BytesToF32(logits.Data), readI32s(seqs.Data), nil
}

// TestGPT2TensorParallel runs gpt2-decode tensor parallel on 2 and 4 ranks
// joined as separate processes would be (each its own sim, the
// all-reduces across the rendezvous over loopback), with the caches
// swapped between rows every step and moved to fresh addresses every step:
//
//   - every rank's logits after three steps equal the single-rank step's
//     within 1e-4 (float32 reassociation of the projections' sums), and
//     are the same bits on every rank;
//   - the bench of every strategy matches eager on every rank, and no
//     strategy captures a collective in steady state (the all-reduces are
//     over a temp that never moves; the caches do).
func TestGPT2TensorParallel(t *testing.T) {
	for _, world := range []int{2, 4} {
		t.Run(fmt.Sprintf("%d ranks", world), func(t *testing.T) {
			if world == 4 && testing.Short() {
				t.Skip("four ranks")
			}
			ctx := context.Background()
			dir := t.TempDir()
			single := tinyGPT2(t, tpShape)
			want, wantSeqs, err := dumpLogits(ctx, openSim(t), single, Swap, filepath.Join(dir, "single.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			ranks := joinProcesses(t, world)
			ws := make([]*Workload, world)
			for r := range world {
				cfg := tpShape
				cfg.Comm = ranks[r].Comm
				if ws[r], err = New("gpt2-decode-tiny", cfg); err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(ws[r].Desc, fmt.Sprintf("tensor-parallel rank %d of %d: %d heads", r, world, 4/world)) {
					t.Errorf("rank %d: %s", r, ws[r].Desc)
				}
				if got, whole := ws[r].gpt2.cacheFloats(), single.gpt2.cacheFloats(); got*int64(world) != whole {
					t.Errorf("rank %d: a cache of %d floats, the whole model's %d over %d ranks", r, got, whole, world)
				}
			}
			got := make([][]float32, world)
			seqs := make([][]int32, world)
			if err := perrank.Each(world, func(r int) error {
				var err error
				got[r], seqs[r], err = dumpLogits(ctx, ranks[r].Backend, ws[r], Swap, filepath.Join(dir, fmt.Sprintf("rank%d.safetensors", r)))
				return err
			}); err != nil {
				t.Fatal(err)
			}
			var worst float64
			for r := range world {
				if fmt.Sprint(seqs[r]) != fmt.Sprint(wantSeqs) {
					t.Fatalf("rank %d's rows hold sequences %v, the single rank's %v", r, seqs[r], wantSeqs)
				}
				for i, x := range got[r] {
					if math.Float32bits(x) != math.Float32bits(got[0][i]) {
						t.Fatalf("logit %d: rank %d has %v, rank 0 %v", i, r, x, got[0][i])
					}
					d := math.Abs(float64(x) - float64(want[i]))
					if !(d <= 1e-4) {
						t.Fatalf("rank %d: logit %d = %v, the single-rank step's %v", r, i, x, want[i])
					}
					worst = max(worst, d)
				}
			}
			t.Logf("%d ranks: max |tensor-parallel - single-rank logits| = %.3g", world, worst)
			if worst == 0 {
				t.Logf("no difference at all: the reassociation happened to be exact")
			}

			patterns := []Pattern{Random}
			if world == 2 {
				patterns = append(patterns, Swap)
			}
			for _, pat := range patterns {
				reps := make([]*report.Report, world)
				if err := perrank.Each(world, func(r int) error {
					o := RunOptions{Steps: 3, Warmup: 1, Pattern: pat, WallBatches: 1, WallBatchSize: 2}
					watch := WatchCollectives(ws[r].Comm, &o)
					rep, err := Bench(ctx, ranks[r].Backend, ws[r], nil, o)
					if err != nil {
						return fmt.Errorf("rank %d, %s: %w", r, pat, err)
					}
					watch.Annotate(rep)
					reps[r] = rep
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				wantRankReports(t, reps)
			}
		})
	}
}

// TestGPT2TensorParallelRejects: heads that do not split over the ranks
// are refused when the workload is built, naming both; a communicator of
// one rank is the whole model, with no collective.
func TestGPT2TensorParallelRejects(t *testing.T) {
	comms := commtest.Comms(t, openSimN(t, 3, time.Minute), 3)
	_, err := New("gpt2-decode-tiny", Config{Comm: comms[0]})
	if !errors.Is(err, gpt2.ErrTensorParallel) || !strings.Contains(err.Error(), "4 heads do not split over 3 ranks") {
		t.Fatalf("heads 4 over 3 ranks: %v", err)
	}
	one := commtest.Comms(t, openSimN(t, 1, time.Minute), 1)
	w, err := New("gpt2-decode-tiny", Config{Comm: one[0]})
	if err != nil {
		t.Fatal(err)
	}
	if w.Comm != nil || strings.Contains(w.Desc, "tensor-parallel") {
		t.Errorf("one rank: comm %v, %s", w.Comm, w.Desc)
	}
}
