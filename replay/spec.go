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
	// Backend and Ordinal are where the step runs: the backend and the
	// device's ordinal.
	Backend gpu.Backend
	Ordinal int
	// Commands is the compiled step over len(Buffers) buffers: it
	// launches, records, instantiates (at any address vector, so a
	// strategy may record over addresses of its own), updates and patches
	// (package internal/graph). Its tracer is the executable's.
	Commands *graph.CommandBuffer
	// Buffers describes every buffer of the step, indexed as the address
	// vectors Run receives.
	Buffers []Buffer
	// Alignment is the executable's (a power of two): of the copies
	// stable and pool make of params and outputs too.
	Alignment uint64
	// Costs price a strategy's work (costs.go): auto's models, and patch's
	// choice between per-node and whole-graph updates. Defaults applied.
	Costs Costs
	// Poll is how a strategy polls the device while it waits for it (a
	// pool slot's timeline, device's patcher mirror, remap's event), and
	// Wait bounds a wait made inside Run (remap's); the executable bounds
	// the waits of Acquire.
	Poll vmm.WaitPolicy
	Wait time.Duration
	// Options are the strategies' own, one group each, defaults applied.
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

	// classes are Buffers split by class: New fills them.
	classes Classes
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

// Options are the strategies' options: one group per strategy that has
// any, each defined and documented in its strategy's file with its
// defaults, and nowhere else. The root package's Options embeds this type
// (stablegraph.StrategyOptions), so that a caller reaches a group as
// opts.Pool, and the executable hands the groups to New as they are.
type Options struct {
	// Copies configure the copies of stable and pool (copies.go).
	Copies CopyOptions
	// Pool configures pool (pool.go).
	Pool PoolOptions
	// DeviceStrategy configures device (device.go); not Device, which the
	// root's Options holds as the device's ordinal.
	DeviceStrategy DeviceOptions
	// Remap configures remap (remap.go).
	Remap RemapOptions
	// Auto configures auto (auto.go).
	Auto AutoOptions
}

// WithDefaults returns o with every group's defaults applied, or an error
// naming the field out of range.
func (o Options) WithDefaults() (Options, error) {
	var err error
	if o.Pool, err = o.Pool.withDefaults(); err != nil {
		return o, err
	}
	if o.Auto, err = o.Auto.withDefaults(); err != nil {
		return o, err
	}
	return o, nil
}

// ChunkFinder finds the physical memory behind the caller's buffers for
// remap (RemapOptions.Memory): a remappable.Allocator (package
// remappable) is one. The root package's ChunkFinder is this type.
type ChunkFinder interface {
	// Chunk returns the physical chunk mapped at p and p's offset in it:
	// the chunk's bytes from the offset on are those the caller sees from
	// p on. An address the finder does not know is an error wrapping
	// gpu.ErrNotFound.
	Chunk(p gpu.DevicePtr) (chunk *vmm.PhysicalAllocation, offset uint64, err error)
}

// Classes are a step's buffers split by class, each list in buffer order:
// what the executable and every strategy need of the classes, computed by
// ClassesOf alone.
type Classes struct {
	// Bound are the params and outputs: the buffers the caller binds
	// every step, whose addresses may move every step.
	Bound []int
	// Outputs are the outputs, States the states.
	Outputs, States []int
}

// ClassesOf splits bufs by class.
func ClassesOf(bufs []Buffer) Classes {
	var c Classes
	for i, b := range bufs {
		if b.Class.Bound() {
			c.Bound = append(c.Bound, i)
		}
		switch b.Class {
		case Output:
			c.Outputs = append(c.Outputs, i)
		case State:
			c.States = append(c.States, i)
		}
	}
	return c
}
