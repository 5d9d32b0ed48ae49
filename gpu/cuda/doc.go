// Package cuda is stablegraph's CUDA backend: it implements gpu.Backend over
// the CUDA driver API, loaded at run time from libcuda through purego (no
// cgo), and registers itself as "cuda". cuBLAS and cuBLASLt, when present,
// serve the optional gpu.GEMM capability (gemm.go: cublasLtMatmul with the
// bias epilogue or cublasSgemm, whichever measures faster per shape and
// alignment class); without cuBLAS, Gemm reports gpu.ErrNotSupported and
// callers use the built-in kernels. libcublasLt is looked for beside the
// libcublas that loaded, then where libcublas is.
//
// The raw bindings live in package cu (symbols, C structs, result codes);
// this package owns lifetimes, contexts and errors, the split cudarc makes
// between its sys and safe layers.
//
// # Contexts
//
// Each device is used through its primary context, retained at Open and
// released at Close (and retained once more for the life of the process, so
// that opening and closing backends does not create and destroy contexts,
// which costs about 0.1 s each). Every driver call, including queries and
// destruction from other goroutines, runs through one helper (enter, behind
// onDevice, call and callFrame) that locks the goroutine to its OS thread and
// makes the handle's device context current there before the call.
//
// # Memory lent to the driver
//
// Output parameters, node parameter structs and kernel arguments in C form
// live in pooled frames (frame.go), so that launches, node updates and graph
// launches allocate nothing; frame.go says why they need no pinning. To know a handle's device, the backend
// records the device of every handle it issues (and of the graph nodes,
// child graphs and library kernels it discovers while inspecting graphs).
//
// # Handles
//
// gpu handles are the backend's own values, issued from a counter and never
// reused, mapped to the driver's objects in tables: CUDA reuses the
// addresses of destroyed streams, events and graphs, and a stale handle must
// not alias a newer object. A handle not in the tables (zero, never issued,
// already destroyed) is refused with gpu.ErrInvalidHandle before the driver
// sees it; the driver does not validate stale handles and may crash on them.
// The tables also count live handles (gpu.HandleCounter) and let Close
// release whatever is left. Device pointers are addresses, as in CUDA.
//
// # Virtual memory
//
// cuMemMap maps only whole driver allocations from offset 0, while MemMap
// maps any granule-aligned part of a chunk. So a chunk is one driver
// allocation per granule (MemCreate of N granules makes N allocations) and
// MemMap maps each granule of its range; MemUnmap and MemSetAccess cover a
// whole range in one call.
//
// # Errors
//
// Driver failures are *gpu.Error values with Op naming the C function
// ("cuMemAlloc_v2"), Code and CodeName the CUresult, Detail the driver's
// description, and Err the gpu sentinel the result maps to (errors.go).
// A symbol the installed driver lacks is gpu.ErrNotSupported naming the
// symbol.
//
// # Refused graph updates
//
// A graph exec update the driver refuses is a *gpu.UpdateError (wrapping
// gpu.ErrGraphUpdate only) that keeps the CUresult, as sim reports the same
// situations. cuGraphExecUpdate says why itself. The per-node updates
// (cuGraphExec*NodeSetParams) refuse with a bare CUDA_ERROR_INVALID_VALUE;
// since the backend checks every argument before calling them, it reads
// that result as a refusal: of the operands for memcpy and memset nodes
// (UpdateParametersChanged), of the change of function for kernel nodes
// (UpdateFunctionChanged; with the node's own function it stays bad input,
// gpu.ErrInvalidValue), and for child-graph nodes it compares the two graphs
// to report UpdateTopologyChanged, UpdateNodeTypeChanged or
// UpdateParametersChanged (refusal.go). A kernel of another device is
// refused before the driver is asked. None of this costs anything on an
// update the driver takes.
//
// # Allocation extents
//
// *Backend implements gpu.AddressRanger (extent.go): its own allocations and
// virtual memory from its tables, other libraries' plain cuMemAlloc
// allocations from cuMemGetAddressRange_v2, cached per allocation so that a
// runtime checking its bindings every step makes no driver call once warm.
// The extent of other libraries' virtual memory and pool memory cannot be
// known (gpu.ErrNotSupported), nor can memory they free and reallocate
// behind the backend's back; extent.go says what is and is not seen.
//
// # Device-side graph updates
//
// *Backend implements gpu.DeviceUpdates on drivers of CUDA 12.4 or newer
// (devupdate.go): CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE set and
// read back with cuGraphKernelNodeSetAttribute/GetAttribute, cuGraphUpload,
// and the patcher's edges through cuGraphAddDependencies. The
// backend enforces the rules of gpu.DeviceUpdates itself, before the driver
// sees the calls, from its handle tables. ModuleLoad asks a module's Code
// for a cubin of the device's compute capability first, then for PTX
// (gpu.ModuleImage.CodeFor): a cubin (the patcher of package kernels ships
// only those) is loaded as built, never JIT-compiled or linked; a device or
// driver that cannot run it is gpu.ErrNotSupported naming the device's
// compute capability.
//
// # Faults
//
// A fault in device code (an illegal address) poisons the CUDA context: every
// later call on that device fails and nothing short of a new process
// recovers. The backend reports the fault (gpu.ErrIllegalAddress) and does
// not offer a device reset.
//
// # Concurrency
//
// A *Backend is safe for concurrent use. Graphs and the execs made from them
// follow NVIDIA's rule, repeated in package gpu: one graph (and its execs)
// must not be used from two goroutines at once, not even to instantiate,
// clone or update; the caller serialises. A handle must not be destroyed
// while another goroutine still uses it. Stream capture uses
// CU_STREAM_CAPTURE_MODE_RELAXED, because goroutines move between OS threads
// and the thread-scoped modes would blame unrelated calls.
package cuda
