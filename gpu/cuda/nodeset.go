package cuda

import (
	"encoding/binary"
	"runtime"
	"unsafe"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

var (
	_ gpu.KernelNodeSets  = (*Backend)(nil)
	_ gpu.GraphNodeSetter = (*Backend)(nil)
	_ gpu.KernelNodeWords = (*kernelNodeSet)(nil)
)

// Kernel node sets (gpu.KernelNodeSet): the per-node exec updates of a step
// at the driver's own cost.
//
// GraphExecKernelNodeSetParams pays, per node, for two handle lookups under
// the backend's lock, the argument check against the kernel's spec, a frame
// from the pool, the packing of every argument into the driver's form, and a
// cuCtxGetCurrent to make the context current: on a moving step of a
// thousand nodes, more than the driver's own update. A set does the lookups,
// the checks and the packing once, at PrepareKernelNodes: each node keeps
// its CUDA_KERNEL_NODE_PARAMS and its arguments in the driver's form (every
// argument in its own 8-byte-aligned words, the void* array pointing at
// them) in memory of its own, and SetWord rewrites one word in place. Apply
// checks once that the exec and its graph are live, makes the context
// current once, and then makes one driver call per node.
//
// The memory a node lends the driver is the set's: Go heap memory, which
// the collector never moves, reachable from the set for as long as the set
// is (the driver copies the parameters at the call and keeps no pointer to
// them; see frame for the same reasoning).

// setNode is one node of a kernel node set.
type setNode struct {
	h     gpu.GraphNode
	n     cu.GraphNode
	fi    *funcInfo
	kp    cu.KernelNodeParams
	words []uint64         // the arguments in the driver's form
	ptrs  []unsafe.Pointer // ptrs[j] = &words[first[j]]
	first []int32          // per argument, its first word; len(args)+1 entries
	kinds []gpu.ArgKind    // per argument
	dev   bool             // device-updatable: a host change needs an upload
}

// kernelNodeSet is the CUDA gpu.KernelNodeSet.
type kernelNodeSet struct {
	b     *Backend
	x     gpu.GraphExec
	cx    cu.GraphExec
	graph gpu.Graph
	dev   int
	upd   *devExec
	nodes []setNode
	cur   cu.Context // cuCtxGetCurrent's output
}

// PrepareKernelNodes implements gpu.KernelNodeSets: every node must be a
// kernel node of the graph x was instantiated from, and every params[i] of
// a known function of x's device with arguments its kernel takes (checked
// here, as GraphExecKernelNodeSetParams checks them per call).
func (b *Backend) PrepareKernelNodes(x gpu.GraphExec, nodes []gpu.GraphNode, params []gpu.KernelParams) (gpu.KernelNodeSet, error) {
	const op = "PrepareKernelNodes"
	if len(nodes) != len(params) {
		return nil, errf(op, gpu.ErrInvalidValue, "%d nodes and %d parameter sets", len(nodes), len(params))
	}
	xi, err := b.exec(op, x)
	if err != nil {
		return nil, err
	}
	s := &kernelNodeSet{b: b, x: x, cx: xi.x, graph: xi.graph, dev: xi.dev, upd: xi.upd, nodes: make([]setNode, len(nodes))}
	words := 0
	for i, p := range params {
		_, cn, fi, err := b.execNode(op, x, nodes[i], gpu.NodeKernel, p.Func)
		if err != nil {
			return nil, err
		}
		fr := getFrame() // kernelParams' checks fill a frame; only they are wanted
		err = b.kernelParams(op, xi.dev, fi, p, fr)
		fr.release()
		if err != nil {
			return nil, err
		}
		sn := &s.nodes[i]
		sn.h, sn.n, sn.fi = nodes[i], cn, fi
		sn.dev = xi.upd != nil && xi.upd.nodes[cn]
		for j := range p.Args {
			words += slotWords(&p.Args[j])
		}
	}
	// One allocation for every node's words and one for the pointers.
	all := make([]uint64, words)
	nargs := 0
	for _, p := range params {
		nargs += len(p.Args)
	}
	allPtrs := make([]unsafe.Pointer, nargs)
	for i, p := range params {
		sn := &s.nodes[i]
		n := 0
		for j := range p.Args {
			n += slotWords(&p.Args[j])
		}
		sn.words, all = all[:n:n], all[n:]
		sn.ptrs, allPtrs = allPtrs[:len(p.Args):len(p.Args)], allPtrs[len(p.Args):]
		sn.first = make([]int32, len(p.Args)+1)
		sn.kinds = make([]gpu.ArgKind, len(p.Args))
		sn.pack(p.Args)
		c := p.Config
		sn.kp = cu.KernelNodeParams{
			Func: sn.fi.f, GridDimX: c.Grid.X, GridDimY: c.Grid.Y, GridDimZ: c.Grid.Z,
			BlockDimX: c.Block.X, BlockDimY: c.Block.Y, BlockDimZ: c.Block.Z, SharedMemBytes: c.SharedMem,
		}
		if b.setByKernel && sn.fi.kern != 0 {
			// The node as the library made it: its context-independent
			// kernel, in the device's context.
			sn.kp.Func, sn.kp.Kern, sn.kp.Ctx = 0, sn.fi.kern, b.devs[xi.dev].ctx
		}
		if len(sn.ptrs) > 0 {
			sn.kp.KernelParams = unsafe.Pointer(&sn.ptrs[0])
		}
	}
	return s, nil
}

// pack lays args out in sn's words (sized for them) as frame.pack does,
// and points sn's pointers at them.
func (sn *setNode) pack(args []gpu.Arg) {
	w := 0
	for j := range args {
		a := &args[j]
		sn.first[j] = int32(w)
		sn.kinds[j] = a.Kind
		sn.ptrs[j] = unsafe.Pointer(&sn.words[w])
		k := slotWords(a)
		clear(sn.words[w : w+k])
		if a.Kind == gpu.ArgBytes {
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&sn.words[w])), k*8), a.Raw)
		} else if a.Kind.Size() == 4 {
			sn.words[w] = uint64(uint32(a.Bits))
		} else {
			sn.words[w] = a.Bits
		}
		w += k
	}
	sn.first[len(args)] = int32(w)
}

