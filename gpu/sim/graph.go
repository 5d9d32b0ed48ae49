package sim

import (
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
)

// Graphs are lists of nodes in creation order; a node's dependencies are
// earlier nodes of the same graph, so creation order is a topological
// order and replay runs nodes in it. A child-graph node owns a deep copy of
// the graph it was given. Graph objects follow the gpu package's
// serialisation rule; Backend.mu guards them anyway, so misuse cannot
// corrupt the backend.

type graph struct {
	handle     gpu.Graph
	dev        int
	nodes      []*node
	owner      *node // the child-graph node owning this graph, nil at top level
	registered bool  // handles in the tables (false while being captured)

	// Device-updatable nodes (devupdate.go).
	devNodes []gpu.DevNode // of this graph's nodes opted in
	execs    int           // live execs instantiated from it
	devExec  *exec         // the live exec holding its device-updatable nodes
}

type node struct {
	handle gpu.GraphNode
	g      *graph
	index  int // position in g.nodes
	typ    gpu.NodeType
	deps   []*node
	p      params
	child  *graph
	// devNode is the node's handle for device code once it opted in to
	// device-side updates (devupdate.go), 0 before.
	devNode gpu.DevNode
}

func (b *Backend) newGraphLocked(dev int, owner *node, register bool) *graph {
	g := &graph{handle: gpu.Graph(b.newHandleLocked()), dev: dev, owner: owner}
	if register {
		b.registerLocked(g)
	}
	return g
}

// registerLocked puts g, its nodes and their child graphs in the tables.
func (b *Backend) registerLocked(g *graph) {
	g.registered = true
	b.mu.graphs[g.handle] = g
	for _, n := range g.nodes {
		b.mu.nodes[n.handle] = n
		if n.child != nil {
			b.registerLocked(n.child)
		}
	}
}

func (b *Backend) unregisterLocked(g *graph) {
	g.registered = false
	delete(b.mu.graphs, g.handle)
	for _, n := range g.nodes {
		delete(b.mu.nodes, n.handle)
		if n.child != nil {
			b.unregisterLocked(n.child)
		}
	}
}

// addNodeLocked appends a node of type typ with deps to g.
func (b *Backend) addNodeLocked(g *graph, typ gpu.NodeType, deps []*node) *node {
	n := &node{handle: gpu.GraphNode(b.newHandleLocked()), g: g, index: len(g.nodes), typ: typ, deps: deps}
	g.nodes = append(g.nodes, n)
	if g.registered {
		b.mu.nodes[n.handle] = n
	}
	return n
}

// copyGraphLocked returns an unregistered deep copy of src, for a
// child-graph node to own.
func (b *Backend) copyGraphLocked(src *graph) *graph {
	c := b.newGraphLocked(src.dev, nil, false)
	for _, sn := range src.nodes {
		deps := make([]*node, len(sn.deps))
		for i, d := range sn.deps {
			deps[i] = c.nodes[d.index]
		}
		n := b.addNodeLocked(c, sn.typ, deps)
		n.p = sn.p
		if sn.child != nil {
			b.adoptLocked(n, b.copyGraphLocked(sn.child))
		}
	}
	return c
}

// adoptLocked makes child (unregistered) the graph owned by n.
func (b *Backend) adoptLocked(n *node, child *graph) {
	child.owner, n.child = n, child
	if n.g.registered {
		b.registerLocked(child)
	}
}

// graphLocked looks up a graph handle.
func (b *Backend) graphLocked(op string, g gpu.Graph) (*graph, error) {
	return getLocked(b, op, "graph", b.mu.graphs, g)
}

