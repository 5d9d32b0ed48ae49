package replay

import (
	"context"

	"github.com/stablegraph/stablegraph/gpu"
)

// Name names a strategy. The root package's Strategy is this type.
type Name string

// The strategies of this build, each described in full in its own file
// (its type's doc), with its options and its code.
const (
	Eager  Name = "eager"  // eager.go
	Record Name = "record" // record.go
	Update Name = "update" // update.go
	Patch  Name = "patch"  // patch.go
	Device Name = "device" // device.go
	Stable Name = "stable" // stable.go
	Pool   Name = "pool"   // pool.go
	Remap  Name = "remap"  // remap.go
	Auto   Name = "auto"   // auto.go, probe.go
)

// Strategy is one way of turning a step's buffer addresses into device
// work. The executable owns one, built by New from a Spec, and calls it
// with its lock held, so a strategy needs no locking of its own for Run,
// Acquire, Counters and Close (state shared with other goroutines, such as
// pool's leases, has its own lock). Memory, Choice and Status (optional
// capabilities, below) may be called without the executable's lock and
// must be safe for that.
type Strategy interface {
	// Run enqueues one step on s with every buffer at addrs (indexed like
	// Spec.Buffers; the executable's vector, rewritten every step: copy
	// what must be kept). After an error the strategy must still be
	// usable: the next Run either reuses a consistent graph or records
	// afresh.
	Run(ctx context.Context, s gpu.Stream, addrs []gpu.DevicePtr) (Result, error)
	// Counters returns what the strategy did since it was built, kept
	// after Close.
	Counters() Counters
	// Close releases what the strategy holds. The executable has waited
	// for its last step.
	Close() error
}

// Result is what a step hands back beyond the caller's own buffers.
type Result struct {
	// Outs, when not nil, are where the outputs are (one per output
	// buffer of the Spec, in buffer order) instead of the bound addresses.
	Outs []gpu.DevicePtr
	// Lease, when not nil, holds the memory of Outs for the caller.
	Lease Lease
}

// Lease holds strategy memory handed out to the caller (zero-copy pool
// outputs) until Release. Both methods are safe from any goroutine.
type Lease interface {
	// Release gives the memory back; it is idempotent.
	Release()
	// Released reports whether Release was called.
	Released() bool
}

// The optional capabilities below are found by type assertion, as
// database/sql finds a driver's optional interfaces; the functions after
// them give the answer for a strategy without the capability, so that the
// executable asks one way whatever the strategy.

// Acquirer is implemented by strategies whose next step may have to wait
// for a resource (a pool slot). The executable calls Acquire with its lock
// held, right before Run; nil means Run can start at once. Otherwise the
// executable drops its lock, calls the function returned, which waits
// until the step may be able to start (ctx carries the deadline), and
// tries again.
type Acquirer interface {
	Acquire() func(ctx context.Context) error
}

// OutputLeaser is implemented by strategies that may hand out their own
// memory for outputs (Result.Lease); the outputs need not be bound when
// LeasesOutputs says so. The answer must not change after New.
type OutputLeaser interface {
	LeasesOutputs() bool
}

// MemoryHolder is implemented by strategies that hold device memory of
// their own beyond the executable's (persistent copies, pool slots).
type MemoryHolder interface {
	Memory() Memory
}

// Chooser is implemented by strategies that run another strategy of their
// choosing (auto).
type Chooser interface {
	// Choice says what runs and why (a copy).
	Choice() Choice
	// Status is the part of the Choice that Stats reports, without the
	// copy.
	Status() Status
}

// WarmUpper is implemented by strategies that take more than one step to
// reach their steady state (recording graphs, proving trace templates):
// auto measures a candidate only after WarmUp steps.
type WarmUpper interface {
	WarmUp() int
}

// AliasSafe is implemented by strategies that give eager's results when
// the buffers bound for a step overlap in device memory (alias.go): an
// output bound onto a param's memory, two outputs on one address, partial
// overlaps. A strategy that works in the caller's memory does by nature
// (eager, record, update, patch); one that copies params and outputs into
// memory of its own must lay its copies out as the caller's are (stable and
// pool do, copies.go). The executable refuses, with an error naming two of
// the overlapping buffers, a step whose bound buffers overlap with one of
// them written when its strategy lacks this capability or answers false,
// so that a strategy that does not handle aliasing never computes other
// bits silently. The answer must not change after New.
type AliasSafe interface {
	AliasSafe() bool
}

// FallbackReporter is implemented by strategies that say why their graph
// updates were refused (Counters.UpdateFallbacks): every strategy that
// embeds base does.
type FallbackReporter interface {
	// Fallbacks returns the refusals so far by reason (a copy). Called
	// under the executable's lock, like Counters.
	Fallbacks() Fallbacks
}

// Status is what a strategy runs now.
type Status struct {
	// Running is the strategy that runs (Choice.Strategy).
	Running Name
	// Ran is the strategy that ran the last step, "" before the first.
	Ran Name
	// Probing is Choice.Probing.
	Probing bool
}

// Acquire returns st's Acquire, or nil for a strategy that never waits.
func Acquire(st Strategy) func(context.Context) error {
	if aq, ok := st.(Acquirer); ok {
		return aq.Acquire()
	}
	return nil
}

// LeasesOutputs reports whether st hands out its own memory for outputs.
func LeasesOutputs(st Strategy) bool {
	l, ok := st.(OutputLeaser)
	return ok && l.LeasesOutputs()
}

// MemoryOf returns the memory st holds: none without MemoryHolder.
func MemoryOf(st Strategy) Memory {
	if m, ok := st.(MemoryHolder); ok {
		return m.Memory()
	}
	return Memory{}
}

// ChoiceOf returns st's Choice; a strategy that chooses nothing runs as
// requested.
func ChoiceOf(st Strategy, requested Name) Choice {
	if c, ok := st.(Chooser); ok {
		return c.Choice()
	}
	return Choice{Requested: requested, Strategy: requested, Reason: "requested"}
}

// StatusOf returns st's Status; for a strategy that chooses nothing, the
// one requested, which ran the last step once stepped says a step ran.
func StatusOf(st Strategy, requested Name, stepped bool) Status {
	if c, ok := st.(Chooser); ok {
		return c.Status()
	}
	s := Status{Running: requested}
	if stepped {
		s.Ran = requested
	}
	return s
}

// HandlesAliasing reports whether st gives eager's results for bound
// buffers that overlap (AliasSafe): false without the capability.
func HandlesAliasing(st Strategy) bool {
	a, ok := st.(AliasSafe)
	return ok && a.AliasSafe()
}

// FallbacksOf returns st's refused updates by reason: none without
// FallbackReporter.
func FallbacksOf(st Strategy) Fallbacks {
	if f, ok := st.(FallbackReporter); ok {
		return f.Fallbacks()
	}
	return Fallbacks{}
}

// WarmUpOf returns the steps st takes to reach its steady state: 1
// without WarmUpper.
func WarmUpOf(st Strategy) int {
	if w, ok := st.(WarmUpper); ok {
		return w.WarmUp()
	}
	return 1
}
