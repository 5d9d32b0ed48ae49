package workload

import (
	"bytes"
	"context"
	"crypto/sha256"
	"math/rand/v2"
	"strings"
	"testing"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
)

func openSim(t *testing.T) gpu.Backend {
	t.Helper()
	b, _, err := gpu.Open("sim", gpu.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c, ok := gpu.LiveHandles(b); ok && !c.IsZero() {
			t.Errorf("live handles after the test: %v", c)
		}
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

func small(t *testing.T, name string) *Workload {
	t.Helper()
	w, err := New(name, Config{Layers: 3, Width: 16, Batch: 4, K: 20, N: 64})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestNew(t *testing.T) {
	for _, name := range Names() {
		var cfg Config
		if name == "gpt2-decode" {
			// Its defaults draw GPT-2 small's 500 MB of weights: seconds,
			// a minute under -race. TestGPT2SmallShape checks that shape.
			cfg = Config{Layers: 1, Width: 64, Heads: 4, Vocab: 256, Positions: 64, Pos: 8}
		}
		if strings.HasSuffix(name, "-large") {
			// Their default width and batch over two of the eight layers,
			// whose weights are most of the test's time under -race.
			cfg.Layers = 2
		}
		w, err := New(name, cfg)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(w.Params) == 0 || len(w.Outputs) != 1 || w.Desc == "" {
			t.Errorf("%s: %+v", name, w)
		}
		if !bytes.Equal(w.Input(3, 0), w.Input(3, 0)) || bytes.Equal(w.Input(3, 0), w.Input(4, 0)) {
			t.Errorf("%s: inputs are not a pure function of the step", name)
		}
	}
	if _, err := New("resnet", Config{}); err == nil {
		t.Error("unknown workload accepted")
	}
	if _, err := New("chain", Config{K: MaxChainK + 1}); err == nil {
		t.Error("chain over the maximum accepted")
	}
	if w, err := New("chain", Config{K: 1}); err != nil || w.Desc != "chain (K=1 n=256)" {
		t.Errorf("chain K=1: %v %v", w, err)
	}
}

// The chain computes y = a·(…(a·x + b)…) + b, K times, which the test
// checks against float32 arithmetic on the host; mlp and train are checked
// against eager by the strategy comparison.
func TestChainValues(t *testing.T) {
	b := openSim(t)
	w := small(t, "chain")
	res, err := Run(context.Background(), b, w, RunOptions{Steps: 2, Pattern: Random, WallBatches: 1, WallBatchSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Digests) != 2 || res.Result.StepUS.P50 <= 0 || res.Result.HostUS.P50 <= 0 {
		t.Fatalf("result %+v", res.Result)
	}
	// Recompute step 1 on the host and compare digests.
	x := gpu.BytesToF32(w.Input(1, 0))
	for range 20 {
		for i := range x {
			x[i] = float32(chainA)*x[i] + float32(chainB)
		}
	}
	want := Digest(sha(gpu.F32ToBytes(x)))
	if res.Digests[1] != want {
		t.Errorf("chain output differs from the host computation")
	}
}

func TestBenchStrategiesMatchEager(t *testing.T) {
	b := openSim(t)
	for _, name := range []string{"mlp", "train", "chain"} {
		for _, pat := range Patterns() {
			w := small(t, name)
			steps := 0
			rep, err := Bench(context.Background(), b, w, nil, RunOptions{Steps: 4, Warmup: 1, Pattern: pat, WallBatches: 1, WallBatchSize: 2,
				Progress: func(sg.Strategy, int, int) { steps++ }})
			if err != nil {
				t.Fatalf("%s/%s: %v", name, pat, err)
			}
			runs := len(sg.Strategies())
			if pat != Fixed {
				runs++ // the replay-fixed floor
			}
			if len(rep.Results) != runs || steps != 5*runs {
				t.Errorf("%s/%s: %d results, %d progress calls", name, pat, len(rep.Results), steps)
			}
			if _, ok := rep.Result(FloorRow); ok != (pat != Fixed) {
				t.Errorf("%s/%s: floor row present = %v", name, pat, ok)
			}
			for _, r := range rep.Results {
				// device says how many pointers it moved.
				explained := r.Strategy == "auto" || r.Strategy == FloorRow || (r.Strategy == "device" && pat != Fixed)
				if !r.OutputsMatchEager || (r.Note != "") != explained {
					t.Errorf("%s/%s/%s: match %v, note %q", name, pat, r.Strategy, r.OutputsMatchEager, r.Note)
				}
				if r.WallUS == nil || r.WallUS.P50 <= 0 {
					t.Errorf("%s/%s/%s: wall time %v", name, pat, r.Strategy, r.WallUS)
				}
				if len(r.StepSamplesUS) != 4 || r.PeakDeviceBytes == 0 {
					t.Errorf("%s/%s/%s: %d samples, peak %d", name, pat, r.Strategy, len(r.StepSamplesUS), r.PeakDeviceBytes)
				}
				switch {
				case r.Strategy == "record" && pat != Fixed && r.Rerecords != 4:
					t.Errorf("%s/%s: record re-recorded %d times in 4 moving steps", name, pat, r.Rerecords)
				case r.Strategy == "record" && pat == Fixed && r.Rerecords != 0:
					t.Errorf("%s/fixed: record re-recorded %d times", name, r.Rerecords)
				case r.Strategy == "patch" && pat != Fixed && r.PatchedNodes == 0:
					t.Errorf("%s/%s: patch patched nothing", name, pat)
				case r.Strategy == "update" && pat != Fixed && r.GraphUpdates == 0:
					t.Errorf("%s/%s: update updated nothing", name, pat)
				case r.Strategy == "device" && pat != Fixed && (!strings.Contains(r.Note, "pointers moved on the device") ||
					!strings.Contains(r.Note, " 0 uploads") || r.PatchedNodes != 0):
					// Every pointer moves on the device, the first
					// command's (a GEMM reading x) too.
					t.Errorf("%s/%s: device: note %q, %d patched nodes; want every pointer moved on the device", name, pat, r.Note, r.PatchedNodes)
				}
			}
		}
	}
}

func TestReferenceMismatch(t *testing.T) {
	b := openSim(t)
	w := small(t, "chain")
	ref := make([]Digest, 3)
	res, err := Run(context.Background(), b, w, RunOptions{Strategy: sg.StrategyPatch, Steps: 3, Reference: ref})
	if err != nil {
		t.Fatal(err)
	}
	if res.Mismatch != 0 || res.Result.OutputsMatchEager || res.Result.Note == "" {
		t.Errorf("mismatch not reported: %+v", res.Result)
	}
	if _, err := Run(context.Background(), b, w, RunOptions{Steps: 3, Reference: ref[:1]}); err == nil {
		t.Error("short reference accepted")
	}
}

func TestRunCancelled(t *testing.T) {
	b := openSim(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, b, small(t, "mlp"), RunOptions{Steps: 2}); err == nil {
		t.Error("cancelled run succeeded")
	}
}

func sha(b []byte) [32]byte {
	var d Digest
	h := sha256.New()
	h.Write(b)
	h.Sum(d[:0])
	return d
}

// noDeviceUpdates is the sim on a driver without device-updatable graph
// nodes.
type noDeviceUpdates struct{ *sim.Backend }

func (noDeviceUpdates) DeviceUpdatesSupported(int) error {
	return gpu.Errorf("DeviceUpdatesSupported", gpu.ErrNotSupported, "no device-side graph updates on this driver")
}

// TestBenchSkipsUnsupported: a strategy Compile refuses with
// gpu.ErrNotSupported gets a row saying so, unchecked, and the others run.
func TestBenchSkipsUnsupported(t *testing.T) {
	raw, err := sim.New(sim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	w := small(t, "chain-moving")
	rep, err := Bench(context.Background(), noDeviceUpdates{raw}, w, []sg.Strategy{sg.StrategyDevice, sg.StrategyPatch},
		RunOptions{Steps: 3, Warmup: 1, Pattern: Random, WallBatches: 1, WallBatchSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	dev, ok := rep.Result("device")
	if !ok || !dev.Unchecked || !strings.HasPrefix(dev.Note, NotSupportedNote) || !strings.Contains(dev.Note, "no device-side graph updates") {
		t.Errorf("device row %+v", dev)
	}
	if patch, ok := rep.Result("patch"); !ok || !patch.OutputsMatchEager {
		t.Errorf("patch row %+v", patch)
	}
	if live := raw.LiveHandles(); !live.IsZero() {
		t.Errorf("live handles %s", live)
	}
}

// TestInputsAreUniformValues: a param's input written into a reused
// buffer is the little-endian float32 encoding of uniform's values from
// the same generator, and a data-parallel rank's shard is its rows of the
// global input, made in a reused buffer that held other bytes.
func TestInputsAreUniformValues(t *testing.T) {
	const total, off, n = 96, 32, 40
	seed := func() *rand.Rand { return rand.New(rand.NewPCG(7, 9)) }
	want := gpu.F32ToBytes(uniform(seed(), total, 1))
	got := uniformInput(total)(seed(), nil)
	if !bytes.Equal(got, want) {
		t.Fatal("uniformInput differs from uniform's values")
	}
	scratch := bytes.Repeat([]byte{0xff}, 4*total)
	shard := shardInput(total, off, n)(seed(), scratch[:0])
	if !bytes.Equal(shard, want[4*off:4*(off+n)]) {
		t.Fatalf("shard of %d values at %d: %d bytes, not the global input's rows", n, off, len(shard))
	}
}
