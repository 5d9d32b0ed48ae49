package workload

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/safetensors"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/models/gpt2"
)

// gpt2Ref is a float64 forward of one decode step of one sequence, written
// from the model's definition rather than from the kernels: embedding, L
// pre-norm blocks (attention over the cache's first pos keys and values
// plus this step's, MLP with tanh GELU), final norm, tied LM head.
type gpt2Ref struct {
	s gpt2Shape
	w map[string][]float64
}

func newGPT2Ref(t *testing.T, wl *Workload) *gpt2Ref {
	t.Helper()
	r := &gpt2Ref{s: wl.gpt2.shape, w: map[string][]float64{}}
	for _, st := range wl.States {
		v := gpu.BytesToF32(st.Data)
		f := make([]float64, len(v))
		for i, x := range v {
			f[i] = float64(x)
		}
		r.w[st.Buffer.Name()] = f
	}
	return r
}

func (r *gpt2Ref) layerNorm(x []float64, name string) []float64 {
	g, b := r.w[name+".weight"], r.w[name+".bias"]
	var mean, v float64
	for _, e := range x {
		mean += e
	}
	mean /= float64(len(x))
	for _, e := range x {
		v += (e - mean) * (e - mean)
	}
	rstd := 1 / math.Sqrt(v/float64(len(x))+gpt2Eps)
	y := make([]float64, len(x))
	for i, e := range x {
		y[i] = (e-mean)*rstd*g[i] + b[i]
	}
	return y
}

// linear is x·W + b with W stored [len(x), n].
func (r *gpt2Ref) linear(x []float64, name string, n int) []float64 {
	w, b := r.w[name+".weight"], r.w[name+".bias"]
	y := make([]float64, n)
	for j := range y {
		s := b[j]
		for i, e := range x {
			s += e * w[i*n+j]
		}
		y[j] = s
	}
	return y
}

// logits of one sequence at position pos with token tok, its cache holding
// cache (float32 values, the layout of gpt2.go) for positions below pos.
func (r *gpt2Ref) logits(tok, pos int, cache []float32) []float64 {
	s := r.s
	d, hd := s.d, s.headDim()
	x := make([]float64, d)
	for c := range x {
		x[c] = r.w["wte.weight"][tok*d+c] + r.w["wpe.weight"][pos*d+c]
	}
	for l := range s.layers {
		pre := "h." + strconv.Itoa(l) + "."
		qkv := r.linear(r.layerNorm(x, pre+"ln_1"), pre+"attn.c_attn", 3*d)
		q, k, v := qkv[:d], qkv[d:2*d], qkv[2*d:]
		key := func(t, c int) float64 {
			if t == pos {
				return k[c]
			}
			return float64(cache[int64(t*s.config().Stride()+l*2*d+c)])
		}
		val := func(t, c int) float64 {
			if t == pos {
				return v[c]
			}
			return float64(cache[int64(t*s.config().Stride()+l*2*d+d+c)])
		}
		att := make([]float64, d)
		for h := range s.heads {
			sc := make([]float64, pos+1)
			m := math.Inf(-1)
			for t := range sc {
				for j := range hd {
					sc[t] += q[h*hd+j] * key(t, h*hd+j)
				}
				sc[t] /= math.Sqrt(float64(hd))
				m = max(m, sc[t])
			}
			var sum float64
			for t := range sc {
				sc[t] = math.Exp(sc[t] - m)
				sum += sc[t]
			}
			for j := range hd {
				for t := range sc {
					att[h*hd+j] += sc[t] / sum * val(t, h*hd+j)
				}
			}
		}
		for c, a := range r.linear(att, pre+"attn.c_proj", d) {
			x[c] += a
		}
		f := r.linear(r.layerNorm(x, pre+"ln_2"), pre+"mlp.c_fc", 4*d)
		for i := range f {
			f[i] = kernels.Gelu(f[i])
		}
		for c, a := range r.linear(f, pre+"mlp.c_proj", d) {
			x[c] += a
		}
	}
	h := r.layerNorm(x, "ln_f")
	out := make([]float64, s.vocab)
	for t := range out {
		for c, e := range h {
			out[t] += e * r.w["wte.weight"][t*d+c]
		}
	}
	return out
}

