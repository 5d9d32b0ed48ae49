package kernels_test

import (
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/gputest"
	"github.com/stablegraph/stablegraph/kernels"
)

// The conformance cases in gpu/gputest check the transformer kernels on
// random inputs against float64 computations; these tests pin down values
// that can be worked out by hand and the references' answers to bad input.

func spec(t *testing.T, name string) gpu.KernelSpec {
	t.Helper()
	k, ok := kernels.Module().Kernel(name)
	if !ok {
		t.Fatalf("no kernel %s", name)
	}
	return k
}

func i32s(v ...int32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return b
}

func f32s(v ...float32) []byte { return gpu.F32ToBytes(v) }

// attention runs DecodeAttention's reference on one sequence of one head
// (headDim 2) over a one-layer cache of npos positions (each position's
// key then value) and returns the output.
func attention(t *testing.T, q []float32, cache []float32, npos int, pos int32, scale float32) ([]float32, error) {
	t.Helper()
	mem := gputest.NewMapMemory()
	out := mem.Alloc(f32s(7, 7)) // an inactive row must overwrite it
	qp, pp, cp := mem.Alloc(f32s(q...)), mem.Alloc(i32s(pos)), mem.Alloc(f32s(cache...))
	args := []gpu.Arg{gpu.Ptr(out), gpu.Ptr(qp), gpu.Ptr(pp)}
	for range kernels.MaxSeqsPerLaunch {
		args = append(args, gpu.Ptr(cp))
	}
	args = append(args, gpu.I32(1), gpu.I32(1), gpu.I32(2), gpu.I32(1), gpu.I32(0), gpu.I32(int32(npos)), gpu.F32(scale))
	err := spec(t, kernels.DecodeAttention).Ref(mem, kernels.DecodeAttentionConfig(1, 1, 2, npos), args)
	return gpu.BytesToF32(mem.Bytes(out)), err
}

func TestDecodeAttentionByHand(t *testing.T) {
	// Position-major, headDim 2: k0 v0 k1 v1 k2 v2 k3 v3.
	keys := []float32{1, 0, 0, 1, 1, 1, 9, 9}
	vals := []float32{2, 4, 6, 8, 10, 12, 99, 99}
	var cache []float32
	for t := range 4 {
		cache = append(append(cache, keys[2*t:2*t+2]...), vals[2*t:2*t+2]...)
	}
	// Position 0: one key, so the output is v0 whatever the score.
	got, err := attention(t, []float32{3, -7}, cache, 4, 0, 0.5)
	if err != nil || got[0] != 2 || got[1] != 4 {
		t.Fatalf("position 0: %v, %v; want v0 = [2 4]", got, err)
	}
	// Position 1 with q ⟂ both keys' difference: equal scores, the mean of
	// v0 and v1. Position 3's key (9, 9) would dominate if it were read.
	got, err = attention(t, []float32{1, 1}, cache, 4, 1, 1)
	if err != nil || got[0] != 4 || got[1] != 6 {
		t.Fatalf("position 1: %v, %v; want [4 6]", got, err)
	}
	// Position 2, q = (ln 2, 0), scale 1: scores ln2, 0, ln2 → weights
	// 2/5, 1/5, 2/5.
	got, err = attention(t, []float32{float32(math.Ln2), 0}, cache, 4, 2, 1)
	want := []float64{(2*2 + 6 + 2*10) / 5.0, (2*4 + 8 + 2*12) / 5.0}
	if err != nil || math.Abs(float64(got[0])-want[0]) > 1e-6 || math.Abs(float64(got[1])-want[1]) > 1e-6 {
		t.Fatalf("position 2: %v, %v; want %v", got, err, want)
	}
	// An inactive row: zeros, and nothing read (a cache of NaNs is fine).
	nan := float32(math.NaN())
	got, err = attention(t, []float32{1, 1}, []float32{nan, nan, nan, nan}, 4, kernels.InactiveRow, 1)
	if err != nil || got[0] != 0 || got[1] != 0 {
		t.Fatalf("inactive row: %v, %v; want [0 0]", got, err)
	}
}

func TestArgmaxByHand(t *testing.T) {
	mem := gputest.NewMapMemory()
	nan := float32(math.NaN())
	logits := mem.Alloc(f32s(
		1, 3, 3, 2, // a tie: the first index, the runner-up equal
		nan, -1, -5, -0.5, // NaN skipped
		nan, nan, nan, nan, // no number: index 0
	))
	next, top := mem.Alloc(make([]byte, 12)), mem.Alloc(make([]byte, 24))
	args := []gpu.Arg{gpu.Ptr(next), gpu.Ptr(top), gpu.Ptr(logits), gpu.I32(3), gpu.I32(4)}
	if err := spec(t, kernels.Argmax).Ref(mem, kernels.ArgmaxConfig(3), args); err != nil {
		t.Fatal(err)
	}
	ids := mem.Bytes(next)
	for r, want := range []int32{1, 3, 0} {
		if got := int32(binary.LittleEndian.Uint32(ids[4*r:])); got != want {
			t.Errorf("row %d: next %d, want %d", r, got, want)
		}
	}
	inf := float32(math.Inf(-1))
	if got, want := gpu.BytesToF32(mem.Bytes(top)), []float32{3, 3, -0.5, -1, inf, inf}; !slicesEqual(got, want) {
		t.Errorf("top = %v, want %v", got, want)
	}
	bad := kernels.ArgmaxConfig(3)
	bad.Block.X = 96
	if err := spec(t, kernels.Argmax).Ref(mem, bad, args); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("a block of 96 threads: %v, want ErrInvalidValue", err)
	}
}

