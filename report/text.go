package report

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// NewTabWriter returns the aligned-column writer every text table of the
// project uses: cells end with a tab, columns are left-aligned and two
// spaces apart. Flush it when done.
func NewTabWriter(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
}

// FormatUS formats a duration in microseconds with precision that suits
// its magnitude: 2 decimals below 10, 1 below 1000, none above.
func FormatUS(us float64) string {
	switch a := abs(us); {
	case a < 10:
		return strconv.FormatFloat(us, 'f', 2, 64)
	case a < 1000:
		return strconv.FormatFloat(us, 'f', 1, 64)
	default:
		return strconv.FormatFloat(us, 'f', 0, 64)
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// FormatBytes formats a byte count in binary units (B, KiB, MiB, GiB, TiB).
func FormatBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, suffix := float64(n), ""
	for _, s := range []string{"KiB", "MiB", "GiB", "TiB"} {
		v /= unit
		suffix = s
		if v < unit {
			break
		}
	}
	return fmt.Sprintf("%.1f %s", v, suffix)
}

// SimulatedNote is what every table and chart of simulated times says.
const SimulatedNote = "times are simulated (the sim backend's model running on this CPU), not a GPU measurement: compare them with no hardware figure"

// WriteTable renders r as a text table: a title line naming the backend,
// device, workload and steps (and, on a simulator, that the times are
// simulated), one row per strategy, then each result's note. Times are in
// microseconds, memory in binary units. The time columns are named for
// what they measure: "GPU" (the step's device work; see Result.GPUTiming),
// "host", "latency" (host call to the end of the device work) and "wall";
// on a simulator each is prefixed "sim".
func (r *Report) WriteTable(w io.Writer) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "backend %s, device %s, workload %s, %d steps\n", r.Backend, r.Device, r.Workload, r.Steps)
	step, host, lat, wall := "GPU", "host", "latency", "wall"
	if r.Simulated {
		fmt.Fprintf(&b, "%s\n", SimulatedNote)
		step, host, lat, wall = "sim step", "sim host", "sim latency", "sim wall"
	}
	b.WriteString("\n")
	tw := NewTabWriter(&b)
	fmt.Fprintf(tw, "strategy\t%[1]s p50 µs\t%[1]s p90 µs\t%[2]s p50 µs\t%[2]s p90 µs\t%[3]s p50 µs\t%[4]s p50 µs\tre-records\tupdates\tpatched nodes\ttraces captured\tcopied\tpeak memory\tmatches eager\n",
		step, host, lat, wall)
	var notes []string
	for _, res := range r.Results {
		match := "yes"
		switch {
		case res.Unchecked:
			match = "-"
		case !res.OutputsMatchEager:
			match = "NO"
		}
		latP50, wallP50 := "-", "-"
		if res.LatencyUS != nil {
			latP50 = FormatUS(res.LatencyUS.P50)
		}
		if res.WallUS != nil {
			wallP50 = FormatUS(res.WallUS.P50)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", res.Strategy,
			FormatUS(res.StepUS.P50), FormatUS(res.StepUS.P90), FormatUS(res.HostUS.P50), FormatUS(res.HostUS.P90), latP50, wallP50,
			res.Rerecords, res.GraphUpdates, res.PatchedNodes, res.TracesCaptured,
			FormatBytes(uint64(max(res.BytesCopied, 0))), FormatBytes(res.PeakDeviceBytes), match)
		if res.Note != "" {
			notes = append(notes, fmt.Sprintf("%s: %s", res.Strategy, res.Note))
		}
	}
	tw.Flush()
	r.writeAgainstFloor(&b, step, host, lat, wall)
	if len(notes) > 0 {
		b.WriteString("\nnotes:\n  " + strings.Join(notes, "\n  ") + "\n")
	}
	if _, err := w.Write(b.Bytes()); err != nil {
		return fmt.Errorf("report: write table: %w", err)
	}
	return nil
}

// writeAgainstFloor writes, when the report has a floor row, every
// strategy's wall, GPU and latency p50 over the floor's side by side, its
// host time over the floor's, the nodes it moved per step and its host time
// per moved node, beside the driver's price of one node update measured in
// the same run (NodeUpdates) and the ratio of the two.
func (r *Report) writeAgainstFloor(b *bytes.Buffer, step, host, lat, wall string) {
	floor, ok := r.Result(FloorRow)
	if !ok {
		return
	}
	probe := "no node update probe in this run"
	if p := r.NodeUpdates; p != nil {
		probe = fmt.Sprintf("node update probe, %d-byte parameters, chain of %d: %s µs per node in flight, %s idle",
			p.ParamBytes, p.Nodes, FormatUS(p.InFlightUS), FormatUS(p.IdleUS))
	}
	fmt.Fprintf(b, "\nagainst the floor (%s) and the driver (%s):\n", FloorRow, probe)
	if slices.ContainsFunc(r.Results, func(res Result) bool { return res.PairedFloor != nil }) {
		b.WriteString("(GPU, latency and host against the floor's step timed beside each of the row's: medians over blocks of steps of the ratios and differences of their means)\n")
	}
	tw := NewTabWriter(b)
	fmt.Fprintf(tw, "strategy\t%s ×floor\t%s ×floor\t%s ×floor\t%s over floor µs\tnodes moved/step\t%s µs/moved node\t÷probe\n", wall, step, lat, host, host)
	ratio := func(x, f float64) string {
		if f == 0 {
			return "-"
		}
		return strconv.FormatFloat(x/f, 'f', 2, 64) + "×"
	}
	for _, res := range r.Results {
		if res.Strategy == FloorRow || res.StepUS.P50 == 0 {
			continue
		}
		w, l, over, per, vs := "-", "-", "-", "-", "-"
		if res.WallUS != nil && floor.WallUS != nil {
			w = ratio(res.WallUS.P50, floor.WallUS.P50)
		}
		switch {
		case res.PairedFloor != nil && res.PairedFloor.LatencyRatio > 0:
			l = strconv.FormatFloat(res.PairedFloor.LatencyRatio, 'f', 2, 64) + "×"
		case res.LatencyUS != nil && floor.LatencyUS != nil:
			l = ratio(res.LatencyUS.P50, floor.LatencyUS.P50)
		}
		if res.HostOverFloorUS != nil {
			over = FormatUS(*res.HostOverFloorUS)
		}
		if res.HostUSPerMovedNode != nil {
			per = FormatUS(*res.HostUSPerMovedNode)
			if p := r.NodeUpdates; p != nil && p.InFlightUS > 0 {
				vs = ratio(*res.HostUSPerMovedNode, p.InFlightUS)
			}
		}
		g := ratio(res.StepUS.P50, floor.StepUS.P50)
		if res.PairedFloor != nil && res.PairedFloor.GPURatio > 0 {
			g = strconv.FormatFloat(res.PairedFloor.GPURatio, 'f', 2, 64) + "×"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", res.Strategy, w, g, l, over,
			strconv.FormatFloat(res.MovedNodesPerStep, 'f', -1, 64), per, vs)
	}
	tw.Flush()
}
