package sim

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

func wantUpdate(t *testing.T, err error, r gpu.UpdateResult) {
	t.Helper()
	var ue *gpu.UpdateError
	if !errors.As(err, &ue) || ue.Result != r || !errors.Is(err, gpu.ErrGraphUpdate) {
		t.Fatalf("got %v, want an UpdateError %q", err, r)
	}
}

func nodeTypes(t *testing.T, b *Backend, g gpu.Graph) ([]gpu.GraphNode, []gpu.NodeType) {
	t.Helper()
	ns, err := b.GraphNodes(g)
	must(t, err)
	var ts []gpu.NodeType
	for _, n := range ns {
		typ, err := b.GraphNodeType(n)
		must(t, err)
		ts = append(ts, typ)
	}
	return ns, ts
}

func TestCaptureRecordsNodesInsteadOfRunning(t *testing.T) {
	b := newSim(t, Config{})
	k := loadKernels(t, b, 0)
	s := newStream(t, b, 0)
	const n = 32
	x, y := alloc(t, b, 0, 4*n), alloc(t, b, 0, 4*n)
	h, err := b.HostAlloc(8)
	must(t, err)
	defer func() { must(t, b.HostFree(h.Handle)) }()

	// An exec graph to be launched inside the capture: y += x.
	inner := newGraph(t, b, 0)
	_, err = b.GraphAddKernelNode(inner, nil, gpu.KernelParams{Func: k.fn(t, kernels.Axpy), Config: kernels.Elementwise(n),
		Args: []gpu.Arg{gpu.Ptr(y), gpu.Ptr(x), gpu.F32(1), gpu.I32(n)}})
	must(t, err)
	ix := instantiate(t, b, inner)

	must(t, b.StreamBeginCapture(s))
	if c, err := b.StreamIsCapturing(s); !c || err != nil {
		t.Fatalf("StreamIsCapturing = %v, %v", c, err)
	}
	must(t, b.LaunchKernel(k.fn(t, kernels.Fill), kernels.Elementwise(n), fillArgs(x, 3, n), s))
	must(t, b.MemsetAsync(gpu.Memset{Dst: y, ElemSize: 4, Count: n}, s))
	must(t, b.MemcpyDtoDAsync(y, x, 4*n, s))
	must(t, b.GraphLaunch(ix, s))
	must(t, b.StreamWriteValue64(s, h.Ptr, 1))
	g, err := b.StreamEndCapture(s)
	must(t, err)
	defer func() { must(t, b.GraphDestroy(g)) }()
	if c, _ := b.StreamIsCapturing(s); c {
		t.Fatal("still capturing after end")
	}

	// Nothing ran.
	must(t, b.StreamSynchronize(s))
	wantAll(t, readF32(t, b, x, n), 0)
	if h.Load64(0) != 0 {
		t.Fatal("captured value write ran")
	}

	ns, ts := nodeTypes(t, b, g)
	want := []gpu.NodeType{gpu.NodeKernel, gpu.NodeMemset, gpu.NodeMemcpy, gpu.NodeChildGraph, gpu.NodeMemWriteValue}
	if !slices.Equal(ts, want) {
		t.Fatalf("captured node types %v, want %v", ts, want)
	}
	for i, nd := range ns {
		deps, err := b.GraphNodeDeps(nd)
		must(t, err)
		if i == 0 && len(deps) != 0 || i > 0 && !slices.Equal(deps, ns[i-1:i]) {
			t.Fatalf("node %d deps %v", i, deps)
		}
	}
	kp, err := b.GraphKernelNodeParams(ns[0])
	must(t, err)
	if kp.Args[1].AsF32() != 3 || kp.Func != k.fn(t, kernels.Fill) {
		t.Fatalf("captured kernel params %+v", kp)
	}
	child, err := b.GraphChildGraph(ns[3])
	must(t, err)
	if _, cts := nodeTypes(t, b, child); !slices.Equal(cts, []gpu.NodeType{gpu.NodeKernel}) {
		t.Fatalf("child graph of captured launch: %v", cts)
	}

	x2 := instantiate(t, b, g)
	must(t, b.GraphLaunch(x2, s))
	must(t, b.StreamSynchronize(s))
	wantAll(t, readF32(t, b, y, n), 6) // y = x, then y += x
	if h.Load64(0) != 1 {
		t.Fatal("value write node did not run")
	}
}

