package sim

import "github.com/stablegraph/stablegraph/gpu"

var _ gpu.GraphNodeReader = (*Backend)(nil)

// GraphMemcpyNodeParams implements gpu.GraphNodeReader.
func (b *Backend) GraphMemcpyNodeParams(h gpu.GraphNode) (gpu.MemcpyParams, error) {
	const op = "GraphMemcpyNodeParams"
	return readNode(b, op, h, gpu.NodeMemcpy, func(n *node) gpu.MemcpyParams { return n.p.cp })
}

// GraphMemsetNodeParams implements gpu.GraphNodeReader.
func (b *Backend) GraphMemsetNodeParams(h gpu.GraphNode) (gpu.Memset, error) {
	const op = "GraphMemsetNodeParams"
	return readNode(b, op, h, gpu.NodeMemset, func(n *node) gpu.Memset { return n.p.ms })
}

// memoryNode returns a graph memory node of g or of its child graphs, or
// nil: CUDA embeds no such graph as a child (cuGraphAddChildGraphNode
// refuses it; only a move of ownership, which the gpu interface does not
// model, could).
func memoryNode(g *graph) *node {
	for _, n := range g.nodes {
		if n.typ == gpu.NodeMemAlloc || n.typ == gpu.NodeMemFree {
			return n
		}
		if n.child != nil {
			if m := memoryNode(n.child); m != nil {
				return m
			}
		}
	}
	return nil
}

// checkChild refuses child, as a child graph, when it holds memory nodes.
func checkChild(op string, child *graph) error {
	if n := memoryNode(child); n != nil {
		return gpu.Errorf(op, gpu.ErrInvalidValue, "graph %#x holds a %s node (%#x), and graphs with memory nodes cannot be child graphs",
			uint64(child.handle), n.typ, uint64(n.handle))
	}
	return nil
}
