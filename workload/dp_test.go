package workload

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
)

// dpShape is small enough for the race detector and large enough that the
// batch splits into 4 shards and the GEMMs sum over several rows.
var dpShape = Config{Layers: 3, Width: 32, Batch: 8}

func openSimN(t *testing.T, n int, timeout time.Duration) *sim.Backend {
	t.Helper()
	b, err := sim.New(gpu.Config{Devices: n, DeviceMemory: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	b.SetCommTimeout(timeout)
	t.Cleanup(func() {
		if c := b.LiveHandles(); !c.IsZero() {
			t.Errorf("live handles after the test: %v", c)
		}
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

func openComms(t *testing.T, b gpu.Backend, n int) []*sg.Comm {
	t.Helper()
	devs := make([]int, n)
	for i := range devs {
		devs[i] = i
	}
	comms, err := sg.NewComms(b, devs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range comms {
			if err := c.Close(); err != nil {
				t.Error(err)
			}
		}
	})
	return comms
}

// stepStates runs steps of w on dev with strat and returns, after every
// step, the contents of its states (the weights) as float32 values, in
// the order of w.States. stop, when not nil, is called after each step
// and ends the run early by returning true.
func stepStates(ctx context.Context, b gpu.Backend, w *Workload, dev int, strat sg.Strategy, steps int,
	after func(step int) bool) (_ [][]float32, err error) {
	caller, err := NewCaller(b, dev, w, PingPong, 1)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, caller.Close()) }()
	s, err := b.StreamCreate(dev, gpu.StreamNonBlocking, 0)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, b.StreamDestroy(s)) }()
	exe, err := sg.Compile(ctx, b, w.Program, sg.Options{Strategy: strat, Device: dev})
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, exe.Close()) }()
	for _, st := range w.States {
		if err := exe.WriteBuffer(ctx, st.Buffer, st.Data); err != nil {
			return nil, err
		}
	}
	var out [][]float32
	for step := range steps {
		bind, err := caller.Bind(step)
		if err != nil {
			return nil, err
		}
		if _, err := exe.Run(ctx, s, bind); err != nil {
			return nil, fmt.Errorf("step %d: %w", step, err)
		}
		var all []float32
		for _, st := range w.States {
			data, err := exe.ReadBuffer(ctx, st.Buffer)
			if err != nil {
				return nil, fmt.Errorf("step %d: %w", step, err)
			}
			all = append(all, gpu.BytesToF32(data)...)
		}
		out = append(out, all)
		if after != nil && after(step) {
			break
		}
	}
	return out, nil
}

