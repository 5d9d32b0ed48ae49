package replay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/internal/steptest"
	"github.com/stablegraph/stablegraph/workload"
)

// TestAutoProbesAndDecides: on mlp, train and chain, with fixed, ping-pong
// and random buffers, auto runs each candidate for its warm-up steps, then
// in interleaved rounds for its measured steps, keeps one and closes the
// others; every output and every state after every step, during and after
// probing, equal eager's bit for bit (train updates its weights every step:
// a candidate that did not see the states the one before it left would
// diverge at once). The choice reports what it measured, and the memory
// shrinks to the kept candidate's.
func TestAutoProbesAndDecides(t *testing.T) {
	const steps = 48 // 43 probe steps by default, then the kept one
	for _, name := range []string{"mlp", "train", "chain"} {
		w := steptest.MustWorkload(t, name, workload.Config{Layers: 3, Width: 16, Batch: 4, K: 12, N: 64})
		for _, pattern := range workload.Patterns() {
			t.Run(name+"/"+string(pattern), func(t *testing.T) {
				b := simtest.New(t, 1)
				want := steptest.RunWorkload(t, b, w, stablegraph.Options{Strategy: stablegraph.StrategyEager}, pattern, steps, true)
				got := steptest.RunWorkload(t, b, w, stablegraph.Options{Strategy: stablegraph.StrategyAuto}, pattern, steps, true)
				steptest.SameResults(t, got, want)
				checkProbes(t, got, 6, 2)
			})
		}
	}
}

// probeOrder is the documented plan of auto's probe steps (replay/probe.go,
// AutoOptions.ProbeSteps): each candidate's warm-up steps in the model's
// order, then rounds that visit every candidate, each round starting one
// further on, a visit being one step back at the caller's addresses and up
// to two measured steps, until each candidate has probeSteps of them. It
// returns the candidate of each step and whether the step is measured.
func probeOrder(order []stablegraph.Strategy, warm map[stablegraph.Strategy]int, probeSteps int) (plan []stablegraph.Strategy, measured []bool) {
	for _, st := range order {
		for range warm[st] {
			plan, measured = append(plan, st), append(measured, false)
		}
	}
	for r := 0; 2*r < probeSteps; r++ {
		for j := range order {
			st := order[(r+j)%len(order)]
			plan, measured = append(plan, st), append(measured, false)
			for range min(2, probeSteps-2*r) {
				plan, measured = append(plan, st), append(measured, true)
			}
		}
	}
	return plan, measured
}