func TestCaptureInvalidation(t *testing.T) {
	b := newSim(t, Config{})
	k := loadKernels(t, b, 0)
	s := newStream(t, b, 0)
	p := alloc(t, b, 0, 64)
	fill := k.fn(t, kernels.Fill)

	wantEnd := func(sentinel error) {
		t.Helper()
		g, err := b.StreamEndCapture(s)
		wantErr(t, err, sentinel)
		if g != 0 {
			t.Fatalf("StreamEndCapture returned graph %#x with an error", g)
		}
	}
	wantEnd(gpu.ErrIllegalState)

	// Synchronizing a capturing stream invalidates the capture.
	must(t, b.StreamBeginCapture(s))
	wantErr(t, b.StreamBeginCapture(s), gpu.ErrIllegalState)
	must(t, b.LaunchKernel(fill, kernels.Elementwise(16), fillArgs(p, 1, 16), s))
	wantErr(t, b.StreamSynchronize(s), gpu.ErrCaptureInvalidated)
	wantErr(t, b.LaunchKernel(fill, kernels.Elementwise(16), fillArgs(p, 1, 16), s), gpu.ErrCaptureInvalidated)
	if c, _ := b.StreamIsCapturing(s); !c {
		t.Fatal("an invalidated capture must still be ended")
	}
	wantEnd(gpu.ErrCaptureInvalidated)
	wantEnd(gpu.ErrIllegalState)

	must(t, b.StreamBeginCapture(s))
	_, err := b.StreamQuery(s)
	wantErr(t, err, gpu.ErrCaptureInvalidated)
	wantEnd(gpu.ErrCaptureInvalidated)

	// Host copies cannot be captured.
	must(t, b.StreamBeginCapture(s))
	wantErr(t, b.MemcpyHtoDAsync(p, make([]byte, 4), s), gpu.ErrCaptureInvalidated)
	wantEnd(gpu.ErrCaptureInvalidated)
	must(t, b.StreamBeginCapture(s))
	wantErr(t, b.MemcpyDtoHAsync(make([]byte, 4), p, s), gpu.ErrCaptureInvalidated)
	wantEnd(gpu.ErrCaptureInvalidated)

	// Waiting on an event recorded outside the capture breaks isolation.
	e := newEvent(t, b, 0, 0)
	must(t, b.EventRecord(e, s))
	must(t, b.StreamBeginCapture(s))
	wantErr(t, b.StreamWaitEvent(s, e), gpu.ErrCaptureInvalidated)
	wantEnd(gpu.ErrCaptureInvalidated)

	// A bad launch is refused without breaking the capture.
	must(t, b.StreamBeginCapture(s))
	wantErr(t, b.LaunchKernel(fill, kernels.Elementwise(16), nil, s), gpu.ErrInvalidValue)
	must(t, b.LaunchKernel(fill, kernels.Elementwise(16), fillArgs(p, 1, 16), s))
	g, err := b.StreamEndCapture(s)
	must(t, err)
	if ns, _ := b.GraphNodes(g); len(ns) != 1 {
		t.Fatalf("capture has %d nodes, want 1", len(ns))
	}
	must(t, b.GraphDestroy(g))

	// Destroying a capturing stream discards the capture.
	s2, err := b.StreamCreate(0, 0, 0)
	must(t, err)
	must(t, b.StreamBeginCapture(s2))
	must(t, b.LaunchKernel(fill, kernels.Elementwise(16), fillArgs(p, 1, 16), s2))
	must(t, b.StreamDestroy(s2))
}

