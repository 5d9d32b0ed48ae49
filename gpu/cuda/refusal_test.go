package cuda

import (
	"errors"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
	"github.com/stablegraph/stablegraph/kernels"
)

// Per-node exec update refusals over the stub driver: the driver answers
// CUDA_ERROR_INVALID_VALUE (sd.fail), as cuGraphExec*NodeSetParams do when
// they refuse a change, and the backend must report an *gpu.UpdateError
// with the reason, keeping the CUresult, wrapping gpu.ErrGraphUpdate and not
// gpu.ErrInvalidValue. gpu_refusal_test.go makes a real driver refuse.

// failOnly makes the stub fail the driver call name with r.
func failOnly(sd *stubDriver, name string, r cu.Result) {
	sd.fail = func(n string) cu.Result {
		if n == name {
			return r
		}
		return cu.Success
	}
}

// wantStubRefusal checks err is a refusal of node n for reason want that
// keeps the driver's CUDA_ERROR_INVALID_VALUE and whose message holds
// every word of detail.
func wantStubRefusal(t *testing.T, what string, err error, n gpu.GraphNode, want gpu.UpdateResult, detail ...string) {
	t.Helper()
	var ue *gpu.UpdateError
	switch {
	case !errors.As(err, &ue) || !errors.Is(err, gpu.ErrGraphUpdate):
		t.Errorf("%s: %v, want an *gpu.UpdateError", what, err)
		return
	case errors.Is(err, gpu.ErrInvalidValue):
		t.Errorf("%s: the refusal also wraps gpu.ErrInvalidValue: %v", what, err)
	case ue.Result != want || ue.Node != n:
		t.Errorf("%s: result %v at node %#x, want %v at node %#x (%v)", what, ue.Result, uint64(ue.Node), want, uint64(n), err)
	case ue.Code != int(cu.ErrorInvalidValue) || ue.CodeName != "CUDA_ERROR_INVALID_VALUE":
		t.Errorf("%s: code %s (%d), want CUDA_ERROR_INVALID_VALUE (1) kept", what, ue.CodeName, ue.Code)
	}
	for _, d := range detail {
		if !strings.Contains(err.Error(), d) {
			t.Errorf("%s: %q does not say %q", what, err, d)
		}
	}
}

type refusalEnv struct {
	*overheadEnv
	axpb gpu.Function
}

func newRefusalEnv(t *testing.T) *refusalEnv {
	e := newOverheadEnv(t)
	m, err := e.b.ModuleLoad(0, kernels.Module())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.b.ModuleUnload(m) })
	axpb, err := e.b.ModuleFunction(m, kernels.Axpb)
	if err != nil {
		t.Fatal(err)
	}
	return &refusalEnv{overheadEnv: e, axpb: axpb}
}

// graphOf builds a graph: kinds are node types in insertion order, each
// depending on the one before when chain is set; child nodes hold
// children[i].
func (e *refusalEnv) graphOf(t *testing.T, chain bool, kinds []gpu.NodeType, children ...gpu.Graph) gpu.Graph {
	t.Helper()
	b := e.b
	g, err := b.GraphCreate(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.GraphDestroy(g) })
	var prev []gpu.GraphNode
	for _, k := range kinds {
		var n gpu.GraphNode
		switch k {
		case gpu.NodeKernel:
			n, err = b.GraphAddKernelNode(g, prev, e.fill)
		case gpu.NodeMemset:
			n, err = b.GraphAddMemsetNode(g, prev, gpu.Memset{Dst: e.p, ElemSize: 4, Count: 16})
		case gpu.NodeEmpty:
			n, err = b.GraphAddEmptyNode(g, prev)
		case gpu.NodeChildGraph:
			n, err = b.GraphAddChildGraphNode(g, prev, children[0])
			children = children[1:]
		}
		if err != nil {
			t.Fatal(err)
		}
		if chain {
			prev = []gpu.GraphNode{n}
		}
	}
	return g
}

