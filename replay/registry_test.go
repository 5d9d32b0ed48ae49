package replay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/internal/steptest"
)

// TestStrategiesMatchEager runs the MLP workload under every strategy and
// movement and demands every output of every step, and the final state,
// equal to eager's bit for bit.
func TestStrategiesMatchEager(t *testing.T) {
	// Enough for auto to probe its four candidates (43 steps) and then
	// run the one it kept.
	const steps = 48
	for _, move := range steptest.Movements() {
		t.Run(string(move), func(t *testing.T) {
			b := simtest.New(t, 1)
			w := steptest.NewMLP(4, 32, 3, 100, 6)
			want, wantAcc := steptest.RunMLP(t, b, w, stablegraph.StrategyEager, move, steps)
			for _, st := range stablegraph.Strategies()[1:] {
				t.Run(string(st), func(t *testing.T) {
					got, gotAcc := steptest.RunMLP(t, b, w, st, move, steps)
					for i := range got {
						for k := range got[i].Outs {
							if !bytes.Equal(got[i].Outs[k], want[i].Outs[k]) {
								t.Fatalf("step %d output %s differs from eager", i, w.Outputs[k].Name())
							}
						}
					}
					if !bytes.Equal(gotAcc, wantAcc) {
						t.Fatal("final state differs from eager")
					}
					checkStats(t, st, move, got)
				})
			}
		})
	}
}