func TestCaptureForkJoin(t *testing.T) {
	b := newSim(t, Config{})
	k := loadKernels(t, b, 0)
	s1, s2, s3 := newStream(t, b, 0), newStream(t, b, 0), newStream(t, b, 0)
	fork, join := newEvent(t, b, 0, gpu.EventDisableTiming), newEvent(t, b, 0, gpu.EventDisableTiming)
	const n = 64
	x, y, z := alloc(t, b, 0, 4*n), alloc(t, b, 0, 4*n), alloc(t, b, 0, 4*n)
	fill := k.fn(t, kernels.Fill)

	must(t, b.StreamBeginCapture(s1))
	must(t, b.MemsetAsync(gpu.Memset{Dst: x, ElemSize: 4, Count: n}, s1))
	must(t, b.EventRecord(fork, s1))
	must(t, b.StreamWaitEvent(s2, fork)) // s2 joins the capture
	if c, _ := b.StreamIsCapturing(s2); !c {
		t.Fatal("forked stream is not capturing")
	}
	must(t, b.LaunchKernel(fill, kernels.Elementwise(n), fillArgs(y, 2, n), s2))
	must(t, b.LaunchKernel(fill, kernels.Elementwise(n), fillArgs(z, 3, n), s1))
	must(t, b.EventRecord(join, s2))
	// Events marking capture points cannot be waited on from the host.
	wantErr(t, b.EventSynchronize(join), gpu.ErrIllegalState)
	_, err := b.StreamEndCapture(s2)
	wantErr(t, err, gpu.ErrIllegalState) // not the origin
	must(t, b.StreamWaitEvent(s1, join))
	must(t, b.MemcpyDtoDAsync(x, y, 4*n, s1))
	g, err := b.StreamEndCapture(s1)
	must(t, err)
	defer func() { must(t, b.GraphDestroy(g)) }()
	if c, _ := b.StreamIsCapturing(s2); c {
		t.Fatal("forked stream still capturing after the end")
	}
	ns, ts := nodeTypes(t, b, g)
	if !slices.Equal(ts, []gpu.NodeType{gpu.NodeMemset, gpu.NodeKernel, gpu.NodeKernel, gpu.NodeMemcpy}) {
		t.Fatalf("node types %v", ts)
	}
	for i, want := range [][]gpu.GraphNode{nil, {ns[0]}, {ns[0]}, {ns[2], ns[1]}} {
		deps, _ := b.GraphNodeDeps(ns[i])
		if !slices.Equal(deps, want) {
			t.Fatalf("node %d deps %v, want %v", i, deps, want)
		}
	}
	x1 := instantiate(t, b, g)
	must(t, b.GraphLaunch(x1, s3))
	must(t, b.StreamSynchronize(s3))
	wantAll(t, readF32(t, b, x, n), 2)
	wantAll(t, readF32(t, b, z, n), 3)

	// A fork never joined back invalidates the capture at its end, and
	// releases the forked stream.
	must(t, b.StreamBeginCapture(s1))
	must(t, b.EventRecord(fork, s1))
	must(t, b.StreamWaitEvent(s2, fork))
	must(t, b.LaunchKernel(fill, kernels.Elementwise(n), fillArgs(y, 2, n), s2))
	_, err = b.StreamEndCapture(s1)
	wantErr(t, err, gpu.ErrCaptureInvalidated)
	if c, _ := b.StreamIsCapturing(s2); c {
		t.Fatal("forked stream still capturing after an unjoined end")
	}
	// A fork with no work of its own needs no join.
	must(t, b.StreamBeginCapture(s1))
	must(t, b.EventRecord(fork, s1))
	must(t, b.StreamWaitEvent(s2, fork))
	g2, err := b.StreamEndCapture(s1)
	must(t, err)
	must(t, b.GraphDestroy(g2))
	// The event works as a plain event again once recorded outside capture.
	must(t, b.EventRecord(fork, s1))
	must(t, b.EventSynchronize(fork))
}

