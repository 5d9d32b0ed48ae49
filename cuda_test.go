package stablegraph_test

// The binding checks on a GPU: bindings smaller than their buffers, steps on
// a capturing stream, and overlapping bindings under every strategy against
// eager, on the CUDA backend. They skip, saying why, where it does not open
// (CI). On the GPU machine (docs/GPU-TESTING.md):
//
//	scripts/gpu-test build .
//	scripts/gpu-test run -test.run CUDA

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/internal/steptest"
)

// openCUDA opens the CUDA backend, closed at cleanup after checking that
// the test released every handle it made.
func openCUDA(t *testing.T) gpu.Backend {
	t.Helper()
	b, _, err := gpu.Open("cuda", gpu.Config{})
	if err != nil {
		t.Skipf("no CUDA here: %v", err)
	}
	t.Cleanup(func() {
		if hc, ok := b.(gpu.HandleCounter); ok {
			if live := hc.LiveHandles(); !live.IsZero() {
				t.Errorf("handles live at the end of the test: %s", live)
			}
		}
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

// cudaStream and cudaAlloc make a stream and memory released at cleanup.
func cudaStream(t *testing.T, b gpu.Backend) gpu.Stream {
	t.Helper()
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.StreamDestroy(s); err != nil {
			t.Error(err)
		}
	})
	return s
}

func cudaAlloc(t *testing.T, b gpu.Backend, size uint64) gpu.DevicePtr {
	t.Helper()
	p, err := b.MemAlloc(0, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.MemFree(p); err != nil {
			t.Error(err)
		}
	})
	return p
}

// TestCUDABindingSmallerThanItsBuffer: on CUDA, under every strategy, an
// 8-byte cuMemAlloc bound to a 64-byte output, a slice running past the
// end of its allocation and freed memory are refused with
// ErrInvalidBinding naming the buffer, its size and the extent the driver
// knows; bindings that fit run, and keep running for 50 steps (the
// extents are cached: the steady state makes no driver call for them).
func TestCUDABindingSmallerThanItsBuffer(t *testing.T) {
	ctx := context.Background()
	b := openCUDA(t)
	s := cudaStream(t, b)
	for _, st := range stablegraph.Strategies() {
		t.Run(string(st), func(t *testing.T) {
			if st == stablegraph.StrategyRemap {
				t.Skip("remap binds whole granules of its own allocator; its refusals are in replay/remap_test.go")
			}
			p, x, y, _ := smallProgram()
			good := stablegraph.Bindings{x: cudaAlloc(t, b, 64), y: cudaAlloc(t, b, 64)}
			small, big := cudaAlloc(t, b, 8), cudaAlloc(t, b, 128)
			exe := steptest.Compile(t, b, p, stablegraph.Options{Strategy: st})
			// Freed after Compile allocated, so that nothing reuses it.
			freed := simtest.Freed(t, b, 0, 64)
			for _, c := range []struct {
				name string
				buf  stablegraph.Buffer
				at   gpu.DevicePtr
				want []string
			}{
				{"8-byte allocation", y, small, []string{`output "y"`, "64 bytes", "+8)"}},
				{"past the end", x, big.Add(96), []string{`param "x"`, "64 bytes", "+128)"}},
				{"freed", x, freed, []string{`param "x"`, "no live allocation"}},
			} {
				bind := stablegraph.Bindings{x: good[x], y: good[y]}
				bind[c.buf] = c.at
				_, err := exe.Run(ctx, s, bind)
				t.Logf("CUDA-BINDING %s %s: %v", st, c.name, err)
				if !errors.Is(err, stablegraph.ErrInvalidBinding) || !errors.Is(err, gpu.ErrOutOfBounds) {
					t.Fatalf("%s: %v, want ErrInvalidBinding and gpu.ErrOutOfBounds", c.name, err)
				}
				for _, w := range c.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: %q does not say %q", c.name, err, w)
					}
				}
			}
			for i := range 50 {
				bind := stablegraph.Bindings{x: good[x], y: good[y]}
				if i%2 == 1 {
					bind[x] = big.Add(64)
				}
				if _, err := exe.Run(ctx, s, bind); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
			}
			if err := b.StreamSynchronize(s); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestCUDARunOnCapturingStream: on CUDA, under every strategy, a step on a
// stream capturing a graph is refused with ErrStreamCapturing before
// anything is enqueued (the capture ends valid and empty), and the next
// steps on a normal stream run and compute y = 2x + 1 (under pool the slot
// is not left waiting for a timeline write that was captured).
func TestCUDARunOnCapturingStream(t *testing.T) {
	ctx := context.Background()
	b := openCUDA(t)
	s, cs := cudaStream(t, b), cudaStream(t, b)
	for _, st := range stablegraph.Strategies() {
		t.Run(string(st), func(t *testing.T) {
			p, x, y, _ := smallProgram()
			opts := stablegraph.Options{Strategy: st, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: 1}}}
			xp, yp := cudaAlloc(t, b, 64), cudaAlloc(t, b, 64)
			if st == stablegraph.StrategyRemap {
				mem := steptest.Memory(t, b, 0, &opts)
				xp, yp = mem(64), mem(64)
			}
			in := make([]float32, 16)
			for i := range in {
				in[i] = float32(i + 1)
			}
			if err := b.MemcpyHtoD(xp, gpu.F32ToBytes(in)); err != nil {
				t.Fatal(err)
			}
			exe := steptest.Compile(t, b, p, opts)
			bind := stablegraph.Bindings{x: xp, y: yp}
			for step := range 4 {
				if step == 1 {
					if err := b.StreamBeginCapture(cs); err != nil {
						t.Fatal(err)
					}
					_, err := exe.Run(ctx, cs, bind)
					t.Logf("CUDA-CAPTURING %s: %v", st, err)
					g, eerr := b.StreamEndCapture(cs)
					if eerr != nil {
						t.Fatalf("the capture was broken: %v (Run: %v)", eerr, err)
					}
					nodes, nerr := b.GraphNodes(g)
					if derr := b.GraphDestroy(g); derr != nil {
						t.Fatal(derr)
					}
					if !errors.Is(err, stablegraph.ErrStreamCapturing) || nerr != nil || len(nodes) != 0 {
						t.Fatalf("Run on a capturing stream: %v; the capture has %d nodes (%v)", err, len(nodes), nerr)
					}
				}
				if _, err := exe.Run(ctx, s, bind); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				if err := b.StreamSynchronize(s); err != nil {
					t.Fatal(err)
				}
				out := make([]byte, 64)
				if err := b.MemcpyDtoH(out, yp); err != nil {
					t.Fatal(err)
				}
				for i, v := range gpu.BytesToF32(out) {
					if v != 2*in[i]+1 {
						t.Fatalf("step %d: y[%d] = %v, want %v", step, i, v, 2*in[i]+1)
					}
				}
			}
		})
	}
}

