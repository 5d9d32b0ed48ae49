package gputest

import (
	"errors"
	"fmt"
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/patchtable"
	"github.com/stablegraph/stablegraph/kernels"
)

// The DeviceUpdates group tests the optional gpu.DeviceUpdates capability
// and the patcher of package kernels running on it: opting nodes in, a
// node added before others (the roots, or a later node), pointers moved by
// the patcher within the same launch, a host-side change of a node that is
// not device-updatable leaving the device's state alone, and each of
// CUDA's rules (gpu.DeviceUpdates lists them). The tests skip when the
// backend or device lacks the capability, and the patcher tests when the
// patcher cannot load (on CUDA: not built, or not for this architecture).
var devUpdateTests = []test{
	{name: "OptIn", run: testDevOptIn},
	{name: "NodeBefore", run: testDevNodeBefore},
	{name: "HostChangeKeepsDeviceState", run: testDevHostChangeKeeps},
	{name: "PatchChainSameLaunch", run: testDevPatchChain},
	{name: "PatcherFromStream", run: testDevPatcherFromStream},
	{name: "PatcherCounts", run: testDevPatcherCounts},
	{name: "InstantiateOnce", run: testDevInstantiateOnce},
	{name: "NoExecUpdate", run: testDevNoExecUpdate},
	{name: "UploadBeforeLaunch", run: testDevUpload},
	{name: "NotNested", run: testDevNotNested},
	{name: "Errors", run: testDevErrors},
}

// devUpdates returns the backend's device updates for dev (behind a
// recorder for the coverage check), skipping the test without them.
func (h *h) devUpdates(dev int) gpu.DeviceUpdates {
	h.Helper()
	du, err := gpu.DeviceUpdatesOf(h.raw, dev)
	if errors.Is(err, gpu.ErrNotSupported) {
		h.Skipf("device-side graph updates: %v", err)
	}
	h.ok("DeviceUpdatesOf", err)
	if h.note == nil {
		return du
	}
	h.note("DeviceUpdatesSupported")
	return devUpdatesRecorder{du, h.note}
}

// devUpdatesRecorder notes the gpu.DeviceUpdates calls of a subtest.
type devUpdatesRecorder struct {
	d    gpu.DeviceUpdates
	note func(string)
}

func (r devUpdatesRecorder) DeviceUpdatesSupported(dev int) error {
	r.note("DeviceUpdatesSupported")
	return r.d.DeviceUpdatesSupported(dev)
}

func (r devUpdatesRecorder) GraphKernelNodeSetDeviceUpdatable(n gpu.GraphNode, on bool) (gpu.DevNode, error) {
	r.note("GraphKernelNodeSetDeviceUpdatable")
	return r.d.GraphKernelNodeSetDeviceUpdatable(n, on)
}

func (r devUpdatesRecorder) GraphKernelNodeDevNode(n gpu.GraphNode) (gpu.DevNode, error) {
	r.note("GraphKernelNodeDevNode")
	return r.d.GraphKernelNodeDevNode(n)
}

func (r devUpdatesRecorder) GraphAddKernelNodeBefore(g gpu.Graph, p gpu.KernelParams, before []gpu.GraphNode) (gpu.GraphNode, error) {
	r.note("GraphAddKernelNodeBefore")
	return r.d.GraphAddKernelNodeBefore(g, p, before)
}

func (r devUpdatesRecorder) GraphUpload(x gpu.GraphExec, s gpu.Stream) error {
	r.note("GraphUpload")
	return r.d.GraphUpload(x, s)
}

// optIn opts n in and checks that its DevNode reads back.
func (h *h) optIn(du gpu.DeviceUpdates, n gpu.GraphNode) gpu.DevNode {
	h.Helper()
	d, err := du.GraphKernelNodeSetDeviceUpdatable(n, true)
	h.ok("GraphKernelNodeSetDeviceUpdatable", err)
	if d == 0 {
		h.Fatalf("GraphKernelNodeSetDeviceUpdatable(%#x) returned DevNode 0", uint64(n))
	}
	return d
}

// patcher returns the patcher kernel on dev, skipping the test when it
// cannot be loaded there.
func (h *h) patcher(dev int) gpu.Function {
	h.Helper()
	k := fmt.Sprintf("%d/%s", dev, kernels.Patcher)
	if f, ok := h.fns[k]; ok {
		return f
	}
	m, err := h.b.ModuleLoad(dev, kernels.PatcherModule())
	if errors.Is(err, gpu.ErrNotSupported) {
		h.Skipf("the patcher cannot be loaded: %v", err)
	}
	h.ok("ModuleLoad(patcher)", err)
	h.track(moduleKey(m), 0, func() error { return h.b.ModuleUnload(m) })
	f, err := h.b.ModuleFunction(m, kernels.Patcher)
	h.ok("ModuleFunction(patcher)", err)
	h.fns[k] = f
	return f
}

