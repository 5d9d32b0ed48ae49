package report

import (
	"bytes"
	"strings"
	"testing"
)

// TestWriteRanksTable: one line per strategy, each rank's numbers in rank
// order, "no" when any rank's outputs differ or a rank has no row; nothing
// for a report without ranks.
func TestWriteRanksTable(t *testing.T) {
	rank := func(gpu float64, match bool) Report {
		wall := Percentiles{P50: gpu + 10}
		return Report{Results: []Result{
			{Strategy: "eager", StepUS: Percentiles{P50: gpu, P90: gpu + 1}, WallUS: &wall, OutputsMatchEager: true},
			{Strategy: "patch", StepUS: Percentiles{P50: gpu / 2, P90: gpu/2 + 1}, OutputsMatchEager: match},
		}}
	}
	r := Report{Ranks: []Report{rank(100, true), rank(200, false)}}
	var buf bytes.Buffer
	if err := r.WriteRanksTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"per rank (ranks 0..1", "100.0 200.0", "110.0 210.0", "50.0 100.0"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.Contains(lines[2], "yes") || !strings.Contains(lines[3], "no") {
		t.Errorf("lines:\n%s", out)
	}
	buf.Reset()
	if err := (&Report{}).WriteRanksTable(&buf); err != nil || buf.Len() != 0 {
		t.Errorf("no ranks: %q, %v", buf.String(), err)
	}
}
