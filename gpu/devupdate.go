package gpu

// DevNode is a device-updatable kernel node as device code names it (CUDA's
// cudaGraphDeviceNode_t): a value that the host writes into tables the
// device reads, not a handle to release. Zero is no node.
type DevNode uint64

// DeviceUpdates is an optional interface: kernel nodes whose parameters
// device code may change while their graph runs (CUDA 12.4's
// device-updatable kernel nodes), so that pointers move without a host
// driver call per step. Use DeviceUpdatesOf to get it; without it, move
// pointers from the host (GraphExecKernelNodeSetParams).
//
// A kernel node opted in (GraphKernelNodeSetDeviceUpdatable) gets a DevNode.
// A kernel running on the device (for stablegraph, the patcher of package
// kernels) changes the node's parameters through the device runtime
// (DeviceRuntime, CUDA's cudaGraphKernelNodeSetParam); the change lives in
// the executable graph on the device and holds for later launches too. The
// updating kernel is added with GraphAddKernelNodeBefore: every node it
// changes must run after it, so that the change takes effect in the same
// launch; the nodes that need no change may run beside it.
//
// CUDA's rules, which every backend enforces with the same errors:
//
//   - A node cannot opt out once in: GraphKernelNodeSetDeviceUpdatable(n,
//     false) on an opted-in node is ErrNotSupported (the driver answers
//     CUDA_ERROR_NOT_SUPPORTED; seen on driver 580).
//   - A graph with device-updatable nodes has at most one executable graph
//     at a time: a second GraphInstantiate before GraphExecDestroy of the
//     first is ErrNotSupported (the driver's answer too).
//   - Neither such a graph nor its executable graph may take part in a
//     whole-graph update: GraphExecUpdate refuses with an *UpdateError
//     (UpdateNotSupported, wrapping ErrGraphUpdate, so that a strategy
//     re-records as it does for any refused update; the driver answers
//     CUDA_ERROR_NOT_SUPPORTED, which the backend never lets it see).
//   - The executable graph must be uploaded (GraphUpload) before its first
//     launch, and again after any host-side change to its device-updatable
//     nodes (GraphExecKernelNodeSetParams): GraphLaunch before that is
//     ErrIllegalState. (CUDA requires it only when the graph updates its own
//     nodes; the driver does not check, and a launch without it may lose the
//     updates silently.) An upload resets the device-side parameters of
//     every device-updatable node to the host-side ones. A host-side change
//     to a node that is not device-updatable needs no upload and leaves the
//     device-side parameters of the others as they are (conformance group
//     DeviceUpdates, HostChangeKeepsDeviceState).
//   - Device-updatable nodes cannot be removed from their graph; package gpu
//     has no node removal, so this rule cannot be broken through it.
//
// Beyond CUDA's documented rules, because CUDA does not say what becomes of
// device handles in copies: nodes of child graphs cannot opt in, a graph
// with device-updatable nodes cannot be embedded in another
// (GraphAddChildGraphNode), and the launch of its executable graph cannot be
// captured (GraphLaunch on a capturing stream): each is ErrNotSupported.
//
// Graph objects follow the serialisation rule of the Graphs interface.
type DeviceUpdates interface {
	// DeviceUpdatesSupported returns nil when device dev can run
	// device-side graph updates, else an error wrapping ErrNotSupported
	// that says why (an older driver, a missing entry point).
	DeviceUpdatesSupported(dev int) error
	// GraphKernelNodeSetDeviceUpdatable opts kernel node n of a top-level
	// graph in to device-side updates (updatable true) and returns its
	// DevNode; opting in again returns the same DevNode. Executable graphs
	// instantiated before the call are not affected. updatable false on a
	// node not opted in does nothing and returns 0.
	GraphKernelNodeSetDeviceUpdatable(n GraphNode, updatable bool) (DevNode, error)
	// GraphKernelNodeDevNode returns kernel node n's DevNode, read back
	// from the driver, or 0 when n has not opted in.
	GraphKernelNodeDevNode(n GraphNode) (DevNode, error)
	// GraphAddKernelNodeBefore adds a kernel node with parameters p and no
	// dependencies of its own, and makes every node of before (nodes of g,
	// each listed once) depend on it: it runs before them, and before
	// every node after them, in every launch; other nodes may run beside
	// it. With before empty it runs beside the whole graph. Where the new
	// node is listed by GraphNodes is backend-specific.
	GraphAddKernelNodeBefore(g Graph, p KernelParams, before []GraphNode) (GraphNode, error)
	// GraphUpload uploads executable graph x to its device, ordered on
	// stream s: see the rules above for when it is needed.
	GraphUpload(x GraphExec, s Stream) error
}

// DeviceRuntime is the part of CUDA's device runtime that a kernel's Go
// reference may call. A backend that models device-updatable kernel nodes
// passes references a Memory that also implements it; a reference that
// needs it and does not find it fails (the device has no such runtime).
type DeviceRuntime interface {
	Memory
	// GraphKernelNodeSetParam is cudaGraphKernelNodeSetParam: it writes
	// value at byte offset of device-updatable node n's kernel parameters,
	// in the executable graph instantiated from n's graph. The change holds
	// for every later run of the node, in the running launch too when the
	// node has not started yet. A node that does not exist, is on another
	// device, has no executable graph, or a range past the end of its
	// parameters is refused with an error wrapping ErrInvalidValue (CUDA's
	// cudaErrorInvalidValue), and nothing changes.
	GraphKernelNodeSetParam(n DevNode, offset uint64, value []byte) error
}