// patchRig is a patcher's memory: its control block and slots in device
// memory, a ring of tables in mapped host memory.
type patchRig struct {
	ctl, slots gpu.DevicePtr
	nslots     int
	tables     gpu.HostMem
	ntables    int
	capacity   int
	stride     uint64
	launches   uint64 // the next launch's sequence number
}

// patchRig makes a patcher's memory for nslots slots, written now when
// slots are given (else with setSlots).
func (h *h) patchRig(dev int, nslots int, slots []patchtable.Slot, ntables, capacity int) *patchRig {
	h.Helper()
	r := &patchRig{nslots: nslots, ntables: ntables, capacity: capacity, stride: patchtable.Stride(capacity)}
	r.ctl = h.alloc(dev, patchtable.CtlSize)
	h.ok("Memset(control block)", h.b.Memset(gpu.Memset{Dst: r.ctl, ElemSize: 4, Count: patchtable.CtlSize / 4}))
	r.slots = h.alloc(dev, uint64(patchtable.SlotSize*max(nslots, 1)))
	if slots != nil {
		h.setSlots(r, slots)
	}
	r.tables = h.hostAlloc(r.stride * uint64(ntables))
	return r
}

func (h *h) setSlots(r *patchRig, slots []patchtable.Slot) {
	h.Helper()
	if len(slots) != r.nslots {
		h.Fatalf("%d slots for a patcher of %d", len(slots), r.nslots)
	}
	h.ok("MemcpyHtoD(slots)", h.b.MemcpyHtoD(r.slots, patchtable.EncodeSlots(slots)))
}

func (r *patchRig) params(f gpu.Function) gpu.KernelParams {
	return gpu.KernelParams{Func: f, Config: kernels.PatcherConfig(r.capacity),
		Args: patchtable.Args(r.ctl, r.slots, r.nslots, r.tables.Ptr, r.stride, r.ntables, r.capacity)}
}

// next writes the table of the next launch. The caller has synchronized
// with the launch that read that table before.
func (h *h) nextTable(r *patchRig, ups []patchtable.Update) {
	h.Helper()
	i := r.launches % uint64(r.ntables)
	h.ok("WritePatchTable", patchtable.Write(r.tables.Bytes[i*r.stride:(i+1)*r.stride], r.launches, ups))
	r.launches++
}

func (h *h) patchCtl(r *patchRig) patchtable.Ctl {
	h.Helper()
	c, err := patchtable.DecodeCtl(h.download(r.ctl, patchtable.CtlSize))
	h.ok("DecodePatchCtl", err)
	return c
}

// devChain is a chain of K sg_axpb kernels, y[i+1] = y[i] + 1 over n
// values, so that y[K] = y[0] + K.
type devChain struct {
	nodes []gpu.GraphNode
	devs  []gpu.DevNode
}

const devChainN = 256

// chainArgs are node i's parameters over buffers bufs.
func (h *h) chainArgs(dev int, bufs []gpu.DevicePtr, i int) gpu.KernelParams {
	return h.axpbParams(dev, bufs[i+1], bufs[i], 1, 1, devChainN)
}

// chainSlots are the two pointer slots of every node: y at offset 0, x at
// offset 8 (sg_axpb's layout).
func chainSlots(devs []gpu.DevNode) []patchtable.Slot {
	var s []patchtable.Slot
	for _, d := range devs {
		s = append(s, patchtable.Slot{Node: d, Offset: 0}, patchtable.Slot{Node: d, Offset: 8})
	}
	return s
}

// moveChain are the updates moving nodes [from, to) of a chain onto bufs.
func moveChain(bufs []gpu.DevicePtr, from, to int) []patchtable.Update {
	var u []patchtable.Update
	for i := from; i < to; i++ {
		u = append(u, patchtable.Update{Slot: uint32(2 * i), Value: uint64(bufs[i+1])},
			patchtable.Update{Slot: uint32(2*i + 1), Value: uint64(bufs[i])})
	}
	return u
}

// chainBufs allocates K+1 buffers, y[0] = v0 and the rest -1.
func (h *h) devChainBufs(k int, v0 float32) []gpu.DevicePtr {
	h.Helper()
	b := h.bufsF32(0, k+1, devChainN)
	h.setF32(b[0], v0, devChainN)
	h.setAll(b[1:], -1, devChainN)
	return b
}

