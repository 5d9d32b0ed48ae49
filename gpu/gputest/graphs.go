package gputest

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

var graphTests = []test{
	{name: "BuildInspectLaunch", run: testGraphBuild},
	{name: "AddErrors", run: testGraphAddErrors},
	{name: "ChildGraphCopied", run: testChildGraphCopied},
	{name: "ReplayOrdered", run: testGraphReplayOrdered},
	{name: "EmptyGraph", run: testEmptyGraph},
	{name: "Destroy", run: testGraphDestroy},
}

// ---- node helpers ----

func (h *h) addKernel(g gpu.Graph, deps []gpu.GraphNode, p gpu.KernelParams) gpu.GraphNode {
	h.Helper()
	n, err := h.b.GraphAddKernelNode(g, deps, p)
	h.ok("GraphAddKernelNode", err)
	return n
}

func (h *h) addMemcpy(g gpu.Graph, deps []gpu.GraphNode, p gpu.MemcpyParams) gpu.GraphNode {
	h.Helper()
	n, err := h.b.GraphAddMemcpyNode(g, deps, p)
	h.ok("GraphAddMemcpyNode", err)
	return n
}

func (h *h) addMemset(g gpu.Graph, deps []gpu.GraphNode, m gpu.Memset) gpu.GraphNode {
	h.Helper()
	n, err := h.b.GraphAddMemsetNode(g, deps, m)
	h.ok("GraphAddMemsetNode", err)
	return n
}

func (h *h) addEmpty(g gpu.Graph, deps []gpu.GraphNode) gpu.GraphNode {
	h.Helper()
	n, err := h.b.GraphAddEmptyNode(g, deps)
	h.ok("GraphAddEmptyNode", err)
	return n
}

func (h *h) addChild(g gpu.Graph, deps []gpu.GraphNode, child gpu.Graph) gpu.GraphNode {
	h.Helper()
	n, err := h.b.GraphAddChildGraphNode(g, deps, child)
	h.ok("GraphAddChildGraphNode", err)
	return n
}

func deps(n ...gpu.GraphNode) []gpu.GraphNode { return n }

func sortedNodes(n []gpu.GraphNode) []gpu.GraphNode {
	n = slices.Clone(n)
	slices.Sort(n)
	return n
}

// wantNodes checks that g's nodes are exactly want (in any order).
func (h *h) wantNodes(what string, g gpu.Graph, want ...gpu.GraphNode) []gpu.GraphNode {
	h.Helper()
	got, err := h.b.GraphNodes(g)
	h.ok("GraphNodes", err)
	if !slices.Equal(sortedNodes(got), sortedNodes(want)) {
		h.Errorf("%s: GraphNodes = %v, want %v", what, got, want)
	}
	return got
}

func (h *h) wantType(n gpu.GraphNode, want gpu.NodeType) {
	h.Helper()
	got, err := h.b.GraphNodeType(n)
	if err != nil || got != want {
		h.Errorf("GraphNodeType(%#x) = %v, %v; want %v", uint64(n), got, err, want)
	}
}

func (h *h) wantDeps(n gpu.GraphNode, want ...gpu.GraphNode) {
	h.Helper()
	got, err := h.b.GraphNodeDeps(n)
	h.ok("GraphNodeDeps", err)
	if !slices.Equal(sortedNodes(got), sortedNodes(want)) {
		h.Errorf("GraphNodeDeps(%#x) = %v, want %v", uint64(n), got, want)
	}
}

// wantKernelParams checks that n's parameters round-trip want, typed.
func (h *h) wantKernelParams(n gpu.GraphNode, want gpu.KernelParams) {
	h.Helper()
	got, err := h.b.GraphKernelNodeParams(n)
	h.ok("GraphKernelNodeParams", err)
	if got.Func != want.Func || got.Config != want.Config || !argsEqual(got.Args, want.Args) {
		h.Errorf("GraphKernelNodeParams(%#x) =\n  %v %+v %v\nwant\n  %v %+v %v", uint64(n),
			got.Func, got.Config, got.Args, want.Func, want.Config, want.Args)
	}
}

func argsEqual(a, b []gpu.Arg) bool {
	return slices.EqualFunc(a, b, func(x, y gpu.Arg) bool {
		return x.Kind == y.Kind && x.Bits == y.Bits && bytes.Equal(x.Raw, y.Raw)
	})
}