// checkStats asserts what each strategy should have done.
func checkStats(t *testing.T, st stablegraph.Strategy, move steptest.Movement, res []steptest.Step) {
	t.Helper()
	final := res[len(res)-1].Stats
	// Auto's probe steps count in no counter but ProbeSteps.
	if final.Steps != int64(len(res)) || final.GraphLaunches+final.ProbeSteps != int64(len(res)) {
		t.Errorf("steps %d, graph launches %d and probe steps %d, want %d", final.Steps, final.GraphLaunches, final.ProbeSteps, len(res))
	}
	if (st == stablegraph.StrategyAuto) != (final.ProbeSteps > 0) {
		t.Errorf("%d probe steps under %s", final.ProbeSteps, st)
	}
	decided := false
	copied := res[0].Stats.Last.BytesCopied // per step, by stable and pool
	if first := res[0].Stats.Last; st == stablegraph.StrategyRemap && (first.Records != 1 || first.Remaps != int64(len(res[0].Bind))) {
		t.Errorf("first step: %d records, %d ranges mapped; want 1 and %d", first.Records, first.Remaps, len(res[0].Bind))
	}
	var deviceUpdates int64 // per moving step, by device
	for i, r := range res[1:] {
		i++
		last := r.Stats.Last
		if last.Rerecords != last.MoveRerecords+last.UpdateFallbacks+last.RetryRerecords {
			t.Errorf("step %d (ran %s): %d re-records not explained by %d moves, %d refusals, %d retries",
				i, r.Stats.Ran, last.Rerecords, last.MoveRerecords, last.UpdateFallbacks, last.RetryRerecords)
		}
		if r.Stats.Probing {
			// Auto runs each candidate in turn, warm-ups included:
			// only the bits are checked (by the caller).
			continue
		}
		if st == stablegraph.StrategyAuto && !decided {
			// The step that runs the candidate kept: what moved is
			// relative to the step before, which another one ran; the
			// checks start at the next.
			decided, copied = true, last.BytesCopied
			if i < 2 || r.Stats.Ran != r.Stats.Strategy {
				t.Errorf("step %d: auto decided at once, or ran %s after choosing %s", i, r.Stats.Ran, r.Stats.Strategy)
			}
			continue
		}
		// Under auto, what the chosen strategy should have done.
		switch r.Stats.Strategy {
		case stablegraph.StrategyRecord:
			if want := int64(b2i(r.Moved)); last.Rerecords != want || last.MoveRerecords != want {
				t.Errorf("step %d: %d re-records (%d for moves), want %d", i, last.Rerecords, last.MoveRerecords, want)
			}
		case stablegraph.StrategyUpdate:
			if want := int64(b2i(r.Moved)); last.GraphUpdates != want || last.Rerecords != 0 {
				t.Errorf("step %d: %d updates and %d re-records, want %d and 0", i, last.GraphUpdates, last.Rerecords, want)
			}
		case stablegraph.StrategyPatch:
			// Node by node, or, where most of the graph's nodes move and
			// the costs price it cheaper, one whole-graph update from the
			// template.
			if last.Rerecords != 0 || last.GraphUpdates > 1 || (last.GraphUpdates == 1) != (r.Moved && last.GraphUpdates != 0) {
				t.Errorf("step %d: %d re-records, %d updates under patch", i, last.Rerecords, last.GraphUpdates)
			}
			if r.Moved != (last.PatchedNodes > 0) {
				t.Errorf("step %d: moved=%v but %d nodes patched", i, r.Moved, last.PatchedNodes)
			}
			// Every traced command on sim is patchable: after the first
			// step nothing is ever captured again, whatever moves.
			if last.TracesCaptured != 0 {
				t.Errorf("step %d: %d traces captured under patch", i, last.TracesCaptured)
			}
		case stablegraph.StrategyRemap:
			// Recorded once over the ranges, never patched or copied: the
			// moved buffers' ranges alone are remapped.
			moved := 0
			for buf, p := range r.Bind {
				if res[i-1].Bind[buf] != p {
					moved++
				}
			}
			if last.Records != 0 || last.Rerecords != 0 || last.PatchedNodes != 0 || last.GraphUpdates != 0 ||
				last.BytesCopied != 0 || last.TracesCaptured != 0 || last.CopyNodeUpdates != 0 {
				t.Errorf("step %d: remap recorded, patched, updated or copied: %+v", i, last)
			}
			if last.Remaps != int64(moved) || (move == steptest.Fixed) != (moved == 0) {
				t.Errorf("step %d: %d ranges remapped, %d buffers moved (%s)", i, last.Remaps, moved, move)
			}
		case stablegraph.StrategyDevice:
			// Recorded once; the first command's node moves from the
			// host (hostLead), every other pointer on the device (the
			// copy and memset of the program as copy and fill kernels,
			// the GEMMs' kernels at their template's slots): nothing
			// else moved from the host, uploaded or captured after the
			// first step.
			if last.Records != 0 || last.GraphUpdates != 0 || last.PatchedNodes > 1 || last.GraphUploads != 0 || last.TracesCaptured != 0 {
				t.Errorf("step %d: %d records, %d updates, %d patched, %d uploads, %d traces captured under device",
					i, last.Records, last.GraphUpdates, last.PatchedNodes, last.GraphUploads, last.TracesCaptured)
			}
			if r.Moved != (last.DeviceUpdates > 0) {
				t.Errorf("step %d: moved=%v but %d pointers moved on the device", i, r.Moved, last.DeviceUpdates)
			}
			// With ping-pong, every param and output moves at every step:
			// the same pointers every time (random buffers may land where
			// they were).
			if move != steptest.PingPong {
				break
			}
			if deviceUpdates == 0 {
				deviceUpdates = last.DeviceUpdates
			} else if last.DeviceUpdates != deviceUpdates {
				t.Errorf("step %d: %d pointers moved on the device, %d at an earlier step", i, last.DeviceUpdates, deviceUpdates)
			}
		case stablegraph.StrategyStable, stablegraph.StrategyPool:
			// The body is recorded once (per pool slot, at its first
			// use) and never patched; only copy nodes follow the caller.
			firstUse := r.Stats.Strategy == stablegraph.StrategyPool && i < 2
			if !firstUse && (last.Records != 0 || last.TracesCaptured != 0) {
				t.Errorf("step %d: %d records, %d traces captured", i, last.Records, last.TracesCaptured)
			}
			if last.Rerecords != 0 || last.PatchedNodes != 0 || last.GraphUpdates != 0 || last.BytesCopied != copied || copied == 0 {
				t.Errorf("step %d: %d re-records, %d patched, %d updates, %d bytes copied (first step: %d)", i,
					last.Rerecords, last.PatchedNodes, last.GraphUpdates, last.BytesCopied, copied)
			}
			if r.Stats.Strategy == stablegraph.StrategyStable && r.Moved != (last.CopyNodeUpdates != 0) {
				t.Errorf("step %d: moved=%v but %d copy nodes updated", i, r.Moved, last.CopyNodeUpdates)
			}
			// A pool slot compares with its own last step: with two
			// slots and ping-pong, each slot always sees the same set.
			if r.Stats.Strategy == stablegraph.StrategyPool && move != steptest.Random && last.CopyNodeUpdates != 0 {
				t.Errorf("step %d: %d copy nodes updated under pool with %s buffers", i, last.CopyNodeUpdates, move)
			}
			if pool := r.Stats.Strategy == stablegraph.StrategyPool; pool != (last.TimelineWrites == 1) {
				t.Errorf("step %d: %d timeline writes under %s", i, last.TimelineWrites, r.Stats.Strategy)
			}
		}
		// With ping-pong, every traced command's address sets repeat from
		// the third step on: all cache hits, nothing captured.
		if move == steptest.PingPong && i >= 2 && (last.TracesCaptured != 0 || last.TraceCacheMisses != 0 || last.TracesSynthesized != 0) {
			t.Errorf("step %d (%s, ping-pong): %d captured, %d misses, %d synthesized; want 0",
				i, st, last.TracesCaptured, last.TraceCacheMisses, last.TracesSynthesized)
		}
	}
	if st == stablegraph.StrategyAuto && (!decided || final.Probing) {
		t.Errorf("auto still probing after %d steps", len(res))
	}
	if testing.Verbose() {
		fmt.Printf("%-7s %-8s %+v\n", st, move, final.Counters)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestEveryRecordCounted holds every registered strategy, under every
// movement, to the counting rule: every graph recorded again is counted
// with its cause (Rerecords = MoveRerecords + UpdateFallbacks +
// RetryRerecords, at every step and in total), and every refused update
// reaches Stats.Fallbacks (its reasons sum to UpdateFallbacks). The steps
// rebind states (BindState, which every strategy allows: a graph recorded
// over the states' addresses records again), the driver refuses updates
// (gpu.ErrGraphUpdate: re-recorded) and fails others (the step fails, the
// next records again), also after auto has decided; every step must still
// give eager's bits.
func TestEveryRecordCounted(t *testing.T) {
	const steps = 34
	rebind := map[int]bool{5: true, 9: true, 26: true}
	// Injected before the step, into every update entry point: each fires
	// at the next call of its entry point, whichever step makes it.
	refuse := map[int]bool{3: true, 24: true}
	fail := map[int]bool{7: true, 28: true}
	updates := []string{"GraphExecUpdate", "GraphExecKernelNodeSetParams", "GraphExecMemcpyNodeSetParams",
		"GraphExecMemsetNodeSetParams", "GraphExecChildGraphNodeSetParams"}
	refusal := &gpu.UpdateError{Op: "injected", Result: gpu.UpdateNotSupported, Detail: "the test refused it"}
	ctx := context.Background()
	for _, move := range steptest.Movements() {
		t.Run(string(move), func(t *testing.T) {
			b := simtest.New(t, 1)
			w := steptest.NewMLP(4, 32, 3, 100, 6)
			want, _ := steptest.RunMLP(t, b, w, stablegraph.StrategyEager, move, steps)
			for _, st := range stablegraph.Strategies() {
				t.Run(string(st), func(t *testing.T) {
					s := simtest.Stream(t, b, 0)
					opts := stablegraph.Options{Strategy: st}
					// By default device makes no exec update a refusal could
					// hit; its first command moved from the host makes one.
					opts.DeviceStrategy.HostLead = st == stablegraph.StrategyDevice
					ad := steptest.NewAddresser(t, b, steptest.ArenaFor(t, b, 64<<20, &opts), move,
						append(append([]stablegraph.Buffer(nil), w.Params...), w.Outputs...), w)
					exe := steptest.Compile(t, b, w.P, opts)
					w.InitStates(t, exe)
					defer b.ClearFaults()
					for i := range steps {
						if rebind[i] {
							rebindState(t, b, exe, w.Acc)
							rebindState(t, b, exe, w.Weights[0])
						}
						for _, op := range updates {
							switch {
							case refuse[i]:
								b.InjectFault(op, 0, refusal)
							case fail[i]:
								b.InjectFault(op, 0, nil)
							}
						}
						bind, err := ad.Bind(i)
						if err != nil {
							t.Fatal(err)
						}
						before := exe.Stats()
						outs, err := exe.Run(ctx, s, bind)
						// A failed update fails its step before anything is
						// enqueued; the step runs again, as a caller would.
						for try := 0; err != nil && errors.Is(err, gpu.ErrInjected) && try < len(updates); try++ {
							outs, err = exe.Run(ctx, s, bind)
						}
						if err != nil {
							t.Fatalf("step %d: %v", i, err)
						}
						for k, o := range w.Outputs {
							got, err := exe.ReadOutput(ctx, outs, o)
							if err != nil {
								t.Fatal(err)
							}
							if !bytes.Equal(got, want[i].Outs[k]) {
								t.Fatalf("step %d (ran %s): output %s differs from eager", i, exe.Stats().Ran, o.Name())
							}
						}
						outs.Release()
						stats := exe.Stats()
						for what, c := range map[string]stablegraph.Counters{"the step": stats.Counters.Sub(before.Counters), "in total": stats.Counters} {
							if c.Rerecords != c.MoveRerecords+c.UpdateFallbacks+c.RetryRerecords {
								t.Errorf("step %d (ran %s), %s: %d re-records, %d explained by moves, %d by refusals, %d by retries",
									i, stats.Ran, what, c.Rerecords, c.MoveRerecords, c.UpdateFallbacks, c.RetryRerecords)
							}
						}
						var reasons int64
						for _, n := range stats.Fallbacks.ByReason {
							reasons += n
						}
						if reasons != stats.UpdateFallbacks {
							t.Errorf("step %d (ran %s): %d updates refused, %d of them in Stats.Fallbacks (%v)",
								i, stats.Ran, stats.UpdateFallbacks, reasons, stats.Fallbacks.ByReason)
						}
						// The graphs held by these strategies point at the
						// states: a rebound one is recorded again, for a move.
						ran := stats.Ran
						if rebind[i] && !stats.Probing && (ran == stablegraph.StrategyRecord || ran == stablegraph.StrategyDevice ||
							ran == stablegraph.StrategyStable || ran == stablegraph.StrategyPool || ran == stablegraph.StrategyRemap) &&
							stats.MoveRerecords == before.MoveRerecords {
							t.Errorf("step %d: states rebound, but %s recorded nothing again for a move", i, ran)
						}
					}
					b.ClearFaults()
					if err := exe.Close(); err != nil {
						t.Fatal(err)
					}
					final := exe.Stats()
					// Where updates are made every step, the injected ones
					// fired and were counted: refusals, and retries where a
					// failed update leaves no graph (update keeps its
					// graph, which a failed whole-graph update leaves as it
					// was).
					updating := st == stablegraph.StrategyUpdate || st == stablegraph.StrategyPatch ||
						st == stablegraph.StrategyDevice || st == stablegraph.StrategyStable
					if move != steptest.Fixed && updating && (final.UpdateFallbacks == 0 || final.Fallbacks.Last == "" ||
						(st != stablegraph.StrategyUpdate && final.RetryRerecords == 0)) {
						t.Errorf("%s, %s buffers: %d refusals, %d retries, last refusal %q: the injected ones did not count",
							st, move, final.UpdateFallbacks, final.RetryRerecords, final.Fallbacks.Last)
					}
				})
			}
		})
	}
}

// rebindState moves state buf to new memory holding its bytes (freed at
// cleanup; the test closes the executable first).
func rebindState(t *testing.T, b gpu.Backend, exe *stablegraph.Executable, buf stablegraph.Buffer) {
	t.Helper()
	ctx := context.Background()
	data, err := exe.ReadBuffer(ctx, buf)
	if err != nil {
		t.Fatal(err)
	}
	p := simtest.Alloc(t, b, 0, uint64(len(data)))
	if err := b.MemcpyHtoD(p, data); err != nil {
		t.Fatal(err)
	}
	if err := exe.BindState(ctx, buf, p); err != nil {
		t.Fatal(err)
	}
}
