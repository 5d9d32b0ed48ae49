package cuda

import (
	"fmt"
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

// childRefusal explains why the driver refused (err, with
// CUDA_ERROR_INVALID_VALUE) to update child-graph node n (driver node cn,
// on dev) with graph child. cuGraphExecChildGraphNodeSetParams says
// nothing more, so the backend compares the node's graph with child the way
// cuGraphExecUpdate pairs nodes (node i with node i, in insertion order;
// dependencies by index; child graphs recursively): a difference there is
// UpdateTopologyChanged or UpdateNodeTypeChanged, like sim's; otherwise
// some node's parameters changed in a way an exec update cannot take
// (memory of another device or kind, a kernel of another context):
// UpdateParametersChanged. This runs only on a refusal, never on the
// update's normal path.
func (b *Backend) childRefusal(op string, dev int, n gpu.GraphNode, cn cu.GraphNode, child cu.Graph, err error) error {
	var old cu.Graph
	var res gpu.UpdateResult
	var why string
	derr := b.onDevice(dev, func() error {
		if r := b.d.GraphChildGraphNodeGetGraph(cn, &old); r != cu.Success {
			return b.check("cuGraphChildGraphNodeGetGraph", r)
		}
		var e error
		res, why, e = b.compareGraphs(old, child, "the child graph")
		return e
	})
	switch {
	case derr != nil:
		return refused(op, gpu.UpdateFailed, n, err, "the driver refused the child graph, and comparing it with the node's failed: %v", derr)
	case res == gpu.UpdateSuccess:
		return refused(op, gpu.UpdateParametersChanged, n, err,
			"the driver refused the child graph, whose topology and node types match the node's: a node's parameters changed in a way an exec update cannot take (memory of another device or kind, a kernel of another context)")
	}
	return refused(op, res, n, err, "%s", why)
}

// compareGraphs compares the new graph with the old one as an exec update
// pairs them, on the current context. It returns UpdateSuccess when their
// topologies and node types match.
func (b *Backend) compareGraphs(old, new cu.Graph, where string) (gpu.UpdateResult, string, error) {
	on, err := b.rawNodes(old)
	if err != nil {
		return 0, "", err
	}
	nn, err := b.rawNodes(new)
	if err != nil {
		return 0, "", err
	}
	if len(on) != len(nn) {
		return gpu.UpdateTopologyChanged, fmt.Sprintf("%s has %d nodes, the node's %d", where, len(nn), len(on)), nil
	}
	index := func(ns []cu.GraphNode) map[cu.GraphNode]int {
		m := make(map[cu.GraphNode]int, len(ns))
		for i, x := range ns {
			m[x] = i
		}
		return m
	}
	oi, ni := index(on), index(nn)
	for i := range nn {
		od, err := b.rawDeps(on[i], oi)
		if err != nil {
			return 0, "", err
		}
		nd, err := b.rawDeps(nn[i], ni)
		if err != nil {
			return 0, "", err
		}
		if !slices.Equal(od, nd) {
			return gpu.UpdateTopologyChanged, fmt.Sprintf("%s: node %d depends on nodes %v, in the node's on %v", where, i, nd, od), nil
		}
	}
	for i := range nn {
		ot, err := b.rawType(on[i])
		if err != nil {
			return 0, "", err
		}
		nt, err := b.rawType(nn[i])
		if err != nil {
			return 0, "", err
		}
		if ot != nt {
			return gpu.UpdateNodeTypeChanged, fmt.Sprintf("%s: node %d is a %v node, in the node's a %v node", where, i, nt, ot), nil
		}
		if nt != gpu.NodeChildGraph {
			continue
		}
		var oc, nc cu.Graph
		if r := b.d.GraphChildGraphNodeGetGraph(on[i], &oc); r != cu.Success {
			return 0, "", b.check("cuGraphChildGraphNodeGetGraph", r)
		}
		if r := b.d.GraphChildGraphNodeGetGraph(nn[i], &nc); r != cu.Success {
			return 0, "", b.check("cuGraphChildGraphNodeGetGraph", r)
		}
		if res, why, err := b.compareGraphs(oc, nc, fmt.Sprintf("%s, node %d's child graph", where, i)); err != nil || res != gpu.UpdateSuccess {
			return res, why, err
		}
	}
	return gpu.UpdateSuccess, "", nil
}

// rawNodes lists g's nodes in insertion order (current context).
func (b *Backend) rawNodes(g cu.Graph) ([]cu.GraphNode, error) {
	var count uint64
	if r := b.d.GraphGetNodes(g, nil, &count); r != cu.Success {
		return nil, b.check("cuGraphGetNodes", r)
	}
	if count == 0 {
		return nil, nil
	}
	nodes := make([]cu.GraphNode, count)
	if r := b.d.GraphGetNodes(g, nodes, &count); r != cu.Success {
		return nil, b.check("cuGraphGetNodes", r)
	}
	return nodes[:min(count, uint64(len(nodes)))], nil
}

// rawDeps returns the indexes (in index) of n's dependencies, sorted.
func (b *Backend) rawDeps(n cu.GraphNode, index map[cu.GraphNode]int) ([]int, error) {
	var count uint64
	if r := b.d.GraphNodeGetDependencies(n, nil, &count); r != cu.Success {
		return nil, b.check("cuGraphNodeGetDependencies_v2", r)
	}
	if count == 0 {
		return nil, nil
	}
	deps := make([]cu.GraphNode, count)
	if r := b.d.GraphNodeGetDependencies(n, deps, &count); r != cu.Success {
		return nil, b.check("cuGraphNodeGetDependencies_v2", r)
	}
	out := make([]int, 0, count)
	for _, d := range deps[:min(count, uint64(len(deps)))] {
		out = append(out, index[d])
	}
	slices.Sort(out)
	return out, nil
}

// rawType is n's type (current context).
func (b *Backend) rawType(n cu.GraphNode) (gpu.NodeType, error) {
	var t cu.GraphNodeType
	if r := b.d.GraphNodeGetType(n, &t); r != cu.Success {
		return 0, b.check("cuGraphNodeGetType", r)
	}
	return nodeTypeOf(t), nil
}
