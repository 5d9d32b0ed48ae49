package faultcampaign_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"runtime"
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

// collTrial is one run of the two-rank data-parallel step (workload dp,
// one rank per device of a two-device sim), with a fault armed in one phase.
type collTrial struct {
	strat sg.Strategy
	steps int
	// phase ("init", "steps", "close") and op/nth of the fault; op "" for
	// a clean run.
	phase, op string
	nth       int

	fired   bool
	errs    [2]error // per rank, the first error of its steps
	initErr error
	closeE  error
	digests [2][]workload.Digest
	count   int // calls of op in the phase (clean run)
	leaked  string
	elapsed time.Duration
}

// collCommTimeout bounds how long a rank waits for the other in a
// collective: a rank whose partner failed gives up after it.
const collCommTimeout = 200 * time.Millisecond

func (ct *collTrial) run(t *testing.T) {
	t.Helper()
	start := time.Now()
	defer func() { ct.elapsed = time.Since(start) }()
	b, err := sim.New(sim.Config{Devices: 2, DeviceMemory: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	b.SetCommTimeout(collCommTimeout)
	arm := func(phase string) func() {
		if ct.phase != phase {
			return func() {}
		}
		c0 := b.Calls(ct.op)
		if ct.op != "" {
			b.InjectFault(ct.op, ct.nth, nil)
		}
		return func() {
			b.ClearFaults()
			n := b.Calls(ct.op) - c0
			ct.count = n
			ct.fired = ct.op != "" && n > ct.nth
		}
	}
	ctx := context.Background()
	disarm := arm("init")
	comms, err := sg.NewComms(b, []int{0, 1})
	disarm()
	if err != nil {
		ct.initErr = err
	} else {
		ws, err := workload.ForRanks("dp", workload.Config{Layers: 2, Width: 16, Batch: 4}, comms)
		if err != nil {
			t.Fatal(err)
		}
		disarm = arm("steps")
		var wg sync.WaitGroup
		for r := range 2 {
			wg.Go(func() { ct.digests[r], ct.errs[r] = collRank(ctx, b, ws[r], ct.strat, ct.steps) })
		}
		wg.Wait()
		disarm()
		disarm = arm("close")
		for _, c := range comms {
			ct.closeE = errors.Join(ct.closeE, c.Close())
		}
		disarm()
	}
	if live := b.LiveHandles(); !live.IsZero() {
		ct.leaked = live.String()
	}
	b.Close()
}

// collRank runs one rank's steps and returns its output digests; it stops
// at the first error.
func collRank(ctx context.Context, b gpu.Backend, w *workload.Workload, strat sg.Strategy, steps int) (ds []workload.Digest, err error) {
	dev := w.Comm.Device()
	caller, err := workload.NewCallerWith(b, dev, w, workload.Random, uint64(dev+1), workload.CallerOptionsFor(strat))
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, caller.Close()) }()
	s, err := b.StreamCreate(dev, gpu.StreamNonBlocking, 0)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, b.StreamDestroy(s)) }()
	defer func() { _ = b.StreamSynchronize(s) }()
	exe, err := sg.Compile(ctx, b, w.Program, sg.Options{Strategy: strat, Device: dev, StrategyOptions: sg.StrategyOptions{Remap: sg.RemapOptions{Memory: caller.Remappable()}}})
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, exe.Close()) }()
	for _, st := range w.States {
		if err := exe.WriteBuffer(ctx, st.Buffer, st.Data); err != nil {
			return nil, err
		}
	}
	for i := range steps {
		bind, err := caller.Bind(i)
		if err != nil {
			return ds, err
		}
		outs, err := exe.Run(ctx, s, bind)
		if err != nil {
			return ds, fmt.Errorf("rank %d step %d: %w", w.Comm.Rank(), i, err)
		}
		h := sha256.New()
		for _, buf := range w.Outputs {
			data, err := exe.ReadOutput(ctx, outs, buf)
			if err != nil {
				outs.Release()
				return ds, fmt.Errorf("rank %d step %d: read: %w", w.Comm.Rank(), i, err)
			}
			h.Write(data)
		}
		outs.Release()
		var d workload.Digest
		h.Sum(d[:0])
		ds = append(ds, d)
	}
	return ds, nil
}