// wantChainOut checks y[i] = y[0] + i for i in [from, to].
func (h *h) wantChainOut(what string, bufs []gpu.DevicePtr, v0 float32, from, to int) {
	h.Helper()
	for i := from; i <= to; i++ {
		h.wantAllF32(fmt.Sprintf("%s: y[%d]", what, i), h.downloadF32(bufs[i], devChainN), v0+float32(i))
	}
}

func testDevOptIn(h *h) {
	du := h.devUpdates(0)
	bufs := h.bufsF32(0, 3, devChainN)
	g := h.graph(0)
	a := h.addKernel(g, nil, h.chainArgs(0, bufs, 0))
	b := h.addKernel(g, deps(a), h.chainArgs(0, bufs, 1))
	for _, n := range []gpu.GraphNode{a, b} {
		if d, err := du.GraphKernelNodeDevNode(n); err != nil || d != 0 {
			h.Errorf("GraphKernelNodeDevNode of a node not opted in = %#x, %v; want 0", uint64(d), err)
		}
	}
	da := h.optIn(du, a)
	if d, err := du.GraphKernelNodeDevNode(a); err != nil || d != da {
		h.Errorf("GraphKernelNodeDevNode after opting in = %#x, %v; want %#x", uint64(d), err, uint64(da))
	}
	if d := h.optIn(du, a); d != da {
		h.Errorf("opting in again gave DevNode %#x, first %#x", uint64(d), uint64(da))
	}
	db := h.optIn(du, b)
	if db == da {
		h.Errorf("two nodes got the same DevNode %#x", uint64(da))
	}
	d, err := du.GraphKernelNodeSetDeviceUpdatable(a, false)
	h.wantErr("opting out a device-updatable node", err, gpu.ErrNotSupported)
	if d != 0 {
		h.Errorf("refused opt-out returned DevNode %#x", uint64(d))
	}
	if d, err := du.GraphKernelNodeDevNode(a); err != nil || d != da {
		h.Errorf("after the refused opt-out: DevNode %#x, %v; want %#x", uint64(d), err, uint64(da))
	}
	c := h.addKernel(g, deps(b), h.chainArgs(0, bufs, 0))
	if d, err := du.GraphKernelNodeSetDeviceUpdatable(c, false); err != nil || d != 0 {
		h.Errorf("opting out a node never opted in = %#x, %v; want 0, nil", uint64(d), err)
	}
	// The nodes still run as ordinary kernels once uploaded.
	x := h.instantiate(g)
	s := h.stream(0)
	h.setF32(bufs[0], 4, devChainN)
	h.ok("GraphUpload", du.GraphUpload(x, s))
	h.launchGraph(x, s)
	h.wantChainOut("launch", bufs, 4, 0, 2)
}

// roots returns g's nodes without dependencies.
func (h *h) roots(g gpu.Graph) []gpu.GraphNode {
	h.Helper()
	all, err := h.b.GraphNodes(g)
	h.ok("GraphNodes", err)
	var r []gpu.GraphNode
	for _, n := range all {
		d, err := h.b.GraphNodeDeps(n)
		h.ok("GraphNodeDeps", err)
		if len(d) == 0 {
			r = append(r, n)
		}
	}
	return r
}

