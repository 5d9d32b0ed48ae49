package replay

import (
	"errors"
	"maps"
	"sync/atomic"

	"github.com/stablegraph/stablegraph/gpu"
)

// Counters count the work a strategy did. The root package's Counters is
// this type: its Executable.Stats holds them summed since Compile and for
// the last step alone, so a benchmark can report totals and per-step
// figures. The trace counters are the executable's tracer's, and SlotWaits
// the executable's own; a strategy counts the rest.
type Counters struct {
	// Launches counts commands enqueued directly on the stream (eager).
	Launches int64
	// GraphLaunches counts executable graphs launched (one per step for
	// the graph strategies).
	GraphLaunches int64
	// Records counts graphs recorded and instantiated, the first included.
	Records int64
	// Rerecords counts the records of a graph recorded before, each for
	// one of three causes, counted apart so that every re-record is
	// explained: Rerecords = MoveRerecords + UpdateFallbacks +
	// RetryRerecords.
	Rerecords int64
	// MoveRerecords counts re-records because an address the graph holds
	// moved: every move under record; a state rebound (BindState) under
	// device, stable, pool and remap, whose graphs otherwise hold
	// addresses that never move, or move on the device.
	MoveRerecords int64
	// UpdateFallbacks counts updates or patches the driver refused,
	// replaced by a re-record (update, patch; device's host-side updates;
	// stable's and pool's copy nodes). Stats.Fallbacks says why, by
	// reason: its counts sum to this.
	UpdateFallbacks int64
	// RetryRerecords counts re-records of a graph that a failed step left
	// unusable (an update or patch that failed with an error other than a
	// refusal, which that step returned): the next step records it anew.
	RetryRerecords int64
	// GraphUpdates counts whole-graph exec updates applied: update's, and
	// patch's from its host template.
	GraphUpdates int64
	// PatchedNodes counts nodes moved in place (patch; with a whole-graph
	// update from the template, the nodes that moved), traced nodes
	// included.
	PatchedNodes int64
	// TracesCaptured counts stream captures of traced commands, including
	// the second captures of differential tracing.
	TracesCaptured int64
	// TracesSynthesized counts traces built from a differential template
	// instead of being captured.
	TracesSynthesized int64
	// TracesMoved counts flattened traces moved to new operands in place
	// by their template's pointer slots (patch): neither captured nor
	// synthesized, only their nodes' pointers updated.
	TracesMoved int64
	// TraceCacheHits and TraceCacheMisses count trace cache lookups.
	TraceCacheHits, TraceCacheMisses int64
	// BytesCopied counts bytes the strategy itself copied to move params in
	// and outputs out (stable, pool); the other strategies copy nothing.
	BytesCopied int64
	// CopyNodeUpdates counts updates of the copy nodes that stable and pool
	// put in their graphs, whose only moving pointer is the caller's
	// buffer. They are counted apart from PatchedNodes, which stays zero
	// for those strategies in steady state: the step body is never
	// patched.
	CopyNodeUpdates int64
	// TimelineWrites counts timeline writes enqueued to release pool slots,
	// one per step.
	TimelineWrites int64
	// SlotWaits counts the times a pool step found no slot ready (the
	// device still using it, or its outputs still leased) and had to wait.
	SlotWaits int64
	// SlotWaitSleeps counts the waits for the device to finish with a slot
	// that outlasted the yield phase of the executable's SlotPoll (Spec.Poll) and slept.
	SlotWaitSleeps int64
	// Remaps counts the buffers whose range remap unmapped and mapped to
	// the caller's memory anew, one per bound buffer that moved.
	Remaps int64
	// AliasedSteps counts the steps of stable and pool whose bound buffers
	// overlapped, one of them written by the step, and which therefore
	// ran over copies laid out as the caller's buffers are (alias.go). The
	// strategies that work in the caller's memory need no such layout and
	// count none.
	AliasedSteps int64
	// DeviceUpdates counts the pointer parameters the device strategy's
	// patcher rewrote on the device: those of every opted-in node whose
	// buffer moved, written by the host into the patcher's table as one
	// update per moved buffer. The host path of that strategy (copies it
	// could not make kernels, collectives) counts in PatchedNodes.
	DeviceUpdates int64
	// GraphUploads counts the device strategy's uploads of its executable
	// graphs: one per recording, none in a steady state (what moves from
	// the host is never a device-updatable node, and needs none).
	GraphUploads int64
	// ProbeSteps counts the steps auto ran to measure a candidate. What
	// those steps did counts in no other counter: the counters are those
	// of the strategy that runs.
	ProbeSteps int64
}

