package workload

import (
	"fmt"
	"math/rand/v2"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

// dp builds one rank's data-parallel training step (docs/WORKLOADS.md):
// the train step of the MLP on the rank's shard of the global batch, with
// every gradient all-reduced (summed) over Config.Comm before the update.
//
// The global batch (Config.Batch, default 8; or Config.BatchPerRank times
// the ranks) is split in Comm.Size() equal shards of contiguous rows, rank
// r taking the r-th; its inputs are exactly
// those rows of the train workload's inputs at the same seed and step. The
// loss is the mean squared error over the whole global batch, so each rank
// scales its output gradient by 2/(global batch·width) and the sum of the
// ranks' gradients is the gradient of the single-rank step over the whole
// batch, up to the order of float32 additions. The gradients live in one
// temp, dW1 db1 … dWL dbL, reduced by one all-reduce in place (one bucket,
// as data-parallel frameworks fuse them), and the updates follow it, so every
// rank applies the same update to the same weights.
//
// Without a communicator (Config.Comm nil) it is the single-rank step over
// the whole batch with no collective: the train step with its updates
// moved after the backward pass, bit for bit the same weights as train.
func dp(c Config) (*Workload, error) {
	const name = "dp"
	world, rank := 1, 0
	if c.Comm != nil {
		world, rank = c.Comm.Size(), c.Comm.Rank()
	}
	if c.BatchPerRank > 0 {
		if c.Batch > 0 {
			return nil, fmt.Errorf("workload %s: a global batch (%d) and a batch per rank (%d) both given; give one", name, c.Batch, c.BatchPerRank)
		}
		if int64(c.BatchPerRank)*int64(world) > 1<<28 {
			return nil, fmt.Errorf("workload %s: batch per rank %d times %d ranks too large", name, c.BatchPerRank, world)
		}
		c.Batch = c.BatchPerRank * world
	}
	L, W, B, err := mlpShape(c, 256, 8)
	if err != nil {
		return nil, fmt.Errorf("workload %s: %w", name, err)
	}
	if B%world != 0 {
		return nil, fmt.Errorf("workload %s: global batch %d does not split into %d equal shards", name, B, world)
	}
	Bs := B / world // rows of this rank
	p := sg.NewProgram(name)
	desc := fmt.Sprintf("%s (layers=%d width=%d batch=%d", name, L, W, B)
	if c.Comm != nil {
		desc += fmt.Sprintf(", rank %d of %d with %d rows", rank, world, Bs)
	}
	wl := &Workload{Name: name, Desc: desc + fmt.Sprintf(", SGD lr=%g)", learningRate), Program: p, Comm: c.Comm}
	n := Bs * W
	x := p.Param("x", f32Bytes(n))
	target := p.Param("target", f32Bytes(n))
	y := p.Output("y", f32Bytes(n))
	wl.Params, wl.Outputs = []sg.Buffer{x, target}, []sg.Buffer{y}
	wl.inputs = append(wl.inputs, shardInput(B*W, rank*n, n), shardInput(B*W, rank*n, n))

	ws, bs, hs := forward(p, wl, c.Seed, x, nil, L, W, Bs)
	p.Memcpy(y.All(), hs[L].All())

	// Gradients: one buffer, layer l's dW then db.
	per := f32Bytes(W*W + W)
	grads := p.Temp("grads", per*int64(L))
	dWOf := func(l int) sg.Slice { return grads.Slice(per*int64(l-1), f32Bytes(W*W)) }
	dbOf := func(l int) sg.Slice { return grads.Slice(per*int64(l-1)+f32Bytes(W*W), f32Bytes(W)) }

	dh := p.Temp(fmt.Sprintf("dh%d", L), f32Bytes(n))
	p.Launch(kernels.SubScale, kernels.Elementwise(n),
		sg.Out(dh.All()), sg.In(hs[L].All()), sg.In(target.All()), sg.F32(2/float32(B*W)), sg.I32(int32(n)))
	for l := L; l >= 1; l-- {
		dz := p.Temp(fmt.Sprintf("dz%d", l), f32Bytes(n))
		p.Launch(kernels.TanhBackward, kernels.Elementwise(n),
			sg.Out(dz.All()), sg.In(dh.All()), sg.In(hs[l].All()), sg.I32(int32(n)))
		p.Gemm(dWOf(l), hs[l-1].All(), dz.All(), sg.GEMM{M: W, N: W, K: Bs, TransA: true, Alpha: 1})
		p.Launch(kernels.BiasGrad, kernels.Elementwise(W),
			sg.Out(dbOf(l)), sg.In(dz.All()), sg.I32(int32(Bs)), sg.I32(int32(W)))
		if l > 1 {
			next := p.Temp(fmt.Sprintf("dh%d", l-1), f32Bytes(n))
			p.Gemm(next.All(), dz.All(), ws[l].All(), sg.GEMM{M: Bs, N: W, K: W, TransB: true, Alpha: 1})
			dh = next
		}
	}
	if c.Comm != nil {
		p.AllReduce(c.Comm, grads.All(), grads.All(), gpu.Float32, gpu.Sum)
	}
	for l := 1; l <= L; l++ {
		p.Launch(kernels.Axpy, kernels.Elementwise(W*W),
			sg.InOut(ws[l].All()), sg.In(dWOf(l)), sg.F32(-learningRate), sg.I32(int32(W*W)))
		p.Launch(kernels.Axpy, kernels.Elementwise(W),
			sg.InOut(bs[l].All()), sg.In(dbOf(l)), sg.F32(-learningRate), sg.I32(int32(W)))
	}
	return wl, nil
}

// shardInput is a param input of n values: values [off, off+n) of the
// global input of total values uniform in [-1, 1] (uniformInput(total)).
func shardInput(total, off, n int) inputFunc {
	return func(r *rand.Rand, dst []byte) []byte {
		for range off {
			r.Float64() // the values before the shard's
		}
		return appendUniform(dst, r, n, 1)
	}
}
