package workload

import (
	"fmt"
	"math/rand/v2"
	"slices"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/kernels"
)

func mlpShape(c Config, width, batch int) (layers, w, b int, err error) {
	layers, w, b = c.Layers, c.Width, c.Batch
	if layers == 0 {
		layers = 8
	}
	if w == 0 {
		w = width
	}
	if b == 0 {
		b = batch
	}
	if int64(w)*int64(w) > 1<<28 || int64(w)*int64(b) > 1<<28 || layers > 1000 {
		return 0, 0, 0, fmt.Errorf("shape layers=%d width=%d batch=%d too large", layers, w, b)
	}
	return layers, w, b, nil
}

// mlp builds L layers of h = tanh(h·W + b): per layer a GEMM into a temp
// and a fused bias+tanh; the last layer writes the output y.
func mlp(name string, c Config, width, batch int) (*Workload, error) {
	L, W, B, err := mlpShape(c, width, batch)
	if err != nil {
		return nil, fmt.Errorf("workload %s: %w", name, err)
	}
	p := sg.NewProgram(name)
	wl := &Workload{Name: name, Desc: fmt.Sprintf("%s (layers=%d width=%d batch=%d)", name, L, W, B), Program: p}
	x := p.Param("x", f32Bytes(B*W))
	y := p.Output("y", f32Bytes(B*W))
	wl.Params, wl.Outputs = []sg.Buffer{x}, []sg.Buffer{y}
	wl.inputs = append(wl.inputs, uniformInput(B*W))
	forward(p, wl, c.Seed, x, &y, L, W, B)
	return wl, nil
}

// forward adds L layers hl = tanh(h(l−1)·Wl + bl) over rows×W activations
// from h0 = x (docs/WORKLOADS.md): per layer a GEMM into a temp and a fused
// bias+tanh. It declares the states Wl and bl with their initial values
// from seed. The last layer writes *out when out is not nil (mlp), else a
// temp like the others (train and dp keep every activation for the
// backward pass). It returns the weights, biases and activations, each
// indexed by layer; hs[0] is x.
func forward(p *sg.Program, wl *Workload, seed uint64, x sg.Buffer, out *sg.Buffer, L, W, rows int) (ws, bs, hs []sg.Buffer) {
	n := rows * W
	ws, bs, hs = make([]sg.Buffer, L+1), make([]sg.Buffer, L+1), make([]sg.Buffer, L+1)
	hs[0] = x
	for l := 1; l <= L; l++ {
		ws[l] = p.State(fmt.Sprintf("W%d", l), f32Bytes(W*W))
		bs[l] = p.State(fmt.Sprintf("b%d", l), f32Bytes(W))
		wl.States = append(wl.States,
			StateInit{ws[l], weights(seed, l, W*W, W)},
			StateInit{bs[l], weights(seed, l, W, W)})
		z := p.Temp(fmt.Sprintf("z%d", l), f32Bytes(n))
		if l == L && out != nil {
			hs[l] = *out
		} else {
			hs[l] = p.Temp(fmt.Sprintf("h%d", l), f32Bytes(n))
		}
		p.Gemm(z.All(), hs[l-1].All(), ws[l].All(), sg.GEMM{M: rows, N: W, K: W, Alpha: 1})
		p.Launch(kernels.BiasTanh, kernels.Elementwise(n),
			sg.Out(hs[l].All()), sg.In(z.All()), sg.In(bs[l].All()), sg.I32(int32(rows)), sg.I32(int32(W)))
	}
	return ws, bs, hs
}

// learningRate is train's SGD step.
const learningRate = 0.01

