package report

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Align is a column's alignment in a Table.
type Align int

const (
	Left Align = iota
	Right
)

// Table is a text table with aligned columns: a header row, a rule, and the
// rows. Columns are separated by two spaces; trailing spaces are trimmed.
type Table struct {
	Header []string
	Align  []Align // per column; missing entries are Left
	Rows   [][]string
}

// AddRow appends a row.
func (t *Table) AddRow(cells ...string) { t.Rows = append(t.Rows, cells) }

// Write renders t to w.
func (t *Table) Write(w io.Writer) error {
	ncol := len(t.Header)
	for _, r := range t.Rows {
		ncol = max(ncol, len(r))
	}
	width := make([]int, ncol)
	measure := func(r []string) {
		for i, c := range r {
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	measure(t.Header)
	for _, r := range t.Rows {
		measure(r)
	}
	var b strings.Builder
	line := func(r []string) {
		var l strings.Builder
		for i := 0; i < ncol; i++ {
			c := ""
			if i < len(r) {
				c = r[i]
			}
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if i > 0 {
				l.WriteString("  ")
			}
			if i < len(t.Align) && t.Align[i] == Right {
				l.WriteString(pad + c)
			} else {
				l.WriteString(c + pad)
			}
		}
		b.WriteString(strings.TrimRight(l.String(), " "))
		b.WriteByte('\n')
	}
	if len(t.Header) > 0 {
		line(t.Header)
		rule := make([]string, ncol)
		for i := range rule {
			rule[i] = strings.Repeat("-", width[i])
		}
		line(rule)
	}
	for _, r := range t.Rows {
		line(r)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("report: write table: %w", err)
	}
	return nil
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

// WriteTable renders r as a text table: a title line naming the backend,
// device, workload and steps, one row per strategy, then each result's note.
// Times are in microseconds, memory in binary units.
func (r *Report) WriteTable(w io.Writer) error {
	title := fmt.Sprintf("backend %s, device %s, workload %s, %d steps\n\n", r.Backend, r.Device, r.Workload, r.Steps)
	if _, err := io.WriteString(w, title); err != nil {
		return fmt.Errorf("report: write table: %w", err)
	}
	t := Table{
		Header: []string{"strategy", "step p50 µs", "step p90 µs", "host p50 µs", "host p90 µs", "wall p50 µs",
			"re-records", "updates", "patched nodes", "copied", "peak memory", "matches eager"},
		Align: []Align{Left, Right, Right, Right, Right, Right, Right, Right, Right, Right, Right, Left},
	}
	var notes []string
	for _, res := range r.Results {
		match := "yes"
		switch {
		case res.Unchecked:
			match = "-"
		case !res.OutputsMatchEager:
			match = "NO"
		}
		wall := "-"
		if res.WallUS != nil {
			wall = FormatUS(res.WallUS.P50)
		}
		t.AddRow(res.Strategy,
			FormatUS(res.StepUS.P50), FormatUS(res.StepUS.P90),
			FormatUS(res.HostUS.P50), FormatUS(res.HostUS.P90), wall,
			strconv.FormatInt(res.Rerecords, 10), strconv.FormatInt(res.GraphUpdates, 10),
			strconv.FormatInt(res.PatchedNodes, 10), FormatBytes(uint64(max(res.BytesCopied, 0))),
			FormatBytes(res.PeakDeviceBytes), match)
		if res.Note != "" {
			notes = append(notes, fmt.Sprintf("%s: %s", res.Strategy, res.Note))
		}
	}
	if err := t.Write(w); err != nil {
		return err
	}
	if len(notes) > 0 {
		if _, err := io.WriteString(w, "\nnotes:\n  "+strings.Join(notes, "\n  ")+"\n"); err != nil {
			return fmt.Errorf("report: write table: %w", err)
		}
	}
	return nil
}
