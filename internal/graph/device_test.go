package graph_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/graph"
	"github.com/stablegraph/stablegraph/internal/trace"
	"github.com/stablegraph/stablegraph/kernels"
)

// devStep is a step over buffers x (0), y (1), z (2, all movable) and t (3,
// fixed): a kernel y = 2x+1, a copy of x into z (a copy kernel), a
// 6-byte memset of t... and of z (host path: no whole 4-byte elements),
// and a traced command on the host path (a collective's place) that
// copies y into t.
func devStep(t *testing.T, m *mlp) (*graph.CommandBuffer, []gpu.DevicePtr, gpu.Function, gpu.Function) {
	t.Helper()
	fn := func(name string) gpu.Function {
		f, err := m.b.ModuleFunction(m.mod, name)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	axpb, cp, fill := fn(kernels.Axpb), fn(kernels.Copy), fn(kernels.Fill)
	const n = 16
	tc := m.tr.NewCommand("collective's place", func(env *trace.Env) error {
		f, err := env.Kernel(kernels.Copy)
		if err != nil {
			return err
		}
		return env.Backend.LaunchKernel(f, kernels.Elementwise(n), []gpu.Arg{gpu.Ptr(env.Ptrs[0]), gpu.Ptr(env.Ptrs[1]), gpu.I32(n)}, env.Stream)
	}, []trace.Use{{Operand: 0}, {Operand: 1}}, []uint64{4 * n, 4 * n})
	cmds := []graph.Command{
		{Name: "axpb", Kind: graph.KindKernel, Func: axpb, Config: kernels.Elementwise(n),
			Args: []graph.Arg{ptr(1), ptr(0), {Value: gpu.F32(2)}, {Value: gpu.F32(1)}, {Value: gpu.I32(n)}}},
		{Name: "copy", Kind: graph.KindMemcpy, Dst: graph.Ref{Buf: 2}, Src: graph.Ref{Buf: 0}, Size: 4 * n},
		{Name: "memset", Kind: graph.KindMemset, Dst: graph.Ref{Buf: 2, Off: 4 * n}, Value: 0x5a, ElemSize: 1, Count: 6},
		{Name: "traced", Kind: graph.KindTraced, Trace: tc, Operands: []int{3, 1}, HostPath: true},
	}
	cb, err := graph.New(0, 4, cmds, m.tr)
	if err != nil {
		t.Fatal(err)
	}
	addrs := []gpu.DevicePtr{m.alloc(4*n, 0), m.alloc(4*n, 0), m.alloc(4*n+8, 0), m.alloc(4*n, 0)}
	return cb, addrs, cp, fill
}

// TestRecordDevice: RecordDevice opts in the kernel nodes with a pointer
// into a movable buffer, at the offsets of their parameter layouts, the
// copy as a copy kernel among them; the memset it cannot make a kernel and
// the host-path traced command are not opted in, and PatchDevice moves
// them from the host, touching no opted-in node.
// uploaded instantiates rec and uploads it on m's stream, as a device
// exec must be before its first launch; the exec is destroyed when the
// test ends.
func uploaded(t *testing.T, m *mlp, du gpu.DeviceUpdates, rec *graph.DeviceRecording) *graph.Exec {
	t.Helper()
	x, err := rec.Instantiate(m.b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Destroy(m.b) })
	if err := du.GraphUpload(x.X, m.s); err != nil {
		t.Fatal(err)
	}
	return x
}

