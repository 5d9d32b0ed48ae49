package drivercost

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/stablegraph/stablegraph/report"
)

// Row names. Graph rows are formats over K.
const (
	RowStreamCreate       = "StreamCreate, per stream"
	RowStreamDestroy      = "StreamDestroy, per stream"
	RowStreamCreateBatch  = "StreamCreate, batch of 112"
	RowStreamDestroyBatch = "StreamDestroy, batch of 112"
	RowEventCreate        = "EventCreate"
	RowEventDestroy       = "EventDestroy"
	RowMemAlloc           = "MemAlloc 2 MiB"
	RowMemFree            = "MemFree 2 MiB"
	RowWriteValueEnqueue  = "StreamWriteValue64 enqueue"
	RowWriteValueSeen     = "StreamWriteValue64 until the host sees it"
	RowCopy1M             = "D2D copy 1 MiB"
	RowCopy64M            = "D2D copy 64 MiB"
	RowParamInfo          = "FuncParamInfo, per call"

	rowCapture         = "graph K=%d: capture, per launch"
	rowInstantiate     = "graph K=%d: instantiate, per node"
	rowFirstLaunch     = "graph K=%d: first GraphLaunch (uploads the graph)"
	rowLaunch          = "graph K=%d: GraphLaunch"
	rowReplay          = "graph K=%d: replay, per node"
	rowEager           = "graph K=%d: eager launches, per kernel"
	rowEagerHost       = "graph K=%d: eager LaunchKernel host, per kernel"
	rowExecUpdate      = "graph K=%d: GraphExecUpdate"
	rowRecaptureUpdate = "graph K=%d: re-capture + GraphExecUpdate"
	rowSetParams       = "graph K=%d: ExecKernelNodeSetParams, per node"
)

// GraphRow returns the name of a graph row for K kernels; what is one of
// "capture", "instantiate", "first-launch", "launch", "replay", "eager",
// "eager-host", "update", "recapture-update", "set-params" (empty for
// anything else).
func GraphRow(what string, k int) string {
	f, ok := map[string]string{
		"capture": rowCapture, "instantiate": rowInstantiate, "first-launch": rowFirstLaunch, "launch": rowLaunch,
		"replay": rowReplay, "eager": rowEager, "eager-host": rowEagerHost, "update": rowExecUpdate,
		"recapture-update": rowRecaptureUpdate, "set-params": rowSetParams,
	}[what]
	if !ok {
		return ""
	}
	return fmt.Sprintf(f, k)
}

func vmmRows(size uint64) [7]string {
	var r [7]string
	for i, op := range []string{"MemCreate", "MemAddressReserve", "MemMap", "MemSetAccess", "MemUnmap", "MemAddressFree", "MemRelease"} {
		r[i] = fmt.Sprintf("VMM %s %s", sizeName(size), op)
	}
	return r
}

func sizeName(size uint64) string { return FormatSize(size) }

// FormatSize names a size as the rows do: "2 MiB", "64 MiB", "512 KiB".
func FormatSize(size uint64) string {
	switch {
	case size >= 1<<20 && size%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", size>>20)
	case size >= 1<<10 && size%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", size>>10)
	}
	return fmt.Sprintf("%d B", size)
}