// bufsF32 allocates k buffers of n float32 values on dev.
func (h *h) bufsF32(dev, k, n int) []gpu.DevicePtr {
	h.Helper()
	p := make([]gpu.DevicePtr, k)
	for i := range p {
		p[i] = h.alloc(dev, uint64(4*n))
	}
	return p
}

// setAll sets every buffer to v.
func (h *h) setAll(p []gpu.DevicePtr, v float32, n int) {
	h.Helper()
	for _, q := range p {
		h.setF32(q, v, n)
	}
}

// ---- tests ----

func testGraphBuild(h *h) {
	const n = 1000
	b := h.bufsF32(0, 4, n)
	A, B, C, D := b[0], b[1], b[2], b[3]
	child := h.graph(0)
	fillD := h.fillParams(0, D, 7, n)
	h.addKernel(child, nil, fillD)

	before, _ := h.counters()
	g := h.graph(0)
	h.wantCounters("after GraphCreate", before, func(c *gpu.HandleCounts) { c.Graphs++ })
	h.wantNodes("a new graph", g)
	setA := f32Memset(A, 1, n)
	M := h.addMemset(g, nil, setA)
	axpb := h.axpbParams(0, B, A, 2, 1, n)
	K := h.addKernel(g, deps(M), axpb)
	cp := gpu.MemcpyParams{Dst: C, Src: B, Size: 4 * n}
	Cp := h.addMemcpy(g, deps(K), cp)
	E := h.addEmpty(g, deps(Cp))
	G := h.addChild(g, deps(E, M), child)

	h.wantNodes("the built graph", g, M, K, Cp, E, G)
	h.wantType(M, gpu.NodeMemset)
	h.wantType(K, gpu.NodeKernel)
	h.wantType(Cp, gpu.NodeMemcpy)
	h.wantType(E, gpu.NodeEmpty)
	h.wantType(G, gpu.NodeChildGraph)
	h.wantDeps(M)
	h.wantDeps(K, M)
	h.wantDeps(Cp, K)
	h.wantDeps(E, Cp)
	h.wantDeps(G, E, M)
	h.wantKernelParams(K, axpb)
	_, err := h.b.GraphKernelNodeParams(M)
	h.wantErr("GraphKernelNodeParams of a memset node", err, gpu.ErrInvalidValue)
	_, err = h.b.GraphChildGraph(K)
	h.wantErr("GraphChildGraph of a kernel node", err, gpu.ErrInvalidValue)

	cg, err := h.b.GraphChildGraph(G)
	h.ok("GraphChildGraph", err)
	cn, err := h.b.GraphNodes(cg)
	h.ok("GraphNodes(child)", err)
	if len(cn) != 1 {
		h.Fatalf("embedded child graph has %d nodes, want 1", len(cn))
	}
	h.wantType(cn[0], gpu.NodeKernel)
	h.wantKernelParams(cn[0], fillD)
	h.wantDeps(cn[0])

	x := h.instantiate(g)
	h.wantCounters("after GraphInstantiate", before, func(c *gpu.HandleCounts) { c.Graphs++; c.GraphExecs++ })
	s := h.stream(0)
	for i := range 2 {
		h.setAll(b, 0, n)
		h.launchGraph(x, s)
		what := fmt.Sprintf("launch %d: ", i)
		h.wantAllF32(what+"memset node", h.downloadF32(A, n), 1)
		h.wantAllF32(what+"kernel node after the memset", h.downloadF32(B, n), 3)
		h.wantAllF32(what+"memcpy node after the kernel", h.downloadF32(C, n), 3)
		h.wantAllF32(what+"child graph node", h.downloadF32(D, n), 7)
	}
}

