// Package report is the data model and the renderers of a stablegraph bench
// run: every replay strategy run side by side on one workload, summarised as
// JSON, as a text table and as a chart of each strategy's time per step
// against the floor. It does not depend on the runtime; the bench command
// fills a Report and hands it here.
//
// # JSON
//
// The JSON form is a stable interface read by scripts that compare runs:
//
//	{
//	  "backend": "sim", "device": "sim device 0", "workload": "mlp", "steps": 100,
//	  "simulated": true,
//	  "results": [
//	    {
//	      "strategy": "eager",
//	      "step_us": {"p50": 12.5, "p90": 14.0},
//	      "host_us": {"p50": 30.1, "p90": 33.9},
//	      "latency_us": {"p50": 41.0, "p90": 45.2}, "gpu_timing": "gated",
//	      "moved_nodes_per_step": 0, "host_over_floor_us": 1.2,
//	      "rerecords": 0, "graph_updates": 0, "patched_nodes": 0, "traces_captured": 0, "bytes_copied": 0,
//	      "peak_device_bytes": 1048576, "outputs_match_eager": true,
//	      "step_samples_us": [...], "host_samples_us": [...], "latency_samples_us": [...]
//	    }
//	  ],
//	  "node_update_probe": {"param_bytes": 360, "nodes": 16, "samples": 20, "idle_us_per_node": 0.4, "in_flight_us_per_node": 0.5}
//	}
//
// step_us is GPU time per step: with "gpu_timing" "gated" the device's work
// alone (the stream held behind a gate while the host enqueued the step,
// timed by events from the gate's opening to the step's end), with "events"
// events around the host's call (the host time before the launch included).
// host_us is host time per step (the host clock around the call),
// latency_us the step's latency (from the host's call to the end of its
// device work: what step_us measured before gating), wall_us (when present)
// wall time per step with steps running back to back. "simulated" is true when the
// backend is a simulator (sim): every time is then its model's time on the
// host CPU, not a GPU measurement, and must not be compared with hardware
// figures. Keys are snake_case. The counters are totals over the measured
// steps (after warm-up): traces_captured above zero there means a traced
// command was captured again in steady state, a re-capture regression. The
// per-step samples are kept under their own keys and may be absent; "note"
// (absent when empty) records why a strategy fell back or failed.
// moved_nodes_per_step is the nodes a strategy moved from the host per step,
// host_over_floor_us its host p50 over the floor row's and
// host_us_per_moved_node the one over the other (both absent without a
// floor row); node_update_probe (absent when not measured) is the driver's
// own price of one node update in the same run, idle and in flight, to set
// host_us_per_moved_node beside.
//
// # Percentiles
//
// Percentile interpolates linearly between the two closest ranks of the
// sorted samples (the "linear" or R-7 method, numpy's default): the p-th
// percentile of n sorted samples x[0..n-1] is x[h] interpolated at
// h = (n-1)·p/100. p50 of an even count is the mean of the two middle
// samples; p90 of 10 samples lies 10% of the way from x[8] to x[9].
//
// # Concurrency
//
// A Report is plain data. Renderers only read it; concurrent renders of one
// Report are safe as long as nobody writes to it meanwhile.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
)

// SetFloor fills every other result's HostOverFloorUS and
// HostUSPerMovedNode: from its PairedFloor where it has one (the median
// over its blocks of the differences), else from the floor row (the step replayed
// with nothing moving). A result with neither is left as it is.
func (r *Report) SetFloor() {
	floor, hasFloor := r.Result(FloorRow)
	hasFloor = hasFloor && floor.HostUS.P50 != 0
	for i := range r.Results {
		res := &r.Results[i]
		if res.Strategy == FloorRow || res.HostUS.P50 == 0 {
			continue
		}
		var over float64
		switch {
		case res.PairedFloor != nil:
			over = res.PairedFloor.HostOverUS
		case hasFloor:
			over = res.HostUS.P50 - floor.HostUS.P50
		default:
			continue
		}
		res.HostOverFloorUS = &over
		if res.MovedNodesPerStep > 0 {
			per := over / res.MovedNodesPerStep
			res.HostUSPerMovedNode = &per
		}
	}
}

