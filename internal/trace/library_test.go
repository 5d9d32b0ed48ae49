package trace_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/blas"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/internal/trace"
	"github.com/stablegraph/stablegraph/kernels"
)

// rig is a sim backend with the built-in kernels, a capture stream and
// device memory for a test, all checked released at the end.
type rig struct {
	t      *testing.T
	b      *sim.Backend
	mod    gpu.Module
	s      gpu.Stream
	allocs []gpu.DevicePtr
}

func newRig(t *testing.T) *rig {
	t.Helper()
	b := simtest.New(t, 1) // checks at cleanup that nothing is left live
	d := simtest.OpenDev(t, b, 0)
	r := &rig{t: t, b: b, mod: d.Mod, s: d.Stream}
	t.Cleanup(func() {
		for _, p := range r.allocs {
			if err := b.MemFree(p); err != nil {
				t.Error(err)
			}
		}
	})
	return r
}

func (r *rig) lookup(name string) (gpu.Function, error) { return r.b.ModuleFunction(r.mod, name) }

// alloc returns size bytes at off bytes past a 256-byte aligned address.
func (r *rig) alloc(size, off uint64) gpu.DevicePtr {
	r.t.Helper()
	p, err := r.b.MemAlloc(0, size+off)
	if err != nil {
		r.t.Fatal(err)
	}
	r.allocs = append(r.allocs, p)
	return p.Add(off)
}

// kernelNames lists the functions of g's kernel nodes, in order.
func (r *rig) kernelNames(g gpu.Graph) []string {
	r.t.Helper()
	nodes, err := r.b.GraphNodes(g)
	if err != nil {
		r.t.Fatal(err)
	}
	var out []string
	for _, n := range nodes {
		if typ, _ := r.b.GraphNodeType(n); typ != gpu.NodeKernel {
			continue
		}
		kp, err := r.b.GraphKernelNodeParams(n)
		if err != nil {
			r.t.Fatal(err)
		}
		name, _ := r.b.FuncName(kp.Func)
		out = append(out, name)
	}
	return out
}

// TestTraceKeyedByAlignmentClass is issue 14's item 3: a traced function
// that branches on its operand's alignment (as libraries do) must not have
// the trace recorded at one alignment class reused, patched or moved to an
// address of another; it is traced again there. Within a class, the
// template moves it without a capture.
func TestTraceKeyedByAlignmentClass(t *testing.T) {
	r := newRig(t)
	const n = 64
	fn := func(env *trace.Env) error {
		y := env.Ptrs[0]
		name, args := kernels.Fill, []gpu.Arg{gpu.Ptr(y), gpu.F32(1), gpu.I32(n)}
		if gpu.AlignClass(y) < gpu.MaxAlignClass {
			name, args = kernels.Axpb, []gpu.Arg{gpu.Ptr(y), gpu.Ptr(y), gpu.F32(0), gpu.F32(2), gpu.I32(n)}
		}
		f, err := env.Kernel(name)
		if err != nil {
			return err
		}
		return env.Backend.LaunchKernel(f, kernels.Elementwise(n), args, env.Stream)
	}
	tr := trace.NewTracer(r.b, 0, r.s, trace.Options{Kernels: r.lookup})
	defer tr.Close()
	c := tr.NewCommand("branches", fn, []trace.Use{{Operand: 0}}, []uint64{4 * n})
	at := func(off uint64) []gpu.DevicePtr { return []gpu.DevicePtr{r.alloc(4*n, off)} }
	for step, want := range []struct {
		off      uint64
		kernel   string
		captures int64
	}{
		{0, kernels.Fill, 2},   // 256-aligned: captured and diffed
		{0, kernels.Fill, 2},   // another 256-aligned address: the template, no capture
		{64, kernels.Axpb, 4},  // class 64: captured and diffed again
		{192, kernels.Axpb, 4}, // class 64 again: its own template
		{0, kernels.Fill, 4},   // back to 256: the first template
		{128, kernels.Axpb, 6}, // class 128: a third
	} {
		ops := at(want.off)
		g, err := tr.Trace(c, ops, true)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.kernelNames(g); len(got) != 1 || got[0] != want.kernel {
			t.Fatalf("step %d (address ≡ %d mod 256): trace launches %v, want %s", step, want.off, got, want.kernel)
		}
		if tr.Stats.Captures != want.captures {
			t.Fatalf("step %d: %d captures, want %d", step, tr.Stats.Captures, want.captures)
		}
		if ok, why := c.Patchable(); !ok {
			t.Fatalf("step %d: not patchable: %v", step, why)
		}
		fl, err := tr.Flat(c, ops, true)
		if err != nil || len(fl.Nodes) != 1 || fl.Template == nil {
			t.Fatalf("step %d: Flat = %+v, %v", step, fl, err)
		}
		name, _ := r.b.FuncName(fl.Nodes[0].Kernel.Func)
		if name != want.kernel || fl.Nodes[0].Kernel.Args[0].AsPtr() != ops[0] {
			t.Fatalf("step %d: flattened node launches %s at %v", step, name, fl.Nodes[0].Kernel.Args[0])
		}
		if tmpl := tr.TemplateFor(c, ops); tmpl != fl.Template {
			t.Fatalf("step %d: TemplateFor gives another template than Flat", step)
		}
	}
	if c.Classes() != 3 {
		t.Errorf("%d classes seen, want 3", c.Classes())
	}
}

