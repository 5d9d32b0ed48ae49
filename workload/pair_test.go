package workload

import (
	"context"
	"errors"
	"strings"
	"testing"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
)

// TestBenchPairFloor: with PairFloor every row but the floor's carries the
// floor's steps timed in blocks beside its measured steps (two blocks, the
// second short), its host time over the floor is the paired median, the
// outputs still match eager, and the pair's executable, stream and buffers
// are gone when Bench returns (openSim checks the live handles).
func TestBenchPairFloor(t *testing.T) {
	b := openSim(t)
	for _, pat := range []Pattern{Random, PingPong} {
		w := small(t, "mlp")
		strats := []sg.Strategy{sg.StrategyPatch, sg.StrategyDevice}
		// Two blocks beside the row's: pairBlock steps, then the rest.
		const steps = pairBlock + 2
		rep, err := Bench(context.Background(), b, w, strats, RunOptions{Steps: steps, Warmup: 1, Pattern: pat, WallBatches: 1, WallBatchSize: 2, PairFloor: true, NoProbe: true})
		if err != nil {
			t.Fatalf("%s: %v", pat, err)
		}
		if len(rep.Results) != len(strats)+2 {
			t.Fatalf("%s: %d rows, want eager, %v and the floor", pat, len(rep.Results), strats)
		}
		for _, r := range rep.Results {
			if r.Strategy == FloorRow {
				if r.PairedFloor != nil {
					t.Errorf("%s: the floor row is paired with itself", pat)
				}
				continue
			}
			p := r.PairedFloor
			if p == nil {
				t.Errorf("%s/%s: no paired floor", pat, r.Strategy)
				continue
			}
			if !r.OutputsMatchEager {
				t.Errorf("%s/%s: outputs differ from eager: %s", pat, r.Strategy, r.Note)
			}
			if len(p.HostSamplesUS) != steps || len(p.LatencySamplesUS) != steps || len(p.GPUSamplesUS) != steps || p.HostUS.P50 <= 0 || p.LatencyRatio <= 0 || p.GPURatio <= 0 {
				t.Errorf("%s/%s: paired floor %+v, want %d host, latency and GPU samples of the floor's step", pat, r.Strategy, p, steps)
			}
			if p.Block != pairBlock {
				t.Errorf("%s/%s: blocks of %d steps, want %d", pat, r.Strategy, p.Block, pairBlock)
			}
			if r.HostOverFloorUS == nil || *r.HostOverFloorUS != p.HostOverUS {
				t.Errorf("%s/%s: host over floor %v, want the paired median %v", pat, r.Strategy, r.HostOverFloorUS, p.HostOverUS)
			}
		}
	}
	rep, err := Bench(context.Background(), b, small(t, "mlp"), []sg.Strategy{sg.StrategyPatch}, RunOptions{Steps: 2, Pattern: Random, WallBatches: -1, NoProbe: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		if r.PairedFloor != nil {
			t.Errorf("%s: paired without PairFloor", r.Strategy)
		}
	}
}

// failingLoad is a backend that loads left modules, then refuses.
type failingLoad struct {
	gpu.Backend
	left int
}

func (f *failingLoad) ModuleLoad(dev int, img *gpu.ModuleImage) (gpu.Module, error) {
	if f.left <= 0 {
		return 0, errors.New("injected: no module")
	}
	f.left--
	return f.Backend.ModuleLoad(dev, img)
}

// TestBenchPairFloorFails: a pair that cannot be built fails the bench
// with an error naming it, and leaves nothing behind.
func TestBenchPairFloorFails(t *testing.T) {
	b := openSim(t)
	_, err := Bench(context.Background(), &failingLoad{Backend: b}, small(t, "mlp"), []sg.Strategy{sg.StrategyPatch},
		RunOptions{Steps: 2, Pattern: Random, WallBatches: -1, NoProbe: true, PairFloor: true})
	if err == nil {
		t.Fatal("bench ran with a floor pair that cannot compile")
	}
	if want := "the paired floor"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name %q", err, want)
	}
}