func testGraphAddErrors(h *h) {
	const n = 64
	p := h.alloc(0, 4*n)
	g1, g2 := h.graph(0), h.graph(0)
	other := h.addEmpty(g2, nil)
	fill := h.fillParams(0, p, 1, n)
	_, err := h.b.GraphAddEmptyNode(g1, deps(other))
	h.wantErr("dependency on a node of another graph", err, gpu.ErrInvalidValue)
	_, err = h.b.GraphAddKernelNode(g1, deps(other), fill)
	h.wantErr("kernel node depending on a node of another graph", err, gpu.ErrInvalidValue)
	_, err = h.b.GraphAddEmptyNode(g1, deps(0))
	h.wantErr("dependency on node 0", err, gpu.ErrInvalidValue, gpu.ErrInvalidHandle)
	_, err = h.b.GraphAddKernelNode(g1, nil, gpu.KernelParams{Func: fill.Func, Config: fill.Config, Args: fill.Args[:2]})
	h.wantErr("kernel node with too few arguments", err, gpu.ErrInvalidValue)
	_, err = h.b.GraphAddKernelNode(g1, nil, gpu.KernelParams{Func: fill.Func, Config: fill.Config,
		Args: []gpu.Arg{fill.Args[0], fill.Args[1], gpu.U32(n)}})
	h.wantErr("kernel node with an argument of the wrong kind", err, gpu.ErrInvalidValue)
	_, err = h.b.GraphAddKernelNode(g1, nil, gpu.KernelParams{Config: fill.Config, Args: fill.Args})
	h.wantErr("kernel node of function 0", err, gpu.ErrInvalidHandle)
	_, err = h.b.GraphAddMemsetNode(g1, nil, gpu.Memset{Dst: p, ElemSize: 3, Count: 4})
	h.wantErr("memset node of 3-byte elements", err, gpu.ErrInvalidValue)
	_, err = h.b.GraphAddChildGraphNode(g1, nil, 0)
	h.wantErr("child graph node of graph 0", err, gpu.ErrInvalidHandle)
	h.wantNodes("a graph after refused adds", g1)

	_, err = h.b.GraphAddEmptyNode(0, nil)
	h.wantErr("GraphAddEmptyNode(graph 0)", err, gpu.ErrInvalidHandle)
	_, err = h.b.GraphAddKernelNode(0, nil, fill)
	h.wantErr("GraphAddKernelNode(graph 0)", err, gpu.ErrInvalidHandle)
	_, err = h.b.GraphAddMemcpyNode(0, nil, gpu.MemcpyParams{Dst: p, Src: p, Size: 4})
	h.wantErr("GraphAddMemcpyNode(graph 0)", err, gpu.ErrInvalidHandle)
	_, err = h.b.GraphAddMemsetNode(0, nil, f32Memset(p, 0, n))
	h.wantErr("GraphAddMemsetNode(graph 0)", err, gpu.ErrInvalidHandle)
	_, err = h.b.GraphAddChildGraphNode(0, nil, g2)
	h.wantErr("GraphAddChildGraphNode(graph 0)", err, gpu.ErrInvalidHandle)
	_, err = h.b.GraphNodes(0)
	h.wantErr("GraphNodes(0)", err, gpu.ErrInvalidHandle)
	_, err = h.b.GraphNodeType(0)
	h.wantErr("GraphNodeType(0)", err, gpu.ErrInvalidHandle)
	_, err = h.b.GraphNodeDeps(0)
	h.wantErr("GraphNodeDeps(0)", err, gpu.ErrInvalidHandle)
	_, err = h.b.GraphKernelNodeParams(0)
	h.wantErr("GraphKernelNodeParams(0)", err, gpu.ErrInvalidHandle)
	_, err = h.b.GraphChildGraph(0)
	h.wantErr("GraphChildGraph(0)", err, gpu.ErrInvalidHandle)
	_, err = h.b.GraphInstantiate(0)
	h.wantErr("GraphInstantiate(0)", err, gpu.ErrInvalidHandle)

	// The graph still works after the refusals.
	h.addKernel(g1, nil, fill)
	x := h.instantiate(g1)
	h.setF32(p, 0, n)
	h.launchGraph(x, h.stream(0))
	h.wantAllF32("graph after refused adds", h.downloadF32(p, n), 1)
}

// testChildGraphCopied checks that a child graph is copied when added: later
// edits and even destruction of the child do not reach the parent.
func testChildGraphCopied(h *h) {
	const n = 500
	b := h.bufsF32(0, 2, n)
	D, E := b[0], b[1]
	child, err := h.b.GraphCreate(0)
	h.ok("GraphCreate", err)
	h.trackGraph(child)
	h.addKernel(child, nil, h.fillParams(0, D, 7, n))
	g := h.graph(0)
	G := h.addChild(g, nil, child)
	h.addKernel(child, nil, h.fillParams(0, E, 9, n)) // after the add: must not reach g
	h.release(graphKey(child))

	cg, err := h.b.GraphChildGraph(G)
	h.ok("GraphChildGraph", err)
	if cn, err := h.b.GraphNodes(cg); err != nil || len(cn) != 1 {
		h.Errorf("embedded copy has nodes %v, %v; want the one node the child had when added", cn, err)
	}
	x := h.instantiate(g)
	h.setAll(b, 0, n)
	h.launchGraph(x, h.stream(0))
	h.wantAllF32("the child's node", h.downloadF32(D, n), 7)
	h.wantAllF32("a node added to the child after it was embedded", h.downloadF32(E, n), 0)
}