// TestStubChildRefusal: a refused child-graph update says why, as sim does.
func TestStubChildRefusal(t *testing.T) {
	e := newRefusalEnv(t)
	b := e.b
	k, m, c, em := gpu.NodeKernel, gpu.NodeMemset, gpu.NodeChildGraph, gpu.NodeEmpty
	old := e.graphOf(t, true, []gpu.NodeType{k, m, c}, e.graphOf(t, false, []gpu.NodeType{k}))
	g, err := b.GraphCreate(0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.GraphDestroy(g)
	G, err := b.GraphAddChildGraphNode(g, nil, old)
	if err != nil {
		t.Fatal(err)
	}
	x, err := b.GraphInstantiate(g)
	if err != nil {
		t.Fatal(err)
	}
	defer b.GraphExecDestroy(x)

	// Accepted: no comparison, no extra driver call.
	same := e.graphOf(t, true, []gpu.NodeType{k, m, c}, e.graphOf(t, false, []gpu.NodeType{k}))
	e.sd.startCounting()
	if err := b.GraphExecChildGraphNodeSetParams(x, G, same); err != nil {
		t.Fatal(err)
	}
	if n := e.sd.callCount("cuGraphGetNodes"); n != 0 {
		t.Errorf("an accepted child update made %d cuGraphGetNodes calls", n)
	}

	failOnly(e.sd, "cuGraphExecChildGraphNodeSetParams", cu.ErrorInvalidValue)
	defer func() { e.sd.fail = nil }()
	for _, c := range []struct {
		what   string
		child  gpu.Graph
		want   gpu.UpdateResult
		detail []string
	}{
		{"an extra node", e.graphOf(t, true, []gpu.NodeType{k, m, c, em}, e.graphOf(t, false, []gpu.NodeType{k})),
			gpu.UpdateTopologyChanged, []string{"has 4 nodes, the node's 3"}},
		{"other edges", e.graphOf(t, false, []gpu.NodeType{k, m, c}, e.graphOf(t, false, []gpu.NodeType{k})),
			gpu.UpdateTopologyChanged, []string{"node 1 depends on nodes [], in the node's on [0]"}},
		{"a node of another type", e.graphOf(t, true, []gpu.NodeType{k, k, c}, e.graphOf(t, false, []gpu.NodeType{k})),
			gpu.UpdateNodeTypeChanged, []string{"node 1 is a kernel node, in the node's a memset node"}},
		{"a grandchild of another topology", e.graphOf(t, true, []gpu.NodeType{k, m, c}, e.graphOf(t, false, []gpu.NodeType{k, k})),
			gpu.UpdateTopologyChanged, []string{"node 2's child graph has 2 nodes, the node's 1"}},
		{"the same topology", same, gpu.UpdateParametersChanged, []string{"topology and node types match"}},
	} {
		wantStubRefusal(t, "child graph with "+c.what, b.GraphExecChildGraphNodeSetParams(x, G, c.child), G, c.want, c.detail...)
	}

	// The context switch failing is no refusal: it is what it is.
	failOnly(e.sd, "cuCtxGetCurrent", cu.ErrorInvalidValue)
	if err := b.GraphExecChildGraphNodeSetParams(x, G, same); !errors.Is(err, gpu.ErrInvalidValue) || errors.Is(err, gpu.ErrGraphUpdate) {
		t.Errorf("cuCtxGetCurrent failing: %v, want gpu.ErrInvalidValue and no refusal", err)
	}
	// Nor is another error of the update itself.
	failOnly(e.sd, "cuGraphExecChildGraphNodeSetParams", cu.ErrorInvalidHandle)
	if err := b.GraphExecChildGraphNodeSetParams(x, G, same); !errors.Is(err, gpu.ErrInvalidHandle) || errors.Is(err, gpu.ErrGraphUpdate) {
		t.Errorf("CUDA_ERROR_INVALID_HANDLE: %v, want gpu.ErrInvalidHandle and no refusal", err)
	}
}

// TestStubNodeRefusals: memcpy, memset and kernel nodes.
func TestStubNodeRefusals(t *testing.T) {
	e := newRefusalEnv(t)
	b := e.b
	g, x, kn, mn := e.graph(t)
	sn, err := b.GraphAddMemsetNode(g, nil, gpu.Memset{Dst: e.p, ElemSize: 4, Count: 16})
	if err != nil {
		t.Fatal(err)
	}
	x2, err := b.GraphInstantiate(g)
	if err != nil {
		t.Fatal(err)
	}
	defer b.GraphExecDestroy(x2)
	defer func() { e.sd.fail = nil }()

	failOnly(e.sd, "cuGraphExecMemcpyNodeSetParams", cu.ErrorInvalidValue)
	wantStubRefusal(t, "memcpy", b.GraphExecMemcpyNodeSetParams(x, mn, gpu.MemcpyParams{Dst: e.p, Src: e.p + 64, Size: 8}), mn,
		gpu.UpdateParametersChanged, "dst 0x", "same device and of the same kind")
	failOnly(e.sd, "cuGraphExecMemsetNodeSetParams", cu.ErrorInvalidValue)
	wantStubRefusal(t, "memset", b.GraphExecMemsetNodeSetParams(x2, sn, gpu.Memset{Dst: e.p, ElemSize: 2, Count: 8}), sn,
		gpu.UpdateParametersChanged, "2-byte elements")

	failOnly(e.sd, "cuGraphExecKernelNodeSetParams_v2", cu.ErrorInvalidValue)
	// The node's own function refused: bad input (a launch configuration
	// out of range, say), not a refusal.
	big := e.fill
	big.Config.Block.X = 4096
	if err := b.GraphExecKernelNodeSetParams(x, kn, big); !errors.Is(err, gpu.ErrInvalidValue) || errors.Is(err, gpu.ErrGraphUpdate) {
		t.Errorf("kernel node update refused with its own function: %v, want gpu.ErrInvalidValue", err)
	}
	// Another function refused: the change of function.
	other := gpu.KernelParams{Func: e.axpb, Config: e.fill.Config,
		Args: []gpu.Arg{gpu.Ptr(e.p), gpu.Ptr(e.p), gpu.F32(1), gpu.F32(0), gpu.I32(16)}}
	wantStubRefusal(t, "kernel of another function", b.GraphExecKernelNodeSetParams(x, kn, other), kn,
		gpu.UpdateFunctionChanged, "change the node's function")
	e.sd.fail = nil
	if err := b.GraphExecKernelNodeSetParams(x, kn, other); err != nil {
		t.Errorf("a change of function the driver takes: %v", err)
	}
}

// TestStubWholeGraphRefusalKeepsCode: whole-graph refusals keep the CUresult
// in the UpdateError's fields.
func TestStubWholeGraphRefusalKeepsCode(t *testing.T) {
	e := newRefusalEnv(t)
	g, x, _, _ := e.graph(t)
	failOnly(e.sd, "cuGraphExecUpdate_v2", cu.ErrorGraphExecUpdateFailure)
	defer func() { e.sd.fail = nil }()
	err := e.b.GraphExecUpdate(x, g)
	var ue *gpu.UpdateError
	if !errors.As(err, &ue) || ue.Code != int(cu.ErrorGraphExecUpdateFailure) || ue.CodeName != "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE" {
		t.Errorf("refused whole-graph update: %v, want an UpdateError keeping CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", err)
	}
}
