package stablegraph_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/bfc"
	"github.com/stablegraph/stablegraph/gpu"
)

type movement string

const (
	fixed    movement = "fixed"
	pingpong movement = "pingpong"
	random   movement = "random"
)

// addresser hands out the params' and outputs' memory for each step from a
// bfc allocator, moving them as the movement says.
type addresser struct {
	t      testing.TB
	a      *bfc.Allocator
	move   movement
	bufs   []stablegraph.Buffer
	sets   []stablegraph.Bindings // fixed and pingpong
	prev   stablegraph.Bindings   // random: the last step's, freed after it
	spacer []gpu.DevicePtr        // random: held allocations that shift the next ones
	r      *rand.Rand
}

func newAddresser(t testing.TB, a *bfc.Allocator, move movement, bufs []stablegraph.Buffer) *addresser {
	ad := &addresser{t: t, a: a, move: move, bufs: bufs, r: rand.New(rand.NewPCG(7, 7))}
	nsets := map[movement]int{fixed: 1, pingpong: 2}[move]
	for range nsets {
		ad.sets = append(ad.sets, ad.alloc())
	}
	return ad
}

func (ad *addresser) alloc() stablegraph.Bindings {
	b := stablegraph.Bindings{}
	for _, buf := range ad.bufs {
		p, err := ad.a.Alloc(uint64(buf.Size()))
		if err != nil {
			ad.t.Fatal(err)
		}
		b[buf] = p
	}
	return b
}

func (ad *addresser) free(b stablegraph.Bindings) {
	for _, p := range b {
		if err := ad.a.Free(p); err != nil {
			ad.t.Fatal(err)
		}
	}
}

// next returns the bindings of step i; the previous step must be complete.
func (ad *addresser) next(i int) stablegraph.Bindings {
	if ad.move != random {
		return ad.sets[i%len(ad.sets)]
	}
	if ad.prev != nil {
		ad.free(ad.prev)
	}
	// Churn the allocator: free some spacers, add some, so best fit lands
	// the step's buffers somewhere new.
	for j := 0; j < len(ad.spacer); j++ {
		if ad.r.IntN(2) == 0 {
			if err := ad.a.Free(ad.spacer[j]); err != nil {
				ad.t.Fatal(err)
			}
			ad.spacer = append(ad.spacer[:j], ad.spacer[j+1:]...)
			j--
		}
	}
	for range 1 + ad.r.IntN(3) {
		p, err := ad.a.Alloc(uint64(256 * (1 + ad.r.IntN(64))))
		if err != nil {
			ad.t.Fatal(err)
		}
		ad.spacer = append(ad.spacer, p)
	}
	ad.prev = ad.alloc()
	return ad.prev
}

func (ad *addresser) close() {
	for _, s := range ad.sets {
		ad.free(s)
	}
	if ad.prev != nil {
		ad.free(ad.prev)
	}
	for _, p := range ad.spacer {
		if err := ad.a.Free(p); err != nil {
			ad.t.Fatal(err)
		}
	}
}

// result is what one step produced.
type result struct {
	outs  [][]byte // per output, in w.outputs order
	stats stablegraph.Stats
	moved bool // some address differs from the step before
}

// runMLP runs steps of w with the strategy and movement and returns each
// step's outputs and the final accumulator state.
func runMLP(t *testing.T, b gpu.Backend, w *mlp, strategy stablegraph.Strategy, move movement, steps int) ([]result, []byte) {
	t.Helper()
	ctx := context.Background()
	s := newStream(t, b)
	a := newArena(t, b, 64<<20)
	exe, err := stablegraph.Compile(ctx, b, w.p, stablegraph.Options{Strategy: strategy})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := exe.Close(); err != nil {
			t.Error(err)
		}
	}()
	w.initStates(t, exe)
	ad := newAddresser(t, a, move, append(append([]stablegraph.Buffer(nil), w.params...), w.outputs...))
	defer ad.close()
	var res []result
	var last stablegraph.Bindings
	for i := range steps {
		bind := ad.next(i)
		moved := false
		for k, p := range bind {
			moved = moved || last[k] != p
		}
		last = maps(bind)
		for buf, data := range w.inputs(i) {
			if err := b.MemcpyHtoD(bind[buf], data); err != nil {
				t.Fatal(err)
			}
		}
		outs, err := exe.Run(ctx, s, bind)
		if err != nil {
			t.Fatalf("%s/%s step %d: %v", strategy, move, i, err)
		}
		r := result{stats: exe.Stats(), moved: moved}
		for _, o := range w.outputs {
			if outs.Addr(o) != bind[o] {
				t.Fatalf("output %s at %#x, bound at %#x", o.Name(), uint64(outs.Addr(o)), uint64(bind[o]))
			}
			data, err := exe.ReadOutput(ctx, outs, o)
			if err != nil {
				t.Fatal(err)
			}
			r.outs = append(r.outs, data)
		}
		res = append(res, r)
	}
	acc, err := exe.ReadBuffer(ctx, w.acc)
	if err != nil {
		t.Fatal(err)
	}
	return res, acc
}

