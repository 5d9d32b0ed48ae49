package sim

import (
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

// TestGraphNodeSetters: a node's parameters set on its graph change what
// an exec instantiated later runs, and what an exec made before runs only
// after a GraphExecUpdate from the graph; a node of another type, or bad
// parameters, are refused.
func TestGraphNodeSetters(t *testing.T) {
	b := newSim(t, Config{})
	k := loadKernels(t, b, 0)
	s := newStream(t, b, 0)
	const n = 16
	p, q, src := alloc(t, b, 0, 4*n), alloc(t, b, 0, 4*n), alloc(t, b, 0, 4*n)
	writeF32(t, b, src, make([]float32, n))
	g := newGraph(t, b, 0)
	fill := gpu.KernelParams{Func: k.fn(t, kernels.Fill), Config: kernels.Elementwise(n), Args: fillArgs(p, 1, n)}
	kn, err := b.GraphAddKernelNode(g, nil, fill)
	must(t, err)
	cn, err := b.GraphAddMemcpyNode(g, []gpu.GraphNode{kn}, gpu.MemcpyParams{Dst: q, Src: p, Size: 4 * n})
	must(t, err)
	sn, err := b.GraphAddMemsetNode(g, []gpu.GraphNode{cn}, gpu.Memset{Dst: src, Value: 0, ElemSize: 4, Count: 1})
	must(t, err)
	x := instantiate(t, b, g)

	moved := fill
	moved.Args = fillArgs(q, 2, n)
	must(t, b.GraphKernelNodeSetParams(kn, moved))
	must(t, b.GraphMemcpyNodeSetParams(cn, gpu.MemcpyParams{Dst: p, Src: q, Size: 4 * n}))
	must(t, b.GraphMemsetNodeSetParams(sn, gpu.Memset{Dst: src, Value: 0x40400000, ElemSize: 4, Count: 1}))
	run := func(x gpu.GraphExec) {
		t.Helper()
		writeF32(t, b, p, make([]float32, n))
		writeF32(t, b, q, make([]float32, n))
		must(t, b.GraphLaunch(x, s))
		must(t, b.StreamSynchronize(s))
	}
	run(x)
	wantAll(t, readF32(t, b, p, n), 1) // the exec made before: unchanged
	wantAll(t, readF32(t, b, q, n), 1)
	run(instantiate(t, b, g)) // one made after: the new parameters
	wantAll(t, readF32(t, b, q, n), 2)
	wantAll(t, readF32(t, b, p, n), 2)
	if got := readF32(t, b, src, 1); got[0] != 3 {
		t.Errorf("memset node set on the graph wrote %v", got[0])
	}
	must(t, b.GraphExecUpdate(x, g))
	run(x)
	wantAll(t, readF32(t, b, p, n), 2)

	wantErr(t, b.GraphKernelNodeSetParams(cn, fill), gpu.ErrInvalidValue)
	wantErr(t, b.GraphMemcpyNodeSetParams(kn, gpu.MemcpyParams{Dst: p, Src: q, Size: 4}), gpu.ErrInvalidValue)
	wantErr(t, b.GraphMemsetNodeSetParams(sn, gpu.Memset{Dst: src, ElemSize: 3, Count: 1}), gpu.ErrInvalidValue)
	bad := fill
	bad.Args = bad.Args[:1]
	wantErr(t, b.GraphKernelNodeSetParams(kn, bad), gpu.ErrInvalidValue)
	wantErr(t, b.GraphKernelNodeSetParams(0xbad, fill), gpu.ErrInvalidHandle)
}
