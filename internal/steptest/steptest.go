// Package steptest holds the helpers shared by the tests that run
// executables step by step (the root package's and package replay's):
// the test program MLP, an Addresser that moves a program's buffers the way
// a caching allocator does, the one loop that runs N steps and records what
// each saw (Run), and the one harness that runs an executable from several
// goroutines against eager (Workers), the check that Compile refuses a
// strategy cleanly (WantCompileRefused) and the one loop that fails each
// of Compile's device calls in turn (CompileFaults). Backend-level helpers live in
// internal/simtest. It is imported by tests only.
package steptest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/bfc"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/remappable"
	"github.com/stablegraph/stablegraph/workload"
)

// NewArena gives the test a bfc allocator over one device allocation of
// device 0, as a framework's caching allocator would, so buffers move
// realistically.
func NewArena(t testing.TB, b gpu.Backend, size uint64) *bfc.Allocator {
	t.Helper()
	base := simtest.Alloc(t, b, 0, size)
	a, err := bfc.New(base, size, bfc.Options{Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Allocator is what an Addresser takes its buffers from: a bfc.Allocator
// over one allocation, or a remappable.Allocator (StrategyRemap).
type Allocator interface {
	Alloc(size uint64) (gpu.DevicePtr, error)
	Free(p gpu.DevicePtr) error
}

// NewRemappable gives the test an allocator of remappable buffers on
// device dev (one VMM allocation each), the memory StrategyRemap maps;
// whatever is left in it is freed at cleanup.
func NewRemappable(t testing.TB, b gpu.Backend, dev int) *remappable.Allocator {
	t.Helper()
	a, err := remappable.New(b, dev, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Close(); err != nil {
			t.Error(err)
		}
	})
	return a
}

// ArenaFor is NewArena for a test under opts.Strategy: for StrategyRemap
// a remappable allocator instead (NewRemappable), set as
// opts.Remap.Memory: the memory remap maps.
func ArenaFor(t testing.TB, b gpu.Backend, size uint64, opts *sg.Options) Allocator {
	t.Helper()
	if opts.Strategy == sg.StrategyRemap {
		a := NewRemappable(t, b, 0)
		opts.Remap.Memory = a
		return a
	}
	return NewArena(t, b, size)
}

// Memory returns how a test allocates the params and outputs it binds
// under opts.Strategy: device memory of dev freed at cleanup, or for
// StrategyRemap buffers of a remappable allocator (NewRemappable), which
// it sets as opts.Remap.Memory: the memory remap maps.
func Memory(t testing.TB, b gpu.Backend, dev int, opts *sg.Options) func(size uint64) gpu.DevicePtr {
	t.Helper()
	if opts.Strategy != sg.StrategyRemap {
		return func(size uint64) gpu.DevicePtr {
			t.Helper()
			return simtest.Alloc(t, b, dev, size)
		}
	}
	a := NewRemappable(t, b, dev)
	opts.Remap.Memory = a
	return func(size uint64) gpu.DevicePtr {
		t.Helper()
		p, err := a.Alloc(size)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
}

// NewRand is the tests' random source for seed.
func NewRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 5)) }

// RandF32 is n floats uniform in [-scale, scale).
func RandF32(r *rand.Rand, n int, scale float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = (r.Float32()*2 - 1) * scale
	}
	return v
}

