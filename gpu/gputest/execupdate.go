package gputest

import (
	"errors"
	"fmt"
	"math"

	"github.com/stablegraph/stablegraph/gpu"
)

var execUpdateTests = []test{
	{name: "WholeGraph", run: testExecUpdate},
	{name: "WholeGraphFromCapture", run: testExecUpdateCaptured},
	{name: "Refused", run: testExecUpdateRefused},
	{name: "NodeSetParams", run: testExecNodeSetParams},
	{name: "NodeSetParamsErrors", run: testExecNodeSetParamsErrors},
	{name: "NodeRefused", run: testExecNodeRefused},
}

// chain is the graph the update tests build: memset A = 1, then kernel
// B = a*A + 1, then memcpy C = B.
type chain struct {
	A, B, C gpu.DevicePtr
	a       float32
}

const chainN = 800

func (h *h) chainBufs(a float32) chain {
	h.Helper()
	b := h.bufsF32(0, 3, chainN)
	return chain{b[0], b[1], b[2], a}
}

func (h *h) buildChain(c chain) gpu.Graph {
	h.Helper()
	g := h.graph(0)
	M := h.addMemset(g, nil, f32Memset(c.A, 1, chainN))
	K := h.addKernel(g, deps(M), h.axpbParams(0, c.B, c.A, c.a, 1, chainN))
	h.addMemcpy(g, deps(K), gpu.MemcpyParams{Dst: c.C, Src: c.B, Size: 4 * chainN})
	return g
}

func (h *h) captureChain(s gpu.Stream, c chain) gpu.Graph {
	h.Helper()
	return h.capture(s, func() {
		h.ok("MemsetAsync", h.b.MemsetAsync(f32Memset(c.A, 1, chainN), s))
		h.launch(h.axpbParams(0, c.B, c.A, c.a, 1, chainN), s)
		h.ok("MemcpyDtoDAsync", h.b.MemcpyDtoDAsync(c.C, c.B, 4*chainN, s))
	})
}

func (h *h) setChain(c chain, v float32) { h.setAll([]gpu.DevicePtr{c.A, c.B, c.C}, v, chainN) }

// wantChain checks c holds the chain's results (written) or v everywhere.
func (h *h) wantChain(what string, c chain, written bool, v float32) {
	h.Helper()
	if !written {
		for i, p := range []gpu.DevicePtr{c.A, c.B, c.C} {
			h.wantAllF32(fmt.Sprintf("%s: buffer %d left alone", what, i), h.downloadF32(p, chainN), v)
		}
		return
	}
	h.wantAllF32(what+": A", h.downloadF32(c.A, chainN), 1)
	h.wantAllF32(what+": B", h.downloadF32(c.B, chainN), c.a+1)
	h.wantAllF32(what+": C", h.downloadF32(c.C, chainN), c.a+1)
}

func testExecUpdate(h *h) {
	old, upd := h.chainBufs(2), h.chainBufs(5)
	x := h.instantiate(h.buildChain(old))
	s := h.stream(0)
	h.setChain(old, -1)
	h.launchGraph(x, s)
	h.wantChain("first launch", old, true, 0)

	g2 := h.buildChain(upd) // same topology, new pointers and a new scalar
	h.ok("GraphExecUpdate", h.b.GraphExecUpdate(x, g2))
	h.setChain(old, -1)
	h.setChain(upd, -1)
	h.launchGraph(x, s)
	h.wantChain("launch after the update: new buffers", upd, true, 0)
	h.wantChain("launch after the update: old buffers", old, false, -1)
	// The update is independent of g2's life.
	h.release(graphKey(g2))
	h.setChain(upd, -1)
	h.launchGraph(x, s)
	h.wantChain("launch after the update graph was destroyed", upd, true, 0)
}

func testExecUpdateCaptured(h *h) {
	old, upd := h.chainBufs(2), h.chainBufs(3)
	s := h.stream(0)
	x := h.instantiate(h.captureChain(s, old))
	h.setChain(old, -1)
	h.launchGraph(x, s)
	h.wantChain("first launch", old, true, 0)
	h.ok("GraphExecUpdate with a re-captured graph", h.b.GraphExecUpdate(x, h.captureChain(s, upd)))
	h.setChain(old, -1)
	h.setChain(upd, -1)
	h.launchGraph(x, s)
	h.wantChain("after the update: new buffers", upd, true, 0)
	h.wantChain("after the update: old buffers", old, false, -1)
}