func TestGeluValues(t *testing.T) {
	for _, c := range []struct{ x, want float64 }{
		{0, 0}, {1, 0.8411919906082768}, {-1, -0.15880800939172324}, {3, 2.996362607918227}, {-6, -8.43964897967453e-11},
	} {
		if got := kernels.Gelu(c.x); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("Gelu(%g) = %.12g, want %.12g", c.x, got, c.want)
		}
	}
}

func TestLayerNormByHand(t *testing.T) {
	mem := gputest.NewMapMemory()
	y := mem.Alloc(make([]byte, 16))
	x := mem.Alloc(f32s(1, 2, 3, 6)) // mean 3, variance (4+1+0+9)/4 = 3.5
	g, b := mem.Alloc(f32s(1, 2, 1, 1)), mem.Alloc(f32s(0, 0, 0, 10))
	args := []gpu.Arg{gpu.Ptr(y), gpu.Ptr(x), gpu.Ptr(g), gpu.Ptr(b), gpu.I32(1), gpu.I32(4), gpu.F32(0)}
	if err := spec(t, kernels.LayerNorm).Ref(mem, kernels.LayerNormConfig(1), args); err != nil {
		t.Fatal(err)
	}
	s := math.Sqrt(3.5)
	want := []float64{-2 / s, 2 * -1 / s, 0, 3/s + 10}
	for i, v := range gpu.BytesToF32(mem.Bytes(y)) {
		if math.Abs(float64(v)-want[i]) > 1e-6 {
			t.Errorf("y[%d] = %v, want %v", i, v, want[i])
		}
	}
}

