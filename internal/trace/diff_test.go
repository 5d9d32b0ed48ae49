package trace

import (
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
)

// fakeGraphs is an in-memory graph store that hands kernel parameters back
// exactly as given, ArgBytes included, as the CUDA backend does for
// captured library kernels (sim would reject untyped arguments).
type fakeGraphs struct {
	next    uint64
	graphs  map[gpu.Graph][]gpu.GraphNode
	nodes   map[gpu.GraphNode]*fakeNode
	layouts map[gpu.Function][]gpu.ParamInfo
}

type fakeNode struct {
	typ  gpu.NodeType
	deps []gpu.GraphNode
	p    gpu.KernelParams
	cp   gpu.MemcpyParams
	ms   gpu.Memset
}

func newFake() *fakeGraphs {
	return &fakeGraphs{graphs: map[gpu.Graph][]gpu.GraphNode{}, nodes: map[gpu.GraphNode]*fakeNode{},
		layouts: map[gpu.Function][]gpu.ParamInfo{}}
}

func (f *fakeGraphs) GraphCreate(int) (gpu.Graph, error) {
	f.next++
	f.graphs[gpu.Graph(f.next)] = nil
	return gpu.Graph(f.next), nil
}

func (f *fakeGraphs) GraphDestroy(g gpu.Graph) error { delete(f.graphs, g); return nil }

func (f *fakeGraphs) add(g gpu.Graph, n *fakeNode) gpu.GraphNode {
	f.next++
	h := gpu.GraphNode(f.next)
	f.nodes[h] = n
	f.graphs[g] = append(f.graphs[g], h)
	return h
}

func (f *fakeGraphs) GraphAddKernelNode(g gpu.Graph, deps []gpu.GraphNode, p gpu.KernelParams) (gpu.GraphNode, error) {
	return f.add(g, &fakeNode{typ: gpu.NodeKernel, deps: slices.Clone(deps), p: p}), nil
}

func (f *fakeGraphs) GraphAddMemcpyNode(g gpu.Graph, deps []gpu.GraphNode, p gpu.MemcpyParams) (gpu.GraphNode, error) {
	return f.add(g, &fakeNode{typ: gpu.NodeMemcpy, deps: slices.Clone(deps), cp: p}), nil
}

func (f *fakeGraphs) GraphAddMemsetNode(g gpu.Graph, deps []gpu.GraphNode, p gpu.Memset) (gpu.GraphNode, error) {
	return f.add(g, &fakeNode{typ: gpu.NodeMemset, deps: slices.Clone(deps), ms: p}), nil
}

func (f *fakeGraphs) GraphAddEmptyNode(g gpu.Graph, deps []gpu.GraphNode) (gpu.GraphNode, error) {
	return f.add(g, &fakeNode{typ: gpu.NodeEmpty, deps: slices.Clone(deps)}), nil
}

func (f *fakeGraphs) GraphNodes(g gpu.Graph) ([]gpu.GraphNode, error) {
	return slices.Clone(f.graphs[g]), nil
}
func (f *fakeGraphs) GraphNodeType(n gpu.GraphNode) (gpu.NodeType, error) {
	return f.nodes[n].typ, nil
}
func (f *fakeGraphs) GraphNodeDeps(n gpu.GraphNode) ([]gpu.GraphNode, error) {
	return f.nodes[n].deps, nil
}
func (f *fakeGraphs) GraphKernelNodeParams(n gpu.GraphNode) (gpu.KernelParams, error) {
	return f.nodes[n].p, nil
}
func (f *fakeGraphs) FuncParamInfo(fn gpu.Function) ([]gpu.ParamInfo, error) {
	l, ok := f.layouts[fn]
	if !ok {
		return nil, gpu.Errorf("FuncParamInfo", gpu.ErrInvalidHandle, "no function %d", fn)
	}
	return l, nil
}

// libParams is a library kernel's parameters as the driver reports them:
// a typed pointer to operand 0, then a 32-byte struct holding a u64 scalar,
// a pointer 64 bytes into operand 1, an i32 and 4 trailing bytes, then an
// f32.
func libParams(ops []gpu.DevicePtr, scalar uint64, m int32) []gpu.Arg {
	s := make([]byte, 28)
	binary.LittleEndian.PutUint64(s[0:], scalar)
	binary.LittleEndian.PutUint64(s[8:], uint64(ops[1])+64)
	binary.LittleEndian.PutUint64(s[16:], 0x1234)
	binary.LittleEndian.PutUint32(s[24:], uint32(m))
	return []gpu.Arg{gpu.Ptr(ops[0]), gpu.Bytes(s), gpu.F32(1.5)}
}

var libLayout = []gpu.ParamInfo{{Offset: 0, Size: 8}, {Offset: 8, Size: 28}, {Offset: 36, Size: 4}}

