package gpt2

import (
	"cmp"
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/kernels"
)

// topCandidates is what kernels.Sample gives the host for a row: its K
// largest logits in kernels.SampleKey order (NaNs dropped, as the Batcher
// drops them) and Z.
func topCandidates(row []float32, K int, temp float64) ([]candidate, float64) {
	keys := make([]uint64, len(row))
	for j, v := range row {
		keys[j] = kernels.SampleKey(v, j)
	}
	slices.SortFunc(keys, func(a, b uint64) int { return cmp.Compare(b, a) })
	var c []candidate
	for _, k := range keys[:min(K, len(keys))] {
		id := int32(^uint32(k))
		if v := row[id]; v == v {
			c = append(c, candidate{id, v})
		}
	}
	_, z := kernels.SampleStats(row, temp)
	return c, z
}

// TestCandidatesMatchWholeRow: drawing from the device's candidates gives
// the token the whole row gives, for every setting, whenever the
// candidates hold the tokens kept; they say they do not exactly when a
// top-k exceeds them or the nucleus reaches past them (checked here
// against the probabilities worked out independently). Both cases occur.
func TestCandidatesMatchWholeRow(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const V, K = 500, 16
	var decided, fellBack int
	for trial := range 400 {
		spread := []float64{0.3, 2, 6}[trial%3]
		row := make([]float32, V)
		for j := range row {
			row[j] = float32(r.NormFloat64() * spread)
		}
		row[r.IntN(V)] = float32(math.NaN())
		for _, s := range []Sampling{
			{Temperature: 0.8, TopK: 5}, {Temperature: 1.2, TopK: K}, {Temperature: 0.8, TopK: 40},
			{Temperature: 0.7, TopP: 0.5}, {Temperature: 1, TopP: 0.9}, {Temperature: 0.8, TopK: 12, TopP: 0.95},
			{Temperature: 0.8, TopK: 40, TopP: 0.95},
		} {
			s.Seed = uint64(trial)
			c, z := topCandidates(row, K, s.Temperature)
			var sc scratch
			whole := s.drawLogits(row, 3, trial, &sc)
			tok, ok := s.drawSorted(c, false, z, 3, trial)
			// Independently: do the top K hold the kept set?
			k, p := s.cut(V)
			want := k <= K
			if k == 0 && p > 0 {
				var acc float64
				for _, e := range c {
					acc += math.Exp((float64(e.v) - float64(c[0].v)) / s.Temperature)
				}
				want = acc >= p*z
			}
			if ok != want {
				t.Fatalf("trial %d, %+v: candidates decide %v, want %v", trial, s, ok, want)
			}
			if !ok {
				fellBack++
				continue
			}
			decided++
			if tok != whole {
				t.Errorf("trial %d, %+v: %d from the candidates, %d from the whole row", trial, s, tok, whole)
			}
		}
	}
	if decided < 100 || fellBack < 100 {
		t.Errorf("%d draws decided by the candidates, %d fell back: both paths should be exercised", decided, fellBack)
	}
}

