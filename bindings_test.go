package stablegraph_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/internal/steptest"
	"github.com/stablegraph/stablegraph/kernels"
)

// skipRemapOnSim skips strategy remap, which binds whole granules of its
// own allocator (its refusals are in replay/remap_test.go), and opens a sim
// device with a stream for the others.
func skipRemapOnSim(t *testing.T, st stablegraph.Strategy) (*sim.Backend, gpu.Stream) {
	t.Helper()
	if st == stablegraph.StrategyRemap {
		t.Skip("remap binds whole granules of its own allocator; its refusals are in replay/remap_test.go")
	}
	b := simtest.New(t, 1)
	return b, simtest.Stream(t, b, 0)
}

// smallProgram is y = 2·x + 1 over 16 floats (64 bytes each), with a state
// acc += y: the program of the binding tests.
func smallProgram() (p *stablegraph.Program, x, y, acc stablegraph.Buffer) {
	p = stablegraph.NewProgram("small")
	x, y = p.Param("x", 64), p.Output("y", 64)
	acc = p.State("acc", 64)
	p.Launch(kernels.Axpb, kernels.Elementwise(16), stablegraph.Out(y.All()), stablegraph.In(x.All()), stablegraph.F32(2), stablegraph.F32(1), stablegraph.I32(16))
	p.Launch(kernels.Axpy, kernels.Elementwise(16), stablegraph.InOut(acc.All()), stablegraph.In(y.All()), stablegraph.F32(1), stablegraph.I32(16))
	return p, x, y, acc
}

// TestBindingSmallerThanItsBuffer: under every strategy, a buffer bound to
// less memory than its size (an 8-byte allocation for a 64-byte output, a
// slice that runs past the end of its allocation, freed memory) is refused
// with ErrInvalidBinding naming the buffer, its size and the extent found,
// before anything is enqueued; the same buffers bound properly then run.
// BindState is checked the same way.
func TestBindingSmallerThanItsBuffer(t *testing.T) {
	ctx := context.Background()
	for _, st := range stablegraph.Strategies() {
		t.Run(string(st), func(t *testing.T) {
			b, s := skipRemapOnSim(t, st)
			p, x, y, acc := smallProgram()
			good := stablegraph.Bindings{x: simtest.Alloc(t, b, 0, 64), y: simtest.Alloc(t, b, 0, 64)}
			big, small := simtest.Alloc(t, b, 0, 128), simtest.Alloc(t, b, 0, 8)
			exe := steptest.Compile(t, b, p, stablegraph.Options{Strategy: st})
			freed := simtest.Freed(t, b, 0, 64)
			for _, c := range []struct {
				name string
				buf  stablegraph.Buffer
				at   gpu.DevicePtr
				want []string
			}{
				{"8-byte allocation", y, small, []string{`output "y"`, "64 bytes", "+8)"}},
				{"past the end", x, big.Add(96), []string{`param "x"`, "64 bytes", "+128)", "32 bytes are left"}},
				{"freed", x, freed, []string{`param "x"`, "freed"}},
			} {
				bind := maps.Clone(good)
				bind[c.buf] = c.at
				_, err := exe.Run(ctx, s, bind)
				if !errors.Is(err, stablegraph.ErrInvalidBinding) || !errors.Is(err, gpu.ErrOutOfBounds) {
					t.Fatalf("%s: %v, want ErrInvalidBinding and gpu.ErrOutOfBounds", c.name, err)
				}
				for _, w := range c.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: %q does not say %q", c.name, err, w)
					}
				}
			}
			if st := exe.Stats(); st.Steps != 0 || st.Records != 0 || st.Launches != 0 || st.GraphLaunches != 0 {
				t.Errorf("refused bindings did work: %+v", st.Counters)
			}
			if _, err := exe.Run(ctx, s, stablegraph.Bindings{x: big.Add(64), y: good[y]}); err != nil {
				t.Fatalf("a binding that ends at its allocation's end: %v", err)
			}
			waitStream(t, b, s)
			if err := exe.BindState(ctx, acc, simtest.Alloc(t, b, 0, 32)); !errors.Is(err, stablegraph.ErrInvalidBinding) || !strings.Contains(err.Error(), `state "acc"`) {
				t.Errorf("BindState to 32 bytes: %v", err)
			}
		})
	}
}