// lib is a trace.Library that records how the tracer calls it.
type lib struct {
	r         *rig
	ws        uint64
	workspace int
	prepared  []string
	runs      []gpu.DevicePtr
	failRun   error
}

func (l *lib) Workspace(gpu.Backend, int) (uint64, error) { l.workspace++; return l.ws, nil }

func (l *lib) Prepare(env *trace.Env) error {
	if capturing, err := env.Backend.StreamIsCapturing(l.r.s); err != nil || capturing {
		l.r.t.Errorf("Prepare ran while the capture stream was capturing (%v)", err)
	}
	key := fmt.Sprint(gpu.AlignClass(env.Ptrs[0]))
	l.prepared = append(l.prepared, key)
	return nil
}

func (l *lib) Run(env *trace.Env) error {
	l.runs = append(l.runs, env.Workspace)
	if env.Workspace != 0 && env.WorkspaceSize < l.ws {
		l.r.t.Errorf("workspace of %d bytes, asked for %d", env.WorkspaceSize, l.ws)
	}
	f, err := env.Kernel(kernels.Fill)
	if err != nil {
		return err
	}
	if err := env.Backend.LaunchKernel(f, kernels.Elementwise(4), []gpu.Arg{gpu.Ptr(env.Ptrs[0]), gpu.F32(3), gpu.I32(4)}, env.Stream); err != nil {
		return err
	}
	return l.failRun
}

