package workload

import (
	"errors"
	"fmt"
	"math/rand/v2"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/safetensors"
)

// seqCaller is the part of a Caller that plays a serving loop around a
// gpt2-decode workload. The caller owns sequences, each with a KV cache in
// its region (a bfc allocation that lives as long as the sequence, holding
// the prefix the sequence has seen: gpt2Model.initialCache). Every step binds
// each batch row's cache param (kv0, kv1, …) to the cache of the sequence in
// that row, and writes the rows' tokens and positions. The step appends to
// the caches, so their contents carry over from step to step, as a real
// decode loop's do.
//
// By pattern (the tokens, positions and logits buffers move as the generic
// Caller moves them; Swap moves them as PingPong):
//
//   - fixed, pingpong: batch-many sequences, row r always holds sequence r,
//     every cache stays where it is.
//   - swap: batch + k sequences (k = swapsPerStep: a quarter of the batch,
//     at least one); from the second step on, every step gives k random
//     rows the k sequences that were out of the batch, so k cache bindings
//     change per step.
//   - random: batch-many sequences in fixed rows, but from the second step
//     on every cache moves to a new allocation (its contents copied over)
//     before the step, so every binding is a fresh address every step.
//
// The first step of every pattern has row r holding sequence r, so a
// one-step run is the same decode whatever the pattern.
type seqCaller struct {
	c     *Caller
	m     *gpt2Model
	seqs  []gpu.DevicePtr // each sequence's cache
	rows  []int           // the sequence in each batch row
	idle  []int           // swap: the sequences out of the batch
	rng   *rand.Rand
	bound int // Bind calls so far
	last  []safetensors.Tensor
}

// swapsPerStep is how many rows of a batch of B get another sequence per
// step under Swap.
func swapsPerStep(batch int) int { return max(1, batch/4) }

// seqCount is how many sequences a caller with pattern keeps.
func seqCount(m *gpt2Model, pattern Pattern) int {
	if pattern == Swap {
		return m.shape.batch + swapsPerStep(m.shape.batch)
	}
	return m.shape.batch
}

// seqRegion is the room a caller's region needs for w's sequences: their
// caches, and under Random as many again plus two for the moves (a cache is
// copied to a new allocation before the old one is freed, between the
// fillers).
func seqRegion(w *Workload, pattern Pattern) uint64 {
	if w.gpt2 == nil {
		return 0
	}
	n := uint64(seqCount(w.gpt2, pattern))
	if pattern == Random {
		n = 2*n + 2
	}
	return n * gpu.RoundUp(uint64(4*w.gpt2.cacheFloats()), 256)
}

// newSeqCaller allocates and fills the sequences' caches in c's region. On
// error the caller frees the region, and with it every cache.
func newSeqCaller(c *Caller, seed uint64) (*seqCaller, error) {
	m := c.w.gpt2
	sc := &seqCaller{c: c, m: m, rng: rand.New(rand.NewPCG(seed, 0x5e9ca11))}
	for seq := range seqCount(m, c.pattern) {
		p, err := c.alloc.Alloc(uint64(4 * m.cacheFloats()))
		if err != nil {
			return nil, fmt.Errorf("workload: KV cache of sequence %d: %w", seq, err)
		}
		sc.seqs = append(sc.seqs, p)
		if err := sc.fill(seq, p); err != nil {
			return nil, err
		}
		if seq < m.shape.batch {
			sc.rows = append(sc.rows, seq)
		} else {
			sc.idle = append(sc.idle, seq)
		}
	}
	return sc, nil
}

// fill writes sequence seq's initial cache at p: zeros, then its prefix.
func (sc *seqCaller) fill(seq int, p gpu.DevicePtr) error {
	b := sc.c.b
	if err := b.Memset(gpu.Memset{Dst: p, ElemSize: 4, Count: uint64(sc.m.cacheFloats())}); err != nil {
		return fmt.Errorf("workload: clear the KV cache of sequence %d: %w", seq, err)
	}
	for _, blk := range sc.m.prefixBlocks(seq) {
		if err := b.MemcpyHtoD(p.Add(uint64(4*blk.off)), blk.data); err != nil {
			return fmt.Errorf("workload: write the KV cache of sequence %d: %w", seq, err)
		}
	}
	return nil
}

