// Package trace runs traced commands: steps of GPU work that stablegraph does
// not build node by node but obtains by letting a Go function enqueue work on
// a stream (a library call such as a GEMM, or a user's function) and, when a
// graph is wanted, capturing that stream into a graph.
//
// # Traces and their cache
//
// A trace is the graph captured from one call of a command's function with
// its operands at given device addresses. Capturing costs a driver round
// trip per enqueued operation and, for collectives or large libraries, far
// more, so every Command keeps an LRU Cache of its traces keyed by the
// addresses of its operands: when buffers ping-pong between a few addresses,
// each address set is captured once and found in the cache afterwards.
//
// # Differential tracing
//
// A trace bakes the operands' addresses into its nodes. To move a trace to
// new addresses without capturing again, the Tracer traces a command twice,
// the second time with every operand at a different, real address (a shadow
// allocation of the same sizes, keeping each address's alignment modulo
// 256), and compares the two graphs (Diff):
//
//  1. They must have the same topology: node count, types, edges, and for
//     kernel nodes the same function, launch shape and parameter sizes.
//  2. Each kernel node's parameters are compared as raw bytes, one parameter
//     at a time, in 8-byte words. A word that differs is a pointer slot into
//     operand X at offset o if and only if its value is addr₁(X)+o in the
//     first trace and addr₂(X)+o in the second, with 0 ≤ o ≤ size(X).
//  3. Every other byte must be identical in the two traces.
//
// When all three hold, the result is a Template: the first trace's nodes
// plus the list of pointer slots, from which Build makes the trace for any
// new addresses with no capture. Otherwise the command is "not patchable"
// and is captured again (through the cache) whenever its addresses change.
// Memcpy and memset nodes are compared the same way, their pointers as
// slots, when the backend reads them back (gpu.GraphNodeReader).
//
// # Alignment classes
//
// Libraries choose their kernels by the alignment of their pointers (a
// vectorised kernel needs 16-byte aligned operands; cuBLASLt filters its
// algorithms by alignment up to 256 bytes), so a trace says what the command
// does only at pointers of the alignment it was recorded at. Every pointer a
// command's function gets has a class, gpu.AlignClass (the largest power of
// two up to 256 dividing it), and a command keeps its templates, and its
// library's preparation, per vector of classes: a trace is reused (the
// cache is keyed by exact addresses, hence by class), built from a template
// or moved in place only at pointers of the class it was recorded at, and
// at a new class the command is traced and diffed again.
//
// # Library commands and their workspace
//
// A Library (a GEMM, package blas) is a command that calls a library. The
// Tracer owns one device workspace for all its library commands, sized for
// the largest they ask for and allocated at its first run or trace, so that
// a captured library call allocates nothing (cuBLAS given no workspace
// allocates one inside the capture: memory nodes at a new address in every
// trace, which can be neither patched nor embedded as a child graph) and
// every trace holds the same workspace address. Library.Prepare runs outside
// any capture, once per alignment class, where the library chooses (and
// times) its algorithm.
//
// # Flattening
//
// Flat returns a trace node by node, so that the step's graph (package
// graph) can hold a library call's kernels as nodes of its own, each
// patched like the step's own kernels, instead of one child-graph node. A
// trace flattens when its nodes are all kernels, memcpys, memsets and empty
// nodes the backend can read back; at addresses of a class with a template
// the nodes come from the template (no capture), and Template.Apply moves
// them in place to new operands, reporting which nodes changed.
//
// The rule never treats a value as a pointer merely because it equals an
// address (docs/ARCHITECTURE.md rule 1): a scalar that happens to equal an
// operand's address in the first trace is the same scalar in the second,
// where the operand has moved, so it is left alone. Only words that move
// with an operand, by exactly its displacement, are rewritten.
//
// Nodes of kinds whose parameters the gpu interface cannot read back
// (graph memory nodes, value writes, nested child graphs, others) make a
// command not patchable; empty nodes are fine. Kernel nodes are always compared through
// their bytes, even where a backend returns them typed (sim), so the path a
// CUDA library kernel takes (gpu.ArgBytes laid out by FuncParamInfo) is the
// one tested in CI. Template.Build gives each argument back its original
// kind, so typed backends receive typed arguments.
//
// # Contract for traced functions
//
// A traced function must enqueue the same work for the same operand
// addresses every time: its work may depend on the addresses and on values
// it captured when the program was built, but not on anything that changes
// between steps. It must not dereference or free the operands on the host.
// It may be called on a capturing stream or, under the eager strategy, on
// the caller's stream.
//
// # Concurrency
//
// A Tracer and its Commands are not safe for concurrent use: the executable
// that owns them serialises every call (graphs must be serialised anyway;
// see package gpu).
package trace