// checkProbes checks the order in which auto ran its candidates, what it
// reports, and the memory it held.
func checkProbes(t *testing.T, tr steptest.WorkloadRun, probeSteps, poolSlots int) {
	t.Helper()
	first, final := tr.First, tr.Final
	if !first.Probing || first.Requested != stablegraph.StrategyAuto || !strings.HasPrefix(first.Reason, "probing ") {
		t.Fatalf("choice at Compile: %+v", first)
	}
	// The probes, in the model's order, the model's choice first.
	var order []stablegraph.Strategy
	for _, c := range first.Candidates {
		if c.Usable {
			order = append(order, c.Strategy)
		}
	}
	if len(order) != 4 || order[0] != first.Strategy {
		t.Fatalf("candidates at Compile %+v", first.Candidates)
	}
	warm := map[stablegraph.Strategy]int{stablegraph.StrategyPatch: 2, stablegraph.StrategyDevice: 2, stablegraph.StrategyStable: 1,
		stablegraph.StrategyPool: poolSlots}
	plan, _ := probeOrder(order, warm, probeSteps)
	if !strings.Contains(first.Reason, fmt.Sprintf("%d steps in all", len(plan))) {
		t.Errorf("the reason at Compile does not give the %d probe steps: %s", len(plan), first.Reason)
	}
	if len(tr.Steps) <= len(plan) {
		t.Fatalf("%d steps run, %d of them probe steps", len(tr.Steps), len(plan))
	}
	step, modelProbed := 0, false
	for _, st := range plan {
		if s := tr.Steps[step].Stats; s.Ran != st || !s.Probing || s.Strategy != first.Strategy {
			t.Fatalf("step %d ran %s (probing %v, strategy %s), want the probe of %s", step, s.Ran, s.Probing, s.Strategy, st)
		}
		// Every candidate's memory is held while probing.
		if m := tr.Steps[step].Mem; m.Persistent == 0 || m.Slots == 0 || m.SlotCount != poolSlots {
			t.Fatalf("step %d: memory while probing %+v", step, m)
		}
		// What a probe step did counts nowhere (a row of auto that ran
		// stable once showed patch's 4004 patched nodes), but for the
		// graph the model's choice records at its first probe step: the
		// strategy said to run holds it (a short generate under auto said
		// "0 graphs recorded").
		var held int64
		if st == first.Strategy && !modelProbed {
			held, modelProbed = 1, true
		}
		if last := tr.Steps[step].Stats.Last; last != (stablegraph.Counters{ProbeSteps: 1, SlotWaits: last.SlotWaits, Records: held}) {
			t.Fatalf("step %d, a probe of %s, counted %+v", step, st, last)
		}
		step++
	}
	// The probes' times are read at the next step (the tests read every
	// step back, so the device is past them): it runs the one kept.
	for ; step < len(tr.Steps); step++ {
		if s := tr.Steps[step].Stats; s.Probing || s.Ran != final.Strategy || s.Strategy != final.Strategy {
			t.Fatalf("step %d after probing: ran %s, probing %v, chose %s", step, s.Ran, s.Probing, final.Strategy)
		}
	}
	if final.Probing || final.Requested != stablegraph.StrategyAuto || !strings.HasPrefix(final.Reason, "fastest measured step") ||
		!strings.Contains(final.Reason, "measured") {
		t.Fatalf("final choice %+v", final)
	}
	if len(final.Candidates) != 4 || final.Candidates[0].Strategy != final.Strategy {
		t.Fatalf("final candidates %+v", final.Candidates)
	}
	// The graphs the kept candidate recorded while probing are the ones
	// it runs: they count (a generate under auto said "0 graphs
	// recorded"), its probe steps' other work does not.
	if st := tr.Steps[len(tr.Steps)-1].Stats; st.Records < 1 || st.Rerecords != 0 || st.ProbeSteps != int64(len(plan)) {
		t.Errorf("counters after choosing %s: %d graphs recorded, %d re-recorded, %d probe steps (want at least 1, 0, %d)",
			final.Strategy, st.Records, st.Rerecords, st.ProbeSteps, len(plan))
	}
	for _, c := range final.Candidates {
		if !c.Usable || c.Probed != probeSteps || c.GPUUS <= 0 || c.HostUS <= 0 || !strings.Contains(final.Reason, string(c.Strategy)+": measured") {
			t.Errorf("candidate %+v; reason %q", c, final.Reason)
		}
	}
	m := tr.Steps[len(tr.Steps)-1].Mem
	if (final.Strategy == stablegraph.StrategyStable) != (m.Persistent > 0) || (final.Strategy == stablegraph.StrategyPool) != (m.Slots > 0) {
		t.Errorf("memory %+v after choosing %s", m, final.Strategy)
	}
	if testing.Verbose() {
		t.Logf("%s", final.Reason)
	}
}

// TestAutoProbeOptions: fewer probe steps and three pool slots change the
// schedule as documented; probing disabled, or skipped for zero-copy
// outputs, leaves the model's choice, and says why.
func TestAutoProbeOptions(t *testing.T) {
	w := steptest.MustWorkload(t, "mlp", workload.Config{Layers: 2, Width: 16, Batch: 2})
	b := simtest.New(t, 1)
	want := steptest.RunWorkload(t, b, w, stablegraph.Options{Strategy: stablegraph.StrategyEager}, workload.Random, 20, true)
	got := steptest.RunWorkload(t, b, w, stablegraph.Options{Strategy: stablegraph.StrategyAuto, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: 3}, Auto: stablegraph.AutoOptions{ProbeSteps: 1}}}, workload.Random, 20, true)
	steptest.SameResults(t, got, want)
	checkProbes(t, got, 1, 3)

	for _, c := range []struct {
		opts stablegraph.Options
		says string
	}{
		{stablegraph.Options{StrategyOptions: stablegraph.StrategyOptions{Auto: stablegraph.AutoOptions{ProbeSteps: -1}}}, "not probed: probing disabled"},
		{stablegraph.Options{StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{ZeroCopyOutputs: true}}}, "not probed: zero-copy outputs"},
	} {
		c.opts.Strategy = stablegraph.StrategyAuto
		tr := steptest.RunWorkload(t, b, w, c.opts, workload.PingPong, 3, true)
		if tr.First.Probing || tr.Final.Probing || tr.First.Strategy != tr.Final.Strategy || !strings.Contains(tr.Final.Reason, c.says) ||
			!strings.HasPrefix(tr.Final.Reason, "cheapest modelled step: ") {
			t.Errorf("%+v: choice %+v", c.opts, tr.Final)
		}
		for i, st := range tr.Steps {
			if st.Stats.Probing || st.Stats.Ran != tr.Final.Strategy {
				t.Errorf("%+v: step %d ran %s", c.opts, i, st.Stats.Ran)
			}
		}
		for _, cand := range tr.Final.Candidates {
			if cand.Probed != 0 {
				t.Errorf("%+v: %s probed", c.opts, cand.Strategy)
			}
		}
	}
	if exe, err := stablegraph.Compile(context.Background(), b, w.Program,
		stablegraph.Options{Strategy: stablegraph.StrategyAuto, StrategyOptions: stablegraph.StrategyOptions{Auto: stablegraph.AutoOptions{ProbeSteps: stablegraph.MaxAutoProbeSteps + 1}}}); err == nil {
		exe.Close()
		t.Error("too many probe steps accepted")
	}
}