// references are the medians measured on the project's H100 machine, in
// microseconds, copied from docs/GPU-MACHINE.md ("Costs"), keyed by row name.
// Rows the document gives no figure for are absent.
var references = func() map[string]float64 {
	r := map[string]float64{
		RowStreamCreate:       1.6,
		RowStreamDestroy:      1.6,
		RowStreamCreateBatch:  320,
		RowStreamDestroyBatch: 216,
		RowEventCreate:        0.27,
		RowEventDestroy:       0.24,
		RowMemAlloc:           32,
		RowMemFree:            29,
		RowWriteValueEnqueue:  1.0,
		RowWriteValueSeen:     4.0,
		RowCopy1M:             6.8,
		RowCopy64M:            51.5,
		RowParamInfo:          0.54,
	}
	for name, v := range map[string]float64{
		"MemCreate": 8.3, "MemAddressReserve": 0.75, "MemMap": 0.88, "MemSetAccess": 20.8,
		"MemUnmap": 15.0, "MemAddressFree": 0.61, "MemRelease": 10.3,
	} {
		r["VMM 2 MiB "+name] = v
	}
	for name, v := range map[string]float64{"MemSetAccess": 39, "MemUnmap": 25, "MemRelease": 45} {
		r["VMM 64 MiB "+name] = v
	}
	for _, k := range []int{10, 100, 1000} {
		r[fmt.Sprintf(rowCapture, k)] = 0.63
		r[fmt.Sprintf(rowInstantiate, k)] = 1.1
		r[fmt.Sprintf(rowReplay, k)] = 1.0
		r[fmt.Sprintf(rowEager, k)] = 3.2
		r[fmt.Sprintf(rowSetParams, k)] = 0.33
	}
	r[fmt.Sprintf(rowInstantiate, 1000)] = 1.114 // per node, from the document's whole-graph figure
	r[fmt.Sprintf(rowLaunch, 10)] = 1.4
	r[fmt.Sprintf(rowLaunch, 1000)] = 2.4
	r[fmt.Sprintf(rowExecUpdate, 10)] = 2.1
	r[fmt.Sprintf(rowExecUpdate, 100)] = 11.6
	r[fmt.Sprintf(rowExecUpdate, 1000)] = 158
	r[fmt.Sprintf(rowRecaptureUpdate, 1000)] = 680
	return r
}()

// Reference returns the H100 reference figure for a row (docs/GPU-MACHINE.md),
// in microseconds, and false where the document gives none.
func Reference(row string) (float64, bool) {
	v, ok := references[row]
	return v, ok
}

// ReferenceLabel describes where the reference figures come from.
const ReferenceLabel = "H100 reference (docs/GPU-MACHINE.md, driver 580, CUDA 13.0)"

// WriteTable renders r as a text table: one row per operation with its
// clock, median, p90 and sample count in microseconds, and on hardware the
// H100 reference and the ratio of the median to it. On a simulator the
// title says the times are simulated, the time columns are named "sim", and
// no reference is shown.
func (r *Result) WriteTable(w io.Writer) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "backend %s, device %d: %s; microseconds", r.Backend, r.Props.Ordinal, r.Device)
	if r.Simulated {
		fmt.Fprintf(&b, "\n%s\n\n", report.SimulatedNote)
	} else {
		fmt.Fprintf(&b, "; ref = %s\n\n", ReferenceLabel)
	}
	tw := report.NewTabWriter(&b)
	if r.Simulated {
		fmt.Fprintln(tw, "operation\tclock\tsim p50 µs\tsim p90 µs\tn")
	} else {
		fmt.Fprintln(tw, "operation\tclock\tp50 µs\tp90 µs\tn\tH100 ref µs\tp50/ref")
	}
	var skipped []string
	for _, row := range r.Rows {
		p50, p90 := report.FormatUS(row.P50), report.FormatUS(row.P90)
		if row.Skipped != "" {
			p50, p90 = "skipped", "-"
			skipped = append(skipped, row.Name+": "+row.Skipped)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d", row.Name, row.Clock, p50, p90, row.Samples)
		if !r.Simulated {
			ref, ratio := "-", "-"
			if row.ReferenceUS != nil {
				ref = report.FormatUS(*row.ReferenceUS)
				if row.Skipped == "" && *row.ReferenceUS > 0 {
					ratio = strconv.FormatFloat(row.P50 / *row.ReferenceUS, 'f', 2, 64) + "x"
				}
			}
			fmt.Fprintf(tw, "\t%s\t%s", ref, ratio)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	if len(skipped) > 0 {
		b.WriteString("\nskipped:\n  " + strings.Join(skipped, "\n  ") + "\n")
	}
	if _, err := w.Write(b.Bytes()); err != nil {
		return fmt.Errorf("drivercost: write table: %w", err)
	}
	return nil
}

// WriteJSON writes r as indented JSON.
func (r *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("drivercost: write json: %w", err)
	}
	return nil
}
