package sim

import "github.com/stablegraph/stablegraph/gpu"

var _ gpu.GraphNodeSetter = (*Backend)(nil)

// Host-side node parameters (gpu.GraphNodeSetter): a node's parameters in
// its graph change in place; execs made from the graph keep theirs until a
// GraphExecUpdate from it, as on CUDA. A graph kept as an exec's host
// template moves this way (graph.CommandBuffer.PatchWhole).

// setGraphNode runs set on node nh of a top-level or child graph, which
// must be of type want, under the write lock.
func (b *Backend) setGraphNode(op string, nh gpu.GraphNode, want gpu.NodeType, set func(n *node) error) error {
	if err := b.enter(op); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := getLocked(b, op, "graph node", b.mu.nodes, nh)
	if err != nil {
		return err
	}
	if n.typ != want {
		return gpu.Errorf(op, gpu.ErrInvalidValue, "node %#x is a %v node, not %v", uint64(nh), n.typ, want)
	}
	return set(n)
}

// GraphKernelNodeSetParams sets kernel node n's parameters in its graph.
// The function may change within the node's device.
func (b *Backend) GraphKernelNodeSetParams(nh gpu.GraphNode, p gpu.KernelParams) error {
	const op = "GraphKernelNodeSetParams"
	return b.setGraphNode(op, nh, gpu.NodeKernel, func(n *node) error {
		k, err := b.kernelParamsLocked(op, p)
		if err != nil {
			return err
		}
		if k.fn.dev != n.g.dev {
			return gpu.Errorf(op, gpu.ErrInvalidValue, "kernel %s is on device %d, the graph on device %d", k.fn.spec.Name, k.fn.dev, n.g.dev)
		}
		n.p.kern = k
		return nil
	})
}

// GraphMemcpyNodeSetParams sets memcpy node n's parameters in its graph
// (checked when the node runs, as at GraphAddMemcpyNode).
func (b *Backend) GraphMemcpyNodeSetParams(nh gpu.GraphNode, p gpu.MemcpyParams) error {
	return b.setGraphNode("GraphMemcpyNodeSetParams", nh, gpu.NodeMemcpy, func(n *node) error {
		n.p.cp = p
		return nil
	})
}

// GraphMemsetNodeSetParams sets memset node n's parameters in its graph.
func (b *Backend) GraphMemsetNodeSetParams(nh gpu.GraphNode, m gpu.Memset) error {
	const op = "GraphMemsetNodeSetParams"
	return b.setGraphNode(op, nh, gpu.NodeMemset, func(n *node) error {
		if err := checkMemset(op, m); err != nil {
			return err
		}
		n.p.ms = m
		return nil
	})
}
