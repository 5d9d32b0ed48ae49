package replay_test

import (
	"bytes"
	"context"
	"testing"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/internal/steptest"
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
