package gpt2

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Sampling says how a sequence's next token is chosen from its logits.
// The zero value is greedy decoding.
type Sampling struct {
	// Temperature divides the logits before the softmax; 0 is greedy
	// (the largest logit, the lowest id on a tie).
	Temperature float64
	// TopK keeps only the K most likely tokens (0: all).
	TopK int
	// TopP keeps the smallest set of most likely tokens whose
	// probabilities add up to at least TopP (nucleus sampling; 0 or 1:
	// all).
	TopP float64
	// Seed seeds the sequence's own random stream (with its index in the
	// request list), so that its tokens do not depend on which sequences
	// share its batch.
	Seed uint64
}

// Greedy reports whether s picks the largest logit.
func (s Sampling) Greedy() bool { return s.Temperature == 0 }

// Check reports settings that cannot be sampled with.
func (s Sampling) Check() error {
	switch {
	case !(s.Temperature >= 0) || math.IsInf(s.Temperature, 1):
		return fmt.Errorf("gpt2: temperature %g: must be 0 (greedy) or positive", s.Temperature)
	case s.TopK < 0:
		return fmt.Errorf("gpt2: top-k %d is negative", s.TopK)
	case !(s.TopP >= 0 && s.TopP <= 1):
		return fmt.Errorf("gpt2: top-p %g outside [0, 1]", s.TopP)
	}
	return nil
}

// ArgmaxLogits returns the index of the largest of logits, the lowest on a
// tie, skipping NaNs (kernels.Argmax's rule), and the gap between the two
// largest.
func ArgmaxLogits(logits []float32) (id int32, gap float32) {
	best, b1, b2 := 0, float32(math.Inf(-1)), float32(math.Inf(-1))
	for j, v := range logits {
		switch {
		case v != v:
		case v > b1:
			best, b1, b2 = j, v, b1
		case v > b2:
			b2 = v
		}
	}
	return int32(best), b1 - b2
}

// sampler draws one sequence's tokens.
type sampler struct {
	s   Sampling
	rng *rand.Rand
	// scratch, reused between draws
	cand []candidate
}

type candidate struct {
	id int32
	p  float64
}

func newSampler(s Sampling, seq int) *sampler {
	return &sampler{s: s, rng: rand.New(rand.NewPCG(s.Seed, uint64(seq)))}
}

// next draws a token from logits: the softmax of logits/Temperature,
// cut to the top K, then to the nucleus of TopP, renormalised. Ties in
// probability keep the lower id first, so the draw is a function of the
// logits and the stream alone.
func (sm *sampler) next(logits []float32) int32 {
	if sm.s.Greedy() {
		id, _ := ArgmaxLogits(logits)
		return id
	}
	m := math.Inf(-1)
	for _, v := range logits {
		if v == v {
			m = max(m, float64(v))
		}
	}
	c := sm.cand[:0]
	for j, v := range logits {
		if v == v {
			c = append(c, candidate{int32(j), math.Exp((float64(v) - m) / sm.s.Temperature)})
		}
	}
	sm.cand = c
	if len(c) == 0 {
		return 0
	}
	slices.SortFunc(c, func(a, b candidate) int {
		if a.p != b.p {
			return cmp.Compare(b.p, a.p)
		}
		return cmp.Compare(a.id, b.id)
	})
	if k := sm.s.TopK; k > 0 && k < len(c) {
		c = c[:k]
	}
	var total float64
	for _, e := range c {
		total += e.p
	}
	if p := sm.s.TopP; p > 0 && p < 1 {
		var acc float64
		for i, e := range c {
			acc += e.p
			if acc >= p*total {
				c = c[:i+1]
				break
			}
		}
		total = acc
	}
	u := sm.rng.Float64() * total
	for _, e := range c {
		if u < e.p {
			return e.id
		}
		u -= e.p
	}
	return c[len(c)-1].id
}
