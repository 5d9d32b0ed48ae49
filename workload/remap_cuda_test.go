package workload

import (
	"context"
	"errors"
	"testing"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/remappable"
)

// The remap strategy on a GPU: it skips, saying why, where the CUDA
// backend does not open (CI). On the GPU machine (docs/GPU-TESTING.md):
//
//	scripts/gpu-test build ./workload
//	scripts/gpu-test run -test.run 'Remap.*CUDA'

// TestRemapCUDA runs the mlp workload under remap with fresh addresses
// every step (random: every buffer a new physical allocation), with
// ping-pong and with fixed buffers: every step's outputs equal eager's bit
// for bit, every bound buffer is remapped every moving step and none on a
// fixed one, and the graph is recorded once. Lines REMAP-CUDA give the
// step times (the bench command is the measurement; these say the path
// ran).
func TestRemapCUDA(t *testing.T) {
	b := openCUDA(t)
	w, err := New("mlp", Config{Layers: 4})
	if err != nil {
		t.Fatal(err)
	}
	const steps, warmup = 20, 2
	bound := int64(len(w.Params) + len(w.Outputs))
	for _, pat := range Patterns() {
		t.Run(string(pat), func(t *testing.T) {
			ctx := context.Background()
			o := RunOptions{Steps: steps, Warmup: warmup, Pattern: pat, WallBatches: -1}
			o.Strategy = sg.StrategyEager
			ref, err := Run(ctx, b, w, o)
			if err != nil {
				t.Fatal(err)
			}
			o.Strategy, o.Reference = sg.StrategyRemap, ref.Digests
			res, err := Run(ctx, b, w, o)
			if err != nil {
				t.Fatal(err)
			}
			if res.Mismatch >= 0 {
				t.Fatalf("remap differs from eager from step %d", res.Mismatch)
			}
			want := bound * steps
			if pat == Fixed {
				want = 0
			}
			if st := res.Stats; st.Remaps != want || st.Records != 0 || st.GraphLaunches != steps || st.BytesCopied != 0 {
				t.Errorf("measured steps: %+v; want %d remaps, no record, one launch a step, nothing copied", st, want)
			}
			t.Logf("REMAP-CUDA %s: step p50 %.1f µs GPU, %.1f µs host (eager %.1f, %.1f)", pat,
				res.Result.StepUS.P50, res.Result.HostUS.P50, ref.Result.StepUS.P50, ref.Result.HostUS.P50)
		})
	}
}

// TestRemapRefusesPlainMemoryCUDA: on CUDA too, memory from cuMemAlloc
// bound to remap is refused with gpu.ErrNotSupported before anything is
// mapped, and the executable then runs on remappable memory.
func TestRemapRefusesPlainMemoryCUDA(t *testing.T) {
	b := openCUDA(t)
	ctx := context.Background()
	w := small(t, "chain")
	a, err := remappable.New(b, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	exe, err := sg.Compile(ctx, b, w.Program, sg.Options{Strategy: sg.StrategyRemap, StrategyOptions: sg.StrategyOptions{Remap: sg.RemapOptions{Memory: a}}})
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.StreamDestroy(s)
	plain, good := sg.Bindings{}, sg.Bindings{}
	for _, buf := range w.buffers() {
		p, err := b.MemAlloc(0, uint64(buf.Size()))
		if err != nil {
			t.Fatal(err)
		}
		defer b.MemFree(p)
		plain[buf] = p
		if good[buf], err = a.Alloc(uint64(buf.Size())); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := exe.Run(ctx, s, plain); !errors.Is(err, gpu.ErrNotSupported) {
		t.Fatalf("remap of cuMemAlloc memory = %v, want gpu.ErrNotSupported", err)
	}
	if err := b.MemcpyHtoD(good[w.Params[0]], w.Input(0, 0)); err != nil {
		t.Fatal(err)
	}
	outs, err := exe.Run(ctx, s, good)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exe.ReadOutput(ctx, outs, w.Outputs[0]); err != nil {
		t.Fatal(err)
	}
}
