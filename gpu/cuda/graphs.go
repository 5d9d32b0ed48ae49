package cuda

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

// graphInfo is a graph the backend knows: one it created (GraphCreate,
// StreamEndCapture: owned, counted, destroyed by the caller) or one embedded
// in a child-graph node (a view: owned by the node, not counted).
type graphInfo struct {
	dev   int
	g     cu.Graph
	owned bool
	nodes map[gpu.GraphNode]struct{}
	views []gpu.Graph // child graphs of this graph's nodes handed out

	devNodes int // nodes opted in to device-side updates (devupdate.go)
	execs    int // live execs instantiated from it
}

// nodeInfo is a graph node the backend knows: made by a GraphAdd call or
// discovered by GraphNodes/GraphNodeDeps.
type nodeInfo struct {
	graph gpu.Graph
	n     cu.GraphNode
	kinds []gpu.ArgKind // the argument kinds of kernel nodes made from typed args
	typ   gpu.NodeType  // cached (a node's type never changes); 0 until known

	devNode cu.GraphDeviceNode // once opted in to device-side updates (devupdate.go)
}

func (b *Backend) graphInfo(op string, g gpu.Graph) (*graphInfo, error) {
	b.mu.Lock()
	gi, ok := b.mu.graphs[g]
	b.mu.Unlock()
	if !ok {
		return nil, errNoGraph(op, g)
	}
	return gi, nil
}

func errNoGraph(op string, g gpu.Graph) error {
	return errf(op, gpu.ErrInvalidHandle, "graph %#x is not live", uint64(g))
}

// nodeDev returns a known node's info and device.
func (b *Backend) nodeDev(op string, n gpu.GraphNode) (*nodeInfo, int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ni, ok := b.mu.nodes[n]
	if !ok {
		return nil, 0, errf(op, gpu.ErrInvalidHandle, "graph node %#x is not known (graph destroyed?)", uint64(n))
	}
	return ni, b.mu.graphs[ni.graph].dev, nil
}

// nodeHandleLocked returns the handle of driver node n of graph g, issuing
// one the first time n is seen.
func (b *Backend) nodeHandleLocked(g gpu.Graph, n cu.GraphNode, kinds []gpu.ArgKind) gpu.GraphNode {
	if h, ok := b.mu.nodeByCU[n]; ok {
		if ni := b.mu.nodes[h]; kinds != nil {
			ni.kinds = kinds
		}
		return h
	}
	h := gpu.GraphNode(b.newIDLocked())
	b.mu.nodes[h] = &nodeInfo{graph: g, n: n, kinds: kinds}
	b.mu.nodeByCU[n] = h
	if gi := b.mu.graphs[g]; gi != nil {
		gi.nodes[h] = struct{}{}
	}
	return h
}

// forgetGraphLocked removes g, its nodes and its views from the tables.
func (b *Backend) forgetGraphLocked(g gpu.Graph) {
	gi := b.mu.graphs[g]
	if gi == nil {
		return
	}
	delete(b.mu.graphs, g)
	delete(b.mu.graphByCU, gi.g)
	for n := range gi.nodes {
		if ni := b.mu.nodes[n]; ni != nil {
			delete(b.mu.nodeByCU, ni.n)
		}
		delete(b.mu.nodes, n)
	}
	for _, v := range gi.views {
		b.forgetGraphLocked(v)
	}
}

// GraphCreate implements gpu.Graphs.
func (b *Backend) GraphCreate(dev int) (gpu.Graph, error) {
	if _, err := b.device("GraphCreate", dev); err != nil {
		return 0, err
	}
	var g cu.Graph
	if err := b.call(dev, "cuGraphCreate", func() cu.Result { return b.d.GraphCreate(&g, 0) }); err != nil {
		return 0, err
	}
	return b.registerGraph(g, dev, true), nil
}

// registerGraph issues a handle for driver graph g (owned: made by the
// caller; else a child graph owned by a node).
func (b *Backend) registerGraph(g cu.Graph, dev int, owned bool) gpu.Graph {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.registerGraphLocked(g, dev, owned)
}

func (b *Backend) registerGraphLocked(g cu.Graph, dev int, owned bool) gpu.Graph {
	if h, ok := b.mu.graphByCU[g]; ok {
		return h
	}
	h := gpu.Graph(b.newIDLocked())
	b.mu.graphs[h] = &graphInfo{dev: dev, g: g, owned: owned, nodes: map[gpu.GraphNode]struct{}{}}
	b.mu.graphByCU[g] = h
	return h
}

// GraphDestroy implements gpu.Graphs. Child graphs handed out for its nodes
// become invalid with it; execs made from it stay valid.
func (b *Backend) GraphDestroy(g gpu.Graph) error {
	b.mu.Lock()
	gi, ok := b.mu.graphs[g]
	if ok && !gi.owned {
		b.mu.Unlock()
		return errf("GraphDestroy", gpu.ErrInvalidHandle, "graph %#x belongs to a child-graph node; destroy its parent", uint64(g))
	}
	if ok {
		delete(b.mu.graphs, g) // claimed
	}
	b.mu.Unlock()
	if !ok {
		return errf("GraphDestroy", gpu.ErrInvalidHandle, "graph %#x is not live", uint64(g))
	}
	err := b.call(gi.dev, "cuGraphDestroy", func() cu.Result { return b.d.GraphDestroy(gi.g) })
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mu.graphs[g] = gi
	if err == nil {
		b.forgetGraphLocked(g)
	}
	return err
}

