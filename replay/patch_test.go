package replay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/internal/steptest"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/workload"
)

// fillU64 returns a traced function that fills its one slice with n copies
// of value(ptr), ptr being the slice's address at trace time.
func fillU64(n int, value func(ptr gpu.DevicePtr) uint64) stablegraph.TraceFunc {
	return func(env *stablegraph.TraceEnv) error {
		f, err := env.Kernel(kernels.FillU64)
		if err != nil {
			return err
		}
		return env.Backend.LaunchKernel(f, kernels.Elementwise(n),
			[]gpu.Arg{gpu.Ptr(env.Ptrs[0]), gpu.U64(value(env.Ptrs[0])), gpu.I32(int32(n))}, env.Stream)
	}
}

// TestScalarEqualToOldAddressSurvivesPatch is docs/ARCHITECTURE.md rule 1: a
// u64 scalar whose value is a buffer's old address must keep its value when
// the pointers are patched, in a kernel node (typed arguments) and in a
// traced node (differential tracing). It also checks that traced commands
// whose scalars follow their addresses get the value eager would give, by
// patching (slope-1 pointer slot) or by re-tracing (not patchable).
func TestScalarEqualToOldAddressSurvivesPatch(t *testing.T) {
	const n = 64
	for _, st := range stablegraph.Strategies() {
		t.Run(string(st), func(t *testing.T) {
			ctx := context.Background()
			b := simtest.New(t, 1)
			s := simtest.Stream(t, b, 0)
			opts := stablegraph.Options{Strategy: st}
			a := steptest.ArenaFor(t, b, 1<<20, &opts)
			p := stablegraph.NewProgram("rule1")
			outs := map[string]stablegraph.Buffer{}
			for _, name := range []string{"kernel", "traced-const", "traced-self", "traced-xor"} {
				outs[name] = p.Output(name, 8*n)
			}
			// Two address sets, ping-ponged; the scalars are set 0's
			// addresses, so after the first move they equal old addresses.
			sets := [2]stablegraph.Bindings{{}, {}}
			for i := range sets {
				for _, o := range outs {
					ptr, err := a.Alloc(8 * n)
					if err != nil {
						t.Fatal(err)
					}
					sets[i][o] = ptr
				}
			}
			old := func(name string) uint64 { return uint64(sets[0][outs[name]]) }
			p.Launch(kernels.FillU64, kernels.Elementwise(n), stablegraph.Out(outs["kernel"].All()),
				stablegraph.U64(old("kernel")), stablegraph.I32(n))
			p.Trace("traced-const", fillU64(n, func(gpu.DevicePtr) uint64 { return old("traced-const") }),
				stablegraph.Out(outs["traced-const"].All()))
			p.Trace("traced-self", fillU64(n, func(ptr gpu.DevicePtr) uint64 { return uint64(ptr) }),
				stablegraph.Out(outs["traced-self"].All()))
			p.Trace("traced-xor", fillU64(n, func(ptr gpu.DevicePtr) uint64 { return uint64(ptr) ^ 0xdead }),
				stablegraph.Out(outs["traced-xor"].All()))

			exe, err := stablegraph.Compile(ctx, b, p, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer exe.Close()
			for step := range 6 {
				bind := sets[step%2]
				res, err := exe.Run(ctx, s, bind)
				if err != nil {
					t.Fatal(err)
				}
				want := map[string]uint64{
					"kernel":       old("kernel"),
					"traced-const": old("traced-const"),
					"traced-self":  uint64(bind[outs["traced-self"]]),
					"traced-xor":   uint64(bind[outs["traced-xor"]]) ^ 0xdead,
				}
				for name, o := range outs {
					if persistentAddresses(exe) && (name == "traced-self" || name == "traced-xor") {
						// Under stable and pool the program runs on
						// persistent copies, under remap on its own
						// ranges: a command whose result is its own
						// address sees theirs, not the caller's.
						continue
					}
					data, err := exe.ReadOutput(ctx, res, o)
					if err != nil {
						t.Fatal(err)
					}
					for i, v := range steptest.U64s(data) {
						if v != want[name] {
							t.Fatalf("step %d: %s[%d] = %#x, want %#x", step, name, i, v, want[name])
						}
					}
				}
			}
			if st != stablegraph.StrategyPatch {
				return
			}
			stats := exe.Stats()
			if stats.Rerecords != 0 || stats.PatchedNodes != 5*4 {
				t.Errorf("re-records %d, patched nodes %d; want 0 and 20", stats.Rerecords, stats.PatchedNodes)
			}
			// traced-const and traced-self: template, nothing re-captured.
			// traced-xor: not patchable, captured once per address set.
			if want := int64(3*2 + 1); stats.TracesCaptured != want {
				t.Errorf("%d traces captured, want %d", stats.TracesCaptured, want)
			}
			for _, info := range exe.Traces() {
				xor := strings.Contains(info.Command, "traced-xor")
				if info.Patchable == xor {
					t.Errorf("%s: patchable=%v (reason %q)", info.Command, info.Patchable, info.Reason)
				}
				if xor && !strings.Contains(info.Reason, "do not point into an operand") {
					t.Errorf("%s: reason %q", info.Command, info.Reason)
				}
			}
		})
	}
}

// persistentAddresses reports whether exe ran its last step on persistent
// copies of its params and outputs (under auto, while it probes, the
// candidate that ran it).
func persistentAddresses(exe *stablegraph.Executable) bool {
	st := exe.Stats().Ran
	return st == stablegraph.StrategyStable || st == stablegraph.StrategyPool || st == stablegraph.StrategyRemap
}

// TestRefusedUpdatesFallBack makes the driver refuse a whole-graph update,
// a node update and a copy node update, and checks that the step still
// runs, by re-recording, and that Stats says why: the refusal counted by
// its reason, the last one in full, and the full error in the debug log.
// Patch records the MLP's copy and memset over bound buffers as kernels,
// so it makes no copy or memset node update to refuse (never).
func TestRefusedUpdatesFallBack(t *testing.T) {
	refused := &gpu.UpdateError{Op: "injected", Result: gpu.UpdateNotSupported, Detail: "the test refused it"}
	for _, c := range []struct {
		st    stablegraph.Strategy
		op    string
		never bool
	}{
		{stablegraph.StrategyUpdate, "GraphExecUpdate", false},
		{stablegraph.StrategyPatch, "GraphExecKernelNodeSetParams", false},
		{stablegraph.StrategyPatch, "GraphExecMemsetNodeSetParams", true},
		{stablegraph.StrategyPatch, "GraphExecMemcpyNodeSetParams", true},
		{stablegraph.StrategyStable, "GraphExecMemcpyNodeSetParams", false},
		{stablegraph.StrategyPool, "GraphExecMemcpyNodeSetParams", false},
	} {
		t.Run(string(c.st)+"/"+c.op, func(t *testing.T) {
			b := simtest.New(t, 1)
			w := steptest.NewMLP(2, 16, 2, 50, 3)
			// Random: a pool slot's copy nodes move too.
			want, _ := steptest.RunMLP(t, b, w, stablegraph.StrategyEager, steptest.Random, 4)
			var log bytes.Buffer
			b.InjectFault(c.op, 0, refused)
			got := runMLPLogged(t, b, w, c.st, steptest.Random, 4, &log)
			for i := range got {
				for k := range got[i].Outs {
					if string(got[i].Outs[k]) != string(want[i].Outs[k]) {
						t.Fatalf("step %d output %d differs from eager", i, k)
					}
				}
			}
			final := got[len(got)-1].Stats
			if c.never {
				if final.UpdateFallbacks != 0 || final.Rerecords != 0 || final.PatchedNodes == 0 {
					t.Errorf("fallbacks %d, re-records %d, patched nodes %d; want a step with no %s to refuse",
						final.UpdateFallbacks, final.Rerecords, final.PatchedNodes, c.op)
				}
				return
			}
			if final.UpdateFallbacks != 1 || final.Rerecords != 1 {
				t.Errorf("fallbacks %d, re-records %d; want 1 and 1", final.UpdateFallbacks, final.Rerecords)
			}
			if n := final.Fallbacks.ByReason["not supported"]; n != 1 || len(final.Fallbacks.ByReason) != 1 {
				t.Errorf("fallbacks by reason %v, want one \"not supported\"", final.Fallbacks.ByReason)
			}
			if !strings.Contains(final.Fallbacks.Last, "the test refused it") {
				t.Errorf("last fallback %q does not give the refusal in full", final.Fallbacks.Last)
			}
			if !strings.Contains(log.String(), "refused; re-recording") || !strings.Contains(log.String(), "the test refused it") {
				t.Errorf("debug log does not give the refusal:\n%s", log.String())
			}
		})
	}
}

// runMLPLogged is steptest.RunMLP with the executable's debug logs in log.
func runMLPLogged(t *testing.T, b gpu.Backend, w *steptest.MLP, st stablegraph.Strategy, move steptest.Movement, steps int, log *bytes.Buffer) []steptest.Step {
	t.Helper()
	s := simtest.Stream(t, b, 0)
	ad := steptest.NewMLPAddresser(t, b, w, move)
	logger := slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	exe := steptest.Compile(t, b, w.P, stablegraph.Options{Strategy: st, Logger: logger})
	w.InitStates(t, exe)
	res := steptest.Run(t, exe, s, ad, steps, w.Outputs, nil)
	if err := b.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
	return res
}

// TestRerecordsExplained: every re-record is counted under its cause
// (Rerecords = MoveRerecords + UpdateFallbacks + RetryRerecords): record
// re-records at every move; a step whose patch failed (not refused) leaves
// no graph and the next records it again; stable re-records when a state
// is rebound; and on the chain workload under auto, whatever moves, every
// step's re-records are explained.
func TestRerecordsExplained(t *testing.T) {
	explained := func(t *testing.T, what string, c stablegraph.Counters) {
		t.Helper()
		if c.Rerecords != c.MoveRerecords+c.UpdateFallbacks+c.RetryRerecords {
			t.Fatalf("%s: %d re-records, %d explained by moves, %d by refusals, %d by retries",
				what, c.Rerecords, c.MoveRerecords, c.UpdateFallbacks, c.RetryRerecords)
		}
	}
	t.Run("record", func(t *testing.T) {
		b := simtest.New(t, 1)
		w := steptest.NewMLP(2, 16, 2, 50, 3)
		got, _ := steptest.RunMLP(t, b, w, stablegraph.StrategyRecord, steptest.PingPong, 5)
		final := got[len(got)-1].Stats
		if final.MoveRerecords != 4 || final.Rerecords != 4 {
			t.Errorf("record, ping-pong, 5 steps: %d re-records, %d for moves; want 4 and 4", final.Rerecords, final.MoveRerecords)
		}
		explained(t, "record", final.Counters)
	})
	t.Run("retry", func(t *testing.T) {
		ctx := context.Background()
		b := simtest.New(t, 1)
		s := simtest.Stream(t, b, 0)
		w := steptest.NewMLP(2, 16, 2, 50, 3)
		ad := steptest.NewMLPAddresser(t, b, w, steptest.PingPong)
		exe := steptest.Compile(t, b, w.P, stablegraph.Options{Strategy: stablegraph.StrategyPatch})
		w.InitStates(t, exe)
		for i := range 4 {
			bind, err := ad.Bind(i)
			if err != nil {
				t.Fatal(err)
			}
			if i == 1 {
				b.InjectFault("GraphExecKernelNodeSetParams", 0, nil) // a failure, not a refusal
				if _, err := exe.Run(ctx, s, bind); !errors.Is(err, gpu.ErrInjected) {
					t.Fatalf("step 1: %v, want the injected failure", err)
				}
			}
			if _, err := exe.Run(ctx, s, bind); err != nil {
				t.Fatal(err)
			}
			if err := b.StreamSynchronize(s); err != nil {
				t.Fatal(err)
			}
		}
		st := exe.Stats()
		if st.RetryRerecords != 1 || st.Rerecords != 1 || st.UpdateFallbacks != 0 {
			t.Errorf("after a failed patch: %d re-records, %d retries, %d fallbacks; want 1, 1, 0", st.Rerecords, st.RetryRerecords, st.UpdateFallbacks)
		}
		explained(t, "patch after a failed step", st.Counters)
	})
	t.Run("state-rebound", func(t *testing.T) {
		var want []float32 // eager's y after the rebound
		for _, strategy := range []stablegraph.Strategy{stablegraph.StrategyEager, stablegraph.StrategyStable, stablegraph.StrategyPool, stablegraph.StrategyDevice} {
			ctx := context.Background()
			b := simtest.New(t, 1)
			s := simtest.Stream(t, b, 0)
			w := steptest.NewMLP(2, 16, 2, 50, 3)
			ad := steptest.NewMLPAddresser(t, b, w, steptest.Fixed)
			exe := steptest.Compile(t, b, w.P, stablegraph.Options{Strategy: strategy, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: 1}}})
			w.InitStates(t, exe)
			for i := range 3 {
				if i == 2 {
					if err := exe.BindState(ctx, w.Acc, simtest.Alloc(t, b, 0, uint64(w.Acc.Size()))); err != nil {
						t.Fatal(err)
					}
				}
				bind, err := ad.Bind(i)
				if err != nil {
					t.Fatal(err)
				}
				outs, err := exe.Run(ctx, s, bind)
				if err != nil {
					t.Fatal(err)
				}
				if err := b.StreamSynchronize(s); err != nil {
					t.Fatal(err)
				}
				if i == 2 {
					got := simtest.Download(t, b, outs.Addr(w.Y), int(w.Y.Size()/4))
					if want == nil {
						want = got
					} else if !slices.Equal(got, want) {
						t.Errorf("%s, a state rebound: y differs from eager's", strategy)
					}
				}
				outs.Release()
			}
			if strategy == stablegraph.StrategyEager {
				continue
			}
			if st := exe.Stats(); st.MoveRerecords != 1 || st.Rerecords != 1 {
				t.Errorf("%s, a state rebound: %d re-records, %d for moves; want 1 and 1", strategy, st.Rerecords, st.MoveRerecords)
			}
		}
	})
	t.Run("auto-chain", func(t *testing.T) {
		for _, pattern := range []workload.Pattern{workload.Fixed, workload.PingPong, workload.Random} {
			b := simtest.New(t, 1)
			w := steptest.MustWorkload(t, "chain", workload.Config{K: 20, N: 64})
			r := steptest.RunWorkload(t, b, w, stablegraph.Options{Strategy: stablegraph.StrategyAuto}, pattern, 24, false)
			for i, st := range r.Steps {
				explained(t, fmt.Sprintf("auto on chain, %s, step %d (ran %s)", pattern, i, st.Stats.Ran), st.Stats.Last)
			}
			explained(t, "auto on chain, "+string(pattern), r.Steps[len(r.Steps)-1].Stats.Counters)
		}
	})
}

