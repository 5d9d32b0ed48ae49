package kernels_test

import (
	"encoding/binary"
	"errors"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/gputest"
	"github.com/stablegraph/stablegraph/kernels"
)

// TestPhiloxKnownAnswers: Random123's known answers for Philox4x32-10.
func TestPhiloxKnownAnswers(t *testing.T) {
	for _, c := range []struct {
		ctr  [4]uint32
		key  [2]uint32
		want [4]uint32
	}{
		{[4]uint32{}, [2]uint32{}, [4]uint32{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
		{[4]uint32{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, [2]uint32{0xffffffff, 0xffffffff},
			[4]uint32{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
		{[4]uint32{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, [2]uint32{0xa4093822, 0x299f31d0},
			[4]uint32{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
	} {
		if got := kernels.Philox4x32(c.ctr, c.key); got != c.want {
			t.Errorf("Philox4x32(%x, %x) = %x, want %x", c.ctr, c.key, got, c.want)
		}
	}
}

// TestGumbelNoise: the noise is −log(−log(u)) to a few units in the last
// place (its logarithm is written out so that CUDA computes the same
// bits), u is strictly inside (0, 1), and a draw's tokens get different
// noise.
func TestGumbelNoise(t *testing.T) {
	seen := map[float64]bool{}
	for i := range uint32(20000) {
		seed, seq, index, id := uint64(i)*0x9e3779b97f4a7c15, i%7, i/7%13, i*31
		u := kernels.GumbelUniform(seed, seq, index, id)
		if !(u > 0 && u < 1) {
			t.Fatalf("uniform %v outside (0, 1)", u)
		}
		g := kernels.GumbelNoise(seed, seq, index, id)
		want := -math.Log(-math.Log(u))
		if d := math.Abs(g - want); d > 8e-16*math.Max(1, math.Abs(want)) {
			t.Errorf("noise of u = %v: %v, math.Log gives %v (off by %.3g)", u, g, want, d)
		}
		seen[g] = true
	}
	if len(seen) < 19990 {
		t.Errorf("%d distinct noises out of 20000", len(seen))
	}
	if a, b := kernels.GumbelNoise(1, 2, 3, 4), kernels.GumbelNoise(1, 2, 3, 5); a == b {
		t.Errorf("tokens 4 and 5 of one draw get the same noise %v", a)
	}
}

// TestSampleSourceConstants: the CUDA source's series coefficients are
// the doubles 1/(2i+1) the reference uses, so that device and host
// compute the noise alike.
func TestSampleSourceConstants(t *testing.T) {
	src, err := os.ReadFile("cuda/kernels.cu")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)sg_glog_c\[12\] = \{(.*?)\};`).FindSubmatch(src)
	if m == nil {
		t.Fatal("kernels.cu has no sg_glog_c[12] table")
	}
	var vals []float64
	for _, f := range strings.Split(string(m[1]), ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			t.Fatal(err)
		}
		vals = append(vals, v)
	}
	if len(vals) != 12 {
		t.Fatalf("%d coefficients, want 12", len(vals))
	}
	for i, v := range vals {
		if want := 1 / float64(2*i+1); v != want {
			t.Errorf("coefficient %d is %v, want %v", i, v, want)
		}
	}
}

// sampleRun runs Sample's reference over rows of logits with the params
// given, and returns draw, cand (ids and values) and stats.
func sampleRun(t *testing.T, logits []float32, vocab, kmax int, params []kernels.SampleParams) ([]int32, []int32, []float32, []float64) {
	t.Helper()
	rows := len(params)
	mem := gputest.NewMapMemory()
	raw := make([]byte, rows*kernels.SampleParamBytes)
	for r, p := range params {
		p.Put(raw[r*kernels.SampleParamBytes:])
	}
	draw, cand, stats := mem.Alloc(make([]byte, 4*rows)), mem.Alloc(make([]byte, 8*rows*kmax)), mem.Alloc(make([]byte, 16*rows))
	args := []gpu.Arg{gpu.Ptr(draw), gpu.Ptr(cand), gpu.Ptr(stats), gpu.Ptr(mem.Alloc(f32s(logits...))), gpu.Ptr(mem.Alloc(raw)),
		gpu.I32(int32(rows)), gpu.I32(int32(vocab)), gpu.I32(int32(kmax))}
	if err := spec(t, kernels.Sample).Ref(mem, kernels.SampleConfig(rows), args); err != nil {
		t.Fatal(err)
	}
	d := mem.Bytes(draw)
	c := mem.Bytes(cand)
	s := mem.Bytes(stats)
	draws := make([]int32, rows)
	for r := range draws {
		draws[r] = int32(binary.LittleEndian.Uint32(d[4*r:]))
	}
	ids, vals := make([]int32, rows*kmax), make([]float32, rows*kmax)
	for i := range ids {
		ids[i] = int32(binary.LittleEndian.Uint32(c[8*i:]))
		vals[i] = math.Float32frombits(binary.LittleEndian.Uint32(c[8*i+4:]))
	}
	st := make([]float64, 2*rows)
	for i := range st {
		st[i] = math.Float64frombits(binary.LittleEndian.Uint64(s[8*i:]))
	}
	return draws, ids, vals, st
}

// TestSampleDrawDistribution: the device sampler's draws follow
// softmax(logits/T): 12,000 draws (rows of one launch, each its own token
// index) at two temperatures pass a chi-square test at the 0.1% level, and
// the same draws fail it against the softmax at the other temperature (so
// the test can fail). NaN and −Inf logits are never drawn. The seed is
// fixed: the outcome is the same every run.
func TestSampleDrawDistribution(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(-1))
	row := []float32{0, 0.5, nan, 1, 1.5, inf, 2, 3}
	const rows = 12000
	counts := map[float64][]int{}
	for _, temp := range []float64{0.7, 1.6} {
		logits := make([]float32, 0, rows*len(row))
		params := make([]kernels.SampleParams, rows)
		for r := range params {
			logits = append(logits, row...)
			params[r] = kernels.SampleParams{Seed: 42, Seq: uint32(r % 5), Index: uint32(r), Temperature: temp, Flags: kernels.SampleDraw}
		}
		draws, _, _, _ := sampleRun(t, logits, len(row), 1, params)
		n := make([]int, len(row))
		for _, d := range draws {
			n[d]++
		}
		if n[2] != 0 || n[5] != 0 {
			t.Errorf("T=%g: NaN drawn %d times, −Inf %d times", temp, n[2], n[5])
		}
		counts[temp] = n
	}
	chi2 := func(n []int, temp float64) float64 {
		var z float64
		for _, v := range row {
			if v == v {
				z += math.Exp(float64(v) / temp)
			}
		}
		var x float64
		for j, v := range row {
			if v != v || math.IsInf(float64(v), -1) {
				continue
			}
			e := rows * math.Exp(float64(v)/temp) / z
			x += (float64(n[j]) - e) * (float64(n[j]) - e) / e
		}
		return x
	}
	// Six outcomes: five degrees of freedom; P(χ² > 20.52) = 0.001.
	const crit = 20.52
	for temp, other := range map[float64]float64{0.7: 1.6, 1.6: 0.7} {
		if x := chi2(counts[temp], temp); x > crit {
			t.Errorf("T=%g: counts %v, χ² = %.1f against softmax(l/%g) (> %.2f)", temp, counts[temp], x, temp, crit)
		}
		if x := chi2(counts[temp], other); x < 10*crit {
			t.Errorf("T=%g: counts %v fit softmax(l/%g) too (χ² = %.1f): the test has no power", temp, counts[temp], other, x)
		}
	}
}

// TestSampleByHand: candidates are the largest logits, the lower id first
// on a tie and NaN last, padded past the vocabulary; stats are the row's
// max and Σ exp((l − max)/T); rows without flags get −1 and −Inf; a draw
// at temperature 0 is the argmax; a draw depends on its (seed, sequence,
// index) alone, not on its row.
func TestSampleByHand(t *testing.T) {
	nan := float32(math.NaN())
	logits := []float32{
		1, 3, 3, nan, 2, // a tie at the top, a NaN
		1, 3, 3, nan, 2,
		0, 0, 0, 0, 0,
	}
	p := []kernels.SampleParams{
		{Temperature: 2, Flags: kernels.SampleCandidates},
		{Temperature: 0, Flags: kernels.SampleDraw | kernels.SampleCandidates},
		{Temperature: 1},
	}
	draws, ids, vals, st := sampleRun(t, logits, 5, 7, p)
	if want := []int32{-1, 1, -1}; !slicesEqual32(draws, want) {
		t.Errorf("draws %v, want %v", draws, want)
	}
	if want := []int32{1, 2, 4, 0, 3, -1, -1}; !slicesEqual32(ids[:7], want) {
		t.Errorf("row 0 candidates %v, want %v", ids[:7], want)
	}
	if v := vals[:7]; v[0] != 3 || v[2] != 2 || v[3] != 1 || v[4] == v[4] || !math.IsInf(float64(v[5]), -1) {
		t.Errorf("row 0 candidate values %v", v)
	}
	if z := 2 + math.Exp(-0.5) + math.Exp(-1); st[0] != 3 || math.Abs(st[1]-z) > 1e-15 {
		t.Errorf("row 0 stats %v, want [3 %v]", st[:2], z)
	}
	if z := 2 + math.Exp(-1) + math.Exp(-2); math.Abs(st[3]-z) > 1e-15 {
		t.Errorf("row 1 (temperature 0: sums at 1) Z = %v, want %v", st[3], z)
	}
	for i := 14; i < 21; i++ {
		if ids[i] != -1 || !math.IsInf(float64(vals[i]), -1) {
			t.Errorf("row 2, without flags: candidate %d is (%d, %v)", i-14, ids[i], vals[i])
		}
	}
	if !math.IsInf(st[4], -1) || st[5] != 0 {
		t.Errorf("row 2 stats %v, want [-Inf 0]", st[4:])
	}
	// The same draw in another row, among other rows, gives the same token.
	q := kernels.SampleParams{Seed: 7, Seq: 3, Index: 11, Temperature: 1.3, Flags: kernels.SampleDraw}
	row := make([]float32, 300)
	for j := range row {
		row[j] = float32(j%17) / 4
	}
	alone, _, _, _ := sampleRun(t, row, 300, 1, []kernels.SampleParams{q})
	other := q
	other.Index++
	three, _, _, _ := sampleRun(t, append(append(append([]float32(nil), row...), row...), row...), 300, 1, []kernels.SampleParams{other, other, q})
	if three[2] != alone[0] {
		t.Errorf("draw %+v: %d alone, %d in row 2 of three", q, alone[0], three[2])
	}
	if want := kernels.SampleDrawRow(row, q); alone[0] != want {
		t.Errorf("draw %d, SampleDrawRow %d", alone[0], want)
	}
}

func slicesEqual32(a, b []int32) bool {
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

// TestSampleRejects: kmax out of range, a block that is not a power of
// two and a grid short of the rows fail with ErrInvalidValue.
func TestSampleRejects(t *testing.T) {
	mem := gputest.NewMapMemory()
	buf := mem.Alloc(make([]byte, 1<<14))
	args := func(rows, vocab, kmax int) []gpu.Arg {
		return []gpu.Arg{gpu.Ptr(buf), gpu.Ptr(buf), gpu.Ptr(buf), gpu.Ptr(buf), gpu.Ptr(buf), gpu.I32(int32(rows)), gpu.I32(int32(vocab)), gpu.I32(int32(kmax))}
	}
	odd := kernels.SampleConfig(1)
	odd.Block.X = 96
	for _, c := range []struct {
		cfg  gpu.LaunchConfig
		args []gpu.Arg
		want string
	}{
		{kernels.SampleConfig(1), args(1, 4, 0), "kmax = 0"},
		{kernels.SampleConfig(1), args(1, 4, kernels.SampleMaxK+1), "kmax = 257"},
		{odd, args(1, 4, 2), "power of two"},
		{kernels.SampleConfig(1), args(2, 4, 2), "does not cover"},
		{kernels.SampleConfig(1), args(1, 0, 2), "vocab = 0"},
	} {
		if err := spec(t, kernels.Sample).Ref(mem, c.cfg, c.args); !errors.Is(err, gpu.ErrInvalidValue) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want ErrInvalidValue saying %q", c.args, err, c.want)
		}
	}
}
