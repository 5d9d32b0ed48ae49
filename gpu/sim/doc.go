// Package sim is the embedded pure-Go backend of stablegraph, registered as
// "sim". It is a model of a CUDA device, not a mock: work really runs (kernels
// are the Go references of their KernelSpec), asynchronously and in stream
// order, against a checked 64-bit address space, and it reports what a real
// GPU would silently corrupt. Open it with New(Config{...}), or with
// gpu.Open("sim", cfg) with a Config in cfg.Backends. It reads no
// environment.
//
// # Address space
//
// One virtual address space is shared by all devices (UVA). Addresses come
// from a cursor that only grows, starting at 1<<44, so address 0 is never
// mapped and a freed range is never handed out again: a use after free
// always faults, and faults as "freed" (the last 32768 or more freed ranges
// are remembered; older ones fault as "unmapped"). Every region is followed
// by an unmapped guard gap, so an overrun faults instead of landing in the
// neighbouring allocation.
//
//   - MemCreate makes a physical chunk of device memory (a multiple of the
//     2 MiB Granularity), charged against Config.DeviceMemory; more than
//     that is gpu.ErrOutOfMemory. Pages are allocated on first write (unwritten
//     memory reads as zero), so large chunks cost little until used.
//   - MemAddressReserve reserves a granularity-aligned range. MemMap maps
//     [offset, offset+size) of a chunk at an unmapped, aligned range inside
//     one reservation. A mapping starts with no access: until MemSetAccess
//     grants a device access, device work touching it faults, as in CUDA.
//     MemUnmap and MemSetAccess take ranges made of whole mappings (several
//     contiguous ones are fine). MemRelease of a mapped chunk removes its
//     handle at once; the memory lives (and stays charged) until its last
//     mapping is unmapped. MemAddressFree needs the whole, unmapped
//     reservation (gpu.ErrIllegalState while mapped).
//   - MemAlloc returns a 256-byte aligned allocation of exactly size bytes
//     (an access past size faults), accessible from its own device only:
//     sim models no peer access for plain allocations.
//   - HostAlloc returns Go memory (8-byte aligned) that is also mapped into
//     the address space at HostMem.Ptr, accessible from every device.
//     StreamWriteValue64 stores into it atomically, so a host polling with
//     HostMem.Load64 never sees a torn value.
//
// # What is checked
//
// Every access of device work (a kernel's gpu.Memory Read and Write, async
// copies and memsets, graph nodes, value writes) must lie wholly in mapped,
// live memory accessible from the device doing it; it may span several
// contiguous mappings. Otherwise nothing is written and the work fails with a
// *gpu.FaultError naming the kernel ("memcpy", "memset" and "writeValue64"
// for those operations), the first bad address, the access size, the device
// and the reason: "unmapped", "freed", "no access from device N".
//
// An event's time (EventElapsed) is when its stream reached it, as a
// device's: the later of its EventRecord and the end of the command before
// it on the stream. An event recorded on an idle stream is thus timed at
// its recording, however late the stream's worker goroutine runs on a busy
// host, and the time between two events covers the host's work between
// their records.
//
// Faults are sticky per device, as on a GPU: the device's later work is
// skipped (event records still complete, so nobody waits forever), and every
// later synchronizing or submitting call on that device (StreamSynchronize,
// StreamQuery, EventSynchronize, EventQuery, synchronous copies and memsets,
// LaunchKernel, GraphLaunch, the async copies, EventRecord, StreamWaitEvent,
// StreamWriteValue64, StreamBeginCapture) returns an error wrapping the fault
// until (*Backend).ResetDevice (gpu.DeviceResetter, which gpu.Backend
// lacks: the error says so, and that closing and reopening the backend
// also recovers). An error returned by a kernel reference that
// is not a fault (a launch too small for its problem) is sticky the same way,
// as an *gpu.Error for "LaunchKernel" wrapping it; a panicking reference is
// one too, wrapping gpu.ErrDeviceLost. Creating, destroying, freeing and
// releasing still work on a faulted device, so tests can clean up.
//
// Every handle that is zero, unknown, of another kind, or already destroyed
// is gpu.ErrInvalidHandle in a *gpu.Error naming the entry point (a double
// free included). Nothing panics on bad input.
//
// # Streams and events
//
// Each stream has one worker goroutine, which runs its work in submission
// order and sleeps when idle; different streams run concurrently. Events
// complete when their stream reaches them, with time.Now() as their time.
// StreamWaitEvent orders work across streams and devices. Priorities (range
// 0 to -5, clamped) are kept but do not affect scheduling. StreamDestroy waits
// for the stream's queued work.
//
// StreamWaitValue64 (gpu.StreamWaits, streamwait.go) holds a stream's later
// work until a word of host or device memory reaches a value (CUDA's cyclic
// greater-or-equal): the worker polls the word, as a GPU's front end does,
// yielding then sleeping up to 200 µs between reads, until the value is
// there, the device faults or the backend closes. Memory freed under a
// waiting stream faults the device at the next read ("waitValue64"). Unlike
// CUDA, whose StreamDestroy returns at once, destroying a stream held by a
// wait nobody will satisfy blocks (StreamDestroy waits for the queue): open
// the gate first. On a capturing stream the wait is refused with
// gpu.ErrNotSupported and the capture goes on.
//
// Asynchronous host copies touch the caller's slice when the stream reaches
// them: MemcpyHtoDAsync reads it then, so it must stay alive and unmodified
// until the stream passes the copy; MemcpyDtoHAsync writes it then.
//
// # Capture
//
// Between StreamBeginCapture and StreamEndCapture, work submitted to the
// stream becomes graph nodes instead of running: LaunchKernel (kernel),
// MemcpyDtoDAsync (memcpy), MemsetAsync (memset), StreamWriteValue64
// (NodeMemWriteValue) and GraphLaunch (a child graph holding a copy of what
// the exec graph would run now). Each stream of a capture has a dependency
// set, the nodes its next node depends on; a new node replaces it.
// Capture spans streams as in CUDA: EventRecord on a capturing stream marks
// the stream's point in the capture (nothing is queued; EventQuery and
// EventSynchronize on such an event are gpu.ErrIllegalState), and
// StreamWaitEvent on that event forks another stream into the capture, or
// joins the event's dependencies into a stream already in it.
// StreamEndCapture, on the origin stream only, ends the capture on all its
// streams; a forked stream with work not joined back into the origin makes
// it fail with gpu.ErrCaptureInvalidated (CUDA's "unjoined").
//
// Host copies (MemcpyHtoDAsync, MemcpyDtoHAsync), StreamSynchronize and
// StreamQuery on a capturing stream, waiting on an event recorded outside the
// capture, and destroying a forked stream invalidate the capture: they
// return gpu.ErrCaptureInvalidated, later work on its streams returns the
// same error, and StreamEndCapture ends it with gpu.ErrCaptureInvalidated and
// no graph. Ending a capture that was not begun, or beginning one on a
// stream already capturing, is gpu.ErrIllegalState. A call refused for bad
// arguments leaves the capture valid.
//
// # Graphs
//
// Nodes run in creation order, which is a topological order because
// dependencies must be earlier nodes of the same graph. A child-graph node
// owns a deep copy of the graph it was given. GraphInstantiate snapshots the
// graph; GraphLaunch queues the exec graph's parameters as they are at that
// moment. GraphExecUpdate and the per-node updates follow CUDA's documented
// rules (same node count, edges and node types, child graphs recursively;
// kernels on the same device; memsets of the same element size; memcpy and
// memset operands in live memory of the same device as when the node was
// instantiated or last updated; mapped host memory may stand in for device
// memory either way, as the CUDA driver 580 takes it although its
// documentation says the kind may not change), change only the
// exec graph, leave it unchanged when refused, and affect later launches
// only. A refusal is a *gpu.UpdateError saying why, as the cuda backend
// reports the same situations; a per-node one names the node updated. Bad
// arguments (a wrong node type, argument kinds, a 3-byte memset) are
// gpu.ErrInvalidValue instead. Updates copy an exec's node list at most
// once per launch, so patching n nodes costs O(n) plus one copy.
//
// # Allocation extents
//
// *Backend implements gpu.AddressRanger (extent.go): it sees every
// allocation, so AddressRange always answers, from the address space under
// its read lock.
//
// # Device-side graph updates
//
// *Backend implements gpu.DeviceUpdates (devupdate.go) with CUDA's rules and
// errors, listed in that interface's doc. An exec's device-updatable nodes
// have device-side parameters apart from the exec's own (host-side) ones:
// GraphUpload sets them, when its stream reaches it, to the host-side ones;
// kernels change them through the device runtime (their gpu.Memory is also a
// gpu.DeviceRuntime, so the patcher of package kernels runs on its Go
// reference); a launch runs each such node with them as the node starts, so
// a change by an earlier node of the same launch takes effect in it. A
// kernel that changes a node of its own launch that does not depend on it
// (on a GPU, a race) fails with a sticky gpu.ErrIllegalState. Stricter than
// CUDA: an upload is required before every launch that follows a host-side
// change of such a node, not only when the graph updates itself; and the
// node of GraphAddKernelNodeBefore is listed first by GraphNodes.
//
// # Collectives
//
// *Backend implements gpu.Collectives with its devices as the ranks: every
// rank of a communicator is a device of the same Backend. A collective is a
// launch of an internal kernel, so it is captured as a kernel node like any
// library kernel, and completes once every rank's stream has reached it;
// results are exact (reductions in rank order). Waits for other ranks end
// at SetCommTimeout's deadline. See collectives.go for the model.
//
// Given a Transport (Config.Transport, SetTransport), the ranks are
// processes instead, one per process, each a sim of its own, exchanging
// their data through the transport (internal/netsim makes one of a
// rendezvous group): the same kernel, checks and reduction, so the same
// bits, and every other capability of the sim is kept. See transport.go.
//
// # GEMM library
//
// *Backend implements gpu.GEMM with a model of cuBLAS (blas.go): its
// kernels take opaque parameter structs (gpu.ArgBytes, laid out by
// FuncParamInfo), are chosen by shape (a small output with a long K is
// split into partial products in the workspace and a reduction: two
// kernels, bits of their own), by alignment (a vectorised kernel at
// 16-byte aligned pointers, which faults on a misaligned one, else a scalar
// kernel computing the same bits) and by the workspace's size. A call given
// no workspace uses the library's own when eager and allocates one inside
// the capture when captured: mem-alloc and mem-free nodes around its
// kernels, at a new address in every capture, as cuBLAS 12.2+ does. A graph
// holding memory nodes runs, but cannot be a child graph (CUDA refuses it),
// and an exec update cannot move its allocation. A product's bits are
// those of the plain loop (each element a float32 sum from +0 over K in
// order; the split sums its parts in order), whatever the blocking, the
// goroutines it is shared over (up to GOMAXPROCS) or the other streams
// running (gemm.go), so the same call always gives the same bits. GraphMemcpyNodeParams and
// GraphMemsetNodeParams (gpu.GraphNodeReader) read copy and memset nodes
// back.
//
// # Testing hooks
//
// Beyond gpu.Backend, *Backend has InjectFault (fail the Nth call of an entry
// point, once), ClearFaults, Calls (calls per entry point since New),
// StallTimeline (value writes complete without writing: a hung GPU),
// ResetDevice (clear a sticky fault) and LiveHandles (gpu.HandleCounter).
// Every entry point goes through one helper, enter, which counts the call and
// fires injected faults. Close drops queued work, stops every goroutine,
// releases everything and reports, as an error, what was still live.
//
// # Deviations from CUDA
//
//   - Synchronous copies and memsets wait for no stream (there is no legacy
//     default stream). They name no stream, so any device with access to the
//     memory may perform them; their faults are charged to the device that
//     owns the memory (device 0 for host or unmapped memory).
//   - The global capture mode's ban on unsafe calls (synchronous copies,
//     synchronizing other streams) during a capture is not modelled: only
//     calls on the streams of the capture break it.
//   - MemAlloc memory is not accessible from other devices; memory is zeroed.
//   - Errors are checked more strictly than CUDA does in places where CUDA
//     would corrupt memory silently (a MemAlloc overrun faults).
//   - Launch limits are those of compute 9.0 with the shared-memory opt-in
//     already made (227 KiB).
//   - An exec update never changes a memset's element size (CUDA may take
//     such a change "opportunistically", or refuse it).
//   - Graph memory (the GEMM library's in-capture workspace) stays mapped
//     until Close rather than until its graph goes, and its nodes only order
//     work; two launches of one such graph in flight share it.
//
// # Concurrency
//
// A Backend is safe for concurrent use. One RWMutex guards the handle tables
// and the address space; kernels resolve each access under its read lock and
// copy page contents under it, so mappings cannot disappear mid-copy while
// kernels on different streams still run in parallel. Nothing waits on a
// stream while holding the lock.
package sim
