// Quickstart compiles one layer, y = tanh(x·W + b), with the auto strategy
// and runs it for 60 steps, x and y at new device addresses every step as a
// caching allocator would hand them out. It runs on a GPU when one is
// present, else on the embedded simulator.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/devbuf"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

func main() {
	ctx := context.Background()
	backend, _, err := gpu.Open("auto", gpu.Config{}) // cuda with a GPU, else sim
	check(err)
	defer backend.Close()
	stream, err := backend.StreamCreate(0, gpu.StreamNonBlocking, 0)
	check(err)
	defer backend.StreamDestroy(stream)

	const batch, width = 2, 2 // float32 values: 4 bytes each
	p := stablegraph.NewProgram("layer")
	x := p.Param("x", 4*batch*width) // the caller's buffer, bound every step
	w := p.Constant("w", gpu.F32ToBytes([]float32{1, 0, 0, 1}))
	b := p.Constant("b", gpu.F32ToBytes([]float32{0.5, -0.5}))
	h := p.Temp("h", 4*batch*width)
	y := p.Output("y", 4*batch*width) // written into the caller's buffer
	p.Gemm(h.All(), x.All(), w.All(), stablegraph.GEMM{M: batch, N: width, K: width, Alpha: 1})
	p.Launch(kernels.BiasTanh, kernels.Elementwise(batch*width), stablegraph.Out(y.All()),
		stablegraph.In(h.All()), stablegraph.In(b.All()), stablegraph.I32(batch), stablegraph.I32(width))
	exe, err := stablegraph.Compile(ctx, backend, p, stablegraph.Options{Strategy: stablegraph.StrategyAuto})
	check(err)
	defer exe.Close()

	const steps = 60 // auto measures its candidates over the first ones
	for step := range steps {
		xs, err := devbuf.Upload(backend, 0, []float32{1, 2, float32(step), 0}, batch, width) // a new address
		check(err)
		ys, err := devbuf.New[float32](backend, 0, batch, width)
		check(err)
		_, err = exe.Run(ctx, stream, stablegraph.Bindings{x: xs.Ptr(), y: ys.Ptr()})
		check(err)
		out, err := ys.Read(stream) // waits for the step
		check(err)
		if step < 3 || step == steps-1 {
			fmt.Printf("step %2d: y = %.3f\n", step, out)
		}
		check(errors.Join(xs.Free(), ys.Free()))
	}
	st := exe.Stats()
	fmt.Printf("%d steps on %s, strategy %s (auto's choice after %d probe steps): %d graph launches, %d re-records\n",
		st.Steps, backend.Name(), st.Strategy, st.ProbeSteps, st.GraphLaunches, st.Rerecords)
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