// TestConcurrentRuns runs one executable from several goroutines on their
// own streams and buffers; every result must be the one eager computes.
func TestConcurrentRuns(t *testing.T) {
	b := simtest.New(t, 1)
	const batch, width, workers, steps = 2, 8, 4, 25
	p := stablegraph.NewProgram("concurrent")
	x := p.Param("x", 4*batch*width)
	w := p.Constant("w", gpu.F32ToBytes(steptest.RandF32(steptest.NewRand(3), width*width, 0.5)))
	h := p.Temp("h", 4*batch*width)
	y := p.Output("y", 4*batch*width)
	p.Gemm(h.All(), x.All(), w.All(), stablegraph.GEMM{M: batch, N: width, K: width, Alpha: 1})
	p.Launch(kernels.Tanh, kernels.Elementwise(batch*width), stablegraph.Out(y.All()), stablegraph.In(h.All()), stablegraph.I32(batch*width))
	exe := steptest.Workers{
		Program: p, X: x, Y: y,
		Input: func(i int) []byte {
			return gpu.F32ToBytes(steptest.RandF32(steptest.NewRand(uint64(i)), batch*width, 1))
		},
		Options: stablegraph.Options{Strategy: stablegraph.StrategyPatch},
		Workers: workers, Steps: steps,
	}.Run(t, b)
	if st := exe.Stats(); st.Steps != workers*steps || st.Rerecords != 0 {
		t.Errorf("steps %d, re-records %d", st.Steps, st.Rerecords)
	}
}