// TestDPEqualsSingleRank checks the done condition of dp: with 2 and 4
// ranks every rank has the same weights after every step, bit for bit, and
// they equal a single-rank run over the whole batch (the train workload)
// up to float32 reduction order. dp without a communicator is train bit
// for bit.
func TestDPEqualsSingleRank(t *testing.T) {
	ctx := context.Background()
	const steps = 4
	single := openSimN(t, 1, time.Minute)
	train, err := New("train", dpShape)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := stepStates(ctx, single, train, 0, sg.StrategyEager, steps, nil)
	if err != nil {
		t.Fatal(err)
	}
	dp1, err := New("dp", dpShape)
	if err != nil {
		t.Fatal(err)
	}
	got1, err := stepStates(ctx, single, dp1, 0, sg.StrategyPatch, steps, nil)
	if err != nil {
		t.Fatal(err)
	}
	for step := range steps {
		for i := range ref[step] {
			if math.Float32bits(got1[step][i]) != math.Float32bits(ref[step][i]) {
				t.Fatalf("dp without a communicator differs from train at step %d, value %d", step, i)
			}
		}
	}

	for _, world := range []int{2, 4} {
		for _, strat := range []sg.Strategy{sg.StrategyPatch, sg.StrategyPool} {
			t.Run(fmt.Sprintf("ranks=%d/%s", world, strat), func(t *testing.T) {
				b := openSimN(t, world, 30*time.Second)
				comms := openComms(t, b, world)
				ws, err := ForRanks("dp", dpShape, comms)
				if err != nil {
					t.Fatal(err)
				}
				states := make([][][]float32, world)
				err = eachRank(world, func(r int) error {
					var err error
					states[r], err = stepStates(ctx, b, ws[r], r, strat, steps, nil)
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
				var worst float64
				for step := range steps {
					for r := 1; r < world; r++ {
						for i, v := range states[r][step] {
							if math.Float32bits(v) != math.Float32bits(states[0][step][i]) {
								t.Fatalf("step %d: rank %d's weight %d = %v, rank 0's %v", step, r, i, v, states[0][step][i])
							}
						}
					}
					for i, v := range states[0][step] {
						want := float64(ref[step][i])
						d := math.Abs(float64(v) - want)
						// A few float32 roundings of a sum over the batch:
						// relative 1e-5 of the weight, or 1e-7 absolute.
						if d > 1e-5*math.Abs(want)+1e-7 {
							t.Fatalf("step %d: weight %d = %v, the single-rank run's %v (difference %g)", step, i, v, want, d)
						}
						worst = max(worst, d)
					}
				}
				t.Logf("largest difference from the single-rank run: %g", worst)
			})
		}
	}
}

// TestDPBenchEveryStrategy runs the dp bench on 2 in-process ranks: every
// strategy matches eager on every rank and captures no collective in
// steady state.
func TestDPBenchEveryStrategy(t *testing.T) {
	const world = 2
	b := openSimN(t, world, 30*time.Second)
	comms := openComms(t, b, world)
	ws, err := ForRanks("dp", dpShape, comms)
	if err != nil {
		t.Fatal(err)
	}
	reps, err := BenchRanks(context.Background(), b, ws, nil, RunOptions{Steps: 4, Warmup: 2, Pattern: Random})
	if err != nil {
		t.Fatal(err)
	}
	for r, rep := range reps {
		seen := map[string]bool{}
		for _, res := range rep.Results {
			seen[res.Strategy] = true
			if !res.OutputsMatchEager {
				t.Errorf("rank %d: %s does not match eager: %s", r, res.Strategy, res.Note)
			}
			if _, err := sg.ParseStrategy(res.Strategy); err == nil && !strings.Contains(res.Note, "collectives captured in steady state: 0") {
				t.Errorf("rank %d: %s: note %q", r, res.Strategy, res.Note)
			}
		}
		for _, s := range sg.Strategies() {
			if !seen[string(s)] {
				t.Errorf("rank %d: no row for %s", r, s)
			}
		}
	}
}

// TestDPRankDies checks that when a rank stops after its first step and
// closes its communicator, the other ranks fail promptly instead of hanging,
// and that a rank that never starts makes them fail within the timeout.
func TestDPRankDies(t *testing.T) {
	ctx := context.Background()
	for _, how := range []string{"dies", "never arrives"} {
		t.Run(how, func(t *testing.T) {
			const world = 3
			b := openSimN(t, world, 200*time.Millisecond)
			comms := openComms(t, b, world)
			shape := dpShape
			shape.Batch = 6 // 3 shards
			ws, err := ForRanks("dp", shape, comms)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			errs := make([]error, world)
			_ = eachRank(world, func(r int) error {
				if r == world-1 {
					if how == "dies" {
						_, errs[r] = stepStates(ctx, b, ws[r], r, sg.StrategyPatch, 1, nil)
						return comms[r].Close()
					}
					return nil
				}
				_, errs[r] = stepStates(ctx, b, ws[r], r, sg.StrategyPatch, 5, nil)
				return nil
			})
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("the ranks took %v to fail", d)
			}
			if how == "dies" && errs[world-1] != nil {
				t.Fatalf("the dying rank's own step failed: %v", errs[world-1])
			}
			for r := range world - 1 {
				if errs[r] == nil {
					t.Fatalf("rank %d ran every step without the missing rank", r)
				}
				want := gpu.ErrTimeout
				if how == "dies" {
					want = gpu.ErrDeviceLost // aborted at once: the rank destroyed its communicator
				}
				if !errors.Is(errs[r], want) {
					t.Fatalf("rank %d: got %v, want %v", r, errs[r], want)
				}
			}
			for r := range world {
				if err := b.ResetDevice(r); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