// TestCollectiveFaults fails, in turn, every call of the collective entry
// points (CommInit while the communicator is made, AllReduce while the two
// ranks of the dp workload run their steps, CommDestroy at the end) on a
// two-device sim, for every strategy. A rank's collective that fails leaves
// the other rank waiting in it: the communicator is then aborted, so a
// retried step would pair collectives wrongly, and no step is retried here.
// What must hold: the faulted call's error reaches its caller, wrapping the
// injected fault and naming the entry point; the other rank does not hang
// (it fails within the communicator timeout, with an error that says so,
// or completes); a run the fault did not stop gives eager's outputs; and
// once everything is closed no handle and no goroutine is left.
func TestCollectiveFaults(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	steps := 3
	strategies := sg.Strategies()
	if raceEnabled || testing.Short() {
		strategies = []sg.Strategy{sg.StrategyEager, sg.StrategyPatch, sg.StrategyPool}
	}
	ref := &collTrial{strat: sg.StrategyEager, steps: steps}
	ref.run(t)
	if ref.errs[0] != nil || ref.errs[1] != nil || ref.initErr != nil || ref.leaked != "" {
		t.Fatalf("clean run: %v %v %v %s", ref.initErr, ref.errs[0], ref.errs[1], ref.leaked)
	}
	type row struct{ injected, survived int }
	summary := map[sg.Strategy]*row{}
	for _, st := range strategies {
		summary[st] = &row{}
		for _, site := range []struct{ phase, op string }{{"init", "CommInit"}, {"steps", "AllReduce"}, {"close", "CommDestroy"}} {
			clean := &collTrial{strat: st, steps: steps, phase: site.phase, op: site.op, nth: 1 << 30}
			clean.run(t)
			if clean.errs[0] != nil || clean.errs[1] != nil || clean.initErr != nil || clean.leaked != "" {
				t.Fatalf("%s: clean run: %v %v %v %s", st, clean.initErr, clean.errs[0], clean.errs[1], clean.leaked)
			}
			for r := range 2 {
				for i, d := range clean.digests[r] {
					if d != ref.digests[r][i] {
						t.Fatalf("%s: clean run: rank %d step %d differs from eager", st, r, i)
					}
				}
			}
			before := runtime.NumGoroutine()
			for nth := range clean.count {
				ct := &collTrial{strat: st, steps: steps, phase: site.phase, op: site.op, nth: nth}
				ct.run(t)
				if !ct.fired {
					continue
				}
				summary[st].injected++
				name := fmt.Sprintf("%s %s %s#%d", st, site.phase, site.op, nth)
				ok := true
				problem := func(format string, args ...any) {
					t.Errorf(name+": "+format, args...)
					ok = false
				}
				named := func(err error) bool {
					return err != nil && errors.Is(err, gpu.ErrInjected) && strings.Contains(err.Error(), site.op)
				}
				switch site.phase {
				case "init":
					if !named(ct.initErr) {
						problem("NewComms: %v", ct.initErr)
					}
				case "steps":
					if !named(ct.errs[0]) && !named(ct.errs[1]) {
						problem("no rank reports the fault: %v; %v", ct.errs[0], ct.errs[1])
					}
					for r, err := range ct.errs {
						if err == nil {
							for i, d := range ct.digests[r] {
								if d != ref.digests[r][i] {
									problem("rank %d completed with step %d differing from eager", r, i)
								}
							}
						} else if !named(err) && !errors.Is(err, gpu.ErrTimeout) && !strings.Contains(err.Error(), "abort") {
							problem("rank %d fails without saying why: %v", r, err)
						}
					}
				case "close":
					if !named(ct.closeE) {
						problem("Close: %v", ct.closeE)
					}
				}
				// A failed CommDestroy keeps its handle by nature.
				if ct.leaked != "" && !(site.op == "CommDestroy" && ct.leaked == "comms=1") {
					problem("handles left: %s", ct.leaked)
				}
				if ct.elapsed > 10*collCommTimeout+5*time.Second {
					problem("took %v: a rank waited far past the communicator timeout", ct.elapsed)
				}
				if ok {
					summary[st].survived++
				}
			}
			deadline := time.Now().Add(2 * time.Second)
			for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := runtime.NumGoroutine(); n > before {
				t.Errorf("%s %s: %d goroutines left behind", st, site.op, n-before)
			}
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "collective faults (dp, 2 ranks, %d steps):\n", steps)
	for _, st := range strategies {
		fmt.Fprintf(&b, "  %-7s injected %3d survived %3d\n", st, summary[st].injected, summary[st].survived)
	}
	t.Log(b.String())
}
