package replay

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
	// Rerecords counts the records after the first: addresses moved
	// (record), or an update or patch was refused or failed and the graph
	// was recorded anew.
	Rerecords int64
	// GraphUpdates counts whole-graph exec updates applied (update).
	GraphUpdates int64
	// UpdateFallbacks counts updates or patches the driver refused,
	// replaced by a re-record.
	UpdateFallbacks int64
	// PatchedNodes counts nodes updated in place (patch), traced nodes
	// included.
	PatchedNodes int64
	// TracesCaptured counts stream captures of traced commands, including
	// the second captures of differential tracing.
	TracesCaptured int64
	// TracesSynthesized counts traces built from a differential template
	// instead of being captured.
	TracesSynthesized int64
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
	// that outlasted the yield phase of Options.SlotPoll and slept.
	SlotWaitSleeps int64
	// DeviceUpdates counts the pointer parameters the device strategy's
	// patcher rewrote on the device: those of every opted-in node whose
	// buffer moved, written by the host into the patcher's table as one
	// update per moved buffer. The host path of that strategy (copies it
	// could not make kernels, collectives) counts in PatchedNodes.
	DeviceUpdates int64
	// GraphUploads counts the uploads of an executable graph after the
	// device strategy moved nodes from the host: zero in a steady state
	// where everything moves on the device.
	GraphUploads int64
}

// Sub returns c - d, field by field.
func (c Counters) Sub(d Counters) Counters {
	return Counters{
		Launches:          c.Launches - d.Launches,
		GraphLaunches:     c.GraphLaunches - d.GraphLaunches,
		Records:           c.Records - d.Records,
		Rerecords:         c.Rerecords - d.Rerecords,
		GraphUpdates:      c.GraphUpdates - d.GraphUpdates,
		UpdateFallbacks:   c.UpdateFallbacks - d.UpdateFallbacks,
		PatchedNodes:      c.PatchedNodes - d.PatchedNodes,
		TracesCaptured:    c.TracesCaptured - d.TracesCaptured,
		TracesSynthesized: c.TracesSynthesized - d.TracesSynthesized,
		TraceCacheHits:    c.TraceCacheHits - d.TraceCacheHits,
		TraceCacheMisses:  c.TraceCacheMisses - d.TraceCacheMisses,
		BytesCopied:       c.BytesCopied - d.BytesCopied,
		CopyNodeUpdates:   c.CopyNodeUpdates - d.CopyNodeUpdates,
		TimelineWrites:    c.TimelineWrites - d.TimelineWrites,
		SlotWaits:         c.SlotWaits - d.SlotWaits,
		SlotWaitSleeps:    c.SlotWaitSleeps - d.SlotWaitSleeps,
		DeviceUpdates:     c.DeviceUpdates - d.DeviceUpdates,
		GraphUploads:      c.GraphUploads - d.GraphUploads,
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
