package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
)

func TestTrend(t *testing.T) {
	for _, c := range []struct {
		vals []float64
		flat bool
	}{
		{nil, true},
		{[]float64{1, 100}, true}, // too few to judge
		{[]float64{10, 10, 10, 10, 10, 10}, true},
		{[]float64{10, 10, 10, 10, 10, 11}, true}, // within 10%
		{[]float64{10, 10, 10, 12, 12, 12}, false},
		{[]float64{12, 12, 12, 10, 10, 10}, true}, // shrinking is fine
	} {
		if got := trendOf(c.vals, 0, 0.1); got.Flat != c.flat {
			t.Errorf("%v: flat %v, want %v (%s)", c.vals, got.Flat, c.flat, got)
		}
	}
}

// TestShortSoak soaks every workload briefly on the sim, every strategy in
// turn: no mismatch, memory flat, progress reported, a report that encodes.
func TestShortSoak(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	workloads := map[string]time.Duration{"mlp": 2 * time.Second, "train": 2 * time.Second, "chain-moving": 1500 * time.Millisecond, "dp": 3 * time.Second}
	if testing.Short() {
		workloads = map[string]time.Duration{"train": time.Second}
	}
	for name, d := range workloads {
		t.Run(name, func(t *testing.T) {
			b, err := sim.New(sim.Config{DeviceMemory: 1 << 30})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if live := b.LiveHandles(); !live.IsZero() {
					t.Errorf("handles live after the soak: %s", live)
				}
				b.Close()
			}()
			var progress []Progress
			cfg := Config{
				// A segment per strategy (and room for the segments'
				// overhead), long enough for a trend even on a loaded
				// machine: a memory sample after every checked step once the
				// 30 warm-up steps have filled the caches.
				Workload: name, Duration: d, CheckEvery: 3, Warmup: 30,
				Segment:     d / time.Duration(len(sg.Strategies())+1),
				Interval:    d / 4,
				SampleEvery: time.Millisecond,
				Progress:    func(p Progress) { progress = append(progress, p) },
			}
			cfg.Shape.Layers, cfg.Shape.Width, cfg.Shape.Batch, cfg.Shape.K = 2, 32, 4, 16
			rep, err := Run(context.Background(), b, cfg)
			if err != nil {
				t.Fatal(err)
			}
			var text bytes.Buffer
			rep.WriteText(&text)
			t.Logf("\n%s", text.String())
			if !rep.OK() || rep.Memory != MemoryFlat {
				t.Fatalf("soak failed (memory %s)", rep.Memory)
			}
			if rep.Steps == 0 || rep.Checks == 0 || len(rep.Strategies) != len(sg.Strategies()) {
				t.Fatalf("steps %d checks %d strategies %d", rep.Steps, rep.Checks, len(rep.Strategies))
			}
			for _, s := range rep.Strategies {
				if s.Segments == 0 || s.Checks == 0 {
					t.Errorf("%s: %d segments, %d checks", s.Strategy, s.Segments, s.Checks)
				}
			}
			if len(progress) < 2 || !progress[len(progress)-1].Final {
				t.Errorf("progress reported %d times, last final %v", len(progress), len(progress) > 0 && progress[len(progress)-1].Final)
			}
			js, err := json.Marshal(rep)
			if err != nil || !strings.Contains(string(js), `"mismatches":0`) {
				t.Errorf("JSON: %v %.200s", err, js)
			}
		})
	}
}