func TestKVAppendByHand(t *testing.T) {
	mem := gputest.NewMapMemory()
	// Two layers (2·2·d = 8 floats a position), the launch over layer 1;
	// the third row is inactive.
	const d, npos, stride = 2, 3, 8
	q := mem.Alloc(make([]byte, 4*3*d))
	qkv := mem.Alloc(f32s(1, 2, 3, 4, 5, 6, 10, 20, 30, 40, 50, 60, 7, 7, 7, 7, 7, 7)) // three rows of [q|k|v]
	bias := mem.Alloc(f32s(0.5, 0.5, 1, 1, 2, 2))
	pos := mem.Alloc(i32s(2, 0, kernels.InactiveRow))
	c0, c1 := mem.Alloc(make([]byte, 4*stride*npos)), mem.Alloc(make([]byte, 4*stride*npos))
	args := []gpu.Arg{gpu.Ptr(q), gpu.Ptr(qkv), gpu.Ptr(bias), gpu.Ptr(pos), gpu.Ptr(c0), gpu.Ptr(c1)}
	for range 6 {
		args = append(args, gpu.Ptr(c0)) // the inactive row's cache among them: not written
	}
	args = append(args, gpu.I32(3), gpu.I32(d), gpu.I32(2), gpu.I32(1), gpu.I32(npos))
	if err := spec(t, kernels.KVAppend).Ref(mem, kernels.Elementwise(3*d), args); err != nil {
		t.Fatal(err)
	}
	check := func(name string, p gpu.DevicePtr, want ...float32) {
		t.Helper()
		if got := gpu.BytesToF32(mem.Bytes(p)); !slicesEqual(got, want) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	check("q", q, 1.5, 2.5, 10.5, 20.5, 7.5, 7.5)
	// Row 0 at position 2 of layer 1: floats 2·8 + 4 on, key then value.
	check("cache 0", c0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 5, 7, 8)
	check("cache 1", c1, 0, 0, 0, 0, 31, 41, 52, 62, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
}

func slicesEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestGPT2RefsRejectBadInput: ids and positions out of range, a bad sequence
// count, launches too small or without the shared memory they need all fail
// with ErrInvalidValue, saying what was wrong.
func TestGPT2RefsRejectBadInput(t *testing.T) {
	cache := make([]float32, 2*4*2)
	for _, c := range []struct {
		name string
		run  func() error
		want string
	}{
		{"attention position too large", func() error { _, err := attention(t, []float32{1, 1}, cache, 4, 4, 1); return err }, "position 4 outside"},
		{"attention position negative", func() error { _, err := attention(t, []float32{1, 1}, cache, 4, -2, 1); return err }, "position -2 outside"},
		{"attention shared memory", func() error {
			mem := gputest.NewMapMemory()
			p := mem.Alloc(make([]byte, 64))
			args := []gpu.Arg{gpu.Ptr(p), gpu.Ptr(p), gpu.Ptr(p)}
			for range 8 {
				args = append(args, gpu.Ptr(p))
			}
			args = append(args, gpu.I32(1), gpu.I32(1), gpu.I32(2), gpu.I32(1), gpu.I32(0), gpu.I32(4), gpu.F32(1))
			cfg := kernels.DecodeAttentionConfig(1, 1, 2, 4)
			cfg.SharedMem = 16
			return spec(t, kernels.DecodeAttention).Ref(mem, cfg, args)
		}, "shared memory"},
		{"attention cache too long", func() error {
			mem := gputest.NewMapMemory()
			p := mem.Alloc(make([]byte, 64))
			args := []gpu.Arg{gpu.Ptr(p), gpu.Ptr(p), gpu.Ptr(p)}
			for range 8 {
				args = append(args, gpu.Ptr(p))
			}
			args = append(args, gpu.I32(1), gpu.I32(1), gpu.I32(2), gpu.I32(1), gpu.I32(0), gpu.I32(20000), gpu.F32(1))
			return spec(t, kernels.DecodeAttention).Ref(mem, kernels.DecodeAttentionConfig(1, 1, 2, 20000), args)
		}, "more than the 49152"},
		{"attention nseq 9", func() error {
			mem := gputest.NewMapMemory()
			p := mem.Alloc(make([]byte, 64))
			args := []gpu.Arg{gpu.Ptr(p), gpu.Ptr(p), gpu.Ptr(p)}
			for range 8 {
				args = append(args, gpu.Ptr(p))
			}
			args = append(args, gpu.I32(9), gpu.I32(1), gpu.I32(2), gpu.I32(1), gpu.I32(0), gpu.I32(4), gpu.F32(1))
			return spec(t, kernels.DecodeAttention).Ref(mem, kernels.DecodeAttentionConfig(9, 1, 2, 4), args)
		}, "nseq = 9"},
		{"attention layer", func() error {
			mem := gputest.NewMapMemory()
			p := mem.Alloc(make([]byte, 64))
			args := []gpu.Arg{gpu.Ptr(p), gpu.Ptr(p), gpu.Ptr(p)}
			for range 8 {
				args = append(args, gpu.Ptr(p))
			}
			args = append(args, gpu.I32(1), gpu.I32(1), gpu.I32(2), gpu.I32(2), gpu.I32(2), gpu.I32(4), gpu.F32(1))
			return spec(t, kernels.DecodeAttention).Ref(mem, kernels.DecodeAttentionConfig(1, 1, 2, 4), args)
		}, "layer 2 outside [0, 2)"},
		{"embed token", func() error { return embed(t, 5, 0) }, "token id 5 outside [0, 5)"},
		{"embed position", func() error { return embed(t, 0, 3) }, "position 3 outside [0, 3)"},
		{"embed position -2", func() error { return embed(t, 0, -2) }, "position -2 outside [0, 3)"},
		{"layernorm grid", func() error {
			mem := gputest.NewMapMemory()
			p := mem.Alloc(make([]byte, 64))
			args := []gpu.Arg{gpu.Ptr(p), gpu.Ptr(p), gpu.Ptr(p), gpu.Ptr(p), gpu.I32(2), gpu.I32(4), gpu.F32(1e-5)}
			return spec(t, kernels.LayerNorm).Ref(mem, kernels.LayerNormConfig(1), args)
		}, "does not cover"},
		{"layernorm block", func() error {
			mem := gputest.NewMapMemory()
			p := mem.Alloc(make([]byte, 64))
			args := []gpu.Arg{gpu.Ptr(p), gpu.Ptr(p), gpu.Ptr(p), gpu.Ptr(p), gpu.I32(1), gpu.I32(4), gpu.F32(1e-5)}
			cfg := gpu.LaunchConfig{Grid: gpu.Dim3{X: 1, Y: 1, Z: 1}, Block: gpu.Dim3{X: 100, Y: 1, Z: 1}}
			return spec(t, kernels.LayerNorm).Ref(mem, cfg, args)
		}, "whole warps"},
	} {
		err := c.run()
		if !errors.Is(err, gpu.ErrInvalidValue) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrInvalidValue saying %q", c.name, err, c.want)
		}
	}
}

// embed runs Embed's reference on one row, vocab 5, 3 positions, d 2.
func embed(t *testing.T, tok, pos int32) error {
	mem := gputest.NewMapMemory()
	y := mem.Alloc(make([]byte, 8))
	wte, wpe := mem.Alloc(make([]byte, 4*5*2)), mem.Alloc(make([]byte, 4*3*2))
	args := []gpu.Arg{gpu.Ptr(y), gpu.Ptr(wte), gpu.Ptr(wpe), gpu.Ptr(mem.Alloc(i32s(tok))), gpu.Ptr(mem.Alloc(i32s(pos))),
		gpu.I32(1), gpu.I32(2), gpu.I32(5), gpu.I32(3)}
	return spec(t, kernels.Embed).Ref(mem, kernels.Elementwise(2), args)
}
