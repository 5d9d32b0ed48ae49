package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/workload"
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
// Segments are counted in steps and sampled after every checked step, so
// that the trends have as many samples on a loaded machine as on an idle
// one.
func TestShortSoak(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	workloads := []string{"mlp", "train", "chain-moving", "dp"}
	if testing.Short() {
		workloads = []string{"train"}
	}
	for _, name := range workloads {
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
				// One cycle of the strategies (a duration shorter than any
				// segment), each segment 54 steps: 24 of warm-up (the
				// caches fill, auto's probe ends), then a sample after
				// every third, checked, step: 10 for each trend.
				Workload: name, Duration: time.Nanosecond, CheckEvery: 3, Warmup: 24, SegmentSteps: 54,
				Interval: time.Nanosecond,
				Progress: func(p Progress) { progress = append(progress, p) },
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
				t.Fatalf("soak failed (memory %s, unjudged %v)", rep.Memory, rep.Unjudged)
			}
			if want := int64(54 * len(sg.Strategies())); rep.Steps != want || rep.Checks == 0 || len(rep.Strategies) != len(sg.Strategies()) {
				t.Fatalf("steps %d (want %d) checks %d strategies %d", rep.Steps, want, rep.Checks, len(rep.Strategies))
			}
			for _, s := range rep.Strategies {
				if s.Segments != 1 || s.Checks == 0 || s.Device.Samples != 10 {
					t.Errorf("%s: %d segments, %d checks, %d samples in the device trend; want 1 segment and 10 samples", s.Strategy, s.Segments, s.Checks, s.Device.Samples)
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
	// Segments of 6 steps: a warm-up of 2 (a third), a checked step
	// every 3: two samples after the warm-up, one short of a trend.
	cfg := Config{Workload: "mlp", Duration: time.Nanosecond, CheckEvery: 3, SegmentSteps: 6,
		Strategies: []sg.Strategy{sg.StrategyPatch, sg.StrategyStable}}
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

// TestTooFewSamplesNeverGrow: with fewer than three baselines the first
// is the cold start, before any step loaded what stays for the process's
// life; a soak that short (or interrupted that soon) is not judged, and
// never reads as growth.
func TestTooFewSamplesNeverGrow(t *testing.T) {
	b, err := sim.New(sim.Config{DeviceMemory: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	cfg, err := Config{Strategies: []sg.Strategy{sg.StrategyPatch}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	s := &soaker{cfg: cfg, b: b, now: time.Now, start: time.Now(), rep: &Report{},
		perStrat: map[sg.Strategy]*StrategyReport{sg.StrategyPatch: {Strategy: "patch", FirstMismatch: -1}},
		// Cold start, then after the first segment: 64 MiB more held for
		// good (lazily loaded modules, say).
		baselines: []baseline{{used: 1 << 20, goroutines: 4, heap: 1 << 20}, {used: 65 << 20, goroutines: 4, heap: 1 << 20}},
	}
	s.finish()
	if s.rep.Memory != MemoryTooFewSamples || !s.rep.BaselineDevice.Flat || !slices.Contains(s.rep.Unjudged, "baseline") {
		t.Errorf("memory %q, baseline device trend %s, unjudged %v; want too few samples", s.rep.Memory, s.rep.BaselineDevice, s.rep.Unjudged)
	}

	// Interrupted in its second segment, a real soak says the same.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	run := Config{Workload: "mlp", Duration: time.Hour, SegmentSteps: 40, CheckEvery: 3, Interval: time.Nanosecond,
		Strategies: []sg.Strategy{sg.StrategyPatch, sg.StrategyStable},
		Progress: func(p Progress) {
			if p.Segment == 1 {
				cancel()
			}
		}}
	run.Shape.Layers, run.Shape.Width, run.Shape.Batch = 2, 16, 4
	rep, err := Run(ctx, b, run)
	if err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	rep.WriteText(&text)
	if !rep.Interrupted || rep.Memory != MemoryTooFewSamples || !strings.Contains(text.String(), "NOT JUDGED") ||
		strings.Contains(text.String(), "grows") || strings.Contains(text.String(), "GROWS") {
		t.Errorf("interrupted %v, memory %q:\n%s", rep.Interrupted, rep.Memory, text.String())
	}
}

// TestSamplingFollowsSegment: the sampling rate follows from the segment
// (and so from the duration), not from the progress interval: a 20 s soak
// with the defaults has room for a trend in every segment.
func TestSamplingFollowsSegment(t *testing.T) {
	cfg, err := Config{Duration: 20 * time.Second}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if perSegment := cfg.Segment / cfg.SampleEvery; perSegment < 20 {
		t.Errorf("segment %v, a sample every %v: %d samples a segment at most", cfg.Segment, cfg.SampleEvery, perSegment)
	}
	if cfg.Interval != DefaultInterval || cfg.SampleEvery >= cfg.Interval/30 {
		t.Errorf("interval %v, sample every %v: the interval still sets the sampling", cfg.Interval, cfg.SampleEvery)
	}
	if _, err := (Config{Pattern: workload.Swap}).withDefaults(); !errors.Is(err, ErrSwap) {
		t.Errorf("swap: %v", err)
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

// tickClock is a clock that moves on by tick every time it is read: time
// that passes with the soak's own work, the same on any machine.
type tickClock struct {
	mu   sync.Mutex
	t    time.Time
	tick time.Duration
}

func (c *tickClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(c.tick)
	return c.t
}

// TestSegmentRunsOnForATrend: a segment too short for its warm-up runs on
// past its time until its strategy has a trend, for at most three more
// segments' time; then the soak is not judged.
func TestSegmentRunsOnForATrend(t *testing.T) {
	b, err := sim.New(sim.Config{DeviceMemory: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, c := range []struct {
		warmup int
		judged bool
	}{{30, true}, {100000, false}} {
		// A segment is 100 reads of the clock: a few dozen steps.
		cfg := Config{Workload: "mlp", Duration: time.Nanosecond, Segment: 100 * time.Millisecond, Warmup: c.warmup,
			CheckEvery: 3, Strategies: []sg.Strategy{sg.StrategyPatch}}
		cfg.Shape.Layers, cfg.Shape.Width, cfg.Shape.Batch = 2, 16, 4
		var steps []int64
		cfg.Interval = time.Nanosecond
		cfg.Progress = func(p Progress) {
			if p.Elapsed < cfg.Segment {
				steps = append(steps, p.Steps)
			}
		}
		clock := &tickClock{t: time.Unix(0, 0), tick: time.Millisecond}
		rep, err := run(context.Background(), b, cfg, clock.now)
		if err != nil {
			t.Fatal(err)
		}
		st := rep.Strategies[0]
		inTime := steps[len(steps)-1]
		t.Logf("warm-up %d: %d steps in the segment's time, %d in all; device trend %s", c.warmup, inTime, st.Steps, segmentTrendString(st.Device, st.DeviceSegment))
		if inTime >= int64(c.warmup)+minTrendSamples {
			t.Fatalf("the segment's time held %d steps: the case tests nothing", inTime)
		}
		if judged := st.DeviceSegment == 0 && st.Device.Samples >= minTrendSamples; judged != c.judged {
			t.Errorf("warm-up %d: trend in segment %d of %d samples; want judged %v", c.warmup, st.DeviceSegment, st.Device.Samples, c.judged)
		}
		if elapsed := time.Duration(rep.DurationS * float64(time.Second)); elapsed > 4*cfg.Segment+50*time.Millisecond {
			t.Errorf("warm-up %d: ran %v on a segment of %v: past the three more segments allowed", c.warmup, elapsed, cfg.Segment)
		}
	}
}