// train builds one SGD training step of the mlp on a mean-squared-error
// loss (docs/WORKLOADS.md): forward keeping every activation, the
// prediction copied into y, then per layer from the last: dz = dh⊙(1−h²),
// dW = h(l−1)ᵀ·dz, db = Σ_rows dz, dh(l−1) = dz·Wᵀ (before W changes), and
// W −= lr·dW, b −= lr·db in place.
func train(name string, c Config, width, batch int) (*Workload, error) {
	L, W, B, err := mlpShape(c, width, batch)
	if err != nil {
		return nil, fmt.Errorf("workload %s: %w", name, err)
	}
	p := sg.NewProgram(name)
	wl := &Workload{Name: name, Desc: fmt.Sprintf("%s (layers=%d width=%d batch=%d, SGD lr=%g)", name, L, W, B, learningRate), Program: p}
	n := B * W
	x := p.Param("x", f32Bytes(n))
	target := p.Param("target", f32Bytes(n))
	y := p.Output("y", f32Bytes(n))
	wl.Params, wl.Outputs = []sg.Buffer{x, target}, []sg.Buffer{y}
	wl.inputs = append(wl.inputs, uniformInput(n), uniformInput(n))

	ws, bs, hs := forward(p, wl, c.Seed, x, nil, L, W, B)
	p.Memcpy(y.All(), hs[L].All())

	dh := p.Temp(fmt.Sprintf("dh%d", L), f32Bytes(n))
	p.Launch(kernels.SubScale, kernels.Elementwise(n),
		sg.Out(dh.All()), sg.In(hs[L].All()), sg.In(target.All()), sg.F32(2/float32(n)), sg.I32(int32(n)))
	for l := L; l >= 1; l-- {
		dz := p.Temp(fmt.Sprintf("dz%d", l), f32Bytes(n))
		dW := p.Temp(fmt.Sprintf("dW%d", l), f32Bytes(W*W))
		db := p.Temp(fmt.Sprintf("db%d", l), f32Bytes(W))
		p.Launch(kernels.TanhBackward, kernels.Elementwise(n),
			sg.Out(dz.All()), sg.In(dh.All()), sg.In(hs[l].All()), sg.I32(int32(n)))
		p.Gemm(dW.All(), hs[l-1].All(), dz.All(), sg.GEMM{M: W, N: W, K: B, TransA: true, Alpha: 1})
		p.Launch(kernels.BiasGrad, kernels.Elementwise(W),
			sg.Out(db.All()), sg.In(dz.All()), sg.I32(int32(B)), sg.I32(int32(W)))
		if l > 1 {
			next := p.Temp(fmt.Sprintf("dh%d", l-1), f32Bytes(n))
			p.Gemm(next.All(), dz.All(), ws[l].All(), sg.GEMM{M: B, N: W, K: W, TransB: true, Alpha: 1})
			dh = next
		}
		p.Launch(kernels.Axpy, kernels.Elementwise(W*W),
			sg.InOut(ws[l].All()), sg.In(dW.All()), sg.F32(-learningRate), sg.I32(int32(W*W)))
		p.Launch(kernels.Axpy, kernels.Elementwise(W),
			sg.InOut(bs[l].All()), sg.In(db.All()), sg.F32(-learningRate), sg.I32(int32(W)))
	}
	return wl, nil
}

// Chain coefficients: y = a·x + b per kernel.
const (
	chainA = 0.999
	chainB = 0.001
)

// chain builds K axpb kernels over n elements: the first reads x, each
// next one reads the previous one's result (two temps, alternating), the
// last writes y.
func chain(c Config) (*Workload, error) { return buildChain("chain", c, false) }

// chainMoving is chain whose two intermediates are caller-bound params
// rather than temps, so that every kernel's buffers move when the caller's
// do: the case where every node of the graph must be updated each step.
func chainMoving(c Config) (*Workload, error) { return buildChain("chain-moving", c, true) }

func buildChain(name string, c Config, moving bool) (*Workload, error) {
	k, n := c.K, c.N
	if k == 0 {
		k = 1000
	}
	if n == 0 {
		n = 256
	}
	if k > MaxChainK || n > 1<<26 {
		return nil, fmt.Errorf("workload chain: K=%d (at most %d) n=%d too large", k, MaxChainK, n)
	}
	p := sg.NewProgram(name)
	wl := &Workload{Name: name, Desc: fmt.Sprintf("%s (K=%d n=%d)", name, k, n), Program: p}
	x := p.Param("x", f32Bytes(n))
	y := p.Output("y", f32Bytes(n))
	wl.Params, wl.Outputs = []sg.Buffer{x}, []sg.Buffer{y}
	wl.inputs = append(wl.inputs, uniformInput(n))
	var t [2]sg.Buffer
	if k > 1 {
		for i := range t {
			name := fmt.Sprintf("t%d", i)
			if moving {
				// Written before read by the step: the caller's contents
				// do not matter, zeros keep every run identical.
				t[i] = p.Param(name, f32Bytes(n))
				wl.Params = append(wl.Params, t[i])
				wl.inputs = append(wl.inputs, func(_ *rand.Rand, dst []byte) []byte {
					dst = slices.Grow(dst, int(f32Bytes(n)))[:f32Bytes(n)]
					clear(dst)
					return dst
				})
			} else {
				t[i] = p.Temp(name, f32Bytes(n))
			}
		}
	}
	prev := x
	for i := 1; i <= k; i++ {
		out := y
		if i < k {
			out = t[i%2]
		}
		p.Launch(kernels.Axpb, kernels.Elementwise(n),
			sg.Out(out.All()), sg.In(prev.All()), sg.F32(chainA), sg.F32(chainB), sg.I32(int32(n)))
		prev = out
	}
	return wl, nil
}