func (s *kernelNodeSet) Len() int { return len(s.nodes) }

// SetWord implements gpu.KernelNodeSet.
func (s *kernelNodeSet) SetWord(i, arg, off int, v uint64) error {
	if i < 0 || i >= len(s.nodes) || arg < 0 || arg >= len(s.nodes[i].kinds) {
		return errf("KernelNodeSet.SetWord", gpu.ErrInvalidValue, "node %d argument %d out of range", i, arg)
	}
	sn := &s.nodes[i]
	size := 8 * int(sn.first[arg+1]-sn.first[arg])
	switch k := sn.kinds[arg]; {
	case k == gpu.ArgBytes && off >= 0 && off+8 <= size:
		if off%8 == 0 {
			sn.words[int(sn.first[arg])+off/8] = v
		} else {
			b := unsafe.Slice((*byte)(unsafe.Pointer(&sn.words[sn.first[arg]])), size)
			binary.LittleEndian.PutUint64(b[off:], v)
		}
	case k != gpu.ArgBytes && off == 0 && k.Size() == 8:
		sn.words[sn.first[arg]] = v
	default:
		return errf("KernelNodeSet.SetWord", gpu.ErrInvalidValue, "no 8-byte word at byte %d of argument %d (%s)", off, arg, k)
	}
	return nil
}

// Word implements gpu.KernelNodeWords: the word of sn.words that SetWord
// would write, for a typed pointer-sized argument or 8 aligned bytes of an
// opaque one.
func (s *kernelNodeSet) Word(i, arg, off int) (*uint64, error) {
	if i < 0 || i >= len(s.nodes) || arg < 0 || arg >= len(s.nodes[i].kinds) {
		return nil, errf("KernelNodeSet.Word", gpu.ErrInvalidValue, "node %d argument %d out of range", i, arg)
	}
	sn := &s.nodes[i]
	size := 8 * int(sn.first[arg+1]-sn.first[arg])
	switch k := sn.kinds[arg]; {
	case k == gpu.ArgBytes && off >= 0 && off+8 <= size && off%8 == 0:
		return &sn.words[int(sn.first[arg])+off/8], nil
	case k != gpu.ArgBytes && off == 0 && k.Size() == 8:
		return &sn.words[sn.first[arg]], nil
	}
	return nil, errf("KernelNodeSet.Word", gpu.ErrInvalidValue, "no aligned 8-byte word at byte %d of argument %d (%s)", off, arg, sn.kinds[arg])
}

