package stablegraph_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/internal/steptest"
	"github.com/stablegraph/stablegraph/kernels"
)

// biasMLP is the mlp workload as PyTorch writes it: per layer one GEMM with
// its bias fused (addmm) and a tanh, over param x into output y.
type biasMLP struct {
	p            *stablegraph.Program
	rows, width  int
	x, y         stablegraph.Buffer
	ws           []stablegraph.Buffer
	wData, bData [][]float32
}

func newBiasMLP(rows, width, layers int) *biasMLP {
	m := &biasMLP{p: stablegraph.NewProgram("mlp-bias"), rows: rows, width: width}
	r := steptest.NewRand(11)
	n := int64(4 * rows * width)
	m.x, m.y = m.p.Param("x", n), m.p.Output("y", n)
	in := m.x
	for l := range layers {
		w := m.p.State(fmt.Sprintf("W%d", l), int64(4*width*width))
		m.ws = append(m.ws, w)
		m.wData = append(m.wData, steptest.RandF32(r, width*width, 1/float32(math.Sqrt(float64(width)))))
		m.bData = append(m.bData, steptest.RandF32(r, width, 0.1))
		b := m.p.Constant(fmt.Sprintf("b%d", l), gpu.F32ToBytes(m.bData[l]))
		h := m.p.Temp(fmt.Sprintf("h%d", l), n)
		m.p.Gemm(h.All(), in.All(), w.All(), stablegraph.GEMM{M: rows, N: width, K: width, Alpha: 1, Bias: b.All()})
		out := m.y
		if l < layers-1 {
			out = m.p.Temp(fmt.Sprintf("a%d", l), n)
		}
		m.p.Launch(kernels.Tanh, kernels.Elementwise(rows*width), stablegraph.Out(out.All()), stablegraph.In(h.All()),
			stablegraph.I32(int32(rows*width)))
		in = out
	}
	return m
}

// ref is the step's output in float64.
func (m *biasMLP) ref(x []float32) []float64 {
	h := make([]float64, len(x))
	for i, v := range x {
		h[i] = float64(v)
	}
	for l := range m.ws {
		next := make([]float64, len(h))
		for i := range m.rows {
			for j := range m.width {
				s := float64(m.bData[l][j])
				for k := range m.width {
					s += h[i*m.width+k] * float64(m.wData[l][k*m.width+j])
				}
				next[i*m.width+j] = math.Tanh(s)
			}
		}
		h = next
	}
	return h
}

// run runs steps of m under strategy with the movement, fresh inputs each
// step, and returns each step's output and the executable's traces.
func (m *biasMLP) run(t *testing.T, b gpu.Backend, strategy stablegraph.Strategy, move steptest.Movement, steps int) ([][]byte, []stablegraph.Stats, []stablegraph.TraceInfo) {
	t.Helper()
	ctx := context.Background()
	s := simtest.Stream(t, b, 0)
	opts := stablegraph.Options{Strategy: strategy}
	a := steptest.ArenaFor(t, b, 64<<20, &opts)
	exe, err := stablegraph.Compile(ctx, b, m.p, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := exe.Close(); err != nil {
			t.Error(err)
		}
	}()
	for l, w := range m.ws {
		if err := exe.WriteBuffer(ctx, w, gpu.F32ToBytes(m.wData[l])); err != nil {
			t.Fatal(err)
		}
	}
	ad := steptest.NewAddresser(t, b, a, move, []stablegraph.Buffer{m.x, m.y}, nil)
	defer ad.Close()
	var outs [][]byte
	var stats []stablegraph.Stats
	for i := range steps {
		bind := ad.Next(i)
		if err := b.MemcpyHtoD(bind[m.x], gpu.F32ToBytes(steptest.RandF32(steptest.NewRand(uint64(i)), m.rows*m.width, 1))); err != nil {
			t.Fatal(err)
		}
		o, err := exe.Run(ctx, s, bind)
		if err != nil {
			t.Fatalf("%s/%s step %d: %v", strategy, move, i, err)
		}
		data, err := exe.ReadOutput(ctx, o, m.y)
		if err != nil {
			t.Fatal(err)
		}
		outs, stats = append(outs, data), append(stats, exe.Stats())
	}
	return outs, stats, exe.Traces()
}

// TestGemmBiasMatchesEager runs the mlp with its biases fused into the
// GEMMs (a small output with a long K, which sim's library splits as cuBLAS
// splits the mlp layer) under every strategy and movement: every output equals eager's bit
// for bit, eager's equals the float64 forward pass to float32 accuracy,
// and patch, with a new address every step, captures nothing after its
// first step, its GEMMs flattened into the step's graph. Auto runs long
// enough to probe every candidate; the others a few steps past recording.
func TestGemmBiasMatchesEager(t *testing.T) {
	const steps, autoSteps = 5, 16
	m := newBiasMLP(8, 128, 2)
	for _, move := range steptest.Movements() {
		t.Run(string(move), func(t *testing.T) {
			b := simtest.New(t, 1)
			want, _, _ := m.run(t, b, stablegraph.StrategyEager, move, autoSteps)
			ref := m.ref(steptest.RandF32(steptest.NewRand(0), m.rows*m.width, 1))
			var num, den float64
			for i, v := range gpu.BytesToF32(want[0]) {
				num += (float64(v) - ref[i]) * (float64(v) - ref[i])
				den += ref[i] * ref[i]
			}
			if e := math.Sqrt(num / den); e > 1e-5 || math.IsNaN(e) {
				t.Fatalf("eager against the float64 forward pass: relative error %.3g", e)
			}
			for _, st := range stablegraph.Strategies()[1:] {
				t.Run(string(st), func(t *testing.T) {
					n := steps
					if st == stablegraph.StrategyAuto {
						n = autoSteps
					}
					got, stats, traces := m.run(t, b, st, move, n)
					for i := range got {
						if !bytes.Equal(got[i], want[i]) {
							t.Fatalf("step %d differs from eager", i)
						}
					}
					if st != stablegraph.StrategyPatch {
						return
					}
					d := stats[n-1].Counters.Sub(stats[0].Counters)
					if d.TracesCaptured != 0 || d.Rerecords != 0 || d.UpdateFallbacks != 0 {
						t.Errorf("patch after its first step: %d captured, %d re-records, %d fallbacks", d.TracesCaptured, d.Rerecords, d.UpdateFallbacks)
					}
					for _, info := range traces {
						if !info.Patchable || !info.Flattened {
							t.Errorf("%s: patchable %v (%s), flattened %v (%s)", info.Command, info.Patchable, info.Reason, info.Flattened, info.NotFlatReason)
						}
					}
				})
			}
		})
	}
}

