package replay

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph/internal/simtest"
)

// TestPickProbed checks the decision rule on the cases of
// testdata/probe_picks.txt, and the median.
func TestPickProbed(t *testing.T) {
	for _, row := range simtest.Table(t, "testdata/probe_picks.txt", 4) {
		bound, err := ParseBound(row[1])
		if err != nil || row[1] == "" {
			t.Fatalf("%s: bound %q: %v", row[0], row[1], err)
		}
		var ms []probeResult
		for _, c := range strings.Split(row[2], ";") {
			var m probeResult
			if _, err := fmt.Sscan(c, &m.gpuUS, &m.hostUS, &m.n); err != nil {
				t.Fatalf("%s: %q: %v", row[0], c, err)
			}
			ms = append(ms, m)
		}
		want, err := strconv.Atoi(row[3])
		if err != nil {
			t.Fatal(err)
		}
		if got := pickProbed(ms, bound); got != want {
			t.Errorf("%s (%s): picked %d, want %d", row[0], bound, got, want)
		}
	}
	for _, c := range []struct {
		v    []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{9, 1, 5}, 5}, {[]float64{4, 1, 3, 100}, 3.5}} {
		if got := median(c.v); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.v, got, c.want)
		}
	}
}