func TestGraphConstructionRules(t *testing.T) {
	b := newSim(t, Config{})
	k := loadKernels(t, b, 0)
	const n = 16
	p := alloc(t, b, 0, 4*n)
	fillP := func(v float32) gpu.KernelParams {
		return gpu.KernelParams{Func: k.fn(t, kernels.Fill), Config: kernels.Elementwise(n), Args: fillArgs(p, v, n)}
	}
	g1, g2 := newGraph(t, b, 0), newGraph(t, b, 0)
	a, err := b.GraphAddKernelNode(g1, nil, fillP(1))
	must(t, err)
	c, err := b.GraphAddEmptyNode(g2, nil)
	must(t, err)
	_, err = b.GraphAddEmptyNode(g1, []gpu.GraphNode{c})
	wantErr(t, err, gpu.ErrInvalidValue)
	_, err = b.GraphAddEmptyNode(g1, []gpu.GraphNode{a, a})
	wantErr(t, err, gpu.ErrInvalidValue)
	_, err = b.GraphAddEmptyNode(g1, []gpu.GraphNode{123456})
	wantErr(t, err, gpu.ErrInvalidHandle)
	_, err = b.GraphAddKernelNode(g1, nil, gpu.KernelParams{Func: k.fn(t, kernels.Fill), Config: kernels.Elementwise(n), Args: fillArgs(p, 1, n)[:1]})
	wantErr(t, err, gpu.ErrInvalidValue)
	_, err = b.GraphAddMemsetNode(g1, nil, gpu.Memset{Dst: p, ElemSize: 8, Count: 1})
	wantErr(t, err, gpu.ErrInvalidValue)
	if ns, _ := b.GraphNodes(g1); len(ns) != 1 {
		t.Fatalf("refused nodes were added: %v", ns)
	}

	// Typed params come back as copies.
	kp, err := b.GraphKernelNodeParams(a)
	must(t, err)
	kp.Args[1] = gpu.F32(99)
	kp2, _ := b.GraphKernelNodeParams(a)
	if kp2.Args[1].AsF32() != 1 {
		t.Fatal("GraphKernelNodeParams returned the node's own slice")
	}
	_, err = b.GraphKernelNodeParams(c)
	wantErr(t, err, gpu.ErrInvalidValue)
	_, err = b.GraphChildGraph(a)
	wantErr(t, err, gpu.ErrInvalidValue)

	// A child graph node holds a deep copy; a graph may embed itself.
	cn, err := b.GraphAddChildGraphNode(g2, []gpu.GraphNode{c}, g1)
	must(t, err)
	_, err = b.GraphAddKernelNode(g1, []gpu.GraphNode{a}, fillP(2))
	must(t, err)
	cg, err := b.GraphChildGraph(cn)
	must(t, err)
	if ns, _ := b.GraphNodes(cg); len(ns) != 1 {
		t.Fatalf("child graph changed with its source: %d nodes", len(ns))
	}
	wantErr(t, b.GraphDestroy(cg), gpu.ErrInvalidValue)
	self, err := b.GraphAddChildGraphNode(g1, nil, g1)
	must(t, err)
	sg, _ := b.GraphChildGraph(self)
	if ns, _ := b.GraphNodes(sg); len(ns) != 2 {
		t.Fatalf("self child has %d nodes, want 2", len(ns))
	}

	// Instantiation snapshots: nodes added later do not run.
	g3 := newGraph(t, b, 0)
	_, err = b.GraphAddKernelNode(g3, nil, fillP(5))
	must(t, err)
	x := instantiate(t, b, g3)
	_, err = b.GraphAddKernelNode(g3, nil, fillP(6))
	must(t, err)
	s := newStream(t, b, 0)
	must(t, b.GraphLaunch(x, s))
	must(t, b.StreamSynchronize(s))
	wantAll(t, readF32(t, b, p, n), 5)

	// Destroying the graph leaves the exec usable; its nodes are gone.
	g4, err := b.GraphCreate(0)
	must(t, err)
	n4, err := b.GraphAddKernelNode(g4, nil, fillP(8))
	must(t, err)
	x4 := instantiate(t, b, g4)
	must(t, b.GraphDestroy(g4))
	_, err = b.GraphNodeType(n4)
	wantErr(t, err, gpu.ErrInvalidHandle)
	wantErr(t, b.GraphExecKernelNodeSetParams(x4, n4, fillP(9)), gpu.ErrInvalidHandle)
	must(t, b.GraphLaunch(x4, s))
	must(t, b.StreamSynchronize(s))
	wantAll(t, readF32(t, b, p, n), 8)
}

// updateFixture is a graph fill(x, 1) → memset(y) → child{fill(y2, 2)}, its
// exec, and the buffers.
type updateFixture struct {
	b       *Backend
	k       kern
	s       gpu.Stream
	x, y    gpu.DevicePtr
	g       gpu.Graph
	exec    gpu.GraphExec
	nodes   []gpu.GraphNode
	childNd gpu.GraphNode
}

const fixN = 16

func (f *updateFixture) fill(t *testing.T, p gpu.DevicePtr, v float32) gpu.KernelParams {
	return gpu.KernelParams{Func: f.k.fn(t, kernels.Fill), Config: kernels.Elementwise(fixN), Args: fillArgs(p, v, fixN)}
}

