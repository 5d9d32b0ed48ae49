package trace_test

import (
	"errors"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/trace"
	"github.com/stablegraph/stablegraph/kernels"
)

// TestTracerOnSim traces a two-kernel function on sim: the first patch-mode
// trace diffs it, a trace at new addresses is built from the template (and
// runs correctly), a return to the first addresses hits the cache, and a
// failing function leaves nothing behind.
func TestTracerOnSim(t *testing.T) {
	b, err := sim.New(sim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	mod, err := b.ModuleLoad(0, kernels.Module())
	if err != nil {
		t.Fatal(err)
	}
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	lookup := func(name string) (gpu.Function, error) { return b.ModuleFunction(mod, name) }
	const n = 32
	// y = 2x + 1, then y = 3y + 0.5 (x is read-only).
	fn := func(env *trace.Env) error {
		f, err := env.Kernel(kernels.Axpb)
		if err != nil {
			return err
		}
		y, x := env.Ptrs[0], env.Ptrs[1]
		if err := env.Backend.LaunchKernel(f, kernels.Elementwise(n), []gpu.Arg{gpu.Ptr(y), gpu.Ptr(x), gpu.F32(2), gpu.F32(1), gpu.I32(n)}, env.Stream); err != nil {
			return err
		}
		return env.Backend.LaunchKernel(f, kernels.Elementwise(n), []gpu.Arg{gpu.Ptr(y), gpu.Ptr(y), gpu.F32(3), gpu.F32(0.5), gpu.I32(n)}, env.Stream)
	}
	var allocs []gpu.DevicePtr
	alloc := func() gpu.DevicePtr {
		p, err := b.MemAlloc(0, 4*n)
		if err != nil {
			t.Fatal(err)
		}
		allocs = append(allocs, p)
		return p
	}
	ops1 := []gpu.DevicePtr{alloc(), alloc()}
	ops2 := []gpu.DevicePtr{alloc(), alloc()}

	tr := trace.NewTracer(b, 0, s, trace.Options{Kernels: lookup})
	c := tr.NewCommand("two", fn, []trace.Use{{Operand: 0}, {Operand: 1}}, []uint64{4 * n, 4 * n})
	if _, err := tr.Trace(c, ops1, true); err != nil {
		t.Fatal(err)
	}
	if ok, why := c.Patchable(); !ok {
		t.Fatalf("not patchable: %v", why)
	}
	if got := len(c.Template().Slots()); got != 4 {
		t.Errorf("%d pointer slots, want 4", got)
	}
	g2, err := tr.Trace(c, ops2, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Trace(c, ops1, true); err != nil {
		t.Fatal(err)
	}
	want := trace.Stats{Captures: 2, DiffCaptures: 1, Synthesized: 1, Hits: 1, Misses: 2}
	if tr.Stats != want {
		t.Errorf("stats %+v, want %+v", tr.Stats, want)
	}

	// The synthesized trace computes into ops2.
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(i)
	}
	if err := b.MemcpyHtoD(ops2[1], gpu.F32ToBytes(x)); err != nil {
		t.Fatal(err)
	}
	// g2 is borrowed from the cache; it is still there (capacity 16).
	xg, err := b.GraphInstantiate(g2)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.GraphLaunch(xg, s); err != nil {
		t.Fatal(err)
	}
	if err := b.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 4*n)
	if err := b.MemcpyDtoH(out, ops2[0]); err != nil {
		t.Fatal(err)
	}
	for i, v := range gpu.BytesToF32(out) {
		if want := 3*(2*x[i]+1) + 0.5; v != want {
			t.Fatalf("y[%d] = %g, want %g", i, v, want)
		}
	}
	if err := b.GraphExecDestroy(xg); err != nil {
		t.Fatal(err)
	}

	// A failing function: the error comes back, the capture is ended.
	boom := errors.New("boom")
	bad := tr.NewCommand("bad", func(env *trace.Env) error {
		if err := fn(env); err != nil {
			return err
		}
		return boom
	}, []trace.Use{{Operand: 0}, {Operand: 1}}, []uint64{4 * n, 4 * n})
	if _, err := tr.Trace(bad, ops1, false); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	if capturing, _ := b.StreamIsCapturing(s); capturing {
		t.Fatal("the stream is still capturing")
	}
	if err := tr.Run(c, ops1, s); err != nil {
		t.Fatal(err)
	}

	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.StreamDestroy(s); err != nil {
		t.Fatal(err)
	}
	for _, p := range allocs {
		if err := b.MemFree(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.ModuleUnload(mod); err != nil {
		t.Fatal(err)
	}
	if live := b.LiveHandles(); !live.IsZero() {
		t.Errorf("live after Close: %s", live)
	}
}