// TestShortSoakTooFewSamples: a soak too short for a trend says so, and
// does not pass, instead of calling memory flat on two samples.
func TestShortSoakTooFewSamples(t *testing.T) {
	b, err := sim.New(sim.Config{DeviceMemory: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// The default interval samples once a second: a 400 ms soak has one
	// sample per strategy at most.
	cfg := Config{Workload: "mlp", Duration: 400 * time.Millisecond, Strategies: []sg.Strategy{sg.StrategyPatch, sg.StrategyStable}}
	cfg.Shape.Layers, cfg.Shape.Width, cfg.Shape.Batch = 2, 16, 4
	rep, err := Run(context.Background(), b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", text.String())
	if rep.Memory != MemoryTooFewSamples || rep.MemoryFlat || rep.OK() {
		t.Errorf("memory %q, flat %v, OK %v; want too few samples, not flat, not OK", rep.Memory, rep.MemoryFlat, rep.OK())
	}
	if !slices.Equal(rep.Unjudged, []string{"patch", "stable", "baseline"}) {
		t.Errorf("unjudged %v", rep.Unjudged)
	}
	out := text.String()
	if !strings.Contains(out, "NOT JUDGED: mismatches 0, memory not judged: too few samples for a trend (patch, stable, baseline)") ||
		strings.Contains(out, "PASS") || strings.Contains(out, "memory flat") {
		t.Errorf("verdict:\n%s", out)
	}
}

// TestSegmentTrend: trends are taken within a segment, never across. auto
// may keep a different candidate in each segment, holding a different
// number of handles for the segment's whole life: a series that steps
// between segments but is flat within each is flat; growth within one
// segment is flagged, whatever the others do.
func TestSegmentTrend(t *testing.T) {
	samples := func(strategy string, segs ...[]int) []Sample {
		var out []Sample
		for seg, vals := range segs {
			// A warm-up sample, out of the trend whatever it holds.
			out = append(out, Sample{Strategy: strategy, Segment: 2 * seg, Warmup: true, Handles: 1000})
			for _, v := range vals {
				out = append(out, Sample{Strategy: strategy, Segment: 2 * seg, Handles: v})
				// Another strategy's sample in between: not this one's.
				out = append(out, Sample{Strategy: "other", Segment: 2*seg + 1, Handles: 10 * v})
			}
		}
		return out
	}
	handles := func(smp Sample) float64 { return float64(smp.Handles) }
	flat := []int{61, 61, 61, 61, 61, 61}
	for _, c := range []struct {
		name    string
		samples []Sample
		flat    bool
		seg     int
	}{
		// The H100 soak's auto: 61 handles in one segment, 62 in the next
		// (another candidate kept). Across segments it would be 61 -> 62.
		{"steps between segments", samples("auto", flat, []int{62, 62, 62, 62, 62, 62}), true, 0},
		{"steps down between segments", samples("auto", []int{69, 69, 69, 69}, flat, []int{68, 68, 68}), true, 2}, // 61 is closest to its tolerance
		{"grows within the second segment", samples("auto", flat, []int{62, 62, 62, 63, 63, 63}), false, 2},
		{"grows within the first segment", samples("auto", []int{61, 61, 62, 62}, []int{60, 60, 60}), false, 0},
		{"too few per segment", samples("auto", []int{61, 61}, []int{90, 90}, []int{120}), true, -1},
		{"a short segment is not judged", samples("auto", []int{61, 99}, flat), true, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			if all := trendOf(func() (v []float64) {
				for _, smp := range c.samples {
					if smp.Strategy == "auto" && !smp.Warmup {
						v = append(v, handles(smp))
					}
				}
				return v
			}(), 0, 0.01); c.name == "steps between segments" && all.Flat {
				t.Fatalf("across segments the series should grow (%s), or the case tests nothing", all)
			}
			got, seg := segmentTrend(c.samples, "auto", handles, 0, 0.01)
			if got.Flat != c.flat || seg != c.seg {
				t.Errorf("flat %v in segment %d (%s), want flat %v in segment %d", got.Flat, seg, got, c.flat, c.seg)
			}
		})
	}
}

// noDeviceUpdates is the sim on a driver without device-updatable graph
// nodes: the device strategy cannot run there.
type noDeviceUpdates struct{ *sim.Backend }

func (noDeviceUpdates) DeviceUpdatesSupported(int) error {
	return gpu.Errorf("DeviceUpdatesSupported", gpu.ErrNotSupported, "no device-side graph updates on this driver")
}

// TestSoakSkipsUnsupported: a strategy the device cannot run is reported
// as such, its segments skipped, and the soak judges the others; a soak of
// unsupported strategies only fails at once.
func TestSoakSkipsUnsupported(t *testing.T) {
	raw, err := sim.New(sim.Config{DeviceMemory: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	b := noDeviceUpdates{raw}
	cfg := Config{Workload: "mlp", Duration: 1500 * time.Millisecond, CheckEvery: 3, Warmup: 10, Segment: 500 * time.Millisecond,
		SampleEvery: time.Millisecond, Strategies: []sg.Strategy{sg.StrategyPatch, sg.StrategyDevice}}
	cfg.Shape.Layers, cfg.Shape.Width, cfg.Shape.Batch = 2, 16, 4
	rep, err := Run(context.Background(), b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", text.String())
	if rep.Error != "" || rep.Mismatches != 0 || rep.Memory == MemoryGrows {
		t.Fatalf("soak: error %q, %d mismatches, memory %s", rep.Error, rep.Mismatches, rep.Memory)
	}
	for _, s := range rep.Strategies {
		switch s.Strategy {
		case "device":
			if !strings.Contains(s.Unsupported, "no device-side graph updates") || s.Segments != 0 || s.Steps != 0 {
				t.Errorf("device: %+v", s)
			}
		case "patch":
			if s.Unsupported != "" || s.Segments == 0 || s.Checks == 0 {
				t.Errorf("patch: %+v", s)
			}
		}
	}
	if slices.Contains(rep.Unjudged, "device") || !strings.Contains(text.String(), "not supported here: ") {
		t.Errorf("unjudged %v; text:\n%s", rep.Unjudged, text.String())
	}
	cfg.Strategies = []sg.Strategy{sg.StrategyDevice}
	rep, err = Run(context.Background(), b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rep.Error, "no strategy of the soak can run") {
		t.Errorf("a soak of an unsupported strategy only: error %q", rep.Error)
	}
	if live := raw.LiveHandles(); !live.IsZero() {
		t.Errorf("handles live after the soaks: %s", live)
	}
}

// TestJudgedBaselines: the baseline trend leaves out the baseline before
// the first step and, once three baselines follow the first cycle of
// strategies, that whole cycle (a strategy's first use may set up driver
// state for good, as the device runtime does on CUDA).
func TestJudgedBaselines(t *testing.T) {
	seq := func(n int) []int {
		s := make([]int, n)
		for i := range s {
			s[i] = i
		}
		return s
	}
	for _, c := range []struct {
		baselines, strategies, first, n int
	}{
		{2, 9, 0, 2},   // too few to drop anything
		{3, 9, 1, 2},   // a short soak: from the end of the first segment
		{12, 9, 1, 11}, // the first cycle ends at baseline 9: only 2 after it
		{13, 9, 10, 3}, // three after the first cycle: judged from there
		{19, 9, 10, 9}, // two whole cycles: the second is judged
	} {
		got := judgedBaselines(seq(c.baselines), c.strategies)
		if len(got) != c.n || (len(got) > 0 && got[0] != c.first) {
			t.Errorf("%d baselines, %d strategies: judged %v, want %d from %d", c.baselines, c.strategies, got, c.n, c.first)
		}
	}
}
