package report

import (
	"bytes"
	"fmt"
	"io"
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
	if len(notes) > 0 {
		b.WriteString("\nnotes:\n  " + strings.Join(notes, "\n  ") + "\n")
	}
	if _, err := w.Write(b.Bytes()); err != nil {
		return fmt.Errorf("report: write table: %w", err)
	}
	return nil
}