// wantRefused checks err is an *UpdateError with result want, and a
// refusal only: not also bad input, which a caller would not retry.
func (h *h) wantRefused(what string, err error, want gpu.UpdateResult) *gpu.UpdateError {
	h.Helper()
	if !h.wantErr(what, err, gpu.ErrGraphUpdate) {
		return nil
	}
	if errors.Is(err, gpu.ErrInvalidValue) {
		h.Errorf("%s: the refusal %v also wraps gpu.ErrInvalidValue", what, err)
	}
	var ue *gpu.UpdateError
	if !errors.As(err, &ue) {
		h.Errorf("%s: error %v is not an *gpu.UpdateError", what, err)
		return nil
	}
	if ue.Result != want {
		h.Errorf("%s: UpdateError.Result = %v, want %v (%v)", what, ue.Result, want, err)
	}
	return ue
}

// wantNodeRefused checks a per-node update of node n was refused for
// reason want, naming n.
func (h *h) wantNodeRefused(what string, err error, n gpu.GraphNode, want gpu.UpdateResult) {
	h.Helper()
	if ue := h.wantRefused(what, err, want); ue != nil && ue.Node != n {
		h.Errorf("%s: UpdateError.Node = %#x, want the node updated, %#x (%v)", what, uint64(ue.Node), uint64(n), err)
	}
}

func testExecUpdateRefused(h *h) {
	old, upd := h.chainBufs(2), h.chainBufs(5)
	x := h.instantiate(h.buildChain(old))
	s := h.stream(0)

	extra := h.buildChain(upd)
	h.addEmpty(extra, nil)
	h.wantRefused("GraphExecUpdate with an extra node", h.b.GraphExecUpdate(x, extra), gpu.UpdateTopologyChanged)

	// Same nodes, but the memcpy hangs off the memset instead of the kernel.
	rewired := h.graph(0)
	M := h.addMemset(rewired, nil, f32Memset(upd.A, 1, chainN))
	h.addKernel(rewired, deps(M), h.axpbParams(0, upd.B, upd.A, upd.a, 1, chainN))
	h.addMemcpy(rewired, deps(M), gpu.MemcpyParams{Dst: upd.C, Src: upd.B, Size: 4 * chainN})
	h.wantRefused("GraphExecUpdate with changed edges", h.b.GraphExecUpdate(x, rewired), gpu.UpdateTopologyChanged)

	// Same shape, but the first node is a memcpy instead of a memset.
	retyped := h.graph(0)
	C := h.addMemcpy(retyped, nil, gpu.MemcpyParams{Dst: upd.A, Src: upd.C, Size: 4 * chainN})
	K := h.addKernel(retyped, deps(C), h.axpbParams(0, upd.B, upd.A, upd.a, 1, chainN))
	h.addMemcpy(retyped, deps(K), gpu.MemcpyParams{Dst: upd.C, Src: upd.B, Size: 4 * chainN})
	h.wantRefused("GraphExecUpdate with a node of another type", h.b.GraphExecUpdate(x, retyped), gpu.UpdateNodeTypeChanged)

	// Same shape, but the memset writes another device's memory.
	if h.b.DeviceCount() >= 2 {
		moved := h.chainBufs(5)
		moved.A = h.bufsF32(1, 1, chainN)[0]
		h.wantRefused("GraphExecUpdate with a memset into another device's memory", h.b.GraphExecUpdate(x, h.buildChain(moved)), gpu.UpdateParametersChanged)
	}

	h.wantErr("GraphExecUpdate(exec 0)", h.b.GraphExecUpdate(0, extra), gpu.ErrInvalidHandle)
	h.wantErr("GraphExecUpdate(graph 0)", h.b.GraphExecUpdate(x, 0), gpu.ErrInvalidHandle)

	// Refusals leave the exec as it was.
	h.setChain(old, -1)
	h.setChain(upd, -1)
	h.launchGraph(x, s)
	h.wantChain("launch after refused updates: original buffers", old, true, 0)
	h.wantChain("launch after refused updates: refused buffers", upd, false, -1)
}

// nodeSet is the graph of the per-node update tests: a kernel filling A,
// a memcpy C = A after it, a memset of D, and a child graph filling E.
type nodeSet struct{ A, C, D, E gpu.DevicePtr }

const nodeN = 600

func (h *h) nodeSetBufs() nodeSet {
	h.Helper()
	b := h.bufsF32(0, 4, nodeN)
	return nodeSet{b[0], b[1], b[2], b[3]}
}

