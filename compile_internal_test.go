package stablegraph

import (
	"math/rand/v2"
	"testing"

	"github.com/stablegraph/stablegraph/kernels"
)

// TestPlanTempsNeverOverlapsLiveTemps checks the temp planner on random
// programs: temps whose lifetimes overlap never share bytes, every offset is
// aligned, and the arena is no larger than the temps laid end to end.
func TestPlanTempsNeverOverlapsLiveTemps(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	for iter := 0; iter < 300; iter++ {
		p := NewProgram("plan")
		ntemps := 1 + r.IntN(12)
		var temps []Buffer
		for i := 0; i < ntemps; i++ {
			temps = append(temps, p.Temp("t", int64(1+r.IntN(5000))))
		}
		ncmds := 1 + r.IntN(20)
		for c := 0; c < ncmds; c++ {
			var args []Arg
			for range 1 + r.IntN(3) {
				args = append(args, InOut(temps[r.IntN(ntemps)].All()))
			}
			p.cmds = append(p.cmds, cmdDecl{kind: cmdTrace, args: args})
		}
		const align = 256
		plan := planTemps(p.bufs, p.cmds, align, true)
		life := map[int][2]int{}
		for i, c := range p.cmds {
			for _, a := range c.args {
				id := a.slice.buf.id
				l, ok := life[id]
				if !ok {
					l = [2]int{i, i}
				}
				l[1] = i
				life[id] = l
			}
		}
		if len(plan.off) != len(life) {
			t.Fatalf("planned %d temps, %d are used", len(plan.off), len(life))
		}
		var used uint64
		for a, la := range life {
			offA, sizeA := plan.off[a], uint64(p.bufs[a].size)
			used += (sizeA + align - 1) / align * align
			if offA%align != 0 || offA+sizeA > plan.size {
				t.Fatalf("temp %d at %d+%d in an arena of %d", a, offA, sizeA, plan.size)
			}
			for b, lb := range life {
				if a == b || la[1] < lb[0] || lb[1] < la[0] {
					continue
				}
				offB, sizeB := plan.off[b], uint64(p.bufs[b].size)
				if offA < offB+sizeB && offB < offA+sizeA {
					t.Fatalf("iteration %d: temps %d %v and %d %v are live together and overlap: [%d,%d) [%d,%d)",
						iter, a, la, b, lb, offA, offA+sizeA, offB, offB+sizeB)
				}
			}
		}
		if plan.size > plan.unshared || plan.unshared != used {
			t.Fatalf("arena %d, unshared %d, sum %d", plan.size, plan.unshared, used)
		}
	}
}

// TestAnalyseFlow checks how the step's use of each buffer is read from
// its commands: written, read before written, written in full.
func TestAnalyseFlow(t *testing.T) {
	p := NewProgram("flow")
	in := p.Param("in", 64)        // read: copy in
	wp := p.Param("wp", 64)        // written in full, then read: no copy in, copy out
	out := p.Output("out", 64)     // written in full
	rf := p.Output("rf", 64)       // read, then written
	part := p.Output("part", 64)   // written in two halves: full
	half := p.Output("half", 64)   // written in one half: not full
	gap := p.Output("gap", 64)     // half written, then the other half read
	inout := p.Output("inout", 64) // InOut first: read first
	p.Memcpy(wp.All(), in.All())
	p.Memcpy(out.All(), wp.All())
	p.Memcpy(in.Slice(0, 0), out.Slice(0, 0)) // empty slices count for nothing
	p.Memcpy(rf.All(), rf.All())
	p.Memcpy(part.Slice(32, 32), in.Slice(0, 32))
	p.Memcpy(part.Slice(0, 32), in.Slice(32, 32))
	p.Memcpy(half.Slice(0, 32), in.Slice(0, 32))
	p.Memcpy(gap.Slice(0, 32), in.Slice(0, 32))
	p.Memcpy(out.Slice(0, 32), gap.Slice(32, 32))
	p.Launch(kernels.Axpy, kernels.Elementwise(16), InOut(inout.All()), In(in.All()), F32(1), I32(16))
	flow := analyseFlow(p.bufs, p.cmds)
	for _, c := range []struct {
		b                      Buffer
		written, readFirst, ok bool
	}{
		{in, false, true, false},
		{wp, true, false, true},
		{out, true, false, true},
		{rf, true, true, true},
		{part, true, false, true},
		{half, true, false, false},
		{gap, true, true, false},
		{inout, true, true, true},
	} {
		f := flow[c.b.id]
		if f.Written != c.written || f.ReadFirst != c.readFirst || f.Full != c.ok {
			t.Errorf("%s: %+v; want written=%v readFirst=%v full=%v", c.b.Name(), f, c.written, c.readFirst, c.ok)
		}
	}
	if !flow[half.id].NeedsCopyIn(true) || flow[part.id].NeedsCopyIn(true) || flow[wp.id].NeedsCopyIn(true) || !flow[in.id].NeedsCopyIn(false) {
		t.Error("NeedsCopyIn is wrong")
	}
}