// Report is the outcome of one bench run.
type Report struct {
	Backend  string `json:"backend"`  // registered backend name ("sim", "cuda")
	Device   string `json:"device"`   // device description
	Workload string `json:"workload"` // workload name and shape
	Steps    int    `json:"steps"`    // measured steps per strategy
	// Simulated is true when the backend is a simulator: the times are its
	// model's, not a GPU measurement (see SimulatedBackend).
	Simulated bool     `json:"simulated"`
	Results   []Result `json:"results"` // one per strategy, in run order
	// Ranks, in the report of rank 0 of a run on several ranks (dp), holds
	// every rank's own report, by rank (rank 0's first), each without
	// Ranks or per-step samples; empty otherwise. WriteRanksTable shows
	// them side by side.
	Ranks []Report `json:"ranks,omitempty"`
	// NodeUpdates is the driver's own price of a moving step's node
	// updates, measured in the same run; nil when not measured.
	NodeUpdates *NodeUpdateProbe `json:"node_update_probe,omitempty"`
}

// NodeUpdateProbe is the host cost of one exec update of a kernel node
// whose parameter block is ParamBytes bytes, in a chain of Nodes nodes, in
// microseconds (medians over Samples samples): with the graph idle, and
// while it runs (what a step moving its nodes pays per node, the driver's
// own price).
type NodeUpdateProbe struct {
	ParamBytes int     `json:"param_bytes"`
	Nodes      int     `json:"nodes"`
	Samples    int     `json:"samples"`
	IdleUS     float64 `json:"idle_us_per_node"`
	InFlightUS float64 `json:"in_flight_us_per_node"`
}

// SimulatedBackend reports whether times measured on the registered
// backend name are simulated: true for "sim".
func SimulatedBackend(name string) bool { return name == "sim" }

// FloorRow is the name of the bench's floor row (workload.FloorRow): the
// step graph replayed with no buffer moving, against which the chart
// divides every strategy's time.
const FloorRow = "replay-fixed"

// Result is one strategy's measurements over the measured steps.
type Result struct {
	Strategy string `json:"strategy"`
	// StepUS is GPU time per step, microseconds.
	StepUS Percentiles `json:"step_us"`
	// HostUS is host time per step, microseconds.
	HostUS Percentiles `json:"host_us"`
	// LatencyUS is step latency, microseconds: from the host's call to the
	// end of the step's device work (host time before the launch, then
	// GPU time); nil in reports written before it was measured.
	LatencyUS *Percentiles `json:"latency_us,omitempty"`
	// GPUTiming says how StepUS was measured: GPUTimingGated (device
	// work alone) or GPUTimingEvents (events around the call: latency);
	// empty in reports written before it was recorded.
	GPUTiming string `json:"gpu_timing,omitempty"`
	// WallUS is wall time per step when steps run back to back, as a
	// training loop runs them (batches of steps timed by the host clock up
	// to a synchronization, divided by the batch size); nil when not
	// measured.
	WallUS *Percentiles `json:"wall_us,omitempty"`

	// MovedNodesPerStep is how many nodes the strategy moved from the
	// host per measured step (node updates; Counters.PatchedNodes), and
	// HostOverFloorUS its host time p50 over the floor's (the bench's
	// replay-fixed row), HostUSPerMovedNode the two divided: what moving
	// a node cost the host, to set beside Report.NodeUpdates. Nil when
	// not known (no floor; no node moved, for the last).
	MovedNodesPerStep  float64  `json:"moved_nodes_per_step"`
	HostOverFloorUS    *float64 `json:"host_over_floor_us,omitempty"`
	HostUSPerMovedNode *float64 `json:"host_us_per_moved_node,omitempty"`

	// PairedFloor, when the bench paired every row with the floor, is
	// the floor's step timed beside each of this row's measured
	// steps; HostOverFloorUS is then its HostOverUS. Nil otherwise.
	PairedFloor *PairedFloor `json:"paired_floor,omitempty"`

	// Totals over the measured steps.
	Rerecords    int64 `json:"rerecords"`
	GraphUpdates int64 `json:"graph_updates"`
	PatchedNodes int64 `json:"patched_nodes"`
	// TracesCaptured counts stream captures of traced commands (library
	// calls) in the measured steps: zero in steady state, unless a trace
	// is captured again every step.
	TracesCaptured int64 `json:"traces_captured"`
	BytesCopied    int64 `json:"bytes_copied"`
	// Remaps counts the ranges the remap strategy mapped to moved buffers
	// (Counters.Remaps); zero for the other strategies.
	Remaps int64 `json:"remaps,omitempty"`

	// PeakDeviceBytes is the most device memory the executable held.
	PeakDeviceBytes uint64 `json:"peak_device_bytes"`
	// OutputsMatchEager is true when every step's outputs equal, bit for
	// bit, those of the eager run on the same inputs.
	OutputsMatchEager bool `json:"outputs_match_eager"`

	// StepSamplesUS and HostSamplesUS are the per-step times behind the
	// percentiles, in step order (for plotting).
	StepSamplesUS []float64 `json:"step_samples_us,omitempty"`
	HostSamplesUS []float64 `json:"host_samples_us,omitempty"`
	// LatencySamplesUS are the per-step latencies behind LatencyUS.
	LatencySamplesUS []float64 `json:"latency_samples_us,omitempty"`

	// Note says why the strategy fell back or failed; empty otherwise.
	Note string `json:"note,omitempty"`

	// Unchecked marks a result whose outputs were not compared with eager
	// at all (OutputsMatchEager is then false and says nothing); the table
	// shows "-". It is not part of the JSON: say so in Note.
	Unchecked bool `json:"-"`
}

