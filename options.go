package stablegraph

import (
	"fmt"
	"log/slog"
	"math/bits"
	"time"

	"github.com/stablegraph/stablegraph/internal/trace"
	"github.com/stablegraph/stablegraph/replay"
	"github.com/stablegraph/stablegraph/vmm"
)

// Strategy names a way of replaying a compiled step when its buffers move
// between steps (docs/ARCHITECTURE.md, "Strategies"). Each is implemented
// in package replay, in the file named after it.
type Strategy = replay.Name

const (
	// StrategyEager launches every command on the stream every step. It
	// records nothing and is the reference the others must match bit for
	// bit.
	StrategyEager = replay.Eager
	// StrategyRecord records the commands into a graph and, whenever an
	// address they use changes, records and instantiates it again: what
	// other runtimes ship.
	StrategyRecord = replay.Record
	// StrategyUpdate re-records into a new graph when addresses change and
	// applies it to the executable graph with a whole-graph exec update,
	// falling back to re-instantiating when the driver refuses.
	StrategyUpdate = replay.Update
	// StrategyPatch rewrites in place only the nodes whose buffers moved,
	// with per-node exec parameter updates; traced nodes through their
	// child graph (see package internal/graph and package internal/trace).
	StrategyPatch = replay.Patch
	// StrategyDevice records the graph once and moves its pointers on the
	// device: every kernel node with a pointer into a param or output
	// opts in to device-side updates, and a patcher kernel, a node of the
	// graph beside the step's first command, rewrites them from the
	// updates the host writes, one per moved buffer: into the patcher's
	// own parameters (one exec update of that node per moving step) when
	// at most 16 buffers move, else (or with DeviceTables) into a table in
	// mapped pinned memory. The step's first command, which the patcher
	// could only delay, moves from the host (one exec update per moved
	// node), as do collectives and copies it cannot make copy kernels;
	// none of them needs the graph uploaded again. A rebound state records
	// the graph afresh. It needs device-updatable
	// graph nodes (CUDA 12.4) and the patcher built for the device
	// (kernels/cuda/gen-patcher.sh); Compile fails with an error wrapping
	// gpu.ErrNotSupported without them. See package replay, device.go.
	StrategyDevice = replay.Device
	// StrategyStable gives every param and output buffer one persistent
	// address for the life of the executable (cached allocations): the
	// graph is recorded once over them, params are copied in and outputs
	// copied back to the caller's buffers every step, states are never
	// copied. The copies are nodes of the step's graph, so a step is one
	// launch; only their caller-side pointers are updated when the caller's
	// buffers move (Counters.CopyNodeUpdates), nothing else is patched.
	StrategyStable = replay.Stable
	// StrategyPool keeps Options.PoolSlots slots of physical memory
	// permanently mapped (VMM), each holding its own copy of the params and
	// outputs, with one graph per slot recorded once and replayed forever.
	// Each step takes the least recently used free slot, waiting on a
	// device-written timeline for the step that last used it (polled as
	// Options.SlotPoll says, at most Options.SlotWait), copies params in,
	// launches the slot's graph, enqueues the timeline write that releases
	// the slot, and copies the outputs out, or with Options.ZeroCopyOutputs
	// leases them to the caller (see Outputs). It needs VMM and stream
	// memory operations; Compile fails with an error wrapping
	// gpu.ErrNotSupported without them.
	StrategyPool = replay.Pool
	// StrategyRemap keeps the graph's addresses fixed and moves the memory
	// instead (XLA's way on CUDA): every param and output gets a virtual
	// address range of its own, the graph is recorded once over them, and
	// each step, for every buffer that moved, it waits for the device to
	// finish the step before (an event, polled as Options.SlotPoll says,
	// at most Options.SlotWait), unmaps the range, maps the physical
	// memory behind the caller's buffer into it and grants the device
	// access, then launches the graph. Nothing is copied. It needs VMM and
	// caller memory it can map: params and outputs allocated by a
	// remappable.Allocator given as Options.Remappable (one physical
	// allocation per buffer). Memory from elsewhere is refused with an
	// error wrapping gpu.ErrNotSupported naming the buffer, and buffers
	// that do not start on a granule of their allocation, or share a
	// granule, with ErrInvalidBinding. It is a baseline to measure
	// (BENCHMARKS.md): auto does not consider it.
	StrategyRemap = replay.Remap
	// StrategyAuto chooses among patch, device, stable and pool for the
	// program and device from measured costs: it builds the candidates the device can
	// run (a cost model, Options.Costs, weighs bytes to copy against nodes
	// to patch, VMM support and slot memory, and orders them), runs each
	// for a few steps timing its GPU and host time (Options.AutoProbeSteps),
	// keeps the fastest and releases the others. It never chooses a
	// strategy the device cannot run; Executable.Choice says what it chose
	// and why, with the figures measured.
	StrategyAuto = replay.Auto
)