// TestBindingOverlapsReboundState: a param or output bound over the
// memory of a state rebound with BindState is refused by every strategy
// (stable and pool never copy states), naming both buffers.
func TestBindingOverlapsReboundState(t *testing.T) {
	ctx := context.Background()
	for _, st := range stablegraph.Strategies() {
		t.Run(string(st), func(t *testing.T) {
			b, s := skipRemapOnSim(t, st)
			p, x, y, acc := smallProgram()
			exe := steptest.Compile(t, b, p, stablegraph.Options{Strategy: st})
			mine := simtest.Alloc(t, b, 0, 64)
			if err := exe.BindState(ctx, acc, mine); err != nil {
				t.Fatal(err)
			}
			_, err := exe.Run(ctx, s, stablegraph.Bindings{x: simtest.Alloc(t, b, 0, 64), y: mine})
			if !errors.Is(err, stablegraph.ErrInvalidBinding) || !strings.Contains(err.Error(), `state "acc"`) || !strings.Contains(err.Error(), `output "y"`) {
				t.Fatalf("output bound over a rebound state: %v", err)
			}
			if _, err := exe.Run(ctx, s, stablegraph.Bindings{x: simtest.Alloc(t, b, 0, 64), y: simtest.Alloc(t, b, 0, 64)}); err != nil {
				t.Fatal(err)
			}
			waitStream(t, b, s)
		})
	}
}

// waitStream waits for s, so that the test's memory outlives the steps that
// use it (its cleanups free it before the executable is closed).
func waitStream(t testing.TB, b gpu.Backend, s gpu.Stream) {
	t.Helper()
	if err := b.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
}

// TestRunOnCapturingStream: a step on a stream that is capturing a graph is
// refused under every strategy with ErrStreamCapturing naming the stream,
// before anything is bound or enqueued: the capture stays valid and
// empty, and the next steps on a stream that is not capturing run and
// match eager (a pool slot is not left waiting for a timeline write that
// was captured instead of run).
func TestRunOnCapturingStream(t *testing.T) {
	ctx := context.Background()
	for _, st := range stablegraph.Strategies() {
		t.Run(string(st), func(t *testing.T) {
			b := simtest.New(t, 1)
			s := simtest.Stream(t, b, 0)
			cs := simtest.Stream(t, b, 0)
			p, x, y, _ := smallProgram()
			opts := stablegraph.Options{Strategy: st, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: 1}}}
			mem := steptest.Memory(t, b, 0, &opts)
			exe := steptest.Compile(t, b, p, opts)
			xp, yp := mem(64), mem(64)
			simtest.Upload(t, b, xp, simtest.Ramp(16, 1))
			bind := stablegraph.Bindings{x: xp, y: yp}
			for step := range 4 {
				if step == 1 {
					if err := b.StreamBeginCapture(cs); err != nil {
						t.Fatal(err)
					}
					_, err := exe.Run(ctx, cs, bind)
					if !errors.Is(err, stablegraph.ErrStreamCapturing) || !strings.Contains(err.Error(), fmt.Sprintf("%#x", uint64(cs))) {
						t.Fatalf("Run on a capturing stream: %v", err)
					}
					g, err := b.StreamEndCapture(cs)
					if err != nil {
						t.Fatalf("the capture was broken: %v", err)
					}
					nodes, err := b.GraphNodes(g)
					if err != nil {
						t.Fatal(err)
					}
					if err := b.GraphDestroy(g); err != nil {
						t.Fatal(err)
					}
					if len(nodes) != 0 {
						t.Fatalf("the refused step left %d nodes in the caller's capture", len(nodes))
					}
				}
				if _, err := exe.Run(ctx, s, bind); err != nil {
					t.Fatalf("step %d after the refused one: %v", step, err)
				}
				waitStream(t, b, s)
				got := simtest.Download(t, b, yp, 16)
				for i, v := range got {
					if v != 2*float32(i+1)+1 {
						t.Fatalf("step %d: y[%d] = %v", step, i, v)
					}
				}
			}
			if st := exe.Stats(); st.Steps != 4 {
				t.Errorf("%d steps, want 4", st.Steps)
			}
		})
	}
}

// TestCompileNilProgram: Compile and Validate of a nil *Program are errors
// wrapping ErrInvalidProgram, not panics.
func TestCompileNilProgram(t *testing.T) {
	b := simtest.New(t, 1)
	var p *stablegraph.Program
	if err := p.Validate(); !errors.Is(err, stablegraph.ErrInvalidProgram) {
		t.Errorf("Validate of nil: %v", err)
	}
	if exe, err := stablegraph.Compile(context.Background(), b, nil, stablegraph.Options{}); exe != nil || !errors.Is(err, stablegraph.ErrInvalidProgram) {
		t.Errorf("Compile of nil: %v", err)
	}
}

