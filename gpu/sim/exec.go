package sim

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/stablegraph/stablegraph/gpu"
)

// An exec graph is a plan: a snapshot of its source graph's nodes, taken at
// instantiation, that later edits of the graph do not reach. Plans are
// copy-on-write by epoch: GraphLaunch queues the current plan and starts a
// new epoch, so a plan that was launched is never modified again (launches
// already queued keep their parameters), and an update copies a launched
// plan once, then edits the copy in place until the next launch. Per-node
// updates thus cost O(1) plus one O(nodes) pointer copy per launch epoch.

type plan struct {
	dev   int
	nodes []*enode
	epoch uint64 // the exec epoch that made it; mutable while current
}

// enode is an immutable node of a plan.
type enode struct {
	typ   gpu.NodeType
	deps  []int // sorted indexes of dependencies, for topology checks
	p     params
	child *plan
	homes homes // memcpy and memset nodes: where their operands lived when set
	dev   bool  // a device-updatable node (top level only): it runs with its exec's device state
}

type exec struct {
	handle gpu.GraphExec
	source gpu.Graph
	g      *graph                    // the source graph, live or not
	index  map[gpu.GraphNode][]int32 // source node → path of node indexes through child plans
	dev    *devState                 // device-updatable nodes (devupdate.go); nil when none

	// plan and epoch change under Backend.mu's write lock (updates) or
	// under its read lock plus mu (GraphLaunch).
	mu    sync.Mutex
	plan  *plan
	epoch uint64
}

func depIndexes(deps []*node) []int {
	out := make([]int, len(deps))
	for i, d := range deps {
		out[i] = d.index
	}
	slices.Sort(out)
	return out
}

// planLocked snapshots g. Kernel nodes must name loaded functions.
func (b *Backend) planLocked(op string, g *graph, epoch uint64) (*plan, error) {
	p := &plan{dev: g.dev, nodes: make([]*enode, len(g.nodes)), epoch: epoch}
	for i, n := range g.nodes {
		e := &enode{typ: n.typ, deps: depIndexes(n.deps), p: n.p, homes: b.mu.as.operandHomes(n.typ, n.p)}
		if n.typ == gpu.NodeKernel && n.p.kern.fn.unloaded.Load() {
			return nil, gpu.Errorf(op, gpu.ErrInvalidHandle, "node %#x: the module of kernel %s was unloaded", uint64(n.handle), n.p.kern.fn.spec.Name)
		}
		if n.child != nil {
			c, err := b.planLocked(op, n.child, epoch)
			if err != nil {
				return nil, err
			}
			e.child = c
		}
		p.nodes[i] = e
	}
	return p, nil
}

func indexNodes(g *graph, prefix []int32, idx map[gpu.GraphNode][]int32) {
	for i, n := range g.nodes {
		path := append(slices.Clip(prefix), int32(i))
		idx[n.handle] = path
		if n.child != nil {
			indexNodes(n.child, path, idx)
		}
	}
}

// graphFromPlanLocked rebuilds an unregistered graph from a plan, for a
// GraphLaunch captured into a child-graph node.
func (b *Backend) graphFromPlanLocked(p *plan) *graph {
	g := b.newGraphLocked(p.dev, nil, false)
	for _, e := range p.nodes {
		deps := make([]*node, len(e.deps))
		for i, d := range e.deps {
			deps[i] = g.nodes[d]
		}
		n := b.addNodeLocked(g, e.typ, deps)
		n.p = e.p
		if e.child != nil {
			b.adoptLocked(n, b.graphFromPlanLocked(e.child))
		}
	}
	return g
}

// GraphInstantiate snapshots g into an exec graph.
func (b *Backend) GraphInstantiate(gh gpu.Graph) (gpu.GraphExec, error) {
	const op = "GraphInstantiate"
	return onGraph(b, op, gh, func(g *graph) (gpu.GraphExec, error) {
		if err := instantiateCheckLocked(op, g); err != nil {
			return 0, err
		}
		p, err := b.planLocked(op, g, 0)
		if err != nil {
			return 0, err
		}
		x := &exec{handle: gpu.GraphExec(b.newHandleLocked()), source: gh, g: g, plan: p, index: map[gpu.GraphNode][]int32{},
			dev: newDevStateLocked(g, p)}
		indexNodes(g, nil, x.index)
		b.mu.execs[x.handle] = x
		g.execs++
		if x.dev != nil {
			g.devExec = x
		}
		return x.handle, nil
	})
}