// TestCUDAAliasedBindingsMatchEager is TestAliasedBindingsMatchEager of
// package replay on CUDA: outputs bound onto params and onto one another
// (in place, two outputs on one address, partial overlaps), every strategy
// and movement, the caller's whole region and the state equal to eager's
// bit for bit after every step. The ALIAS line gives each strategy's
// aliased steps and records.
func TestCUDAAliasedBindingsMatchEager(t *testing.T) {
	const n, steps = 1024, 18
	b := openCUDA(t)
	s := cudaStream(t, b)
	a := steptest.NewAlias(n)
	for _, c := range steptest.AliasCases(n) {
		for _, move := range steptest.Movements() {
			t.Run(fmt.Sprintf("%s/%s", c.Name, move), func(t *testing.T) {
				want := steptest.RunAlias(t, b, s, a, c, stablegraph.Options{Strategy: stablegraph.StrategyEager}, move, steps)
				for _, st := range stablegraph.Strategies()[1:] {
					if st == stablegraph.StrategyRemap {
						continue // refuses overlaps itself (replay/remap_test.go)
					}
					got := steptest.RunAlias(t, b, s, a, c, stablegraph.Options{Strategy: st}, move, steps)
					steptest.SameAlias(t, fmt.Sprintf("%s %s %s", c.Name, move, st), got, want)
					final := got[len(got)-1].Stats
					t.Logf("ALIAS %s %s %s: aliased steps %d, records %d, re-records %d", c.Name, move, st, final.AliasedSteps, final.Records, final.Rerecords)
				}
			})
		}
	}
}

// TestCUDAGemmAtAnotherAlignment: issue 14's alignment rule on the GPU. A
// GEMM (cuBLAS chooses its kernels by the alignment of its operands) runs
// under patch with its input at 256-byte-aligned addresses, then 64 bytes
// further (another alignment class), then back: every step equals eager's
// bits at the same addresses; the first step at the new class traces the
// GEMM again (the template of the other class is not reused), and the
// return to a class already seen traces nothing. CUDA-ALIGN lines give the
// captures per step.
func TestCUDAGemmAtAnotherAlignment(t *testing.T) {
	ctx := context.Background()
	b := openCUDA(t)
	s := cudaStream(t, b)
	const m, n, k = 8, 256, 256
	w := make([]float32, k*n)
	for i := range w {
		w[i] = float32(i%13) / 16
	}
	p := stablegraph.NewProgram("gemm-align")
	x := p.Param("x", 4*m*k)
	wc := p.Constant("w", gpu.F32ToBytes(w))
	y := p.Output("y", 4*m*n)
	p.Gemm(y.All(), x.All(), wc.All(), stablegraph.GEMM{M: m, N: n, K: k, Alpha: 1})
	xmem, ymem := cudaAlloc(t, b, 4*m*k+512), cudaAlloc(t, b, 4*m*n+512)
	offsets := []uint64{0, 0, 64, 64, 0, 64, 0}
	run := func(st stablegraph.Strategy) (outs [][]byte, captured []int64) {
		exe := steptest.Compile(t, b, p, stablegraph.Options{Strategy: st})
		for i, off := range offsets {
			in := make([]float32, m*k)
			for j := range in {
				in[j] = float32((i+j)%7) - 3
			}
			xp, yp := xmem.Add(off), ymem.Add(off)
			if err := b.MemcpyHtoD(xp, gpu.F32ToBytes(in)); err != nil {
				t.Fatal(err)
			}
			o, err := exe.Run(ctx, s, stablegraph.Bindings{x: xp, y: yp})
			if err != nil {
				t.Fatalf("%s step %d: %v", st, i, err)
			}
			got, err := exe.ReadOutput(ctx, o, y)
			if err != nil {
				t.Fatal(err)
			}
			outs, captured = append(outs, got), append(captured, exe.Stats().Last.TracesCaptured)
		}
		return outs, captured
	}
	want, _ := run(stablegraph.StrategyEager)
	got, captured := run(stablegraph.StrategyPatch)
	for i := range offsets {
		t.Logf("CUDA-ALIGN step %d, operands %d bytes past 256-byte alignment: %d traces captured", i, offsets[i], captured[i])
		if string(got[i]) != string(want[i]) {
			t.Errorf("step %d (offset %d): patch differs from eager", i, offsets[i])
		}
	}
	if captured[2] == 0 {
		t.Errorf("the first step at another alignment class captured nothing: a trace of the 256-byte class was reused at 64")
	}
	if captured[4] != 0 || captured[5] != 0 || captured[6] != 0 {
		t.Errorf("returning to classes already seen captured %v; want none", captured[4:])
	}
}