// depsLocked checks that deps are nodes of g and converts them into
// fr.deps.
func (b *Backend) depsLocked(op string, g gpu.Graph, deps []gpu.GraphNode, fr *frame) error {
	if len(deps) <= frameDeps {
		fr.deps = fr.depBuf[:len(deps)]
	} else {
		fr.deps = make([]cu.GraphNode, len(deps))
	}
	for i, d := range deps {
		ni, ok := b.mu.nodes[d]
		if !ok {
			return errf(op, gpu.ErrInvalidHandle, "dependency %#x is not a known node", uint64(d))
		}
		if ni.graph != g {
			return errf(op, gpu.ErrInvalidValue, "dependency %#x belongs to graph %#x, not %#x", uint64(d), uint64(ni.graph), uint64(g))
		}
		fr.deps[i] = ni.n
	}
	return nil
}

// addNode is the common path of the GraphAdd calls: g and deps are looked
// up (deps into fr.deps), add makes the driver call cop with them (the new
// node into fr.node), and the node gets its handle.
func (b *Backend) addNode(op string, typ gpu.NodeType, g gpu.Graph, deps []gpu.GraphNode, fr *frame,
	cop string, add func(gi *graphInfo) cu.Result) (gpu.GraphNode, error) {
	b.mu.Lock()
	gi, ok := b.mu.graphs[g]
	var err error
	if ok {
		err = b.depsLocked(op, g, deps, fr)
	}
	b.mu.Unlock()
	if !ok {
		return 0, errNoGraph(op, g)
	}
	if err != nil {
		return 0, err
	}
	if err := b.callFrame(fr, gi.dev, cop, func() cu.Result { return add(gi) }); err != nil {
		return 0, err
	}
	return b.newNode(g, fr.node, nil, typ), nil
}

// newNode issues the handle of node n just added to g.
func (b *Backend) newNode(g gpu.Graph, n cu.GraphNode, kinds []gpu.ArgKind, typ gpu.NodeType) gpu.GraphNode {
	b.mu.Lock()
	defer b.mu.Unlock()
	h := b.nodeHandleLocked(g, n, kinds)
	b.mu.nodes[h].typ = typ
	return h
}

// kernelParams checks p (fi is p.Func's info, nil when unknown) for a
// kernel node on dev and writes the C node parameters into fr.kp.
func (b *Backend) kernelParams(op string, dev int, fi *funcInfo, p gpu.KernelParams, fr *frame) error {
	if fi == nil {
		return errNoFunc(op, p.Func)
	}
	if fi.dev != dev {
		return errf(op, gpu.ErrInvalidValue, "kernel of device %d in a graph of device %d", fi.dev, dev)
	}
	if err := b.checkArgs(op, fi, p.Func, p.Args); err != nil {
		return err
	}
	c := p.Config
	fr.kp = cu.KernelNodeParams{
		Func: fi.f, GridDimX: c.Grid.X, GridDimY: c.Grid.Y, GridDimZ: c.Grid.Z,
		BlockDimX: c.Block.X, BlockDimY: c.Block.Y, BlockDimZ: c.Block.Z, SharedMemBytes: c.SharedMem,
		KernelParams: unsafe.Pointer(fr.pack(p.Args)),
	}
	return nil
}

// argKinds are the kinds a kernel node made from args (checked against fi)
// remembers, so that reading its parameters back gives typed arguments:
// nil unless every argument is typed.
func argKinds(fi *funcInfo, args []gpu.Arg) []gpu.ArgKind {
	if len(args) == 0 {
		return nil
	}
	for _, a := range args {
		if a.Kind == gpu.ArgBytes {
			return nil
		}
	}
	if fi.spec != nil {
		return fi.spec.Params // equal to the kinds of args: checkArgs checked them
	}
	kinds := make([]gpu.ArgKind, len(args))
	for i, a := range args {
		kinds[i] = a.Kind
	}
	return kinds
}

// GraphAddKernelNode implements gpu.Graphs.
func (b *Backend) GraphAddKernelNode(g gpu.Graph, deps []gpu.GraphNode, p gpu.KernelParams) (gpu.GraphNode, error) {
	const op = "GraphAddKernelNode"
	fr := getFrame()
	defer fr.release()
	b.mu.Lock()
	gi, ok := b.mu.graphs[g]
	fi := b.mu.funcs[p.Func]
	var depErr error
	if ok {
		depErr = b.depsLocked(op, g, deps, fr)
	}
	b.mu.Unlock()
	if !ok {
		return 0, errNoGraph(op, g)
	}
	if err := b.kernelParams(op, gi.dev, fi, p, fr); err != nil {
		return 0, err
	}
	if depErr != nil {
		return 0, depErr
	}
	err := b.callFrame(fr, gi.dev, "cuGraphAddKernelNode_v2", func() cu.Result {
		return b.d.GraphAddKernelNode(&fr.node, gi.g, fr.deps, &fr.kp)
	})
	if err != nil {
		return 0, err
	}
	return b.newNode(g, fr.node, argKinds(fi, p.Args), gpu.NodeKernel), nil
}