// trace builds what capturing the library call at ops would give: a kernel
// node, an empty node after it, and a second kernel after both.
func (f *fakeGraphs) trace(ops []gpu.DevicePtr, scalar uint64, m int32) gpu.Graph {
	g, _ := f.GraphCreate(0)
	cfg := gpu.Linear(128, 0)
	a, _ := f.GraphAddKernelNode(g, nil, gpu.KernelParams{Func: 1, Config: cfg, Args: libParams(ops, scalar, m)})
	e, _ := f.GraphAddEmptyNode(g, []gpu.GraphNode{a})
	f.GraphAddKernelNode(g, []gpu.GraphNode{e, a}, gpu.KernelParams{Func: 2, Config: cfg,
		Args: []gpu.Arg{gpu.Ptr(ops[1]), gpu.I32(m)}})
	return g
}

func TestDiffFindsPointerSlotsOnly(t *testing.T) {
	f := newFake()
	f.layouts[1] = libLayout
	f.layouts[2] = []gpu.ParamInfo{{Offset: 0, Size: 8}, {Offset: 8, Size: 4}}
	sizes := []uint64{256, 512}
	ops1 := key(0x7f0000001000, 0x7f0000002000)
	ops2 := key(0x7f0000801000, 0x7f0000a02000)
	// The scalar equals operand 0's address in the first trace: the trap
	// of rule 1. It does not move in the second trace, so it stays.
	scalar := uint64(ops1[0])
	tm, err := Diff(f, f.trace(ops1, scalar, 7), f.trace(ops2, scalar, 7), ops1, ops2, sizes)
	if err != nil {
		t.Fatal(err)
	}
	want := []Slot{
		{Node: 0, Arg: 0, Byte: 0, Operand: 0, Off: 0},
		{Node: 0, Arg: 1, Byte: 8, Operand: 1, Off: 64},
		{Node: 2, Arg: 0, Byte: 0, Operand: 1, Off: 0},
	}
	if got := tm.Slots(); !slices.Equal(got, want) {
		t.Fatalf("slots %+v, want %+v", got, want)
	}

	ops3 := key(0x7f0000f00000, 0x7f0000e00000)
	g, err := tm.Build(f, 0, ops3)
	if err != nil {
		t.Fatal(err)
	}
	nodes, _ := f.GraphNodes(g)
	if len(nodes) != 3 || f.nodes[nodes[1]].typ != gpu.NodeEmpty || !slices.Equal(slices.Sorted(slices.Values(f.nodes[nodes[2]].deps)), []gpu.GraphNode{nodes[0], nodes[1]}) {
		t.Fatalf("built graph has the wrong shape")
	}
	args := f.nodes[nodes[0]].p.Args
	if args[0].Kind != gpu.ArgPtr || args[0].AsPtr() != ops3[0] {
		t.Errorf("typed pointer: %v, want ptr(%#x)", args[0], uint64(ops3[0]))
	}
	if args[1].Kind != gpu.ArgBytes {
		t.Fatalf("struct parameter came back as %s", args[1].Kind)
	}
	raw := args[1].Raw
	if v := binary.LittleEndian.Uint64(raw[0:]); v != scalar {
		t.Errorf("scalar equal to an old address was rewritten: %#x, want %#x", v, scalar)
	}
	if v := binary.LittleEndian.Uint64(raw[8:]); v != uint64(ops3[1])+64 {
		t.Errorf("pointer in struct: %#x, want %#x", v, uint64(ops3[1])+64)
	}
	if v := binary.LittleEndian.Uint32(raw[24:]); v != 7 || args[2].AsF32() != 1.5 {
		t.Errorf("scalars changed: m=%d f=%v", v, args[2])
	}
	if p := f.nodes[nodes[2]].p.Args; p[0].AsPtr() != ops3[1] || p[1].AsI32() != 7 {
		t.Errorf("second kernel: %v", p)
	}
	// The template is not disturbed by building.
	if b := binary.LittleEndian.Uint64(tm.nodes[0].Kernel.Args[1].Raw[8:]); b != uint64(ops1[1])+64 {
		t.Errorf("building rewrote the template: %#x", b)
	}
}

