package replay_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/internal/steptest"
	"github.com/stablegraph/stablegraph/kernels"
)

// aliasVariants are the option sets the aliasing test runs: every
// strategy, and the persistent-address ones with copies on the stream, one
// and three pool slots, and auto deciding by its model.
func aliasVariants() []struct {
	name string
	opts stablegraph.Options
} {
	var v []struct {
		name string
		opts stablegraph.Options
	}
	add := func(name string, opts stablegraph.Options) {
		v = append(v, struct {
			name string
			opts stablegraph.Options
		}{name, opts})
	}
	for _, st := range stablegraph.Strategies()[1:] {
		if st == stablegraph.StrategyRemap {
			// remap maps the caller's own memory and refuses what it
			// cannot map (remap_test.go), overlaps included.
			continue
		}
		add(string(st), stablegraph.Options{Strategy: st})
	}
	add("stable-stream-copies", stablegraph.Options{Strategy: stablegraph.StrategyStable, StrategyOptions: stablegraph.StrategyOptions{Copies: stablegraph.CopyOptions{OnStream: true}}})
	add("pool-1", stablegraph.Options{Strategy: stablegraph.StrategyPool, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: 1}}})
	add("pool-3", stablegraph.Options{Strategy: stablegraph.StrategyPool, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: 3}}})
	add("pool-2-stream-copies", stablegraph.Options{Strategy: stablegraph.StrategyPool, StrategyOptions: stablegraph.StrategyOptions{Copies: stablegraph.CopyOptions{OnStream: true}}})
	add("auto-model", stablegraph.Options{Strategy: stablegraph.StrategyAuto, StrategyOptions: stablegraph.StrategyOptions{Auto: stablegraph.AutoOptions{ProbeSteps: -1}}})
	return v
}

// TestAliasedBindingsMatchEager binds outputs onto params and onto one
// another (in place, two outputs on one address, partial overlaps, all
// together) under every strategy and every movement of the caller's memory
// (fixed, ping-pong, fresh addresses every step), and demands after every
// step the caller's whole region and the state equal to eager's bit for
// bit. Stable and pool must run the aliased steps over copies laid out as
// the caller's (Counters.AliasedSteps), and the steps whose buffers do not
// overlap (or overlap only read) over their own.
func TestAliasedBindingsMatchEager(t *testing.T) {
	const n = 64
	// Enough for auto to probe its three candidates and run the one kept.
	const steps = 18
	a := steptest.NewAlias(n)
	for _, c := range steptest.AliasCases(n) {
		t.Run(c.Name, func(t *testing.T) {
			for _, move := range steptest.Movements() {
				t.Run(string(move), func(t *testing.T) {
					b := simtest.New(t, 1)
					s := simtest.Stream(t, b, 0)
					want := steptest.RunAlias(t, b, s, a, c, stablegraph.Options{Strategy: stablegraph.StrategyEager}, move, steps)
					for _, v := range aliasVariants() {
						t.Run(v.name, func(t *testing.T) {
							got := steptest.RunAlias(t, b, s, a, c, v.opts, move, steps)
							steptest.SameAlias(t, fmt.Sprintf("%s %s %s", c.Name, move, v.name), got, want)
							checkAliasStats(t, c, move, v.opts, got)
						})
					}
				})
			}
		})
	}
}