// SetArgs implements gpu.KernelNodeSet. Opaque arguments of another size
// lay the node out anew.
func (s *kernelNodeSet) SetArgs(i int, args []gpu.Arg) error {
	const op = "KernelNodeSet.SetArgs"
	if i < 0 || i >= len(s.nodes) {
		return errf(op, gpu.ErrInvalidValue, "node %d out of range", i)
	}
	sn := &s.nodes[i]
	if len(args) != len(sn.kinds) {
		return errf(op, gpu.ErrInvalidValue, "%d arguments, the node was prepared with %d", len(args), len(sn.kinds))
	}
	words := 0
	for j := range args {
		if args[j].Kind != sn.kinds[j] {
			return errf(op, gpu.ErrInvalidValue, "argument %d is %s, prepared as %s", j, args[j].Kind, sn.kinds[j])
		}
		words += slotWords(&args[j])
	}
	if err := s.b.checkArgs(op, sn.fi, 0, args); err != nil {
		return err
	}
	if words != len(sn.words) {
		sn.words = make([]uint64, words)
	}
	sn.pack(args)
	return nil
}

// live checks that the exec and the graph its nodes belong to are live (a
// destroyed graph's nodes are gone, and so are per-node updates naming
// them), once per Apply.
func (s *kernelNodeSet) live(op string) error {
	s.b.mu.Lock()
	_, xok := s.b.mu.execs[s.x]
	_, gok := s.b.mu.graphs[s.graph]
	s.b.mu.Unlock()
	switch {
	case !xok:
		return errNoExec(op, s.x)
	case !gok:
		return errf(op, gpu.ErrInvalidHandle, "graph %#x, whose nodes the set updates, is not live", uint64(s.graph))
	}
	return nil
}

// Apply implements gpu.KernelNodeSet: one cuGraphExecKernelNodeSetParams_v2
// per node, the context made current once.
func (s *kernelNodeSet) Apply(idx []int32) (int, error) {
	const op = "KernelNodeSet.Apply"
	if err := s.check(op, idx); err != nil || len(idx) == 0 {
		return 0, err
	}
	if err := s.b.enterCtx(s.b.devs[s.dev].ctx, &s.cur); err != nil {
		return 0, err
	}
	for k, i := range idx {
		sn := &s.nodes[i]
		if r := s.b.d.GraphExecKernelNodeSetParams(s.cx, sn.n, &sn.kp); r != cu.Success {
			runtime.UnlockOSThread()
			err := s.b.check("cuGraphExecKernelNodeSetParams_v2", r)
			s.markDirty(idx[:k])
			if isInvalidValue(err, "cuGraphExecKernelNodeSetParams_v2") {
				err = s.b.kernelUpdateRefusal(op, s.dev, sn.h, sn.n, sn.fi, err)
			}
			return k, err
		}
	}
	runtime.UnlockOSThread()
	s.markDirty(idx)
	return len(idx), nil
}

// check refuses, before any driver call, indexes out of range and a set
// whose exec or graph is gone.
func (s *kernelNodeSet) check(op string, idx []int32) error {
	for _, i := range idx {
		if i < 0 || int(i) >= len(s.nodes) {
			return errf(op, gpu.ErrInvalidValue, "node %d out of range", i)
		}
	}
	if len(idx) == 0 {
		return nil
	}
	return s.live(op)
}

// markDirty records that device-updatable nodes among idx changed on the
// host (their device-side parameters need an upload, devupdate.go).
func (s *kernelNodeSet) markDirty(idx []int32) {
	if s.upd == nil {
		return
	}
	for _, i := range idx {
		if s.nodes[i].dev {
			s.upd.dirty.Store(true)
			return
		}
	}
}

// ApplyGraph implements gpu.KernelNodeSet: one cuGraphKernelNodeSetParams_v2
// per node, on the graph the exec was made from.
func (s *kernelNodeSet) ApplyGraph(idx []int32) (int, error) {
	const op = "KernelNodeSet.ApplyGraph"
	if !s.b.d.Has("cuGraphKernelNodeSetParams_v2") {
		return 0, errf(op, gpu.ErrNotSupported, "the driver has no cuGraphKernelNodeSetParams_v2")
	}
	if err := s.check(op, idx); err != nil || len(idx) == 0 {
		return 0, err
	}
	if err := s.b.enterCtx(s.b.devs[s.dev].ctx, &s.cur); err != nil {
		return 0, err
	}
	defer runtime.UnlockOSThread()
	for k, i := range idx {
		sn := &s.nodes[i]
		if r := s.b.d.GraphKernelNodeSetParams(sn.n, &sn.kp); r != cu.Success {
			return k, s.b.check("cuGraphKernelNodeSetParams_v2", r)
		}
	}
	return len(idx), nil
}

