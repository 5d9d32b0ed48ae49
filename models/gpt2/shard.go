package gpt2

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Tensor parallelism (Megatron-LM's split of a transformer block; doc.go).
//
// A Shard of R ranks holds, of every block, heads/R attention heads and
// 4d/R MLP columns:
//
//   - c_attn (d → 3d) and c_fc (d → 4d) are column-parallel: the rank
//     holds its columns of the weight and of the bias. c_attn's columns
//     are three blocks, q, k and v, each split in R, so that the rank's
//     part is again [q | k | v], each d/R wide: its heads' queries, keys
//     and values, which the decode kernels take as they take the whole
//     model's with d/R for d and heads/R for heads.
//   - attn.c_proj (d → d) and mlp.c_proj (4d → d) are row-parallel: the
//     rank holds the rows that multiply its columns, and its product is a
//     partial sum of the whole model's. One all-reduce (sum) per
//     projection adds the ranks' partial sums, after which every rank
//     holds the same result, and the bias is added once, after the
//     all-reduce (BiasResidual), so the biases are whole on every rank.
//   - The embeddings, the layer norms and the LM head (the token embedding)
//     are replicated: every rank computes the same residual stream and the
//     same logits. A column-split LM head would read a fraction of the
//     embedding per token but need an all-gather of every row's logits
//     (one more collective a token, and GPT-2's vocabulary of 50257 padded
//     to a multiple of R) and a pass to interleave the ranks' columns;
//     at batch 1, a token's 24 all-reduces already cost more than the
//     whole head (docs/MULTI-GPU.md), so the head stays whole.
//
// A rank's KV cache holds its heads only: position t of layer l at
// (t·layers + l)·2·(d/R) floats, the keys of its d/R columns then their
// values (Shard.Stride).

// Split says how a tensor-parallel shard takes its part of a weight.
type Split uint8

const (
	// Replicated: every rank holds the whole tensor.
	Replicated Split = iota
	// Columns: the tensor's last dimension is Groups blocks of equal
	// width, and the rank holds its R-th of each block, in order.
	Columns
	// Rows: the rank holds its R-th of the first dimension.
	Rows
)

func (s Split) String() string {
	switch s {
	case Replicated:
		return "replicated"
	case Columns:
		return "columns"
	case Rows:
		return "rows"
	}
	return fmt.Sprintf("Split(%d)", int(s))
}

// splitOf is how weight name (as in Specs) is split, and its column
// groups.
func splitOf(name string) (Split, int) {
	switch {
	case strings.HasSuffix(name, ".attn.c_attn.weight"), strings.HasSuffix(name, ".attn.c_attn.bias"):
		return Columns, 3
	case strings.HasSuffix(name, ".mlp.c_fc.weight"), strings.HasSuffix(name, ".mlp.c_fc.bias"):
		return Columns, 1
	case strings.HasSuffix(name, ".attn.c_proj.weight"), strings.HasSuffix(name, ".mlp.c_proj.weight"):
		return Rows, 1
	}
	return Replicated, 1
}

// ranks is the number of ranks, 1 for the zero Shard.
func (s Shard) ranks() int { return max(s.Ranks, 1) }

// Whole reports whether s is the whole model (one rank).
func (s Shard) Whole() bool { return s.ranks() == 1 }

func (s Shard) String() string {
	if s.Whole() {
		return "the whole model"
	}
	return fmt.Sprintf("tensor-parallel rank %d of %d", s.Rank, s.Ranks)
}

// Check reports a shard that does not split c: a rank out of range, or
// heads that do not divide by the ranks. (The MLP columns, 4·width =
// 4·heads·headDim, divide whenever the heads do.) The error wraps
// ErrTensorParallel.
func (s Shard) Check(c Config) error {
	n := s.ranks()
	switch {
	case s.Ranks < 0 || s.Rank < 0 || s.Rank >= n:
		return fmt.Errorf("%w: rank %d of %d", ErrTensorParallel, s.Rank, s.Ranks)
	case n == 1:
		return nil
	case c.Heads%n != 0:
		return fmt.Errorf("%w: %d heads do not split over %d ranks", ErrTensorParallel, c.Heads, n)
	}
	return nil
}

// Heads is the number of attention heads the shard computes.
func (s Shard) Heads(c Config) int { return c.Heads / s.ranks() }

// Width is the shard's attention width: the columns of its queries, keys
// and values (its heads times the head dimension), and of its KV cache.
func (s Shard) Width(c Config) int { return s.Heads(c) * c.HeadDim() }

// Inner is the shard's MLP columns.
func (s Shard) Inner(c Config) int { return 4 * c.Width / s.ranks() }

// Stride is the floats between two positions of the shard's KV cache.
func (s Shard) Stride(c Config) int { return c.Layers * 2 * s.Width(c) }

// CacheBytes is the size of the shard's KV cache of a sequence holding
// positions positions (Config.CacheBytes for the whole model).
func (s Shard) CacheBytes(c Config, positions int) int64 {
	return int64(positions) * int64(s.Stride(c)) * 4
}

// shardSpec is sp's spec for shard s (a Specs entry of the whole model).
func shardSpec(sp Spec, s Shard) Spec {
	split, _ := splitOf(sp.Name)
	sp.Shape = slices.Clone(sp.Shape)
	n := int64(s.ranks())
	switch split {
	case Columns:
		sp.Shape[len(sp.Shape)-1] /= n
	case Rows:
		sp.Shape[0] /= n
	}
	return sp
}

// sliceTensor returns shard s's part of t, a tensor of the whole model
// whose spec is whole and shard's is part.
func sliceTensor(t Tensor, whole, part Spec, s Shard) (Tensor, error) {
	if !slices.Equal(t.Shape, whole.Shape) || int64(len(t.Data)) != 4*whole.Elements() {
		return Tensor{}, fmt.Errorf("gpt2: tensor %q has shape %v and %d bytes, the whole model's is %v", t.Name, t.Shape, len(t.Data), whole.Shape)
	}
	out := Tensor{Name: t.Name, Shape: slices.Clone(part.Shape)}
	split, groups := splitOf(t.Name)
	n, r := int64(s.ranks()), int64(s.Rank)
	switch split {
	case Replicated:
		out.Data = slices.Clone(t.Data)
	case Rows:
		rowBytes := 4 * whole.Elements() / whole.Shape[0]
		rows := whole.Shape[0] / n
		out.Data = slices.Clone(t.Data[r*rows*rowBytes : (r+1)*rows*rowBytes])
	case Columns:
		cols := whole.Shape[len(whole.Shape)-1]
		block := cols / int64(groups) // a group's columns
		part := block / n             // the rank's columns of a group
		rows := whole.Elements() / cols
		out.Data = make([]byte, 0, 4*part*int64(groups)*rows)
		for row := range rows {
			for g := range int64(groups) {
				from := 4 * (row*cols + g*block + r*part)
				out.Data = append(out.Data, t.Data[from:from+4*part]...)
			}
		}
	}
	return out, nil
}

// Shard returns the weights rank s.Rank of a tensor-parallel group of
// s.Ranks holds, sliced from w, which must be the whole model (Specs'
// shapes of the shard; Split says which part of each tensor). The
// tensors' bytes are copied: w is left as it is.
func (w *Weights) Shard(s Shard) (*Weights, error) {
	if !w.Part.Whole() {
		return nil, fmt.Errorf("gpt2: weights of %s cannot be split again: slice the whole model's", w.Part)
	}
	if err := s.Check(w.Config); err != nil {
		return nil, err
	}
	whole, err := Specs(w.Config, Shard{})
	if err != nil {
		return nil, err
	}
	if len(w.Tensors) != len(whole) {
		return nil, fmt.Errorf("gpt2: %d tensors, the model has %d", len(w.Tensors), len(whole))
	}
	out := &Weights{Config: w.Config, Part: s, Source: w.Source}
	if !s.Whole() {
		out.Source += fmt.Sprintf(", %s", s)
	}
	for i, t := range w.Tensors {
		if t.Name != whole[i].Name {
			return nil, fmt.Errorf("gpt2: tensor %d is %q, the model's is %q", i, t.Name, whole[i].Name)
		}
		part, err := sliceTensor(t, whole[i], shardSpec(whole[i], s), s)
		if err != nil {
			return nil, err
		}
		out.Tensors = append(out.Tensors, part)
	}
	return out, nil
}

// errNoComm is a tensor-parallel step without its communicator.
var errNoComm = errors.New("a tensor-parallel step needs its group's communicator (Step.Comm), for the all-reduces")
