package stablegraph_test

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/bfc"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/workload"
)

// newSim opens a one-device sim backend and, at cleanup, checks that every
// handle the test made was released before closing it.
func newSim(t testing.TB) *sim.Backend {
	t.Helper()
	b, err := sim.New(gpu.Config{Devices: 1, DeviceMemory: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if live := b.LiveHandles(); !live.IsZero() {
			t.Errorf("handles live at the end of the test: %s", live)
		}
		if err := b.Close(); err != nil {
			t.Errorf("close sim: %v", err)
		}
	})
	return b
}

func newStream(t testing.TB, b gpu.Backend) gpu.Stream {
	t.Helper()
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.StreamDestroy(s); err != nil {
			t.Errorf("destroy stream: %v", err)
		}
	})
	return s
}

// newArena gives the test a bfc allocator over one device allocation, as a
// framework's caching allocator would, so buffers move realistically.
func newArena(t testing.TB, b gpu.Backend, size uint64) *bfc.Allocator {
	t.Helper()
	base, err := b.MemAlloc(0, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.MemFree(base); err != nil {
			t.Errorf("free arena: %v", err)
		}
	})
	a, err := bfc.New(base, size, bfc.Options{Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func f32Bytes(v []float32) []byte { return gpu.F32ToBytes(v) }

func randF32(r *rand.Rand, n int, scale float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = (r.Float32()*2 - 1) * scale
	}
	return v
}

func u64s(b []byte) []uint64 {
	v := make([]uint64, len(b)/8)
	for i := range v {
		v[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return v
}

// mlp is the test workload: an MLP (gemm + bias_tanh per layer) over param
// x into output y, a chain of K small kernels over param x2 into output z,
// a state acc that accumulates z every step, an output m written by a
// memset then an axpy, and an output ycopy copied from y by a memcpy.
type mlp struct {
	p                     *stablegraph.Program
	batch, width, layers  int
	n, k                  int
	x, x2                 stablegraph.Buffer
	y, z, m, ycopy        stablegraph.Buffer
	acc                   stablegraph.Buffer
	weights               []stablegraph.Buffer
	params, outputs       []stablegraph.Buffer
	biasData, weightsData [][]float32
}

func newMLP(batch, width, layers, n, k int) *mlp {
	w := &mlp{batch: batch, width: width, layers: layers, n: n, k: k}
	p := stablegraph.NewProgram("mlp")
	w.p = p
	r := rand.New(rand.NewPCG(1, 2))
	act := int64(4 * batch * width)
	w.x = p.Param("x", act)
	w.x2 = p.Param("x2", int64(4*n))
	w.y = p.Output("y", act)
	w.z = p.Output("z", int64(4*n))
	w.m = p.Output("m", int64(4*n))
	w.ycopy = p.Output("ycopy", act)
	w.acc = p.State("acc", int64(4*n))
	in := w.x
	for l := 0; l < layers; l++ {
		wt := p.State("w"+string(rune('0'+l)), int64(4*width*width))
		w.weights = append(w.weights, wt)
		w.weightsData = append(w.weightsData, randF32(r, width*width, 1/float32(math.Sqrt(float64(width)))))
		bias := randF32(r, width, 0.1)
		w.biasData = append(w.biasData, bias)
		bb := p.Constant("b"+string(rune('0'+l)), f32Bytes(bias))
		h := p.Temp("h"+string(rune('0'+l)), act)
		p.Gemm(h.All(), in.All(), wt.All(), stablegraph.GEMM{M: batch, N: width, K: width, Alpha: 1})
		out := w.y
		if l < layers-1 {
			out = p.Temp("a"+string(rune('0'+l)), act)
		}
		p.Launch(kernels.BiasTanh, kernels.Elementwise(batch*width),
			stablegraph.Out(out.All()), stablegraph.In(h.All()), stablegraph.In(bb.All()),
			stablegraph.I32(int32(batch)), stablegraph.I32(int32(width)))
		in = out
	}
	p.Memcpy(w.ycopy.All(), w.y.All())
	// The chain: t0 = axpb(x2), t_i = axpb(t_{i-1}), z = axpb(t_{k-2}).
	prev := w.x2
	for i := 0; i < k; i++ {
		out := w.z
		if i < k-1 {
			out = p.Temp("t"+string(rune('a'+i)), int64(4*n))
		}
		p.Launch(kernels.Axpb, kernels.Elementwise(n), stablegraph.Out(out.All()), stablegraph.In(prev.All()),
			stablegraph.F32(0.9+float32(i)/100), stablegraph.F32(0.01*float32(i)), stablegraph.I32(int32(n)))
		prev = out
	}
	p.Launch(kernels.Axpy, kernels.Elementwise(n), stablegraph.InOut(w.acc.All()), stablegraph.In(w.z.All()),
		stablegraph.F32(0.5), stablegraph.I32(int32(n)))
	p.Memset(w.m.All(), math.Float32bits(1), 4)
	p.Launch(kernels.Axpy, kernels.Elementwise(n), stablegraph.InOut(w.m.All()), stablegraph.In(w.acc.All()),
		stablegraph.F32(2), stablegraph.I32(int32(n)))
	w.params = []stablegraph.Buffer{w.x, w.x2}
	w.outputs = []stablegraph.Buffer{w.y, w.z, w.m, w.ycopy}
	return w
}

// initStates writes the weights.
func (w *mlp) initStates(t testing.TB, exe *stablegraph.Executable) {
	t.Helper()
	for l, wt := range w.weights {
		if err := exe.WriteBuffer(context.Background(), wt, f32Bytes(w.weightsData[l])); err != nil {
			t.Fatal(err)
		}
	}
}

// inputs returns step's param contents.
func (w *mlp) inputs(step int) map[stablegraph.Buffer][]byte {
	r := rand.New(rand.NewPCG(uint64(step), 99))
	return map[stablegraph.Buffer][]byte{
		w.x:  f32Bytes(randF32(r, w.batch*w.width, 1)),
		w.x2: f32Bytes(randF32(r, w.n, 1)),
	}
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 5)) }

// mustAlloc allocates device memory freed at cleanup.
func mustAlloc(t testing.TB, b gpu.Backend, size uint64) gpu.DevicePtr {
	t.Helper()
	p, err := b.MemAlloc(0, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.MemFree(p); err != nil {
			t.Errorf("free: %v", err)
		}
	})
	return p
}

// startWorkload compiles w with opts, initialises its states and makes a
// caller whose buffers move by pattern. done closes the executable, then
// the caller, reporting failures; call it before the test's own checks of
// live handles.
func startWorkload(t testing.TB, b gpu.Backend, w *workload.Workload, opts stablegraph.Options, pattern workload.Pattern) (exe *stablegraph.Executable, caller *workload.Caller, done func()) {
	t.Helper()
	ctx := context.Background()
	caller, err := workload.NewCaller(b, 0, w, pattern, 1)
	if err != nil {
		t.Fatal(err)
	}
	exe, err = stablegraph.Compile(ctx, b, w.Program, opts)
	if err != nil {
		if cerr := caller.Close(); cerr != nil {
			t.Error(cerr)
		}
		t.Fatal(err)
	}
	done = func() {
		if err := exe.Close(); err != nil {
			t.Error(err)
		}
		if err := caller.Close(); err != nil {
			t.Error(err)
		}
	}
	for _, st := range w.States {
		if err := exe.WriteBuffer(ctx, st.Buffer, st.Data); err != nil {
			done()
			t.Fatal(err)
		}
	}
	return exe, caller, done
}