func TestRecordDevice(t *testing.T) {
	m := newMLP(t, 2, 4, 1, trace.Options{})
	cb, addrs, cp, fill := devStep(t, m)
	du, err := gpu.DeviceUpdatesOf(m.b, 0)
	if err != nil {
		t.Fatal(err)
	}
	opts := graph.DeviceOptions{Movable: []bool{true, true, true, false}, Copy: cp, Fill: fill}
	if _, err := cb.RecordDevice(m.b, du, addrs[:2], opts); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("RecordDevice with 2 addresses for 4 buffers: %v", err)
	}
	rec, err := cb.RecordDevice(m.b, du, addrs, opts)
	if err != nil {
		t.Fatal(err)
	}
	// axpb: y at 0, x at 8; the copy kernel: z at 0, x at 8.
	type slot struct {
		buf    int
		offset uint32
	}
	var got []slot
	for _, s := range rec.Slots {
		got = append(got, slot{s.Buf, s.Offset})
		if d, err := du.GraphKernelNodeDevNode(s.Node); err != nil || d != s.Dev || d == 0 {
			t.Errorf("slot %+v: node opted in as %#x, %v", s, uint64(d), err)
		}
	}
	if want := []slot{{0, 8}, {0, 8}, {1, 0}, {2, 0}}; !slices.Equal(got, want) {
		t.Errorf("slots %+v, want %+v", got, want)
	}
	if want := []graph.SlotRange{{Buf: 0, First: 0, N: 2}, {Buf: 1, First: 2, N: 1}, {Buf: 2, First: 3, N: 1}}; !slices.Equal(rec.Ranges, want) {
		t.Errorf("ranges %+v, want %+v", rec.Ranges, want)
	}
	nodes, err := m.b.GraphNodes(rec.Graph())
	if err != nil {
		t.Fatal(err)
	}
	opted := 0
	for _, n := range nodes {
		if typ, _ := m.b.GraphNodeType(n); typ == gpu.NodeKernel {
			if d, _ := du.GraphKernelNodeDevNode(n); d != 0 {
				opted++
			}
		}
	}
	if opted != 2 || len(nodes) != 4 {
		t.Errorf("%d nodes, %d opted in; want 4 and 2 (not the memset, not the traced command's kernel)", len(nodes), opted)
	}
	x := uploaded(t, m, du, rec)
	s := m.s
	// Nothing moved: nothing to do. x, y and z moved: the memset and the
	// traced command from the host; the opted-in nodes stay as recorded,
	// so the exec needs no upload to launch.
	if n, err := cb.PatchDevice(m.b, x, addrs); err != nil || n != 0 {
		t.Errorf("PatchDevice with nothing moved: %d, %v", n, err)
	}
	moved := []gpu.DevicePtr{m.alloc(64, 0), m.alloc(64, 0), m.alloc(72, 0), addrs[3]}
	n, err := cb.PatchDevice(m.b, x, moved)
	if err != nil || n != 2 {
		t.Fatalf("PatchDevice: %d nodes from the host, %v; want the memset and the traced command's kernel", n, err)
	}
	if !slices.Equal(x.Addrs(), moved) {
		t.Errorf("Addrs after PatchDevice %v, want %v", x.Addrs(), moved)
	}
	if err := x.Launch(m.b, s); err != nil {
		t.Errorf("launch after moving only nodes that are not device-updatable: %v", err)
	}
	if err := m.b.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
	// The copy kernel off 4-byte alignment: refused, to record again.
	odd := []gpu.DevicePtr{moved[0].Add(2), moved[1], moved[2], moved[3]}
	if _, err := cb.PatchDevice(m.b, x, odd); !errors.Is(err, gpu.ErrGraphUpdate) {
		t.Errorf("PatchDevice with the copy kernel's source unaligned: %v, want ErrGraphUpdate", err)
	}
	// Not a device exec.
	plain, err := cb.Instantiate(m.b, addrs, true)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Destroy(m.b)
	if _, err := cb.PatchDevice(m.b, plain, moved); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("PatchDevice of an exec not recorded for it: %v", err)
	}
	// What the host path moves, counted.
	if mv := x.Moves(cb, []int{0, 1, 2}); mv != (graph.Moves{Nodes: 3, Copies: 2, Kernelizable: 1, Traced: 1}) {
		t.Errorf("Exec.Moves %+v", mv)
	}
	if mv := cb.Moves([]int{0, 1, 2}); mv != (graph.Moves{Nodes: 3, Copies: 2, Kernelizable: 1, Traced: 1}) {
		t.Errorf("CommandBuffer.Moves %+v", mv)
	}
}

