package gpu

import "time"

// Backend is an opened device backend: the small core every backend
// implements. Methods are grouped by concern into the interfaces below.
// Consumers that need only part should declare a small interface of their
// own.
//
// Everything a device may lack is an optional interface instead, found by
// type assertion in capability.go, whose helpers say what a caller does
// without it: virtual memory (VirtualMemory), host timeline memory and
// stream writes (StreamMemOps), stream waits, device-side graph updates,
// collectives, a GEMM library, allocation extents, graph node read-back,
// handle counts, device reset and fault injection.
//
// Backend is safe for concurrent use; see the package doc for the graph
// serialisation rule.
type Backend interface {
	// Name is the registered name of the backend ("sim", "cuda").
	Name() string
	// Close releases the backend. Handles still live are reported by the
	// error (when the backend counts them) and released.
	Close() error

	Devices
	Streams
	Events
	DeviceMemory
	Modules
	Graphs
}

// Devices enumerates devices.
type Devices interface {
	DeviceCount() int
	DeviceProps(dev int) (DeviceProps, error)
}

// Streams are in-order work queues.
type Streams interface {
	// StreamCreate creates a stream on dev. Priority follows CUDA: lower
	// numbers are higher priority; out-of-range values are clamped.
	StreamCreate(dev int, flags StreamFlags, priority int) (Stream, error)
	// StreamPriorityRange returns the least and greatest priority (CUDA:
	// least is 0, greatest is negative).
	StreamPriorityRange(dev int) (least, greatest int, err error)
	// StreamQuery reports whether all work submitted to s has completed. A
	// fault in that work is returned as the error.
	StreamQuery(s Stream) (idle bool, err error)
	// StreamSynchronize waits for all work submitted to s. On a capturing
	// stream it fails with ErrCaptureInvalidated and breaks the capture, as
	// CUDA does.
	StreamSynchronize(s Stream) error
	// StreamWaitEvent makes later work on s wait for e's last record.
	StreamWaitEvent(s Stream, e Event) error
	// StreamDestroy destroys s once its pending work completes.
	StreamDestroy(s Stream) error
}

// Events mark points in streams.
type Events interface {
	EventCreate(dev int, flags EventFlags) (Event, error)
	EventRecord(e Event, s Stream) error
	// EventQuery reports whether the work before e's last record completed.
	EventQuery(e Event) (done bool, err error)
	EventSynchronize(e Event) error
	// EventElapsed is the time between two completed records.
	EventElapsed(start, end Event) (time.Duration, error)
	EventDestroy(e Event) error
}

// DeviceMemory is plain device memory.
type DeviceMemory interface {
	MemAlloc(dev int, size uint64) (DevicePtr, error)
	// MemFree frees an allocation made by MemAlloc; a pointer that is not
	// the start of a live allocation is ErrInvalidHandle.
	MemFree(p DevicePtr) error
	// MemGetInfo reports free and total device memory in bytes.
	MemGetInfo(dev int) (free, total uint64, err error)

	// Synchronous copies return once the copy is done. Whether they also
	// wait for work on other streams is backend-specific (CUDA's legacy
	// default stream does; sim does not): order them with a stream
	// synchronization when it matters.
	MemcpyHtoD(dst DevicePtr, src []byte) error
	MemcpyDtoH(dst []byte, src DevicePtr) error
	MemcpyDtoD(dst, src DevicePtr, size uint64) error
	Memset(m Memset) error

	// Asynchronous copies are ordered on s. The host slice must stay alive
	// and unmodified (for DtoH: unread) until the stream passes the copy.
	MemcpyHtoDAsync(dst DevicePtr, src []byte, s Stream) error
	MemcpyDtoHAsync(dst []byte, src DevicePtr, s Stream) error
	MemcpyDtoDAsync(dst, src DevicePtr, size uint64, s Stream) error
	MemsetAsync(m Memset, s Stream) error
}

