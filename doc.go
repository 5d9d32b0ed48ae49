// Package stablegraph runs a GPU step program (kernels, library calls such
// as GEMMs, copies, memsets) thousands of times at the cost of one graph
// launch per step, even when the caller hands it buffers at new device
// addresses every step. See docs/ARCHITECTURE.md for the design.
//
// # Programs
//
// A Program declares buffers by class (Param, State, Temp, Output,
// Constant; see Class) and an ordered list of commands over slices of them:
//
//	p := stablegraph.NewProgram("mlp")
//	x := p.Param("x", 4*batch*width)
//	w := p.State("w", 4*width*width)
//	b := p.Constant("b", biasBytes)
//	h := p.Temp("h", 4*batch*width)
//	y := p.Output("y", 4*batch*width)
//	p.Gemm(h.All(), x.All(), w.All(), stablegraph.GEMM{M: batch, N: width, K: width, Alpha: 1})
//	p.Launch(kernels.BiasTanh, kernels.Elementwise(batch*width),
//		stablegraph.Out(y.All()), stablegraph.In(h.All()), stablegraph.In(b.All()),
//		stablegraph.I32(batch), stablegraph.I32(width))
//
// Kernel arguments are typed: slices with their access (In, Out, InOut)
// are the only pointers, scalars have explicit types (I32, U64, F32, ...).
// That is what lets the patch strategy rewrite pointers and never scalars.
// Program.Trace adds a command whose work a Go function enqueues on a
// stream (a library call); it enters graphs by stream capture.
//
// # Compiling and running
//
// Compile validates the program (errors name the command and the buffer
// and wrap ErrInvalidProgram), lays out and allocates the executable's own
// memory (temps share memory when their lifetimes do not overlap), and
// returns an Executable bound to a device and a Strategy. Device code
// cannot tell where a buffer ends, so Compile checks every launch of a
// built-in kernel against the kernel's signature (package kernels,
// "Extents"): a slice shorter than what the kernel reads or writes through
// it for the launch's scalars (sg_axpb's 4·n bytes of y and of x) is
// refused, naming the kernel argument, the buffer and both sizes, as are
// scalars the kernel cannot take. A nil context is an error (wrapping
// gpu.ErrInvalidValue) wherever one is taken, never a panic.
//
//	exe, err := stablegraph.Compile(ctx, backend, p, stablegraph.Options{Strategy: stablegraph.StrategyPatch})
//	defer exe.Close()
//	outs, err := exe.Run(ctx, stream, stablegraph.Bindings{x: xPtr, y: yPtr})
//	defer outs.Release() // a no-op unless outputs are leased (zero-copy pool)
//
// Each step the caller binds every param and output to its memory (from a
// caching allocator such as package bfc, so addresses move); states,
// temps and constants belong to the executable. Run enqueues the step and
// returns where the outputs are (Outputs.Addr): the caller's buffers, or
// pool slot memory leased to the caller; ReadOutput and ReadBuffer read
// results back, WriteBuffer initialises states.
//
// # Bindings
//
// Run checks the bindings before anything is enqueued; a mistake is an
// error wrapping ErrInvalidBinding that names the buffers:
//
//   - Every param and output is bound (outputs are optional under
//     zero-copy pool outputs, and then ignored), to a non-null address,
//     and nothing else is.
//   - Sizes: each binding must hold its buffer's whole size inside one live
//     allocation. Where the backend can tell the allocation an address lies
//     in (gpu.AddressRanger: the sim always; CUDA for its own memory and
//     other libraries' plain cuMemAlloc memory, cached so that the steady
//     state asks the driver nothing), a binding that runs past its
//     allocation's end, or lies in freed or unmapped memory, is refused
//     naming the buffer, its size and the extent found (gpu.CheckBinding;
//     the error also wraps gpu.ErrOutOfBounds). Not checked: two buffers
//     sub-allocated from one allocation (a caching allocator's segment, a
//     pool, a reservation) that overlap each other or a neighbour, since
//     the allocation is all the backend sees; memory of unknowable extent
//     (on CUDA, other libraries' virtual memory and memory pools); memory
//     another library freed and reallocated behind the backend's back,
//     which keeps its old extent.
//   - Aliasing: params and outputs may share memory, in whole or in part:
//     an output bound onto the param it is computed from (an in-place
//     update, a donated buffer), two outputs on one address, an output over
//     a param's tail. Every strategy gives eager's semantics for them,
//     commands reading and writing the caller's bytes in program order: a
//     command that reads a param after another wrote an output over it
//     sees the new bytes. Eager, record, update and patch work in the
//     caller's memory; stable and pool lay their copies of the overlapping
//     buffers out as the caller's are (package replay, "Aliasing"). A
//     command whose own input and output overlap other than element for
//     element has no single result on a GPU, as under any runtime. A
//     strategy that did not handle aliasing (replay.AliasSafe) would have
//     such bindings refused, naming two of the buffers; every built-in one
//     handles them.
//   - A param or output may not overlap a state rebound to the caller's
//     memory with BindState: stable and pool never copy states, so no
//     strategy takes such bindings (refused, naming both).
//
// The stream must not be capturing a graph: a step's work is the
// executable's own graphs, recorded, updated and copied around, which
// cannot be captured into the caller's. Run refuses it with an error
// wrapping ErrStreamCapturing before binding or enqueueing anything; the
// capture stays valid, and the next step on a stream that is not capturing
// runs as if the refused one had not been asked for.
//
// # Strategies
//
// The strategies live in package replay, one unit each behind one
// interface; an Executable holds one and never branches on which. Strategy
// names them (Strategies lists them), each constant's doc says in a line
// what it does, and its file in package replay (replay/eager.go,
// replay/patch.go, ...) says it in full, with its options (one group each
// in Options: Copies, Pool, DeviceStrategy, Remap, Auto) and what it
// counts; docs/ARCHITECTURE.md ("Strategies") sets them side by side.
//
// All produce the same bits as eager. Executable.Stats counts what each
// did, with every re-record explained by its cause (Counters.Rerecords =
// MoveRerecords + UpdateFallbacks + RetryRerecords) and every refused
// graph update by the backend's reason (Stats.Fallbacks);
// Executable.Memory counts the memory each holds (persistent copies and
// slots included) and the tracer's library workspace; Executable.Choice
// says what StrategyAuto chose and why.
//
// # Concurrency and resources
//
// An Executable is safe for concurrent use; steps are serialised (see
// Executable). A pool step waiting for a slot waits without the
// executable's lock. The read-only accessors (Stats, Memory, Choice,
// Strategy, Traces) never wait for the device nor behind Close. Every
// error path releases the handles it created; the lock order of the whole
// module is in docs/ARCHITECTURE.md.
//
// Close (bounded by Options.CloseWait; CloseContext takes a context) wakes
// at once every Run waiting for a pool slot and every read waiting for the
// last step, which fail with ErrClosed, then waits for the last step
// without the executable's lock and releases everything, reporting every
// release that fails; on the sim backend the live-handle counters return
// to zero. When the wait ends first (a stuck stream), Close releases
// nothing, since the device may still use it, returns an error naming what
// it left, and a later Close tries again. The context bounds the waits and
// nothing else: with nothing to wait for, Close releases everything even
// with a context already ended, and closing a closed executable returns
// nil. Client.Close is bounded the same way (package client).
//
// # Around the executable
//
// Package client holds what a process keeps beside its executables:
// streams from a cache, and per device a timeline and a retirement queue
// that frees the caller's buffers once the device is done with them.
// Collective commands (Program.AllReduce and the others) run over a Comm,
// one rank's communicator (comm.go).
package stablegraph

// The built-in backends register themselves with gpu.Register: importing
// stablegraph is enough for gpu.Open("auto"), "sim" and "cuda".
import (
	_ "github.com/stablegraph/stablegraph/gpu/cuda"
	_ "github.com/stablegraph/stablegraph/gpu/sim"
)