func memcpyParams(p gpu.MemcpyParams) cu.Memcpy3D {
	return cu.Memcpy3D{
		SrcMemoryType: cu.MemoryTypeDevice, SrcDevice: cu.DevicePtr(p.Src),
		DstMemoryType: cu.MemoryTypeDevice, DstDevice: cu.DevicePtr(p.Dst),
		WidthInBytes: p.Size, Height: 1, Depth: 1,
	}
}

func memsetParams(op string, m gpu.Memset) (cu.MemsetNodeParams, error) {
	if err := checkMemset(op, m); err != nil {
		return cu.MemsetNodeParams{}, err
	}
	if m.Count == 0 {
		return cu.MemsetNodeParams{}, errf(op, gpu.ErrInvalidValue, "memset node of 0 elements")
	}
	return cu.MemsetNodeParams{Dst: cu.DevicePtr(m.Dst), Value: m.Value, ElementSize: uint32(m.ElemSize), Width: m.Count, Height: 1}, nil
}

// GraphAddMemcpyNode implements gpu.Graphs (device-to-device copies).
func (b *Backend) GraphAddMemcpyNode(g gpu.Graph, deps []gpu.GraphNode, p gpu.MemcpyParams) (gpu.GraphNode, error) {
	const op = "GraphAddMemcpyNode"
	if p.Size == 0 {
		return 0, errf(op, gpu.ErrInvalidValue, "memcpy node of 0 bytes")
	}
	fr := getFrame()
	defer fr.release()
	fr.cp = memcpyParams(p)
	return b.addNode(op, gpu.NodeMemcpy, g, deps, fr, "cuGraphAddMemcpyNode", func(gi *graphInfo) cu.Result {
		return b.d.GraphAddMemcpyNode(&fr.node, gi.g, fr.deps, &fr.cp, b.devs[gi.dev].ctx)
	})
}

// GraphAddMemsetNode implements gpu.Graphs.
func (b *Backend) GraphAddMemsetNode(g gpu.Graph, deps []gpu.GraphNode, m gpu.Memset) (gpu.GraphNode, error) {
	const op = "GraphAddMemsetNode"
	mp, err := memsetParams(op, m)
	if err != nil {
		return 0, err
	}
	fr := getFrame()
	defer fr.release()
	fr.mp = mp
	return b.addNode(op, gpu.NodeMemset, g, deps, fr, "cuGraphAddMemsetNode", func(gi *graphInfo) cu.Result {
		return b.d.GraphAddMemsetNode(&fr.node, gi.g, fr.deps, &fr.mp, b.devs[gi.dev].ctx)
	})
}

// GraphAddChildGraphNode implements gpu.Graphs: the driver embeds a copy of
// child.
func (b *Backend) GraphAddChildGraphNode(g gpu.Graph, deps []gpu.GraphNode, child gpu.Graph) (gpu.GraphNode, error) {
	const op = "GraphAddChildGraphNode"
	ci, err := b.graphInfo(op, child)
	if err != nil {
		return 0, err
	}
	if err := childCheck(op, child, ci); err != nil {
		return 0, err
	}
	if child == g {
		return 0, errf(op, gpu.ErrInvalidValue, "graph %#x cannot contain itself", uint64(g))
	}
	fr := getFrame()
	defer fr.release()
	return b.addNode(op, gpu.NodeChildGraph, g, deps, fr, "cuGraphAddChildGraphNode", func(gi *graphInfo) cu.Result {
		return b.d.GraphAddChildGraphNode(&fr.node, gi.g, fr.deps, ci.g)
	})
}

// GraphAddEmptyNode implements gpu.Graphs.
func (b *Backend) GraphAddEmptyNode(g gpu.Graph, deps []gpu.GraphNode) (gpu.GraphNode, error) {
	fr := getFrame()
	defer fr.release()
	return b.addNode("GraphAddEmptyNode", gpu.NodeEmpty, g, deps, fr, "cuGraphAddEmptyNode", func(gi *graphInfo) cu.Result {
		return b.d.GraphAddEmptyNode(&fr.node, gi.g, fr.deps)
	})
}

// GraphNodes implements gpu.Graphs, in the driver's order (creation order).
func (b *Backend) GraphNodes(g gpu.Graph) ([]gpu.GraphNode, error) {
	gi, err := b.graphInfo("GraphNodes", g)
	if err != nil {
		return nil, err
	}
	var nodes []cu.GraphNode
	err = b.onDevice(gi.dev, func() error {
		var count uint64
		if r := b.d.GraphGetNodes(gi.g, nil, &count); r != cu.Success {
			return b.check("cuGraphGetNodes", r)
		}
		nodes = make([]cu.GraphNode, count)
		if count == 0 {
			return nil
		}
		if r := b.d.GraphGetNodes(gi.g, nodes, &count); r != cu.Success {
			return b.check("cuGraphGetNodes", r)
		}
		nodes = nodes[:count]
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]gpu.GraphNode, len(nodes))
	b.mu.Lock()
	for i, n := range nodes {
		out[i] = b.nodeHandleLocked(g, n, nil)
	}
	b.mu.Unlock()
	return out, nil
}