func TestDiffNotPatchable(t *testing.T) {
	sizes := []uint64{256, 512}
	ops1 := key(0x7f0000001000, 0x7f0000002000)
	ops2 := key(0x7f0000801000, 0x7f0000a02000)
	cfg := gpu.Linear(128, 0)
	one := func(f *fakeGraphs, fn gpu.Function, args ...gpu.Arg) gpu.Graph {
		g, _ := f.GraphCreate(0)
		f.GraphAddKernelNode(g, nil, gpu.KernelParams{Func: fn, Config: cfg, Args: args})
		return g
	}
	cases := []struct {
		name   string
		g1, g2 func(f *fakeGraphs) gpu.Graph
		reason string
	}{
		{"node count",
			func(f *fakeGraphs) gpu.Graph { return f.trace(ops1, 0, 7) },
			func(f *fakeGraphs) gpu.Graph { return one(f, 2, gpu.Ptr(ops2[1]), gpu.I32(7)) },
			"3 and 1 nodes"},
		{"scalar depends on the addresses",
			func(f *fakeGraphs) gpu.Graph { return f.trace(ops1, 0, 7) },
			func(f *fakeGraphs) gpu.Graph { return f.trace(ops2, 0, 8) },
			"parameter 1 trailing bytes"},
		{"pointer outside the operand",
			func(f *fakeGraphs) gpu.Graph { return one(f, 2, gpu.Ptr(ops1[0]+300), gpu.I32(1)) },
			func(f *fakeGraphs) gpu.Graph { return one(f, 2, gpu.Ptr(ops2[0]+300), gpu.I32(1)) },
			"do not point into an operand"},
		{"pointer into another operand",
			func(f *fakeGraphs) gpu.Graph { return one(f, 2, gpu.Ptr(ops1[0]), gpu.I32(1)) },
			func(f *fakeGraphs) gpu.Graph { return one(f, 2, gpu.Ptr(ops2[1]), gpu.I32(1)) },
			"do not point into an operand"},
		{"different kernels",
			func(f *fakeGraphs) gpu.Graph { return one(f, 2, gpu.Ptr(ops1[0]), gpu.I32(1)) },
			func(f *fakeGraphs) gpu.Graph { return one(f, 3, gpu.Ptr(ops2[0]), gpu.I32(1)) },
			"different kernels"},
		{"layout disagrees",
			func(f *fakeGraphs) gpu.Graph { return one(f, 3, gpu.Ptr(ops1[0]), gpu.I32(1)) },
			func(f *fakeGraphs) gpu.Graph { return one(f, 3, gpu.Ptr(ops2[0]), gpu.I32(1)) },
			"driver: 8"},
		{"value write node",
			func(f *fakeGraphs) gpu.Graph {
				g, _ := f.GraphCreate(0)
				f.add(g, &fakeNode{typ: gpu.NodeMemWriteValue})
				return g
			},
			func(f *fakeGraphs) gpu.Graph {
				g, _ := f.GraphCreate(0)
				f.add(g, &fakeNode{typ: gpu.NodeMemWriteValue})
				return g
			},
			"mem-write-value node"},
		{"edges differ",
			func(f *fakeGraphs) gpu.Graph {
				g, _ := f.GraphCreate(0)
				f.GraphAddEmptyNode(g, nil)
				f.GraphAddEmptyNode(g, nil)
				return g
			},
			func(f *fakeGraphs) gpu.Graph {
				g, _ := f.GraphCreate(0)
				n, _ := f.GraphAddEmptyNode(g, nil)
				f.GraphAddEmptyNode(g, []gpu.GraphNode{n})
				return g
			},
			"different dependencies"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFake()
			f.layouts[1] = libLayout
			f.layouts[2] = []gpu.ParamInfo{{Offset: 0, Size: 8}, {Offset: 8, Size: 4}}
			f.layouts[3] = []gpu.ParamInfo{{Offset: 0, Size: 8}, {Offset: 8, Size: 8}}
			_, err := Diff(f, c.g1(f), c.g2(f), ops1, ops2, sizes)
			if !errors.Is(err, ErrNotPatchable) {
				t.Fatalf("err = %v, want ErrNotPatchable", err)
			}
			if !strings.Contains(err.Error(), c.reason) {
				t.Errorf("reason %q does not say %q", err, c.reason)
			}
		})
	}
	f := newFake()
	if _, err := Diff(f, 0, 0, ops1, ops1, sizes); err == nil || errors.Is(err, ErrNotPatchable) {
		t.Errorf("operands at the same addresses in both traces: err = %v", err)
	}
}

func (f *fakeGraphs) GraphMemcpyNodeParams(n gpu.GraphNode) (gpu.MemcpyParams, error) {
	return f.nodes[n].cp, nil
}

func (f *fakeGraphs) GraphMemsetNodeParams(n gpu.GraphNode) (gpu.Memset, error) {
	return f.nodes[n].ms, nil
}

// copies builds a trace of a memset of operand 0 then a copy from operand 1
// (src bytes in) into operand 0, of size bytes, with memset value v.
func (f *fakeGraphs) copies(ops []gpu.DevicePtr, src gpu.DevicePtr, size uint64, v uint32) gpu.Graph {
	g, _ := f.GraphCreate(0)
	a, _ := f.GraphAddMemsetNode(g, nil, gpu.Memset{Dst: ops[0], Value: v, ElemSize: 4, Count: 8})
	f.GraphAddMemcpyNode(g, []gpu.GraphNode{a}, gpu.MemcpyParams{Dst: ops[0].Add(32), Src: src, Size: size})
	return g
}

