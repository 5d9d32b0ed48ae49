package gpt2

import (
	"math"
	"strconv"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

// refModel is GPT-2's forward pass in float64, written from the model's
// definition (not from the step builder): the check that prefill and
// decode compute the same function.
type refModel struct {
	c Config
	w map[string][]float64
}

func newRef(w *Weights) *refModel {
	r := &refModel{c: w.Config, w: map[string][]float64{}}
	for _, t := range w.Tensors {
		v := gpu.BytesToF32(t.Data)
		f := make([]float64, len(v))
		for i, x := range v {
			f[i] = float64(x)
		}
		r.w[t.Name] = f
	}
	return r
}

func (r *refModel) layerNorm(x []float64, name string) []float64 {
	g, b := r.w[name+".weight"], r.w[name+".bias"]
	var mean, v float64
	for _, e := range x {
		mean += e
	}
	mean /= float64(len(x))
	for _, e := range x {
		v += (e - mean) * (e - mean)
	}
	rstd := 1 / math.Sqrt(v/float64(len(x))+r.c.eps())
	y := make([]float64, len(x))
	for i, e := range x {
		y[i] = (e-mean)*rstd*g[i] + b[i]
	}
	return y
}

// linear is x·W + b with W stored [len(x), n].
func (r *refModel) linear(x []float64, name string, n int) []float64 {
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

// forward returns the logits after each token of toks (positions 0..),
// with causal attention.
func (r *refModel) forward(toks []int32) [][]float64 {
	c := r.c
	d, hd, T := c.Width, c.HeadDim(), len(toks)
	xs := make([][]float64, T)
	for t, tok := range toks {
		xs[t] = make([]float64, d)
		for j := range d {
			xs[t][j] = r.w["wte.weight"][int(tok)*d+j] + r.w["wpe.weight"][t*d+j]
		}
	}
	for l := range c.Layers {
		pre := "h." + strconv.Itoa(l) + "."
		qkv := make([][]float64, T)
		for t := range T {
			qkv[t] = r.linear(r.layerNorm(xs[t], pre+"ln_1"), pre+"attn.c_attn", 3*d)
		}
		for t := range T {
			att := make([]float64, d)
			for h := range c.Heads {
				sc := make([]float64, t+1)
				m := math.Inf(-1)
				for u := range sc {
					for j := range hd {
						sc[u] += qkv[t][h*hd+j] * qkv[u][d+h*hd+j]
					}
					sc[u] /= math.Sqrt(float64(hd))
					m = max(m, sc[u])
				}
				var sum float64
				for u := range sc {
					sc[u] = math.Exp(sc[u] - m)
					sum += sc[u]
				}
				for j := range hd {
					for u := range sc {
						att[h*hd+j] += sc[u] / sum * qkv[u][2*d+h*hd+j]
					}
				}
			}
			for j, a := range r.linear(att, pre+"attn.c_proj", d) {
				xs[t][j] += a
			}
		}
		for t := range T {
			f := r.linear(r.layerNorm(xs[t], pre+"ln_2"), pre+"mlp.c_fc", 4*d)
			for i := range f {
				f[i] = kernels.Gelu(f[i])
			}
			for j, a := range r.linear(f, pre+"mlp.c_proj", d) {
				xs[t][j] += a
			}
		}
	}
	out := make([][]float64, T)
	for t := range T {
		h := r.layerNorm(xs[t], "ln_f")
		out[t] = make([]float64, c.Vocab)
		for v := range c.Vocab {
			for j := range d {
				out[t][v] += h[j] * r.w["wte.weight"][v*d+j]
			}
		}
	}
	return out
}

// greedy continues toks by n greedy tokens, returning them and the gap
// between the two largest logits at each.
func (r *refModel) greedy(toks []int32, n int) ([]int32, []float64) {
	toks = append([]int32(nil), toks...)
	var out []int32
	var gaps []float64
	for range n {
		lg := r.forward(toks)
		last := lg[len(lg)-1]
		best, b1, b2 := 0, math.Inf(-1), math.Inf(-1)
		for j, v := range last {
			if v > b1 {
				best, b1, b2 = j, v, b1
			} else if v > b2 {
				b2 = v
			}
		}
		out = append(out, int32(best))
		gaps = append(gaps, b1-b2)
		toks = append(toks, int32(best))
	}
	return out, gaps
}