// GraphNodeType implements gpu.Graphs.
func (b *Backend) GraphNodeType(n gpu.GraphNode) (gpu.NodeType, error) {
	ni, dev, err := b.nodeDev("GraphNodeType", n)
	if err != nil {
		return 0, err
	}
	return b.typeOf(dev, ni)
}

// typeOf is ni's type, asked of the driver once.
func (b *Backend) typeOf(dev int, ni *nodeInfo) (gpu.NodeType, error) {
	b.mu.Lock()
	t := ni.typ
	b.mu.Unlock()
	if t != 0 {
		return t, nil
	}
	t, err := b.nodeType(dev, ni.n)
	if err != nil {
		return 0, err
	}
	b.mu.Lock()
	ni.typ = t
	b.mu.Unlock()
	return t, nil
}

// wantType checks that n (a known node on dev) has type want, so that a
// call for another type of node never reaches the driver.
func (b *Backend) wantType(op string, dev int, ni *nodeInfo, want gpu.NodeType) error {
	t, err := b.typeOf(dev, ni)
	if err != nil {
		return err
	}
	if t != want {
		return errWrongType(op, t, want)
	}
	return nil
}

func errWrongType(op string, t, want gpu.NodeType) error {
	return errf(op, gpu.ErrInvalidValue, "the node is a %v node, not %v", t, want)
}

func (b *Backend) nodeType(dev int, n cu.GraphNode) (gpu.NodeType, error) {
	var t cu.GraphNodeType
	if err := b.call(dev, "cuGraphNodeGetType", func() cu.Result { return b.d.GraphNodeGetType(n, &t) }); err != nil {
		return 0, err
	}
	return nodeTypeOf(t), nil
}

// nodeTypeOf maps a driver node type to the gpu one.
func nodeTypeOf(t cu.GraphNodeType) gpu.NodeType {
	switch t {
	case cu.GraphNodeKernel:
		return gpu.NodeKernel
	case cu.GraphNodeMemcpy:
		return gpu.NodeMemcpy
	case cu.GraphNodeMemset:
		return gpu.NodeMemset
	case cu.GraphNodeGraph:
		return gpu.NodeChildGraph
	case cu.GraphNodeEmpty:
		return gpu.NodeEmpty
	case cu.GraphNodeBatchMemOp:
		return gpu.NodeMemWriteValue
	case cu.GraphNodeMemAlloc:
		return gpu.NodeMemAlloc
	case cu.GraphNodeMemFree:
		return gpu.NodeMemFree
	}
	return gpu.NodeOther
}

// GraphNodeDeps implements gpu.Graphs.
func (b *Backend) GraphNodeDeps(n gpu.GraphNode) ([]gpu.GraphNode, error) {
	ni, dev, err := b.nodeDev("GraphNodeDeps", n)
	if err != nil {
		return nil, err
	}
	var deps []cu.GraphNode
	err = b.onDevice(dev, func() error {
		var count uint64
		if r := b.d.GraphNodeGetDependencies(ni.n, nil, &count); r != cu.Success {
			return b.check("cuGraphNodeGetDependencies_v2", r)
		}
		deps = make([]cu.GraphNode, count)
		if count == 0 {
			return nil
		}
		if r := b.d.GraphNodeGetDependencies(ni.n, deps, &count); r != cu.Success {
			return b.check("cuGraphNodeGetDependencies_v2", r)
		}
		deps = deps[:count]
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]gpu.GraphNode, len(deps))
	b.mu.Lock()
	for i, d := range deps {
		out[i] = b.nodeHandleLocked(ni.graph, d, nil)
	}
	b.mu.Unlock()
	return out, nil
}

// Launch parameter markers of the extra array (CU_LAUNCH_PARAM_*).
const (
	launchParamEnd           = 0x00
	launchParamBufferPointer = 0x01
	launchParamBufferSize    = 0x02
)