// Strategies lists the strategies this build implements, in the order
// benchmarks report them.
func Strategies() []Strategy { return replay.Names() }

// ParseStrategy returns the strategy named s.
func ParseStrategy(s string) (Strategy, error) {
	st, err := replay.Parse(s)
	if err != nil {
		return "", fmt.Errorf("stablegraph: %w", err)
	}
	return st, nil
}

// Costs are the per-operation costs, in microseconds of step time, that
// StrategyAuto weighs (see replay.Costs). The defaults are the H100
// figures of docs/GPU-MACHINE.md; zero fields of Options.Costs take them.
type Costs = replay.Costs

// AutoBound is what bounds a step, by which StrategyAuto ranks its
// candidates (see Options.AutoBound and replay.Bound).
type AutoBound = replay.Bound

// The bounds of Options.AutoBound.
const (
	AutoBoundLatency    = replay.BoundLatency
	AutoBoundThroughput = replay.BoundThroughput
)

// ChunkFinder finds the physical memory behind the caller's buffers for
// StrategyRemap (replay.ChunkFinder); a remappable.Allocator is one.
type ChunkFinder = replay.ChunkFinder

// DefaultCosts returns the measured costs (see Costs).
func DefaultCosts() Costs { return replay.DefaultCosts() }

// Options configure Compile. The zero value is valid; each field's default
// is given with it and applied in one place, withDefaults.
type Options struct {
	// Strategy is the replay strategy. Default StrategyPatch.
	Strategy Strategy
	// Device is the ordinal of the device the executable runs on.
	// Default 0.
	Device int
	// TraceCacheSize is how many traces each traced command keeps, keyed
	// by its operands' addresses. Default 16 (trace.DefaultCacheSize).
	TraceCacheSize int
	// Alignment of the executable's own buffers (states, constants, temps),
	// a power of two. Default 256, what cudaMalloc guarantees.
	Alignment uint64
	// NoTempSharing gives every temp its own memory. Default false: temps
	// whose lifetimes (first to last command using them) do not overlap
	// share memory.
	NoTempSharing bool
	// Logger receives the executable's logs; per-step paths log at debug
	// level only. Default slog.Default().
	Logger *slog.Logger

	// PoolSlots is the number of slots of StrategyPool (1 to MaxPoolSlots).
	// Two let the host prepare a step while the device runs the one
	// before. Default 2.
	PoolSlots int
	// SlotWait bounds how long Run waits for a pool slot: for the device to
	// finish the step that last used it, or for a zero-copy lease on it to
	// be released. Passing it is an error wrapping ErrSlotWait and
	// gpu.ErrTimeout. It bounds StrategyRemap's wait for the device to
	// finish the step before one that moves buffers too (an error
	// wrapping gpu.ErrTimeout). StrategyDevice waits as long, and polls as
	// SlotPoll says, for its next patch table (its error wraps
	// gpu.ErrTimeout). Default 30 s.
	SlotWait time.Duration
	// CloseWait bounds how long Close waits for the executable's last step
	// to complete on the device before it gives up, releasing nothing and
	// saying what it left (see Executable.CloseContext, which takes a
	// context instead). Default 30 s.
	CloseWait time.Duration
	// SlotPoll is how a pool step waiting for the device to finish with a
	// slot polls the slot timeline (see vmm.WaitPolicy): it yields between
	// reads for up to SlotPoll.Yield, then sleeps from SlotPoll.MinSleep
	// doubling to SlotPoll.MaxSleep, never past SlotWait. With steps run
	// back to back a step waits about one step's GPU time for its slot;
	// polling with yields sees the slot free within a microsecond, where a
	// sleep, however short, costs tens of microseconds. Zero fields take
	// vmm's defaults: 1 ms of yields (vmm.DefaultWaitYield; negative: no
	// yields), then sleeps of 50 µs to 1 ms.
	SlotPoll vmm.WaitPolicy
	// ZeroCopyOutputs makes StrategyPool (also when StrategyAuto chooses
	// it) hand out its outputs in the slot that ran instead of copying them
	// into the caller's buffers: Run's Outputs hold the slot's addresses
	// and a lease, and the slot is not reused until Outputs.Release. Output
	// bindings are then optional and ignored. Other strategies write the
	// caller's output buffers as usual. Default false.
	ZeroCopyOutputs bool
	// StreamCopies makes stable and pool copy params and outputs with
	// stream copies around the graph launch instead of copy nodes inside
	// the graph: no node is updated when the caller's buffers move, at the
	// price of one more launch per copy. Default false (copies in the
	// graph, one launch per step).
	StreamCopies bool
	// DeviceTables makes StrategyDevice pass every step's pointer moves
	// through its ring of tables in mapped host memory, which the patcher
	// reads over the bus, also when at most kernels.PatchInlineCap (16)
	// buffers move: by default those go in the patcher node's own
	// parameters, with one exec update of that node per step that moves
	// anything, which costs the GPU half as much (see replay/device.go).
	// Default false.
	DeviceTables bool
	// Costs are the per-operation costs StrategyAuto models by. Zero
	// fields take the values of DefaultCosts.
	Costs Costs
	// AutoBound is what bounds a step, by which StrategyAuto ranks the
	// candidates it measured: AutoBoundLatency (host + GPU time, each step
	// awaited before the next, as a decode loop runs them) or
	// AutoBoundThroughput (the larger of the two, steps run back to back,
	// as a training loop runs them). GPU time alone never ranks: a
	// candidate whose host time exceeds its GPU time is bound by its host
	// time. Default AutoBoundLatency; Choice.Reason says which applied.
	AutoBound AutoBound
	// AutoProbeSteps is how many steps StrategyAuto measures each of its
	// candidates over before it keeps one. Compile builds every candidate
	// the device can run (the model excludes what it cannot, and pool slots
	// larger than Costs.PoolMemoryFraction of free memory); the first steps
	// run each in turn, the model's cheapest first, for its warm-up steps
	// that record its graphs (patch 2, device 2, stable 1, pool one per
	// slot); then rounds visit every candidate in turn, each round starting
	// one candidate further on, a visit being one step that brings the
	// candidate back to the caller's addresses and up to two measured
	// steps, until each has AutoProbeSteps measured steps (replay/probe.go
	// has the plan). A measured step is timed as stablegraph bench times
	// one: its stream waits behind a gate while the candidate enqueues it
	// (host time, by the clock), so that events around its work time the
	// device's work alone (GPU time). Once the device has passed the last
	// probe step (polled, never waited for; the model's choice runs
	// meanwhile), auto keeps the candidate with the lowest median step time
	// under AutoBound, then under the other bound, then host time (times
	// within 1% or 0.5 µs are equal; the model breaks ties), and closes the
	// others, releasing their memory. The probe steps count in no counter
	// of Stats but ProbeSteps; the graphs the kept candidate recorded while
	// probing count in Records. Default 6 (with the four candidates of a
	// device that can run them all, 43 probe steps); negative: no probing,
	// the model alone decides at Compile. Probing is also skipped with
	// ZeroCopyOutputs (Choice.Reason says so). For a program holding
	// collectives the ranks decide together: the first step agrees on the
	// candidates every rank built, and the step after the probes on each
	// candidate's slowest-rank times, read one step later, so that every
	// rank keeps the same strategy (Choice.Agreed; replay/collective.go).
	// Every rank must compile the program with the same options.
	AutoProbeSteps int
	// Remappable is where StrategyRemap finds the physical memory behind
	// the params and outputs the caller binds: the remappable.Allocator
	// they are allocated from. StrategyRemap needs it for a program with
	// params or outputs; the other strategies ignore it. Default nil.
	Remappable ChunkFinder
}

