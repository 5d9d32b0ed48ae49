package stablegraph_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

// TestPatchSteadyStatePingPong is the acceptance check for patch: once both
// address sets have been seen, a step re-records nothing, captures nothing,
// misses no trace, and only patches nodes.
func TestPatchSteadyStatePingPong(t *testing.T) {
	b := newSim(t)
	w := newMLP(4, 16, 3, 64, 8)
	res, _ := runMLP(t, b, w, stablegraph.StrategyPatch, pingpong, 20)
	warm, final := res[1].stats, res[len(res)-1].stats
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
	for _, info := range mustTraces(t, b, w) {
		if !info.Patchable || !info.Flattened {
			t.Errorf("%s on sim: patchable %v (%s), flattened %v (%s)", info.Command, info.Patchable, info.Reason, info.Flattened, info.NotFlatReason)
		}
	}
}

func mustTraces(t *testing.T, b gpu.Backend, w *mlp) []stablegraph.TraceInfo {
	t.Helper()
	ctx := context.Background()
	exe, err := stablegraph.Compile(ctx, b, w.p, stablegraph.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	s := newStream(t, b)
	bind := stablegraph.Bindings{}
	for _, buf := range append(append([]stablegraph.Buffer(nil), w.params...), w.outputs...) {
		bind[buf] = mustAlloc(t, b, uint64(buf.Size()))
	}
	if _, err := exe.Run(ctx, s, bind); err != nil {
		t.Fatal(err)
	}
	infos := exe.Traces()
	if len(infos) != w.layers {
		t.Fatalf("%d traced commands, want %d GEMMs", len(infos), w.layers)
	}
	return infos
}

func TestBindingErrors(t *testing.T) {
	ctx := context.Background()
	b := newSim(t)
	s := newStream(t, b)
	w := newMLP(2, 8, 1, 8, 2)
	exe, err := stablegraph.Compile(ctx, b, w.p, stablegraph.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	good := stablegraph.Bindings{}
	for _, buf := range append(append([]stablegraph.Buffer(nil), w.params...), w.outputs...) {
		good[buf] = mustAlloc(t, b, uint64(buf.Size()))
	}
	alien := stablegraph.NewProgram("other").Param("x", 4)
	late := w.p.Param("declared-after-compile", 4)
	for name, mutate := range map[string]func(stablegraph.Bindings){
		"missing param":   func(bb stablegraph.Bindings) { delete(bb, w.x) },
		"missing output":  func(bb stablegraph.Bindings) { delete(bb, w.z) },
		"null address":    func(bb stablegraph.Bindings) { bb[w.x2] = 0 },
		"state bound":     func(bb stablegraph.Bindings) { bb[w.acc] = good[w.x] },
		"other program":   func(bb stablegraph.Bindings) { bb[alien] = good[w.x] },
		"zero buffer key": func(bb stablegraph.Bindings) { bb[stablegraph.Buffer{}] = good[w.x] },
		"late buffer":     func(bb stablegraph.Bindings) { bb[late] = good[w.x] },
	} {
		bb := maps(good)
		mutate(bb)
		if _, err := exe.Run(ctx, s, bb); !errors.Is(err, stablegraph.ErrInvalidBinding) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	if st := exe.Stats(); st.Steps != 0 || st.Records != 0 {
		t.Errorf("rejected bindings did work: %+v", st)
	}
	if _, err := exe.Run(ctx, s, good); err != nil {
		t.Fatal(err)
	}
	if _, err := exe.ReadBuffer(ctx, w.x); !errors.Is(err, stablegraph.ErrInvalidBinding) {
		t.Errorf("ReadBuffer of a param: %v", err)
	}
	if err := exe.WriteBuffer(ctx, w.acc, []byte{1}); !errors.Is(err, stablegraph.ErrInvalidBinding) {
		t.Errorf("WriteBuffer of the wrong size: %v", err)
	}
	if _, err := exe.ReadOutput(ctx, stablegraph.Outputs{}, w.y); !errors.Is(err, stablegraph.ErrInvalidBinding) {
		t.Errorf("ReadOutput of an output not given: %v", err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := exe.Run(canceled, s, good); !errors.Is(err, context.Canceled) {
		t.Errorf("Run with a canceled context: %v", err)
	}
	if err := exe.Close(); err != nil {
		t.Fatal(err)
	}
	if err := exe.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := exe.Run(ctx, s, good); !errors.Is(err, stablegraph.ErrClosed) {
		t.Errorf("Run after Close: %v", err)
	}
	if _, err := exe.ReadBuffer(ctx, w.acc); !errors.Is(err, stablegraph.ErrClosed) {
		t.Errorf("ReadBuffer after Close: %v", err)
	}
}

// TestBindState moves a state into caller memory between steps: every
// strategy must follow it, and the result must equal eager's.
func TestBindState(t *testing.T) {
	ctx := context.Background()
	const n = 16
	run := func(st stablegraph.Strategy) []float32 {
		b := newSim(t)
		s := newStream(t, b)
		p := stablegraph.NewProgram("bind-state")
		x := p.Param("x", 4*n)
		acc := p.State("acc", 4*n)
		y := p.Output("y", 4*n)
		p.Launch(kernels.Axpy, kernels.Elementwise(n), stablegraph.InOut(acc.All()), stablegraph.In(x.All()), stablegraph.F32(1), stablegraph.I32(n))
		p.Launch(kernels.Copy, kernels.Elementwise(n), stablegraph.Out(y.All()), stablegraph.In(acc.All()), stablegraph.I32(n))
		exe, err := stablegraph.Compile(ctx, b, p, stablegraph.Options{Strategy: st})
		if err != nil {
			t.Fatal(err)
		}
		defer exe.Close()
		xp, yp := mustAlloc(t, b, 4*n), mustAlloc(t, b, 4*n)
		ones := make([]float32, n)
		for i := range ones {
			ones[i] = 1
		}
		if err := b.MemcpyHtoD(xp, f32Bytes(ones)); err != nil {
			t.Fatal(err)
		}
		for step := range 4 {
			if step == 2 {
				// The caller's state memory starts at 10.
				mine := mustAlloc(t, b, 4*n)
				ten := make([]float32, n)
				for i := range ten {
					ten[i] = 10
				}
				if err := b.MemcpyHtoD(mine, f32Bytes(ten)); err != nil {
					t.Fatal(err)
				}
				if err := exe.BindState(ctx, acc, mine); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := exe.Run(ctx, s, stablegraph.Bindings{x: xp, y: yp}); err != nil {
				t.Fatal(err)
			}
		}
		got, err := exe.ReadBuffer(ctx, acc)
		if err != nil {
			t.Fatal(err)
		}
		if err := exe.Close(); err != nil {
			t.Fatal(err)
		}
		return gpu.BytesToF32(got)
	}
	for _, st := range stablegraph.Strategies() {
		if got := run(st); got[0] != 12 || got[n-1] != 12 {
			t.Errorf("%s: acc = %v, want 12 everywhere", st, got)
		}
	}
}

func TestTempSharing(t *testing.T) {
	ctx := context.Background()
	b := newSim(t)
	w := newMLP(4, 16, 3, 64, 8)
	shared, err := stablegraph.Compile(ctx, b, w.p, stablegraph.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Close()
	alone, err := stablegraph.Compile(ctx, b, w.p, stablegraph.Options{NoTempSharing: true})
	if err != nil {
		t.Fatal(err)
	}
	defer alone.Close()
	ms, ma := shared.Memory(), alone.Memory()
	// The MLP's temps: h0 a0 h1 a1 h2 (256 B each) and a chain of 7
	// (256 B each); each lives from its writer to its reader, so at most
	// two are live at once.
	if ms.TempsUnshared != 12*256 || ma.Temps != ma.TempsUnshared || ms.Temps != 2*256 {
		t.Errorf("shared %+v, unshared %+v", ms, ma)
	}
	if ms.States != 3*1024+256 || ms.Constants != 3*256 {
		t.Errorf("states %d, constants %d", ms.States, ms.Constants)
	}
}

func TestOptions(t *testing.T) {
	for _, s := range stablegraph.Strategies() {
		if got, err := stablegraph.ParseStrategy(string(s)); err != nil || got != s {
			t.Errorf("ParseStrategy(%q) = %q, %v", s, got, err)
		}
	}
	if _, err := stablegraph.ParseStrategy("stable-ish"); err == nil {
		t.Error("ParseStrategy accepted an unknown name")
	}
	b := newSim(t)
	w := newMLP(2, 8, 1, 8, 2)
	for _, o := range []stablegraph.Options{
		{Strategy: "nope"}, {Alignment: 24}, {TraceCacheSize: -1}, {Device: 3},
	} {
		if exe, err := stablegraph.Compile(context.Background(), b, w.p, o); err == nil {
			exe.Close()
			t.Errorf("Compile accepted %+v", o)
		}
	}
	exe, err := stablegraph.Compile(context.Background(), b, w.p, stablegraph.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	if exe.Strategy() != stablegraph.StrategyPatch {
		t.Errorf("default strategy %s", exe.Strategy())
	}
}

// BenchmarkStep measures one step of the MLP workload per strategy on sim,
// with params and outputs ping-ponging: host time of Run plus the sim's
// execution, synchronised every step.
func BenchmarkStep(b *testing.B) {
	for _, st := range stablegraph.Strategies() {
		b.Run(fmt.Sprint(st), func(b *testing.B) {
			ctx := context.Background()
			be := newSim(b)
			s := newStream(b, be)
			w := newMLP(8, 64, 4, 256, 16)
			exe, err := stablegraph.Compile(ctx, be, w.p, stablegraph.Options{Strategy: st})
			if err != nil {
				b.Fatal(err)
			}
			defer exe.Close()
			var sets [2]stablegraph.Bindings
			for i := range sets {
				sets[i] = stablegraph.Bindings{}
				for _, buf := range append(append([]stablegraph.Buffer(nil), w.params...), w.outputs...) {
					sets[i][buf] = mustAlloc(b, be, uint64(buf.Size()))
				}
			}
			for i := 0; b.Loop(); i++ {
				if _, err := exe.Run(ctx, s, sets[i%2]); err != nil {
					b.Fatal(err)
				}
				if err := be.StreamSynchronize(s); err != nil {
					b.Fatal(err)
				}
			}
			st := exe.Stats()
			b.ReportMetric(float64(st.Rerecords)/float64(st.Steps), "rerecords/step")
			b.ReportMetric(float64(st.PatchedNodes)/float64(st.Steps), "patched/step")
		})
	}
}