// TestLibraryWorkspaceAndPrepare: the tracer sizes one workspace for all
// its library commands when it first runs or traces one, allocates it
// once, gives the same address to every call (eager and captured), calls
// Prepare once per alignment class and never while capturing, and frees
// the workspace at Close. Plain functions get no workspace.
func TestLibraryWorkspaceAndPrepare(t *testing.T) {
	r := newRig(t)
	l1, l2 := &lib{r: r, ws: 4096}, &lib{r: r, ws: 1 << 16}
	tr := trace.NewTracer(r.b, 0, r.s, trace.Options{Kernels: r.lookup})
	c1 := tr.NewLibraryCommand("l1", l1, []trace.Use{{Operand: 0}}, []uint64{16})
	c2 := tr.NewLibraryCommand("l2", l2, []trace.Use{{Operand: 0}}, []uint64{16})
	var plainWS []gpu.DevicePtr
	plain := tr.NewCommand("plain", func(env *trace.Env) error {
		plainWS = append(plainWS, env.Workspace)
		return nil
	}, []trace.Use{{Operand: 0}}, []uint64{16})
	before, ours := r.b.LiveHandles().Allocations, len(r.allocs)
	ops := []gpu.DevicePtr{r.alloc(16, 0)}
	if err := tr.Run(c1, ops, r.s); err != nil {
		t.Fatal(err)
	}
	if got := r.b.LiveHandles().Allocations - before; got != 2 || tr.WorkspaceSize() != 1<<16 {
		t.Fatalf("after the first run: %d new allocations (want the operand and one workspace), workspace %d bytes (want the largest asked, %d)",
			got, tr.WorkspaceSize(), 1<<16)
	}
	for _, ops := range [][]gpu.DevicePtr{ops, {r.alloc(16, 0)}, {r.alloc(16, 64)}, {r.alloc(16, 64)}} {
		if _, err := tr.Trace(c1, ops, true); err != nil {
			t.Fatal(err)
		}
		if _, err := tr.Trace(c2, ops, false); err != nil {
			t.Fatal(err)
		}
		if err := tr.Run(plain, ops, r.s); err != nil {
			t.Fatal(err)
		}
	}
	if l1.workspace != 1 || l2.workspace != 1 {
		t.Errorf("Workspace asked %d and %d times, want once each", l1.workspace, l2.workspace)
	}
	if len(l1.prepared) != 2 || len(l2.prepared) != 2 || tr.Stats.Prepares != 4 {
		t.Errorf("prepared %v and %v (%d), want once per command and class (2 classes)", l1.prepared, l2.prepared, tr.Stats.Prepares)
	}
	for _, w := range append(l1.runs, l2.runs...) {
		if w == 0 || w != l1.runs[0] {
			t.Fatalf("library runs saw workspaces %v and %v; want one address throughout", l1.runs, l2.runs)
		}
	}
	for _, w := range plainWS {
		if w != 0 {
			t.Fatalf("a plain function got the workspace %#x", uint64(w))
		}
	}
	// A failing library leaves nothing behind.
	boom := errors.New("boom")
	l1.failRun = boom
	if _, err := tr.Trace(c1, []gpu.DevicePtr{r.alloc(16, 0)}, false); !errors.Is(err, boom) {
		t.Fatalf("failing run: %v", err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if got, want := r.b.LiveHandles().Allocations-before, len(r.allocs)-ours; got != want {
		t.Errorf("after Close: %d allocations live beyond the test's %d operands: the workspace was not freed", got, want)
	}

	// NoWorkspace: libraries get none, nothing is allocated.
	l3 := &lib{r: r, ws: 4096}
	tr = trace.NewTracer(r.b, 0, r.s, trace.Options{Kernels: r.lookup, NoWorkspace: true})
	defer tr.Close()
	c3 := tr.NewLibraryCommand("l3", l3, []trace.Use{{Operand: 0}}, []uint64{16})
	if err := tr.Run(c3, ops, r.s); err != nil {
		t.Fatal(err)
	}
	if l3.runs[0] != 0 || l3.workspace != 0 || tr.WorkspaceSize() != 0 {
		t.Errorf("NoWorkspace: run saw %#x, Workspace asked %d times, size %d", uint64(l3.runs[0]), l3.workspace, tr.WorkspaceSize())
	}
}

// gemmCommand registers the mlp layer's GEMM with its bias (C, A, B, bias
// in four operands) with tr.
func gemmCommand(tr *trace.Tracer) *trace.Command {
	const m, n, k = 8, 256, 256
	g := blas.Gemm{M: m, N: n, K: k, Alpha: 1, Bias: true}
	return tr.NewLibraryCommand("gemm", blas.Command(g), []trace.Use{{Operand: 0}, {Operand: 1}, {Operand: 2}, {Operand: 3}},
		[]uint64{4 * m * n, 4 * m * k, 4 * k * n, 4 * n})
}

// TestGemmTraceWithoutWorkspace reproduces what the H100 showed: a GEMM
// whose library allocates its workspace inside the capture holds a new
// address in every trace, is not patchable, cannot be flattened, and is
// captured again at every new address. With the tracer's workspace the
// same GEMM is patchable and flattened: at fresh addresses every step,
// nothing is captured after the first trace.
func TestGemmTraceWithoutWorkspace(t *testing.T) {
	r := newRig(t)
	fresh := func() []gpu.DevicePtr {
		return []gpu.DevicePtr{r.alloc(4*8*256, 0), r.alloc(4*8*256, 0), r.alloc(4*256*256, 0), r.alloc(4*256, 0)}
	}
	const steps = 10
	for _, owned := range []bool{false, true} {
		tr := trace.NewTracer(r.b, 0, r.s, trace.Options{Kernels: r.lookup, NoWorkspace: !owned})
		c := gemmCommand(tr)
		var captures []int64
		for range steps {
			fl, err := tr.Flat(c, fresh(), true)
			if err != nil {
				t.Fatal(err)
			}
			if owned != (fl.Nodes != nil) {
				t.Fatalf("owned=%v: flattened %v (%s)", owned, fl.Nodes != nil, fl.Why)
			}
			captures = append(captures, tr.Stats.Captures)
		}
		ok, why := c.Patchable()
		flat, whyFlat := c.Flattened()
		t.Logf("owned workspace %v: captures after each step %v; patchable %v (%v); flattened %v (%s)", owned, captures, ok, why, flat, whyFlat)
		if owned {
			if !ok || !flat || captures[0] != 2 || captures[steps-1] != 2 {
				t.Errorf("with the tracer's workspace: captures %v (want 2 then none), patchable %v, flattened %v", captures, ok, flat)
			}
		} else {
			if ok || !strings.Contains(why.Error(), "mem-alloc") || flat || !strings.Contains(whyFlat, "mem-alloc") {
				t.Errorf("without a workspace: patchable %v (%v), flattened %v (%s); want neither, naming the mem-alloc node", ok, why, flat, whyFlat)
			}
			if captures[steps-1] != 2+steps-1 {
				t.Errorf("without a workspace: captures %v; want one per new address", captures)
			}
		}
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFlatMemcpyMemset: a traced function of a memset, a kernel and a copy
// is flattened into those three nodes, proved patchable (the copy's and
// the memset's pointers are slots), and moved by its template.
func TestFlatMemcpyMemset(t *testing.T) {
	r := newRig(t)
	const n = 16
	fn := func(env *trace.Env) error {
		y, x := env.Ptrs[0], env.Ptrs[1]
		if err := env.Backend.MemsetAsync(gpu.Memset{Dst: y, Value: 0, ElemSize: 4, Count: n}, env.Stream); err != nil {
			return err
		}
		f, err := env.Kernel(kernels.Axpy)
		if err != nil {
			return err
		}
		if err := env.Backend.LaunchKernel(f, kernels.Elementwise(n), []gpu.Arg{gpu.Ptr(y), gpu.Ptr(x), gpu.F32(2), gpu.I32(n)}, env.Stream); err != nil {
			return err
		}
		return env.Backend.MemcpyDtoDAsync(x.Add(4*n), y, 4*n, env.Stream)
	}
	tr := trace.NewTracer(r.b, 0, r.s, trace.Options{Kernels: r.lookup})
	defer tr.Close()
	c := tr.NewCommand("three", fn, []trace.Use{{Operand: 0}, {Operand: 1}}, []uint64{4 * n, 8 * n})
	ops := []gpu.DevicePtr{r.alloc(4*n, 0), r.alloc(8*n, 0)}
	fl, err := tr.Flat(c, ops, true)
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := c.Patchable(); !ok {
		t.Fatalf("not patchable: %v", why)
	}
	if len(fl.Nodes) != 3 || fl.Nodes[0].Type != gpu.NodeMemset || fl.Nodes[1].Type != gpu.NodeKernel || fl.Nodes[2].Type != gpu.NodeMemcpy {
		t.Fatalf("flattened into %+v", fl.Nodes)
	}
	if got := len(fl.Template.Slots()); got != 5 {
		t.Errorf("%d pointer slots, want 5 (memset dst, kernel y and x, copy dst and src)", got)
	}
	ops2 := []gpu.DevicePtr{r.alloc(4*n, 0), r.alloc(8*n, 0)}
	moved := fl.Template.NodesAt(ops2)
	if moved[0].Memset.Dst != ops2[0] || moved[2].Memcpy.Dst != ops2[1].Add(4*n) || moved[2].Memcpy.Src != ops2[0] ||
		moved[1].Kernel.Args[1].AsPtr() != ops2[1] {
		t.Errorf("moved nodes %+v", moved)
	}
	// In place, only the nodes whose pointers change are reported.
	changed := fl.Template.Apply(moved, ops2, nil)
	if len(changed) != 0 {
		t.Errorf("Apply to the same addresses changed nodes %v", changed)
	}
	ops3 := []gpu.DevicePtr{ops2[0], r.alloc(8*n, 0)} // only x moves
	if changed := fl.Template.Apply(moved, ops3, nil); len(changed) != 2 || changed[0] != 1 || changed[1] != 2 {
		t.Errorf("moving x changed nodes %v, want the kernel and the copy", changed)
	}
}