func (b *Backend) GraphExecDestroy(xh gpu.GraphExec) error {
	const op = "GraphExecDestroy"
	return b.onExec(op, xh, func(x *exec) error {
		delete(b.mu.execs, xh)
		b.execDestroyedLocked(x)
		return nil
	})
}

// GraphLaunch queues x's current plan on s: its parameters are fixed now,
// so later updates of x affect only later launches. On a capturing stream
// it records a child-graph node holding a copy of what x would run now
// (its source graph with x's updates applied).
func (b *Backend) GraphLaunch(xh gpu.GraphExec, s gpu.Stream) error {
	const op = "GraphLaunch"
	if err := b.enter(op); err != nil {
		return err
	}
	return b.submit(op, s, capNode, func(st *stream) (cmd, error) {
		x, err := getLocked(b, op, "graph exec", b.mu.execs, xh)
		if err != nil {
			return cmd{}, err
		}
		x.mu.Lock()
		if err := launchCheckLocked(op, x, st); err != nil {
			x.mu.Unlock()
			return cmd{}, err
		}
		p := x.plan
		x.epoch++ // p is frozen from now on
		x.mu.Unlock()
		return cmd{kind: cmdGraph, plan: p, dev: x.dev}, nil
	})
}

// runPlan replays p on st's worker, node by node in creation order, and
// stops at the first node that faults. ds is the device state of its exec
// (nil when it has no device-updatable nodes).
func (st *stream) runPlan(p *plan, ds *devState) bool { return st.runPlanAt(p, ds, -1) }

// runPlanAt runs p, a plan nested in top-level node top (-1: p is the top
// level).
func (st *stream) runPlanAt(p *plan, ds *devState, top int) bool {
	b := st.b
	for i, e := range p.nodes {
		var err error
		at := top
		if at < 0 {
			at = i
		}
		switch e.typ {
		case gpu.NodeKernel:
			k := &e.p.kern
			if e.dev && ds != nil {
				if cur, ok := ds.current(i); ok {
					k = &cur
				}
			}
			if !st.runKernelIn(k, launchCtx{ds: ds, node: at}) {
				return false
			}
			continue
		case gpu.NodeChildGraph:
			if !st.runPlanAt(e.child, ds, at) {
				return false
			}
			continue
		case gpu.NodeEmpty, gpu.NodeMemAlloc, gpu.NodeMemFree:
			// Graph memory stays mapped for the graph's life (see
			// internalAllocLocked): its nodes only order work.
			continue
		}
		if b.faulted(p.dev) || b.closingNow() {
			return false
		}
		switch e.typ {
		case gpu.NodeMemcpy:
			err = b.copyDtoD(actor{dev: p.dev, kernel: "memcpy"}, e.p.cp.Dst, e.p.cp.Src, e.p.cp.Size)
		case gpu.NodeMemset:
			err = b.memset(actor{dev: p.dev, kernel: "memset"}, e.p.ms)
		case gpu.NodeMemWriteValue:
			err = b.writeValue(actor{dev: p.dev, kernel: "writeValue64"}, e.p.wv)
		}
		if err != nil {
			return false
		}
	}
	return true
}

// ---- whole-graph update ----

func updateErr(op string, r gpu.UpdateResult, n gpu.GraphNode, format string, args ...any) error {
	return &gpu.UpdateError{Op: op, Result: r, Node: n, Detail: fmt.Sprintf(format, args...)}
}