// depsLocked resolves deps, which must be distinct nodes of g.
func (b *Backend) depsLocked(op string, g *graph, deps []gpu.GraphNode) ([]*node, error) {
	out := make([]*node, 0, len(deps))
	for _, h := range deps {
		n, err := getLocked(b, op, "graph node", b.mu.nodes, h)
		if err != nil {
			return nil, err
		}
		if n.g != g {
			return nil, gpu.Errorf(op, gpu.ErrInvalidValue, "dependency %#x is a node of graph %#x, not of graph %#x", uint64(h), uint64(n.g.handle), uint64(g.handle))
		}
		if slices.Contains(out, n) {
			return nil, gpu.Errorf(op, gpu.ErrInvalidValue, "dependency %#x is listed twice", uint64(h))
		}
		out = append(out, n)
	}
	return out, nil
}

// addNode is the common part of the GraphAdd*Node entry points: it builds
// the node with fill (which validates) under the write lock.
func (b *Backend) addNode(op string, gh gpu.Graph, deps []gpu.GraphNode, typ gpu.NodeType, fill func(n *node) error) (gpu.GraphNode, error) {
	return onGraph(b, op, gh, func(g *graph) (gpu.GraphNode, error) {
		ds, err := b.depsLocked(op, g, deps)
		if err != nil {
			return 0, err
		}
		// Validate into a scratch node first so a refused node leaves g as it
		// was and issues no handle.
		var tmp node
		if err := fill(&tmp); err != nil {
			return 0, err
		}
		var child *graph
		if tmp.child != nil {
			child = b.copyGraphLocked(tmp.child) // before adding n: g may be its own child
		}
		n := b.addNodeLocked(g, typ, ds)
		n.p = tmp.p
		if child != nil {
			b.adoptLocked(n, child)
		}
		return n.handle, nil
	})
}

func (b *Backend) GraphCreate(dev int) (gpu.Graph, error) {
	const op = "GraphCreate"
	if err := b.enter(op); err != nil {
		return 0, err
	}
	if err := b.checkDev(op, dev); err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return 0, errClosed(op)
	}
	return b.newGraphLocked(dev, nil, true).handle, nil
}

// GraphDestroy destroys g, its nodes and their child graphs. A child graph
// owned by a node cannot be destroyed on its own (gpu.ErrInvalidValue).
func (b *Backend) GraphDestroy(gh gpu.Graph) error {
	const op = "GraphDestroy"
	if err := b.enter(op); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	g, err := b.graphLocked(op, gh)
	if err != nil {
		return err
	}
	if g.owner != nil {
		return gpu.Errorf(op, gpu.ErrInvalidValue, "graph %#x is owned by child-graph node %#x; destroy its top-level graph", uint64(gh), uint64(g.owner.handle))
	}
	b.unregisterLocked(g)
	b.graphDestroyedLocked(g)
	return nil
}

func (b *Backend) GraphAddKernelNode(g gpu.Graph, deps []gpu.GraphNode, p gpu.KernelParams) (gpu.GraphNode, error) {
	const op = "GraphAddKernelNode"
	return b.addNode(op, g, deps, gpu.NodeKernel, func(n *node) (err error) {
		n.p.kern, err = b.kernelParamsLocked(op, p)
		return err
	})
}

// GraphAddMemcpyNode adds a device-to-device copy node. Addresses are
// checked when the node runs.
func (b *Backend) GraphAddMemcpyNode(g gpu.Graph, deps []gpu.GraphNode, p gpu.MemcpyParams) (gpu.GraphNode, error) {
	return b.addNode("GraphAddMemcpyNode", g, deps, gpu.NodeMemcpy, func(n *node) error {
		n.p.cp = p
		return nil
	})
}

func (b *Backend) GraphAddMemsetNode(g gpu.Graph, deps []gpu.GraphNode, p gpu.Memset) (gpu.GraphNode, error) {
	const op = "GraphAddMemsetNode"
	return b.addNode(op, g, deps, gpu.NodeMemset, func(n *node) error {
		n.p.ms = p
		return checkMemset(op, p)
	})
}