// TestRecordDeviceFlattenedGEMM: a flattened GEMM's kernel nodes are opted
// in at its template's slots (the split-K GEMM: its split kernel reads x);
// the estimate counts it as LibraryNodes node, the exec as the nodes that
// point into the buffers moved.
func TestRecordDeviceFlattenedGEMM(t *testing.T) {
	m := newMLP(t, 8, 128, 2, trace.Options{})
	a := m.fresh(0)
	du, err := gpu.DeviceUpdatesOf(m.b, 0)
	if err != nil {
		t.Fatal(err)
	}
	movable := make([]bool, m.nbufs)
	movable[0], movable[1] = true, true
	rec, err := m.cb.RecordDevice(m.b, du, a, graph.DeviceOptions{Movable: movable})
	if err != nil {
		t.Fatal(err)
	}
	x, err := rec.Instantiate(m.b)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Destroy(m.b)
	// x is the GEMM of layer 0's A: one slot in its split kernel; y is the
	// last tanh's output.
	if len(rec.Ranges) != 2 || rec.Ranges[0].N != 1 || rec.Ranges[1].N != 1 {
		t.Fatalf("ranges %+v", rec.Ranges)
	}
	if mv := x.Moves(m.cb, []int{0}); mv != (graph.Moves{Nodes: 1}) {
		t.Errorf("Exec.Moves(x) %+v", mv)
	}
	if mv := m.cb.Moves([]int{0, 1}); mv != (graph.Moves{Nodes: graph.LibraryNodes + 1}) {
		t.Errorf("CommandBuffer.Moves(x, y) %+v", mv)
	}
	if n, err := m.cb.PatchDevice(m.b, x, m.fresh(0)); err != nil || n != 0 {
		t.Errorf("PatchDevice in the class: %d, %v", n, err)
	}
	if _, err := m.cb.PatchDevice(m.b, x, m.fresh(4)); !errors.Is(err, gpu.ErrGraphUpdate) {
		t.Errorf("PatchDevice at another alignment class: %v, want ErrGraphUpdate", err)
	}
}

