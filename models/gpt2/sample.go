package gpt2

import (
	"container/heap"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"

	"github.com/stablegraph/stablegraph/kernels"
)

// Sampling says how a sequence's next token is chosen from its logits.
// The zero value is greedy decoding.
//
// A sampled token is a Gumbel-max draw: among the kept tokens S (all of
// them, or the top K, then the nucleus of TopP), the one of largest
// logit/Temperature + G, where G is Gumbel noise that depends on the
// seed, the sequence's index in the request list, the token's index in
// the sequence and the token id alone (kernels.GumbelNoise). That is an
// exact draw from softmax(logits/Temperature) renormalised over S, and
// the same tokens whichever way it is computed: on the device over the
// whole row, on the host from the device's candidates, or on the host
// from the whole row read back (doc.go, Sampling).
type Sampling struct {
	// Temperature divides the logits before the softmax; 0 is greedy
	// (the largest logit, the lowest id on a tie).
	Temperature float64
	// TopK keeps only the K most likely tokens (0 or the vocabulary:
	// all; more is refused).
	TopK int
	// TopP keeps the smallest set of most likely tokens whose
	// probabilities add up to at least TopP (nucleus sampling; 0 or 1:
	// all).
	TopP float64
	// Seed keys the sequence's noise (with its index in the request list
	// and each token's index), so that its tokens do not depend on which
	// sequences share its batch or where they are drawn.
	Seed uint64
}

// Greedy reports whether s picks the largest logit.
func (s Sampling) Greedy() bool { return s.Temperature == 0 }

// Check reports settings that cannot be sampled with: a temperature
// that is negative, infinite or NaN, a negative top-k, a top-p outside
// (0, 1] other than 0 (none). CheckRequest also refuses a top-k above the
// vocabulary.
func (s Sampling) Check() error {
	switch {
	case !(s.Temperature >= 0) || math.IsInf(s.Temperature, 1):
		return fmt.Errorf("gpt2: temperature %g: must be 0 (greedy) or positive", s.Temperature)
	case s.TopK < 0:
		return fmt.Errorf("gpt2: top-k %d is negative", s.TopK)
	case !(s.TopP >= 0 && s.TopP <= 1):
		return fmt.Errorf("gpt2: top-p %g outside (0, 1]", s.TopP)
	}
	return nil
}

// checkVocab is Check, and a top-k no larger than the vocabulary.
func (s Sampling) checkVocab(vocab int) error {
	if err := s.Check(); err != nil {
		return err
	}
	if s.TopK > vocab {
		return fmt.Errorf("gpt2: top-k %d is more than the vocabulary of %d tokens", s.TopK, vocab)
	}
	return nil
}