// build builds a graph of the fixture's shape with the given values.
func (f *updateFixture) build(t *testing.T, xv float32, yv uint32, cv float32) gpu.Graph {
	b := f.b
	g := newGraph(t, b, 0)
	child := newGraph(t, b, 0)
	_, err := b.GraphAddKernelNode(child, nil, f.fill(t, f.y+4*fixN, cv))
	must(t, err)
	n0, err := b.GraphAddKernelNode(g, nil, f.fill(t, f.x, xv))
	must(t, err)
	n1, err := b.GraphAddMemsetNode(g, []gpu.GraphNode{n0}, gpu.Memset{Dst: f.y, Value: yv, ElemSize: 4, Count: fixN})
	must(t, err)
	_, err = b.GraphAddChildGraphNode(g, []gpu.GraphNode{n1}, child)
	must(t, err)
	return g
}

func newUpdateFixture(t *testing.T, b *Backend) *updateFixture {
	f := &updateFixture{b: b, k: loadKernels(t, b, 0), s: newStream(t, b, 0)}
	f.x, f.y = alloc(t, b, 0, 4*fixN), alloc(t, b, 0, 8*fixN)
	f.g = f.build(t, 1, 10, 2)
	f.exec = instantiate(t, b, f.g)
	var err error
	f.nodes, err = b.GraphNodes(f.g)
	must(t, err)
	cg, err := b.GraphChildGraph(f.nodes[2])
	must(t, err)
	cns, err := b.GraphNodes(cg)
	must(t, err)
	f.childNd = cns[0]
	return f
}

// run launches the exec and returns x, y and y's second half (the child).
func (f *updateFixture) run(t *testing.T) (float32, uint32, float32) {
	t.Helper()
	b := f.b
	must(t, b.Memset(gpu.Memset{Dst: f.x, ElemSize: 4, Count: fixN}))
	must(t, b.Memset(gpu.Memset{Dst: f.y, ElemSize: 4, Count: 2 * fixN}))
	must(t, b.GraphLaunch(f.exec, f.s))
	must(t, b.StreamSynchronize(f.s))
	y := make([]byte, 8*fixN)
	must(t, b.MemcpyDtoH(y, f.y))
	return readF32(t, b, f.x, 1)[0], uint32(y[0]), gpu.BytesToF32(y[4*fixN:])[fixN-1]
}

func TestGraphExecUpdateRefusals(t *testing.T) {
	b := newSim(t, Config{Devices: 2})
	f := newUpdateFixture(t, b)
	check := func(x float32, y uint32, c float32) {
		t.Helper()
		gx, gy, gc := f.run(t)
		if gx != x || gy != y || gc != c {
			t.Fatalf("exec ran (%v, %v, %v), want (%v, %v, %v)", gx, gy, gc, x, y, c)
		}
	}
	check(1, 10, 2)

	// Node count.
	g := newGraph(t, b, 0)
	_, err := b.GraphAddEmptyNode(g, nil)
	must(t, err)
	wantUpdate(t, b.GraphExecUpdate(f.exec, g), gpu.UpdateTopologyChanged)

	// Edges: same nodes, memset no longer depends on the kernel.
	g = newGraph(t, b, 0)
	n0, _ := b.GraphAddKernelNode(g, nil, f.fill(t, f.x, 1))
	n1, _ := b.GraphAddMemsetNode(g, nil, gpu.Memset{Dst: f.y, ElemSize: 4, Count: fixN})
	_, err = b.GraphAddChildGraphNode(g, []gpu.GraphNode{n1}, newGraph(t, b, 0))
	must(t, err)
	_ = n0
	wantUpdate(t, b.GraphExecUpdate(f.exec, g), gpu.UpdateTopologyChanged)

	// Node type: an empty node where the memset was.
	g = newGraph(t, b, 0)
	n0, _ = b.GraphAddKernelNode(g, nil, f.fill(t, f.x, 1))
	n1, _ = b.GraphAddEmptyNode(g, []gpu.GraphNode{n0})
	cg := newGraph(t, b, 0)
	_, _ = b.GraphAddKernelNode(cg, nil, f.fill(t, f.y, 1))
	_, err = b.GraphAddChildGraphNode(g, []gpu.GraphNode{n1}, cg)
	must(t, err)
	wantUpdate(t, b.GraphExecUpdate(f.exec, g), gpu.UpdateNodeTypeChanged)

	// Child graph compared recursively: an extra node in the child.
	g = f.build(t, 1, 10, 2)
	ns, _ := b.GraphNodes(g)
	cgh, _ := b.GraphChildGraph(ns[2])
	_, err = b.GraphAddEmptyNode(cgh, nil)
	must(t, err)
	wantUpdate(t, b.GraphExecUpdate(f.exec, g), gpu.UpdateTopologyChanged)

	// A kernel of another device.
	k1 := loadKernels(t, b, 1)
	g = f.build(t, 1, 10, 2)
	g2 := newGraph(t, b, 0)
	n0, _ = b.GraphAddKernelNode(g2, nil, gpu.KernelParams{Func: k1.fn(t, kernels.Fill), Config: kernels.Elementwise(fixN), Args: fillArgs(f.x, 1, fixN)})
	n1, _ = b.GraphAddMemsetNode(g2, []gpu.GraphNode{n0}, gpu.Memset{Dst: f.y, ElemSize: 4, Count: fixN})
	ns, _ = b.GraphNodes(g)
	cgh, _ = b.GraphChildGraph(ns[2])
	_, err = b.GraphAddChildGraphNode(g2, []gpu.GraphNode{n1}, cgh)
	must(t, err)
	wantUpdate(t, b.GraphExecUpdate(f.exec, g2), gpu.UpdateFunctionChanged)

	// A memset element size change.
	g = newGraph(t, b, 0)
	n0, _ = b.GraphAddKernelNode(g, nil, f.fill(t, f.x, 1))
	n1, _ = b.GraphAddMemsetNode(g, []gpu.GraphNode{n0}, gpu.Memset{Dst: f.y, ElemSize: 2, Count: 2 * fixN})
	_, _ = b.GraphAddChildGraphNode(g, []gpu.GraphNode{n1}, cgh)
	wantUpdate(t, b.GraphExecUpdate(f.exec, g), gpu.UpdateParametersChanged)

	// After every refusal the exec is unchanged.
	check(1, 10, 2)

	// A compatible graph updates every node, the child's included.
	must(t, b.GraphExecUpdate(f.exec, f.build(t, 4, 20, 5)))
	check(4, 20, 5)
	// Per-node updates still name nodes of the source graph.
	must(t, b.GraphExecKernelNodeSetParams(f.exec, f.nodes[0], f.fill(t, f.x, 7)))
	check(7, 20, 5)
}