// TestShadowOutOfMemory: when differential tracing cannot allocate its
// shadow operands, the GEMM is not patchable but the steps still run and
// match, the GEMM being re-traced (through the cache) when it moves.
func TestShadowOutOfMemory(t *testing.T) {
	b := simtest.New(t, 1)
	w := steptest.NewMLP(2, 8, 1, 8, 2)
	want, _ := steptest.RunMLP(t, b, w, stablegraph.StrategyEager, steptest.PingPong, 4)
	// runMLP allocates its arena, then Compile its memory; the next
	// MemAlloc is the GEMMs' workspace (at the first trace), the one after
	// it the shadow.
	before := b.Calls("MemAlloc")
	exe, err := stablegraph.Compile(context.Background(), b, w.P, stablegraph.Options{})
	if err != nil {
		t.Fatal(err)
	}
	compileAllocs := b.Calls("MemAlloc") - before
	if err := exe.Close(); err != nil {
		t.Fatal(err)
	}
	b.InjectFault("MemAlloc", 2+compileAllocs, gpu.ErrOutOfMemory)
	got, _ := steptest.RunMLP(t, b, w, stablegraph.StrategyPatch, steptest.PingPong, 4)
	b.ClearFaults()
	for i := range got {
		for k := range got[i].Outs {
			if string(got[i].Outs[k]) != string(want[i].Outs[k]) {
				t.Fatalf("step %d output %d differs from eager", i, k)
			}
		}
	}
	final := got[len(got)-1].Stats
	// One capture at step 0, one at the first move; then cache hits.
	if final.TracesCaptured != 2 || final.TracesSynthesized != 0 || final.Rerecords != 0 {
		t.Errorf("captured %d, synthesized %d, re-records %d; want 2, 0, 0", final.TracesCaptured, final.TracesSynthesized, final.Rerecords)
	}
}