// GraphKernelNodeParams implements gpu.Graphs. Arguments are typed for nodes
// made from typed arguments and for captured launches of our own kernels
// (their spec says the kinds); for library kernels they are ArgBytes, one
// per parameter of the driver's layout (FuncParamInfo).
func (b *Backend) GraphKernelNodeParams(n gpu.GraphNode) (gpu.KernelParams, error) {
	const op = "GraphKernelNodeParams"
	ni, dev, err := b.nodeDev(op, n)
	if err != nil {
		return gpu.KernelParams{}, err
	}
	if err := b.wantType(op, dev, ni, gpu.NodeKernel); err != nil {
		return gpu.KernelParams{}, err
	}
	var kp cu.KernelNodeParams
	var kern cu.Kernel
	err = b.onDevice(dev, func() error {
		if r := b.d.GraphKernelNodeGetParams(ni.n, &kp); r != cu.Success {
			return b.check("cuGraphKernelNodeGetParams_v2", r)
		}
		if kp.Func == 0 && kp.Kern != 0 {
			kern = kp.Kern
			// A context-independent kernel (cuLibrary, the runtime's
			// launches): its function in this context.
			return b.check("cuKernelGetFunction", b.d.KernelGetFunction(&kp.Func, kp.Kern))
		}
		return nil
	})
	if err != nil {
		return gpu.KernelParams{}, err
	}
	b.mu.Lock()
	f := b.funcHandleLocked(kp.Func, &funcInfo{dev: dev, f: kp.Func, kern: kern})
	fi := b.mu.funcs[f]
	if fi.kern == 0 {
		fi.kern = kern
	}
	kinds := ni.kinds
	if kinds == nil && fi.spec != nil {
		kinds = fi.spec.Params
	}
	b.mu.Unlock()
	if kinds == nil { // a library's kernel: it may carry launch attributes
		if err := b.launchAttrs(op, dev, ni.n); err != nil {
			return gpu.KernelParams{}, err
		}
	}
	out := gpu.KernelParams{Func: f, Config: gpu.LaunchConfig{
		Grid:      gpu.Dim3{X: kp.GridDimX, Y: kp.GridDimY, Z: kp.GridDimZ},
		Block:     gpu.Dim3{X: kp.BlockDimX, Y: kp.BlockDimY, Z: kp.BlockDimZ},
		SharedMem: kp.SharedMemBytes,
	}}
	var layout []gpu.ParamInfo
	if kinds == nil || kp.KernelParams == nil {
		if layout, err = b.paramInfo(fi, f); err != nil {
			return gpu.KernelParams{}, err
		}
	}
	switch {
	case kp.KernelParams != nil:
		out.Args = decodeArgs(kp.KernelParams, kinds, layout)
	case kp.Extra != nil:
		buf, ok := extraBuffer(kp.Extra)
		if !ok {
			return gpu.KernelParams{}, errf(op, gpu.ErrNotSupported, "kernel node %#x passes its parameters in an extra array without a buffer", uint64(n))
		}
		var total uint64
		for _, p := range layout {
			total = max(total, p.Offset+p.Size)
		}
		if uint64(len(buf)) < total {
			return gpu.KernelParams{}, errf(op, gpu.ErrNotSupported, "kernel node %#x parameter buffer has %d bytes, layout needs %d", uint64(n), len(buf), total)
		}
		out.Args = decodeBuffer(buf, kinds, layout)
	default:
		out.Args = []gpu.Arg{}
	}
	return out, nil
}

// extraBuffer finds the parameter buffer in a launch's extra array
// ({BUFFER_POINTER, p, BUFFER_SIZE, &size, END}).
func extraBuffer(extra unsafe.Pointer) ([]byte, bool) {
	var buf unsafe.Pointer
	var size uint64
	haveSize := false
	for i := 0; i < 16; i += 2 {
		key := *(*uintptr)(unsafe.Add(extra, i*8))
		if key == launchParamEnd {
			break
		}
		val := *(*unsafe.Pointer)(unsafe.Add(extra, (i+1)*8))
		switch key {
		case launchParamBufferPointer:
			buf = val
		case launchParamBufferSize:
			if val != nil {
				size = binary.LittleEndian.Uint64(unsafe.Slice((*byte)(val), 8))
				haveSize = true
			}
		}
	}
	if buf == nil || !haveSize {
		return nil, false
	}
	return unsafe.Slice((*byte)(buf), size), true
}

// GraphChildGraph implements gpu.Graphs. The graph belongs to the node: it is
// valid until the parent graph is destroyed and must not be destroyed itself.
func (b *Backend) GraphChildGraph(n gpu.GraphNode) (gpu.Graph, error) {
	ni, dev, err := b.nodeDev("GraphChildGraph", n)
	if err != nil {
		return 0, err
	}
	if err := b.wantType("GraphChildGraph", dev, ni, gpu.NodeChildGraph); err != nil {
		return 0, err
	}
	var g cu.Graph
	if err := b.call(dev, "cuGraphChildGraphNodeGetGraph", func() cu.Result { return b.d.GraphChildGraphNodeGetGraph(ni.n, &g) }); err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if h, ok := b.mu.graphByCU[g]; ok {
		return h, nil
	}
	h := b.registerGraphLocked(g, dev, false)
	if parent := b.mu.graphs[ni.graph]; parent != nil {
		parent.views = append(parent.views, h)
	}
	return h, nil
}

// StreamBeginCapture implements gpu.Graphs, in relaxed capture mode (see
// the package doc).
func (b *Backend) StreamBeginCapture(s gpu.Stream) error {
	dev, cs, err := b.stream("StreamBeginCapture", s)
	if err != nil {
		return err
	}
	if capt, err := b.capturing(dev, cs); err != nil || capt {
		if err == nil {
			err = errf("StreamBeginCapture", gpu.ErrIllegalState, "stream %#x is already capturing", uint64(s))
		}
		return err
	}
	err = b.call(dev, "cuStreamBeginCapture_v2", func() cu.Result {
		return b.d.StreamBeginCapture(cs, cu.StreamCaptureModeRelaxed)
	})
	if err == nil {
		b.captures.Add(1)
	}
	return err
}