func TestPerNodeUpdatesTakeEffectAtNextLaunch(t *testing.T) {
	b := newSim(t, Config{})
	f := newUpdateFixture(t, b)
	gt := newGate(t, b, 0)

	// Two launches queued behind a gate, with an update between them.
	gt.launch(t, b, f.s)
	out1, out2 := make([]byte, 8*fixN), make([]byte, 8*fixN)
	x1, x2 := make([]byte, 4), make([]byte, 4)
	must(t, b.GraphLaunch(f.exec, f.s))
	must(t, b.MemcpyDtoHAsync(out1, f.y, f.s))
	must(t, b.MemcpyDtoHAsync(x1, f.x, f.s))
	must(t, b.GraphExecKernelNodeSetParams(f.exec, f.nodes[0], f.fill(t, f.x, 3)))
	must(t, b.GraphExecMemsetNodeSetParams(f.exec, f.nodes[1], gpu.Memset{Dst: f.y, Value: 30, ElemSize: 4, Count: fixN}))
	must(t, b.GraphExecKernelNodeSetParams(f.exec, f.childNd, f.fill(t, f.y+4*fixN, 33)))
	must(t, b.GraphLaunch(f.exec, f.s))
	must(t, b.MemcpyDtoHAsync(out2, f.y, f.s))
	must(t, b.MemcpyDtoHAsync(x2, f.x, f.s))
	gt.release()
	must(t, b.StreamSynchronize(f.s))
	if gpu.BytesToF32(x1)[0] != 1 || out1[0] != 10 || gpu.BytesToF32(out1[4*fixN:])[0] != 2 {
		t.Fatalf("first launch saw a later update: x=%v y=%d child=%v", gpu.BytesToF32(x1), out1[0], gpu.BytesToF32(out1[4*fixN:])[0])
	}
	if gpu.BytesToF32(x2)[0] != 3 || out2[0] != 30 || gpu.BytesToF32(out2[4*fixN:])[0] != 33 {
		t.Fatalf("second launch missed the update: x=%v y=%d child=%v", gpu.BytesToF32(x2), out2[0], gpu.BytesToF32(out2[4*fixN:])[0])
	}
	// The graph itself is unchanged.
	kp, err := b.GraphKernelNodeParams(f.nodes[0])
	must(t, err)
	if kp.Args[1].AsF32() != 1 {
		t.Fatalf("per-node update changed the graph: %v", kp.Args)
	}

	// Refusals.
	wantErr(t, b.GraphExecMemsetNodeSetParams(f.exec, f.nodes[0], gpu.Memset{Dst: f.y, ElemSize: 4, Count: 1}), gpu.ErrInvalidValue)
	wantUpdate(t, b.GraphExecMemsetNodeSetParams(f.exec, f.nodes[1], gpu.Memset{Dst: f.y, ElemSize: 2, Count: 1}), gpu.UpdateParametersChanged)
	wantErr(t, b.GraphExecMemcpyNodeSetParams(f.exec, f.nodes[1], gpu.MemcpyParams{}), gpu.ErrInvalidValue)
	wantErr(t, b.GraphExecKernelNodeSetParams(f.exec, f.nodes[0], gpu.KernelParams{Func: f.k.fn(t, kernels.Fill), Config: kernels.Elementwise(1)}), gpu.ErrInvalidValue)
	other := newGraph(t, b, 0)
	on, _ := b.GraphAddEmptyNode(other, nil)
	wantErr(t, b.GraphExecKernelNodeSetParams(f.exec, on, f.fill(t, f.x, 1)), gpu.ErrInvalidValue)
	wantErr(t, b.GraphExecKernelNodeSetParams(f.exec, 0, f.fill(t, f.x, 1)), gpu.ErrInvalidHandle)
	bad := newGraph(t, b, 0)
	_, _ = b.GraphAddEmptyNode(bad, nil)
	_, _ = b.GraphAddEmptyNode(bad, nil)
	wantUpdate(t, b.GraphExecChildGraphNodeSetParams(f.exec, f.nodes[2], bad), gpu.UpdateTopologyChanged)

	// A compatible child graph replaces the child's parameters.
	good := newGraph(t, b, 0)
	_, _ = b.GraphAddKernelNode(good, nil, f.fill(t, f.y+4*fixN, 44))
	must(t, b.GraphExecChildGraphNodeSetParams(f.exec, f.nodes[2], good))
	if _, _, c := f.run(t); c != 44 {
		t.Fatalf("child update: %v", c)
	}
}