// matchLocked checks that g can update p, with the rules CUDA enforces:
// same node count and edges (node i against node i, deps by index), same
// node types, kernels on the same device, memsets of the same element
// size, memcpy and memset operands in memory of the same device or kind
// (operandsLocked); child graphs recursively.
func (b *Backend) matchLocked(op string, p *plan, g *graph) error {
	if len(p.nodes) != len(g.nodes) {
		return updateErr(op, gpu.UpdateTopologyChanged, 0, "graph %#x has %d nodes, the exec graph %d", uint64(g.handle), len(g.nodes), len(p.nodes))
	}
	for i, n := range g.nodes {
		if want, got := p.nodes[i].deps, depIndexes(n.deps); !slices.Equal(want, got) {
			return updateErr(op, gpu.UpdateTopologyChanged, n.handle, "node %d depends on nodes %v, in the exec graph on %v", i, got, want)
		}
	}
	for i, n := range g.nodes {
		e := p.nodes[i]
		if e.typ != n.typ {
			return updateErr(op, gpu.UpdateNodeTypeChanged, n.handle, "node %d is a %s node, in the exec graph a %s node", i, n.typ, e.typ)
		}
		switch n.typ {
		case gpu.NodeKernel:
			if nd, ed := n.p.kern.fn.dev, e.p.kern.fn.dev; nd != ed {
				return updateErr(op, gpu.UpdateFunctionChanged, n.handle, "node %d: kernel %s is on device %d, the exec graph's kernel on device %d", i, n.p.kern.fn.spec.Name, nd, ed)
			}
		case gpu.NodeMemset:
			if ne, ee := n.p.ms.ElemSize, e.p.ms.ElemSize; ne != ee {
				return updateErr(op, gpu.UpdateParametersChanged, n.handle, "node %d: memset element size %d, in the exec graph %d", i, ne, ee)
			}
		case gpu.NodeChildGraph:
			if err := b.matchLocked(op, e.child, n.child); err != nil {
				return err
			}
		case gpu.NodeMemAlloc, gpu.NodeMemFree:
			// CUDA cannot move a graph allocation by an update.
			if n.p.ga != e.p.ga {
				return updateErr(op, gpu.UpdateParametersChanged, n.handle, "node %d: a %s node's allocation cannot change", i, n.typ)
			}
		}
		if _, err := b.operandsLocked(op, n.handle, e, n.p); err != nil {
			return err
		}
	}
	return nil
}

// GraphExecUpdate applies g's parameters to x when g has x's topology; on
// refusal (an *gpu.UpdateError) x is unchanged. Per-node updates keep
// naming nodes by their handles in x's source graph.
func (b *Backend) GraphExecUpdate(xh gpu.GraphExec, gh gpu.Graph) error {
	const op = "GraphExecUpdate"
	return b.onExec(op, xh, func(x *exec) error {
		g, err := b.graphLocked(op, gh)
		if err != nil {
			return err
		}
		if err := updateCheck(op, x, g); err != nil {
			return err
		}
		if err := b.matchLocked(op, x.plan, g); err != nil {
			return err
		}
		p, err := b.planLocked(op, g, x.epoch)
		if err != nil {
			return err
		}
		x.plan = p
		return nil
	})
}

// ---- per-node updates ----

// onExec is the frame of the calls that change exec graph xh: it counts op
// (fault injection) and runs f on the exec under the write lock.
func (b *Backend) onExec(op string, xh gpu.GraphExec, f func(x *exec) error) error {
	if err := b.enter(op); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	x, err := getLocked(b, op, "graph exec", b.mu.execs, xh)
	if err != nil {
		return err
	}
	return f(x)
}

// execNodeLocked finds source node nh in x, checking its type.
func (b *Backend) execNodeLocked(op string, xh gpu.GraphExec, nh gpu.GraphNode, want gpu.NodeType) (*exec, []int32, *enode, error) {
	x, err := getLocked(b, op, "graph exec", b.mu.execs, xh)
	if err != nil {
		return nil, nil, nil, err
	}
	if _, err := getLocked(b, op, "graph node", b.mu.nodes, nh); err != nil {
		return nil, nil, nil, err
	}
	path, ok := x.index[nh]
	if !ok {
		return nil, nil, nil, gpu.Errorf(op, gpu.ErrInvalidValue, "node %#x is not a node of graph %#x, which exec %#x was instantiated from", uint64(nh), uint64(x.source), uint64(xh))
	}
	p := x.plan
	for _, i := range path[:len(path)-1] {
		p = p.nodes[i].child
	}
	e := p.nodes[path[len(path)-1]]
	if e.typ != want {
		return nil, nil, nil, gpu.Errorf(op, gpu.ErrInvalidValue, "node %#x is a %s node, not a %s node", uint64(nh), e.typ, want)
	}
	return x, path, e, nil
}