// StreamEndCapture implements gpu.Graphs. An invalidated capture is
// ErrCaptureInvalidated; the stream has left capture mode either way.
func (b *Backend) StreamEndCapture(s gpu.Stream) (gpu.Graph, error) {
	dev, cs, err := b.stream("StreamEndCapture", s)
	if err != nil {
		return 0, err
	}
	if capt, err := b.capturing(dev, cs); err != nil || !capt {
		if err == nil {
			err = errf("StreamEndCapture", gpu.ErrIllegalState, "stream %#x is not capturing", uint64(s))
		}
		return 0, err
	}
	var g cu.Graph
	var r cu.Result
	err = b.onDevice(dev, func() error { r = b.d.StreamEndCapture(cs, &g); return nil })
	if err != nil {
		return 0, err
	}
	b.captures.Add(-1) // the stream has left capture mode, whatever r says
	if r != cu.Success {
		if g != 0 { // not expected, but never leak a graph
			_ = b.call(dev, "cuGraphDestroy", func() cu.Result { return b.d.GraphDestroy(g) })
		}
		return 0, b.check("cuStreamEndCapture", r)
	}
	return b.registerGraph(g, dev, true), nil
}

// StreamIsCapturing implements gpu.Graphs. A capture that was invalidated
// but not yet ended still counts as capturing.
func (b *Backend) StreamIsCapturing(s gpu.Stream) (bool, error) {
	dev, cs, err := b.stream("StreamIsCapturing", s)
	if err != nil {
		return false, err
	}
	// Only this backend holds its streams' CUstreams, so only it can begin
	// a capture on one: while none it began is in progress, the answer is
	// no, without a driver call (an executable asks before every step).
	if b.captures.Load() == 0 {
		return false, nil
	}
	return b.capturing(dev, cs)
}

// GraphInstantiate implements gpu.Graphs.
func (b *Backend) GraphInstantiate(g gpu.Graph) (gpu.GraphExec, error) {
	gi, err := b.graphInfo("GraphInstantiate", g)
	if err != nil {
		return 0, err
	}
	b.mu.Lock()
	err = instantiateCheckLocked("GraphInstantiate", g, gi)
	b.mu.Unlock()
	if err != nil {
		return 0, err
	}
	var x cu.GraphExec
	if err := b.call(gi.dev, "cuGraphInstantiateWithFlags", func() cu.Result { return b.d.GraphInstantiate(&x, gi.g, 0) }); err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	h := gpu.GraphExec(b.newIDLocked())
	b.mu.execs[h] = execInfo{dev: gi.dev, graph: g, x: x, upd: b.devExecLocked(gi)}
	gi.execs++
	return h, nil
}

// execInfo is a live exec: its device and the graph it was made from (which
// may since have been destroyed).
type execInfo struct {
	dev   int
	graph gpu.Graph
	x     cu.GraphExec
	upd   *devExec // device-updatable nodes (devupdate.go); nil when none
}

func (b *Backend) exec(op string, x gpu.GraphExec) (execInfo, error) {
	b.mu.Lock()
	xi, ok := b.mu.execs[x]
	b.mu.Unlock()
	if !ok {
		return execInfo{}, errNoExec(op, x)
	}
	return xi, nil
}

func errNoExec(op string, x gpu.GraphExec) error {
	return errf(op, gpu.ErrInvalidHandle, "graph exec %#x is not live", uint64(x))
}

// execNode checks a per-node exec update: x live, n a live node of the
// graph x was made from, of type want. (Once that graph is destroyed its
// nodes are gone, and so are per-node updates of x.) When f is not 0 it
// also returns f's info (nil when f is not known), looked up under the same
// lock.
func (b *Backend) execNode(op string, x gpu.GraphExec, n gpu.GraphNode, want gpu.NodeType, f gpu.Function) (execInfo, cu.GraphNode, *funcInfo, error) {
	var (
		typ gpu.NodeType
		fi  *funcInfo
	)
	b.mu.Lock()
	xi, ok := b.mu.execs[x]
	ni, known := b.mu.nodes[n]
	if known {
		typ = ni.typ
	}
	if f != 0 {
		fi = b.mu.funcs[f]
	}
	b.mu.Unlock()
	switch {
	case !ok:
		return xi, 0, nil, errNoExec(op, x)
	case !known:
		return xi, 0, nil, errf(op, gpu.ErrInvalidHandle, "node %#x is not a live node", uint64(n))
	case ni.graph != xi.graph:
		return xi, 0, nil, errf(op, gpu.ErrInvalidValue, "node %#x belongs to graph %#x, not to %#x that exec %#x was made from",
			uint64(n), uint64(ni.graph), uint64(xi.graph), uint64(x))
	case typ == 0: // not known yet: ask the driver (once)
		if err := b.wantType(op, xi.dev, ni, want); err != nil {
			return xi, 0, nil, err
		}
	case typ != want:
		return xi, 0, nil, errWrongType(op, typ, want)
	}
	return xi, ni.n, fi, nil
}

// GraphExecDestroy implements gpu.Graphs.
func (b *Backend) GraphExecDestroy(x gpu.GraphExec) error {
	b.mu.Lock()
	xi, ok := b.mu.execs[x]
	delete(b.mu.execs, x)
	b.mu.Unlock()
	if !ok {
		return errf("GraphExecDestroy", gpu.ErrInvalidHandle, "graph exec %#x is not live", uint64(x))
	}
	err := b.call(xi.dev, "cuGraphExecDestroy", func() cu.Result { return b.d.GraphExecDestroy(xi.x) })
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		b.mu.execs[x] = xi
	} else if gi := b.mu.graphs[xi.graph]; gi != nil {
		gi.execs--
	}
	return err
}