// TestPatchSteadyStatePingPong is the acceptance check for patch node by
// node: once both address sets have been seen, a step re-records nothing,
// captures nothing, misses no trace, and only patches nodes. Most of this
// small graph's nodes move, where the default costs would take whole-graph
// updates at some steps (TestPatchDefaultCostsChooseWhole): the costs here
// price node updates below them.
func TestPatchSteadyStatePingPong(t *testing.T) {
	w := steptest.NewMLP(4, 16, 3, 64, 8)
	res, _ := runMLPWith(t, w, stablegraph.Options{Strategy: stablegraph.StrategyPatch, Costs: stablegraph.Costs{NodeUpdateUS: 0.01}}, steptest.PingPong, 20)
	warm, final := res[1].Stats, res[len(res)-1].Stats
	d := final.Counters.Sub(warm.Counters)
	if d.Records != 0 || d.Rerecords != 0 || d.GraphUpdates != 0 || d.TracesCaptured != 0 ||
		d.TracesSynthesized != 0 || d.TraceCacheMisses != 0 || d.UpdateFallbacks != 0 {
		t.Errorf("steady state did more than patch: %+v", d)
	}
	// Per step: the first GEMM (reads x; its one kernel node, flattened
	// and moved by its template: no trace looked up), the chain's first
	// kernel (reads x2) and last (writes z), the axpy reading z, the memcpy
	// (y, ycopy), the last bias_tanh (writes y), the memset and axpy on m.
	if want := int64(8 * (len(res) - 2)); d.PatchedNodes != want || d.TraceCacheHits != 0 {
		t.Errorf("patched %d nodes with %d cache hits over %d steps; want %d and 0", d.PatchedNodes, d.TraceCacheHits, len(res)-2, want)
	}
	for _, info := range mustTraces(t, simtest.New(t, 1), w) {
		if !info.Patchable || !info.Flattened {
			t.Errorf("%s on sim: patchable %v (%s), flattened %v (%s)", info.Command, info.Patchable, info.Reason, info.Flattened, info.NotFlatReason)
		}
	}
}

func mustTraces(t *testing.T, b gpu.Backend, w *steptest.MLP) []stablegraph.TraceInfo {
	t.Helper()
	ctx := context.Background()
	exe, err := stablegraph.Compile(ctx, b, w.P, stablegraph.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	s := simtest.Stream(t, b, 0)
	bind := stablegraph.Bindings{}
	for _, buf := range append(append([]stablegraph.Buffer(nil), w.Params...), w.Outputs...) {
		bind[buf] = simtest.Alloc(t, b, 0, uint64(buf.Size()))
	}
	if _, err := exe.Run(ctx, s, bind); err != nil {
		t.Fatal(err)
	}
	infos := exe.Traces()
	if len(infos) != w.Layers {
		t.Fatalf("%d traced commands, want %d GEMMs", len(infos), w.Layers)
	}
	return infos
}