// setExecNode is the frame of the GraphExec*NodeSetParams calls: it counts
// the call (fault injection), runs check (the parameters alone, when not
// nil), finds source node n of exec xh and checks its type under b.mu, and
// replaces the node with what update returns from the node as it is.
func (b *Backend) setExecNode(op string, xh gpu.GraphExec, n gpu.GraphNode, want gpu.NodeType, check func() error, update func(x *exec, e *enode) (*enode, error)) error {
	if err := b.enter(op); err != nil {
		return err
	}
	if check != nil {
		if err := check(); err != nil {
			return err
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	x, path, e, err := b.execNodeLocked(op, xh, n, want)
	if err != nil {
		return err
	}
	ne, err := update(x, e)
	if err != nil {
		return err
	}
	x.setLocked(path, ne)
	return nil
}

// setLocked replaces the node at path with e, copying launched plans on
// the way.
func (x *exec) setLocked(path []int32, e *enode) { x.plan = x.setIn(x.plan, path, e) }

func (x *exec) setIn(p *plan, path []int32, e *enode) *plan {
	if p.epoch != x.epoch {
		p = &plan{dev: p.dev, nodes: slices.Clone(p.nodes), epoch: x.epoch}
	}
	i := path[0]
	if len(path) > 1 {
		parent := *p.nodes[i]
		parent.child = x.setIn(parent.child, path[1:], e)
		e = &parent
	}
	p.nodes[i] = e
	return p
}

// GraphExecKernelNodeSetParams sets the parameters of kernel node n in x
// (not in its graph), from the next launch on. The function may change
// within its device (else an *gpu.UpdateError); args are checked against
// its spec.
func (b *Backend) GraphExecKernelNodeSetParams(xh gpu.GraphExec, n gpu.GraphNode, p gpu.KernelParams) error {
	const op = "GraphExecKernelNodeSetParams"
	return b.setExecNode(op, xh, n, gpu.NodeKernel, nil, func(x *exec, e *enode) (*enode, error) {
		k, err := b.kernelParamsLocked(op, p)
		if err != nil {
			return nil, err
		}
		if k.fn.dev != e.p.kern.fn.dev {
			return nil, updateErr(op, gpu.UpdateFunctionChanged, n, "kernel %s is on device %d, the node's kernel on device %d", k.fn.spec.Name, k.fn.dev, e.p.kern.fn.dev)
		}
		ne := *e
		ne.p.kern = k
		hostChangedLocked(x, e)
		return &ne, nil
	})
}

// GraphExecMemcpyNodeSetParams sets a memcpy node's parameters in x. New
// operands in memory of another device or kind than the node's are refused
// (operandsLocked).
func (b *Backend) GraphExecMemcpyNodeSetParams(xh gpu.GraphExec, n gpu.GraphNode, p gpu.MemcpyParams) error {
	const op = "GraphExecMemcpyNodeSetParams"
	return b.setExecNode(op, xh, n, gpu.NodeMemcpy, nil, func(_ *exec, e *enode) (*enode, error) {
		np := e.p
		np.cp = p
		return b.withOperandsLocked(op, n, e, np)
	})
}

// GraphExecMemsetNodeSetParams sets a memset node's parameters in x. A
// change of element size is refused (an *gpu.UpdateError: CUDA allows it
// only "opportunistically"; sim never), as is a destination in memory of
// another device or kind (operandsLocked).
func (b *Backend) GraphExecMemsetNodeSetParams(xh gpu.GraphExec, n gpu.GraphNode, p gpu.Memset) error {
	const op = "GraphExecMemsetNodeSetParams"
	check := func() error { return checkMemset(op, p) }
	return b.setExecNode(op, xh, n, gpu.NodeMemset, check, func(_ *exec, e *enode) (*enode, error) {
		if p.ElemSize != e.p.ms.ElemSize {
			return nil, updateErr(op, gpu.UpdateParametersChanged, n, "memset element size cannot change from %d to %d in an instantiated graph", e.p.ms.ElemSize, p.ElemSize)
		}
		np := e.p
		np.ms = p
		return b.withOperandsLocked(op, n, e, np)
	})
}

// GraphExecChildGraphNodeSetParams applies child's parameters to the child
// graph of node n in x; child must have the same topology and obey the
// update rules of GraphExecUpdate, recursively (else an *gpu.UpdateError
// naming n, with the child's offending node in its detail).
func (b *Backend) GraphExecChildGraphNodeSetParams(xh gpu.GraphExec, n gpu.GraphNode, child gpu.Graph) error {
	const op = "GraphExecChildGraphNodeSetParams"
	return b.setExecNode(op, xh, n, gpu.NodeChildGraph, nil, func(x *exec, e *enode) (*enode, error) {
		g, err := b.graphLocked(op, child)
		if err != nil {
			return nil, err
		}
		if err := childCheck(op, g); err != nil {
			return nil, err
		}
		if err := b.matchLocked(op, e.child, g); err != nil {
			// The refusal names the node updated; the child's own node
			// goes into the detail.
			var ue *gpu.UpdateError
			if errors.As(err, &ue) {
				if ue.Node != 0 {
					ue.Detail = fmt.Sprintf("in the child graph, node %#x: %s", uint64(ue.Node), ue.Detail)
				}
				ue.Node = n
			}
			return nil, err
		}
		cp, err := b.planLocked(op, g, x.epoch)
		if err != nil {
			return nil, err
		}
		ne := *e
		ne.child = cp
		return &ne, nil
	})
}

// ---- operand homes ----

// home is where an operand's memory lives, for CUDA's update rule "the
// device(s) to which the operand(s) was allocated/mapped cannot change" and
// "the new pointer must be to the same kind of allocation": a device
// ordinal, homeHost, or homeNone.
type home int16

const (
	homeNone home = -2 // in no live allocation
	homeHost home = -1 // HostAlloc memory
)

func (h home) String() string {
	switch h {
	case homeNone:
		return "no live allocation"
	case homeHost:
		return "host memory"
	}
	return fmt.Sprintf("memory of device %d", int(h))
}

// homes are a memcpy node's destination and source, or a memset node's
// destination; the others are homeNone.
type homes [2]home

var operandNames = [2]string{"destination", "source"}

// homeOf returns where the memory at a lives.
func (as *addrSpace) homeOf(a uint64) home {
	r := as.regionAt(a)
	switch {
	case r == nil || r.freed:
		return homeNone
	case r.kind == regAlloc:
		return home(r.dev)
	case r.kind == regHost:
		return homeHost
	}
	if i := mappingIndex(r, a); i < len(r.maps) && r.maps[i].start <= a {
		return home(r.maps[i].chunk.dev)
	}
	return homeNone
}

// operandHomes returns where the operands of a node of type typ live.
func (as *addrSpace) operandHomes(typ gpu.NodeType, p params) homes {
	hs := homes{homeNone, homeNone}
	switch typ {
	case gpu.NodeMemcpy:
		hs[0], hs[1] = as.homeOf(uint64(p.cp.Dst)), as.homeOf(uint64(p.cp.Src))
	case gpu.NodeMemset:
		hs[0] = as.homeOf(uint64(p.ms.Dst))
	}
	return hs
}

// withOperandsLocked returns memcpy or memset node e with parameters p, its
// operands checked and their homes recorded by operandsLocked.
func (b *Backend) withOperandsLocked(op string, n gpu.GraphNode, e *enode, p params) (*enode, error) {
	ne := *e
	ne.p = p
	var err error
	if ne.homes, err = b.operandsLocked(op, n, e, ne.p); err != nil {
		return nil, err
	}
	return &ne, nil
}

// operandsLocked checks the new parameters p of memcpy or memset node n
// (e in the plan) as CUDA does an exec update of them, and returns where
// their operands live: an operand must be in live memory, and in memory of
// the same device and kind as the node's operand was when it was
// instantiated or last updated (an operand that was in no live memory then
// may move anywhere). Other nodes pass.
func (b *Backend) operandsLocked(op string, n gpu.GraphNode, e *enode, p params) (homes, error) {
	if e.typ != gpu.NodeMemcpy && e.typ != gpu.NodeMemset {
		return e.homes, nil
	}
	hs := b.mu.as.operandHomes(e.typ, p)
	ptrs := [2]gpu.DevicePtr{p.cp.Dst, p.cp.Src}
	count := 2
	if e.typ == gpu.NodeMemset {
		ptrs[0], count = p.ms.Dst, 1
	}
	for i := range count {
		switch {
		case hs[i] == homeNone:
			return hs, updateErr(op, gpu.UpdateParametersChanged, n, "%s %s %#x is in no live allocation", e.typ, operandNames[i], uint64(ptrs[i]))
		case e.homes[i] != homeNone && hs[i] != e.homes[i] && hs[i] != homeHost && e.homes[i] != homeHost:
			// Mapped host memory is taken in either direction: the CUDA
			// driver (580) does, though its documentation says a node's
			// memory may not change kind.
			return hs, updateErr(op, gpu.UpdateParametersChanged, n,
				"%s %s %#x is in %s; the instantiated node's is in %s, which an exec update cannot change", e.typ, operandNames[i], uint64(ptrs[i]), hs[i], e.homes[i])
		}
	}
	return hs, nil
}