// TestSamplerDistribution: the host's draws (which the device's equal
// token for token: TestCandidatesMatchWholeRow, TestDeviceSamplingMatchesHost)
// follow the softmax of logits/T renormalised over the tokens kept, worked
// out here independently by sorting the probabilities: temperature alone,
// top-k, top-p and both. 12,000 draws a setting (fixed seed: the outcome is
// the same every run) pass a chi-square test at the 0.1% level; tokens
// outside the kept set are never drawn, and the counts fail the test
// against the softmax without the cut (so it can fail).
func TestSamplerDistribution(t *testing.T) {
	row := []float32{2, 0.1, 1.5, 3, -1, 1, 2.5, 0, 0.5, -2}
	// P(χ² > c) = 0.001 for 1 to 9 degrees of freedom.
	crit := []float64{0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88}
	const n = 12000
	for _, c := range []struct {
		s    Sampling
		kept int // how many tokens the cut keeps (worked out by hand)
	}{
		{Sampling{Temperature: 1.4, Seed: 1}, 10},
		{Sampling{Temperature: 0.9, TopK: 4, Seed: 2}, 4},
		// Sorted at T = 0.9: 3, 2.5, 2, 1.5 hold 43.3%, 25.2%, 14.7%,
		// 8.6%: a nucleus of 0.75 needs three.
		{Sampling{Temperature: 0.9, TopP: 0.75, Seed: 3}, 3},
		{Sampling{Temperature: 0.9, TopK: 6, TopP: 0.7, Seed: 4}, 3},
		{Sampling{Temperature: 2, TopK: 9, TopP: 0.99, Seed: 5}, 9},
	} {
		s := c.s
		// Independently: the probabilities, sorted, cut to the top k and
		// then to the smallest prefix reaching p of what is left.
		ids := make([]int, len(row))
		for i := range ids {
			ids[i] = i
		}
		slices.SortFunc(ids, func(a, b int) int { return cmp.Compare(row[b], row[a]) })
		if s.TopK > 0 {
			ids = ids[:s.TopK]
		}
		w := make([]float64, len(ids))
		var sum float64
		for i, id := range ids {
			w[i] = math.Exp(float64(row[id]) / s.Temperature)
			sum += w[i]
		}
		kept, acc := len(ids), 0.0
		if s.TopP > 0 {
			kept = 0
			for kept < len(w) && acc < s.TopP*sum {
				acc += w[kept]
				kept++
			}
		}
		if kept != c.kept {
			t.Fatalf("%+v: the cut keeps %d, want %d", s, kept, c.kept)
		}
		var total float64
		for _, v := range w[:kept] {
			total += v
		}
		counts := map[int32]int{}
		var sc scratch
		for i := range n {
			counts[s.drawLogits(row, i%3, i, &sc)]++
		}
		var x, xAll float64
		var zAll float64
		for _, v := range row {
			zAll += math.Exp(float64(v) / s.Temperature)
		}
		for i, id := range ids[:kept] {
			e := n * w[i] / total
			d := float64(counts[int32(id)]) - e
			x += d * d / e
			eAll := n * w[i] / zAll
			xAll += (float64(counts[int32(id)]) - eAll) * (float64(counts[int32(id)]) - eAll) / eAll
		}
		for j := range row {
			if !slices.Contains(ids[:kept], j) {
				if counts[int32(j)] != 0 {
					t.Errorf("%+v: token %d, outside the kept set, drawn %d times", s, j, counts[int32(j)])
				}
				eAll := n * math.Exp(float64(row[j])/s.Temperature) / zAll
				xAll += eAll // (0 − e)²/e
			}
		}
		if x > crit[kept-1] {
			t.Errorf("%+v: χ² = %.1f over the %d kept tokens (> %.2f)", s, x, kept, crit[kept-1])
		}
		if kept < len(row) && xAll < 3*crit[len(row)-1] {
			t.Errorf("%+v: the counts fit the softmax without the cut too (χ² = %.1f): the test has no power", s, xAll)
		}
	}
}

// TestDeviceSamplingMatchesHost: on sim, a batch sampled on the device
// (a draw over the row for temperature alone, the candidates for top-k and
// top-p, falling back to the logits when those do not hold the nucleus)
// gives the same tokens as the same batch drawn on the host from whole rows
// (Options.HostSampling), every draw counted where it was made; the draw
// reads back less.
func TestDeviceSamplingMatchesHost(t *testing.T) {
	b := openSim(t)
	w := microWeights(t)
	for _, c := range []struct {
		s    Sampling
		cand int
		// which counters of the device run must be positive
		device, candidates, fallbacks bool
	}{
		{Sampling{Temperature: 0.8, Seed: 1}, 0, true, false, false},
		{Sampling{Temperature: 0.8, TopK: 40, TopP: 0.95, Seed: 2}, 0, false, true, false},
		{Sampling{Temperature: 1.1, TopK: 5, Seed: 3}, 0, false, true, false},
		// The micro model's logits are flat: a nucleus of 0.9 needs far
		// more than 8 candidates.
		{Sampling{Temperature: 1, TopP: 0.9, Seed: 4}, 8, false, false, true},
		{Sampling{Temperature: 0.9, TopK: 20, Seed: 5}, 8, false, false, true},
	} {
		reqs := mixedRequests(c.s)
		dev := newBatcher(t, b, w, Options{Rows: 3, PrefillRows: 4, Candidates: c.cand})
		host := newBatcher(t, b, w, Options{Rows: 3, PrefillRows: 4, HostSampling: true})
		got, want := generate(t, dev, reqs), generate(t, host, reqs)
		total := 0
		for i := range reqs {
			total += len(want[i].Tokens)
			if !slices.Equal(got[i].Tokens, want[i].Tokens) {
				t.Errorf("%+v: sequence %d: %v on the device, %v on the host", c.s, i, got[i].Tokens, want[i].Tokens)
			}
		}
		ds, hs := dev.Stats(), host.Stats()
		if n := ds.DeviceDraws + ds.CandidateDraws + ds.Fallbacks + ds.HostDraws; n != int64(total) {
			t.Errorf("%+v: %d draws counted for %d tokens: %+v", c.s, n, total, ds)
		}
		if (ds.DeviceDraws > 0) != c.device || (ds.CandidateDraws > 0) != c.candidates || (ds.Fallbacks > 0) != c.fallbacks || ds.HostDraws != 0 {
			t.Errorf("%+v: device run drew %d on the device, %d from candidates, %d fell back, %d on the host", c.s,
				ds.DeviceDraws, ds.CandidateDraws, ds.Fallbacks, ds.HostDraws)
		}
		if hs.HostDraws != int64(total) || hs.DeviceDraws+hs.CandidateDraws+hs.Fallbacks != 0 {
			t.Errorf("%+v: host run: %+v", c.s, hs)
		}
		// (64 candidates of 8 bytes outweigh the micro model's 97 logits:
		// only the draw is compared.)
		if c.device && ds.ReadbackBytes*4 > hs.ReadbackBytes {
			t.Errorf("%+v: the device run read back %d bytes, the host run %d", c.s, ds.ReadbackBytes, hs.ReadbackBytes)
		}
	}
}