func (h *h) childFill(p gpu.DevicePtr, v float32) gpu.Graph {
	h.Helper()
	c := h.graph(0)
	h.addKernel(c, nil, h.fillParams(0, p, v, nodeN))
	return c
}

func (h *h) wantNodeSet(what string, ns nodeSet, a, d, e float32) {
	h.Helper()
	h.wantAllF32(what+": kernel node", h.downloadF32(ns.A, nodeN), a)
	h.wantAllF32(what+": memcpy node", h.downloadF32(ns.C, nodeN), a)
	h.wantAllF32(what+": memset node", h.downloadF32(ns.D, nodeN), d)
	h.wantAllF32(what+": child graph node", h.downloadF32(ns.E, nodeN), e)
}

func (h *h) setNodeSet(ns nodeSet, v float32) {
	h.setAll([]gpu.DevicePtr{ns.A, ns.C, ns.D, ns.E}, v, nodeN)
}

func testExecNodeSetParams(h *h) {
	old, upd := h.nodeSetBufs(), h.nodeSetBufs()
	g := h.graph(0)
	fillOld := h.fillParams(0, old.A, 1, nodeN)
	K := h.addKernel(g, nil, fillOld)
	Cp := h.addMemcpy(g, deps(K), gpu.MemcpyParams{Dst: old.C, Src: old.A, Size: 4 * nodeN})
	M := h.addMemset(g, nil, f32Memset(old.D, 2, nodeN))
	G := h.addChild(g, nil, h.childFill(old.E, 3))
	x := h.instantiate(g)
	s := h.stream(0)
	h.setNodeSet(old, -1)
	h.launchGraph(x, s)
	h.wantNodeSet("first launch", old, 1, 2, 3)

	h.setNodeSet(old, -1)
	h.setNodeSet(upd, -1)
	fillNew := h.fillParams(0, upd.A, 5, nodeN)
	h.ok("GraphExecKernelNodeSetParams", h.b.GraphExecKernelNodeSetParams(x, K, fillNew))
	h.ok("GraphExecMemcpyNodeSetParams", h.b.GraphExecMemcpyNodeSetParams(x, Cp, gpu.MemcpyParams{Dst: upd.C, Src: upd.A, Size: 4 * nodeN}))
	h.ok("GraphExecMemsetNodeSetParams", h.b.GraphExecMemsetNodeSetParams(x, M, f32Memset(upd.D, 6, nodeN)))
	h.ok("GraphExecChildGraphNodeSetParams", h.b.GraphExecChildGraphNodeSetParams(x, G, h.childFill(upd.E, 7)))
	h.sync(s)
	h.wantNodeSet("after the updates, before a launch", upd, -1, -1, -1)
	h.launchGraph(x, s)
	h.wantNodeSet("launch after per-node updates: new buffers", upd, 5, 6, 7)
	h.wantNodeSet("launch after per-node updates: old buffers", old, -1, -1, -1)
	// The updates changed the exec, not the graph.
	h.wantKernelParams(K, fillOld)
	x2 := h.instantiate(g)
	h.launchGraph(x2, s)
	h.wantNodeSet("a new exec of the original graph", old, 1, 2, 3)
}