// TestGemmBiasValidation: a bias too small for N floats, or misaligned, is
// refused at Compile naming the buffer.
func TestGemmBiasValidation(t *testing.T) {
	for _, c := range []struct {
		name string
		bias func(p *stablegraph.Program) stablegraph.Slice
		says string
	}{
		{"too small", func(p *stablegraph.Program) stablegraph.Slice { return p.State("bias", 4*7).All() }, "N=8 float32 need 32"},
		{"misaligned", func(p *stablegraph.Program) stablegraph.Slice { return p.State("bias", 64).Slice(2, 32) }, "not 4-byte aligned"},
		{"out of bounds", func(p *stablegraph.Program) stablegraph.Slice { return p.State("bias", 32).Slice(16, 32) }, "out of bounds"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := stablegraph.NewProgram("gemm")
			x, y := p.Param("x", 4*8*8), p.Output("y", 4*8*8)
			p.Gemm(y.All(), x.All(), x.All(), stablegraph.GEMM{M: 8, N: 8, K: 8, Alpha: 1, Bias: c.bias(p)})
			err := p.Validate()
			var ce *stablegraph.CompileError
			if !errors.Is(err, stablegraph.ErrInvalidProgram) || !errors.As(err, &ce) || ce.Buffer != "bias" || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("Validate = %v, want an error on buffer bias saying %q", err, c.says)
			}
		})
	}
}

// TestRefusedChildGraphUpdateFallsBack: a traced command that cannot be
// flattened (it captures a value write, a node the gpu interface cannot
// read back) stays a child graph; when the driver refuses its update,
// patch re-records, and the outputs stay eager's.
func TestRefusedChildGraphUpdateFallsBack(t *testing.T) {
	ctx := context.Background()
	b := simtest.New(t, 1)
	p := stablegraph.NewProgram("write")
	x, y := p.Param("x", 64), p.Output("y", 64)
	p.Trace("write", func(env *stablegraph.TraceEnv) error {
		f, err := env.Kernel(kernels.Copy)
		if err != nil {
			return err
		}
		if err := env.Backend.LaunchKernel(f, kernels.Elementwise(16), []gpu.Arg{gpu.Ptr(env.Ptrs[1]), gpu.Ptr(env.Ptrs[0]), gpu.I32(16)}, env.Stream); err != nil {
			return err
		}
		ops, err := gpu.StreamMemOpsOf(env.Backend, 0)
		if err != nil {
			return err
		}
		return ops.StreamWriteValue64(env.Stream, env.Ptrs[1].Add(56), 7)
	}, stablegraph.In(x.All()), stablegraph.Out(y.All()))
	exe, err := stablegraph.Compile(ctx, b, p, stablegraph.Options{Strategy: stablegraph.StrategyPatch})
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	s := simtest.Stream(t, b, 0)
	sets := [2]stablegraph.Bindings{{x: simtest.Alloc(t, b, 0, 64), y: simtest.Alloc(t, b, 0, 64)}, {x: simtest.Alloc(t, b, 0, 64), y: simtest.Alloc(t, b, 0, 64)}}
	want := append(gpu.F32ToBytes([]float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}), 7, 0, 0, 0, 0, 0, 0, 0)
	for i := range 4 {
		if i == 2 {
			b.InjectFault("GraphExecChildGraphNodeSetParams", 0, &gpu.UpdateError{Op: "injected", Result: gpu.UpdateNotSupported})
		}
		bind := sets[i%2]
		if err := b.MemcpyHtoD(bind[x], gpu.F32ToBytes([]float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})); err != nil {
			t.Fatal(err)
		}
		o, err := exe.Run(ctx, s, bind)
		if err != nil {
			t.Fatal(err)
		}
		got, err := exe.ReadOutput(ctx, o, y)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("step %d: %v, want %v", i, got, want)
		}
	}
	if st := exe.Stats(); st.UpdateFallbacks != 1 || st.Rerecords != 1 {
		t.Errorf("fallbacks %d, re-records %d; want 1 and 1", st.UpdateFallbacks, st.Rerecords)
	}
	info := exe.Traces()
	if len(info) != 1 || info[0].Flattened || !strings.Contains(info[0].NotFlatReason, "mem-write-value") {
		t.Errorf("traces %+v; want one, not flattened because of its value write", info)
	}
}