// TestRecordDeviceHostLead: with HostLead 1 the step's first command (the
// kernel, which points into x and y) is not opted in and moves from the
// host, with no upload; the patcher goes before the next command with a
// slot (the copy kernel), beside the first. HostLead 0 puts it before the
// first command; HostLead 2 makes the copy a lead command too, left a copy
// node, so that nothing is left for the device.
func TestRecordDeviceHostLead(t *testing.T) {
	m := newMLP(t, 2, 4, 1, trace.Options{})
	cb, addrs, cp, fill := devStep(t, m)
	du, err := gpu.DeviceUpdatesOf(m.b, 0)
	if err != nil {
		t.Fatal(err)
	}
	opts := func(lead int) graph.DeviceOptions {
		return graph.DeviceOptions{Movable: []bool{true, true, true, false}, Copy: cp, Fill: fill, HostLead: lead}
	}
	if _, err := cb.RecordDevice(m.b, du, addrs, opts(-1)); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("RecordDevice with HostLead -1: %v", err)
	}
	kernelNodes := func(g gpu.Graph) (all []gpu.GraphNode, opted int) {
		nodes, err := m.b.GraphNodes(g)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			if typ, _ := m.b.GraphNodeType(n); typ == gpu.NodeKernel {
				all = append(all, n)
				if d, _ := du.GraphKernelNodeDevNode(n); d != 0 {
					opted++
				}
			}
		}
		return all, opted
	}

	rec0, err := cb.RecordDevice(m.b, du, addrs, opts(0))
	if err != nil {
		t.Fatal(err)
	}
	if _, opted := kernelNodes(rec0.Graph()); opted != 2 || rec0.Lead != 0 || len(rec0.Before) != 1 || rec0.Before[0] != rec0.Slots[0].Node {
		t.Errorf("HostLead 0: %d opted in, lead %d, before %v; want 2, 0 and the kernel's node", opted, rec0.Lead, rec0.Before)
	}
	if err := rec0.Destroy(m.b); err != nil {
		t.Fatal(err)
	}

	rec, err := cb.RecordDevice(m.b, du, addrs, opts(1))
	if err != nil {
		t.Fatal(err)
	}
	all, opted := kernelNodes(rec.Graph())
	if opted != 1 || rec.Lead != 1 || len(rec.Slots) != 2 || len(rec.Before) != 1 {
		t.Fatalf("HostLead 1: %d kernel nodes, %d opted in, lead %d, slots %+v, before %v; want the copy kernel alone opted in, before it",
			len(all), opted, rec.Lead, rec.Slots, rec.Before)
	}
	copyNode := rec.Before[0]
	for _, s := range rec.Slots {
		if s.Node != copyNode {
			t.Errorf("slot %+v is not the copy kernel's", s)
		}
	}
	if d, err := m.b.GraphNodeDeps(copyNode); err != nil || len(d) != 1 || d[0] == copyNode {
		t.Errorf("the copy kernel depends on %v, %v; want the first command's node", d, err)
	}
	// The patcher's place: here a fill of the copy's destination, which
	// the copy overwrites only if it runs after.
	z := addrs[2]
	if _, err := du.GraphAddKernelNodeBefore(rec.Graph(), gpu.KernelParams{Func: fill, Config: kernels.Elementwise(16),
		Args: []gpu.Arg{gpu.Ptr(z), gpu.F32(-1), gpu.I32(16)}}, rec.Before); err != nil {
		t.Fatal(err)
	}
	x := uploaded(t, m, du, rec)
	// x and y move: the first command from the host, and the host-path
	// traced command (it reads y); z stays, and so do the copy kernel and
	// the memset.
	in := make([]float32, 16)
	for i := range in {
		in[i] = float32(i)
	}
	moved := []gpu.DevicePtr{m.upload(in, 0), m.alloc(64, 0), addrs[2], addrs[3]}
	n, err := cb.PatchDevice(m.b, x, moved)
	if err != nil || n != 2 {
		t.Fatalf("PatchDevice: %d nodes from the host, %v; want the first command's and the traced command's", n, err)
	}
	if err := x.Launch(m.b, m.s); err != nil {
		t.Fatalf("launch after moving the lead command from the host, no upload: %v", err)
	}
	if err := m.b.StreamSynchronize(m.s); err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, 64)
	if err := m.b.MemcpyDtoH(raw, moved[1]); err != nil {
		t.Fatal(err)
	}
	for i, v := range gpu.BytesToF32(raw) {
		if v != 2*float32(i)+1 {
			t.Fatalf("y[%d] = %v at the moved address, want %v", i, v, 2*float32(i)+1)
		}
	}

	rec2, err := cb.RecordDevice(m.b, du, addrs, opts(2))
	if err != nil {
		t.Fatal(err)
	}
	defer rec2.Destroy(m.b)
	if _, opted := kernelNodes(rec2.Graph()); opted != 0 || rec2.Lead != 2 || len(rec2.Slots) != 0 || len(rec2.Before) != 0 {
		t.Errorf("HostLead 2: %d opted in, lead %d, %d slots, before %v; want nothing on the device", opted, rec2.Lead, len(rec2.Slots), rec2.Before)
	}
}