// testGraphReplayOrdered launches an accumulating graph several times
// without synchronizing: each launch runs once, in order.
func testGraphReplayOrdered(h *h) {
	const n = 2000
	b := h.bufsF32(0, 2, n)
	y, x := b[0], b[1]
	g := h.graph(0)
	axpy := gpu.KernelParams{Func: h.fn(0, kernels.Axpy), Config: kernels.Elementwise(n),
		Args: []gpu.Arg{gpu.Ptr(y), gpu.Ptr(x), gpu.F32(2), gpu.I32(n)}}
	h.addKernel(g, nil, axpy)
	ex := h.instantiate(g)
	h.setF32(y, 1, n)
	h.setF32(x, 0.5, n)
	s1, s2 := h.stream(0), h.stream(0)
	for range 3 {
		h.ok("GraphLaunch", h.b.GraphLaunch(ex, s1))
	}
	h.sync(s1)
	h.wantAllF32("y after 3 launches of y += 2x", h.downloadF32(y, n), 4)
	h.ok("GraphLaunch on another stream", h.b.GraphLaunch(ex, s2))
	h.sync(s2)
	h.wantAllF32("y after a 4th launch on another stream", h.downloadF32(y, n), 5)
	h.wantErr("GraphLaunch on stream 0", h.b.GraphLaunch(ex, 0), gpu.ErrInvalidHandle)
}

func testEmptyGraph(h *h) {
	g := h.graph(0)
	x := h.instantiate(g)
	s := h.stream(0)
	h.launchGraph(x, s)
	g2 := h.graph(0)
	e := h.addEmpty(g2, nil)
	h.addEmpty(g2, deps(e))
	h.launchGraph(h.instantiate(g2), s)
}

func testGraphDestroy(h *h) {
	const n = 300
	p := h.alloc(0, 4*n)
	before, _ := h.counters()
	g, err := h.b.GraphCreate(0)
	h.ok("GraphCreate", err)
	h.trackGraph(g)
	K := h.addKernel(g, nil, h.fillParams(0, p, 4, n))
	x1, x2 := h.instantiate(g), h.instantiate(g)
	if x1 == x2 {
		h.Errorf("two instantiations returned the same exec %#x", uint64(x1))
	}
	h.ok("GraphDestroy", h.b.GraphDestroy(g))
	h.forget(graphKey(g))
	h.wantCounters("after GraphDestroy with two execs live", before, func(c *gpu.HandleCounts) { c.GraphExecs += 2; c.Modules++ })
	h.wantErr("second GraphDestroy", h.b.GraphDestroy(g), gpu.ErrInvalidHandle)
	h.wantErr("GraphAddEmptyNode on a destroyed graph", func() error { _, err := h.b.GraphAddEmptyNode(g, nil); return err }(), gpu.ErrInvalidHandle)
	_, err = h.b.GraphInstantiate(g)
	h.wantErr("GraphInstantiate of a destroyed graph", err, gpu.ErrInvalidHandle)
	_, err = h.b.GraphNodeType(K)
	h.wantErr("GraphNodeType of a node of a destroyed graph", err, gpu.ErrInvalidHandle)

	s := h.stream(0)
	h.setF32(p, 0, n)
	h.launchGraph(x1, s)
	h.wantAllF32("exec launched after its graph was destroyed", h.downloadF32(p, n), 4)
	h.release(execKey(x1))
	h.wantErr("second GraphExecDestroy", h.b.GraphExecDestroy(x1), gpu.ErrInvalidHandle)
	h.wantErr("GraphLaunch of a destroyed exec", h.b.GraphLaunch(x1, s), gpu.ErrInvalidHandle)
	h.setF32(p, 0, n)
	h.launchGraph(x2, s)
	h.wantAllF32("the other exec of the same graph", h.downloadF32(p, n), 4)
	h.release(execKey(x2))
	h.wantCounters("after destroying both execs", before, func(c *gpu.HandleCounts) { c.Modules++; c.Streams++ })

	h.wantErr("GraphDestroy(0)", h.b.GraphDestroy(0), gpu.ErrInvalidHandle)
	h.wantErr("GraphExecDestroy(0)", h.b.GraphExecDestroy(0), gpu.ErrInvalidHandle)
	h.wantErr("GraphLaunch(0)", h.b.GraphLaunch(0, s), gpu.ErrInvalidHandle)
}
