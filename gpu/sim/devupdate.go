package sim

import (
	"bytes"
	"slices"
	"sync"

	"github.com/stablegraph/stablegraph/gpu"
)

// Device-updatable kernel nodes (gpu.DeviceUpdates), modelled on CUDA 12.4.
//
// A node opted in gets a DevNode, a value kept in Backend.mu.devNodes. An
// exec instantiated from a graph with such nodes marks them in its plan
// (enode.dev, top-level nodes only) and gets a devState: the parameters the
// device holds for those nodes. They are separate from the plan, the
// host-side state: GraphUpload copies the plan's parameters into the device
// state when its stream reaches it, the device runtime
// (memView.GraphKernelNodeSetParam, what the patcher calls) changes them
// there, and a launch runs the device-updatable nodes with the device
// state's parameters as each node starts, so a change made by an earlier
// node of the same launch takes effect in that launch. Host-side changes
// (GraphExecKernelNodeSetParams) change only the plan and mark the exec
// dirty: it must be uploaded again before it is launched.
//
// The sim refuses what CUDA refuses (gpu.DeviceUpdates lists the rules and
// errors) and, as for memory faults, reports what a GPU would silently get
// wrong: a kernel that changes a node of its own launch that does not depend
// on it (the node may already have run, or be running) fails with a sticky
// error instead of racing.

// devNodeTag marks DevNode values, so that one is easy to tell from an
// address or a handle in a dump.
const devNodeTag = 0xdede << 48

var _ gpu.DeviceUpdates = (*Backend)(nil)

// devState is the device side of an exec with device-updatable nodes.
type devState struct {
	g     *graph       // the graph the exec was instantiated from
	slots map[int]bool // top-level indexes of the device-updatable nodes
	deps  [][]int      // top-level dependencies by index; an exec's topology never changes

	// uploaded and dirty are host-side state, guarded by exec.mu.
	uploaded bool // GraphUpload was called
	dirty    bool // a device-updatable node changed on the host since

	mu    sync.Mutex
	cur   map[int]kernelParams // the parameters the device holds, by node index
	after map[int][]bool       // after[r][i]: node i depends on node r, transitively; built lazily
}

// current returns the parameters the device holds for node i.
func (ds *devState) current(i int) (kernelParams, bool) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	k, ok := ds.cur[i]
	return k, ok
}

// dependsOn reports whether node i depends on node r, transitively.
func (ds *devState) dependsOn(i, r int) bool {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	after, ok := ds.after[r]
	if !ok {
		// Dependencies are earlier nodes, so one pass in index order.
		after = make([]bool, len(ds.deps))
		for j := r + 1; j < len(ds.deps); j++ {
			for _, d := range ds.deps[j] {
				if d == r || after[d] {
					after[j] = true
					break
				}
			}
		}
		ds.after[r] = after
	}
	return i < len(after) && after[i]
}

// newDevStateLocked marks g's device-updatable nodes in p (fresh from
// planLocked, not yet shared) and returns their device state, or nil when
// g has none.
func newDevStateLocked(g *graph, p *plan) *devState {
	if len(g.devNodes) == 0 {
		return nil
	}
	ds := &devState{g: g, slots: map[int]bool{}, deps: make([][]int, len(g.nodes)),
		cur: map[int]kernelParams{}, after: map[int][]bool{}}
	for i, n := range g.nodes {
		ds.deps[i] = p.nodes[i].deps
		if n.devNode != 0 {
			p.nodes[i].dev = true
			ds.slots[i] = true
		}
	}
	return ds
}

// instantiateCheckLocked refuses a second exec of a graph with
// device-updatable nodes.
func instantiateCheckLocked(op string, g *graph) error {
	if len(g.devNodes) > 0 && g.execs > 0 {
		return gpu.Errorf(op, gpu.ErrNotSupported, "graph %#x has device-updatable kernel nodes and %d executable graph(s) already: it may have one at a time (destroy it first)", uint64(g.handle), g.execs)
	}
	return nil
}

// execDestroyedLocked updates x's graph's bookkeeping when x goes.
func (b *Backend) execDestroyedLocked(x *exec) {
	g := x.g
	g.execs--
	if g.devExec == x {
		g.devExec = nil
	}
	if !g.registered && g.execs == 0 {
		b.forgetDevNodesLocked(g)
	}
}

// graphDestroyedLocked drops g's DevNodes once nothing can use them.
func (b *Backend) graphDestroyedLocked(g *graph) {
	if g.execs == 0 {
		b.forgetDevNodesLocked(g)
	}
}

func (b *Backend) forgetDevNodesLocked(g *graph) {
	for _, d := range g.devNodes {
		delete(b.mu.devNodes, d)
	}
	g.devNodes = nil
}