// testDevNodeBefore: a node added before the roots runs first; one added
// before a later node runs beside the nodes before that one; one added
// before nothing runs beside the whole graph.
func testDevNodeBefore(h *h) {
	du := h.devUpdates(0)
	bufs := h.bufsF32(0, 5, devChainN)
	W, X, Y, Z, V := bufs[0], bufs[1], bufs[2], bufs[3], bufs[4]
	copyP := func(y, x gpu.DevicePtr) gpu.KernelParams {
		return gpu.KernelParams{Func: h.fn(0, kernels.Copy), Config: kernels.Elementwise(devChainN),
			Args: []gpu.Arg{gpu.Ptr(y), gpu.Ptr(x), gpu.I32(devChainN)}}
	}
	addP := func(z, x, y gpu.DevicePtr) gpu.KernelParams {
		return gpu.KernelParams{Func: h.fn(0, kernels.Add), Config: kernels.Elementwise(devChainN),
			Args: []gpu.Arg{gpu.Ptr(z), gpu.Ptr(x), gpu.Ptr(y), gpu.I32(devChainN)}}
	}
	s := h.stream(0)
	// Before the roots: two roots copy W, a third node adds their
	// outputs; the new node fills W, so Z = 2*3 only if it runs before
	// both.
	g := h.graph(0)
	A := h.addKernel(g, nil, copyP(X, W))
	B := h.addKernel(g, nil, copyP(Y, W))
	C := h.addKernel(g, deps(A, B), addP(Z, X, Y))
	R, err := du.GraphAddKernelNodeBefore(g, h.fillParams(0, W, 3, devChainN), h.roots(g))
	h.ok("GraphAddKernelNodeBefore(the roots)", err)
	h.wantNodes("after the node before the roots", g, A, B, C, R)
	h.wantType(R, gpu.NodeKernel)
	h.wantDeps(R)
	h.wantDeps(A, R)
	h.wantDeps(B, R)
	h.wantDeps(C, A, B)
	h.wantKernelParams(R, h.fillParams(0, W, 3, devChainN))
	x := h.instantiate(g)
	for step := range 3 {
		h.setAll(bufs, -1, devChainN)
		h.launchGraph(x, s)
		h.wantAllF32(fmt.Sprintf("launch %d: Z", step), h.downloadF32(Z, devChainN), 6)
	}

	// Before a later node: A copies V to X, then C adds X and W; the new
	// node fills W and only C waits for it.
	g2 := h.graph(0)
	A2 := h.addKernel(g2, nil, copyP(X, V))
	C2 := h.addKernel(g2, deps(A2), addP(Z, X, W))
	R2, err := du.GraphAddKernelNodeBefore(g2, h.fillParams(0, W, 4, devChainN), deps(C2))
	h.ok("GraphAddKernelNodeBefore(a later node)", err)
	h.wantNodes("after the node before a later node", g2, A2, C2, R2)
	h.wantDeps(R2)
	h.wantDeps(A2)
	h.wantDeps(C2, A2, R2)
	h.setAll(bufs, -1, devChainN)
	h.setF32(V, 2, devChainN)
	h.launchGraph(h.instantiate(g2), s)
	h.wantAllF32("before a later node: Z", h.downloadF32(Z, devChainN), 6)

	// Before nothing, and on an empty graph: a node of its own.
	e := h.graph(0)
	R3, err := du.GraphAddKernelNodeBefore(e, h.fillParams(0, W, 9, devChainN), nil)
	h.ok("GraphAddKernelNodeBefore(empty graph)", err)
	h.wantNodes("empty graph with the new node", e, R3)
	h.launchGraph(h.instantiate(e), s)
	h.wantAllF32("the node of an empty graph", h.downloadF32(W, devChainN), 9)
}

// testDevHostChangeKeeps: a host-side change of a node that is not
// device-updatable, in an exec that has such nodes, takes effect at the
// next launch without an upload and leaves the device-side parameters of
// the device-updatable nodes as the device last set them. (The device
// strategy moves the step's first command from the host this way while
// the patcher moves the others beside it.)
func testDevHostChangeKeeps(h *h) {
	du := h.devUpdates(0)
	f := h.patcher(0)
	const K = 4
	built := h.devChainBufs(K, 0)
	F := h.bufsF32(0, 2, devChainN)
	g := h.graph(0)
	lead := h.addKernel(g, nil, h.fillParams(0, F[0], 1, devChainN)) // not device-updatable
	var c devChain
	for i := range K {
		d := deps(lead)
		if i > 0 {
			d = deps(c.nodes[i-1])
		}
		c.nodes = append(c.nodes, h.addKernel(g, d, h.chainArgs(0, built, i)))
		c.devs = append(c.devs, h.optIn(du, c.nodes[i]))
	}
	r := h.patchRig(0, 2*K, chainSlots(c.devs), 2, 2*K)
	P, err := du.GraphAddKernelNodeBefore(g, r.params(f), deps(c.nodes[0]))
	h.ok("GraphAddKernelNodeBefore(patcher, the chain's first node)", err)
	h.wantDeps(P)
	h.wantDeps(lead)
	h.wantDeps(c.nodes[0], lead, P)
	x := h.instantiate(g)
	s := h.stream(0)
	h.ok("GraphUpload", du.GraphUpload(x, s))

	moved := h.devChainBufs(K, 10)
	h.nextTable(r, moveChain(moved, 0, K))
	h.launchGraph(x, s)
	h.wantChainOut("launch 0: moved by the patcher", moved, 10, 0, K)
	h.wantAllF32("launch 0: the plain node", h.downloadF32(F[0], devChainN), 1)

	for step := 1; step <= 3; step++ {
		// The plain node moves from the host, nothing on the device, no
		// upload.
		v := float32(10 * step)
		h.ok("GraphExecKernelNodeSetParams(plain node)", h.b.GraphExecKernelNodeSetParams(x, lead, h.fillParams(0, F[step%2], v, devChainN)))
		h.setAll(built, -1, devChainN)
		h.setF32(moved[0], v, devChainN)
		h.setAll(moved[1:], -1, devChainN)
		h.nextTable(r, nil)
		h.launchGraph(x, s)
		h.wantAllF32(fmt.Sprintf("launch %d: the host-side change", step), h.downloadF32(F[step%2], devChainN), v)
		h.wantChainOut(fmt.Sprintf("launch %d: the device-side addresses kept", step), moved, v, 0, K)
		h.wantAllF32(fmt.Sprintf("launch %d: the recorded addresses unused", step), h.downloadF32(built[K], devChainN), -1)
	}
	if got := h.patchCtl(r); got != (patchtable.Ctl{Seq: 4}) {
		h.Errorf("patcher control block after 4 launches: %+v, want seq 4 and no failure", got)
	}
}

