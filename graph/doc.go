// Package graph holds stablegraph's command buffers: a compiled step as a
// list of commands over buffer references, and the three ways of turning it
// into device work that the replay strategies are built from.
//
//   - Launch enqueues every command on a stream (the eager path).
//   - Record builds a gpu.Graph with one node per command, in order, each
//     depending on the one before (the stream order the commands were
//     declared in). Traced commands become child-graph nodes whose graphs
//     come from the trace package.
//   - Patch rewrites, in an instantiated graph, only the nodes whose
//     buffers moved, through the per-node exec parameter updates.
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
// moved and re-sends each marked node's parameters, rebuilt from its typed
// arguments with the pointer arguments resolved at the new addresses.
// Scalars come from the program, never from the old node, so no value is
// ever treated as a pointer because of what it equals (docs/ARCHITECTURE.md rule
// 1). Traced nodes are patched through their child graph
// (GraphExecChildGraphNodeSetParams) with a trace for the new addresses from
// the trace package: cached, built from a differential template, or, for
// commands that are not patchable, captured again.
//
// # Concurrency
//
// A CommandBuffer is immutable once made and safe for concurrent reads.
// Exec values and the Tracer are not safe for concurrent use; the
// executable that owns them serialises every call, as the gpu package
// requires for graphs.
package graph
