package trace

import (
	"bytes"
	"errors"
	"fmt"
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
)

// Node is one node of a trace in flat form: what a captured graph holds,
// read back node by node, so that its nodes can be added to another graph
// as nodes of their own (see Tracer.Flat). Only the fields of Type are
// used. Deps are indices of earlier nodes of the same trace.
type Node struct {
	Type   gpu.NodeType // gpu.NodeKernel, NodeMemcpy, NodeMemset or NodeEmpty
	Deps   []int
	Kernel gpu.KernelParams
	Memcpy gpu.MemcpyParams
	Memset gpu.Memset
}

// SameShape reports whether n and m are the same kind of node with the same
// dependencies, and, for kernels, the same function and launch shape and
// parameters of the same sizes: whether m's parameters can be set on the
// node n describes by a per-node exec update.
func (n *Node) SameShape(m *Node) bool {
	if n.Type != m.Type || !slices.Equal(n.Deps, m.Deps) {
		return false
	}
	switch n.Type {
	case gpu.NodeKernel:
		a, b := &n.Kernel, &m.Kernel
		if a.Func != b.Func || a.Config != b.Config || len(a.Args) != len(b.Args) {
			return false
		}
		for i := range a.Args {
			if a.Args[i].Kind != b.Args[i].Kind || a.Args[i].Size() != b.Args[i].Size() {
				return false
			}
		}
	case gpu.NodeMemset:
		return n.Memset.ElemSize == m.Memset.ElemSize
	}
	return true
}

// SameParams reports whether n and m (of the same shape) hold the same
// parameters.
func (n *Node) SameParams(m *Node) bool {
	switch n.Type {
	case gpu.NodeKernel:
		for i, a := range n.Kernel.Args {
			b := m.Kernel.Args[i]
			if a.Kind == gpu.ArgBytes {
				if !bytes.Equal(a.Raw, b.Raw) {
					return false
				}
			} else if a.Bits != b.Bits {
				return false
			}
		}
	case gpu.NodeMemcpy:
		return n.Memcpy == m.Memcpy
	case gpu.NodeMemset:
		return n.Memset == m.Memset
	}
	return true
}

// Clone returns a deep copy of n: its argument bytes may be rewritten
// without touching n.
func (n Node) Clone() Node {
	n.Deps = slices.Clone(n.Deps)
	n.Kernel.Args = slices.Clone(n.Kernel.Args)
	for i, a := range n.Kernel.Args {
		if a.Raw != nil {
			n.Kernel.Args[i].Raw = slices.Clone(a.Raw)
		}
	}
	return n
}

// CloneNodes deep-copies ns.
func CloneNodes(ns []Node) []Node {
	out := make([]Node, len(ns))
	for i := range ns {
		out[i] = ns[i].Clone()
	}
	return out
}

// Exits returns the indices of the nodes of ns no other node depends on:
// the nodes whatever follows the trace must wait for.
func Exits(ns []Node) []int {
	used := make([]bool, len(ns))
	for _, n := range ns {
		for _, d := range n.Deps {
			used[d] = true
		}
	}
	var out []int
	for i, u := range used {
		if !u {
			out = append(out, i)
		}
	}
	return out
}

// readNodes reads graph g node by node. A node whose parameters cannot be
// read back through the gpu interface (its type is not modelled, or the
// backend cannot decode it) stops the read with why set, naming the node:
// such a trace can be neither proved patchable nor flattened, only kept
// whole. Errors come from the backend.
func readNodes(r GraphReader, g gpu.Graph) (_ []Node, why string, _ error) {
	handles, err := r.GraphNodes(g)
	if err != nil {
		return nil, "", fmt.Errorf("read trace: %w", err)
	}
	index := make(map[gpu.GraphNode]int, len(handles))
	for i, n := range handles {
		index[n] = i
	}
	nr, _ := gpu.GraphNodeReaderOf(r)
	out := make([]Node, len(handles))
	for i, h := range handles {
		typ, err := r.GraphNodeType(h)
		if err != nil {
			return nil, "", fmt.Errorf("read trace node %d: %w", i, err)
		}
		deps, err := r.GraphNodeDeps(h)
		if err != nil {
			return nil, "", fmt.Errorf("read trace node %d: %w", i, err)
		}
		n := &out[i]
		n.Type = typ
		for _, d := range deps {
			j, ok := index[d]
			if !ok {
				return nil, "", gpu.Errorf("trace.readNodes", gpu.ErrIllegalState, "node %d depends on a node outside its graph", i)
			}
			n.Deps = append(n.Deps, j)
		}
		slices.Sort(n.Deps)
		switch typ {
		case gpu.NodeEmpty:
		case gpu.NodeKernel:
			n.Kernel, err = r.GraphKernelNodeParams(h)
			if errors.Is(err, gpu.ErrNotSupported) {
				// The backend cannot read this kernel's parameters back
				// (NCCL's kernels pass a buffer shorter than their declared
				// layout): nothing can be proved about them.
				return nil, fmt.Sprintf("node %d: the backend cannot read its kernel parameters: %v", i, err), nil
			}
		case gpu.NodeMemcpy, gpu.NodeMemset:
			if nr == nil {
				return nil, fmt.Sprintf("node %d is a %s node, whose parameters the backend cannot read back", i, typ), nil
			}
			if typ == gpu.NodeMemcpy {
				n.Memcpy, err = nr.GraphMemcpyNodeParams(h)
			} else {
				n.Memset, err = nr.GraphMemsetNodeParams(h)
			}
			if errors.Is(err, gpu.ErrNotSupported) {
				return nil, fmt.Sprintf("node %d: the backend cannot read its %s parameters: %v", i, typ, err), nil
			}
		case gpu.NodeMemAlloc, gpu.NodeMemFree:
			return nil, fmt.Sprintf("node %d is a %s node: the command allocates memory inside the capture "+
				"(a library given no workspace), so every trace holds a new address", i, typ), nil
		default:
			return nil, fmt.Sprintf("node %d is a %s node, whose parameters the gpu interface cannot read back", i, typ), nil
		}
		if err != nil {
			return nil, "", fmt.Errorf("read trace node %d: %w", i, err)
		}
	}
	return out, "", nil
}
