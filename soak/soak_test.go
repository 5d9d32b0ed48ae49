package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	sg "stablegraph"
	"stablegraph/gpu"
	"stablegraph/gpu/sim"
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
	workloads := map[string]time.Duration{"mlp": 1500 * time.Millisecond, "train": 1500 * time.Millisecond, "chain-moving": 700 * time.Millisecond, "dp": 700 * time.Millisecond}
	if testing.Short() {
		workloads = map[string]time.Duration{"train": time.Second}
	}
	for name, d := range workloads {
		t.Run(name, func(t *testing.T) {
			b, err := sim.New(gpu.Config{DeviceMemory: 1 << 30})
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
				Workload: name, Duration: d, CheckEvery: 3, Warmup: 30,
				Segment:  d / time.Duration(len(sg.Strategies())+3),
				Interval: d / 4,
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
			if !rep.OK() {
				t.Fatalf("soak failed")
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
