package replay

import (
	"fmt"
	"math"

	"github.com/stablegraph/stablegraph/internal/graph"
)

// Costs are the per-operation costs, in microseconds of step time, that
// auto weighs. The defaults (DefaultCosts) are measured figures, listed
// with their source in docs/GPU-MACHINE.md ("Costs"): the copies' and the
// patcher's from an H100, the host's node and graph updates from an H200
// (BENCHMARKS.md, section 00); zero fields take them (WithDefaults). The
// root package's Costs is this type.
type Costs struct {
	// NodeUpdateUS is the cost of updating one kernel, memcpy or memset
	// node of an executable graph in place
	// (cuGraphExecKernelNodeSetParams) in a step: the update and what it
	// adds to the launch that follows.
	NodeUpdateUS float64
	// TracedUpdateUS is the cost of moving one traced command that is
	// not flattened (a collective, or a function whose trace the backend
	// cannot read back): building its child graph from the template and
	// setting it on the exec graph. Not measured: estimated from a
	// capture-sized graph build plus a node update. A flattened library
	// call (a GEMM) moves as its kernel nodes, at NodeUpdateUS each
	// (graph.Moves).
	TracedUpdateUS float64
	// CopyLatencyUS and CopyBytesPerUS model one device-to-device copy as
	// CopyLatencyUS + bytes/CopyBytesPerUS of GPU time: a line through
	// two measured copies, a small and a large one, since small copies
	// are latency-bound (docs/GPU-MACHINE.md derives it).
	CopyLatencyUS, CopyBytesPerUS float64
	// TimelineWriteUS is the cost of the timeline write that releases a
	// pool slot (the cuStreamWriteValue64 enqueue).
	TimelineWriteUS float64
	// PoolMemoryFraction is the largest fraction of the device's free
	// memory that the pool's slots may take for auto to consider pool: a
	// policy, not a measurement. Default 0.25.
	PoolMemoryFraction float64
	// PatcherUS is the GPU time the device strategy's patcher node adds to
	// a step, whatever moves: a chain of opted-in nodes, every node moved,
	// against the same chain without the patcher, less the per-node cost
	// (BenchmarkDeviceUpdatesChain).
	PatcherUS float64
	// PatcherInlineUS is what the inline patcher node adds instead, when
	// at most kernels.PatchInlineCap buffers move, measured the same way
	// (bench/probes/patcher). Its parameters are set with one exec update
	// (NodeUpdateUS) per step that moves something.
	PatcherInlineUS float64
	// PatcherNodeUS is the GPU time per node the patcher moves: opting the
	// node in to device-side updates and its two pointer writes.
	PatcherNodeUS float64
	// GraphNodeSetUS is the host cost of setting one kernel node's
	// parameters on a graph, not an exec (cuGraphKernelNodeSetParams: the
	// host template of a whole-graph update).
	GraphNodeSetUS float64
	// ExecUpdateUS and ExecUpdateNodeUS model one whole-graph exec update
	// (cuGraphExecUpdate) as ExecUpdateUS + ExecUpdateNodeUS per node of
	// the graph: a line through two measured updates, of a small graph and
	// of a large one (docs/GPU-MACHINE.md, "Costs"). With GraphNodeSetUS
	// and NodeUpdateUS they set where patch takes a whole-graph update
	// instead of per-node updates (wholeCheaper).
	ExecUpdateUS, ExecUpdateNodeUS float64
}

// DefaultCosts returns the measured costs (see Costs and
// docs/GPU-MACHINE.md).
func DefaultCosts() Costs {
	return Costs{
		NodeUpdateUS:       0.75,
		TracedUpdateUS:     5,
		CopyLatencyUS:      6.09,
		CopyBytesPerUS:     1.478e6,
		TimelineWriteUS:    1.0,
		PoolMemoryFraction: 0.25,
		PatcherUS:          4.4,
		PatcherInlineUS:    2.2,
		PatcherNodeUS:      0.03,
		GraphNodeSetUS:     0.45,
		ExecUpdateUS:       1.75,
		ExecUpdateNodeUS:   0.154,
	}
}

// WithDefaults returns c with its zero fields set to DefaultCosts', or an
// error naming a negative, NaN or out-of-range field.
func (c Costs) WithDefaults() (Costs, error) {
	d := DefaultCosts()
	for _, f := range []struct {
		v   *float64
		def float64
		max float64
	}{
		{&c.NodeUpdateUS, d.NodeUpdateUS, math.Inf(1)},
		{&c.TracedUpdateUS, d.TracedUpdateUS, math.Inf(1)},
		{&c.CopyLatencyUS, d.CopyLatencyUS, math.Inf(1)},
		{&c.CopyBytesPerUS, d.CopyBytesPerUS, math.Inf(1)},
		{&c.TimelineWriteUS, d.TimelineWriteUS, math.Inf(1)},
		{&c.PoolMemoryFraction, d.PoolMemoryFraction, 1},
		{&c.PatcherUS, d.PatcherUS, math.Inf(1)},
		{&c.PatcherInlineUS, d.PatcherInlineUS, math.Inf(1)},
		{&c.PatcherNodeUS, d.PatcherNodeUS, math.Inf(1)},
		{&c.GraphNodeSetUS, d.GraphNodeSetUS, math.Inf(1)},
		{&c.ExecUpdateUS, d.ExecUpdateUS, math.Inf(1)},
		{&c.ExecUpdateNodeUS, d.ExecUpdateNodeUS, math.Inf(1)},
	} {
		switch {
		case *f.v == 0:
			*f.v = f.def
		case *f.v < 0 || *f.v > f.max || math.IsNaN(*f.v):
			return c, fmt.Errorf("cost %g out of range in %+v", *f.v, c)
		}
	}
	return c, nil
}

// copyUS is the modelled GPU time of one copy of size bytes.
func (c Costs) copyUS(size uint64) float64 {
	return c.CopyLatencyUS + float64(size)/c.CopyBytesPerUS
}

// wholeUS is the modelled host cost of bringing an exec to new addresses
// with one whole-graph update from its host template: w.Template nodes set
// on the template, then the update of a graph of w.Graph nodes.
func (c Costs) wholeUS(w graph.Whole) float64 {
	return float64(w.Template)*c.GraphNodeSetUS + c.ExecUpdateUS + float64(w.Graph)*c.ExecUpdateNodeUS
}

// perNodeAtMost is the most moved nodes whose per-node updates cost no
// more than the update of a graph of graphNodes nodes alone, the part of
// a whole-graph update no template work lowers: beyond it, the template
// is worth asking (wholeCheaper).
func (c Costs) perNodeAtMost(graphNodes int) int {
	if c.NodeUpdateUS <= 0 {
		return math.MaxInt
	}
	// Bounded before the conversion, which is undefined past MaxInt.
	return int(min(c.wholeUS(graph.Whole{Graph: graphNodes})/c.NodeUpdateUS, math.MaxInt32))
}

// wholeCheaper reports whether the whole-graph update of w costs less than
// its w.Nodes per-node updates: many moved nodes in a small graph.
func (c Costs) wholeCheaper(w graph.Whole) bool {
	return c.wholeUS(w) < float64(w.Nodes)*c.NodeUpdateUS
}