// launchCheckLocked refuses launches of an exec with device-updatable nodes
// that was not uploaded since its last host-side change, or into a capture.
// x.mu is held.
func launchCheckLocked(op string, x *exec, st *stream) error {
	ds := x.dev
	switch {
	case ds == nil:
		return nil
	case st.cap != nil:
		return gpu.Errorf(op, gpu.ErrNotSupported, "exec %#x has device-updatable kernel nodes: its launch cannot be captured into another graph", uint64(x.handle))
	case !ds.uploaded:
		return gpu.Errorf(op, gpu.ErrIllegalState, "exec %#x has device-updatable kernel nodes: upload it (GraphUpload) before its first launch", uint64(x.handle))
	case ds.dirty:
		return gpu.Errorf(op, gpu.ErrIllegalState, "exec %#x: a device-updatable kernel node changed on the host since the last upload: upload it again (GraphUpload) before launching", uint64(x.handle))
	}
	return nil
}

// hostChangedLocked notes a host-side change of node e of x (b.mu held
// for writing).
func hostChangedLocked(x *exec, e *enode) {
	if e.dev {
		x.mu.Lock()
		x.dev.dirty = true
		x.mu.Unlock()
	}
}

// updateCheck refuses whole-graph updates involving device-updatable nodes.
func updateCheck(op string, x *exec, g *graph) error {
	switch {
	case x.dev != nil:
		return updateErr(op, gpu.UpdateNotSupported, 0, "exec %#x has device-updatable kernel nodes, which whole-graph updates do not allow", uint64(x.handle))
	case len(g.devNodes) > 0:
		return updateErr(op, gpu.UpdateNotSupported, 0, "graph %#x has device-updatable kernel nodes, which whole-graph updates do not allow", uint64(g.handle))
	}
	return nil
}

// childCheck refuses as a child graph a graph with memory nodes
// (checkChild) or device-updatable nodes.
func childCheck(op string, child *graph) error {
	if err := checkChild(op, child); err != nil {
		return err
	}
	if len(child.devNodes) > 0 {
		return gpu.Errorf(op, gpu.ErrNotSupported, "graph %#x has device-updatable kernel nodes and cannot be a child graph", uint64(child.handle))
	}
	return nil
}

// DeviceUpdatesSupported reports that every simulated device can run
// device-side graph updates (as a compute 9.0 device under CUDA 13 can).
func (b *Backend) DeviceUpdatesSupported(dev int) error {
	const op = "DeviceUpdatesSupported"
	if err := b.enter(op); err != nil {
		return err
	}
	return b.checkDev(op, dev)
}

// GraphKernelNodeSetDeviceUpdatable implements gpu.DeviceUpdates.
func (b *Backend) GraphKernelNodeSetDeviceUpdatable(nh gpu.GraphNode, updatable bool) (gpu.DevNode, error) {
	const op = "GraphKernelNodeSetDeviceUpdatable"
	if err := b.enter(op); err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.nodeLocked(op, nh, gpu.NodeKernel)
	if err != nil {
		return 0, err
	}
	switch {
	case n.g.owner != nil:
		return 0, gpu.Errorf(op, gpu.ErrNotSupported, "node %#x belongs to the child graph of node %#x: only nodes of top-level graphs can be device-updatable", uint64(nh), uint64(n.g.owner.handle))
	case !updatable && n.devNode != 0:
		return 0, gpu.Errorf(op, gpu.ErrNotSupported, "node %#x is device-updatable and cannot opt out", uint64(nh))
	case !updatable || n.devNode != 0:
		return n.devNode, nil
	}
	n.devNode = gpu.DevNode(devNodeTag | b.newHandleLocked())
	b.mu.devNodes[n.devNode] = n
	n.g.devNodes = append(n.g.devNodes, n.devNode)
	return n.devNode, nil
}

// GraphKernelNodeDevNode implements gpu.DeviceUpdates.
func (b *Backend) GraphKernelNodeDevNode(nh gpu.GraphNode) (gpu.DevNode, error) {
	const op = "GraphKernelNodeDevNode"
	return readNode(b, op, nh, gpu.NodeKernel, func(n *node) gpu.DevNode { return n.devNode })
}

// GraphAddKernelNodeBefore implements gpu.DeviceUpdates. The node is
// inserted first in g's node list, so creation order stays a topological
// order; on CUDA it is listed last.
func (b *Backend) GraphAddKernelNodeBefore(gh gpu.Graph, p gpu.KernelParams, before []gpu.GraphNode) (gpu.GraphNode, error) {
	const op = "GraphAddKernelNodeBefore"
	return onGraph(b, op, gh, func(g *graph) (gpu.GraphNode, error) {
		k, err := b.kernelParamsLocked(op, p)
		if err != nil {
			return 0, err
		}
		if k.fn.dev != g.dev {
			return 0, gpu.Errorf(op, gpu.ErrInvalidValue, "kernel %s of device %d in a graph of device %d", k.fn.spec.Name, k.fn.dev, g.dev)
		}
		// The nodes to come after it: nodes of g, each once, as
		// dependencies are.
		after, err := b.depsLocked(op, g, before)
		if err != nil {
			return 0, err
		}
		first := &node{handle: gpu.GraphNode(b.newHandleLocked()), g: g, typ: gpu.NodeKernel}
		first.p.kern = k
		for _, n := range after {
			n.deps = append(slices.Clip(n.deps), first)
		}
		g.nodes = append([]*node{first}, g.nodes...)
		for i, n := range g.nodes {
			n.index = i
		}
		if g.registered {
			b.mu.nodes[first.handle] = first
		}
		return first.handle, nil
	})
}