// PairedFloor is the floor's step (the graph replayed with nothing
// moving) timed beside a row's measured steps, the same way, and the row
// against it block by block. The host's clock on a GPU machine moves
// between regimes that last many steps; a block of the row's steps and the
// floor's block beside it share one, so the medians over the blocks of
// their differences and ratios compare the two without the regime, where
// the p50s of rows run seconds apart do not.
//
// The steps go in blocks, not one by one, because each side pays for
// following the other: the floor is an executable of its own, with its own
// weights, and a workload whose two sets of weights do not fit in the
// card's L2 together finds its own evicted after the other's step
// (BENCHMARKS.md, section 00). Taken step by step, the per-step figures
// were two populations, and which side paid depended on the order. So
// after every Block steps of the row the floor runs a step untimed and then
// Block timed ones; the row's first step of a block, which follows the
// floor's, is left out of the comparison with the floor's step beside it
// (not out of the row's own percentiles), and every figure compares warm
// steps with warm steps, as a loop of steps runs them.
type PairedFloor struct {
	// Block is how many of the row's steps each floor block follows (the
	// last block may hold fewer).
	Block int `json:"block"`
	// HostUS, LatencyUS and GPUUS are the floor steps' own percentiles,
	// and HostSamplesUS, LatencySamplesUS and GPUSamplesUS their samples,
	// in step order, one for each of the row's.
	HostUS           Percentiles `json:"host_us"`
	LatencyUS        Percentiles `json:"latency_us"`
	GPUUS            Percentiles `json:"gpu_us"`
	HostSamplesUS    []float64   `json:"host_samples_us,omitempty"`
	LatencySamplesUS []float64   `json:"latency_samples_us,omitempty"`
	GPUSamplesUS     []float64   `json:"gpu_samples_us,omitempty"`
	// HostOverUS is the median over the blocks of the row's mean host time
	// minus the floor's; LatencyRatio and GPURatio the medians of the
	// row's mean latency and GPU time over the floor's (0 when either side
	// was not measured). The card's clock moves between rows run seconds
	// apart as the host's does, so the GPU time is set against the floor's
	// taken beside it too.
	HostOverUS   float64 `json:"host_over_us"`
	LatencyRatio float64 `json:"latency_ratio,omitempty"`
	GPURatio     float64 `json:"gpu_ratio,omitempty"`
}

// NewPairedFloor pairs a row's host, latency and GPU samples with the
// floor's taken beside them in blocks of block steps (microseconds, step
// order; the slices of one kind have one length, and latencies and GPU
// times may be absent). It returns nil when there is no pair.
func NewPairedFloor(block int, hostUS, latencyUS, gpuUS, floorHostUS, floorLatencyUS, floorGPUUS []float64) *PairedFloor {
	n := min(len(hostUS), len(floorHostUS))
	if n == 0 {
		return nil
	}
	block = max(block, 1)
	p := &PairedFloor{Block: block, HostUS: Summarize(floorHostUS), HostSamplesUS: floorHostUS}
	p.HostOverUS = blockMedian(block, hostUS, floorHostUS, func(x, f float64) (float64, bool) { return x - f, true })
	if len(latencyUS) > 0 && len(floorLatencyUS) > 0 {
		p.LatencyUS, p.LatencySamplesUS = Summarize(floorLatencyUS), floorLatencyUS
		p.LatencyRatio = medianRatio(block, latencyUS, floorLatencyUS)
	}
	if len(gpuUS) > 0 && len(floorGPUUS) > 0 {
		p.GPUUS, p.GPUSamplesUS = Summarize(floorGPUUS), floorGPUUS
		p.GPURatio = medianRatio(block, gpuUS, floorGPUUS)
	}
	return p
}

