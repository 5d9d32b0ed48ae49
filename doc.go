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
// returns an Executable bound to a device and a Strategy:
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
// # Strategies
//
// The strategies live in package replay, one file each, behind one
// interface; an Executable holds one and never branches on which. Strategy
// names them (Strategies lists them).
//
// StrategyEager launches every command each step; StrategyRecord
// re-records and re-instantiates a graph whenever an address changes;
// StrategyUpdate re-records and applies a whole-graph exec update;
// StrategyPatch updates in place only the nodes whose buffers moved
// (package graph), moving traced nodes through their child graph with
// traces from a per-command LRU cache keyed by address or built from a
// differential-tracing template (package trace). StrategyDevice records
// once and moves the pointers on the GPU: a patcher kernel, the graph's
// root node, rewrites the pointer parameters of the nodes opted in to
// device-side updates from a table the host writes into mapped pinned
// memory, one update per moved buffer, so that a step is one launch and no
// other driver call (it needs CUDA 12.4's device-updatable graph nodes and
// the patcher built for the GPU; see package replay, device.go).
//
// Two strategies never move the program's addresses at all. StrategyStable
// gives every param and output a persistent allocation for the life of the
// executable; StrategyPool gives each of Options.PoolSlots slots of
// VMM-mapped memory its own copy of them, with one graph per slot. The
// step's graph is recorded once over those addresses and wrapped in copy
// nodes: params are copied in and outputs copied back to the caller's
// buffers inside the graph, so a step is one launch, and when the caller's
// buffers move only the copy nodes' caller-side pointers are updated
// (Counters.CopyNodeUpdates; PatchedNodes stays zero). States are never
// copied. Options.StreamCopies enqueues the copies around the launch
// instead. Buffers are copied only as the step needs: in when the step reads
// the caller's contents (every param it reads; an output read before it is
// written or written only in part), out when the step writes them. A
// program whose commands use their own addresses as data sees the
// persistent addresses, not the caller's.
//
// StrategyPool waits, before reusing a slot, for a device-written timeline
// to pass the step that last used it (polling with yields for a short
// bounded time, then sleeping with back-off, as Options.SlotPoll says; at
// most Options.SlotWait, then ErrSlotWait), and enqueues the timeline write
// that releases the slot right after the slot's graph. With
// Options.ZeroCopyOutputs it does not copy outputs out: Run's Outputs are
// the slot's memory, leased until Outputs.Release, and a slot is not reused
// while leased. It needs VMM and stream memory operations; Compile refuses
// it with an error wrapping gpu.ErrNotSupported on devices without them.
//
// StrategyAuto chooses among patch, device, stable and pool per program and device
// from measured costs. A cost model (Costs, by default the H100 figures of
// docs/GPU-MACHINE.md: nodes to patch against bytes and copies to make, VMM
// support and slot memory) rules out what the device cannot run and orders
// the rest; Compile builds them (falling back past one that runs out of
// memory), and the first steps run each in turn, warm-up steps then
// Options.AutoProbeSteps steps timed by events (GPU time) and the clock
// (host time). Auto keeps the fastest, by GPU time then host time, and
// releases the others; all compute the same bits over the same states, so
// the switches are invisible. Without probing (AutoProbeSteps < 0,
// zero-copy outputs, collectives) the model decides. Executable.Choice says
// what it chose and why, with the measured and modelled figures.
//
// All produce the same bits as eager. Executable.Stats counts what each
// did; Executable.Memory counts the memory each holds (persistent copies
// and slots included).
//
// # Concurrency and resources
//
// An Executable is safe for concurrent use; steps are serialised (see
// Executable). A pool step waiting for a slot waits without the
// executable's lock. Every error path releases the handles it created, and
// Close releases everything, reporting every release that fails; on the
// sim backend the live-handle counters return to zero. The lock order of
// the whole module is in docs/ARCHITECTURE.md.
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
