package replay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/commtest"
	"github.com/stablegraph/stablegraph/internal/perrank"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/replay"
	"github.com/stablegraph/stablegraph/workload"
)

// rankTimes are the probe times each rank "measures" (GPU µs; host time
// 1 µs for all), so that rank 0 alone would keep patch and rank 1 alone
// stable, while the slowest rank's times make device the fastest.
var rankTimes = map[int]map[replay.Name]float64{
	0: {replay.Patch: 10, replay.Device: 50, replay.Stable: 100, replay.Pool: 60},
	1: {replay.Patch: 100, replay.Device: 50, replay.Stable: 10, replay.Pool: 60},
}

func hookRankTimes(t *testing.T) {
	t.Cleanup(replay.SetProbeTimesHook(func(dev int, s replay.Name, _, _ float64) (float64, float64) {
		return rankTimes[dev][s], 1
	}))
}

// runAuto runs steps of w under auto on device dev of b and returns its
// choice after them.
func runAuto(ctx context.Context, b gpu.Backend, w *workload.Workload, dev, steps int) (_ stablegraph.Choice, err error) {
	caller, err := workload.NewCaller(b, dev, w, workload.Random, 1)
	if err != nil {
		return stablegraph.Choice{}, err
	}
	defer func() { err = errors.Join(err, caller.Close()) }()
	s, err := b.StreamCreate(dev, gpu.StreamNonBlocking, 0)
	if err != nil {
		return stablegraph.Choice{}, err
	}
	defer func() { err = errors.Join(err, b.StreamDestroy(s)) }()
	exe, err := stablegraph.Compile(ctx, b, w.Program, stablegraph.Options{Strategy: stablegraph.StrategyAuto, Device: dev})
	if err != nil {
		return stablegraph.Choice{}, err
	}
	defer func() { err = errors.Join(err, exe.Close()) }()
	for _, st := range w.States {
		if err := exe.WriteBuffer(ctx, st.Buffer, st.Data); err != nil {
			return stablegraph.Choice{}, err
		}
	}
	for step := range steps {
		bind, err := caller.Bind(step)
		if err != nil {
			return stablegraph.Choice{}, err
		}
		outs, err := exe.Run(ctx, s, bind)
		if err != nil {
			return stablegraph.Choice{}, fmt.Errorf("device %d, step %d: %w", dev, step, err)
		}
		outs.Release()
		// Alone, auto decides once the device has passed its probes.
		if err := b.StreamSynchronize(s); err != nil {
			return stablegraph.Choice{}, err
		}
	}
	return exe.Choice(), nil
}

// TestAutoAgreesOverRanks: on a step with collectives (dp on two ranks of
// one sim), ranks whose probes measure differently (rank 0 alone would
// keep patch, rank 1 alone stable: checked on a step without
// collectives) choose the same strategy: the one fastest by the slowest
// rank's times (device), which both report, agreed.
func TestAutoAgreesOverRanks(t *testing.T) {
	ctx := context.Background()
	hookRankTimes(t)
	// 1 step for the plan's agreement, 43 probe steps (warm-ups: patch,
	// device, pool 2, stable 1; then rounds of one unmeasured and two
	// measured steps per candidate, 6 measured each), 1 for the times'
	// agreement, then the kept one.
	const steps = 48
	shape := workload.Config{Layers: 2, Width: 16, Batch: 4}

	alone := map[int]replay.Name{0: replay.Patch, 1: replay.Stable}
	for dev, want := range alone {
		b := simtest.New(t, 2)
		w, err := workload.New("mlp", shape)
		if err != nil {
			t.Fatal(err)
		}
		ch, err := runAuto(ctx, b, w, dev, steps)
		if err != nil {
			t.Fatal(err)
		}
		if ch.Strategy != want || ch.Probing || ch.Agreed {
			t.Fatalf("device %d alone (no collectives): %s, probing %v, agreed %v: %s", dev, ch.Strategy, ch.Probing, ch.Agreed, ch.Reason)
		}
	}

	b := simtest.New(t, 2)
	ws, err := workload.ForRanks("dp", shape, commtest.Comms(t, b, 2))
	if err != nil {
		t.Fatal(err)
	}
	choices := make([]stablegraph.Choice, 2)
	if err := perrank.Each(2, func(r int) error {
		var err error
		choices[r], err = runAuto(ctx, b, ws[r], r, steps)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for r, ch := range choices {
		if ch.Strategy != replay.Device || ch.Probing || !ch.Agreed || !strings.Contains(ch.Reason, "slowest rank's") {
			t.Fatalf("rank %d: %s, probing %v, agreed %v: %s", r, ch.Strategy, ch.Probing, ch.Agreed, ch.Reason)
		}
		for _, c := range ch.Candidates {
			want := max(rankTimes[0][c.Strategy], rankTimes[1][c.Strategy])
			if c.Probed == 0 || c.GPUUS != want {
				t.Errorf("rank %d: %s probed %d steps at %.1f us, want the slowest rank's %.1f", r, c.Strategy, c.Probed, c.GPUUS, want)
			}
		}
	}
}