func testExecNodeSetParamsErrors(h *h) {
	ns := h.nodeSetBufs()
	g := h.graph(0)
	fill := h.fillParams(0, ns.A, 1, nodeN)
	K := h.addKernel(g, nil, fill)
	M := h.addMemset(g, nil, f32Memset(ns.D, 2, nodeN))
	Cp := h.addMemcpy(g, deps(K), gpu.MemcpyParams{Dst: ns.C, Src: ns.A, Size: 4 * nodeN})
	G := h.addChild(g, nil, h.childFill(ns.E, 3))
	x := h.instantiate(g)
	other := h.graph(0)
	foreign := h.addKernel(other, nil, fill)

	h.wantErr("GraphExecKernelNodeSetParams with too few arguments",
		h.b.GraphExecKernelNodeSetParams(x, K, gpu.KernelParams{Func: fill.Func, Config: fill.Config, Args: fill.Args[:2]}), gpu.ErrInvalidValue)
	h.wantErr("GraphExecKernelNodeSetParams with a wrong kind",
		h.b.GraphExecKernelNodeSetParams(x, K, gpu.KernelParams{Func: fill.Func, Config: fill.Config,
			Args: []gpu.Arg{fill.Args[0], gpu.I32(1), fill.Args[2]}}), gpu.ErrInvalidValue)
	h.wantErr("GraphExecKernelNodeSetParams of a memset node", h.b.GraphExecKernelNodeSetParams(x, M, fill), gpu.ErrInvalidValue)
	h.wantErr("GraphExecKernelNodeSetParams of a node of another graph", h.b.GraphExecKernelNodeSetParams(x, foreign, fill))
	h.wantErr("GraphExecKernelNodeSetParams of node 0", h.b.GraphExecKernelNodeSetParams(x, 0, fill), gpu.ErrInvalidHandle, gpu.ErrInvalidValue)
	h.wantErr("GraphExecKernelNodeSetParams of exec 0", h.b.GraphExecKernelNodeSetParams(0, K, fill), gpu.ErrInvalidHandle)
	h.wantErr("GraphExecMemsetNodeSetParams of a kernel node", h.b.GraphExecMemsetNodeSetParams(x, K, f32Memset(ns.D, 1, nodeN)), gpu.ErrInvalidValue)
	h.wantErr("GraphExecMemsetNodeSetParams with 3-byte elements",
		h.b.GraphExecMemsetNodeSetParams(x, M, gpu.Memset{Dst: ns.D, ElemSize: 3, Count: 3}), gpu.ErrInvalidValue)
	h.wantErr("GraphExecMemsetNodeSetParams of exec 0", h.b.GraphExecMemsetNodeSetParams(0, M, f32Memset(ns.D, 1, nodeN)), gpu.ErrInvalidHandle)
	h.wantErr("GraphExecMemcpyNodeSetParams of a memset node",
		h.b.GraphExecMemcpyNodeSetParams(x, M, gpu.MemcpyParams{Dst: ns.C, Src: ns.A, Size: 4}), gpu.ErrInvalidValue)
	h.wantErr("GraphExecMemcpyNodeSetParams of exec 0",
		h.b.GraphExecMemcpyNodeSetParams(0, Cp, gpu.MemcpyParams{Dst: ns.C, Src: ns.A, Size: 4}), gpu.ErrInvalidHandle)
	bigger := h.childFill(ns.E, 4)
	h.addEmpty(bigger, nil)
	h.wantNodeRefused("GraphExecChildGraphNodeSetParams with a child of another topology",
		h.b.GraphExecChildGraphNodeSetParams(x, G, bigger), G, gpu.UpdateTopologyChanged)
	h.wantErr("GraphExecChildGraphNodeSetParams of a kernel node",
		h.b.GraphExecChildGraphNodeSetParams(x, K, h.childFill(ns.E, 4)), gpu.ErrInvalidValue)
	h.wantErr("GraphExecChildGraphNodeSetParams with graph 0", h.b.GraphExecChildGraphNodeSetParams(x, G, 0), gpu.ErrInvalidHandle)
	h.wantErr("GraphExecChildGraphNodeSetParams of exec 0",
		h.b.GraphExecChildGraphNodeSetParams(0, G, h.childFill(ns.E, 4)), gpu.ErrInvalidHandle)

	// Refused updates change nothing.
	h.setNodeSet(ns, -1)
	h.launchGraph(x, h.stream(0))
	h.wantNodeSet("launch after refused per-node updates", ns, 1, 2, 3)
}

