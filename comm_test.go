package stablegraph_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/bfc"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/commtest"
	"github.com/stablegraph/stablegraph/internal/perrank"
	"github.com/stablegraph/stablegraph/internal/steptest"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/remappable"
)

// newSimN opens a sim of n devices with a short communicator timeout and
// checks at cleanup that everything was released.
func newSimN(t testing.TB, n int) *sim.Backend {
	t.Helper()
	b, err := sim.New(sim.Config{Devices: n, DeviceMemory: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	b.SetCommTimeout(10 * time.Second)
	t.Cleanup(func() {
		if live := b.LiveHandles(); !live.IsZero() {
			t.Errorf("handles live at the end of the test: %s", live)
		}
		if err := b.Close(); err != nil {
			t.Errorf("close sim: %v", err)
		}
	})
	return b
}

// collProg is one rank's program using every collective: over a moving
// param x of world·n floats into outputs, in place over a state and a temp.
type collProg struct {
	p                     *stablegraph.Program
	x                     stablegraph.Buffer
	sum, rs, ag, bc, ag2  stablegraph.Buffer
	acc                   stablegraph.Buffer
	outs                  []stablegraph.Buffer
	world, rank, n, root  int
	accData               []float32
	inputsOf              func(step, rank int) []float32
	commStatsBefore       stablegraph.CommStats
	comm                  *stablegraph.Comm
	steadyCapturesAllowed bool
}

func newCollProg(c *stablegraph.Comm, n int) *collProg {
	w, r := c.Size(), c.Rank()
	cp := &collProg{world: w, rank: r, n: n, root: w - 1, comm: c}
	p := stablegraph.NewProgram(fmt.Sprintf("collectives rank %d", r))
	cp.p = p
	all := int64(4 * w * n)
	blk := int64(4 * n)
	cp.x = p.Param("x", all)
	cp.sum = p.Output("sum", all)
	cp.rs = p.Output("rs", blk)
	cp.ag = p.Output("ag", all)
	cp.bc = p.Output("bc", all)
	cp.ag2 = p.Output("ag2", all)
	cp.acc = p.State("acc", all)
	tmp := p.Temp("t", all)
	p.AllReduce(c, cp.x.All(), cp.sum.All(), gpu.Float32, gpu.Sum)
	p.ReduceScatter(c, cp.x.All(), cp.rs.All(), gpu.Float32, gpu.Sum)
	p.AllGather(c, cp.x.Slice(0, blk), cp.ag.All(), gpu.Float32)
	p.Broadcast(c, cp.x.All(), cp.bc.All(), gpu.Float32, cp.root)
	// acc = max over ranks of (acc + x), in place.
	p.Launch(kernels.Axpy, kernels.Elementwise(w*n), stablegraph.InOut(cp.acc.All()), stablegraph.In(cp.x.All()),
		stablegraph.F32(1), stablegraph.I32(int32(w*n)))
	p.AllReduce(c, cp.acc.All(), cp.acc.All(), gpu.Float32, gpu.Max)
	// In-place all-gather through a temp: x's first block into t's block r.
	p.Memcpy(tmp.Slice(int64(r)*blk, blk), cp.x.Slice(0, blk))
	p.AllGather(c, tmp.Slice(int64(r)*blk, blk), tmp.All(), gpu.Float32)
	p.Memcpy(cp.ag2.All(), tmp.All())
	cp.outs = []stablegraph.Buffer{cp.sum, cp.rs, cp.ag, cp.bc, cp.ag2}
	cp.accData = make([]float32, w*n)
	cp.inputsOf = func(step, rank int) []float32 {
		return steptest.RandF32(rand.New(rand.NewPCG(uint64(step), uint64(rank))), w*n, 1)
	}
	return cp
}

// want returns the expected outputs of step, and advances the expected acc.
func (cp *collProg) want(step int) [][]float32 {
	w, n := cp.world, cp.n
	xs := make([][]float32, w)
	for r := range xs {
		xs[r] = cp.inputsOf(step, r)
	}
	sum := slices.Clone(xs[0])
	for r := 1; r < w; r++ {
		for i := range sum {
			sum[i] += xs[r][i]
		}
	}
	var ag []float32
	for r := range w {
		ag = append(ag, xs[r][:n]...)
	}
	acc := make([]float32, w*n)
	for i := range acc {
		acc[i] = cp.accData[i] + xs[0][i]
		for r := 1; r < w; r++ {
			acc[i] = max(acc[i], cp.accData[i]+xs[r][i])
		}
	}
	cp.accData = acc
	return [][]float32{sum, sum[cp.rank*n : (cp.rank+1)*n], ag, xs[cp.root], ag}
}

// runColl runs steps of cp's program with strategy on its rank's device,
// the caller's buffers moving every step, and checks every output exactly.
func runColl(ctx context.Context, b gpu.Backend, cp *collProg, strategy stablegraph.Strategy, steps int) error {
	dev := cp.comm.Device()
	opts := stablegraph.Options{Strategy: strategy, Device: dev}
	var alloc steptest.Allocator
	if strategy == stablegraph.StrategyRemap {
		// Remap maps the memory behind the caller's buffers: they come
		// from a remappable allocator.
		ra, err := remappable.New(b, dev, nil)
		if err != nil {
			return err
		}
		defer ra.Close()
		alloc, opts.Remap.Memory = ra, ra
	}
	exe, err := stablegraph.Compile(ctx, b, cp.p, opts)
	if err != nil {
		return err
	}
	defer exe.Close()
	s, err := b.StreamCreate(dev, gpu.StreamNonBlocking, 0)
	if err != nil {
		return err
	}
	defer b.StreamDestroy(s)
	if alloc == nil {
		const region = 8 << 20
		base, err := b.MemAlloc(dev, region)
		if err != nil {
			return err
		}
		defer b.MemFree(base)
		if alloc, err = bfc.New(base, region, bfc.Options{Name: "rank"}); err != nil {
			return err
		}
	}
	r := rand.New(rand.NewPCG(uint64(dev), 7))
	var prev []gpu.DevicePtr
	for step := range steps {
		filler, err := alloc.Alloc(uint64(1 + r.IntN(4096)))
		if err != nil {
			return err
		}
		bind := stablegraph.Bindings{}
		var cur []gpu.DevicePtr
		for _, buf := range append([]stablegraph.Buffer{cp.x}, cp.outs...) {
			p, err := alloc.Alloc(uint64(buf.Size()))
			if err != nil {
				return err
			}
			bind[buf] = p
			cur = append(cur, p)
		}
		if err := b.MemcpyHtoD(bind[cp.x], gpu.F32ToBytes(cp.inputsOf(step, cp.rank))); err != nil {
			return err
		}
		if step == 2 {
			cp.commStatsBefore = cp.comm.Stats()
		}
		outs, err := exe.Run(ctx, s, bind)
		if err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		}
		want := cp.want(step)
		for i, buf := range cp.outs {
			data, err := exe.ReadOutput(ctx, outs, buf)
			if err != nil {
				return fmt.Errorf("step %d: %w", step, err)
			}
			if got := gpu.BytesToF32(data); !slices.Equal(got, want[i]) {
				return fmt.Errorf("step %d (%s): output %s differs: got %v, want %v", step, strategy, buf.Name(), got[:4], want[i][:4])
			}
		}
		accData, err := exe.ReadBuffer(ctx, cp.acc)
		if err != nil {
			return err
		}
		if got := gpu.BytesToF32(accData); !slices.Equal(got, cp.accData) {
			return fmt.Errorf("step %d (%s): state acc differs", step, strategy)
		}
		for _, p := range prev {
			if err := alloc.Free(p); err != nil {
				return err
			}
		}
		prev = append(cur, filler)
	}
	if err := b.StreamSynchronize(s); err != nil {
		return err
	}
	for _, p := range prev {
		if err := alloc.Free(p); err != nil {
			return err
		}
	}
	return nil
}

// TestCollectiveCommandsEveryStrategy runs every collective, over moving
// params and outputs and in place over a state and a temp, with 2 and 4
// ranks under every strategy, and checks every output bit for bit.
func TestCollectiveCommandsEveryStrategy(t *testing.T) {
	ctx := context.Background()
	for _, world := range []int{2, 4} {
		t.Run(fmt.Sprintf("ranks=%d", world), func(t *testing.T) {
			b := newSimN(t, world)
			comms := commtest.Comms(t, b, world)
			for _, strat := range stablegraph.Strategies() {
				t.Run(string(strat), func(t *testing.T) {
					err := perrank.Each(world, func(r int) error {
						return runColl(ctx, b, newCollProg(comms[r], 8), strat, 6)
					})
					if err != nil {
						t.Fatal(err)
					}
				})
			}
		})
	}
}

// TestCollectiveCapturedOnceInSteadyState runs a step whose collective is
// over a state and a temp (addresses that never move) while its params
// move every step, and checks that no strategy captures the collective
// again after the first steps.
func TestCollectiveCapturedOnceInSteadyState(t *testing.T) {
	ctx := context.Background()
	const world, n, steps = 2, 64, 8
	b := newSimN(t, world)
	comms := commtest.Comms(t, b, world)
	for _, strat := range stablegraph.Strategies() {
		t.Run(string(strat), func(t *testing.T) {
			err := perrank.Each(world, func(r int) error {
				c := comms[r]
				p := stablegraph.NewProgram("steady")
				x := p.Param("x", 4*n)
				y := p.Output("y", 4*n)
				g := p.Temp("g", 4*n)
				w := p.State("w", 4*n)
				p.Launch(kernels.Axpb, kernels.Elementwise(n), stablegraph.Out(g.All()), stablegraph.In(x.All()),
					stablegraph.F32(2), stablegraph.F32(0), stablegraph.I32(n))
				p.AllReduce(c, g.All(), g.All(), gpu.Float32, gpu.Sum)
				p.Launch(kernels.Axpy, kernels.Elementwise(n), stablegraph.InOut(w.All()), stablegraph.In(g.All()),
					stablegraph.F32(-0.5), stablegraph.I32(n))
				p.Launch(kernels.Copy, kernels.Elementwise(n), stablegraph.Out(y.All()), stablegraph.In(w.All()), stablegraph.I32(n))
				opts := stablegraph.Options{Strategy: strat, Device: c.Device()}
				alloc := func() (gpu.DevicePtr, func() error, error) {
					p, err := b.MemAlloc(c.Device(), 4*n)
					return p, func() error { return b.MemFree(p) }, err
				}
				if strat == stablegraph.StrategyRemap {
					ra, err := remappable.New(b, c.Device(), nil)
					if err != nil {
						return err
					}
					defer ra.Close()
					opts.Remap.Memory = ra
					alloc = func() (gpu.DevicePtr, func() error, error) {
						p, err := ra.Alloc(4 * n)
						return p, func() error { return ra.Free(p) }, err
					}
				}
				exe, err := stablegraph.Compile(ctx, b, p, opts)
				if err != nil {
					return err
				}
				defer exe.Close()
				s, err := b.StreamCreate(c.Device(), gpu.StreamNonBlocking, 0)
				if err != nil {
					return err
				}
				defer b.StreamDestroy(s)
				bufs := make([]gpu.DevicePtr, 6)
				for i := range bufs {
					p, free, err := alloc()
					if err != nil {
						return err
					}
					defer free()
					bufs[i] = p
				}
				var before stablegraph.CommStats
				var traced int64
				for step := range steps {
					if step == 2 {
						before = c.Stats()
						traced = exe.Stats().TracesCaptured
					}
					// Params and outputs move among three places.
					bind := stablegraph.Bindings{x: bufs[step%3], y: bufs[3+step%3]}
					if err := b.MemcpyHtoD(bind[x], gpu.F32ToBytes(slices.Repeat([]float32{float32(r + 1)}, n))); err != nil {
						return err
					}
					outs, err := exe.Run(ctx, s, bind)
					if err != nil {
						return err
					}
					data, err := exe.ReadOutput(ctx, outs, y)
					if err != nil {
						return err
					}
					// w -= 0.5·Σ_r 2(r+1) each step: -3 per step with 2 ranks.
					if got, want := gpu.BytesToF32(data)[0], float32(-3*(step+1)); got != want {
						return fmt.Errorf("step %d: y = %v, want %v", step, got, want)
					}
				}
				after := c.Stats()
				if after.Captured != before.Captured {
					return fmt.Errorf("%s: the collective was captured %d times in steady state (stats %+v then %+v)",
						strat, after.Captured-before.Captured, before, after)
				}
				if strat != stablegraph.StrategyEager && after.Captured == 0 {
					return fmt.Errorf("%s: the collective was never captured", strat)
				}
				if got := exe.Stats().TracesCaptured - traced; got != 0 && strat != stablegraph.StrategyEager {
					return fmt.Errorf("%s: %d traces captured in steady state", strat, got)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestCollectiveCompileErrors(t *testing.T) {
	b := newSimN(t, 2)
	comms := commtest.Comms(t, b, 2)
	c := comms[0]
	cases := []struct {
		name  string
		build func(p *stablegraph.Program, x, y stablegraph.Buffer)
		want  string
	}{
		{"no communicator", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.AllReduce(nil, x.All(), y.All(), gpu.Float32, gpu.Sum)
		}, "command 0 (allreduce): no communicator"},
		{"data type", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.AllReduce(c, x.All(), y.All(), gpu.DataType(0), gpu.Sum)
		}, "unknown data type"},
		{"reduction", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.AllReduce(c, x.All(), y.All(), gpu.Float32, gpu.ReduceOp(9))
		}, "unknown reduction"},
		{"lengths", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.AllReduce(c, x.Slice(0, 8), y.All(), gpu.Float32, gpu.Sum)
		}, "differ in length"},
		{"partial elements", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.AllReduce(c, x.Slice(0, 6), y.Slice(0, 6), gpu.Float32, gpu.Sum)
		}, "whole 4-byte float32 elements"},
		{"reduce-scatter lengths", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.ReduceScatter(c, x.All(), y.All(), gpu.Float32, gpu.Sum)
		}, "must hold 2 times recv"},
		{"all-gather lengths", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.AllGather(c, x.All(), y.All(), gpu.Float32)
		}, "must hold 2 times send"},
		{"root", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.Broadcast(c, x.All(), y.All(), gpu.Float32, 2)
		}, "root 2 is not a rank"},
		{"overlap", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.AllReduce(c, y.Slice(0, 32), y.Slice(32, 32), gpu.Float32, gpu.Sum)
			p.AllReduce(c, y.Slice(0, 32), y.Slice(16, 32), gpu.Float32, gpu.Sum)
		}, "overlap, and not as the in-place form of allreduce"},
		{"all-gather in place at the wrong block", func(p *stablegraph.Program, x, y stablegraph.Buffer) {
			p.AllGather(c, y.Slice(32, 32), y.All(), gpu.Float32) // rank 0's block is at 0
		}, "not as the in-place form of allgather"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := stablegraph.NewProgram("bad")
			x := p.Param("x", 64)
			y := p.Output("y", 64)
			tc.build(p, x, y)
			_, err := stablegraph.Compile(context.Background(), b, p, stablegraph.Options{})
			if !errors.Is(err, stablegraph.ErrInvalidProgram) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrInvalidProgram with %q", err, tc.want)
			}
		})
	}

	valid := func() *stablegraph.Program {
		p := stablegraph.NewProgram("ok")
		x := p.Param("x", 64)
		y := p.Output("y", 64)
		p.AllReduce(c, x.All(), y.All(), gpu.Float32, gpu.Sum)
		return p
	}
	t.Run("backend without collectives", func(t *testing.T) {
		_, err := stablegraph.Compile(context.Background(), struct{ gpu.Backend }{b}, valid(), stablegraph.Options{})
		if !errors.Is(err, gpu.ErrNotSupported) {
			t.Fatalf("got %v, want gpu.ErrNotSupported", err)
		}
		if _, err := stablegraph.NewCommID(struct{ gpu.Backend }{b}); !errors.Is(err, gpu.ErrNotSupported) {
			t.Fatalf("NewCommID: got %v, want gpu.ErrNotSupported", err)
		}
	})
	t.Run("wrong device", func(t *testing.T) {
		_, err := stablegraph.Compile(context.Background(), b, valid(), stablegraph.Options{Device: 1})
		if !errors.Is(err, stablegraph.ErrInvalidProgram) || !strings.Contains(err.Error(), "not on device 1") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("another backend", func(t *testing.T) {
		other := newSimN(t, 1)
		_, err := stablegraph.Compile(context.Background(), other, valid(), stablegraph.Options{})
		if !errors.Is(err, stablegraph.ErrInvalidProgram) || !strings.Contains(err.Error(), "belongs to backend") {
			t.Fatalf("got %v", err)
		}
	})
}

// TestCollectiveRankNeverRuns checks that when one rank never runs its
// step, the others get an error within the communicator timeout instead of
// hanging.
func TestCollectiveRankNeverRuns(t *testing.T) {
	ctx := context.Background()
	const world, n = 3, 16
	b := newSimN(t, world)
	b.SetCommTimeout(100 * time.Millisecond)
	comms := commtest.Comms(t, b, world)
	start := time.Now()
	err := perrank.Each(world-1, func(r int) error { // the last rank never runs
		err := runColl(ctx, b, newCollProg(comms[r], n), stablegraph.StrategyPatch, 2)
		if err == nil {
			return errors.New("a step completed without the missing rank")
		}
		if !errors.Is(err, gpu.ErrTimeout) {
			return fmt.Errorf("got %v, want a timeout", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the ranks took %v to fail with a 100ms timeout", d)
	}
	for r := range world {
		if err := b.ResetDevice(r); err != nil {
			t.Fatal(err)
		}
	}
}
