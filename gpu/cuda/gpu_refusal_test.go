package cuda

// Per-node exec update refusals by a real driver; skips without a GPU.
// Lines starting CUDA-REFUSAL give the errors, for the record.

import (
	"errors"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
	"github.com/stablegraph/stablegraph/kernels"
)

// TestNodeRefusalGPU: cuGraphExecChildGraphNodeSetParams refuses a child
// graph of another topology (and of other node types) with
// CUDA_ERROR_INVALID_VALUE; the backend reports it as an *gpu.UpdateError
// saying why, keeping the CUresult, and the exec graph still runs what it
// ran. A child of the same topology is taken. Memset and memcpy nodes
// moved to host memory or freed memory are refused the same way.
func TestNodeRefusalGPU(t *testing.T) {
	b := openOrSkip(t, Config{})
	closeClean(t, b)
	m, err := b.ModuleLoad(0, kernels.Module())
	if err != nil {
		t.Fatal(err)
	}
	defer b.ModuleUnload(m)
	fill, err := b.ModuleFunction(m, kernels.Fill)
	if err != nil {
		t.Fatal(err)
	}
	const n = 1024
	bufs := make([]gpu.DevicePtr, 4) // kernel's, child's, memset's, memcpy's
	for i := range bufs {
		if bufs[i], err = b.MemAlloc(0, 4*n); err != nil {
			t.Fatal(err)
		}
		defer b.MemFree(bufs[i])
	}
	fillOf := func(p gpu.DevicePtr, v float32) gpu.KernelParams {
		return gpu.KernelParams{Func: fill, Config: kernels.Elementwise(n), Args: []gpu.Arg{gpu.Ptr(p), gpu.F32(v), gpu.I32(n)}}
	}
	var graphs []gpu.Graph
	defer func() {
		for _, g := range graphs {
			b.GraphDestroy(g)
		}
	}()
	graphOf := func(nodes ...func(g gpu.Graph) error) gpu.Graph {
		g, err := b.GraphCreate(0)
		if err != nil {
			t.Fatal(err)
		}
		graphs = append(graphs, g)
		for _, add := range nodes {
			if err := add(g); err != nil {
				t.Fatal(err)
			}
		}
		return g
	}
	kernel := func(p gpu.DevicePtr, v float32) func(gpu.Graph) error {
		return func(g gpu.Graph) error { _, err := b.GraphAddKernelNode(g, nil, fillOf(p, v)); return err }
	}
	memset := func(p gpu.DevicePtr) func(gpu.Graph) error {
		return func(g gpu.Graph) error {
			_, err := b.GraphAddMemsetNode(g, nil, gpu.Memset{Dst: p, ElemSize: 4, Count: n})
			return err
		}
	}

	g := graphOf(kernel(bufs[0], 1))
	G, err := b.GraphAddChildGraphNode(g, nil, graphOf(kernel(bufs[1], 2)))
	if err != nil {
		t.Fatal(err)
	}
	M, err := b.GraphAddMemsetNode(g, nil, gpu.Memset{Dst: bufs[2], Value: gpu.F32(3).AsU32(), ElemSize: 4, Count: n})
	if err != nil {
		t.Fatal(err)
	}
	C, err := b.GraphAddMemcpyNode(g, []gpu.GraphNode{M}, gpu.MemcpyParams{Dst: bufs[3], Src: bufs[2], Size: 4 * n})
	if err != nil {
		t.Fatal(err)
	}
	x, err := b.GraphInstantiate(g)
	if err != nil {
		t.Fatal(err)
	}
	defer b.GraphExecDestroy(x)
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.StreamDestroy(s)
	run := func(what string, want ...float32) {
		t.Helper()
		for _, p := range bufs {
			if err := b.MemsetAsync(gpu.Memset{Dst: p, ElemSize: 4, Count: n}, s); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.GraphLaunch(x, s); err != nil {
			t.Fatal(err)
		}
		if err := b.StreamSynchronize(s); err != nil {
			t.Fatal(err)
		}
		for i, p := range bufs {
			got := make([]byte, 4*n)
			if err := b.MemcpyDtoH(got, p); err != nil {
				t.Fatal(err)
			}
			if v := gpu.BytesToF32(got); v[0] != want[i] || v[n-1] != want[i] {
				t.Errorf("%s: buffer %d holds %v ... %v, want %v", what, i, v[0], v[n-1], want[i])
			}
		}
	}
	run("first launch", 1, 2, 3, 3)

	refusal := func(what string, err error, node gpu.GraphNode, want gpu.UpdateResult) {
		t.Helper()
		t.Logf("CUDA-REFUSAL %s: %v", what, err)
		var ue *gpu.UpdateError
		switch {
		case !errors.As(err, &ue) || !errors.Is(err, gpu.ErrGraphUpdate):
			t.Errorf("%s: %v, want an *gpu.UpdateError", what, err)
		case errors.Is(err, gpu.ErrInvalidValue):
			t.Errorf("%s: the refusal also wraps gpu.ErrInvalidValue", what)
		case ue.Result != want || ue.Node != node:
			t.Errorf("%s: %v at node %#x, want %v at node %#x", what, ue.Result, uint64(ue.Node), want, uint64(node))
		case ue.Code != int(cu.ErrorInvalidValue) && ue.Code != int(cu.ErrorGraphExecUpdateFailure):
			// Driver 580 refuses child graphs with GRAPH_EXEC_UPDATE_FAILURE,
			// other per-node updates with INVALID_VALUE.
			t.Errorf("%s: CUresult %s (%d) not kept, want CUDA_ERROR_INVALID_VALUE or CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE", what, ue.CodeName, ue.Code)
		}
	}
	refusal("child graph of two nodes for one", b.GraphExecChildGraphNodeSetParams(x, G, graphOf(kernel(bufs[1], 5), kernel(bufs[1], 6))),
		G, gpu.UpdateTopologyChanged)
	refusal("child graph of a memset for a kernel", b.GraphExecChildGraphNodeSetParams(x, G, graphOf(memset(bufs[1]))),
		G, gpu.UpdateNodeTypeChanged)
	hm, err := b.HostAlloc(4 * n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.HostFree(hm.Handle)
	// Mapped host memory is taken (driver 580), though the documentation
	// says a node's memory may not change kind; the node is moved back.
	err = b.GraphExecMemsetNodeSetParams(x, M, gpu.Memset{Dst: hm.Ptr, ElemSize: 4, Count: n})
	t.Logf("CUDA-REFUSAL memset into mapped host memory (taken by driver 580): %v", err)
	if err != nil {
		t.Errorf("memset into mapped host memory: %v, want it taken as the sim takes it", err)
	}
	if err := b.GraphExecMemsetNodeSetParams(x, M, gpu.Memset{Dst: bufs[2], Value: gpu.F32(3).AsU32(), ElemSize: 4, Count: n}); err != nil {
		t.Fatal(err)
	}
	freed, err := b.MemAlloc(0, 4*n)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.MemFree(freed); err != nil {
		t.Fatal(err)
	}
	refusal("memcpy from freed memory", b.GraphExecMemcpyNodeSetParams(x, C, gpu.MemcpyParams{Dst: bufs[3], Src: freed, Size: 4 * n}),
		C, gpu.UpdateParametersChanged)
	run("launch after the refusals", 1, 2, 3, 3)

	// Unknown from the docs: is the backend's virtual memory "the same kind
	// of allocation" as cuMemAlloc memory? sim says yes. Either answer is
	// recorded; a refusal must still be one.
	if gran := b.devs[0].props.Granularity; b.devs[0].props.VMM && gran > 0 {
		c, err := b.MemCreate(0, gran)
		if err != nil {
			t.Fatal(err)
		}
		defer b.MemRelease(c)
		va, err := b.MemAddressReserve(gran, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer b.MemAddressFree(va, gran)
		if err := b.MemMap(va, gran, 0, c); err != nil {
			t.Fatal(err)
		}
		defer b.MemUnmap(va, gran)
		if err := b.MemSetAccess(va, gran, []int{0}); err != nil {
			t.Fatal(err)
		}
		x2, err := b.GraphInstantiate(g)
		if err != nil {
			t.Fatal(err)
		}
		defer b.GraphExecDestroy(x2)
		err = b.GraphExecMemsetNodeSetParams(x2, M, gpu.Memset{Dst: va, ElemSize: 4, Count: n})
		t.Logf("CUDA-REFUSAL probe: memset node moved from cuMemAlloc memory to a VMM mapping: %v", err)
		if err != nil {
			refusal("memset moved into virtual memory", err, M, gpu.UpdateParametersChanged)
		}
	}

	if err := b.GraphExecChildGraphNodeSetParams(x, G, graphOf(kernel(bufs[1], 7))); err != nil {
		t.Fatalf("child graph of the same topology: %v", err)
	}
	run("launch after an accepted child update", 1, 7, 3, 3)
}