// testDevPatchChain: the patcher before the roots moves every pointer of a
// chain to fresh buffers each launch; the chain runs on the new buffers in
// the same launch, and device-side changes hold for later launches.
func testDevPatchChain(h *h) {
	du := h.devUpdates(0)
	f := h.patcher(0)
	const K = 24
	built := h.devChainBufs(K, 0) // the addresses the graph is built with
	g := h.graph(0)
	var c devChain
	for i := range K {
		var d []gpu.GraphNode
		if i > 0 {
			d = deps(c.nodes[i-1])
		}
		c.nodes = append(c.nodes, h.addKernel(g, d, h.chainArgs(0, built, i)))
		c.devs = append(c.devs, h.optIn(du, c.nodes[i]))
	}
	r := h.patchRig(0, 2*K, chainSlots(c.devs), 2, 2*K)
	_, err := du.GraphAddKernelNodeBefore(g, r.params(f), h.roots(g))
	h.ok("GraphAddKernelNodeBefore(patcher, the roots)", err)
	x := h.instantiate(g)
	s := h.stream(0)
	h.ok("GraphUpload", du.GraphUpload(x, s))

	var prev []gpu.DevicePtr
	for step := range 4 {
		bufs := h.devChainBufs(K, float32(10*step)) // fresh addresses every step
		h.setAll(built, -1, devChainN)
		h.nextTable(r, moveChain(bufs, 0, K))
		h.launchGraph(x, s)
		h.wantChainOut(fmt.Sprintf("launch %d: new buffers", step), bufs, float32(10*step), 0, K)
		h.wantAllF32(fmt.Sprintf("launch %d: the buffers the graph was built with", step), h.downloadF32(built[K], devChainN), -1)
		if prev != nil {
			h.wantChainOut(fmt.Sprintf("launch %d: the previous launch's buffers", step), prev, float32(10*(step-1)), 0, K)
		}
		prev = bufs
	}
	// Move only the first half: the second half keeps the addresses the
	// device set last launch (device-side changes persist).
	const half = K / 2
	bufs := h.devChainBufs(K, 100)
	h.setAll(prev[half+1:], -1, devChainN) // rewritten only if the unmoved nodes still target them
	h.nextTable(r, moveChain(bufs, 0, half))
	h.launchGraph(x, s)
	h.wantChainOut("half move: moved nodes", bufs, 100, 0, half)
	h.wantAllF32("half move: node outputs past the moved half stay unwritten", h.downloadF32(bufs[half+1], devChainN), -1)
	h.wantChainOut("half move: unmoved nodes, on last launch's buffers", prev, 30, half+1, K)
	if got := h.patchCtl(r); got != (patchtable.Ctl{Seq: 5}) {
		h.Errorf("patcher control block after 5 launches: %+v, want seq 5 and no failure", got)
	}
}

// testDevPatcherFromStream: a patcher launched on its own (not in the
// graph) moves a captured graph's nodes for its next launch.
func testDevPatcherFromStream(h *h) {
	du := h.devUpdates(0)
	f := h.patcher(0)
	const K = 6
	built := h.devChainBufs(K, 0)
	s := h.stream(0)
	g := h.capture(s, func() {
		for i := range K {
			h.launch(h.chainArgs(0, built, i), s)
		}
	})
	// Find chain position of each captured node by its output pointer.
	devs := make([]gpu.DevNode, K)
	nodes, err := h.b.GraphNodes(g)
	h.ok("GraphNodes", err)
	for _, n := range nodes {
		p, err := h.b.GraphKernelNodeParams(n)
		h.ok("GraphKernelNodeParams", err)
		i := slices.Index(built, p.Args[0].AsPtr()) - 1
		if i < 0 || devs[i] != 0 {
			h.Fatalf("captured node %#x writes %#x, not a chain output", uint64(n), p.Args[0].Bits)
		}
		devs[i] = h.optIn(du, n)
	}
	x := h.instantiate(g)
	h.ok("GraphUpload", du.GraphUpload(x, s))
	r := h.patchRig(0, 2*K, chainSlots(devs), 1, 2*K)
	for step := range 3 {
		bufs := h.devChainBufs(K, float32(step))
		h.nextTable(r, moveChain(bufs, 0, K))
		p := r.params(f)
		h.launch(p, s)
		h.launchGraph(x, s)
		h.wantChainOut(fmt.Sprintf("step %d", step), bufs, float32(step), 0, K)
	}
	h.wantAllF32("the captured buffers", h.downloadF32(built[1], devChainN), -1)
	if got := h.patchCtl(r); got != (patchtable.Ctl{Seq: 3}) {
		h.Errorf("patcher control block: %+v", got)
	}
}