// execOnStream looks up exec x and stream s for op, which must be on one
// device; what names the operation in the error ("launched", "uploaded").
func (b *Backend) execOnStream(op string, x gpu.GraphExec, s gpu.Stream, what string) (execInfo, streamInfo, error) {
	b.mu.Lock()
	xi, xok := b.mu.execs[x]
	si, sok := b.mu.streams[s]
	b.mu.Unlock()
	switch {
	case !xok:
		return xi, si, errNoExec(op, x)
	case !sok:
		return xi, si, errNoStream(op, s)
	case si.dev != xi.dev:
		return xi, si, errf(op, gpu.ErrInvalidValue, "graph of device %d %s on a stream of device %d", xi.dev, what, si.dev)
	}
	return xi, si, nil
}

// GraphLaunch implements gpu.Graphs.
func (b *Backend) GraphLaunch(x gpu.GraphExec, s gpu.Stream) error {
	const op = "GraphLaunch"
	xi, si, err := b.execOnStream(op, x, s, "launched")
	if err != nil {
		return err
	}
	if xi.upd != nil {
		if err := b.launchCheck(op, x, xi, si); err != nil {
			return err
		}
	}
	return b.call(xi.dev, "cuGraphLaunch", func() cu.Result { return b.d.GraphLaunch(xi.x, si.s) })
}

// GraphExecUpdate implements gpu.Graphs. A refusal is an *gpu.UpdateError
// with the driver's reason and, when it names a node the backend knows, the
// offending node.
func (b *Backend) GraphExecUpdate(x gpu.GraphExec, g gpu.Graph) error {
	xi, err := b.exec("GraphExecUpdate", x)
	if err != nil {
		return err
	}
	gi, err := b.graphInfo("GraphExecUpdate", g)
	if err != nil {
		return err
	}
	if err := b.updateCheck(x, xi, g); err != nil {
		return err
	}
	// The result info lives in a pooled frame and the call needs no
	// closure: a whole-graph update from the host template is a step's
	// work (patch), which allocates nothing.
	fr := getFrame()
	defer fr.release()
	if err := b.enter(b.devs[xi.dev].ctx, fr); err != nil {
		return err
	}
	r := b.d.GraphExecUpdate(xi.x, gi.g, &fr.upd)
	runtime.UnlockOSThread()
	info := fr.upd
	switch r {
	case cu.Success:
		return nil
	case cu.ErrorGraphExecUpdateFailure:
		b.mu.Lock()
		node := b.mu.nodeByCU[info.ErrorNode]
		b.mu.Unlock()
		res := updateResult(info.Result)
		if res == gpu.UpdateSuccess { // a failure must give a reason
			res = gpu.UpdateFailed
		}
		return &gpu.UpdateError{Op: "cuGraphExecUpdate_v2", Result: res, Node: node,
			Code: int(r), CodeName: r.Name(), Detail: fmt.Sprintf("CUgraphExecUpdateResult %d", info.Result)}
	}
	return b.check("cuGraphExecUpdate_v2", r)
}

// GraphExecKernelNodeSetParams implements gpu.Graphs. Arguments are checked
// as for launches. A function of another device is refused (an
// *gpu.UpdateError, UpdateFunctionChanged) before the driver is asked; a
// change of function the driver refuses (CUDA_ERROR_INVALID_VALUE: dynamic
// parallelism, device-side launch or update) is one too, while the driver
// refusing the node's own function is bad input (a launch configuration
// out of range), gpu.ErrInvalidValue.
func (b *Backend) GraphExecKernelNodeSetParams(x gpu.GraphExec, n gpu.GraphNode, p gpu.KernelParams) error {
	const op = "GraphExecKernelNodeSetParams"
	xi, cn, fi, err := b.execNode(op, x, n, gpu.NodeKernel, p.Func)
	if err != nil {
		return err
	}
	if fi != nil && fi.dev != xi.dev {
		return &gpu.UpdateError{Op: op, Result: gpu.UpdateFunctionChanged, Node: n,
			Detail: fmt.Sprintf("kernel %#x is on device %d, the node on device %d: an exec update cannot change the context of a kernel node's function", uint64(p.Func), fi.dev, xi.dev)}
	}
	fr := getFrame()
	defer fr.release()
	if err := b.kernelParams(op, xi.dev, fi, p, fr); err != nil {
		return err
	}
	err = b.callFrame(fr, xi.dev, "cuGraphExecKernelNodeSetParams_v2", func() cu.Result {
		return b.d.GraphExecKernelNodeSetParams(xi.x, cn, &fr.kp)
	})
	if err == nil && xi.upd != nil && xi.upd.nodes[cn] {
		xi.upd.dirty.Store(true)
	}
	if err == nil || !isInvalidValue(err, "cuGraphExecKernelNodeSetParams_v2") {
		return err
	}
	// Refused: a change of function, or bad parameters? Ask the node.
	return b.kernelUpdateRefusal(op, xi.dev, n, cn, fi, err)
}