// TestGemmHugeShapeRefused: a GEMM whose matrices need more bytes than an
// int64 holds is refused against 64-byte buffers (the sizes are computed
// without overflow), at every shape that used to wrap around.
func TestGemmHugeShapeRefused(t *testing.T) {
	for _, g := range []stablegraph.GEMM{
		{M: math.MaxInt32, N: math.MaxInt32, K: math.MaxInt32, Alpha: 1},
		{M: 1 << 30, N: 1 << 31 / 2, K: 4, Alpha: 1},
		{M: math.MaxInt32, N: 4, K: math.MaxInt32, Alpha: 1},
	} {
		p := stablegraph.NewProgram("huge")
		a, bb, c := p.Param("a", 64), p.Param("b", 64), p.Output("c", 64)
		p.Gemm(c.All(), a.All(), bb.All(), g)
		err := p.Validate()
		if !errors.Is(err, stablegraph.ErrInvalidProgram) || !strings.Contains(err.Error(), "matrix needs") {
			t.Errorf("m=%d n=%d k=%d: %v", g.M, g.N, g.K, err)
		}
	}
}

// TestCanceledRunNamesExecutable: a Run with a context already canceled
// says which executable and step, and wraps context.Canceled.
func TestCanceledRunNamesExecutable(t *testing.T) {
	ctx := context.Background()
	b := simtest.New(t, 1)
	s := simtest.Stream(t, b, 0)
	p, x, y, _ := smallProgram()
	exe := steptest.Compile(t, b, p, stablegraph.Options{})
	bind := stablegraph.Bindings{x: simtest.Alloc(t, b, 0, 64), y: simtest.Alloc(t, b, 0, 64)}
	for range 2 {
		if _, err := exe.Run(ctx, s, bind); err != nil {
			t.Fatal(err)
		}
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	_, err := exe.Run(canceled, s, bind)
	waitStream(t, b, s)
	if want := "stablegraph: executable small: step 2: context canceled"; err == nil || err.Error() != want || !errors.Is(err, context.Canceled) {
		t.Errorf("Run canceled: %v, want %q", err, want)
	}
}

// TestMemoryAfterBindState: Memory stops counting a state's own allocation
// once BindState freed it.
func TestMemoryAfterBindState(t *testing.T) {
	ctx := context.Background()
	b := simtest.New(t, 1)
	p, _, _, acc := smallProgram()
	exe := steptest.Compile(t, b, p, stablegraph.Options{})
	before := exe.Memory()
	if before.States != 256 { // 64 bytes rounded to the alignment
		t.Fatalf("states %d bytes, want 256", before.States)
	}
	if err := exe.BindState(ctx, acc, simtest.Alloc(t, b, 0, 64)); err != nil {
		t.Fatal(err)
	}
	if after := exe.Memory(); after.States != 0 || after.Total() != before.Total()-256 {
		t.Errorf("after BindState: %+v (before %+v)", after, before)
	}
}

// TestTracesMovedAndWorkspace: under patch at fresh addresses, the
// flattened GEMMs of the mlp move by their templates (Counters.TracesMoved,
// the tracer's count) and Memory counts the tracer's library workspace.
func TestTracesMovedAndWorkspace(t *testing.T) {
	b := simtest.New(t, 1)
	w := steptest.NewMLP(4, 32, 2, 64, 3)
	res, _ := steptest.RunMLP(t, b, w, stablegraph.StrategyPatch, steptest.Random, 6)
	last := res[len(res)-1]
	// Only the first layer's GEMM reads a buffer that moves (x); the
	// second's operands are temps and a state.
	if last.Stats.TracesMoved != int64(len(res)-2) || last.Stats.Last.TracesMoved != 1 {
		t.Errorf("traces moved %d in all, %d in the last step; want the first GEMM moved at every step after the second", last.Stats.TracesMoved, last.Stats.Last.TracesMoved)
	}
	if last.Mem.Workspace == 0 || last.Mem.Total() < last.Mem.Workspace+last.Mem.States {
		t.Errorf("memory %+v: no library workspace counted", last.Mem)
	}
}