// U64s reads b as little-endian uint64s.
func U64s(b []byte) []uint64 {
	v := make([]uint64, len(b)/8)
	for i := range v {
		v[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return v
}

// MLP is the test program: an MLP (gemm + bias_tanh per layer) over param
// X into output Y, a chain of K small kernels over param X2 into output Z,
// a state Acc that accumulates Z every step, an output M written by a
// memset then an axpy, and an output YCopy copied from Y by a memcpy:
// every kind of command and every buffer class.
type MLP struct {
	P                     *sg.Program
	Batch, Width, Layers  int
	N, K                  int
	X, X2                 sg.Buffer
	Y, Z, M, YCopy        sg.Buffer
	Acc                   sg.Buffer
	Weights               []sg.Buffer
	Params, Outputs       []sg.Buffer
	BiasData, WeightsData [][]float32
}

// NewMLP declares the test program.
func NewMLP(batch, width, layers, n, k int) *MLP {
	w := &MLP{Batch: batch, Width: width, Layers: layers, N: n, K: k}
	p := sg.NewProgram("mlp")
	w.P = p
	r := rand.New(rand.NewPCG(1, 2))
	act := int64(4 * batch * width)
	w.X = p.Param("x", act)
	w.X2 = p.Param("x2", int64(4*n))
	w.Y = p.Output("y", act)
	w.Z = p.Output("z", int64(4*n))
	w.M = p.Output("m", int64(4*n))
	w.YCopy = p.Output("ycopy", act)
	w.Acc = p.State("acc", int64(4*n))
	in := w.X
	for l := 0; l < layers; l++ {
		wt := p.State("w"+string(rune('0'+l)), int64(4*width*width))
		w.Weights = append(w.Weights, wt)
		w.WeightsData = append(w.WeightsData, RandF32(r, width*width, 1/float32(math.Sqrt(float64(width)))))
		bias := RandF32(r, width, 0.1)
		w.BiasData = append(w.BiasData, bias)
		bb := p.Constant("b"+string(rune('0'+l)), gpu.F32ToBytes(bias))
		h := p.Temp("h"+string(rune('0'+l)), act)
		p.Gemm(h.All(), in.All(), wt.All(), sg.GEMM{M: batch, N: width, K: width, Alpha: 1})
		out := w.Y
		if l < layers-1 {
			out = p.Temp("a"+string(rune('0'+l)), act)
		}
		p.Launch(kernels.BiasTanh, kernels.Elementwise(batch*width),
			sg.Out(out.All()), sg.In(h.All()), sg.In(bb.All()),
			sg.I32(int32(batch)), sg.I32(int32(width)))
		in = out
	}
	p.Memcpy(w.YCopy.All(), w.Y.All())
	// The chain: t0 = axpb(x2), t_i = axpb(t_{i-1}), z = axpb(t_{k-2}).
	prev := w.X2
	for i := 0; i < k; i++ {
		out := w.Z
		if i < k-1 {
			out = p.Temp("t"+string(rune('a'+i)), int64(4*n))
		}
		p.Launch(kernels.Axpb, kernels.Elementwise(n), sg.Out(out.All()), sg.In(prev.All()),
			sg.F32(0.9+float32(i)/100), sg.F32(0.01*float32(i)), sg.I32(int32(n)))
		prev = out
	}
	p.Launch(kernels.Axpy, kernels.Elementwise(n), sg.InOut(w.Acc.All()), sg.In(w.Z.All()),
		sg.F32(0.5), sg.I32(int32(n)))
	p.Memset(w.M.All(), math.Float32bits(1), 4)
	p.Launch(kernels.Axpy, kernels.Elementwise(n), sg.InOut(w.M.All()), sg.In(w.Acc.All()),
		sg.F32(2), sg.I32(int32(n)))
	w.Params = []sg.Buffer{w.X, w.X2}
	w.Outputs = []sg.Buffer{w.Y, w.Z, w.M, w.YCopy}
	return w
}

// InitStates writes the weights.
func (w *MLP) InitStates(t testing.TB, exe *sg.Executable) {
	t.Helper()
	for l, wt := range w.Weights {
		if err := exe.WriteBuffer(context.Background(), wt, gpu.F32ToBytes(w.WeightsData[l])); err != nil {
			t.Fatal(err)
		}
	}
}

// Inputs returns step's param contents.
func (w *MLP) Inputs(step int) map[sg.Buffer][]byte {
	r := rand.New(rand.NewPCG(uint64(step), 99))
	return map[sg.Buffer][]byte{
		w.X:  gpu.F32ToBytes(RandF32(r, w.Batch*w.Width, 1)),
		w.X2: gpu.F32ToBytes(RandF32(r, w.N, 1)),
	}
}

// Movement is how an Addresser moves the buffers between steps.
type Movement string

const (
	Fixed    Movement = "fixed"    // the same buffers every step
	PingPong Movement = "pingpong" // two sets, alternating
	Random   Movement = "random"   // new buffers every step, between live allocations
)

// Movements lists every Movement.
func Movements() []Movement { return []Movement{Fixed, PingPong, Random} }

// Addresser hands out the params' and outputs' memory for each step from a
// bfc allocator, moving them as its Movement says, and writes the params'
// contents when it has an MLP (a Binder).
type Addresser struct {
	t      testing.TB
	b      gpu.Backend
	a      Allocator
	move   Movement
	bufs   []sg.Buffer
	mlp    *MLP
	sets   []sg.Bindings // fixed and pingpong
	prev   sg.Bindings   // random: the last step's, freed after it
	spacer []gpu.DevicePtr
	r      *rand.Rand
}

// NewAddresser moves bufs within a; with w, Bind also writes w's inputs.
// Its memory goes back to a at Close or cleanup.
func NewAddresser(t testing.TB, b gpu.Backend, a Allocator, move Movement, bufs []sg.Buffer, w *MLP) *Addresser {
	ad := &Addresser{t: t, b: b, a: a, move: move, bufs: bufs, mlp: w, r: rand.New(rand.NewPCG(7, 7))}
	nsets := map[Movement]int{Fixed: 1, PingPong: 2}[move]
	for range nsets {
		ad.sets = append(ad.sets, ad.alloc())
	}
	t.Cleanup(ad.Close)
	return ad
}

// NewMLPAddresser is NewAddresser over w's params and outputs, in a fresh
// arena of 64 MiB.
func NewMLPAddresser(t testing.TB, b gpu.Backend, w *MLP, move Movement) *Addresser {
	return NewAddresser(t, b, NewArena(t, b, 64<<20), move, append(append([]sg.Buffer(nil), w.Params...), w.Outputs...), w)
}

func (ad *Addresser) alloc() sg.Bindings {
	b := sg.Bindings{}
	for _, buf := range ad.bufs {
		p, err := ad.a.Alloc(uint64(buf.Size()))
		if err != nil {
			ad.t.Fatal(err)
		}
		b[buf] = p
	}
	return b
}

func (ad *Addresser) free(b sg.Bindings) {
	for _, p := range b {
		if err := ad.a.Free(p); err != nil {
			ad.t.Fatal(err)
		}
	}
}

// Next returns the bindings of step i; the previous step must be complete.
func (ad *Addresser) Next(i int) sg.Bindings {
	if ad.move != Random {
		return ad.sets[i%len(ad.sets)]
	}
	if ad.prev != nil {
		ad.free(ad.prev)
	}
	// Churn the allocator: free some spacers, add some, so best fit lands
	// the step's buffers somewhere new.
	for j := 0; j < len(ad.spacer); j++ {
		if ad.r.IntN(2) == 0 {
			if err := ad.a.Free(ad.spacer[j]); err != nil {
				ad.t.Fatal(err)
			}
			ad.spacer = append(ad.spacer[:j], ad.spacer[j+1:]...)
			j--
		}
	}
	for range 1 + ad.r.IntN(3) {
		p, err := ad.a.Alloc(uint64(256 * (1 + ad.r.IntN(64))))
		if err != nil {
			ad.t.Fatal(err)
		}
		ad.spacer = append(ad.spacer, p)
	}
	ad.prev = ad.alloc()
	return ad.prev
}

// Bind is Next, with the MLP's inputs of step i written (a Binder).
func (ad *Addresser) Bind(i int) (sg.Bindings, error) {
	bind := ad.Next(i)
	if ad.mlp != nil {
		for buf, data := range ad.mlp.Inputs(i) {
			if err := ad.b.MemcpyHtoD(bind[buf], data); err != nil {
				return nil, err
			}
		}
	}
	return bind, nil
}

// Close gives the Addresser's memory back to its allocator; it runs at
// cleanup too, and is idempotent.
func (ad *Addresser) Close() {
	for _, s := range ad.sets {
		ad.free(s)
	}
	ad.sets = nil
	if ad.prev != nil {
		ad.free(ad.prev)
		ad.prev = nil
	}
	for _, p := range ad.spacer {
		if err := ad.a.Free(p); err != nil {
			ad.t.Error(err)
		}
	}
	ad.spacer = nil
}

// Binder gives each step's bindings, the params' contents written:
// a workload.Caller, or an Addresser.
type Binder interface {
	Bind(step int) (sg.Bindings, error)
}

// Step is what Run saw at one step.
type Step struct {
	Bind     sg.Bindings     // the step's bindings (a copy)
	Outs     [][]byte        // per output, in the order given to Run
	OutAddrs []gpu.DevicePtr // where each output was (Outputs.Addr)
	Leased   bool            // the outputs were leased
	States   [][]byte        // per state, when Run was given states
	Stats    sg.Stats        // after the step
	Mem      sg.MemoryStats  // after the step
	Moved    bool            // some binding differs from the step before
}

// Run runs steps of exe on s, each bound by bind: it reads every output of
// outputs (then releases them) and, when states is not nil, every state
// of states after every step, and fails the test at the first error. It
// is the one loop the tests run N steps with.
func Run(t testing.TB, exe *sg.Executable, s gpu.Stream, bind Binder, steps int, outputs, states []sg.Buffer) []Step {
	t.Helper()
	ctx := context.Background()
	var res []Step
	var last sg.Bindings
	for i := range steps {
		b, err := bind.Bind(i)
		if err != nil {
			t.Fatal(err)
		}
		st := Step{Bind: maps.Clone(b)}
		for k, p := range b {
			st.Moved = st.Moved || last[k] != p
		}
		last = st.Bind
		outs, err := exe.Run(ctx, s, b)
		if err != nil {
			t.Fatalf("%s step %d (ran %s): %v", exe.Strategy(), i, exe.Stats().Ran, err)
		}
		st.Leased = outs.Leased()
		for _, o := range outputs {
			data, err := exe.ReadOutput(ctx, outs, o)
			if err != nil {
				t.Fatal(err)
			}
			st.Outs = append(st.Outs, data)
			st.OutAddrs = append(st.OutAddrs, outs.Addr(o))
		}
		outs.Release()
		for _, sb := range states {
			data, err := exe.ReadBuffer(ctx, sb)
			if err != nil {
				t.Fatal(err)
			}
			st.States = append(st.States, data)
		}
		st.Stats, st.Mem = exe.Stats(), exe.Memory()
		res = append(res, st)
	}
	return res
}

// Compile compiles p with opts, closing the executable at cleanup.
func Compile(t testing.TB, b gpu.Backend, p *sg.Program, opts sg.Options) *sg.Executable {
	t.Helper()
	exe, err := sg.Compile(context.Background(), b, p, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := exe.Close(); err != nil {
			t.Error(err)
		}
	})
	return exe
}

// RunMLP runs steps of w under strategy with the buffers moving as move
// says, and returns what every step saw and the final accumulator state.
// Outputs must stay where they were bound. The buffers come from a bfc
// arena, or for StrategyRemap from a remappable allocator, the memory it
// maps.
func RunMLP(t testing.TB, b gpu.Backend, w *MLP, strategy sg.Strategy, move Movement, steps int) ([]Step, []byte) {
	t.Helper()
	s := simtest.Stream(t, b, 0)
	opts := sg.Options{Strategy: strategy}
	ad := NewAddresser(t, b, ArenaFor(t, b, 64<<20, &opts), move, append(append([]sg.Buffer(nil), w.Params...), w.Outputs...), w)
	exe, err := sg.Compile(context.Background(), b, w.P, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := exe.Close(); err != nil {
			t.Error(err)
		}
	}()
	w.InitStates(t, exe)
	res := Run(t, exe, s, ad, steps, w.Outputs, nil)
	for i, st := range res {
		for k, o := range w.Outputs {
			if st.OutAddrs[k] != st.Bind[o] {
				t.Fatalf("step %d: output %s at %#x, bound at %#x", i, o.Name(), uint64(st.OutAddrs[k]), uint64(st.Bind[o]))
			}
		}
	}
	acc, err := exe.ReadBuffer(context.Background(), w.Acc)
	if err != nil {
		t.Fatal(err)
	}
	return res, acc
}

// MustWorkload builds workload name with cfg.
func MustWorkload(t testing.TB, name string, cfg workload.Config) *workload.Workload {
	t.Helper()
	w, err := workload.New(name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// StartWorkload compiles w with opts, initialises its states and makes a
// caller whose buffers move by pattern (a remappable caller for
// StrategyRemap, given to the executable as Options.Remap.Memory unless
// opts has one). done closes the executable, then the caller, reporting
// failures; call it before the test's own checks of live handles.
func StartWorkload(t testing.TB, b gpu.Backend, w *workload.Workload, opts sg.Options, pattern workload.Pattern) (exe *sg.Executable, caller *workload.Caller, done func()) {
	t.Helper()
	ctx := context.Background()
	caller, err := workload.NewCallerWith(b, 0, w, pattern, 1, workload.CallerOptionsFor(opts.Strategy))
	if err != nil {
		t.Fatal(err)
	}
	if opts.Remap.Memory == nil {
		opts.Remap.Memory = caller.Remappable()
	}
	exe, err = sg.Compile(ctx, b, w.Program, opts)
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

// WorkloadRun is what RunWorkload saw.
type WorkloadRun struct {
	Steps        []Step
	States       [][]byte // the final states, in w.States order
	First, Final sg.Choice
}

// RunWorkload runs steps of w with opts, the caller's buffers moving by
// pattern, reading every output after every step and, with everyStep,
// every state too; the final states are read in any case.
func RunWorkload(t testing.TB, b gpu.Backend, w *workload.Workload, opts sg.Options, pattern workload.Pattern, steps int, everyStep bool) WorkloadRun {
	t.Helper()
	s := simtest.Stream(t, b, 0)
	exe, caller, done := StartWorkload(t, b, w, opts, pattern)
	defer done()
	states := make([]sg.Buffer, len(w.States))
	for i, st := range w.States {
		states[i] = st.Buffer
	}
	r := WorkloadRun{First: exe.Choice()}
	var every []sg.Buffer
	if everyStep {
		every = states
	}
	r.Steps = Run(t, exe, s, caller, steps, w.Outputs, every)
	r.Final = exe.Choice()
	for _, sb := range states {
		data, err := exe.ReadBuffer(context.Background(), sb)
		if err != nil {
			t.Fatal(err)
		}
		r.States = append(r.States, data)
	}
	return r
}

// SameResults demands every output of every step, every state read after
// a step, and every final state equal to want's, bit for bit.
func SameResults(t testing.TB, got, want WorkloadRun) {
	t.Helper()
	for i := range want.Steps {
		for k := range want.Steps[i].Outs {
			if !bytes.Equal(got.Steps[i].Outs[k], want.Steps[i].Outs[k]) {
				t.Fatalf("step %d (ran %s) output %d differs from eager", i, got.Steps[i].Stats.Ran, k)
			}
		}
		for k := range want.Steps[i].States {
			if !bytes.Equal(got.Steps[i].States[k], want.Steps[i].States[k]) {
				t.Fatalf("step %d (ran %s) state %d differs from eager", i, got.Steps[i].Stats.Ran, k)
			}
		}
	}
	for k := range want.States {
		if !bytes.Equal(got.States[k], want.States[k]) {
			t.Fatalf("final state %d differs from eager", k)
		}
	}
}

// Workers configures the concurrent-workers harness.
type Workers struct {
	// Program is run with one param X and one output Y, which depends on
	// X alone; States are written before the first step.
	Program *sg.Program
	X, Y    sg.Buffer
	States  []workload.StateInit
	// Input is the contents of input i of X.
	Input func(i int) []byte
	// Options compile the executable under test. With a
	// *remappable.Allocator as Options.Remap.Memory (StrategyRemap), the
	// workers' buffers are allocated from it.
	Options sg.Options
	// Workers goroutines run Steps steps each.
	Workers, Steps int
	// During, when set, is called over and over beside the workers until
	// they finish (readers of Choice, Memory, Stats); it returns an error
	// to fail the test.
	During func(exe *sg.Executable) error
}

// Run compiles the program with eager and with the options, and runs the
// executable from the workers, each on its own stream with two sets of
// buffers it alternates, checking every output against eager's. It
// returns the executable (closed at cleanup) for the test's own checks.
func (c Workers) Run(t testing.TB, b gpu.Backend) *sg.Executable {
	t.Helper()
	ctx := context.Background()
	ref := Compile(t, b, c.Program, sg.Options{Strategy: sg.StrategyEager})
	exe := Compile(t, b, c.Program, c.Options)
	for _, st := range c.States {
		for _, e := range []*sg.Executable{ref, exe} {
			if err := e.WriteBuffer(ctx, st.Buffer, st.Data); err != nil {
				t.Fatal(err)
			}
		}
	}
	type job struct {
		s      gpu.Stream
		xp, yp [2]gpu.DevicePtr
		want   [2][]byte
	}
	rs := simtest.Stream(t, b, 0)
	alloc := func(size int64) gpu.DevicePtr { return simtest.Alloc(t, b, 0, uint64(size)) }
	if ra, ok := c.Options.Remap.Memory.(*remappable.Allocator); ok {
		// Remap's buffers come from the allocator it maps from.
		alloc = func(size int64) gpu.DevicePtr {
			p, err := ra.Alloc(uint64(size))
			if err != nil {
				t.Fatal(err)
			}
			return p
		}
	}
	jobs := make([]*job, c.Workers)
	for i := range jobs {
		j := &job{s: simtest.Stream(t, b, 0)}
		for k := range 2 {
			j.xp[k] = alloc(c.X.Size())
			j.yp[k] = alloc(c.Y.Size())
			if err := b.MemcpyHtoD(j.xp[k], c.Input(10*i+k)); err != nil {
				t.Fatal(err)
			}
			outs, err := ref.Run(ctx, rs, sg.Bindings{c.X: j.xp[k], c.Y: j.yp[k]})
			if err != nil {
				t.Fatal(err)
			}
			if j.want[k], err = ref.ReadOutput(ctx, outs, c.Y); err != nil {
				t.Fatal(err)
			}
		}
		jobs[i] = j
	}
	stop := make(chan struct{})
	during := make(chan error, 1)
	go func() {
		var err error
		for err == nil && c.During != nil {
			select {
			case <-stop:
				during <- nil
				return
			default:
			}
			err = c.During(exe)
		}
		during <- err
	}()
	errs := make(chan error, c.Workers)
	for _, j := range jobs {
		go func() {
			for step := range c.Steps {
				k := step % 2
				outs, err := exe.Run(ctx, j.s, sg.Bindings{c.X: j.xp[k], c.Y: j.yp[k]})
				if err != nil {
					errs <- err
					return
				}
				got, err := exe.ReadOutput(ctx, outs, c.Y)
				outs.Release()
				if err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(got, j.want[k]) {
					errs <- fmt.Errorf("step %d (ran %s): concurrent run differs from eager", step, exe.Stats().Ran)
					return
				}
				_ = exe.Stats() // read beside the other workers' steps
			}
			errs <- nil
		}()
	}
	for range c.Workers {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	close(stop)
	if err := <-during; err != nil {
		t.Error(err)
	}
	return exe
}

// WantCompileRefused compiles p on b with opts and fails the test unless
// Compile fails with an error wrapping want and, when says is not empty,
// containing it, and leaves no handle of counted (the sim under b) live.
func WantCompileRefused(t testing.TB, b gpu.Backend, counted *sim.Backend, p *sg.Program, opts sg.Options, want error, says string) {
	t.Helper()
	exe, err := sg.Compile(context.Background(), b, p, opts)
	if err == nil {
		exe.Close()
		t.Fatalf("Compile with strategy %s succeeded; want it refused (%v)", opts.Strategy, want)
	}
	if !errors.Is(err, want) || !strings.Contains(err.Error(), says) {
		t.Fatalf("Compile = %v, want %v saying %q", err, want, says)
	}
	simtest.WantZero(t, counted, "after the refused Compile")
}

// CompileFaults fails, one call at a time, every call of each op that
// compiling p on b with opts makes, and fails the test unless each failure
// is returned (wrapping gpu.ErrInjected, and naming the op when nameOp is
// set) and leaves nothing live, and unless Compile calls every op.
func CompileFaults(t testing.TB, b *sim.Backend, p *sg.Program, opts sg.Options, ops []string, nameOp bool) {
	t.Helper()
	for _, op := range ops {
		for nth := 0; ; nth++ {
			before := b.Calls(op)
			b.InjectFault(op, nth, nil)
			exe, err := sg.Compile(context.Background(), b, p, opts)
			fired := b.Calls(op)-before > nth
			b.ClearFaults()
			if err == nil {
				if fired {
					t.Fatalf("%s call %d failed but Compile succeeded", op, nth)
				}
				if err := exe.Close(); err != nil {
					t.Fatal(err)
				}
				if nth == 0 {
					t.Errorf("Compile never calls %s", op)
				}
				break
			}
			if !errors.Is(err, gpu.ErrInjected) || (nameOp && !strings.Contains(err.Error(), op)) {
				t.Fatalf("%s call %d: error does not wrap the injected fault (or name the call): %v", op, nth, err)
			}
			simtest.WantZero(t, b, fmt.Sprintf("%s call %d failed", op, nth))
		}
	}
}
