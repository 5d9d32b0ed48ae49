package cuda

import (
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

// Device-updatable kernel nodes (gpu.DeviceUpdates) over CUDA 12.4's launch
// attribute, and the graph edits behind GraphAddKernelNodeBefore.
//
// The backend enforces the rules of gpu.DeviceUpdates itself, before the
// driver sees the call, with the errors the gpu package documents: the
// driver does not check some of them (a launch without an upload may lose
// the device-side updates silently), and its checks of the others are not
// documented precisely enough to rely on. The state it needs lives in its
// handle tables: the DevNode of each node opted in (nodeInfo.devNode), how
// many a graph has and how many execs (graphInfo), and for each exec with
// device-updatable nodes whether it was uploaded since the last host-side
// change of one of them (execInfo.upd).

var _ gpu.DeviceUpdates = (*Backend)(nil)

// minDeviceUpdatesDriver is the first driver with device-updatable kernel
// nodes: CUDA 12.4.
const minDeviceUpdatesDriver = 12040

// deviceUpdateSymbols are the entry points device updates need (one of each
// line).
var deviceUpdateSymbols = [][]string{
	{"cuGraphKernelNodeSetAttribute"}, {"cuGraphKernelNodeGetAttribute"}, {"cuGraphUpload"},
	{"cuGraphAddDependencies_v2", "cuGraphAddDependencies"}, {"cuGraphDestroyNode"},
}

// devExec is the device-update state of an exec with device-updatable
// nodes. Its flags are read on every launch, without the backend's lock.
type devExec struct {
	nodes    map[cu.GraphNode]bool // its device-updatable nodes; immutable
	uploaded atomic.Bool           // GraphUpload succeeded
	dirty    atomic.Bool           // a device-updatable node changed on the host since
}

// DeviceUpdatesSupported implements gpu.DeviceUpdates: it needs a CUDA 12.4
// driver exporting the entry points above.
func (b *Backend) DeviceUpdatesSupported(dev int) error {
	return b.deviceUpdatesSupported("DeviceUpdatesSupported", dev)
}

func (b *Backend) deviceUpdatesSupported(op string, dev int) error {
	d, err := b.device(op, dev)
	if err != nil {
		return err
	}
	if v := d.props.DriverVersion; v < minDeviceUpdatesDriver {
		return errf(op, gpu.ErrNotSupported, "device %d (%s): the driver is CUDA %d.%d; device-updatable kernel nodes need CUDA 12.4 or newer",
			dev, d.props.Name, v/1000, v%1000/10)
	}
	for _, alts := range deviceUpdateSymbols {
		ok := false
		for _, name := range alts {
			ok = ok || b.d.Has(name)
		}
		if !ok {
			return errf(op, gpu.ErrNotSupported, "%s does not export %s, which device-updatable kernel nodes need", b.d.Path, alts[0])
		}
	}
	return nil
}

// GraphKernelNodeSetDeviceUpdatable implements gpu.DeviceUpdates: it sets
// CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE on the node and reads the
// node's devNode back from the same attribute.
func (b *Backend) GraphKernelNodeSetDeviceUpdatable(n gpu.GraphNode, updatable bool) (gpu.DevNode, error) {
	const op = "GraphKernelNodeSetDeviceUpdatable"
	ni, dev, err := b.nodeDev(op, n)
	if err != nil {
		return 0, err
	}
	if err := b.wantType(op, dev, ni, gpu.NodeKernel); err != nil {
		return 0, err
	}
	b.mu.Lock()
	gi, cur := b.mu.graphs[ni.graph], ni.devNode
	b.mu.Unlock()
	switch {
	case gi == nil:
		return 0, errNoGraph(op, ni.graph)
	case !gi.owned:
		return 0, errf(op, gpu.ErrNotSupported, "node %#x belongs to a child graph: only nodes of top-level graphs can be device-updatable", uint64(n))
	case !updatable && cur != 0:
		return 0, errf(op, gpu.ErrNotSupported, "node %#x is device-updatable and cannot opt out", uint64(n))
	case !updatable || cur != 0:
		return gpu.DevNode(cur), nil
	}
	if err := b.deviceUpdatesSupported(op, dev); err != nil {
		return 0, err
	}
	var dn cu.GraphDeviceNode
	err = b.onDevice(dev, func() error {
		v := cu.LaunchAttributeValue{DeviceUpdatableKernelNode: cu.DeviceUpdatableKernelNode{DeviceUpdatable: 1}}
		if r := b.d.GraphKernelNodeSetAttribute(ni.n, cu.LaunchAttributeDeviceUpdatableKernelNode, &v); r != cu.Success {
			return b.check("cuGraphKernelNodeSetAttribute", r)
		}
		var out cu.LaunchAttributeValue
		if r := b.d.GraphKernelNodeGetAttribute(ni.n, cu.LaunchAttributeDeviceUpdatableKernelNode, &out); r != cu.Success {
			return b.check("cuGraphKernelNodeGetAttribute", r)
		}
		if out.DeviceUpdatableKernelNode.DeviceUpdatable != 1 || out.DeviceUpdatableKernelNode.DevNode == 0 {
			return errf(op, gpu.ErrNotSupported, "the driver took the attribute but reads back deviceUpdatable=%d devNode=%#x",
				out.DeviceUpdatableKernelNode.DeviceUpdatable, uintptr(out.DeviceUpdatableKernelNode.DevNode))
		}
		dn = out.DeviceUpdatableKernelNode.DevNode
		return nil
	})
	if err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if ni.devNode == 0 {
		ni.devNode = dn
		gi.devNodes++
	}
	return gpu.DevNode(ni.devNode), nil
}

// GraphKernelNodeDevNode implements gpu.DeviceUpdates: the devNode read
// back from the driver, 0 for a node not opted in (without asking).
func (b *Backend) GraphKernelNodeDevNode(n gpu.GraphNode) (gpu.DevNode, error) {
	const op = "GraphKernelNodeDevNode"
	ni, dev, err := b.nodeDev(op, n)
	if err != nil {
		return 0, err
	}
	if err := b.wantType(op, dev, ni, gpu.NodeKernel); err != nil {
		return 0, err
	}
	b.mu.Lock()
	cur := ni.devNode
	b.mu.Unlock()
	if cur == 0 {
		return 0, nil
	}
	var out cu.LaunchAttributeValue
	err = b.call(dev, "cuGraphKernelNodeGetAttribute", func() cu.Result {
		return b.d.GraphKernelNodeGetAttribute(ni.n, cu.LaunchAttributeDeviceUpdatableKernelNode, &out)
	})
	if err != nil {
		return 0, err
	}
	if got := out.DeviceUpdatableKernelNode.DevNode; got != cur {
		return 0, errf(op, gpu.ErrIllegalState, "the driver reads back devNode %#x for node %#x, opted in as %#x", uintptr(got), uint64(n), uintptr(cur))
	}
	return gpu.DevNode(cur), nil
}

// GraphAddKernelNodeBefore implements gpu.DeviceUpdates: the node is added
// without dependencies, then an edge from it to each node of before
// (cuGraphAddDependencies); if that fails the node is removed again. The
// driver lists the new node after the others.
func (b *Backend) GraphAddKernelNodeBefore(g gpu.Graph, p gpu.KernelParams, before []gpu.GraphNode) (gpu.GraphNode, error) {
	const op = "GraphAddKernelNodeBefore"
	fr := getFrame()
	defer fr.release()
	b.mu.Lock()
	gi, ok := b.mu.graphs[g]
	fi := b.mu.funcs[p.Func]
	var toErr error
	if ok {
		// The nodes to come after it, looked up as dependencies are.
		toErr = b.depsLocked(op, g, before, fr)
	}
	b.mu.Unlock()
	if !ok {
		return 0, errNoGraph(op, g)
	}
	if err := b.kernelParams(op, gi.dev, fi, p, fr); err != nil {
		return 0, err
	}
	if toErr != nil {
		return 0, toErr
	}
	to := slices.Clone(fr.deps)
	for i, n := range to {
		if slices.Contains(to[:i], n) {
			return 0, errf(op, gpu.ErrInvalidValue, "node %#x is listed twice", uint64(before[i]))
		}
	}
	err := b.onDevice(gi.dev, func() error {
		if r := b.d.GraphAddKernelNode(&fr.node, gi.g, nil, &fr.kp); r != cu.Success {
			return b.check("cuGraphAddKernelNode_v2", r)
		}
		if len(to) == 0 {
			return nil
		}
		from := make([]cu.GraphNode, len(to))
		for i := range from {
			from[i] = fr.node
		}
		if r := b.d.GraphAddDependencies(gi.g, from, to); r != cu.Success {
			err := b.check("cuGraphAddDependencies_v2", r)
			if r := b.d.GraphDestroyNode(fr.node); r != cu.Success {
				return fmt.Errorf("%w; and removing the new node failed: %w", err, b.check("cuGraphDestroyNode", r))
			}
			return err
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return b.newNode(g, fr.node, argKinds(fi, p.Args), gpu.NodeKernel), nil
}

// GraphUpload implements gpu.DeviceUpdates.
func (b *Backend) GraphUpload(x gpu.GraphExec, s gpu.Stream) error {
	const op = "GraphUpload"
	xi, si, err := b.execOnStream(op, x, s, "uploaded")
	if err != nil {
		return err
	}
	if err := b.call(xi.dev, "cuGraphUpload", func() cu.Result { return b.d.GraphUpload(xi.x, si.s) }); err != nil {
		return err
	}
	if xi.upd != nil {
		xi.upd.uploaded.Store(true)
		xi.upd.dirty.Store(false)
	}
	return nil
}

// ---- the rules, checked by the Graphs entry points (graphs.go) ----

// instantiateCheckLocked refuses a second exec of a graph with
// device-updatable nodes.
func instantiateCheckLocked(op string, g gpu.Graph, gi *graphInfo) error {
	if gi.devNodes > 0 && gi.execs > 0 {
		return errf(op, gpu.ErrNotSupported, "graph %#x has device-updatable kernel nodes and %d executable graph(s) already: it may have one at a time (destroy it first)", uint64(g), gi.execs)
	}
	return nil
}

// devExecLocked is the device-update state of a new exec of gi, nil when
// gi has no device-updatable node.
func (b *Backend) devExecLocked(gi *graphInfo) *devExec {
	if gi.devNodes == 0 {
		return nil
	}
	de := &devExec{nodes: map[cu.GraphNode]bool{}}
	for n := range gi.nodes {
		if ni := b.mu.nodes[n]; ni != nil && ni.devNode != 0 {
			de.nodes[ni.n] = true
		}
	}
	return de
}

// launchCheck refuses launches of an exec with device-updatable nodes that
// was not uploaded since its last host-side change, and their capture.
func (b *Backend) launchCheck(op string, x gpu.GraphExec, xi execInfo, si streamInfo) error {
	switch {
	case !xi.upd.uploaded.Load():
		return errf(op, gpu.ErrIllegalState, "exec %#x has device-updatable kernel nodes: upload it (GraphUpload) before its first launch", uint64(x))
	case xi.upd.dirty.Load():
		return errf(op, gpu.ErrIllegalState, "exec %#x: a device-updatable kernel node changed on the host since the last upload: upload it again (GraphUpload) before launching", uint64(x))
	}
	if b.captures.Load() > 0 { // no stream of this backend captures otherwise
		capt, err := b.capturing(si.dev, si.s)
		if err != nil {
			return err
		}
		if capt {
			return errf(op, gpu.ErrNotSupported, "exec %#x has device-updatable kernel nodes: its launch cannot be captured into another graph", uint64(x))
		}
	}
	return nil
}

// updateCheck refuses whole-graph updates involving device-updatable nodes.
func (b *Backend) updateCheck(x gpu.GraphExec, xi execInfo, g gpu.Graph) error {
	b.mu.Lock()
	gi := b.mu.graphs[g]
	b.mu.Unlock()
	switch {
	case xi.upd != nil:
		return &gpu.UpdateError{Op: "GraphExecUpdate", Result: gpu.UpdateNotSupported,
			Detail: fmt.Sprintf("exec %#x has device-updatable kernel nodes, which whole-graph updates do not allow", uint64(x))}
	case gi != nil && gi.devNodes > 0:
		return &gpu.UpdateError{Op: "GraphExecUpdate", Result: gpu.UpdateNotSupported,
			Detail: fmt.Sprintf("graph %#x has device-updatable kernel nodes, which whole-graph updates do not allow", uint64(g))}
	}
	return nil
}

// childCheck refuses a graph with device-updatable nodes as a child graph.
func childCheck(op string, child gpu.Graph, ci *graphInfo) error {
	if ci.devNodes > 0 {
		return errf(op, gpu.ErrNotSupported, "graph %#x has device-updatable kernel nodes and cannot be a child graph", uint64(child))
	}
	return nil
}
