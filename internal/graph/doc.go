// Package graph holds stablegraph's command buffers: a compiled step as a
// list of commands over buffer references, and the three ways of turning it
// into device work that the replay strategies are built from.
//
//   - Launch enqueues every command on a stream (the eager path).
//   - Record builds a gpu.Graph with one node per command, in order, each
//     depending on the one before (the stream order the commands were
//     declared in). A traced command whose trace flattens (kernels, memcpys,
//     memsets: trace.Tracer.Flat) adds its nodes in their own dependency
//     order between the command before and the one after; any other traced
//     command becomes a child-graph node holding its trace.
//   - Patch rewrites, in an instantiated graph, only the nodes whose
//     buffers moved, through the per-node exec parameter updates;
//     PatchWhole moves them with one whole-graph update from the host
//     template instead (whole.go), and WholeCounts says what each would
//     take, for the caller to price.
//   - RecordDevice records the step for device-side patching: its kernel
//     nodes with pointers into movable buffers opted in to device-side
//     updates, and where each of those pointers is (the slots a node of
//     the caller's rewrites on the device); PatchDevice moves from the
//     host what the device cannot (device.go says what moves where).
//
// # Addresses
//
// A command never holds a device address. It names buffers by index and
// byte offset (Ref); every step supplies one base address per buffer, and a
// reference resolves to base+offset. Strategies compare the address vectors
// of two steps to find what moved.
//
// # Patch table
//
// The patch table is built from the commands' typed arguments when the
// command buffer is made: for each buffer, the commands that reference it.
// Applying it to a step's addresses marks the commands of the buffers that
// moved and re-sends each marked node's parameters with the pointer
// arguments resolved at the new addresses. Kernel nodes are prepared once,
// at the first move, from their typed arguments (a gpu.KernelNodeSet,
// hostset.go): a step rewrites in place only their pointer words and hands
// the moved nodes to the backend in one Apply, one driver call per node on
// CUDA, allocating nothing. Scalars come from the program, never from the
// old node, so no value is ever treated as a pointer because of what it
// equals (docs/ARCHITECTURE.md rule 1). A flattened traced command is patched node by node: when its nodes
// came from a differential template and its operands stay in the alignment
// class of the template, the template's pointer slots are rewritten in
// place and only the nodes they change are updated (no capture, no trace
// lookup: what makes a cuBLAS GEMM as cheap to move as a kernel of our
// own); otherwise its trace at the new addresses is compared with the nodes
// recorded, and the update is refused (gpu.ErrGraphUpdate, so the strategy
// re-records) when the trace no longer has their shape. Other traced nodes
// are patched through their child graph (GraphExecChildGraphNodeSetParams)
// with a trace for the new addresses from the trace package: cached, built
// from a differential template, or, for commands that are not patchable,
// captured again.
//
// # Concurrency
//
// A CommandBuffer is immutable once made and safe for concurrent reads.
// Exec values and the Tracer are not safe for concurrent use; the
// executable that owns them serialises every call, as the gpu package
// requires for graphs.
package graph