// testDevPatcherCounts: updates the patcher cannot apply are counted, the
// others applied; a table that is not the launch's own is skipped whole.
func testDevPatcherCounts(h *h) {
	du := h.devUpdates(0)
	f := h.patcher(0)
	const K = 2
	built := h.devChainBufs(K, 0)
	g := h.graph(0)
	n0 := h.addKernel(g, nil, h.chainArgs(0, built, 0))
	n1 := h.addKernel(g, deps(n0), h.chainArgs(0, built, 1))
	// Here the patcher is added before the nodes opt in (PatchChainSameLaunch
	// does it the other way round).
	r := h.patchRig(0, 2*K, nil, 2, 8)
	_, err := du.GraphAddKernelNodeBefore(g, r.params(f), h.roots(g))
	h.ok("GraphAddKernelNodeBefore(patcher, the roots)", err)
	h.setSlots(r, chainSlots([]gpu.DevNode{h.optIn(du, n0), h.optIn(du, n1)}))
	x := h.instantiate(g)
	s := h.stream(0)
	h.ok("GraphUpload", du.GraphUpload(x, s))

	bufs := h.devChainBufs(K, 5)
	ups := moveChain(bufs, 0, K)
	ups = slices.Insert(ups, 1, patchtable.Update{Slot: 4, Value: 1}, patchtable.Update{Slot: 1000, Value: 2}) // no such slots
	h.nextTable(r, ups)
	h.launchGraph(x, s)
	h.wantChainOut("the valid updates", bufs, 5, 0, K)
	// Which failure is recorded first is up to the threads' race.
	got := h.patchCtl(r)
	if want := (patchtable.Ctl{Seq: 1, Failed: 2, FirstEntry: got.FirstEntry, FirstCode: 1}); got != want || (got.FirstEntry != 2 && got.FirstEntry != 3) {
		h.Errorf("control block after bad updates at entries 1 and 2: %+v, want seq 1, 2 failed, the first at entry 1 or 2 (FirstEntry 2 or 3), code 1", got)
	}
	want := got
	// Launch 1 finds a table written for launch 3: nothing moves.
	next := h.devChainBufs(K, 7)
	h.ok("WritePatchTable", patchtable.Write(r.tables.Bytes[r.stride:2*r.stride], 3, moveChain(next, 0, K)))
	h.setAll(bufs[1:], -1, devChainN)
	h.launchGraph(x, s)
	h.wantChainOut("a skipped table: the previous buffers", bufs, 5, 0, K)
	h.wantAllF32("a skipped table: its buffers", h.downloadF32(next[K], devChainN), -1)
	want.Seq, want.Skipped = 2, 1
	if got := h.patchCtl(r); got != want {
		h.Errorf("control block after a skipped table: %+v, want %+v", got, want)
	}
}

func testDevInstantiateOnce(h *h) {
	du := h.devUpdates(0)
	bufs := h.bufsF32(0, 2, devChainN)
	g := h.graph(0)
	n := h.addKernel(g, nil, h.chainArgs(0, bufs, 0))
	// Without device-updatable nodes, any number of execs.
	x0, x0b := h.instantiate(g), h.instantiate(g)
	h.optIn(du, n)
	x, err := h.b.GraphInstantiate(g)
	h.wantErr("instantiating a graph with device-updatable nodes that has execs", err, gpu.ErrNotSupported)
	if err == nil {
		h.ok("GraphExecDestroy", h.b.GraphExecDestroy(x))
	}
	h.release(execKey(x0))
	h.release(execKey(x0b))
	x1 := h.instantiate(g)
	x2, err := h.b.GraphInstantiate(g)
	h.wantErr("a second exec of a graph with device-updatable nodes", err, gpu.ErrNotSupported)
	if err == nil {
		h.ok("GraphExecDestroy", h.b.GraphExecDestroy(x2))
	}
	h.release(execKey(x1))
	x3 := h.instantiate(g)
	s := h.stream(0)
	h.setF32(bufs[0], 2, devChainN)
	h.ok("GraphUpload", du.GraphUpload(x3, s))
	h.launchGraph(x3, s)
	h.wantAllF32("the exec made after the first was destroyed", h.downloadF32(bufs[1], devChainN), 3)
}

