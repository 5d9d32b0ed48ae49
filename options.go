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
// between steps. Each is one unit of package replay: its file (named
// after it) holds its description, the one authoritative account of what
// it does, its options and what it counts, and its code;
// docs/ARCHITECTURE.md ("Strategies") sets them side by side.
type Strategy = replay.Name

const (
	// StrategyEager launches every command every step: the reference the
	// others match bit for bit (replay/eager.go).
	StrategyEager = replay.Eager
	// StrategyRecord records the graph again whenever an address moves
	// (replay/record.go).
	StrategyRecord = replay.Record
	// StrategyUpdate re-records and applies a whole-graph exec update
	// (replay/update.go).
	StrategyUpdate = replay.Update
	// StrategyPatch updates in place only the nodes whose buffers moved
	// (replay/patch.go).
	StrategyPatch = replay.Patch
	// StrategyDevice records once and moves the pointers on the device,
	// with a patcher node (replay/device.go; options: DeviceStrategy). It
	// needs device-updatable graph nodes and the patcher built for the
	// device: Compile fails with an error wrapping gpu.ErrNotSupported
	// without them.
	StrategyDevice = replay.Device
	// StrategyStable copies params and outputs in and out of persistent
	// copies of its own (replay/stable.go; options: Copies).
	StrategyStable = replay.Stable
	// StrategyPool runs over slots of VMM memory, each with its own copies
	// and graph (replay/pool.go; options: Pool, Copies). It needs VMM and
	// stream memory operations: Compile fails with an error wrapping
	// gpu.ErrNotSupported without them.
	StrategyPool = replay.Pool
	// StrategyRemap maps the caller's memory into fixed ranges instead of
	// moving the graph (replay/remap.go; options: Remap): a baseline to
	// measure, which auto does not consider.
	StrategyRemap = replay.Remap
	// StrategyAuto measures patch, device, stable and pool on the first
	// steps and keeps the fastest (replay/auto.go; options: Auto);
	// Executable.Choice says what it chose and why.
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
// StrategyAuto weighs (see replay.Costs). The defaults are the measured
// figures of docs/GPU-MACHINE.md (the copies' and the patcher's from an
// H100, the host's node and graph updates from an H200); zero fields of
// Options.Costs take them.
type Costs = replay.Costs

// AutoBound is what bounds a step, by which StrategyAuto ranks its
// candidates (see AutoOptions.Bound and replay.Bound).
type AutoBound = replay.Bound

// The bounds of AutoOptions.Bound.
const (
	AutoBoundLatency    = replay.BoundLatency
	AutoBoundThroughput = replay.BoundThroughput
)

// ChunkFinder finds the physical memory behind the caller's buffers for
// StrategyRemap (replay.ChunkFinder); a remappable.Allocator is one.
type ChunkFinder = replay.ChunkFinder

// StrategyOptions are the strategies' options, one group per strategy,
// each defined and documented with its strategy in package replay
// (replay.Options): Options embeds them, so a group is reached as
// opts.Pool, opts.Auto and so on.
type StrategyOptions = replay.Options

// The strategies' option groups (see StrategyOptions).
type (
	// CopyOptions configure stable's and pool's copies (replay/copies.go).
	CopyOptions = replay.CopyOptions
	// PoolOptions configure StrategyPool (replay/pool.go).
	PoolOptions = replay.PoolOptions
	// DeviceOptions configure StrategyDevice (replay/device.go).
	DeviceOptions = replay.DeviceOptions
	// RemapOptions configure StrategyRemap (replay/remap.go).
	RemapOptions = replay.RemapOptions
	// AutoOptions configure StrategyAuto (replay/auto.go).
	AutoOptions = replay.AutoOptions
)

// MaxPoolSlots bounds PoolOptions.Slots.
const MaxPoolSlots = replay.MaxPoolSlots

// MaxAutoProbeSteps bounds AutoOptions.ProbeSteps.
const MaxAutoProbeSteps = replay.MaxAutoProbeSteps

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
	// Alignment of the executable's own buffers (states, constants, temps)
	// and of the copies StrategyStable and StrategyPool make of params and
	// outputs, a power of two. Default 256, what cudaMalloc guarantees.
	Alignment uint64
	// NoTempSharing gives every temp its own memory. Default false: temps
	// whose lifetimes (first to last command using them) do not overlap
	// share memory.
	NoTempSharing bool
	// Logger receives the executable's logs; per-step paths log at debug
	// level only. Default slog.Default().
	Logger *slog.Logger

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
	// Costs are the per-operation costs that price the strategies' work:
	// StrategyAuto's models, and StrategyPatch's choice between per-node
	// and whole-graph updates. Zero fields take the values of
	// DefaultCosts.
	Costs Costs

	// StrategyOptions are the strategies' own options, one group each
	// (Copies, Pool, DeviceStrategy, Remap, Auto), documented with their
	// strategy in package replay. Their defaults are applied with the
	// rest.
	StrategyOptions
}

// Option defaults that are not zero values of other types.
const (
	defaultSlotWait  = 30 * time.Second
	defaultCloseWait = 30 * time.Second
)

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
	if o.StrategyOptions, err = o.StrategyOptions.WithDefaults(); err != nil {
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