// GraphUpload implements gpu.DeviceUpdates: when s reaches it, the device
// state of x's device-updatable nodes becomes the host-side parameters as
// they are now. For an exec without such nodes it does nothing. On a
// capturing stream it invalidates the capture.
func (b *Backend) GraphUpload(xh gpu.GraphExec, s gpu.Stream) error {
	const op = "GraphUpload"
	if err := b.enter(op); err != nil {
		return err
	}
	return b.submit(op, s, capInvalidate, func(st *stream) (cmd, error) {
		x, err := getLocked(b, op, "graph exec", b.mu.execs, xh)
		if err != nil {
			return cmd{}, err
		}
		if x.plan.dev != st.dev {
			return cmd{}, gpu.Errorf(op, gpu.ErrInvalidValue, "exec %#x of device %d uploaded on stream %#x of device %d", uint64(xh), x.plan.dev, uint64(s), st.dev)
		}
		x.mu.Lock()
		defer x.mu.Unlock()
		ds := x.dev
		if ds == nil {
			return cmd{kind: cmdFunc}, nil
		}
		snap := make(map[int]kernelParams, len(ds.slots))
		for i := range ds.slots {
			snap[i] = x.plan.nodes[i].p.kern // args are never modified once stored
		}
		ds.uploaded, ds.dirty = true, false
		return cmd{kind: cmdFunc, fn: func() {
			ds.mu.Lock()
			ds.cur = snap
			ds.mu.Unlock()
		}}, nil
	})
}

// launchCtx says which launch a kernel runs in: the device state of its
// exec (nil outside graphs and for execs without device-updatable nodes)
// and the top-level node it runs in.
type launchCtx struct {
	ds   *devState
	node int
}

// GraphKernelNodeSetParam is the device runtime call of kernels running on
// the sim (gpu.DeviceRuntime).
func (m memView) GraphKernelNodeSetParam(n gpu.DevNode, offset uint64, value []byte) error {
	return m.b.deviceSetParam(m.a, m.lc, n, offset, value)
}

func (b *Backend) deviceSetParam(a actor, lc launchCtx, n gpu.DevNode, off uint64, value []byte) error {
	const op = "cudaGraphKernelNodeSetParam"
	invalid := func(format string, args ...any) error {
		return gpu.Errorf(op, gpu.ErrInvalidValue, "kernel %s on device %d, node %#x: "+format, append([]any{a.kernel, a.dev, uint64(n)}, args...)...)
	}
	b.mu.RLock()
	nd := b.mu.devNodes[n]
	var (
		ds   *devState
		slot = -1
		dev  int
	)
	if nd != nil {
		dev = nd.g.dev
		if x := nd.g.devExec; x != nil {
			if path, ok := x.index[nd.handle]; ok && len(path) == 1 && x.dev.slots[int(path[0])] {
				ds, slot = x.dev, int(path[0])
			}
		}
	}
	b.mu.RUnlock()
	switch {
	case nd == nil:
		return invalid("no such device-updatable node")
	case dev != a.dev:
		return invalid("the node is on device %d", dev)
	case ds == nil:
		return invalid("no executable graph holds the node as device-updatable (instantiate its graph after opting it in)")
	}
	if lc.ds == ds && !ds.dependsOn(slot, lc.node) {
		err := gpu.Errorf(op, gpu.ErrIllegalState, "kernel %s in node %d of an exec changes node %d of the same launch, which does not depend on it: on a GPU that node may run before or during the change", a.kernel, lc.node, slot)
		b.stick(a.dev, err)
		return err
	}
	ds.mu.Lock()
	defer ds.mu.Unlock()
	k, ok := ds.cur[slot]
	if !ok {
		return invalid("its executable graph was not uploaded")
	}
	layout := k.fn.params
	var size uint64
	for _, p := range layout {
		size = max(size, p.Offset+p.Size)
	}
	if off > size || uint64(len(value)) > size-off {
		return invalid("%d bytes at offset %d are past the %d bytes of kernel %s's parameters", len(value), off, size, k.fn.spec.Name)
	}
	buf := make([]byte, size)
	for i, arg := range k.args {
		arg.Encode(buf[layout[i].Offset:])
	}
	copy(buf[off:], value)
	args := make([]gpu.Arg, len(k.args))
	for i, kind := range k.fn.spec.Params {
		raw := buf[layout[i].Offset : layout[i].Offset+layout[i].Size]
		if kind == gpu.ArgBytes {
			// A library kernel's opaque parameter (the sim's cuBLAS).
			args[i] = gpu.Arg{Kind: kind, Raw: bytes.Clone(raw)}
			continue
		}
		args[i] = gpu.Arg{Kind: kind, Bits: decodeBits(raw)}
	}
	k.args = args
	ds.cur[slot] = k
	return nil
}

// decodeBits reads a 4- or 8-byte little-endian value.
func decodeBits(raw []byte) uint64 {
	var v uint64
	for i := len(raw) - 1; i >= 0; i-- {
		v = v<<8 | uint64(raw[i])
	}
	return v
}
