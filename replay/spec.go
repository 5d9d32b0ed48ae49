package replay

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/graph"
	"github.com/stablegraph/stablegraph/vmm"
)

// Spec is everything a strategy is built from: the compiled step and what
// the executable knows about its buffers, the device, and the options that
// concern strategies. New takes it by value; a strategy keeps what it
// needs and never reaches back into the executable.
type Spec struct {
	// Program names the program, for errors and logs.
	Program string
	// Backend and Device are where the step runs.
	Backend gpu.Backend
	Device  int
	// Commands is the compiled step over len(Buffers) buffers: it
	// launches, records, instantiates (at any address vector, so a
	// strategy may record over addresses of its own), updates and patches
	// (package internal/graph). Its tracer is the executable's.
	Commands *graph.CommandBuffer
	// Buffers describes every buffer of the step, indexed as the address
	// vectors Run receives.
	Buffers []Buffer
	// Options are the strategy options, defaults applied.
	Options Options
	// Collectives is true when the step holds collectives, whose time is
	// set by the peers.
	Collectives bool
	// Agree, for a step with collectives, combines numbers over the ranks
	// of its communicators, so that auto decides with the other ranks
	// (collective.go). Nil: auto decides such a step by its model alone.
	// It allocates nothing before its first MaxOver; auto, which calls
	// it, closes it.
	Agree Agreement
	// Kernels resolves the executable's loaded kernels by name, the
	// built-in ones (package kernels) always among them, for a strategy
	// that puts kernels of its own in the step (device: copy and fill
	// kernels for moving copies and memsets). Nil: none.
	Kernels func(name string) (gpu.Function, error)
	// Logger receives the strategy's logs; per-step paths log at debug
	// level only.
	Logger *slog.Logger
}

// Buffer is one buffer of the step as strategies see it.
type Buffer struct {
	Name string
	// Class says who owns the buffer and whether its address moves: the
	// params and outputs are bound by the caller every step and may move
	// every step; states move only when rebound; temps and constants never
	// move.
	Class Class
	Size  int64
	// Flow is how the step reads and writes the buffer.
	Flow Flow
}

// Class says who owns a buffer's memory and whether its address moves
// between steps (docs/ARCHITECTURE.md, "Buffer classes"). The root
// package's Class is this type.
type Class uint8

const (
	// Param buffers belong to the caller, who binds a (possibly new)
	// address every step.
	Param Class = iota + 1
	// State buffers (weights, optimizer state) belong to the executable,
	// live across steps and are updated in place. Their address is fixed
	// unless the caller rebinds them.
	State
	// Temp buffers are the executable's scratch within one step.
	Temp
	// Output buffers belong to the caller, who binds them every step like
	// params; every output is written by some command.
	Output
	// Constant buffers belong to the executable and are written once.
	Constant
)

var classNames = [...]string{"invalid", "param", "state", "temp", "output", "constant"}

func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// Bound reports whether the caller binds buffers of class c every step
// (params and outputs): their addresses may move every step.
func (c Class) Bound() bool { return c == Param || c == Output }

// Flow says how a step uses one buffer, for the strategies that give
// params and outputs a persistent copy of their own (stable, pool): to
// have the same effect on the caller's memory as eager, which works in
// the caller's buffers directly, they copy in every buffer whose caller
// contents the step can see, and copy out every buffer the step writes.
type Flow struct {
	// Written: some command writes part of the buffer.
	Written bool
	// ReadFirst: some command reads a byte that no earlier command wrote
	// in the step, so the caller's contents matter (every param; an output
	// read before it is written, or written only in part and read).
	ReadFirst bool
	// Full: the step's writes cover the whole buffer. A buffer written in
	// part keeps the caller's bytes elsewhere, which a copy out of the
	// whole buffer must not overwrite with stale ones.
	Full bool
}

// NeedsCopyIn reports whether a buffer copied back to the caller after the
// step (copiedOut) must be copied in before it.
func (f Flow) NeedsCopyIn(copiedOut bool) bool {
	return f.ReadFirst || (copiedOut && !f.Full)
}

// Options are the executable options strategies read (the root's Options
// documents each), defaults applied.
type Options struct {
	// Alignment of the persistent copies stable allocates and of the
	// copies within a pool slot.
	Alignment uint64
	// PoolSlots, SlotPoll and ZeroCopyOutputs configure pool.
	PoolSlots       int
	SlotPoll        vmm.WaitPolicy
	ZeroCopyOutputs bool
	// StreamCopies makes stable and pool copy with stream copies around
	// the launch instead of copy nodes in the graph.
	StreamCopies bool
	// DeviceTables makes device use its ring of tables for every step.
	DeviceTables bool
	// Costs, AutoProbeSteps and AutoBound configure auto (Costs patch
	// too: whether a whole-graph update from the template is cheaper).
	Costs          Costs
	AutoProbeSteps int
	AutoBound      Bound
	// Remappable finds the physical memory behind the caller's params and
	// outputs, and DeviceWait bounds the wait for the device before they
	// are remapped: both configure remap (remap.go).
	Remappable ChunkFinder
	DeviceWait time.Duration
}

// bound returns the buffers the caller binds every step, in order.
func (sp *Spec) bound() []int {
	var out []int
	for i, b := range sp.Buffers {
		if b.Class.Bound() {
			out = append(out, i)
		}
	}
	return out
}

// outputs returns the output buffers, in order.
func (sp *Spec) outputs() []int {
	var out []int
	for i, b := range sp.Buffers {
		if b.Class == Output {
			out = append(out, i)
		}
	}
	return out
}
