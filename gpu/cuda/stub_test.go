package cuda

import (
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

// stubDriver is a fake libcuda for tests and benchmarks without a GPU: a
// cu.Stub that answers every call with success, issues distinct handles
// through the output parameters of the calls that create things, and keeps
// the little state the backend reads back (current context, capture status,
// node types, host allocations). It does no device work.
type stubDriver struct {
	next    atomic.Uintptr // last handle issued
	current atomic.Uintptr // the context current "on the thread" (one for all threads)

	// fail, when set, is consulted before every call: a result other than
	// Success is returned instead of doing the call.
	fail func(name string) cu.Result

	mu        sync.Mutex
	calls     map[string]int // counted only while count is set
	count     atomic.Bool
	capturing map[uintptr]bool
	nodeTypes map[uintptr]cu.GraphNodeType
	hostMem   map[uintptr][]byte
	ranges    map[uintptr]stubRange // device allocations, by base

	// Graph structure, for the backend's comparison of refused child
	// graphs: nodes of each graph in insertion order, each node's
	// dependencies, child-graph nodes' graphs, kernel nodes' functions.
	graphNodes map[uintptr][]uintptr
	nodeDeps   map[uintptr][]uintptr
	childOf    map[uintptr]uintptr
	kernelFunc map[uintptr]uintptr
}

// stubRange is an allocation cuMemGetAddressRange_v2 reports: one made by
// cuMemAlloc_v2, or one a test added with addRange (another library's).
type stubRange struct {
	size  uint64
	plain bool // a plain cuMemAlloc allocation (legacy IPC capable)
}

// addRange makes the stub report an allocation [base, base+size) that the
// backend did not make, as another library's memory.
func (sd *stubDriver) addRange(base uintptr, size uint64, plain bool) {
	sd.mu.Lock()
	sd.ranges[base] = stubRange{size: size, plain: plain}
	sd.mu.Unlock()
}

// rangeAt returns the allocation holding p.
func (sd *stubDriver) rangeAt(p uintptr) (uintptr, stubRange, bool) {
	sd.mu.Lock()
	defer sd.mu.Unlock()
	for base, r := range sd.ranges {
		if p >= base && uint64(p-base) < r.size {
			return base, r, true
		}
	}
	return 0, stubRange{}, false
}

const stubCtx = 0xc0_0000 // the primary context of device 0; device d gets stubCtx+d

func newStubDriver() *stubDriver {
	return &stubDriver{capturing: map[uintptr]bool{}, nodeTypes: map[uintptr]cu.GraphNodeType{},
		hostMem: map[uintptr][]byte{}, calls: map[string]int{}, ranges: map[uintptr]stubRange{},
		graphNodes: map[uintptr][]uintptr{}, nodeDeps: map[uintptr][]uintptr{}, childOf: map[uintptr]uintptr{},
		kernelFunc: map[uintptr]uintptr{}}
}

// newStubBackend opens a backend over a fresh stub driver with one device,
// closed (and checked for leaks) at the end of the test.
func newStubBackend(tb testing.TB) (*Backend, *stubDriver) {
	tb.Helper()
	sd := newStubDriver()
	b, err := openDriver(cu.NewStub("stub-libcuda", sd.call), resolveOptions(Config{}))
	if err != nil {
		tb.Fatalf("open over the stub driver: %v", err)
	}
	tb.Cleanup(func() {
		if c := b.LiveHandles(); !c.IsZero() {
			tb.Errorf("leak: %v", c)
		}
		if err := b.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return b, sd
}

// callCount returns how many times name was called since counting began.
func (sd *stubDriver) callCount(name string) int {
	sd.mu.Lock()
	defer sd.mu.Unlock()
	return sd.calls[name]
}

func (sd *stubDriver) startCounting() {
	sd.mu.Lock()
	sd.calls = map[string]int{}
	sd.mu.Unlock()
	sd.count.Store(true)
}

func (sd *stubDriver) handle() uintptr { return sd.next.Add(1) << 4 }

// out returns argument i as a pointer to T (an output parameter).
func out[T any](a *cu.StubArgs, i int) *T {
	return *(*(*T))(unsafe.Pointer(&a.A[i]))
}

func (sd *stubDriver) call(name string, a cu.StubArgs) cu.Result {
	if sd.fail != nil {
		if r := sd.fail(name); r != cu.Success {
			return r
		}
	}
	if sd.count.Load() {
		sd.mu.Lock()
		sd.calls[name]++
		sd.mu.Unlock()
	}
	switch name {
	// Hot calls first; they read nothing and write nothing.
	case "cuLaunchKernel", "cuGraphLaunch", "cuGraphExecKernelNodeSetParams_v2", "cuGraphExecMemcpyNodeSetParams",
		"cuStreamWriteValue64_v2", "cuEventRecord", "cuMemcpyDtoDAsync_v2":
		return cu.Success
	case "cuCtxGetCurrent":
		*out[cu.Context](&a, 0) = cu.Context(sd.current.Load())
	case "cuCtxSetCurrent":
		sd.current.Store(a.A[0])
	case "cuDriverGetVersion":
		*out[int32](&a, 0) = 13000
	case "cuDeviceGetCount":
		*out[int32](&a, 0) = 1
	case "cuDeviceGet":
		*out[cu.Device](&a, 0) = cu.Device(a.A[1])
	case "cuDeviceGetName":
		copy(unsafe.Slice(out[byte](&a, 0), a.A[1]), "Stub GPU\x00")
	case "cuDeviceTotalMem_v2":
		*out[uint64](&a, 0) = 80 << 30
	case "cuDeviceGetAttribute":
		v := int32(0)
		switch cu.DeviceAttribute(a.A[1]) {
		case cu.AttrComputeMajor:
			v = 9
		case cu.AttrVirtualMemoryManagement, cu.AttrCanUse64BitStreamMemOps, cu.AttrUnifiedAddressing:
			v = 1
		case cu.AttrMultiprocessorCount:
			v = 132
		}
		*out[int32](&a, 0) = v
	case "cuDevicePrimaryCtxRetain":
		*out[cu.Context](&a, 0) = cu.Context(stubCtx + a.A[1])
	case "cuMemGetInfo_v2":
		*out[uint64](&a, 0), *out[uint64](&a, 1) = 79<<30, 80<<30
	case "cuMemGetAllocationGranularity":
		*out[uint64](&a, 0) = 2 << 20
	case "cuCtxGetStreamPriorityRange":
		*out[int32](&a, 0), *out[int32](&a, 1) = 0, -5
	case "cuStreamCreateWithPriority", "cuEventCreate", "cuModuleLoadDataEx", "cuModuleGetFunction", "cuGraphCreate",
		"cuGraphInstantiateWithFlags", "cuMemCreate":
		*out[uintptr](&a, 0) = sd.handle()
	case "cuMemAlloc_v2":
		p := sd.handle() << 20 // 16 MiB apart: allocations of the tests are smaller
		*out[uintptr](&a, 0) = p
		sd.addRange(p, uint64(a.A[1]), true)
	case "cuMemFree_v2":
		sd.mu.Lock()
		delete(sd.ranges, a.A[0])
		sd.mu.Unlock()
	case "cuMemGetAddressRange_v2": // (base, size, p)
		base, r, ok := sd.rangeAt(a.A[2])
		if !ok {
			return cu.ErrorNotFound
		}
		*out[uintptr](&a, 0), *out[uint64](&a, 1) = base, r.size
	case "cuPointerGetAttribute": // (data, attr, p)
		_, r, ok := sd.rangeAt(a.A[2])
		switch {
		case !ok:
			return cu.ErrorInvalidValue
		case cu.PointerAttribute(a.A[1]) == cu.PointerAttrIsLegacyIPCCapable && r.plain:
			*out[int32](&a, 0) = 1
		default:
			*out[int32](&a, 0) = 0
		}
	case "cuMemAddressReserve":
		*out[uintptr](&a, 0) = sd.handle() << 20
	case "cuGraphAddKernelNode_v2", "cuGraphAddMemcpyNode", "cuGraphAddMemsetNode", "cuGraphAddChildGraphNode", "cuGraphAddEmptyNode":
		// (node, graph, deps, ndeps, params or child...)
		n := sd.handle()
		*out[uintptr](&a, 0) = n
		var deps []uintptr
		if a.A[3] > 0 {
			deps = append(deps, unsafe.Slice(out[uintptr](&a, 2), a.A[3])...)
		}
		sd.mu.Lock()
		sd.nodeTypes[n] = stubNodeTypes[name]
		sd.graphNodes[a.A[1]] = append(sd.graphNodes[a.A[1]], n)
		sd.nodeDeps[n] = deps
		switch name {
		case "cuGraphAddChildGraphNode":
			sd.childOf[n] = a.A[4] // the driver embeds a copy; the stub, the graph itself
		case "cuGraphAddKernelNode_v2":
			sd.kernelFunc[n] = uintptr(out[cu.KernelNodeParams](&a, 4).Func)
		}
		sd.mu.Unlock()
	case "cuGraphNodeGetType":
		sd.mu.Lock()
		*out[cu.GraphNodeType](&a, 1) = sd.nodeTypes[a.A[0]]
		sd.mu.Unlock()
	case "cuGraphGetNodes": // (graph, nodes, count)
		sd.mu.Lock()
		sd.list(sd.graphNodes[a.A[0]], out[uintptr](&a, 1), out[uint64](&a, 2))
		sd.mu.Unlock()
	case "cuGraphNodeGetDependencies_v2": // (node, deps, edges, count)
		sd.mu.Lock()
		sd.list(sd.nodeDeps[a.A[0]], out[uintptr](&a, 1), out[uint64](&a, 3))
		sd.mu.Unlock()
	case "cuGraphChildGraphNodeGetGraph": // (node, graph)
		sd.mu.Lock()
		*out[uintptr](&a, 1) = sd.childOf[a.A[0]]
		sd.mu.Unlock()
	case "cuGraphKernelNodeGetParams_v2": // (node, params): the function only
		sd.mu.Lock()
		out[cu.KernelNodeParams](&a, 1).Func = cu.Function(sd.kernelFunc[a.A[0]])
		sd.mu.Unlock()
	case "cuFuncGetParamInfo":
		// The layout of a (ptr, f32, i32) kernel such as fill.
		layout := [][2]uint64{{0, 8}, {8, 4}, {12, 4}}
		if a.A[1] >= uintptr(len(layout)) {
			return cu.ErrorInvalidValue
		}
		*out[uint64](&a, 2), *out[uint64](&a, 3) = layout[a.A[1]][0], layout[a.A[1]][1]
	case "cuStreamBeginCapture_v2":
		sd.mu.Lock()
		sd.capturing[a.A[0]] = true
		sd.mu.Unlock()
	case "cuStreamIsCapturing":
		sd.mu.Lock()
		st := cu.StreamCaptureStatusNone
		if sd.capturing[a.A[0]] {
			st = cu.StreamCaptureStatusActive
		}
		sd.mu.Unlock()
		*out[cu.StreamCaptureStatus](&a, 1) = st
	case "cuStreamEndCapture":
		sd.mu.Lock()
		delete(sd.capturing, a.A[0])
		sd.mu.Unlock()
		*out[uintptr](&a, 1) = sd.handle()
	case "cuMemHostAlloc":
		buf := make([]byte, a.A[1])
		p := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
		sd.mu.Lock()
		sd.hostMem[p] = buf // keeps it alive; Go's heap does not move it
		sd.mu.Unlock()
		*out[unsafe.Pointer](&a, 0) = unsafe.Pointer(unsafe.SliceData(buf))
	case "cuMemHostGetDevicePointer_v2":
		*out[uintptr](&a, 0) = a.A[1]
	case "cuMemFreeHost":
		sd.mu.Lock()
		delete(sd.hostMem, a.A[0])
		sd.mu.Unlock()
	}
	return cu.Success
}

// list answers a driver call that lists nodes: C's (array, *count)
// convention, with a nil array to count only.
func (sd *stubDriver) list(nodes []uintptr, array *uintptr, count *uint64) {
	if array != nil {
		copy(unsafe.Slice(array, min(int(*count), len(nodes))), nodes)
	}
	*count = uint64(len(nodes))
}

var stubNodeTypes = map[string]cu.GraphNodeType{"cuGraphAddKernelNode_v2": cu.GraphNodeKernel, "cuGraphAddMemcpyNode": cu.GraphNodeMemcpy,
	"cuGraphAddMemsetNode": cu.GraphNodeMemset, "cuGraphAddChildGraphNode": cu.GraphNodeGraph, "cuGraphAddEmptyNode": cu.GraphNodeEmpty}