// cut is the top-k and top-p that s applies over a vocabulary of vocab
// tokens, 0 for none.
func (s Sampling) cut(vocab int) (k int, p float64) {
	if s.TopK > 0 && s.TopK < vocab {
		k = s.TopK
	}
	if s.TopP > 0 && s.TopP < 1 {
		p = s.TopP
	}
	return k, p
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

// candidate is a token and its logit.
type candidate struct {
	id int32
	v  float32
}

// draw is where a token was drawn, for Stats.
type draw uint8

const (
	drawNone       draw = iota
	drawDevice          // the device's draw over the whole row
	drawCandidates      // the host, from the device's candidates
	drawLogits          // the host, from the whole row read back
)

// scratch is one sequence's reusable memory for host draws.
type scratch struct {
	keys []uint64
	cand []candidate
	h    minHeap
}

// drawLogits draws token index of sequence seq from a whole row of logits:
// the kept set from the row, then the Gumbel-max draw over it. Temperature
// alone scans the row once; top-k selects the k largest with a heap; top-p
// alone sorts the row.
func (s Sampling) drawLogits(logits []float32, seq, index int, sc *scratch) int32 {
	k, p := s.cut(len(logits))
	c := sc.cand[:0]
	switch {
	case k == 0 && p == 0:
		return s.gumbelMax(nil, logits, seq, index)
	case k > 0:
		sc.h = sc.h[:0]
		for j, v := range logits {
			if v != v {
				continue
			}
			key := kernels.SampleKey(v, j)
			if len(sc.h) < k {
				heap.Push(&sc.h, key)
			} else if key > sc.h[0] {
				sc.h[0] = key
				heap.Fix(&sc.h, 0)
			}
		}
		sc.keys = append(sc.keys[:0], sc.h...)
	default:
		sc.keys = sc.keys[:0]
		for j, v := range logits {
			if v == v {
				sc.keys = append(sc.keys, kernels.SampleKey(v, j))
			}
		}
	}
	slices.Sort(sc.keys)
	for i := len(sc.keys) - 1; i >= 0; i-- {
		id := int32(^uint32(sc.keys[i]))
		c = append(c, candidate{id, logits[id]})
	}
	sc.cand = c
	tok, _ := s.drawSorted(c, true, 0, seq, index)
	return tok
}

// drawSorted draws token index of sequence seq from c, the largest logits
// of a row in kernels.SampleKey order with no NaN. complete says c holds
// every logit of the row that is not NaN; when it does not, z is the
// row's Σ exp((v − max)/T) (kernels.Sample's stats). ok is false when c
// does not hold the whole kept set: a top-k larger than c, or a nucleus
// that c's probabilities do not reach.
func (s Sampling) drawSorted(c []candidate, complete bool, z float64, seq, index int) (tok int32, ok bool) {
	if len(c) == 0 {
		return 0, complete
	}
	k, p := s.cut(math.MaxInt)
	if k > 0 {
		if k > len(c) && !complete {
			return 0, false
		}
		c = c[:min(k, len(c))]
		complete = true // the kept set so far is c
	}
	if m := float64(c[0].v); p > 0 && !math.IsInf(m, 0) {
		total := z
		if complete {
			total = 0
			for _, e := range c {
				total += math.Exp((float64(e.v) - m) / s.Temperature)
			}
		}
		var acc float64
		n := -1
		for i, e := range c {
			acc += math.Exp((float64(e.v) - m) / s.Temperature)
			if acc >= p*total {
				n = i + 1
				break
			}
		}
		switch {
		case n > 0:
			c = c[:n]
		case !complete:
			return 0, false
		}
	}
	return s.gumbelMax(c, nil, seq, index), true
}

// gumbelMax is the kept token of largest logit/T + noise, the lower id on
// a tie, NaN scores skipped: over c, or over every index of row when c is
// nil. 0 when no score is a number (as on the device). A long list is
// split over goroutines: the noise costs a few hundred nanoseconds a token
// on the host, 50,257 of them a row, and the device computes it in
// parallel too; the rule (larger score, then lower id) gives the same
// token however the list is split.
func (s Sampling) gumbelMax(c []candidate, row []float32, seq, index int) int32 {
	n := len(row)
	if c != nil {
		n = len(c)
	}
	chunks := 1
	if n >= 2*gumbelChunk {
		chunks = min(runtime.GOMAXPROCS(0), n/gumbelChunk)
	}
	bests := make([]scored, chunks)
	scan := func(k int) {
		b := scored{id: -1}
		for i := k * n / chunks; i < (k+1)*n/chunks; i++ {
			id, v := int32(i), float32(0)
			if c != nil {
				id, v = c[i].id, c[i].v
			} else {
				v = row[i]
			}
			sc := kernels.SampleScore(v, s.Temperature, kernels.GumbelNoise(s.Seed, uint32(seq), uint32(index), uint32(id)))
			if sc == sc {
				b = b.better(scored{id, sc})
			}
		}
		bests[k] = b
	}
	if chunks == 1 {
		scan(0)
	} else {
		var wg sync.WaitGroup
		for k := range chunks {
			wg.Go(func() { scan(k) })
		}
		wg.Wait()
	}
	best := scored{id: -1}
	for _, b := range bests {
		if b.id >= 0 {
			best = best.better(b)
		}
	}
	return max(best.id, 0)
}

// gumbelChunk is the fewest tokens gumbelMax gives a goroutine.
const gumbelChunk = 2048

// scored is a token and its Gumbel-max score (id −1: none yet).
type scored struct {
	id int32
	s  float64
}

// better is the winner of a and o: the larger score, the lower id on a tie.
func (a scored) better(o scored) scored {
	if a.id < 0 || o.s > a.s || o.s == a.s && o.id < a.id {
		return o
	}
	return a
}

// minHeap is a min-heap of kernels.SampleKey values: the k largest seen,
// smallest on top.
type minHeap []uint64

func (h minHeap) Len() int           { return len(h) }
func (h minHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h minHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *minHeap) Push(x any)        { *h = append(*h, x.(uint64)) }
func (h *minHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
