package replay_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/workload"
)

// turnsFault is the fault of one turns run: the nth call of op made by
// rank's Run of step (op "": none).
type turnsFault struct {
	op              string
	rank, step, nth int
}

func (f turnsFault) String() string {
	return fmt.Sprintf("%s #%d in rank %d's step %d", f.op, f.nth, f.rank, f.step)
}

// turnsRun is what a turns run saw.
type turnsRun struct {
	calls   [2][]int // per rank and step, the calls of the fault's op made by Run
	fired   bool
	faulted error // the faulted Run's error
	retried error // the error of the step run again after it (nil: it ran)
	errs    [2]error
	done    [2]int // steps each rank completed and read
	digests [2][][sha256.Size]byte
	choices [2]stablegraph.Choice
	closed  [2]error
	leaked  string
}

// turnsCommTimeout bounds how long a rank's collective waits for the
// other: far longer than the other rank's Run takes to enqueue its part.
const turnsCommTimeout = 2 * time.Second

// runInTurns runs steps of dp under strat (auto with one measured probe
// step per candidate) on the two devices of a fresh sim, one rank per
// device, the buffers bound by pattern, from one goroutine: each step runs
// on rank 0, then on rank 1, then both read their outputs. So the calls each Run makes are the
// same from run to run, and a fault lands in the call it names. The rank
// whose Run fails with the fault runs the same step again at once, as a
// caller that carries on would; the run stops at any other error (or a
// second one), and everything is closed.
func runInTurns(t *testing.T, strat stablegraph.Strategy, pattern workload.Pattern, steps int, f turnsFault) *turnsRun {
	t.Helper()
	ctx := context.Background()
	out := &turnsRun{}
	b, err := sim.New(sim.Config{Devices: 2, DeviceMemory: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if live := b.LiveHandles(); !live.IsZero() {
			out.leaked = live.String()
		}
		if err := b.Close(); err != nil {
			t.Errorf("close sim: %v", err)
		}
	}()
	b.SetCommTimeout(turnsCommTimeout)
	comms, err := stablegraph.NewComms(b, []int{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			if err := c.Close(); err != nil {
				t.Errorf("close %s: %v", c, err)
			}
		}
	}()
	ws, err := workload.ForRanks("dp", workload.Config{Layers: 2, Width: 16, Batch: 4}, comms)
	if err != nil {
		t.Fatal(err)
	}
	type rank struct {
		w      *workload.Workload
		caller *workload.Caller
		s      gpu.Stream
		exe    *stablegraph.Executable
	}
	var rs [2]*rank
	defer func() {
		for r, rk := range rs {
			if rk == nil {
				continue
			}
			if rk.exe != nil {
				out.choices[r] = rk.exe.Choice()
				out.closed[r] = rk.exe.Close()
			}
			if err := b.StreamDestroy(rk.s); err != nil {
				t.Errorf("rank %d: destroy stream: %v", r, err)
			}
			if err := rk.caller.Close(); err != nil {
				t.Errorf("rank %d: close caller: %v", r, err)
			}
		}
	}()
	for r, w := range ws {
		caller, err := workload.NewCaller(b, r, w, pattern, uint64(r+1))
		if err != nil {
			t.Fatal(err)
		}
		s, err := b.StreamCreate(r, gpu.StreamNonBlocking, 0)
		if err != nil {
			t.Fatal(errors.Join(err, caller.Close()))
		}
		rs[r] = &rank{w: w, caller: caller, s: s}
		exe, err := stablegraph.Compile(ctx, b, w.Program, stablegraph.Options{Strategy: strat, Device: r,
			StrategyOptions: stablegraph.StrategyOptions{Auto: stablegraph.AutoOptions{ProbeSteps: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		rs[r].exe = exe
		for _, st := range w.States {
			if err := exe.WriteBuffer(ctx, st.Buffer, st.Data); err != nil {
				t.Fatal(err)
			}
		}
	}
	for r := range out.calls {
		out.calls[r] = make([]int, steps)
	}
	for i := range steps {
		var outs [2]stablegraph.Outputs
		for r, rk := range rs {
			bind, err := rk.caller.Bind(i)
			if err != nil {
				out.errs[r] = fmt.Errorf("bind: %w", err)
				return out
			}
			armed := f.op != "" && f.rank == r && f.step == i
			var c0 int
			if f.op != "" {
				c0 = b.Calls(f.op)
			}
			if armed {
				b.InjectFault(f.op, f.nth, nil)
			}
			o, err := rk.exe.Run(ctx, rk.s, bind)
			b.ClearFaults()
			if f.op != "" {
				out.calls[r][i] = b.Calls(f.op) - c0
			}
			if armed && out.calls[r][i] > f.nth {
				out.fired = true
				if err != nil {
					out.faulted = err
					o, err = rk.exe.Run(ctx, rk.s, bind)
					out.retried = err
				}
			}
			if err != nil {
				out.errs[r] = err
				return out
			}
			outs[r] = o
		}
		for r, rk := range rs {
			h := sha256.New()
			for _, buf := range rk.w.Outputs {
				data, err := rk.exe.ReadOutput(ctx, outs[r], buf)
				if err != nil {
					out.errs[r] = fmt.Errorf("step %d: read %s: %w", i, buf.Name(), err)
					return out
				}
				h.Write(data)
			}
			out.digests[r] = append(out.digests[r], [sha256.Size]byte(h.Sum(nil)))
			out.done[r]++
		}
	}
	return out
}

// TestAutoCollectiveFaults fails, one at a time, every AllReduce,
// GraphLaunch and EventSynchronize call that rank 1's steps make while
// auto decides with rank 0 on dp (the steps' gradient all-reduces, the
// agreements' all-reduces, every probe step's launch, the agreements'
// reads), the ranks' steps run in turns so that each fault lands in the
// call it names. The rank whose step failed runs it again at once, as a
// caller that carries on would. What must hold: the failed step's error
// wraps the injected fault and names the entry point; auto never pairs its
// collectives wrongly with the other rank's (every error, of a step, a
// read or Close, says why: the fault, a timeout or an abort, never ranks
// that disagree); a step run again that goes through pairs with rank 0's,
// and both ranks then run every step, give eager's outputs and keep the
// same strategy, agreed; one that fails names the fault (an agreement
// that failed to enqueue ends the decision), and rank 0 then gives up with
// a timeout or an abort; and nothing is left live.
func TestAutoCollectiveFaults(t *testing.T) {
	patterns := []workload.Pattern{workload.Random, workload.PingPong}
	if testing.Short() {
		patterns = patterns[:1]
	}
	for _, pattern := range patterns {
		t.Run(string(pattern), func(t *testing.T) { autoCollectiveFaults(t, pattern) })
	}
}

func autoCollectiveFaults(t *testing.T, pattern workload.Pattern) {
	const steps = 20 // with ProbeSteps 1: 15 probe steps; the times' agreement is read at step 17
	ref := runInTurns(t, stablegraph.StrategyEager, pattern, steps, turnsFault{})
	if ref.errs[0] != nil || ref.errs[1] != nil {
		t.Fatalf("eager: %v; %v", ref.errs[0], ref.errs[1])
	}
	// says: no error, or one that says why, never ranks that disagree.
	says := func(err error) bool {
		return err == nil || errors.Is(err, gpu.ErrInjected) || errors.Is(err, gpu.ErrTimeout) || strings.Contains(err.Error(), "abort")
	}
	trials := 0
	for _, op := range []string{"AllReduce", "GraphLaunch", "EventSynchronize"} {
		clean := runInTurns(t, stablegraph.StrategyAuto, pattern, steps, turnsFault{op: op, rank: -1})
		for r := range 2 {
			if clean.errs[r] != nil || clean.closed[r] != nil || clean.done[r] != steps {
				t.Fatalf("auto, no fault: rank %d: %v (closed: %v)", r, clean.errs[r], clean.closed[r])
			}
			for i, d := range clean.digests[r] {
				if d != ref.digests[r][i] {
					t.Fatalf("auto, no fault: rank %d step %d differs from eager", r, i)
				}
			}
			if ch := clean.choices[r]; ch.Probing || !ch.Agreed || ch.Strategy != clean.choices[0].Strategy {
				t.Fatalf("auto, no fault: rank %d chose %s (probing %v, agreed %v): %s", r, ch.Strategy, ch.Probing, ch.Agreed, ch.Reason)
			}
		}
		for step, n := range clean.calls[1] {
			for nth := range n {
				f := turnsFault{op: op, rank: 1, step: step, nth: nth}
				got := runInTurns(t, stablegraph.StrategyAuto, pattern, steps, f)
				if !got.fired {
					t.Fatalf("%s: the fault did not fire (the calls differ from the clean run's)", f)
				}
				trials++
				named := func(err error) bool {
					return errors.Is(err, gpu.ErrInjected) && strings.Contains(err.Error(), op)
				}
				if got.faulted == nil && op != "EventSynchronize" {
					t.Errorf("%s: the step succeeded", f)
				}
				if got.faulted != nil && !named(got.faulted) {
					t.Errorf("%s: the step failed without naming the fault: %v", f, got.faulted)
				}
				if got.faulted == nil || got.retried == nil {
					// The fault was absorbed (the probes' times unread), or
					// the step run again went through: it paired with rank
					// 0's, and both ranks run every step and decide together.
					for r := range 2 {
						if got.errs[r] != nil || got.closed[r] != nil || got.done[r] != steps {
							t.Errorf("%s: rank %d ran %d of %d steps: %v (Close: %v)", f, r, got.done[r], steps, got.errs[r], got.closed[r])
						}
					}
					c0, c1 := got.choices[0], got.choices[1]
					if c0.Strategy != c1.Strategy || !c0.Agreed || !c1.Agreed || c0.Probing || c1.Probing {
						t.Errorf("%s: the ranks chose %s (agreed %v: %s) and %s (agreed %v: %s)", f, c0.Strategy, c0.Agreed, c0.Reason, c1.Strategy, c1.Agreed, c1.Reason)
					}
				} else {
					// The step run again failed: with the fault, since the
					// agreement rank 0 waits in can no longer be met; rank 0
					// gives up in it.
					if !named(got.retried) {
						t.Errorf("%s: the step run again fails without naming the fault: %v", f, got.retried)
					}
					if err := errors.Join(got.errs[0], got.closed[0]); err == nil || !says(err) {
						t.Errorf("%s: rank 0 does not give up with a timeout or an abort: %v", f, err)
					}
					if !says(got.closed[1]) {
						t.Errorf("%s: rank 1's Close fails without saying why: %v", f, got.closed[1])
					}
					if ch := got.choices[1]; ch.Agreed || !strings.Contains(ch.Reason, "agreement failed") {
						t.Errorf("%s: rank 1's choice (agreed %v): %s", f, ch.Agreed, ch.Reason)
					}
				}
				for r := range 2 {
					for i, d := range got.digests[r] {
						if d != ref.digests[r][i] {
							t.Errorf("%s: rank %d step %d differs from eager", f, r, i)
						}
					}
				}
				if got.leaked != "" {
					t.Errorf("%s: left live: %s", f, got.leaked)
				}
			}
		}
	}
	if trials == 0 {
		t.Fatal("no fault was injected")
	}
	t.Logf("%d faults injected", trials)
}