func testDevNoExecUpdate(h *h) {
	du := h.devUpdates(0)
	old, upd := h.bufsF32(0, 2, devChainN), h.bufsF32(0, 2, devChainN)
	plain := h.graph(0)
	h.addKernel(plain, nil, h.chainArgs(0, old, 0))
	dev := h.graph(0)
	h.optIn(du, h.addKernel(dev, nil, h.chainArgs(0, upd, 0)))
	xPlain := h.instantiate(plain)
	h.wantRefused("GraphExecUpdate of an exec with a graph that has device-updatable nodes",
		h.b.GraphExecUpdate(xPlain, dev), gpu.UpdateNotSupported)
	xDev := h.instantiate(dev)
	other := h.graph(0)
	h.addKernel(other, nil, h.chainArgs(0, old, 0))
	h.wantRefused("GraphExecUpdate of an exec with device-updatable nodes",
		h.b.GraphExecUpdate(xDev, other), gpu.UpdateNotSupported)
	// Both execs still run their own parameters.
	s := h.stream(0)
	h.setAll(old, 1, devChainN)
	h.setAll(upd, 1, devChainN)
	h.launchGraph(xPlain, s)
	h.ok("GraphUpload", du.GraphUpload(xDev, s))
	h.launchGraph(xDev, s)
	h.wantAllF32("plain exec after the refused update", h.downloadF32(old[1], devChainN), 2)
	h.wantAllF32("device-updatable exec after the refused update", h.downloadF32(upd[1], devChainN), 2)
}

func testDevUpload(h *h) {
	du := h.devUpdates(0)
	bufs := h.bufsF32(0, 6, devChainN)
	g := h.graph(0)
	n := h.addKernel(g, nil, h.chainArgs(0, bufs, 0)) // bufs[1] = bufs[0] + 1
	plainNode := h.addKernel(g, deps(n), h.fillParams(0, bufs[2], 7, devChainN))
	h.optIn(du, n)
	x := h.instantiate(g)
	s := h.stream(0)
	h.wantErr("launch before the first upload", h.b.GraphLaunch(x, s), gpu.ErrIllegalState)
	h.ok("GraphUpload", du.GraphUpload(x, s))
	h.setAll(bufs, 1, devChainN)
	h.launchGraph(x, s)
	h.wantAllF32("first launch", h.downloadF32(bufs[1], devChainN), 2)

	// A host-side change of the device-updatable node needs an upload.
	h.ok("GraphExecKernelNodeSetParams", h.b.GraphExecKernelNodeSetParams(x, n, h.axpbParams(0, bufs[4], bufs[3], 1, 1, devChainN)))
	h.wantErr("launch after a host-side change without an upload", h.b.GraphLaunch(x, s), gpu.ErrIllegalState)
	h.ok("GraphUpload", du.GraphUpload(x, s))
	h.setAll(bufs, 1, devChainN)
	h.launchGraph(x, s)
	h.wantAllF32("after the upload: the host-side change", h.downloadF32(bufs[4], devChainN), 2)
	h.wantAllF32("after the upload: the old output", h.downloadF32(bufs[1], devChainN), 1)

	// A host-side change of another node does not.
	h.ok("GraphExecKernelNodeSetParams(plain node)", h.b.GraphExecKernelNodeSetParams(x, plainNode, h.fillParams(0, bufs[5], 8, devChainN)))
	h.launchGraph(x, s)
	h.wantAllF32("change of a node that is not device-updatable", h.downloadF32(bufs[5], devChainN), 8)

	// An exec without device-updatable nodes may be uploaded too.
	plain := h.graph(0)
	h.addKernel(plain, nil, h.fillParams(0, bufs[0], 3, devChainN))
	xp := h.instantiate(plain)
	h.launchGraph(xp, s)
	h.ok("GraphUpload of an exec without device-updatable nodes", du.GraphUpload(xp, s))
	h.launchGraph(xp, s)
	h.wantAllF32("plain exec", h.downloadF32(bufs[0], devChainN), 3)
}