func TestGraphFaultStopsReplay(t *testing.T) {
	b := newSim(t, Config{})
	k := loadKernels(t, b, 0)
	s := newStream(t, b, 0)
	p := alloc(t, b, 0, 64)
	dead, err := b.MemAlloc(0, 64)
	must(t, err)
	g := newGraph(t, b, 0)
	n0, _ := b.GraphAddKernelNode(g, nil, gpu.KernelParams{Func: k.fn(t, kernels.Fill), Config: kernels.Elementwise(16), Args: fillArgs(p, 1, 16)})
	n1, _ := b.GraphAddMemcpyNode(g, []gpu.GraphNode{n0}, gpu.MemcpyParams{Dst: dead, Src: p, Size: 64})
	_, _ = b.GraphAddKernelNode(g, []gpu.GraphNode{n1}, gpu.KernelParams{Func: k.fn(t, kernels.Fill), Config: kernels.Elementwise(16), Args: fillArgs(p, 2, 16)})
	x := instantiate(t, b, g)
	must(t, b.MemFree(dead))
	must(t, b.GraphLaunch(x, s))
	fe := wantFault(t, b.StreamSynchronize(s))
	if fe.Kernel != "memcpy" || fe.Addr != dead || fe.Reason != "freed" {
		t.Fatalf("fault %+v", fe)
	}
	wantFault(t, b.GraphLaunch(x, s))
	must(t, b.ResetDevice(0))
	wantAll(t, readF32(t, b, p, 16), 1) // the node after the fault did not run
}

