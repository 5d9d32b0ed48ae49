package graph_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/graph"
	"github.com/stablegraph/stablegraph/internal/trace"
)

// copyCounter counts the exec updates of copy and memset nodes.
type copyCounter struct {
	gpu.Backend
	memcpys, memsets int
}

func (c *copyCounter) GraphExecMemcpyNodeSetParams(x gpu.GraphExec, n gpu.GraphNode, p gpu.MemcpyParams) error {
	c.memcpys++
	return c.Backend.GraphExecMemcpyNodeSetParams(x, n, p)
}

func (c *copyCounter) GraphExecMemsetNodeSetParams(x gpu.GraphExec, n gpu.GraphNode, p gpu.Memset) error {
	c.memsets++
	return c.Backend.GraphExecMemsetNodeSetParams(x, n, p)
}

// TestInstantiateCopiesAsKernels: with InstantiateOptions' kernels, the
// copy over movable buffers is recorded as a copy kernel and moves as a
// kernel node (no copy node update), per node and from the template, with
// the copy's bits; the memset it cannot make a kernel (6 bytes) stays a
// memset node; a move off 4-byte alignment is refused, to record again,
// which keeps the copy a copy node there.
func TestInstantiateCopiesAsKernels(t *testing.T) {
	m := newMLP(t, 2, 4, 1, trace.Options{})
	cb, addrs, cp, fill := devStep(t, m)
	opts := graph.InstantiateOptions{Patch: true, Movable: []bool{true, true, true, false}, Copy: cp, Fill: fill}
	bad := opts
	bad.Movable = bad.Movable[:2]
	if _, err := cb.InstantiateWith(m.b, addrs, bad); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("InstantiateWith with 2 movable flags for 4 buffers: %v", err)
	}
	x, err := cb.InstantiateWith(m.b, addrs, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Destroy(m.b)
	kinds := map[gpu.NodeType]int{}
	nodes, err := m.b.GraphNodes(x.Graph)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		typ, _ := m.b.GraphNodeType(n)
		kinds[typ]++
	}
	if kinds[gpu.NodeMemcpy] != 0 || kinds[gpu.NodeMemset] != 1 {
		t.Errorf("node kinds %v: want the copy a kernel, the 6-byte memset a memset node", kinds)
	}
	const n = 16
	check := func(name string, a []gpu.DevicePtr) {
		t.Helper()
		src := make([]float32, n)
		for i := range src {
			src[i] = float32(len(name)*100 + i)
		}
		if err := m.b.MemcpyHtoD(a[0], gpu.F32ToBytes(src)); err != nil {
			t.Fatal(err)
		}
		if err := x.Launch(m.b, m.s); err != nil {
			t.Fatal(err)
		}
		if err := m.b.StreamSynchronize(m.s); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 4*n)
		if err := m.b.MemcpyDtoH(got, a[2]); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, gpu.F32ToBytes(src)) {
			t.Errorf("%s: z is not a copy of x", name)
		}
	}
	check("recorded", addrs)
	cc := &copyCounter{Backend: m.b}
	fresh := func() []gpu.DevicePtr {
		return []gpu.DevicePtr{m.alloc(4*n, 0), m.alloc(4*n, 0), m.alloc(4*n+8, 0), addrs[3]}
	}
	// The whole-graph update first: it prepares the exec's kernel nodes
	// through the sim's own sets, which the per-node moves then use.
	a1 := fresh()
	if _, err := cb.PatchWhole(m.b, x, a1); err != nil {
		t.Fatal(err)
	}
	check("whole", a1)
	a2 := fresh()
	moved, err := cb.Patch(cc, x, a2)
	if err != nil {
		t.Fatal(err)
	}
	if cc.memcpys != 0 || cc.memsets != 1 || moved != 4 {
		t.Errorf("Patch: %d copy node updates, %d memset node updates, %d nodes; want 0, 1 (the 6-byte memset) and 4", cc.memcpys, cc.memsets, moved)
	}
	check("per node", a2)
	a3 := fresh()
	if _, err := cb.PatchWhole(m.b, x, a3); err != nil {
		t.Fatal(err)
	}
	check("whole after per node", a3)
	odd := []gpu.DevicePtr{a3[0].Add(2), a3[1], a3[2], a3[3]}
	var ue *gpu.UpdateError
	if _, err := cb.Patch(cc, x, odd); !errors.Is(err, gpu.ErrGraphUpdate) || !errors.As(err, &ue) {
		t.Errorf("Patch with the copy kernel's source off 4-byte alignment: %v, want an UpdateError", err)
	}
	// Recorded there, the copy is a copy node.
	y, err := cb.InstantiateWith(m.b, odd, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer y.Destroy(m.b)
	if nodes, err = m.b.GraphNodes(y.Graph); err != nil {
		t.Fatal(err)
	}
	copies := 0
	for _, n := range nodes {
		if typ, _ := m.b.GraphNodeType(n); typ == gpu.NodeMemcpy {
			copies++
		}
	}
	if copies != 1 {
		t.Errorf("recorded at an odd source: %d copy nodes, want 1", copies)
	}
}
