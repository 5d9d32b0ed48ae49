package stablegraph

import (
	"context"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/kernels"
)

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
		if f.written != c.written || f.readFirst != c.readFirst || f.full != c.ok {
			t.Errorf("%s: %+v; want written=%v readFirst=%v full=%v", c.b.Name(), f, c.written, c.readFirst, c.ok)
		}
	}
	if !flow[half.id].needsCopyIn(true) || flow[part.id].needsCopyIn(true) || flow[wp.id].needsCopyIn(true) || !flow[in.id].needsCopyIn(false) {
		t.Error("needsCopyIn is wrong")
	}
}

// BenchmarkSlotAcquireRelease measures the host side of taking a pool slot
// and handing it back: acquire (the least recently used slot not leased,
// its timeline point checked without synchronising), a zero-copy lease
// taken and released, as a step does around its launch. The device work
// is not included (see BenchmarkStep and BenchmarkPoolStep for that).
func BenchmarkSlotAcquireRelease(b *testing.B) {
	for _, n := range []int{1, 2, 3} {
		b.Run(map[int]string{1: "slots=1", 2: "slots=2", 3: "slots=3"}[n], func(b *testing.B) {
			be, err := sim.New(gpu.Config{})
			if err != nil {
				b.Fatal(err)
			}
			defer be.Close()
			p := NewProgram("bench")
			x := p.Param("x", 256)
			y := p.Output("y", 256)
			p.Launch(kernels.Copy, kernels.Elementwise(64), Out(y.All()), In(x.All()), I32(64))
			exe, err := Compile(context.Background(), be, p, Options{Strategy: StrategyPool, PoolSlots: n, ZeroCopyOutputs: true})
			if err != nil {
				b.Fatal(err)
			}
			defer exe.Close()
			pl := exe.mu.strat.(*pool)
			exe.mu.Lock()
			defer exe.mu.Unlock()
			for b.Loop() {
				if pl.acquire() != nil {
					b.Fatal("no slot ready")
				}
				slot := pl.next
				pl.next = nil
				pl.uses++
				slot.used = pl.uses
				pl.leases.Lock()
				slot.leased = true
				pl.leases.Unlock()
				l := &lease{p: pl, slot: slot}
				l.release()
			}
		})
	}
}