func maps(b stablegraph.Bindings) stablegraph.Bindings {
	out := stablegraph.Bindings{}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// TestStrategiesMatchEager runs the MLP workload under every strategy and
// movement and demands every output of every step, and the final state,
// equal to eager's bit for bit.
func TestStrategiesMatchEager(t *testing.T) {
	// Enough for auto to probe its three candidates (14 steps) and then
	// run the one it kept.
	const steps = 18
	for _, move := range []movement{fixed, pingpong, random} {
		t.Run(string(move), func(t *testing.T) {
			b := newSim(t)
			w := newMLP(4, 32, 3, 100, 6)
			want, wantAcc := runMLP(t, b, w, stablegraph.StrategyEager, move, steps)
			for _, st := range stablegraph.Strategies()[1:] {
				t.Run(string(st), func(t *testing.T) {
					got, gotAcc := runMLP(t, b, w, st, move, steps)
					for i := range got {
						for k := range got[i].outs {
							if !bytes.Equal(got[i].outs[k], want[i].outs[k]) {
								t.Fatalf("step %d output %s differs from eager", i, w.outputs[k].Name())
							}
						}
					}
					if !bytes.Equal(gotAcc, wantAcc) {
						t.Fatal("final state differs from eager")
					}
					checkStats(t, st, move, got)
				})
			}
		})
	}
}

// checkStats asserts what each strategy should have done.
func checkStats(t *testing.T, st stablegraph.Strategy, move movement, res []result) {
	t.Helper()
	final := res[len(res)-1].stats
	if final.Steps != int64(len(res)) || final.GraphLaunches != int64(len(res)) {
		t.Errorf("steps %d, graph launches %d, want %d", final.Steps, final.GraphLaunches, len(res))
	}
	decided := false
	copied := res[0].stats.Last.BytesCopied // per step, by stable and pool
	for i, r := range res[1:] {
		i++
		last := r.stats.Last
		if r.stats.Probing {
			// Auto runs each candidate in turn, warm-ups included:
			// only the bits are checked (by the caller).
			continue
		}
		if st == stablegraph.StrategyAuto && !decided {
			// The step that runs the candidate kept: what moved is
			// relative to the step before, which another one ran; the
			// checks start at the next.
			decided, copied = true, last.BytesCopied
			if i < 2 || r.stats.Ran != r.stats.Strategy {
				t.Errorf("step %d: auto decided at once, or ran %s after choosing %s", i, r.stats.Ran, r.stats.Strategy)
			}
			continue
		}
		// Under auto, what the chosen strategy should have done.
		switch r.stats.Strategy {
		case stablegraph.StrategyRecord:
			if want := int64(b2i(r.moved)); last.Rerecords != want {
				t.Errorf("step %d: %d re-records, want %d", i, last.Rerecords, want)
			}
		case stablegraph.StrategyUpdate:
			if want := int64(b2i(r.moved)); last.GraphUpdates != want || last.Rerecords != 0 {
				t.Errorf("step %d: %d updates and %d re-records, want %d and 0", i, last.GraphUpdates, last.Rerecords, want)
			}
		case stablegraph.StrategyPatch:
			if last.Rerecords != 0 || last.GraphUpdates != 0 {
				t.Errorf("step %d: %d re-records, %d updates under patch", i, last.Rerecords, last.GraphUpdates)
			}
			if r.moved != (last.PatchedNodes > 0) {
				t.Errorf("step %d: moved=%v but %d nodes patched", i, r.moved, last.PatchedNodes)
			}
			// Every traced command on sim is patchable: after the first
			// step nothing is ever captured again, whatever moves.
			if last.TracesCaptured != 0 {
				t.Errorf("step %d: %d traces captured under patch", i, last.TracesCaptured)
			}
		case stablegraph.StrategyStable, stablegraph.StrategyPool:
			// The body is recorded once (per pool slot, at its first
			// use) and never patched; only copy nodes follow the caller.
			firstUse := r.stats.Strategy == stablegraph.StrategyPool && i < 2
			if !firstUse && (last.Records != 0 || last.TracesCaptured != 0) {
				t.Errorf("step %d: %d records, %d traces captured", i, last.Records, last.TracesCaptured)
			}
			if last.Rerecords != 0 || last.PatchedNodes != 0 || last.GraphUpdates != 0 || last.BytesCopied != copied || copied == 0 {
				t.Errorf("step %d: %d re-records, %d patched, %d updates, %d bytes copied (first step: %d)", i,
					last.Rerecords, last.PatchedNodes, last.GraphUpdates, last.BytesCopied, copied)
			}
			if r.stats.Strategy == stablegraph.StrategyStable && r.moved != (last.CopyNodeUpdates != 0) {
				t.Errorf("step %d: moved=%v but %d copy nodes updated", i, r.moved, last.CopyNodeUpdates)
			}
			// A pool slot compares with its own last step: with two
			// slots and ping-pong, each slot always sees the same set.
			if r.stats.Strategy == stablegraph.StrategyPool && move != random && last.CopyNodeUpdates != 0 {
				t.Errorf("step %d: %d copy nodes updated under pool with %s buffers", i, last.CopyNodeUpdates, move)
			}
			if pool := r.stats.Strategy == stablegraph.StrategyPool; pool != (last.TimelineWrites == 1) {
				t.Errorf("step %d: %d timeline writes under %s", i, last.TimelineWrites, r.stats.Strategy)
			}
		}
		// With ping-pong, every traced command's address sets repeat from
		// the third step on: all cache hits, nothing captured.
		if move == pingpong && i >= 2 && (last.TracesCaptured != 0 || last.TraceCacheMisses != 0 || last.TracesSynthesized != 0) {
			t.Errorf("step %d (%s, ping-pong): %d captured, %d misses, %d synthesized; want 0",
				i, st, last.TracesCaptured, last.TraceCacheMisses, last.TracesSynthesized)
		}
	}
	if st == stablegraph.StrategyAuto && (!decided || final.Probing) {
		t.Errorf("auto still probing after %d steps", len(res))
	}
	if testing.Verbose() {
		fmt.Printf("%-7s %-8s %+v\n", st, move, final.Counters)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