// testExecNodeRefused: per-node updates that CUDA documents as changes an
// instantiated graph cannot take are refused alike by every backend, as an
// *gpu.UpdateError naming the node and the reason (never as bad input),
// and leave the exec graph as it was.
func testExecNodeRefused(h *h) {
	ns := h.nodeSetBufs()
	g := h.graph(0)
	K := h.addKernel(g, nil, h.fillParams(0, ns.A, 1, nodeN))
	Cp := h.addMemcpy(g, deps(K), gpu.MemcpyParams{Dst: ns.C, Src: ns.A, Size: 4 * nodeN})
	M := h.addMemset(g, nil, f32Memset(ns.D, 2, nodeN))
	G := h.addChild(g, nil, h.childFill(ns.E, 3))
	x := h.instantiate(g)
	s := h.stream(0)

	// Child graphs must keep the topology and node types of the node's.
	bigger := h.childFill(ns.E, 4)
	h.addEmpty(bigger, nil)
	h.wantNodeRefused("child graph with an extra node", h.b.GraphExecChildGraphNodeSetParams(x, G, bigger), G, gpu.UpdateTopologyChanged)
	retyped := h.graph(0)
	h.addMemset(retyped, nil, f32Memset(ns.E, 4, nodeN))
	h.wantNodeRefused("child graph whose node is a memset, not a kernel", h.b.GraphExecChildGraphNodeSetParams(x, G, retyped), G, gpu.UpdateNodeTypeChanged)

	// Memory operands may move only within memory of the same device and
	// kind (the documentation's rule) and never to memory no longer
	// allocated. Mapped pinned host memory is taken by the driver (580,
	// CUDA 13, on the H100), although the documentation would refuse it, so
	// every backend takes it; the nodes are moved back before the launch.
	if mo, err := h.memOpsOf(0); err != nil {
		h.Logf("no mapped host memory to move nodes into: %v", err)
	} else if hm, err := mo.HostAlloc(4 * nodeN); err == nil {
		h.track(hostKey(hm.Handle), 0, func() error { return mo.HostFree(hm.Handle) })
		h.ok("memset into mapped host memory", h.b.GraphExecMemsetNodeSetParams(x, M, f32Memset(hm.Ptr, 5, nodeN)))
		h.ok("memcpy into mapped host memory",
			h.b.GraphExecMemcpyNodeSetParams(x, Cp, gpu.MemcpyParams{Dst: hm.Ptr, Src: ns.A, Size: 4 * nodeN}))
		h.ok("memset back", h.b.GraphExecMemsetNodeSetParams(x, M, f32Memset(ns.D, 2, nodeN)))
		h.ok("memcpy back", h.b.GraphExecMemcpyNodeSetParams(x, Cp, gpu.MemcpyParams{Dst: ns.C, Src: ns.A, Size: 4 * nodeN}))
	} else if !errors.Is(err, gpu.ErrNotSupported) {
		h.ok("HostAlloc", err)
	}
	freed, err := h.b.MemAlloc(0, 4*nodeN)
	h.ok("MemAlloc", err)
	h.ok("MemFree", h.b.MemFree(freed))
	h.wantNodeRefused("memcpy from freed memory",
		h.b.GraphExecMemcpyNodeSetParams(x, Cp, gpu.MemcpyParams{Dst: ns.C, Src: freed, Size: 4 * nodeN}), Cp, gpu.UpdateParametersChanged)
	h.wantNodeRefused("memset into freed memory", h.b.GraphExecMemsetNodeSetParams(x, M, f32Memset(freed, 5, nodeN)), M, gpu.UpdateParametersChanged)

	// Memory and kernels of another device (two devices only).
	if h.b.DeviceCount() >= 2 {
		other := h.bufsF32(1, 1, nodeN)[0]
		h.wantNodeRefused("kernel of another device", h.b.GraphExecKernelNodeSetParams(x, K, h.fillParams(1, other, 5, nodeN)), K, gpu.UpdateFunctionChanged)
		h.wantNodeRefused("memset into another device's memory", h.b.GraphExecMemsetNodeSetParams(x, M, f32Memset(other, 5, nodeN)), M, gpu.UpdateParametersChanged)
		h.wantNodeRefused("memcpy from another device's memory",
			h.b.GraphExecMemcpyNodeSetParams(x, Cp, gpu.MemcpyParams{Dst: ns.C, Src: other, Size: 4 * nodeN}), Cp, gpu.UpdateParametersChanged)
	} else {
		h.Logf("one device: updates to another device's kernels and memory not checked")
	}

	// Refused updates changed nothing.
	h.setNodeSet(ns, -1)
	h.launchGraph(x, s)
	h.wantNodeSet("launch after refused per-node updates", ns, 1, 2, 3)

	// A memset's element size: CUDA may take the change ("opportunistically")
	// or refuse it; a refusal must be one. sim always refuses.
	x2 := h.instantiate(g)
	half := gpu.Memset{Dst: ns.D, Value: 0x3f80, ElemSize: 2, Count: 2 * nodeN}
	if err := h.b.GraphExecMemsetNodeSetParams(x2, M, half); err != nil {
		h.wantNodeRefused("memset of another element size", err, M, gpu.UpdateParametersChanged)
	} else {
		h.Logf("%s took a memset node update to another element size", h.raw.Name())
		h.setNodeSet(ns, -1)
		h.launchGraph(x2, s)
		h.wantAllF32("memset of 2-byte elements 0x3f80", h.downloadF32(ns.D, nodeN), math.Float32frombits(0x3f803f80))
	}
}