// TestSampledStrategies: device sampling gives the same tokens under auto
// and every strategy, those that copy or map the step's params (the
// sampling param among them) included, as under eager, with fresh and with
// unchanged params.
func TestSampledStrategies(t *testing.T) {
	b := openSim(t)
	w := microWeights(t)
	reqs := mixedRequests(Sampling{Temperature: 0.9, TopK: 30, Seed: 8})
	reqs = append(reqs, mixedRequests(Sampling{Temperature: 1.2, Seed: 9})...)
	reqs = append(reqs, mixedRequests(Sampling{})...)
	want := generate(t, newBatcher(t, b, w, Options{Rows: 3, PrefillRows: 4, Strategy: sg.StrategyEager}), reqs)
	for _, st := range []sg.Strategy{sg.StrategyAuto, sg.StrategyPatch, sg.StrategyUpdate, sg.StrategyStable, sg.StrategyPool, sg.StrategyDevice} {
		bt := newBatcher(t, b, w, Options{Rows: 3, PrefillRows: 4, Strategy: st})
		res, err := bt.Generate(context.Background(), reqs, nil)
		if err != nil {
			t.Fatalf("%s: %v", st, err)
		}
		for i := range reqs {
			if !slices.Equal(res[i].Tokens, want[i].Tokens) {
				t.Errorf("%s: sequence %d: %v, eager %v", st, i, res[i].Tokens, want[i].Tokens)
			}
		}
	}
}

// TestHostDrawEqualsKernel: over GPT-2's vocabulary (long enough that the
// host splits the row over goroutines), the host's temperature draw is the
// token of kernels.Sample's reference (the body sim runs and the CUDA
// kernel is checked against bit for bit), NaNs and −Infs among the
// logits; and a top-p whose nucleus is most of the row draws from the
// same noise as a one-goroutine scan over the kept set.
func TestHostDrawEqualsKernel(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 9))
	const V = EndOfText + 1
	row := make([]float32, V)
	for j := range row {
		switch r.IntN(60) {
		case 0:
			row[j] = float32(math.NaN())
		case 1:
			row[j] = float32(math.Inf(-1))
		default:
			row[j] = float32(r.NormFloat64() * 0.5)
		}
	}
	var sc scratch
	for trial := range 6 {
		s := Sampling{Temperature: []float64{0.3, 1, 2.5}[trial%3], Seed: uint64(trial) * 77}
		want := kernels.SampleDrawRow(row, kernels.SampleParams{Seed: s.Seed, Seq: uint32(trial), Index: uint32(40 + trial),
			Temperature: s.Temperature, Flags: kernels.SampleDraw})
		if got := s.drawLogits(row, trial, 40+trial, &sc); got != want {
			t.Errorf("%+v: host draws %d, kernels.Sample's reference %d", s, got, want)
		}
		s.TopP = 0.97
		got := s.drawLogits(row, trial, 40+trial, &sc)
		kept := sc.cand // drawLogits leaves the sorted row here; the nucleus is a prefix
		best, bs := int32(-1), math.Inf(-1)
		var total, acc float64
		m := float64(kept[0].v)
		for _, e := range kept {
			total += math.Exp((float64(e.v) - m) / s.Temperature)
		}
		for _, e := range kept {
			sc := kernels.SampleScore(e.v, s.Temperature, kernels.GumbelNoise(s.Seed, uint32(trial), uint32(40+trial), uint32(e.id)))
			if sc > bs || sc == bs && e.id < best {
				best, bs = e.id, sc
			}
			if acc += math.Exp((float64(e.v) - m) / s.Temperature); acc >= s.TopP*total {
				break
			}
		}
		if got != best {
			t.Errorf("%+v: host draws %d, a scan of the nucleus %d", s, got, best)
		}
	}
}
