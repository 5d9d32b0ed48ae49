package replay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph/gpu"

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

// sleeper is a candidate whose host work is a sleep and that enqueues no
// device work: what a probe measures of it is its host time.
type sleeper struct {
	d time.Duration
	n int
}

func (s *sleeper) Run(context.Context, gpu.Stream, []gpu.DevicePtr) (Result, error) {
	time.Sleep(s.d)
	s.n++
	return Result{}, nil
}
func (s *sleeper) Counters() Counters { return Counters{GraphLaunches: int64(s.n)} }
func (s *sleeper) Close() error       { return nil }

// TestProbeGPUTimeExcludesHost: auto times a measured step as the bench
// does, the stream held behind a gate while the candidate enqueues it, so a
// candidate whose host work is slow is charged it as host time and not
// again as GPU time (before, events around the call on an idle stream
// counted the host's time twice under the latency bound). Sleeps are
// lower bounds whatever the machine's load: the test asserts the host time
// at least the sleep and the GPU time a small part of it.
func TestProbeGPUTimeExcludesHost(t *testing.T) {
	const sleep = 30 * time.Millisecond
	b := simtest.New(t, 1)
	s := simtest.Stream(t, b, 0)
	slow, fast := &sleeper{d: sleep}, &sleeper{}
	spec := Spec{Backend: b, Options: Options{Auto: AutoOptions{ProbeSteps: 2, Bound: BoundLatency}}, Logger: slog.Default()}
	ch := Choice{Requested: Auto, Candidates: []Candidate{{Strategy: Patch, Usable: true}, {Strategy: Stable, Usable: true}}}
	a, err := newAutoProbe(spec, ch, []*probe{{strategy: Patch, st: slow, cand: 0}, {strategy: Stable, st: fast, cand: 1}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if a.gate == nil {
		t.Fatal("the sim can hold a stream behind a gate; the probe did not")
	}
	ctx := context.Background()
	for i := 0; a.Choice().Probing; i++ {
		if i > 40 {
			t.Fatalf("still probing after %d steps: %s", i, a.Choice().Reason)
		}
		if w := a.Acquire(); w != nil {
			t.Fatal("a candidate with nothing to wait for waited")
		}
		if _, err := a.Run(ctx, s, nil); err != nil {
			t.Fatal(err)
		}
		if err := b.StreamSynchronize(s); err != nil {
			t.Fatal(err)
		}
	}
	ch = a.Choice()
	if ch.Strategy != Stable {
		t.Errorf("kept %s, want the candidate without the sleep: %s", ch.Strategy, ch.Reason)
	}
	for _, c := range ch.Candidates {
		if c.Strategy != Patch {
			continue
		}
		if c.Probed != 2 || c.HostUS < float64(sleep.Microseconds()) || c.GPUUS > float64(sleep.Microseconds())/3 {
			t.Errorf("the sleeping candidate: %d steps measured, %.0f us host, %.0f us GPU; want 2, at least %d host and the GPU a small part of it",
				c.Probed, c.HostUS, c.GPUUS, sleep.Microseconds())
		}
	}
	if err := errors.Join(b.StreamSynchronize(s), a.Close()); err != nil {
		t.Fatal(err)
	}
}