// TestAutoProbeConcurrent runs one auto executable from several goroutines
// through and past probing, while another reads its Choice, Memory and
// Stats; run under -race. Every result must be eager's.
func TestAutoProbeConcurrent(t *testing.T) {
	const workers, steps = 4, 14 // past the 43 probe steps
	w := steptest.MustWorkload(t, "mlp", workload.Config{Layers: 2, Width: 16, Batch: 2})
	b := simtest.New(t, 1)
	exe := steptest.Workers{
		// The mlp's output depends on its input alone.
		Program: w.Program, X: w.Params[0], Y: w.Outputs[0], States: w.States,
		Input:   func(i int) []byte { return w.Input(i, 0) },
		Options: stablegraph.Options{Strategy: stablegraph.StrategyAuto},
		Workers: workers, Steps: steps,
		During: func(exe *stablegraph.Executable) error {
			ch := exe.Choice()
			_ = exe.Memory().Total()
			if st := exe.Stats(); st.Strategy == "" || ch.Strategy == "" {
				return errors.New("no strategy reported")
			}
			return nil
		},
	}.Run(t, b)
	if ch := exe.Choice(); ch.Probing || !strings.HasPrefix(ch.Reason, "fastest measured step") {
		t.Errorf("after %d steps: %+v", workers*steps, ch)
	}
}

// TestAutoProbeFaults fails, one at a time, the device calls made at every
// step of probing and of the decision (event records and reads, graph
// recording, launches, copies, timeline writes). A faulted step returns
// the injected error; every step that succeeds gives eager's outputs; auto
// still decides; and Close leaves exactly the handles live that were
// before Compile.
func TestAutoProbeFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("a fault at every probe step is slow under -short")
	}
	ops := []string{"EventRecord", "EventQuery", "EventElapsed", "GraphLaunch", "GraphInstantiate",
		"GraphExecMemcpyNodeSetParams", "GraphExecKernelNodeSetParams", "StreamWriteValue64", "StreamBeginCapture",
		"GraphUpload", "GraphKernelNodeSetDeviceUpdatable", "GraphAddKernelNodeBefore", "HostAlloc"}
	const steps = 20           // 15 probe steps with one measured step each
	compared := []int{0, 1, 3} // outputs that do not depend on the accumulator
	b := simtest.New(t, 1)
	w := steptest.NewMLP(2, 8, 2, 10, 3)
	want, _ := steptest.RunMLP(t, b, w, stablegraph.StrategyEager, steptest.PingPong, steps)
	ctx := context.Background()
	s := simtest.Stream(t, b, 0)
	a := steptest.NewArena(t, b, 16<<20)
	fired := map[string]int{}
	for _, op := range ops {
		for at := range steps - 2 {
			for _, nth := range []int{0, 2} {
				base := b.LiveHandles()
				exe, err := stablegraph.Compile(ctx, b, w.P, stablegraph.Options{Strategy: stablegraph.StrategyAuto, StrategyOptions: stablegraph.StrategyOptions{Auto: stablegraph.AutoOptions{ProbeSteps: 1}}})
				if err != nil {
					t.Fatal(err)
				}
				w.InitStates(t, exe)
				ad := steptest.NewAddresser(t, b, a, steptest.PingPong, append(append([]stablegraph.Buffer(nil), w.Params...), w.Outputs...), w)
				for i := range steps {
					bind, err := ad.Bind(i)
					if err != nil {
						t.Fatal(err)
					}
					calls := b.Calls(op)
					if i == at {
						b.InjectFault(op, nth, nil)
					}
					outs, err := exe.Run(ctx, s, bind)
					b.ClearFaults()
					hit := i == at && b.Calls(op)-calls > nth
					if hit {
						fired[op]++
					}
					if err != nil {
						if !hit || !errors.Is(err, gpu.ErrInjected) || !strings.Contains(err.Error(), op) {
							t.Fatalf("%s call %d at step %d: step %d failed: %v", op, nth, at, i, err)
						}
						if err := b.StreamSynchronize(s); err != nil {
							t.Fatal(err)
						}
						continue
					}
					if hit {
						t.Fatalf("%s call %d at step %d failed, but the step succeeded", op, nth, at)
					}
					for _, k := range compared {
						got, err := exe.ReadOutput(ctx, outs, w.Outputs[k])
						if err != nil {
							t.Fatal(err)
						}
						if !bytes.Equal(got, want[i].Outs[k]) {
							t.Fatalf("%s call %d at step %d: step %d (ran %s) output %s differs from eager",
								op, nth, at, i, exe.Stats().Ran, w.Outputs[k].Name())
						}
					}
				}
				if ch := exe.Choice(); ch.Probing {
					t.Fatalf("%s call %d at step %d: still probing after %d steps: %s", op, nth, at, steps, ch.Reason)
				}
				ad.Close()
				if err := exe.Close(); err != nil {
					t.Fatal(err)
				}
				if live := b.LiveHandles(); live != base {
					t.Fatalf("%s call %d at step %d: handles live after Close: %s, before Compile: %s", op, nth, at, live, base)
				}
			}
		}
	}
	for _, op := range ops {
		if fired[op] == 0 {
			t.Errorf("no fault fired in %s", op)
		}
	}
	t.Logf("faults fired: %v", fired)
}