// TestLargeGraphReplay replays a graph of 10 000 tiny kernels, as the
// strategies' tests do, and checks the per-node cost stays in microseconds.
func TestLargeGraphReplay(t *testing.T) {
	b := newSim(t, Config{})
	k := loadKernels(t, b, 0)
	s := newStream(t, b, 0)
	const nodes, launches = 10000, 5
	p := alloc(t, b, 0, 4*nodes)
	axpb := k.fn(t, kernels.Axpb)
	g := newGraph(t, b, 0)
	var prev []gpu.GraphNode
	for i := range nodes {
		n, err := b.GraphAddKernelNode(g, prev, gpu.KernelParams{Func: axpb, Config: kernels.Elementwise(1),
			Args: []gpu.Arg{gpu.Ptr(p + gpu.DevicePtr(4*i)), gpu.Ptr(p + gpu.DevicePtr(4*i)), gpu.F32(1), gpu.F32(1), gpu.I32(1)}})
		must(t, err)
		prev = []gpu.GraphNode{n}
	}
	x := instantiate(t, b, g)
	start := time.Now()
	for range launches {
		must(t, b.GraphLaunch(x, s))
	}
	must(t, b.StreamSynchronize(s))
	per := time.Since(start) / (nodes * launches)
	t.Logf("%v per node", per)
	if per > 200*time.Microsecond {
		t.Fatalf("replay costs %v per node", per)
	}
	wantAll(t, readF32(t, b, p, nodes), launches)

	// Patching every node between launches stays cheap too.
	ns, _ := b.GraphNodes(g)
	start = time.Now()
	for i, n := range ns {
		must(t, b.GraphExecKernelNodeSetParams(x, n, gpu.KernelParams{Func: axpb, Config: kernels.Elementwise(1),
			Args: []gpu.Arg{gpu.Ptr(p + gpu.DevicePtr(4*i)), gpu.Ptr(p + gpu.DevicePtr(4*i)), gpu.F32(0), gpu.F32(-1), gpu.I32(1)}}))
	}
	t.Logf("%v per patched node", time.Since(start)/nodes)
	must(t, b.GraphLaunch(x, s))
	must(t, b.StreamSynchronize(s))
	wantAll(t, readF32(t, b, p, nodes), -1)
}

func BenchmarkGraphReplayPerNode(bm *testing.B) {
	b := newSim(bm, Config{})
	k := loadKernels(bm, b, 0)
	s := newStream(bm, b, 0)
	const nodes = 1000
	p := alloc(bm, b, 0, 4*nodes)
	g := newGraph(bm, b, 0)
	for i := range nodes {
		_, err := b.GraphAddKernelNode(g, nil, gpu.KernelParams{Func: k.fn(bm, kernels.Fill), Config: kernels.Elementwise(1),
			Args: fillArgs(p+gpu.DevicePtr(4*i), 1, 1)})
		must(bm, err)
	}
	x := instantiate(bm, b, g)
	bm.ResetTimer()
	for range bm.N {
		must(bm, b.GraphLaunch(x, s))
	}
	must(bm, b.StreamSynchronize(s))
	bm.ReportMetric(float64(bm.Elapsed().Nanoseconds())/float64(bm.N*nodes), "ns/node")
}

func BenchmarkEagerLaunch(bm *testing.B) {
	b := newSim(bm, Config{})
	k := loadKernels(bm, b, 0)
	s := newStream(bm, b, 0)
	p := alloc(bm, b, 0, 4)
	fill := k.fn(bm, kernels.Fill)
	args := fillArgs(p, 1, 1)
	bm.ResetTimer()
	for range bm.N {
		must(bm, b.LaunchKernel(fill, kernels.Elementwise(1), args, s))
	}
	must(bm, b.StreamSynchronize(s))
}

func BenchmarkPerNodeUpdate(bm *testing.B) {
	b := newSim(bm, Config{})
	k := loadKernels(bm, b, 0)
	p := alloc(bm, b, 0, 4*1000)
	g := newGraph(bm, b, 0)
	var ns []gpu.GraphNode
	for i := range 1000 {
		n, err := b.GraphAddKernelNode(g, nil, gpu.KernelParams{Func: k.fn(bm, kernels.Fill), Config: kernels.Elementwise(1),
			Args: fillArgs(p+gpu.DevicePtr(4*i), 1, 1)})
		must(bm, err)
		ns = append(ns, n)
	}
	x := instantiate(bm, b, g)
	fill := k.fn(bm, kernels.Fill)
	bm.ResetTimer()
	for i := range bm.N {
		j := i % len(ns)
		must(bm, b.GraphExecKernelNodeSetParams(x, ns[j], gpu.KernelParams{Func: fill, Config: kernels.Elementwise(1),
			Args: fillArgs(p+gpu.DevicePtr(4*j), float32(i), 1)}))
	}
}