// checkAliasStats checks that stable and pool ran each step over the layout
// its bindings call for, recording an aliased layout's graph once per set
// of copies when the placement repeats.
func checkAliasStats(t *testing.T, c steptest.AliasCase, move steptest.Movement, opts stablegraph.Options, got []steptest.AliasStep) {
	t.Helper()
	for i, st := range got {
		ran := st.Stats.Ran
		copies := ran == stablegraph.StrategyStable || ran == stablegraph.StrategyPool
		want := int64(0)
		if copies && c.Hazard {
			want = 1
		}
		if st.Stats.Last.ProbeSteps > 0 {
			want = 0 // auto measuring a candidate: its work counts nowhere
		}
		if st.Stats.Last.AliasedSteps != want {
			t.Fatalf("step %d ran %s: %d aliased steps, want %d", i, ran, st.Stats.Last.AliasedSteps, want)
		}
		if last := st.Stats.Last; last.Rerecords != last.MoveRerecords+last.UpdateFallbacks+last.RetryRerecords {
			t.Fatalf("step %d: %d re-records unexplained by %+v", i, last.Rerecords, last)
		}
	}
	final := got[len(got)-1].Stats
	switch opts.Strategy {
	case stablegraph.StrategyStable:
		// One layout per placement: the region's alignment is the same at
		// every address the arena hands out, so every step has the same
		// layout and one graph is recorded, whatever moves.
		if final.Records != 1 || final.Rerecords != 0 {
			t.Errorf("stable recorded %d graphs (%d re-records), want 1", final.Records, final.Rerecords)
		}
	case stablegraph.StrategyPool:
		slots := int64(opts.Pool.Slots)
		if slots == 0 {
			slots = 2 // the default
		}
		if final.Records != slots || final.Rerecords != 0 {
			t.Errorf("pool recorded %d graphs (%d re-records), want one per slot (%d)", final.Records, final.Rerecords, slots)
		}
	}
	if mem := got[len(got)-1].Stats; opts.Strategy == stablegraph.StrategyStable && c.Hazard && mem.AliasedSteps != int64(len(got)) {
		t.Errorf("stable ran %d aliased steps of %d", mem.AliasedSteps, len(got))
	}
}

// TestAliasedParamsMatchEager: a param the step writes (in place) bound
// over another param read after it, under every strategy and with pool's
// zero-copy outputs, whose leased outputs move within the slot when its
// copies are laid out as the caller's: the outputs and the caller's param
// memory equal eager's after every step.
func TestAliasedParamsMatchEager(t *testing.T) {
	ctx := context.Background()
	const n = 16
	p := stablegraph.NewProgram("written-param")
	x, x2, y := p.Param("x", 4*n), p.Param("x2", 4*n), p.Output("y", 4*n)
	p.Launch(kernels.Axpb, kernels.Elementwise(n), stablegraph.Out(x.All()), stablegraph.In(x.All()), stablegraph.F32(2), stablegraph.F32(1), stablegraph.I32(n))
	p.Launch(kernels.Axpb, kernels.Elementwise(n), stablegraph.Out(y.All()), stablegraph.In(x2.All()), stablegraph.F32(3), stablegraph.F32(0), stablegraph.I32(n))
	run := func(t *testing.T, b gpu.Backend, opts stablegraph.Options) (ys, xs [][]byte) {
		s := simtest.Stream(t, b, 0)
		mem := [2]gpu.DevicePtr{simtest.Alloc(t, b, 0, 8*n), simtest.Alloc(t, b, 0, 8*n)}
		exe := steptest.Compile(t, b, p, opts)
		for i := range 6 {
			m := mem[i%2]
			simtest.Upload(t, b, m, steptest.RandF32(steptest.NewRand(uint64(i)), 2*n, 1))
			// x2 is x's second half on even steps, x itself on odd ones.
			bind := stablegraph.Bindings{x: m, x2: m.Add(uint64(4 * n / 2 * (1 - i%2))), y: simtest.Alloc(t, b, 0, 4*n)}
			outs, err := exe.Run(ctx, s, bind)
			if err != nil {
				t.Fatal(err)
			}
			got, err := exe.ReadOutput(ctx, outs, y)
			if err != nil {
				t.Fatal(err)
			}
			outs.Release()
			ys = append(ys, got)
			xs = append(xs, gpu.F32ToBytes(simtest.Download(t, b, m, 2*n)))
		}
		if err := b.StreamSynchronize(s); err != nil {
			t.Fatal(err)
		}
		return ys, xs
	}
	b := simtest.New(t, 1)
	wantY, wantX := run(t, b, stablegraph.Options{Strategy: stablegraph.StrategyEager})
	variants := aliasVariants()
	variants = append(variants, struct {
		name string
		opts stablegraph.Options
	}{"pool-zero-copy", stablegraph.Options{Strategy: stablegraph.StrategyPool, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{ZeroCopyOutputs: true}}}})
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			gotY, gotX := run(t, b, v.opts)
			for i := range wantY {
				if !bytes.Equal(gotY[i], wantY[i]) || !bytes.Equal(gotX[i], wantX[i]) {
					t.Fatalf("step %d differs from eager", i)
				}
			}
		})
	}
}
