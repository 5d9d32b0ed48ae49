package replay

import "testing"

// TestPickProbed checks the decision rule: lowest GPU time, then host time,
// times within 2% or 0.5 µs being equal, ties to the model's order, and
// candidates not measured left out.
func TestPickProbed(t *testing.T) {
	for _, c := range []struct {
		name string
		ms   []probeResult
		want int
	}{
		{"none measured", []probeResult{{}, {}}, -1},
		// The H100 figures with random movement: stable's GPU time wins
		// although the model put patch first.
		{"gpu decides", []probeResult{{86.4, 31, 3}, {67.7, 9.9, 3}, {70.3, 14.2, 3}}, 1},
		// Ping-pong: patch's lower GPU time wins.
		{"model's choice fastest", []probeResult{{62.0, 6.5, 3}, {68.0, 10.3, 3}, {64.3, 8.3, 3}}, 0},
		{"gpu tie, host decides", []probeResult{{60, 9, 3}, {60.8, 4, 3}}, 1},
		{"full tie keeps the model's order", []probeResult{{60, 4, 3}, {60.5, 4.2, 3}}, 0},
		{"sub-microsecond gpu tie", []probeResult{{5.3, 1.0, 3}, {5.1, 1.0, 3}}, 0},
		{"unmeasured skipped", []probeResult{{1, 1, 0}, {50, 5, 3}, {40, 5, 1}}, 2},
	} {
		if got := pickProbed(c.ms); got != c.want {
			t.Errorf("%s: picked %d, want %d", c.name, got, c.want)
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
