package stablegraph_test

import (
	"context"
	"fmt"
	"log"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/kernels"
)

// Example compiles y = tanh(x·W + b) with the patch strategy and runs it for
// three steps with x and y at new addresses every step, as a caching
// allocator would hand them out.
func Example() {
	ctx := context.Background()
	backend, err := sim.New(sim.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close()
	stream, err := backend.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		log.Fatal(err)
	}
	defer backend.StreamDestroy(stream)

	const batch, width = 2, 4
	p := stablegraph.NewProgram("layer")
	x := p.Param("x", 4*batch*width)
	w := p.State("w", 4*width*width)
	b := p.Constant("b", gpu.F32ToBytes([]float32{0, 0.5, 0, -0.5}))
	h := p.Temp("h", 4*batch*width)
	y := p.Output("y", 4*batch*width)
	p.Gemm(h.All(), x.All(), w.All(), stablegraph.GEMM{M: batch, N: width, K: width, Alpha: 1})
	p.Launch(kernels.BiasTanh, kernels.Elementwise(batch*width),
		stablegraph.Out(y.All()), stablegraph.In(h.All()), stablegraph.In(b.All()),
		stablegraph.I32(batch), stablegraph.I32(width))

	exe, err := stablegraph.Compile(ctx, backend, p, stablegraph.Options{Strategy: stablegraph.StrategyPatch})
	if err != nil {
		log.Fatal(err)
	}
	defer exe.Close()
	identity := make([]float32, width*width)
	for i := range width {
		identity[i*width+i] = 1
	}
	if err := exe.WriteBuffer(ctx, w, gpu.F32ToBytes(identity)); err != nil {
		log.Fatal(err)
	}

	for step := range 3 {
		// The caller's buffers, at new addresses every step.
		xp, _ := backend.MemAlloc(0, uint64(x.Size()))
		yp, _ := backend.MemAlloc(0, uint64(y.Size()))
		input := []float32{0, 0, 0, 0, float32(step), 0, 0, 0}
		if err := backend.MemcpyHtoD(xp, gpu.F32ToBytes(input)); err != nil {
			log.Fatal(err)
		}
		outs, err := exe.Run(ctx, stream, stablegraph.Bindings{x: xp, y: yp})
		if err != nil {
			log.Fatal(err)
		}
		out, err := exe.ReadOutput(ctx, outs, y)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("step %d: %.3f\n", step, gpu.BytesToF32(out))
		backend.MemFree(xp)
		backend.MemFree(yp)
	}
	st := exe.Stats()
	fmt.Printf("records %d, re-records %d, patched nodes %d, traces captured %d\n",
		st.Records, st.Rerecords, st.PatchedNodes, st.TracesCaptured)
	// Output:
	// step 0: [0.000 0.462 0.000 -0.462 0.000 0.462 0.000 -0.462]
	// step 1: [0.000 0.462 0.000 -0.462 0.762 0.462 0.000 -0.462]
	// step 2: [0.000 0.462 0.000 -0.462 0.964 0.462 0.000 -0.462]
	// records 1, re-records 0, patched nodes 4, traces captured 2
}