// Sub returns c - d, field by field.
func (c Counters) Sub(d Counters) Counters {
	return Counters{
		Launches:          c.Launches - d.Launches,
		GraphLaunches:     c.GraphLaunches - d.GraphLaunches,
		Records:           c.Records - d.Records,
		Rerecords:         c.Rerecords - d.Rerecords,
		MoveRerecords:     c.MoveRerecords - d.MoveRerecords,
		UpdateFallbacks:   c.UpdateFallbacks - d.UpdateFallbacks,
		RetryRerecords:    c.RetryRerecords - d.RetryRerecords,
		GraphUpdates:      c.GraphUpdates - d.GraphUpdates,
		PatchedNodes:      c.PatchedNodes - d.PatchedNodes,
		TracesCaptured:    c.TracesCaptured - d.TracesCaptured,
		TracesSynthesized: c.TracesSynthesized - d.TracesSynthesized,
		TracesMoved:       c.TracesMoved - d.TracesMoved,
		TraceCacheHits:    c.TraceCacheHits - d.TraceCacheHits,
		TraceCacheMisses:  c.TraceCacheMisses - d.TraceCacheMisses,
		BytesCopied:       c.BytesCopied - d.BytesCopied,
		CopyNodeUpdates:   c.CopyNodeUpdates - d.CopyNodeUpdates,
		TimelineWrites:    c.TimelineWrites - d.TimelineWrites,
		SlotWaits:         c.SlotWaits - d.SlotWaits,
		SlotWaitSleeps:    c.SlotWaitSleeps - d.SlotWaitSleeps,
		Remaps:            c.Remaps - d.Remaps,
		AliasedSteps:      c.AliasedSteps - d.AliasedSteps,
		DeviceUpdates:     c.DeviceUpdates - d.DeviceUpdates,
		GraphUploads:      c.GraphUploads - d.GraphUploads,
		ProbeSteps:        c.ProbeSteps - d.ProbeSteps,
	}
}

// add adds d to c, field by field.
func (c *Counters) add(d Counters) {
	*c = c.Sub(d.neg())
}

// neg returns -c, field by field.
func (c Counters) neg() Counters { return Counters{}.Sub(c) }

// Memory is the device memory a strategy holds of its own (MemoryHolder),
// beside the executable's states, constants and temps.
type Memory struct {
	// Persistent is what stable holds: a persistent copy of every param
	// and output.
	Persistent uint64
	// Slots is what pool holds: SlotCount slots of physical memory, each
	// with a copy of every param and output, rounded up to the VMM
	// granularity.
	Slots     uint64
	SlotCount int
}

func (m Memory) plus(o Memory) Memory {
	return Memory{Persistent: m.Persistent + o.Persistent, Slots: m.Slots + o.Slots, SlotCount: m.SlotCount + o.SlotCount}
}

// Fallbacks say why a strategy's graph updates were refused
// (Counters.UpdateFallbacks), so that a benchmark's re-records can be
// traced to the driver's reason. The root package's Stats.Fallbacks is
// this type.
type Fallbacks struct {
	// ByReason counts the refusals by the reason the backend gave: the
	// gpu.UpdateResult of its *gpu.UpdateError ("topology changed",
	// "parameters changed", ...). It sums to Counters.UpdateFallbacks; nil
	// when there was none.
	ByReason map[string]int64
	// Last is the last refusal's error in full (the operation, the node,
	// the driver's code and the detail), "" when there was none.
	Last string

	seq int64 // when Last happened (fallbackSeq), to merge candidates'
}

// fallbackSeq orders the refusals of all strategies, so that auto can tell
// which of its candidates' refusals came last.
var fallbackSeq atomic.Int64

// clone returns a copy of f whose map is its own.
func (f Fallbacks) clone() Fallbacks {
	f.ByReason = maps.Clone(f.ByReason)
	return f
}

// merge adds o's refusals to f; Last becomes the later of the two.
func (f *Fallbacks) merge(o Fallbacks) {
	for k, n := range o.ByReason {
		if f.ByReason == nil {
			f.ByReason = map[string]int64{}
		}
		f.ByReason[k] += n
	}
	if o.seq > f.seq {
		f.Last, f.seq = o.Last, o.seq
	}
}

// since returns the refusals f holds beyond o, an earlier copy of the same
// strategy's Fallbacks: its counts by reason less o's, and Last when it
// came after o's.
func (f Fallbacks) since(o Fallbacks) Fallbacks {
	var d Fallbacks
	for k, n := range f.ByReason {
		if n -= o.ByReason[k]; n != 0 {
			if d.ByReason == nil {
				d.ByReason = map[string]int64{}
			}
			d.ByReason[k] = n
		}
	}
	if f.seq > o.seq {
		d.Last, d.seq = f.Last, f.seq
	}
	return d
}

// refusalReason is the short reason of a refused update: its
// gpu.UpdateResult, or "refused" for an error that says no more.
func refusalReason(err error) string {
	var ue *gpu.UpdateError
	if errors.As(err, &ue) {
		return ue.Result.String()
	}
	return "refused"
}