// TestDiffMemcpyMemset: the pointers of copies and memsets are slots when
// they move with an operand; their sizes and values must not change; a
// pointer that moves with an operand but lies outside it is named so.
func TestDiffMemcpyMemset(t *testing.T) {
	f := newFake()
	sizes := []uint64{256, 512}
	ops1 := key(0x7f0000001000, 0x7f0000002000)
	ops2 := key(0x7f0000801000, 0x7f0000a02000)
	tm, err := Diff(f, f.copies(ops1, ops1[1]+16, 64, 0), f.copies(ops2, ops2[1]+16, 64, 0), ops1, ops2, sizes)
	if err != nil {
		t.Fatal(err)
	}
	want := []Slot{{Node: 0, Arg: 0, Operand: 0}, {Node: 1, Arg: 0, Operand: 0, Off: 32}, {Node: 1, Arg: 1, Operand: 1, Off: 16}}
	if got := tm.Slots(); !slices.Equal(got, want) {
		t.Fatalf("slots %+v, want %+v", got, want)
	}
	ops3 := key(0x7f0000f00000, 0x7f0000e00000)
	ns := tm.NodesAt(ops3)
	if ns[0].Memset.Dst != ops3[0] || ns[1].Memcpy.Dst != ops3[0]+32 || ns[1].Memcpy.Src != ops3[1]+16 || ns[1].Memcpy.Size != 64 {
		t.Errorf("moved nodes %+v", ns)
	}
	if g, err := tm.Build(f, 0, ops3); err != nil || len(f.graphs[g]) != 2 || f.nodes[f.graphs[g][1]].cp != ns[1].Memcpy {
		t.Errorf("Build: %v", err)
	}
	for name, c := range map[string]struct {
		g1, g2 gpu.Graph
		reason string
	}{
		"memset value": {f.copies(ops1, ops1[1], 64, 0), f.copies(ops2, ops2[1], 64, 1), "sets"},
		"copy size":    {f.copies(ops1, ops1[1], 64, 0), f.copies(ops2, ops2[1], 32, 0), "copies 64 and 32 bytes"},
		"source before the operand": {f.copies(ops1, ops1[1]-8, 64, 0), f.copies(ops2, ops2[1]-8, 64, 0),
			"it moves with operand 1, at offset -8 of its 512 bytes"},
		"source that moves with nothing": {f.copies(ops1, 0x5000, 64, 0), f.copies(ops2, 0x9000, 64, 0),
			"moves with no operand"},
	} {
		_, err := Diff(f, c.g1, c.g2, ops1, ops2, sizes)
		if !errors.Is(err, ErrNotPatchable) || !strings.Contains(err.Error(), c.reason) {
			t.Errorf("%s: %v, want not patchable with %q", name, err, c.reason)
		}
	}
}

// readerless hides the fake's memcpy and memset readers, as a backend
// without gpu.GraphNodeReader.
type readerless struct{ f *fakeGraphs }

func (r readerless) GraphNodes(g gpu.Graph) ([]gpu.GraphNode, error)     { return r.f.GraphNodes(g) }
func (r readerless) GraphNodeType(n gpu.GraphNode) (gpu.NodeType, error) { return r.f.GraphNodeType(n) }
func (r readerless) GraphNodeDeps(n gpu.GraphNode) ([]gpu.GraphNode, error) {
	return r.f.GraphNodeDeps(n)
}
func (r readerless) GraphKernelNodeParams(n gpu.GraphNode) (gpu.KernelParams, error) {
	return r.f.GraphKernelNodeParams(n)
}
func (r readerless) FuncParamInfo(fn gpu.Function) ([]gpu.ParamInfo, error) {
	return r.f.FuncParamInfo(fn)
}

// TestDiffMemcpyWithoutReader: a backend that cannot read memcpy nodes
// back leaves a trace of them not patchable, saying so.
func TestDiffMemcpyWithoutReader(t *testing.T) {
	f := newFake()
	ops1 := key(0x7f0000001000, 0x7f0000002000)
	ops2 := key(0x7f0000801000, 0x7f0000a02000)
	_, err := Diff(readerless{f}, f.copies(ops1, ops1[1], 64, 0), f.copies(ops2, ops2[1], 64, 0), ops1, ops2, []uint64{256, 512})
	if !errors.Is(err, ErrNotPatchable) || !strings.Contains(err.Error(), "cannot read back") {
		t.Fatalf("err = %v, want not patchable: parameters the backend cannot read back", err)
	}
}