// Close implements gpu.KernelNodeSet: the set holds no driver object.
func (s *kernelNodeSet) Close() error {
	s.nodes = nil
	return nil
}

// kernelUpdateRefusal turns the driver's CUDA_ERROR_INVALID_VALUE for an exec
// update of kernel node n (cn; its function fi) into what it means: a
// refused change of function (an *gpu.UpdateError) or bad parameters (err).
func (b *Backend) kernelUpdateRefusal(op string, dev int, n gpu.GraphNode, cn cu.GraphNode, fi *funcInfo, err error) error {
	var kp cu.KernelNodeParams
	if b.onDevice(dev, func() error {
		if r := b.d.GraphKernelNodeGetParams(cn, &kp); r != cu.Success {
			return b.check("cuGraphKernelNodeGetParams_v2", r)
		}
		if kp.Func == 0 && kp.Kern != 0 {
			return b.check("cuKernelGetFunction", b.d.KernelGetFunction(&kp.Func, kp.Kern))
		}
		return nil
	}) != nil || fi == nil || kp.Func == fi.f {
		return err
	}
	return refused(op, gpu.UpdateFunctionChanged, n, err,
		"the driver refused to change the node's function (CUDA allows no change of context, nor to a function using dynamic parallelism, device-side graph launch or device-side update)")
}

// graphNode looks up node n of a live graph for a host-side parameter change
// of type want; it returns the node and its device.
func (b *Backend) graphNode(op string, n gpu.GraphNode, want gpu.NodeType) (*nodeInfo, int, error) {
	ni, dev, err := b.nodeDev(op, n)
	if err != nil {
		return nil, 0, err
	}
	if err := b.wantType(op, dev, ni, want); err != nil {
		return nil, 0, err
	}
	return ni, dev, nil
}

// GraphKernelNodeSetParams implements gpu.GraphNodeSetter: n's parameters in
// its graph; execs made from the graph take them only through
// GraphExecUpdate.
func (b *Backend) GraphKernelNodeSetParams(n gpu.GraphNode, p gpu.KernelParams) error {
	const op = "GraphKernelNodeSetParams"
	ni, dev, err := b.graphNode(op, n, gpu.NodeKernel)
	if err != nil {
		return err
	}
	fi, err := b.funcInfo(op, p.Func)
	if err != nil {
		return err
	}
	fr := getFrame()
	defer fr.release()
	if err := b.kernelParams(op, dev, fi, p, fr); err != nil {
		return err
	}
	return b.callFrame(fr, dev, "cuGraphKernelNodeSetParams_v2", func() cu.Result {
		return b.d.GraphKernelNodeSetParams(ni.n, &fr.kp)
	})
}

// GraphMemcpyNodeSetParams implements gpu.GraphNodeSetter.
func (b *Backend) GraphMemcpyNodeSetParams(n gpu.GraphNode, p gpu.MemcpyParams) error {
	const op = "GraphMemcpyNodeSetParams"
	ni, dev, err := b.graphNode(op, n, gpu.NodeMemcpy)
	if err != nil {
		return err
	}
	if p.Size == 0 {
		return errf(op, gpu.ErrInvalidValue, "memcpy node of 0 bytes")
	}
	fr := getFrame()
	defer fr.release()
	fr.cp = memcpyParams(p)
	return b.callFrame(fr, dev, "cuGraphMemcpyNodeSetParams", func() cu.Result {
		return b.d.GraphMemcpyNodeSetParams(ni.n, &fr.cp)
	})
}

// GraphMemsetNodeSetParams implements gpu.GraphNodeSetter.
func (b *Backend) GraphMemsetNodeSetParams(n gpu.GraphNode, m gpu.Memset) error {
	const op = "GraphMemsetNodeSetParams"
	ni, dev, err := b.graphNode(op, n, gpu.NodeMemset)
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
	return b.callFrame(fr, dev, "cuGraphMemsetNodeSetParams", func() cu.Result {
		return b.d.GraphMemsetNodeSetParams(ni.n, &fr.mp)
	})
}