// bind moves the sequences on to step (a swap or a move of every cache,
// from the second call on), binds each row's cache and writes the rows'
// tokens and positions into their params, already bound in bind.
func (sc *seqCaller) bind(step int, bind sg.Bindings) error {
	if sc.bound > 0 {
		switch sc.c.pattern {
		case Swap:
			sc.swap()
		case Random:
			if err := sc.move(); err != nil {
				return err
			}
		case Fixed:
			if sc.c.shadow {
				if err := sc.shadowMove(); err != nil {
					return err
				}
			}
		}
	}
	sc.bound++
	m := sc.m
	for r, seq := range sc.rows {
		bind[m.caches[r]] = sc.seqs[seq]
	}
	tokens, positions := m.tokenBytes(step, sc.rows), m.positionBytes(sc.rows)
	for _, in := range []struct {
		buf  sg.Buffer
		data []byte
	}{{m.tokens, tokens}, {m.positions, positions}} {
		if err := sc.c.b.MemcpyHtoD(bind[in.buf], in.data); err != nil {
			return fmt.Errorf("workload: write input %s of step %d: %w", in.buf.Name(), step, err)
		}
	}
	rows := make([]int32, len(sc.rows))
	for r, seq := range sc.rows {
		rows[r] = int32(seq)
	}
	b := int64(len(rows))
	sc.last = []safetensors.Tensor{
		{Name: "tokens", DType: "I32", Shape: []int64{b}, Data: tokens},
		{Name: "positions", DType: "I32", Shape: []int64{b}, Data: positions},
		{Name: "sequences", DType: "I32", Shape: []int64{b}, Data: i32Bytes(rows)},
	}
	return nil
}

// swap gives swapsPerStep random rows the sequences out of the batch.
func (sc *seqCaller) swap() {
	for j, r := range sc.rng.Perm(len(sc.rows))[:len(sc.idle)] {
		sc.rows[r], sc.idle[j] = sc.idle[j], sc.rows[r]
	}
}

// move copies every cache to a new allocation and frees the old one. The
// previous step must be complete.
func (sc *seqCaller) move() error {
	for seq, old := range sc.seqs {
		p, err := sc.copyCache(seq, old)
		if err != nil {
			return fmt.Errorf("workload: move the KV cache of sequence %d: %w", seq, err)
		}
		if err := sc.c.alloc.Free(old); err != nil {
			return fmt.Errorf("workload: free the old KV cache of sequence %d: %w", seq, err)
		}
		sc.seqs[seq] = p
	}
	return nil
}

// shadowMove copies every cache to a new allocation, as move does, and
// frees the copy: the caches stay where they are (ShadowMoves).
func (sc *seqCaller) shadowMove() error {
	for seq, old := range sc.seqs {
		p, err := sc.copyCache(seq, old)
		if err == nil {
			err = sc.c.alloc.Free(p)
		}
		if err != nil {
			return fmt.Errorf("workload: shadow the move of the KV cache of sequence %d: %w", seq, err)
		}
	}
	return nil
}

// copyCache copies sequence seq's cache at old to a new allocation and
// returns it; on error nothing new is left allocated.
func (sc *seqCaller) copyCache(seq int, old gpu.DevicePtr) (gpu.DevicePtr, error) {
	size := uint64(4 * sc.m.cacheFloats())
	p, err := sc.c.alloc.Alloc(size)
	if err != nil {
		return 0, err
	}
	if err := sc.c.b.MemcpyDtoD(p, old, size); err != nil {
		return 0, errors.Join(err, sc.c.alloc.Free(p))
	}
	return p, nil
}

// lastInputs are the inputs the caller wrote for its last bound step, as
// tensors named after their params: what Run's dump holds besides the
// outputs. For gpt2-decode: tokens, positions and the sequence in each row;
// otherwise every param, float32.
func (c *Caller) lastInputs(step int) []safetensors.Tensor {
	if c.seq != nil {
		return c.seq.last
	}
	var ts []safetensors.Tensor
	for i, buf := range c.w.Params {
		data := c.w.Input(step, i)
		ts = append(ts, safetensors.Tensor{Name: buf.Name(), DType: "F32", Shape: []int64{int64(len(data) / 4)}, Data: data})
	}
	return ts
}

// outputTensors are a step's outputs as tensors named after their buffers:
// gpt2-decode's logits [batch, vocab], others flat float32.
func (w *Workload) outputTensors(outs [][]byte) []safetensors.Tensor {
	var ts []safetensors.Tensor
	for i, buf := range w.Outputs {
		shape := []int64{int64(len(outs[i]) / 4)}
		if w.gpt2 != nil {
			shape = []int64{int64(w.gpt2.shape.batch), int64(w.gpt2.shape.vocab)}
		}
		ts = append(ts, safetensors.Tensor{Name: buf.Name(), DType: "F32", Shape: shape, Data: outs[i]})
	}
	return ts
}