// VirtualMemory is an optional interface: physical chunks mapped into
// reserved address ranges (CUDA's VMM). Sizes, offsets and addresses must
// be multiples of the device's granularity. A backend may implement it and
// still lack it on some devices: AllocationGranularity then returns an
// error wrapping ErrNotSupported. Get it with VirtualMemoryOf
// (capability.go), which says what to do without it.
type VirtualMemory interface {
	// AllocationGranularity is dev's granularity, or an error wrapping
	// ErrNotSupported when dev has no virtual memory management.
	AllocationGranularity(dev int) (uint64, error)
	// MemCreate creates a physical chunk of size bytes on dev.
	MemCreate(dev int, size uint64) (PhysMem, error)
	// MemRelease releases a chunk. Like CUDA, a chunk that is still mapped
	// stays alive until its last mapping is unmapped.
	MemRelease(h PhysMem) error
	// MemAddressReserve reserves a virtual address range. align 0 means
	// the granularity.
	MemAddressReserve(size, align uint64) (DevicePtr, error)
	// MemAddressFree frees a reservation; it must be wholly unmapped.
	MemAddressFree(p DevicePtr, size uint64) error
	// MemMap maps size bytes of h starting at offset at p, inside a
	// reservation, over a range not already mapped.
	MemMap(p DevicePtr, size, offset uint64, h PhysMem) error
	// MemUnmap unmaps a range that was mapped by one or more MemMap calls
	// (it must cover whole mappings).
	MemUnmap(p DevicePtr, size uint64) error
	// MemSetAccess grants read-write access to a mapped range to each
	// device in devs. Device code touching a mapping from a device without
	// access faults.
	MemSetAccess(p DevicePtr, size uint64, devs []int) error
}

// StreamMemOps is an optional interface: host-visible timeline memory and
// stream-ordered writes into it. A backend may implement it and still lack
// it on some devices: StreamMemOpsSupported then returns an error wrapping
// ErrNotSupported. Get it with StreamMemOpsOf (capability.go), which says
// what to do without it.
type StreamMemOps interface {
	// StreamMemOpsSupported returns nil when streams of dev can write
	// values (StreamWriteValue64), else an error wrapping ErrNotSupported
	// that says why.
	StreamMemOpsSupported(dev int) error
	// HostAlloc allocates size bytes of pinned host memory mapped into the
	// device address space, zeroed.
	HostAlloc(size uint64) (HostMem, error)
	HostFree(h HostAlloc) error
	// StreamWriteValue64 writes v to the 8 bytes at p (8-byte aligned) when
	// s reaches this point; the write is visible to the host after that.
	StreamWriteValue64(s Stream, p DevicePtr, v uint64) error
}

// Modules load kernels and launch them.
type Modules interface {
	ModuleLoad(dev int, img *ModuleImage) (Module, error)
	// ModuleUnload unloads m. Its functions become invalid handles.
	ModuleUnload(m Module) error
	// ModuleFunction looks up a kernel by name (ErrNotFound if absent).
	ModuleFunction(m Module, name string) (Function, error)
	// FuncName is the kernel's name.
	FuncName(f Function) (string, error)
	// FuncParamInfo is the parameter layout, in order, as the driver sees
	// it (offsets and sizes, no types).
	FuncParamInfo(f Function) ([]ParamInfo, error)
	// LaunchKernel enqueues f on s. Arguments are checked against the
	// kernel's spec: a wrong count or kind is ErrInvalidValue.
	LaunchKernel(f Function, cfg LaunchConfig, args []Arg, s Stream) error
}