// TestHostNode: a kernel node of a device exec that is no command's (the
// inline patcher's place) moves from the host in the set of the commands'
// nodes: a word set with HostNodeWord reaches the exec at ApplyHost when
// nothing else moves, and with the commands' nodes at PatchDevice (one
// Apply, no driver call of its own); the node is fixed once the set is
// prepared, and HostNodeWord needs one.
func TestHostNode(t *testing.T) {
	m := newMLP(t, 2, 4, 1, trace.Options{})
	cb, addrs, cp, fill := devStep(t, m)
	du, err := gpu.DeviceUpdatesOf(m.b, 0)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := cb.RecordDevice(m.b, du, addrs, graph.DeviceOptions{Movable: []bool{true, true, true, false}, Copy: cp, Fill: fill, HostLead: 1})
	if err != nil {
		t.Fatal(err)
	}
	w := []gpu.DevicePtr{m.alloc(64, 0), m.alloc(64, 0)}
	p := gpu.KernelParams{Func: fill, Config: kernels.Elementwise(16), Args: []gpu.Arg{gpu.Ptr(w[0]), gpu.F32(7), gpu.I32(16)}}
	node, err := du.GraphAddKernelNodeBefore(rec.Graph(), p, rec.Before)
	if err != nil {
		t.Fatal(err)
	}
	x := uploaded(t, m, du, rec)
	if err := cb.HostNodeWord(m.b, x, 0, 0, uint64(w[1])); !errors.Is(err, gpu.ErrIllegalState) {
		t.Errorf("HostNodeWord with no host node: %v", err)
	}
	if err := x.SetHostNode(node, p); err != nil {
		t.Fatal(err)
	}
	p.Args[0] = gpu.Ptr(0) // the exec keeps its own copy
	// filled launches x and says which of w it filled with 7s.
	filled := func() [2]bool {
		t.Helper()
		for _, b := range w {
			if err := m.b.Memset(gpu.Memset{Dst: b, ElemSize: 4, Count: 16}); err != nil {
				t.Fatal(err)
			}
		}
		if err := x.Launch(m.b, m.s); err != nil {
			t.Fatal(err)
		}
		if err := m.b.StreamSynchronize(m.s); err != nil {
			t.Fatal(err)
		}
		var out [2]bool
		for i, b := range w {
			raw := make([]byte, 64)
			if err := m.b.MemcpyDtoH(raw, b); err != nil {
				t.Fatal(err)
			}
			out[i] = gpu.BytesToF32(raw)[15] == 7
		}
		return out
	}
	if got := filled(); got != [2]bool{true, false} {
		t.Fatalf("as recorded: filled %v", got)
	}
	// Nothing else moves: ApplyHost applies it.
	if err := cb.HostNodeWord(m.b, x, 0, 0, uint64(w[1])); err != nil {
		t.Fatal(err)
	}
	if got := filled(); got != [2]bool{true, false} {
		t.Fatalf("staged, not applied: filled %v", got)
	}
	if err := cb.ApplyHost(x); err != nil {
		t.Fatal(err)
	}
	if got := filled(); got != [2]bool{false, true} {
		t.Fatalf("after ApplyHost: filled %v", got)
	}
	if err := x.SetHostNode(node, p); !errors.Is(err, gpu.ErrIllegalState) {
		t.Errorf("SetHostNode once the set is prepared: %v", err)
	}
	// With the first command moved: PatchDevice applies both, and
	// ApplyHost has nothing left to do.
	if err := cb.HostNodeWord(m.b, x, 0, 0, uint64(w[0])); err != nil {
		t.Fatal(err)
	}
	moved := slices.Clone(addrs)
	moved[0] = m.alloc(64, 0)
	if _, err := cb.PatchDevice(m.b, x, moved); err != nil {
		t.Fatal(err)
	}
	before := m.b.Calls("GraphExecKernelNodeSetParams")
	if err := cb.ApplyHost(x); err != nil {
		t.Fatal(err)
	}
	if d := m.b.Calls("GraphExecKernelNodeSetParams") - before; d != 0 {
		t.Errorf("ApplyHost after PatchDevice made %d exec updates", d)
	}
	if got := filled(); got != [2]bool{true, false} {
		t.Fatalf("after PatchDevice: filled %v", got)
	}
}