func readI32s(b []byte) []int32 {
	v := make([]int32, len(b)/4)
	for i := range v {
		v[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

func tinyGPT2(t *testing.T, cfg Config) *Workload {
	t.Helper()
	w, err := New("gpt2-decode-tiny", cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestGPT2DecodeMatchesReference runs the tiny config on sim with nine rows
// (two launches of the cache kernels per layer) under swap, dumps the last
// step, and checks its logits against the float64 forward of each row's
// sequence: token, position and initial cache as the dump and the workload
// say.
func TestGPT2DecodeMatchesReference(t *testing.T) {
	b := openSim(t)
	w := tinyGPT2(t, Config{Batch: 9, Seed: 3})
	dump := filepath.Join(t.TempDir(), "step.safetensors")
	if _, err := Run(context.Background(), b, w, RunOptions{Steps: 3, Pattern: Swap, Dump: dump, WallBatches: -1}); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(dump)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Metadata["step"] != "2" || f.Metadata["pattern"] != "swap" {
		t.Errorf("dump metadata %v", f.Metadata)
	}
	read := func(name string) []byte {
		ts, err := f.ReadTensor(name)
		if err != nil {
			t.Fatal(err)
		}
		return ts.Data
	}
	toks, pos, seqs := readI32s(read("tokens")), readI32s(read("positions")), readI32s(read("sequences"))
	logits := gpu.BytesToF32(read("logits"))
	if in, _ := f.Info("logits"); len(in.Shape) != 2 || in.Shape[0] != 9 || in.Shape[1] != 256 {
		t.Errorf("logits shape %v", in.Shape)
	}
	m, s := w.gpt2, w.gpt2.shape
	swapped := 0
	for r, seq := range seqs {
		if int(seq) != r {
			swapped++
		}
		if toks[r] != m.token(2, int(seq)) || int(pos[r]) != s.seqPos(int(seq)) {
			t.Errorf("row %d: token %d position %d, the workload says %d and %d for sequence %d",
				r, toks[r], pos[r], m.token(2, int(seq)), s.seqPos(int(seq)), seq)
		}
	}
	if swapped == 0 {
		t.Errorf("after two swaps every row still holds its own sequence: %v", seqs)
	}
	ref := newGPT2Ref(t, w)
	var worst float64
	for r, seq := range seqs {
		want := ref.logits(int(toks[r]), int(pos[r]), gpu.BytesToF32(m.initialCache(int(seq))))
		for v, x := range want {
			worst = max(worst, math.Abs(float64(logits[r*s.vocab+v])-x))
		}
	}
	var sq float64
	for _, x := range logits {
		sq += float64(x) * float64(x)
	}
	rms := math.Sqrt(sq / float64(len(logits)))
	t.Logf("max |sim logits - float64 reference| = %.3g (logits rms %.3g)", worst, rms)
	if !(rms > 0.1) {
		t.Errorf("logits rms %.3g: too small for the comparison to mean much", rms)
	}
	if !(worst < 2e-5) {
		t.Errorf("logits differ from the float64 reference by %.3g", worst)
	}
}

// TestGPT2BenchStrategiesMatchEager: every strategy's logits equal eager's
// bit for bit at every step, for every pattern, including swap (cache
// bindings change every step) and random (every cache moves every step).
func TestGPT2BenchStrategiesMatchEager(t *testing.T) {
	b := openSim(t)
	for _, c := range []struct {
		pat   Pattern
		batch int
	}{{Fixed, 2}, {PingPong, 3}, {Swap, 9}, {Random, 9}} {
		w := tinyGPT2(t, Config{Batch: c.batch, Layers: 1})
		rep, err := Bench(context.Background(), b, w, nil, RunOptions{Steps: 3, Warmup: 1, Pattern: c.pat, WallBatches: -1})
		if err != nil {
			t.Fatalf("%s: %v", c.pat, err)
		}
		for _, r := range rep.Results {
			if !r.OutputsMatchEager {
				t.Errorf("%s/%s: outputs differ from eager: %s", c.pat, r.Strategy, r.Note)
			}
			if r.Strategy == "patch" && c.pat != Fixed && r.PatchedNodes == 0 {
				t.Errorf("%s: patch patched nothing", c.pat)
			}
		}
		if c.pat == Swap {
			if _, ok := rep.Result(FloorRow); !ok {
				t.Errorf("swap: no floor row")
			}
		}
	}
}

// TestGPT2CallerSequences checks the caller's bookkeeping: swap changes
// swapsPerStep rows per step among batch+k sequences, random moves every
// cache, and a cache keeps what the step appended.
func TestGPT2CallerSequences(t *testing.T) {
	b := openSim(t)
	w := tinyGPT2(t, Config{Batch: 9, Layers: 1})
	ctx := context.Background()
	for _, pat := range []Pattern{Swap, Random, Fixed} {
		c, err := NewCaller(b, 0, w, pat, 5)
		if err != nil {
			t.Fatal(err)
		}
		exe, err := sg.Compile(ctx, b, w.Program, sg.Options{Strategy: sg.StrategyEager})
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range w.States {
			if err := exe.WriteBuffer(ctx, st.Buffer, st.Data); err != nil {
				t.Fatal(err)
			}
		}
		s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
		if err != nil {
			t.Fatal(err)
		}
		var prev sg.Bindings
		for step := range 4 {
			bind, err := c.Bind(step)
			if err != nil {
				t.Fatal(err)
			}
			changed := 0
			for _, kv := range w.gpt2.caches {
				if prev != nil && bind[kv] != prev[kv] {
					changed++
				}
			}
			want := map[Pattern]int{Swap: swapsPerStep(9), Random: 9, Fixed: 0}[pat]
			if step > 0 && changed != want && !(pat == Swap && changed <= want) {
				t.Errorf("%s step %d: %d cache bindings changed, want %d", pat, step, changed, want)
			}
			if len(c.seq.seqs) != seqCount(w.gpt2, pat) {
				t.Errorf("%s: %d sequences", pat, len(c.seq.seqs))
			}
			outs, err := exe.Run(ctx, s, bind)
			if err != nil {
				t.Fatal(err)
			}
			outs.Release()
			if err := b.StreamSynchronize(s); err != nil {
				t.Fatal(err)
			}
			// The step appended this step's key at each row's position:
			// the cache now differs from its initial contents there.
			r0 := c.seq.rows[0]
			got := make([]byte, 4*w.gpt2.shape.cacheFloats())
			if err := b.MemcpyDtoH(got, bind[w.gpt2.caches[0]]); err != nil {
				t.Fatal(err)
			}
			init := w.gpt2.initialCache(r0)
			// Position-major: the positions before seqPos, then layer 0's key.
			stride := 4 * w.gpt2.shape.config().Stride()
			p := w.gpt2.shape.seqPos(r0) * stride
			if string(got[:p]) != string(init[:p]) || string(got[p:p+4*w.gpt2.shape.d]) == string(init[p:p+4*w.gpt2.shape.d]) {
				t.Errorf("%s step %d: sequence %d's cache lost its prefix or got no key at position %d", pat, step, r0, p/stride)
			}
			prev = bind
		}
		if err := errors.Join(exe.Close(), b.StreamDestroy(s), c.Close()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := NewCaller(b, 0, small(t, "mlp"), Swap, 1); err == nil || !strings.Contains(err.Error(), "per-sequence") {
		t.Errorf("swap on mlp: %v", err)
	}
}

// TestGPT2CallerFaults fails each driver call the gpt2 caller makes in turn
// (allocation, memset, copies) while it sets up and binds: every failure
// is an error and nothing leaks (openSim checks the live handles).
func TestGPT2CallerFaults(t *testing.T) {
	b := openSim(t)
	fi := b.(gpu.FaultInjector)
	w := tinyGPT2(t, Config{Batch: 3, Layers: 1})
	for _, op := range []string{"MemAlloc", "Memset", "MemcpyHtoD", "MemcpyDtoD"} {
		for nth := 0; ; nth++ {
			fi.ClearFaults()
			fi.InjectFault(op, nth, gpu.ErrOutOfMemory)
			before := fi.Calls(op)
			c, err := NewCaller(b, 0, w, Random, 1)
			if err == nil {
				for step := range 3 {
					if _, err = c.Bind(step); err != nil {
						break
					}
				}
				err = errors.Join(err, c.Close())
			}
			calls := fi.Calls(op) - before
			if nth >= calls {
				if err != nil {
					t.Fatalf("%s: no fault injected at call %d of %d, yet: %v", op, nth, calls, err)
				}
				if calls == 0 {
					t.Errorf("the caller never calls %s", op)
				}
				t.Logf("%s: each of %d calls failed in turn", op, calls)
				break
			}
			if !errors.Is(err, gpu.ErrInjected) {
				t.Errorf("%s call %d failed, the caller said %v", op, nth, err)
			}
		}
	}
	fi.ClearFaults()
}

// TestGPT2SmallShape checks the default config against GPT-2 small's
// published size without generating its 500 MB of weights.
func TestGPT2SmallShape(t *testing.T) {
	s, err := gpt2Config(Config{}, gpt2Small)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	specs, err := gpt2.Specs(s.config(), gpt2.Shard{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ts := range specs {
		n += ts.Elements()
	}
	if n != 124_439_808 || s.headDim() != 64 || s.cacheFloats()*4 != 75_497_472 {
		t.Errorf("GPT-2 small: %d parameters (want 124439808), head dim %d, cache %d bytes", n, s.headDim(), s.cacheFloats()*4)
	}
}

func TestGPT2Config(t *testing.T) {
	w := tinyGPT2(t, Config{})
	if got := len(w.Params); got != 2+4 || w.Params[0].Name() != "tokens" || w.Params[2].Name() != "kv0" {
		t.Errorf("params %v", w.Params)
	}
	if want := 4 * 2 * 2 * 64 * 64; w.Params[2].Size() != int64(want) {
		t.Errorf("cache of %d bytes, want %d (positions × layers × k,v × d floats)", w.Params[2].Size(), want)
	}
	if got := len(w.States); got != 2+12*2+2 {
		t.Errorf("%d weight tensors", got)
	}
	if !strings.Contains(w.Desc, "layers=2 d=64 heads=4 vocab=256 positions=64 pos=16 batch=4") {
		t.Errorf("desc %q", w.Desc)
	}
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Width: 60, Heads: 8}, "not a multiple"},
		{Config{Pos: 64}, "outside the cache"},
		{Config{Positions: 9000}, "too large"},
		{Config{Vocab: -1}, "negative"},
	} {
		if _, err := New("gpt2-decode-tiny", c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error saying %q", c.cfg, err, c.want)
		}
	}
	// Launches: embedding, per layer 9 plus two per group of eight rows,
	// final norm and LM head.
	b := openSim(t)
	for _, batch := range []int{1, 8, 9} {
		w := tinyGPT2(t, Config{Batch: batch, Layers: 2})
		res, err := Run(context.Background(), b, w, RunOptions{Steps: 1, Pattern: Fixed, WallBatches: -1})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := res.Stats.Launches, int64(1+2*(9+2*((batch+7)/8))+2); got != want {
			t.Errorf("batch %d: %d launches per step, want %d", batch, got, want)
		}
	}
	// Inputs: a pure function of the step for tokens; cache i's prefix.
	if string(w.Input(1, 0)) == string(w.Input(2, 0)) || string(w.Input(1, 0)) != string(w.Input(1, 0)) {
		t.Error("tokens are not a function of the step")
	}
	if pos := readI32s(w.Input(0, 1)); pos[0] != 16 || pos[1] != 15 || pos[3] != 13 {
		t.Errorf("positions %v", pos)
	}
}

// TestGPT2WeightsFile: a missing file is written with the generated
// weights, then read back identically; files that do not fit the config
// are refused, saying why.
func TestGPT2WeightsFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "w.safetensors")
	w1 := tinyGPT2(t, Config{Weights: path, Seed: 9})
	if !strings.Contains(w1.Desc, "written to") {
		t.Errorf("desc %q", w1.Desc)
	}
	w2 := tinyGPT2(t, Config{Weights: path, Seed: 1}) // the file wins over the seed
	if !strings.Contains(w2.Desc, "from "+path) {
		t.Errorf("desc %q", w2.Desc)
	}
	w3 := tinyGPT2(t, Config{Seed: 9})
	for i := range w1.States {
		if string(w1.States[i].Data) != string(w2.States[i].Data) || string(w1.States[i].Data) != string(w3.States[i].Data) {
			t.Fatalf("tensor %s differs between generated, written and read", w1.States[i].Buffer.Name())
		}
	}
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if in, ok := f.Info("h.1.attn.c_attn.weight"); !ok || in.DType != "F32" || len(in.Shape) != 2 || in.Shape[0] != 64 || in.Shape[1] != 192 {
		t.Errorf("c_attn %+v", in)
	}
	f.Close()
	if _, err := New("gpt2-decode-tiny", Config{Weights: path, Width: 32}); err == nil || !strings.Contains(err.Error(), "has shape [256 64], the config needs [256 32]") {
		t.Errorf("wrong width: %v", err)
	}
	bad := filepath.Join(dir, "bad.safetensors")
	if err := safetensors.WriteFile(bad, []safetensors.Tensor{{Name: "wte.weight", DType: "F16", Shape: []int64{256, 64}, Data: make([]byte, 2*256*64)}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := New("gpt2-decode-tiny", Config{Weights: bad}); err == nil || !strings.Contains(err.Error(), "F16") {
		t.Errorf("F16 weights: %v", err)
	}
	if err := os.WriteFile(bad, []byte("not safetensors"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New("gpt2-decode-tiny", Config{Weights: bad}); !errors.Is(err, safetensors.ErrFormat) {
		t.Errorf("garbage file: %v", err)
	}
}

var updateFixture = flag.Bool("update", false, "rewrite the gpt2 peer fixture in bench/peers/testdata/gpt2")

// The PyTorch peer's tests (bench/peers/test_gpt2.py) run it on a micro
// config against this workload's weights and eager logits, kept in
// bench/peers/testdata/gpt2. TestGPT2PeerFixture fails when they no longer
// match what the workload makes; -update rewrites them.
const peerFixture = "../bench/peers/testdata/gpt2"

func TestGPT2PeerFixture(t *testing.T) {
	dir := t.TempDir()
	if *updateFixture {
		dir = peerFixture
		if err := os.Remove(filepath.Join(dir, "weights.safetensors")); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err) // else New would read the old weights back
		}
	}
	cfg := Config{Layers: 1, Width: 16, Heads: 2, Vocab: 32, Positions: 16, Pos: 6, Batch: 3, Seed: 5,
		Weights: filepath.Join(dir, "weights.safetensors")}
	w := tinyGPT2(t, cfg)
	dump := filepath.Join(dir, "eager-b3.safetensors")
	b := openSim(t)
	if _, err := Run(context.Background(), b, w, RunOptions{Steps: 1, Pattern: Fixed, Dump: dump, WallBatches: -1}); err != nil {
		t.Fatal(err)
	}
	if *updateFixture {
		t.Logf("wrote %s", dir)
		return
	}
	for _, name := range []string{"weights.safetensors", "eager-b3.safetensors"} {
		got, err := safetensors.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		want, err := safetensors.Open(filepath.Join(peerFixture, name))
		if err != nil {
			t.Fatalf("%v (go test ./workload -run TestGPT2PeerFixture -update writes it)", err)
		}
		if len(got.Tensors()) != len(want.Tensors()) {
			t.Errorf("%s: %d tensors, the fixture %d", name, len(got.Tensors()), len(want.Tensors()))
		}
		for _, in := range got.Tensors() {
			g, _ := got.ReadTensor(in.Name)
			f, err := want.ReadTensor(in.Name)
			if err != nil || !closeTensor(g, f) {
				t.Errorf("%s: tensor %s differs from the fixture (%v): run go test ./workload -run TestGPT2PeerFixture -update", name, in.Name, err)
			}
		}
		got.Close()
		want.Close()
	}
}

// closeTensor: same dtype, shape and bytes, or float32 values within 1e-6
// (the sim's libm may round differently on another platform).
func closeTensor(a, b safetensors.Tensor) bool {
	if a.DType != b.DType || !slices.Equal(a.Shape, b.Shape) || len(a.Data) != len(b.Data) {
		return false
	}
	if a.DType != "F32" {
		return string(a.Data) == string(b.Data)
	}
	x, y := gpu.BytesToF32(a.Data), gpu.BytesToF32(b.Data)
	for i := range x {
		if math.Abs(float64(x[i])-float64(y[i])) > 1e-6 {
			return false
		}
	}
	return true
}
