package workload

import (
	"context"
	"math"
	"path/filepath"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	_ "github.com/stablegraph/stablegraph/gpu/cuda"
	"github.com/stablegraph/stablegraph/internal/safetensors"
)

// The gpt2-decode tests on a GPU: they skip, saying why, where the CUDA
// backend does not open (CI). On the GPU machine (docs/GPU-TESTING.md):
//
//	scripts/gpu-test build ./workload
//	scripts/gpu-test run -test.run GPT2.*CUDA

func openCUDA(t *testing.T) gpu.Backend {
	t.Helper()
	b, _, err := gpu.Open("cuda", gpu.Config{})
	if err != nil {
		t.Skipf("no CUDA here: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

// checkLogits runs one eager step of w on b with row r holding sequence r,
// and compares its logits with the float64 forward: max abs difference at
// most tol.
func checkLogits(t *testing.T, b gpu.Backend, w *Workload, tol float64) {
	t.Helper()
	dump := filepath.Join(t.TempDir(), "step.safetensors")
	if _, err := Run(context.Background(), b, w, RunOptions{Steps: 1, Pattern: Fixed, Dump: dump, WallBatches: -1}); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(dump)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lt, err := f.ReadTensor("logits")
	if err != nil {
		t.Fatal(err)
	}
	logits := gpu.BytesToF32(lt.Data)
	m, s := w.gpt2, w.gpt2.shape
	ref := newGPT2Ref(t, w)
	var worst float64
	for r := range s.batch {
		want := ref.logits(int(m.token(0, r)), s.seqPos(r), gpu.BytesToF32(m.initialCache(r)))
		for v, x := range want {
			worst = max(worst, math.Abs(float64(logits[r*s.vocab+v])-x))
		}
	}
	t.Logf("%s on %s: max |logits - float64 reference| = %.3g", w.Desc, b.Name(), worst)
	if !(worst <= tol) {
		t.Errorf("logits differ from the float64 reference by %.3g (tolerance %g)", worst, tol)
	}
}

// TestGPT2DecodeCUDA: the tiny config on the GPU, nine rows (two launches
// of the cache kernels), every strategy bit for bit against eager under
// swap and random, and eager against the float64 forward.
func TestGPT2DecodeCUDA(t *testing.T) {
	b := openCUDA(t)
	w := tinyGPT2(t, Config{Batch: 9})
	checkLogits(t, b, w, 1e-4)
	for _, pat := range []Pattern{Swap, Random} {
		rep, err := Bench(context.Background(), b, w, nil, RunOptions{Steps: 5, Warmup: 1, Pattern: pat, WallBatches: -1})
		if err != nil {
			t.Fatalf("%s: %v", pat, err)
		}
		for _, r := range rep.Results {
			if !r.OutputsMatchEager {
				t.Errorf("%s/%s: outputs differ from eager: %s", pat, r.Strategy, r.Note)
			}
		}
	}
}

// TestGPT2SmallCUDA: GPT-2 small's shape (1024 positions, 12 heads of 64,
// vocab 50257) at batch 2 against the float64 forward. Skipped with
// -short: drawing the weights and the reference take seconds.
func TestGPT2SmallCUDA(t *testing.T) {
	b := openCUDA(t)
	if testing.Short() {
		t.Skip("-short")
	}
	w, err := New("gpt2-decode", Config{Batch: 2})
	if err != nil {
		t.Fatal(err)
	}
	checkLogits(t, b, w, 1e-4)
}