func (b *Backend) GraphAddChildGraphNode(g gpu.Graph, deps []gpu.GraphNode, child gpu.Graph) (gpu.GraphNode, error) {
	const op = "GraphAddChildGraphNode"
	return b.addNode(op, g, deps, gpu.NodeChildGraph, func(n *node) (err error) {
		if n.child, err = b.graphLocked(op, child); err != nil {
			return err
		}
		return childCheck(op, n.child)
	})
}

func (b *Backend) GraphAddEmptyNode(g gpu.Graph, deps []gpu.GraphNode) (gpu.GraphNode, error) {
	return b.addNode("GraphAddEmptyNode", g, deps, gpu.NodeEmpty, func(*node) error { return nil })
}

// ---- inspection ----

func handles(ns []*node) []gpu.GraphNode {
	out := make([]gpu.GraphNode, len(ns))
	for i, n := range ns {
		out[i] = n.handle
	}
	return out
}

// GraphNodes returns g's nodes in creation order.
func (b *Backend) GraphNodes(gh gpu.Graph) ([]gpu.GraphNode, error) {
	const op = "GraphNodes"
	if err := b.enter(op); err != nil {
		return nil, err
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	g, err := b.graphLocked(op, gh)
	if err != nil {
		return nil, err
	}
	return handles(g.nodes), nil
}

// onGraph is the frame of the calls that change graph gh: it counts op
// (fault injection) and runs f on the graph under the write lock.
func onGraph[T any](b *Backend, op string, gh gpu.Graph, f func(g *graph) (T, error)) (T, error) {
	var zero T
	if err := b.enter(op); err != nil {
		return zero, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	g, err := b.graphLocked(op, gh)
	if err != nil {
		return zero, err
	}
	return f(g)
}

// readNode is the frame of the calls that read a node: it counts op (fault
// injection) and returns what read finds in node h, of type typ (0: any),
// under the read lock.
func readNode[T any](b *Backend, op string, h gpu.GraphNode, typ gpu.NodeType, read func(n *node) T) (T, error) {
	if err := b.enter(op); err != nil {
		var zero T
		return zero, err
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	n, err := b.nodeLocked(op, h, typ)
	if err != nil {
		var zero T
		return zero, err
	}
	return read(n), nil
}

// nodeOf looks up a node, and checks its type when want is not 0.
func (b *Backend) nodeLocked(op string, h gpu.GraphNode, want gpu.NodeType) (*node, error) {
	n, err := getLocked(b, op, "graph node", b.mu.nodes, h)
	if err != nil {
		return nil, err
	}
	if want != 0 && n.typ != want {
		return nil, gpu.Errorf(op, gpu.ErrInvalidValue, "node %#x is a %s node, not a %s node", uint64(h), n.typ, want)
	}
	return n, nil
}

func (b *Backend) GraphNodeType(h gpu.GraphNode) (gpu.NodeType, error) {
	const op = "GraphNodeType"
	return readNode(b, op, h, 0, func(n *node) gpu.NodeType { return n.typ })
}

func (b *Backend) GraphNodeDeps(h gpu.GraphNode) ([]gpu.GraphNode, error) {
	const op = "GraphNodeDeps"
	return readNode(b, op, h, 0, func(n *node) []gpu.GraphNode { return handles(n.deps) })
}

// GraphKernelNodeParams returns a copy of a kernel node's typed parameters.
func (b *Backend) GraphKernelNodeParams(h gpu.GraphNode) (gpu.KernelParams, error) {
	const op = "GraphKernelNodeParams"
	return readNode(b, op, h, gpu.NodeKernel, func(n *node) gpu.KernelParams { return n.p.kern.public() })
}

// GraphChildGraph returns the graph a child-graph node owns. Changes to it
// change the node, as in CUDA; it cannot be destroyed on its own.
func (b *Backend) GraphChildGraph(h gpu.GraphNode) (gpu.Graph, error) {
	const op = "GraphChildGraph"
	return readNode(b, op, h, gpu.NodeChildGraph, func(n *node) gpu.Graph { return n.child.handle })
}
