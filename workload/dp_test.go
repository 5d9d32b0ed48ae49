package workload

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/commtest"
	"github.com/stablegraph/stablegraph/internal/perrank"
	"github.com/stablegraph/stablegraph/rendezvous"
	"github.com/stablegraph/stablegraph/report"
)

// dpShape is small enough for the race detector and large enough that the
// batch splits into 4 shards and the GEMMs sum over several rows.
var dpShape = Config{Layers: 3, Width: 32, Batch: 8}

func openSimN(t *testing.T, n int, timeout time.Duration) *sim.Backend {
	t.Helper()
	b, err := sim.New(sim.Config{Devices: n, DeviceMemory: 1 << 30})
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
				comms := commtest.Comms(t, b, world)
				ws, err := ForRanks("dp", dpShape, comms)
				if err != nil {
					t.Fatal(err)
				}
				states := make([][][]float32, world)
				err = perrank.Each(world, func(r int) error {
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
	comms := commtest.Comms(t, b, world)
	ws, err := ForRanks("dp", dpShape, comms)
	if err != nil {
		t.Fatal(err)
	}
	reps, err := BenchRanks(context.Background(), b, ws, nil, RunOptions{Steps: 4, Warmup: 2, Pattern: Random, WallBatches: 1, WallBatchSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	wantRankReports(t, reps)
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
			comms := commtest.Comms(t, b, world)
			shape := dpShape
			shape.Batch = 6 // 3 shards
			ws, err := ForRanks("dp", shape, comms)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			errs := make([]error, world)
			_ = perrank.Each(world, func(r int) error {
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

// joinProcesses sets up world ranks as a job of one process per rank would:
// a sim of its own per rank (a "process"), joined by a rendezvous over
// loopback (JoinRank), so that dp's all-reduce crosses the rendezvous.
func joinProcesses(t *testing.T, world int) []*Rank {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ranks := make([]*Rank, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		b := openSimN(t, 1, 30*time.Second)
		cfg := rendezvous.Config{Addr: l.Addr().String(), Rank: r, World: world, Token: "dp-test-token-0123456789", Timeout: 30 * time.Second}
		if r == 0 {
			cfg.Listener = l
		}
		wg.Go(func() { ranks[r], errs[r] = JoinRank(context.Background(), b, 0, cfg) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = perrank.Each(world, func(r int) error {
			if err := ranks[r].Close(context.Background()); err != nil {
				t.Errorf("rank %d: %v", r, err)
			}
			return nil
		})
	})
	return ranks
}

// TestDPAcrossProcesses runs dp as one process per rank would (each rank
// its own sim, the all-reduce across the rendezvous): every rank's weights
// after every step are the bits of the same ranks run as devices of one
// sim, under patch and pool, and the bench of every strategy matches eager
// on every rank, capturing no collective in steady state.
func TestDPAcrossProcesses(t *testing.T) {
	ctx := context.Background()
	const world, steps = 2, 3
	// The reference: the ranks as devices of one sim.
	one := openSimN(t, world, 30*time.Second)
	ws, err := ForRanks("dp", dpShape, commtest.Comms(t, one, world))
	if err != nil {
		t.Fatal(err)
	}
	for _, strat := range []sg.Strategy{sg.StrategyPatch, sg.StrategyPool, sg.StrategyDevice} {
		ref := make([][][]float32, world)
		if err := perrank.Each(world, func(r int) error {
			var err error
			ref[r], err = stepStates(ctx, one, ws[r], r, strat, steps, nil)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		ranks := joinProcesses(t, world)
		got := make([][][]float32, world)
		if err := perrank.Each(world, func(r int) error {
			w, err := New("dp", Config{Layers: dpShape.Layers, Width: dpShape.Width, Batch: dpShape.Batch, Comm: ranks[r].Comm})
			if err != nil {
				return err
			}
			got[r], err = stepStates(ctx, ranks[r].Backend, w, 0, strat, steps, nil)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		for r := range world {
			for step := range steps {
				for i, v := range got[r][step] {
					if math.Float32bits(v) != math.Float32bits(ref[r][step][i]) {
						t.Fatalf("%s: rank %d, step %d: weight %d = %v across processes, %v in one", strat, r, step, i, v, ref[r][step][i])
					}
				}
			}
		}
	}

	benchAcrossProcesses(t, world)
}

// TestDPAcrossFourProcesses is the bench of TestDPAcrossProcesses on four
// ranks, each its own sim, the collectives across the rendezvous.
func TestDPAcrossFourProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("four ranks")
	}
	benchAcrossProcesses(t, 4)
}

// benchAcrossProcesses runs dp's bench of every strategy on world ranks
// joined as separate processes would be (each its own sim): every
// strategy matches eager on every rank, no collective is captured in
// steady state, and GatherReports gives every rank every rank's report,
// in rank order.
func benchAcrossProcesses(t *testing.T, world int) {
	ctx := context.Background()
	ranks := joinProcesses(t, world)
	reps := make([]*report.Report, world)
	gathered := make([][]report.Report, world)
	if err := perrank.Each(world, func(r int) error {
		w, err := New("dp", Config{Layers: dpShape.Layers, Width: dpShape.Width, Batch: dpShape.Batch, Comm: ranks[r].Comm})
		if err != nil {
			return err
		}
		o := RunOptions{Steps: 3, Warmup: 1, Pattern: Random, WallBatches: 1, WallBatchSize: 2}
		watch := WatchCollectives(w.Comm, &o)
		if reps[r], err = Bench(ctx, ranks[r].Backend, w, nil, o); err != nil {
			return err
		}
		watch.Annotate(reps[r])
		gathered[r], err = GatherReports(ctx, ranks[r].Group, reps[r])
		return err
	}); err != nil {
		t.Fatal(err)
	}
	wantRankReports(t, reps)
	for r := range world {
		if len(gathered[r]) != world {
			t.Fatalf("rank %d gathered %d reports, want %d", r, len(gathered[r]), world)
		}
		for i, g := range gathered[r] {
			if g.Workload != reps[i].Workload || len(g.Results) != len(reps[i].Results) {
				t.Errorf("rank %d's copy of rank %d's report: %q with %d results, want %q with %d", r, i,
					g.Workload, len(g.Results), reps[i].Workload, len(reps[i].Results))
			}
			if !strings.Contains(g.Workload, fmt.Sprintf("rank %d of %d", i, world)) {
				t.Errorf("report %d of rank %d is %q", i, r, g.Workload)
			}
		}
	}
}

// TestDPRanksAligned: on ranks of one communicator, Run waits for a
// barrier (an eager all-reduce) before every step, warm-up included, and
// before every wall batch, and holds the device behind a second one
// inside the gate: two barriers a step and one a batch, none captured;
// the note says so. One rank runs no barrier.
func TestDPRanksAligned(t *testing.T) {
	ctx := context.Background()
	const world, warmup, steps, batches = 2, 1, 3, 2
	b := openSimN(t, world, 30*time.Second)
	comms := commtest.Comms(t, b, world)
	ws, err := ForRanks("dp", dpShape, comms)
	if err != nil {
		t.Fatal(err)
	}
	before := make([]sg.CommStats, world)
	for r, c := range comms {
		before[r] = c.Stats()
	}
	res, err := RunRanks(ctx, b, ws, RunOptions{Strategy: sg.StrategyPatch, Steps: steps, Warmup: warmup, Pattern: Random,
		WallBatches: batches, WallBatchSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	for r, c := range comms {
		got := c.Stats()
		if n := got.Launched - before[r].Launched; n != 2*(warmup+steps)+batches {
			t.Errorf("rank %d launched %d eager collectives, want %d barriers", r, n, 2*(warmup+steps)+batches)
		}
		if !strings.Contains(res[r].Result.Note, "ranks aligned by a barrier") || !strings.Contains(res[r].Result.Note, "skew p50") {
			t.Errorf("rank %d: note %q", r, res[r].Result.Note)
		}
	}
	one, err := New("dp", dpShape)
	if err != nil {
		t.Fatal(err)
	}
	single := openSimN(t, 1, 30*time.Second)
	r1, err := Run(ctx, single, one, RunOptions{Strategy: sg.StrategyPatch, Steps: 2, Pattern: Random, WallBatches: 1})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(r1.Result.Note, "aligned") {
		t.Errorf("one rank: note %q", r1.Result.Note)
	}
}

// TestJoinRankFailures: a rank that cannot make its communicator aborts the
// group, so the others fail at once instead of waiting; a rank whose
// rendezvous fails returns its error with nothing left open.
func TestJoinRankFailures(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const world = 2
	errs := make([]error, world)
	start := time.Now()
	var wg sync.WaitGroup
	for r := range world {
		b := openSimN(t, 1, 30*time.Second)
		cfg := rendezvous.Config{Addr: l.Addr().String(), Rank: r, World: world, Token: "dp-test-token-0123456789", Timeout: 30 * time.Second}
		if r == 0 {
			cfg.Listener = l
		}
		dev := 0
		if r == 1 {
			dev = 5 // no such device
		}
		wg.Go(func() {
			rk, err := JoinRank(context.Background(), b, dev, cfg)
			if err == nil {
				rk.Close(context.Background())
			}
			errs[r] = err
		})
	}
	wg.Wait()
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the ranks took %v to fail", d)
	}
	if !errors.Is(errs[1], gpu.ErrInvalidValue) || !strings.Contains(errs[1].Error(), "device 5") {
		t.Fatalf("rank 1: %v", errs[1])
	}
	if !errors.Is(errs[0], gpu.ErrDeviceLost) && !errors.Is(errs[0], rendezvous.ErrAborted) {
		t.Fatalf("rank 0: %v, want the abort of rank 1", errs[0])
	}
	// No rank 0 at all: the rendezvous's error, nothing open.
	b := openSimN(t, 1, time.Second)
	_, err = JoinRank(context.Background(), b, 0, rendezvous.Config{Addr: "127.0.0.1:1", Rank: 1, World: 2,
		Token: "dp-test-token-0123456789", Timeout: 200 * time.Millisecond})
	if !errors.Is(err, rendezvous.ErrTimeout) {
		t.Fatalf("no rank 0: %v", err)
	}
}

// TestDPDevice: dp on 2 ranks with the device strategy. The all-reduce
// keeps its host path (its buffer, the gradients, is a temp that never
// moves, so it costs nothing per step); everything else moves on the
// device: after the first step no node is moved from the host, no graph
// uploaded again, no collective captured, and every rank's weights after
// every step are patch's bit for bit. Auto on dp weighs the device
// strategy by the model (dp's collectives rule out probing).
func TestDPDevice(t *testing.T) {
	ctx := context.Background()
	const world, steps = 2, 4
	b := openSimN(t, world, 30*time.Second)
	ws, err := ForRanks("dp", dpShape, commtest.Comms(t, b, world))
	if err != nil {
		t.Fatal(err)
	}
	states := func(strat sg.Strategy) [][][]float32 {
		out := make([][][]float32, world)
		if err := perrank.Each(world, func(r int) error {
			var err error
			out[r], err = stepStates(ctx, b, ws[r], r, strat, steps, nil)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	want, got := states(sg.StrategyPatch), states(sg.StrategyDevice)
	for r := range world {
		for step := range steps {
			for i, v := range got[r][step] {
				if math.Float32bits(v) != math.Float32bits(want[r][step][i]) {
					t.Fatalf("rank %d, step %d: weight %d = %v under device, %v under patch", r, step, i, v, want[r][step][i])
				}
			}
		}
	}
	res, err := RunRanks(ctx, b, ws, RunOptions{Strategy: sg.StrategyDevice, Steps: 4, Warmup: 1, Pattern: Random, WallBatches: -1})
	if err != nil {
		t.Fatal(err)
	}
	for r, rr := range res {
		c := rr.Stats
		// Every pointer moves on the device, the first GEMM's too;
		// the all-reduces' buffers are temps, which never move.
		if c.PatchedNodes != 0 || c.GraphUploads != 0 || c.Rerecords != 0 || c.TracesCaptured != 0 || c.DeviceUpdates == 0 ||
			!strings.Contains(rr.Result.Note, "collectives captured in steady state: 0") {
			t.Errorf("rank %d: %+v; note %q", r, c, rr.Result.Note)
		}
	}
	exe, err := sg.Compile(ctx, b, ws[0].Program, sg.Options{Strategy: sg.StrategyAuto, Device: 0})
	if err != nil {
		t.Fatal(err)
	}
	ch := exe.Choice()
	if err := exe.Close(); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range ch.Candidates {
		found = found || (c.Strategy == sg.StrategyDevice && c.Usable && c.StepUS > 0)
	}
	// Auto weighs device on dp, and probes with the other ranks.
	if !found || !strings.Contains(ch.Reason, "device (") || !ch.Probing || !strings.Contains(ch.Reason, "with the other ranks") {
		t.Errorf("auto on dp: %+v", ch)
	}
}

// wantRankReports fails the test unless every rank's report has a row for
// every strategy, each matching eager, and the library's strategies
// captured no collective in steady state.
func wantRankReports(t *testing.T, reps []*report.Report) {
	t.Helper()
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

// TestRankKeepsEveryCapability: a rank of a job of one process per rank on
// the sim offers every capability a plain sim offers (only its collectives
// go through the rendezvous; TestDPAcrossProcesses runs them); Close gives
// the sim its in-process communicators back.
func TestRankKeepsEveryCapability(t *testing.T) {
	want := gpu.Capabilities(openSimN(t, 1, time.Second), 0)
	if !slices.Contains(want, "GEMM") || !slices.Contains(want, "AddressRanger") || !slices.Contains(want, "FaultInjector") {
		t.Fatalf("the plain sim offers %v", want)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const world = 2
	sims := make([]*sim.Backend, world)
	ranks := make([]*Rank, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		sims[r] = openSimN(t, 1, 30*time.Second)
		cfg := rendezvous.Config{Addr: l.Addr().String(), Rank: r, World: world, Token: "dp-test-token-0123456789", Timeout: 30 * time.Second}
		if r == 0 {
			cfg.Listener = l
		}
		wg.Go(func() { ranks[r], errs[r] = JoinRank(context.Background(), sims[r], 0, cfg) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r, rk := range ranks {
		if got := gpu.Capabilities(rk.Backend, 0); !slices.Equal(got, want) {
			t.Errorf("rank %d's backend offers %v, the plain sim %v", r, got, want)
		}
	}
	for r := range world {
		wg.Go(func() { errs[r] = ranks[r].Close(context.Background()) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	// In-process again: a communicator of one rank on the sim's device.
	c, err := sg.NewComms(sims[0], []int{0})
	if err != nil {
		t.Fatalf("a communicator in-process after Close: %v", err)
	}
	if err := c[0].Close(); err != nil {
		t.Fatal(err)
	}
}

// TestDPBatchPerRank: a batch per rank makes the global batch that many
// rows times the ranks (each rank's shard is BatchPerRank rows, the same
// rows as the global batch split), and is refused with a global batch or
// on a workload without ranks.
func TestDPBatchPerRank(t *testing.T) {
	const world = 2
	b := openSimN(t, world, 30*time.Second)
	comms := commtest.Comms(t, b, world)
	weak, err := ForRanks("dp", Config{Layers: 2, Width: 16, BatchPerRank: 3}, comms)
	if err != nil {
		t.Fatal(err)
	}
	strong, err := ForRanks("dp", Config{Layers: 2, Width: 16, Batch: 6}, comms)
	if err != nil {
		t.Fatal(err)
	}
	for r := range world {
		if !strings.Contains(weak[r].Desc, "batch=6") || !strings.Contains(weak[r].Desc, "with 3 rows") {
			t.Errorf("rank %d: %q", r, weak[r].Desc)
		}
		if weak[r].Desc != strong[r].Desc {
			t.Errorf("rank %d: batch per rank %q, global batch %q", r, weak[r].Desc, strong[r].Desc)
		}
		for i := range weak[r].Params {
			if string(weak[r].Input(5, i)) != string(strong[r].Input(5, i)) {
				t.Errorf("rank %d: param %d differs", r, i)
			}
		}
	}
	one, err := New("dp", Config{Layers: 2, Width: 16, BatchPerRank: 3})
	if err != nil || !strings.Contains(one.Desc, "batch=3") {
		t.Errorf("one rank: %v, %v", one, err)
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"dp", Config{Batch: 8, BatchPerRank: 4}, "both given"},
		{"train", Config{BatchPerRank: 4}, "dp's alone"},
		{"dp", Config{BatchPerRank: -1}, "negative"},
	} {
		if _, err := New(tc.name, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %+v: %v, want %q", tc.name, tc.cfg, err, tc.want)
		}
	}
}