// isInvalidValue reports whether err is CUDA_ERROR_INVALID_VALUE from the
// driver call cop (not from the context switch before it), which the
// per-node exec updates return when they refuse a change.
func isInvalidValue(err error, cop string) bool {
	var ge *gpu.Error
	return errors.As(err, &ge) && ge.Op == cop && ge.Code == int(cu.ErrorInvalidValue)
}

// refused turns the driver's refusal err of a per-node update of n into an
// *gpu.UpdateError, keeping its CUresult.
func refused(op string, r gpu.UpdateResult, n gpu.GraphNode, err error, format string, args ...any) error {
	ue := &gpu.UpdateError{Op: op, Result: r, Node: n, Detail: fmt.Sprintf(format, args...)}
	var ge *gpu.Error
	var de *gpu.UpdateError
	switch {
	case errors.As(err, &ge):
		ue.Code, ue.CodeName = ge.Code, ge.CodeName
	case errors.As(err, &de):
		ue.Code, ue.CodeName = de.Code, de.CodeName
	}
	return ue
}

// GraphExecMemcpyNodeSetParams implements gpu.Graphs.
func (b *Backend) GraphExecMemcpyNodeSetParams(x gpu.GraphExec, n gpu.GraphNode, p gpu.MemcpyParams) error {
	const op = "GraphExecMemcpyNodeSetParams"
	xi, cn, _, err := b.execNode(op, x, n, gpu.NodeMemcpy, 0)
	if err != nil {
		return err
	}
	if p.Size == 0 {
		return errf(op, gpu.ErrInvalidValue, "memcpy node of 0 bytes")
	}
	fr := getFrame()
	defer fr.release()
	fr.cp = memcpyParams(p)
	err = b.callFrame(fr, xi.dev, "cuGraphExecMemcpyNodeSetParams", func() cu.Result {
		return b.d.GraphExecMemcpyNodeSetParams(xi.x, cn, &fr.cp, b.devs[xi.dev].ctx)
	})
	if err != nil && isInvalidValue(err, "cuGraphExecMemcpyNodeSetParams") {
		// The arguments were checked: what is left is the update rule.
		return refused(op, gpu.UpdateParametersChanged, n, err,
			"the driver refused the operands dst %#x, src %#x: an exec update keeps a memcpy node's memory allocated, on the same device and of the same kind (device or host)",
			uint64(p.Dst), uint64(p.Src))
	}
	return err
}

// GraphExecMemsetNodeSetParams implements gpu.Graphs.
func (b *Backend) GraphExecMemsetNodeSetParams(x gpu.GraphExec, n gpu.GraphNode, m gpu.Memset) error {
	const op = "GraphExecMemsetNodeSetParams"
	xi, cn, _, err := b.execNode(op, x, n, gpu.NodeMemset, 0)
	if err != nil {
		return err
	}
	mp, err := memsetParams(op, m)
	if err != nil {
		return err
	}
	fr := getFrame()
	defer fr.release()
	fr.mp = mp
	err = b.callFrame(fr, xi.dev, "cuGraphExecMemsetNodeSetParams", func() cu.Result {
		return b.d.GraphExecMemsetNodeSetParams(xi.x, cn, &fr.mp, b.devs[xi.dev].ctx)
	})
	if err != nil && isInvalidValue(err, "cuGraphExecMemsetNodeSetParams") {
		return refused(op, gpu.UpdateParametersChanged, n, err,
			"the driver refused destination %#x with %d-byte elements: an exec update keeps a memset node's memory allocated, on the same device and of the same kind (device or host), and may refuse another element size or count",
			uint64(m.Dst), m.ElemSize)
	}
	return err
}

// GraphExecChildGraphNodeSetParams implements gpu.Graphs. The driver refuses
// a child of another topology, or one whose nodes change in a way an exec
// update cannot take, with CUDA_ERROR_INVALID_VALUE and no reason; the
// backend then compares the two graphs to say which (childRefusal), and
// returns an *gpu.UpdateError naming n.
func (b *Backend) GraphExecChildGraphNodeSetParams(x gpu.GraphExec, n gpu.GraphNode, child gpu.Graph) error {
	const op = "GraphExecChildGraphNodeSetParams"
	xi, err := b.exec(op, x)
	if err != nil {
		return err
	}
	ci, err := b.graphInfo(op, child)
	if err != nil {
		return err
	}
	if err := childCheck(op, child, ci); err != nil {
		return err
	}
	_, cn, _, err := b.execNode(op, x, n, gpu.NodeChildGraph, 0)
	if err != nil {
		return err
	}
	err = b.call(xi.dev, "cuGraphExecChildGraphNodeSetParams", func() cu.Result {
		return b.d.GraphExecChildGraphNodeSetParams(xi.x, cn, ci.g)
	})
	// The driver refuses a child graph it cannot take with
	// CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE (seen on driver 580) or, as its
	// documentation says, CUDA_ERROR_INVALID_VALUE: either way the two
	// graphs are compared to say why.
	var ue *gpu.UpdateError
	if err != nil && (isInvalidValue(err, "cuGraphExecChildGraphNodeSetParams") || errors.As(err, &ue)) {
		return b.childRefusal(op, xi.dev, n, cn, ci.g, err)
	}
	return err
}