// medianRatio is blockMedian of the ratio of the means, over the blocks
// whose floor mean is positive; 0 when there is none.
func medianRatio(block int, x, f []float64) float64 {
	return blockMedian(block, x, f, func(x, f float64) (float64, bool) { return x / f, f > 0 })
}

// blockMedian is the median over blocks of block steps of cmp(the mean of
// the row's x, the mean of the floor's f), both without the block's first
// step (a block of one step keeps it), leaving out a block cmp refuses; 0
// when cmp takes none.
func blockMedian(block int, x, f []float64, cmp func(x, f float64) (float64, bool)) float64 {
	n := min(len(x), len(f))
	var figs []float64
	for lo := 0; lo < n; lo += block {
		hi := min(lo+block, n)
		first := lo
		if hi-lo > 1 {
			first++ // it follows the floor's block
		}
		if v, ok := cmp(mean(x[first:hi]), mean(f[first:hi])); ok {
			figs = append(figs, v)
		}
	}
	if len(figs) == 0 {
		return 0
	}
	return Percentile(figs, 50)
}

func mean(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// The values of Result.GPUTiming.
const (
	// GPUTimingGated: the stream waited behind a gate while the host
	// enqueued the step, and the GPU time is from an event after the gate
	// to one after the step: the device's work alone.
	GPUTimingGated = "gated"
	// GPUTimingEvents: events around the host's call, on an idle stream;
	// the GPU time includes the host time before the launch (it is then
	// the latency).
	GPUTimingEvents = "events"
)

// Percentiles summarise samples, in the unit of the field that holds them.
type Percentiles struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
}

// Summarize returns the p50 and p90 of samples (zero for no samples). It
// does not modify samples.
func Summarize(samples []float64) Percentiles {
	return Percentiles{P50: Percentile(samples, 50), P90: Percentile(samples, 90)}
}

// Percentile returns the p-th percentile (0 <= p <= 100, clamped) of
// samples by linear interpolation between closest ranks (see the package
// doc). It returns 0 for no samples, so that the result always encodes as
// JSON. NaN samples sort first. samples is not modified.
func Percentile(samples []float64, p float64) float64 {
	if len(samples) == 0 {
		return 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	return sortedPercentile(s, p)
}

func sortedPercentile(s []float64, p float64) float64 {
	p = math.Max(0, math.Min(100, p))
	h := float64(len(s)-1) * p / 100
	lo := int(math.Floor(h))
	hi := min(lo+1, len(s)-1)
	return s[lo] + (h-float64(lo))*(s[hi]-s[lo])
}

// SetSamples stores step and host samples (microseconds) in r and fills
// StepUS and HostUS from them.
func (r *Result) SetSamples(stepUS, hostUS []float64) {
	r.StepSamplesUS = stepUS
	r.HostSamplesUS = hostUS
	r.StepUS = Summarize(stepUS)
	r.HostUS = Summarize(hostUS)
}

// SetLatency stores latency samples (microseconds) in r and fills
// LatencyUS from them.
func (r *Result) SetLatency(latencyUS []float64) {
	r.LatencySamplesUS = latencyUS
	p := Summarize(latencyUS)
	r.LatencyUS = &p
}

// Result returns the result for strategy, and false when there is none.
func (r *Report) Result(strategy string) (Result, bool) {
	for _, res := range r.Results {
		if res.Strategy == strategy {
			return res, true
		}
	}
	return Result{}, false
}

// WriteJSON writes r as indented JSON. Samples are included unless
// withSamples is false.
func (r *Report) WriteJSON(w io.Writer, withSamples bool) error {
	out := *r
	if !withSamples {
		out.Results = slices.Clone(r.Results)
		for i := range out.Results {
			out.Results[i].StepSamplesUS = nil
			out.Results[i].HostSamplesUS = nil
			out.Results[i].LatencySamplesUS = nil
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(&out); err != nil {
		return fmt.Errorf("report: write json: %w", err)
	}
	return nil
}

// ReadJSON decodes a report written by WriteJSON. Unknown fields are
// rejected, so that a misspelt key is found rather than silently dropped.
func ReadJSON(rd io.Reader) (*Report, error) {
	dec := json.NewDecoder(rd)
	dec.DisallowUnknownFields()
	var r Report
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("report: read json: %w", err)
	}
	return &r, nil
}
