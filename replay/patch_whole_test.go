package replay_test

import (
	"bytes"
	"context"
	"testing"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/internal/steptest"
	"github.com/stablegraph/stablegraph/workload"
)

// runMLPWith is steptest.RunMLP with options.
func runMLPWith(t *testing.T, w *steptest.MLP, opts sg.Options, move steptest.Movement, steps int) ([]steptest.Step, []byte) {
	t.Helper()
	b := simtest.New(t, 1)
	s := simtest.Stream(t, b, 0)
	ad := steptest.NewAddresser(t, b, steptest.ArenaFor(t, b, 64<<20, &opts), move, append(append([]sg.Buffer(nil), w.Params...), w.Outputs...), w)
	exe := steptest.Compile(t, b, w.P, opts)
	w.InitStates(t, exe)
	res := steptest.Run(t, exe, s, ad, steps, w.Outputs, nil)
	acc, err := exe.ReadBuffer(context.Background(), w.Acc)
	if err != nil {
		t.Fatal(err)
	}
	return res, acc
}

// TestPatchWholeGraphMatchesEager: with node updates priced above a
// whole-graph update, patch moves the step with whole-graph updates from
// its host template, one per moving step, never re-recording, and gives
// eager's bits for every movement; priced the other way, it patches node by
// node.
func TestPatchWholeGraphMatchesEager(t *testing.T) {
	const steps = 12
	w := steptest.NewMLP(4, 32, 3, 100, 6)
	for _, move := range steptest.Movements() {
		t.Run(string(move), func(t *testing.T) {
			want, wantAcc := runMLPWith(t, w, sg.Options{Strategy: sg.StrategyEager}, move, steps)
			for _, c := range []struct {
				name  string
				costs sg.Costs
				whole bool
			}{
				{"whole", sg.Costs{NodeUpdateUS: 100}, true},
				{"per node", sg.Costs{NodeUpdateUS: 0.01}, false},
			} {
				t.Run(c.name, func(t *testing.T) {
					got, gotAcc := runMLPWith(t, w, sg.Options{Strategy: sg.StrategyPatch, Costs: c.costs}, move, steps)
					for i := range got {
						for k := range got[i].Outs {
							if !bytes.Equal(got[i].Outs[k], want[i].Outs[k]) {
								t.Fatalf("step %d output %s differs from eager", i, w.Outputs[k].Name())
							}
						}
						last := got[i].Stats.Last
						if i == 0 {
							continue
						}
						if last.Rerecords != 0 {
							t.Errorf("step %d: %d re-records", i, last.Rerecords)
						}
						if wantUpd := int64(b2i(got[i].Moved && c.whole)); last.GraphUpdates != wantUpd {
							t.Errorf("step %d (moved %v): %d whole-graph updates, want %d", i, got[i].Moved, last.GraphUpdates, wantUpd)
						}
						if got[i].Moved != (last.PatchedNodes > 0) {
							t.Errorf("step %d: moved=%v but %d nodes moved", i, got[i].Moved, last.PatchedNodes)
						}
					}
					if !bytes.Equal(gotAcc, wantAcc) {
						t.Fatal("final state differs from eager")
					}
				})
			}
		})
	}
}

// TestPatchDefaultCostsChooseWhole: with the default costs (BENCHMARKS.md,
// "Costs from the H200 run") patch takes one whole-graph update from its
// template where most nodes of the graph move (chain-moving: every node
// points into a moving buffer) and per-node updates where few do (mlp,
// train: the first and last layers; chain: its ends), every step, and
// gives eager's bits either way.
func TestPatchDefaultCostsChooseWhole(t *testing.T) {
	const steps = 8
	for _, c := range []struct {
		name  string
		cfg   workload.Config
		whole bool
	}{
		{"chain-moving", workload.Config{K: 64, N: 64}, true},
		{"chain", workload.Config{K: 64, N: 64}, false},
		{"mlp", workload.Config{Layers: 4, Width: 32, Batch: 4}, false},
		{"train", workload.Config{Layers: 4, Width: 32, Batch: 4}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := steptest.MustWorkload(t, c.name, c.cfg)
			b := simtest.New(t, 1)
			want := steptest.RunWorkload(t, b, w, sg.Options{Strategy: sg.StrategyEager}, workload.Random, steps, false)
			got := steptest.RunWorkload(t, b, w, sg.Options{Strategy: sg.StrategyPatch}, workload.Random, steps, false)
			steptest.SameResults(t, got, want)
			// From the third step on: the first records, the second proves
			// the traced commands' templates.
			for i, st := range got.Steps[2:] {
				last := st.Stats.Last
				if last.PatchedNodes == 0 || last.Rerecords != 0 || (last.GraphUpdates == 1) != c.whole || last.GraphUpdates > 1 {
					t.Fatalf("step %d: %d nodes moved, %d whole-graph updates, %d re-records; want a whole-graph update: %v",
						i+2, last.PatchedNodes, last.GraphUpdates, last.Rerecords, c.whole)
				}
			}
		})
	}
}