// Graphs record work once and replay it with one launch.
//
// A Graph and the GraphExecs made from it must not be used concurrently
// (NVIDIA: graph objects are not thread safe, even for instantiate, clone
// and update); the caller serialises.
type Graphs interface {
	GraphCreate(dev int) (Graph, error)
	// GraphDestroy destroys g and its nodes. Exec graphs made from it stay
	// valid.
	GraphDestroy(g Graph) error

	// Node construction. deps must be nodes of g.
	GraphAddKernelNode(g Graph, deps []GraphNode, p KernelParams) (GraphNode, error)
	GraphAddMemcpyNode(g Graph, deps []GraphNode, p MemcpyParams) (GraphNode, error)
	GraphAddMemsetNode(g Graph, deps []GraphNode, p Memset) (GraphNode, error)
	// GraphAddChildGraphNode embeds a copy of child; later changes to
	// child do not affect g.
	GraphAddChildGraphNode(g Graph, deps []GraphNode, child Graph) (GraphNode, error)
	GraphAddEmptyNode(g Graph, deps []GraphNode) (GraphNode, error)

	// Inspection, for patching captured graphs.
	GraphNodes(g Graph) ([]GraphNode, error)
	GraphNodeType(n GraphNode) (NodeType, error)
	GraphNodeDeps(n GraphNode) ([]GraphNode, error)
	// GraphKernelNodeParams returns a kernel node's parameters. For nodes
	// made from typed launches the Args are typed; for nodes the backend
	// cannot type (captured library kernels on CUDA) each Arg is ArgBytes,
	// laid out by FuncParamInfo.
	GraphKernelNodeParams(n GraphNode) (KernelParams, error)
	// GraphChildGraph returns the graph embedded in a child-graph node
	// (owned by the node: do not destroy it).
	GraphChildGraph(n GraphNode) (Graph, error)

	// Stream capture: work submitted to s between begin and end becomes
	// a new graph instead of running.
	StreamBeginCapture(s Stream) error
	StreamEndCapture(s Stream) (Graph, error)
	StreamIsCapturing(s Stream) (bool, error)

	GraphInstantiate(g Graph) (GraphExec, error)
	GraphExecDestroy(x GraphExec) error
	GraphLaunch(x GraphExec, s Stream) error
	// GraphExecUpdate applies g's parameters to x. g must have x's topology
	// (same nodes, types and edges, in creation order); otherwise it
	// returns an *UpdateError and x is unchanged.
	GraphExecUpdate(x GraphExec, g Graph) error

	// Per-node updates of an exec graph, n naming the node in the graph x
	// was instantiated from. They take effect at the next launch.
	//
	// A change an instantiated graph cannot take is refused with an
	// *UpdateError naming n, as CUDA documents: a kernel of another device
	// (UpdateFunctionChanged); memcpy or memset operands in memory of
	// another device than the node's, or in no live allocation
	// (UpdateParametersChanged; mapped host memory is taken in place of
	// device memory, as the CUDA driver takes it; a memset's element size may be
	// refused the same way); a child graph of another topology or node
	// types (UpdateTopologyChanged, UpdateNodeTypeChanged) or breaking
	// these rules in its nodes. Bad arguments are ErrInvalidValue.
	GraphExecKernelNodeSetParams(x GraphExec, n GraphNode, p KernelParams) error
	GraphExecMemcpyNodeSetParams(x GraphExec, n GraphNode, p MemcpyParams) error
	GraphExecMemsetNodeSetParams(x GraphExec, n GraphNode, p Memset) error
	// GraphExecChildGraphNodeSetParams replaces the child's parameters;
	// child must have the same topology as the node's graph.
	GraphExecChildGraphNodeSetParams(x GraphExec, n GraphNode, child Graph) error
}

// FaultInjector is implemented by backends that can fail calls on request
// (sim). Tests sweep error paths with it: fail call nth (0 = the next) of
// entry point op (a Backend method name), count calls with Calls, and check
// that nothing leaked. The injected error wraps ErrInjected and err.
type FaultInjector interface {
	InjectFault(op string, nth int, err error)
	ClearFaults()
	Calls(op string) int
}

// DeviceResetter is implemented by backends on which a device survives a
// fault (sim): ResetDevice clears the sticky fault. On CUDA a fault is fatal
// to the context, so tests that fault on purpose need this interface.
type DeviceResetter interface {
	ResetDevice(dev int) error
}

// HandleCounter is implemented by backends that count live handles (sim
// always; cuda for the handles it issued). Tests assert the counts return to
// zero.
type HandleCounter interface {
	LiveHandles() HandleCounts
}