func testDevNotNested(h *h) {
	du := h.devUpdates(0)
	bufs := h.bufsF32(0, 2, devChainN)
	// A node of a child graph cannot opt in.
	parent := h.graph(0)
	child := h.graph(0)
	h.addKernel(child, nil, h.chainArgs(0, bufs, 0))
	cn := h.addChild(parent, nil, child)
	view, err := h.b.GraphChildGraph(cn)
	h.ok("GraphChildGraph", err)
	inner, err := h.b.GraphNodes(view)
	h.ok("GraphNodes(child)", err)
	if len(inner) != 1 {
		h.Fatalf("child graph has %d nodes, want 1", len(inner))
	}
	_, err = du.GraphKernelNodeSetDeviceUpdatable(inner[0], true)
	h.wantErr("opting in a node of a child graph", err, gpu.ErrNotSupported)

	// A graph with device-updatable nodes cannot be a child.
	dev := h.graph(0)
	h.optIn(du, h.addKernel(dev, nil, h.chainArgs(0, bufs, 0)))
	_, err = h.b.GraphAddChildGraphNode(parent, nil, dev)
	h.wantErr("a graph with device-updatable nodes as a child", err, gpu.ErrNotSupported)
	x := h.instantiate(parent)
	h.wantErr("a graph with device-updatable nodes as a child's new parameters",
		h.b.GraphExecChildGraphNodeSetParams(x, cn, dev), gpu.ErrNotSupported)

	// The launch of its exec cannot be captured; the capture stays valid.
	xd := h.instantiate(dev)
	s := h.stream(0)
	h.ok("GraphUpload", du.GraphUpload(xd, s))
	h.sync(s)
	g := h.capture(s, func() {
		h.wantErr("capturing the launch of an exec with device-updatable nodes", h.b.GraphLaunch(xd, s), gpu.ErrNotSupported)
		h.launch(h.fillParams(0, bufs[1], 4, devChainN), s)
	})
	h.launchGraph(h.instantiate(g), s)
	h.wantAllF32("the capture after the refused launch", h.downloadF32(bufs[1], devChainN), 4)
}

func testDevErrors(h *h) {
	du := h.devUpdates(0)
	bufs := h.bufsF32(0, 2, devChainN)
	g := h.graph(0)
	k := h.addKernel(g, nil, h.chainArgs(0, bufs, 0))
	m := h.addMemset(g, deps(k), f32Memset(bufs[1], 1, devChainN))
	_, err := du.GraphKernelNodeSetDeviceUpdatable(m, true)
	h.wantErr("opting in a memset node", err, gpu.ErrInvalidValue)
	_, err = du.GraphKernelNodeSetDeviceUpdatable(0, true)
	h.wantErr("opting in node 0", err, gpu.ErrInvalidHandle)
	_, err = du.GraphKernelNodeDevNode(m)
	h.wantErr("DevNode of a memset node", err, gpu.ErrInvalidValue)
	_, err = du.GraphKernelNodeDevNode(0)
	h.wantErr("DevNode of node 0", err, gpu.ErrInvalidHandle)
	h.wantErr("DeviceUpdatesSupported(-1)", du.DeviceUpdatesSupported(-1), gpu.ErrInvalidValue)

	p := h.fillParams(0, bufs[0], 1, devChainN)
	_, err = du.GraphAddKernelNodeBefore(0, p, nil)
	h.wantErr("a node before others in graph 0", err, gpu.ErrInvalidHandle)
	short := p
	short.Args = p.Args[:2]
	_, err = du.GraphAddKernelNodeBefore(g, short, deps(k))
	h.wantErr("a node before others with too few arguments", err, gpu.ErrInvalidValue)
	_, err = du.GraphAddKernelNodeBefore(g, p, deps(k, k))
	h.wantErr("a node before a node listed twice", err, gpu.ErrInvalidValue)
	other := h.graph(0)
	o := h.addKernel(other, nil, h.chainArgs(0, bufs, 0))
	_, err = du.GraphAddKernelNodeBefore(g, p, deps(k, o))
	h.wantErr("a node before a node of another graph", err, gpu.ErrInvalidValue)
	_, err = du.GraphAddKernelNodeBefore(g, p, deps(k, 0))
	h.wantErr("a node before node 0", err, gpu.ErrInvalidHandle)
	h.wantNodes("after the refused nodes", g, k, m)
	for _, n := range []gpu.GraphNode{k, m} {
		if d, err := h.b.GraphNodeDeps(n); err != nil || (n == k && len(d) != 0) || (n == m && !slices.Equal(d, deps(k))) {
			h.Errorf("a refused node changed the dependencies of %#x: %v, %v", uint64(n), d, err)
		}
	}

	x := h.instantiate(g)
	s := h.stream(0)
	h.wantErr("GraphUpload of exec 0", du.GraphUpload(0, s), gpu.ErrInvalidHandle)
	h.wantErr("GraphUpload on stream 0", du.GraphUpload(x, 0), gpu.ErrInvalidHandle)
	h.release(execKey(x))
	h.wantErr("GraphUpload of a destroyed exec", du.GraphUpload(x, s), gpu.ErrInvalidHandle)
}