// MaxPoolSlots bounds Options.PoolSlots.
const MaxPoolSlots = 64

// Option defaults that are not zero values of other types.
const (
	defaultPoolSlots      = 2
	defaultSlotWait       = 30 * time.Second
	defaultCloseWait      = 30 * time.Second
	defaultAutoProbeSteps = 6
)

// MaxAutoProbeSteps bounds Options.AutoProbeSteps.
const MaxAutoProbeSteps = 1000

func (o Options) withDefaults() (Options, error) {
	var err error
	if o.Strategy == "" {
		o.Strategy = StrategyPatch
	}
	if _, err := ParseStrategy(string(o.Strategy)); err != nil {
		return o, err
	}
	if o.Device < 0 {
		return o, fmt.Errorf("stablegraph: negative device %d", o.Device)
	}
	if o.TraceCacheSize < 0 {
		return o, fmt.Errorf("stablegraph: negative trace cache size %d", o.TraceCacheSize)
	}
	if o.TraceCacheSize == 0 {
		o.TraceCacheSize = trace.DefaultCacheSize
	}
	if o.Alignment == 0 {
		o.Alignment = 256
	}
	if bits.OnesCount64(o.Alignment) != 1 {
		return o, fmt.Errorf("stablegraph: alignment %d is not a power of two", o.Alignment)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	switch {
	case o.PoolSlots == 0:
		o.PoolSlots = defaultPoolSlots
	case o.PoolSlots < 0 || o.PoolSlots > MaxPoolSlots:
		return o, fmt.Errorf("stablegraph: %d pool slots (1 to %d)", o.PoolSlots, MaxPoolSlots)
	}
	switch {
	case o.SlotWait == 0:
		o.SlotWait = defaultSlotWait
	case o.SlotWait < 0:
		return o, fmt.Errorf("stablegraph: negative slot wait %v", o.SlotWait)
	}
	switch {
	case o.CloseWait == 0:
		o.CloseWait = defaultCloseWait
	case o.CloseWait < 0:
		return o, fmt.Errorf("stablegraph: negative close wait %v", o.CloseWait)
	}
	switch {
	case o.AutoProbeSteps == 0:
		o.AutoProbeSteps = defaultAutoProbeSteps
	case o.AutoProbeSteps > MaxAutoProbeSteps:
		return o, fmt.Errorf("stablegraph: %d auto probe steps (at most %d)", o.AutoProbeSteps, MaxAutoProbeSteps)
	}
	if o.AutoBound, err = replay.ParseBound(string(o.AutoBound)); err != nil {
		return o, fmt.Errorf("stablegraph: %w", err)
	}
	if err := o.SlotPoll.Validate(); err != nil {
		return o, fmt.Errorf("stablegraph: slot poll: %w", err)
	}
	if o.Costs, err = o.Costs.WithDefaults(); err != nil {
		return o, fmt.Errorf("stablegraph: %w", err)
	}
	return o, nil
}

// replayOptions are the options strategies read (package replay).
func (o Options) replayOptions() replay.Options {
	return replay.Options{
		Alignment:       o.Alignment,
		PoolSlots:       o.PoolSlots,
		SlotPoll:        o.SlotPoll,
		ZeroCopyOutputs: o.ZeroCopyOutputs,
		StreamCopies:    o.StreamCopies,
		DeviceTables:    o.DeviceTables,
		Costs:           o.Costs,
		AutoProbeSteps:  o.AutoProbeSteps,
		AutoBound:       o.AutoBound,
		Remappable:      o.Remappable,
		DeviceWait:      o.SlotWait,
	}
}