// TestAutoDecisionReleaseFaults: a release that fails when auto closes the
// candidates it did not keep (an event, a graph) is reported by the Run
// that made it, before that Run enqueues anything; the next step runs; the
// handle that could not be released is the only one left.
func TestAutoDecisionReleaseFaults(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		op   string
		leak gpu.HandleCounts
	}{
		{"EventDestroy", gpu.HandleCounts{Events: 1}},
		{"GraphExecDestroy", gpu.HandleCounts{GraphExecs: 1}},
	} {
		t.Run(c.op, func(t *testing.T) {
			// Not simtest.New: the handle whose release fails stays live.
			b, err := sim.New(sim.Config{Devices: 1, DeviceMemory: 1 << 30})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			w := steptest.NewMLP(2, 8, 2, 10, 3)
			s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
			if err != nil {
				t.Fatal(err)
			}
			bufs := map[stablegraph.Buffer]gpu.DevicePtr{}
			for _, buf := range append(append([]stablegraph.Buffer(nil), w.Params...), w.Outputs...) {
				if bufs[buf], err = b.MemAlloc(0, uint64(buf.Size())); err != nil {
					t.Fatal(err)
				}
			}
			base := b.LiveHandles()
			exe, err := stablegraph.Compile(ctx, b, w.P, stablegraph.Options{Strategy: stablegraph.StrategyAuto, StrategyOptions: stablegraph.StrategyOptions{Auto: stablegraph.AutoOptions{ProbeSteps: 1}}})
			if err != nil {
				t.Fatal(err)
			}
			failed := false
			for i := 0; i < 20 && !failed; i++ {
				if err := b.StreamSynchronize(s); err != nil {
					t.Fatal(err)
				}
				// 15 probe steps (7 of warm-up, a round of two steps per
				// candidate): step 15 decides and fences, step 16 closes
				// the candidates not kept and destroys the probe events.
				if i == 15 || i == 16 {
					b.InjectFault(c.op, 0, nil)
				}
				_, err := exe.Run(ctx, s, bufs)
				b.ClearFaults()
				switch {
				case err != nil && (!errors.Is(err, gpu.ErrInjected) || !strings.Contains(err.Error(), c.op)):
					t.Fatalf("step %d: %v", i, err)
				case err != nil:
					failed = true
					if exe.Choice().Probing || i != 16 {
						t.Fatalf("step %d failed (probing %v): %v", i, exe.Choice().Probing, err)
					}
				}
			}
			if !failed {
				t.Fatalf("no step reported the failed %s", c.op)
			}
			if _, err := exe.Run(ctx, s, bufs); err != nil {
				t.Fatalf("the step after the reported failure: %v", err)
			}
			if err := errors.Join(b.StreamSynchronize(s), exe.Close()); err != nil {
				t.Fatal(err)
			}
			live := b.LiveHandles()
			if live.Events-base.Events != c.leak.Events || live.GraphExecs-base.GraphExecs != c.leak.GraphExecs ||
				live.Allocations != base.Allocations || live.Chunks != base.Chunks || live.Mappings != base.Mappings {
				t.Errorf("live after Close %s, before Compile %s; want only %s more", live, base, c.leak)
			}
		})
	}
}
