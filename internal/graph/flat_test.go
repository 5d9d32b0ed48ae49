package graph_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/blas"
	"github.com/stablegraph/stablegraph/internal/graph"
	"github.com/stablegraph/stablegraph/internal/trace"
	"github.com/stablegraph/stablegraph/kernels"
)

// mlp is L layers of y = tanh(x·W + b) as a command buffer on sim: per
// layer a traced GEMM with its bias (into a temp) and a tanh kernel.
// Buffers: 0 x (moves), 1 y (moves), then per layer W, b, h (fixed).
type mlp struct {
	t       *testing.T
	b       *sim.Backend
	s       gpu.Stream
	tr      *trace.Tracer
	cb      *graph.CommandBuffer
	rows, w int
	layers  int
	addrs   []gpu.DevicePtr // fixed buffers at their addresses; x and y set per step
	mod     gpu.Module
	allocs  []gpu.DevicePtr
	xs      []float32
	nbufs   int
}

func newMLP(t *testing.T, rows, w, layers int, opts trace.Options) *mlp {
	t.Helper()
	b, err := sim.New(sim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	m := &mlp{t: t, b: b, rows: rows, w: w, layers: layers, nbufs: 2 + 3*layers}
	if m.mod, err = b.ModuleLoad(0, kernels.Module()); err != nil {
		t.Fatal(err)
	}
	if m.s, err = b.StreamCreate(0, gpu.StreamNonBlocking, 0); err != nil {
		t.Fatal(err)
	}
	capture, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	opts.Kernels = func(name string) (gpu.Function, error) { return b.ModuleFunction(m.mod, name) }
	m.tr = trace.NewTracer(b, 0, capture, opts)
	t.Cleanup(func() {
		if err := m.tr.Close(); err != nil {
			t.Error(err)
		}
		for _, p := range m.allocs {
			b.MemFree(p)
		}
		b.StreamDestroy(capture)
		b.StreamDestroy(m.s)
		b.ModuleUnload(m.mod)
		if live := b.LiveHandles(); !live.IsZero() {
			t.Errorf("live at the end: %s", live)
		}
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	r := rand.New(rand.NewPCG(1, 2))
	tanh, err := b.ModuleFunction(m.mod, kernels.Tanh)
	if err != nil {
		t.Fatal(err)
	}
	m.addrs = make([]gpu.DevicePtr, m.nbufs)
	n := rows * w
	var cmds []graph.Command
	in := 0
	for l := range layers {
		wb, bb, hb := 2+3*l, 3+3*l, 4+3*l
		m.addrs[wb] = m.upload(randF32(r, w*w, 0.1), 0)
		m.addrs[bb] = m.upload(randF32(r, w, 0.1), 0)
		m.addrs[hb] = m.alloc(uint64(4*n), 0)
		g := blas.Gemm{M: rows, N: w, K: w, Alpha: 1, Bias: true}
		c := m.tr.NewLibraryCommand(fmt.Sprintf("gemm %d", l), blas.Command(g),
			[]trace.Use{{Operand: 0}, {Operand: 1}, {Operand: 2}, {Operand: 3}},
			[]uint64{uint64(4 * n), uint64(4 * n), uint64(4 * w * w), uint64(4 * w)})
		cmds = append(cmds, graph.Command{Name: fmt.Sprintf("gemm %d", l), Kind: graph.KindTraced, Trace: c, Operands: []int{hb, in, wb, bb}, Library: true})
		out := hb
		if l == layers-1 {
			out = 1
		}
		cmds = append(cmds, graph.Command{Name: fmt.Sprintf("tanh %d", l), Kind: graph.KindKernel, Func: tanh, Config: kernels.Elementwise(n),
			Args: []graph.Arg{ptr(out), ptr(hb), {Value: gpu.I32(int32(n))}}})
		in = out
	}
	if m.cb, err = graph.New(0, m.nbufs, cmds, m.tr); err != nil {
		t.Fatal(err)
	}
	m.xs = randF32(r, n, 1)
	return m
}

func ptr(buf int) graph.Arg {
	return graph.Arg{Value: gpu.Arg{Kind: gpu.ArgPtr}, Ref: graph.Ref{Buf: buf}}
}

func randF32(r *rand.Rand, n int, scale float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = scale * float32(r.Float64()*2-1)
	}
	return v
}

func (m *mlp) alloc(size, off uint64) gpu.DevicePtr {
	m.t.Helper()
	p, err := m.b.MemAlloc(0, size+off)
	if err != nil {
		m.t.Fatal(err)
	}
	m.allocs = append(m.allocs, p)
	return p.Add(off)
}

func (m *mlp) upload(v []float32, off uint64) gpu.DevicePtr {
	m.t.Helper()
	p := m.alloc(uint64(4*len(v)), off)
	if err := m.b.MemcpyHtoD(p, gpu.F32ToBytes(v)); err != nil {
		m.t.Fatal(err)
	}
	return p
}

// fresh returns the step's addresses: x and y at new allocations, off
// bytes past 256-byte alignment.
func (m *mlp) fresh(off uint64) []gpu.DevicePtr {
	a := append([]gpu.DevicePtr(nil), m.addrs...)
	a[0] = m.upload(m.xs, off)
	a[1] = m.alloc(uint64(4*m.rows*m.w), off)
	return a
}

func (m *mlp) out(a []gpu.DevicePtr) string {
	m.t.Helper()
	buf := make([]byte, 4*m.rows*m.w)
	if err := m.b.StreamSynchronize(m.s); err != nil {
		m.t.Fatal(err)
	}
	if err := m.b.MemcpyDtoH(buf, a[1]); err != nil {
		m.t.Fatal(err)
	}
	return string(buf)
}

// eager runs the step on the stream at a (the reference bits).
func (m *mlp) eager(a []gpu.DevicePtr) string {
	m.t.Helper()
	if _, err := m.cb.Launch(m.b, m.s, a); err != nil {
		m.t.Fatal(err)
	}
	return m.out(a)
}

// TestFlattenedPatchFreshAddresses: the step's GEMMs are flattened into
// its graph (the split-K GEMM's two kernels as two nodes, chained, the
// tanh after the second), and patch moves them to fresh addresses every
// step with no capture after the first record, computing eager's bits.
func TestFlattenedPatchFreshAddresses(t *testing.T) {
	m := newMLP(t, 8, 128, 4, trace.Options{})
	a := m.fresh(0)
	want := m.eager(a)
	x, err := m.cb.Instantiate(m.b, a, true)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Destroy(m.b)
	flat := x.Flattened()
	for l := range m.layers {
		if flat[2*l] != 2 || flat[2*l+1] != 0 {
			t.Fatalf("flattened nodes per command %v; want 2 for each GEMM (split-K), 0 for the kernels", flat)
		}
	}
	nodes, err := m.b.GraphNodes(x.Graph)
	if err != nil || len(nodes) != 3*m.layers {
		t.Fatalf("the step's graph has %d nodes (%v), want %d: no child graphs", len(nodes), err, 3*m.layers)
	}
	for i, n := range nodes {
		typ, _ := m.b.GraphNodeType(n)
		deps, _ := m.b.GraphNodeDeps(n)
		if typ != gpu.NodeKernel || (i == 0) != (len(deps) == 0) || (i > 0 && (len(deps) != 1 || deps[0] != nodes[i-1])) {
			t.Fatalf("node %d: %v with deps %v; want a chain of kernels", i, typ, deps)
		}
	}
	if err := x.Launch(m.b, m.s); err != nil {
		t.Fatal(err)
	}
	if got := m.out(a); got != want {
		t.Fatal("the recorded step differs from eager")
	}
	captures := m.tr.Stats.Captures
	for step := 1; step <= 12; step++ {
		a := m.fresh(0)
		want := m.eager(a)
		n, err := m.cb.Patch(m.b, x, a)
		if err != nil {
			t.Fatal(err)
		}
		// x feeds the first GEMM's first kernel, y is the last tanh's
		// output: two nodes.
		if n != 2 {
			t.Errorf("step %d: patched %d nodes, want 2", step, n)
		}
		if err := x.Launch(m.b, m.s); err != nil {
			t.Fatal(err)
		}
		if got := m.out(a); got != want {
			t.Fatalf("step %d: the patched step differs from eager", step)
		}
	}
	if m.tr.Stats.Captures != captures || m.tr.Stats.Moved != 12 {
		t.Errorf("steady state: %d captures (want %d), %d moved (want 12)", m.tr.Stats.Captures, captures, m.tr.Stats.Moved)
	}
}

// TestFlattenedPatchOtherClass: operands moved to another alignment class
// are traced again there. When the library picks the same kernels, the
// nodes are set from that trace; when it picks others (the vectorised
// kernel at 256, the scalar one at 8), the patch is refused
// (gpu.ErrGraphUpdate) and a new record computes eager's bits.
func TestFlattenedPatchOtherClass(t *testing.T) {
	for _, c := range []struct {
		name    string
		rows    int
		refused bool
	}{
		{"same kernels (split-K at both classes)", 8, false},
		{"other kernels (vectorised, then scalar)", 64, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newMLP(t, c.rows, 128, 2, trace.Options{})
			a := m.fresh(0)
			m.eager(a)
			x, err := m.cb.Instantiate(m.b, a, true)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { x.Destroy(m.b) }()
			before := m.tr.Stats.Captures
			a = m.fresh(8)
			want := m.eager(a)
			_, err = m.cb.Patch(m.b, x, a)
			if c.refused {
				if !errors.Is(err, gpu.ErrGraphUpdate) {
					t.Fatalf("patch across kernels: %v, want a refusal", err)
				}
				x.Destroy(m.b)
				if x, err = m.cb.Instantiate(m.b, a, true); err != nil {
					t.Fatal(err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if m.tr.Stats.Captures != before+2 {
				t.Errorf("%d captures at the new class, want 2 (a trace and its diff)", m.tr.Stats.Captures-before)
			}
			if err := x.Launch(m.b, m.s); err != nil {
				t.Fatal(err)
			}
			if got := m.out(a); got != want {
				t.Fatal("the step at the new class differs from eager")
			}
		})
	}
}

// TestFlattenedUpdateAndRecord: the update strategy's whole-graph update
// and the record strategy (traces captured, not diffed) both work over
// flattened GEMMs read back from their captures.
func TestFlattenedUpdateAndRecord(t *testing.T) {
	m := newMLP(t, 8, 128, 2, trace.Options{})
	a := m.fresh(0)
	m.eager(a)
	x, err := m.cb.Instantiate(m.b, a, false)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Destroy(m.b)
	if f := x.Flattened(); f[0] != 2 {
		t.Fatalf("record without patching: flattened %v", f)
	}
	for range 3 {
		a := m.fresh(0)
		want := m.eager(a)
		if err := m.cb.Update(m.b, x, a); err != nil {
			t.Fatal(err)
		}
		if err := x.Launch(m.b, m.s); err != nil {
			t.Fatal(err)
		}
		if got := m.out(a); got != want {
			t.Fatal("the updated step differs from eager")
		}
	}
}

// TestNotFlattenedWithoutWorkspace: a GEMM given no workspace captures
// memory nodes, so it cannot be flattened, and CUDA (and sim) refuse it as
// a child graph: recording the step fails, naming the memory node. This is
// why the tracer owns a workspace.
func TestNotFlattenedWithoutWorkspace(t *testing.T) {
	m := newMLP(t, 8, 128, 1, trace.Options{NoWorkspace: true})
	a := m.fresh(0)
	m.eager(a)
	_, err := m.cb.Instantiate(m.b, a, true)
	if !errors.Is(err, gpu.ErrInvalidValue) {
		t.Fatalf("recording a GEMM without a workspace: %v, want the child graph refused", err)
	}
	if ok, why := m.cb.Traced()[0].Flattened(); ok || why == "" {
		t.Errorf("flattened %v (%q)", ok, why)
	}
}
