package workload_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"log"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
)

// sumPrefix is the Go reference of a user's kernel
//
//	extern "C" __global__ void sum_prefix2(float* y, const int* lens,
//	        const float* h0, const float* h1, int nseq)
//
// y[i] = h_i[0] + … + h_i[lens[i]-1] for the sequences i < nseq (at most
// two): each sequence's history is its own buffer, passed as its own typed
// pointer argument, and its length is read from device memory, so neither a
// new length nor a new history buffer changes the recorded graph.
func sumPrefix(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
	nseq := int(a[4].AsI32())
	if nseq < 1 || nseq > 2 || cfg.Grid.X*cfg.Block.X < uint32(nseq) {
		return fmt.Errorf("sum_prefix2: nseq %d, launch %v: %w", nseq, cfg, gpu.ErrInvalidValue)
	}
	lb := make([]byte, 4*nseq)
	if err := mem.Read(a[1].AsPtr(), lb); err != nil {
		return err
	}
	y := make([]float32, nseq)
	for i := range y {
		n := int(int32(binary.LittleEndian.Uint32(lb[4*i:])))
		h, err := gpu.ReadF32(mem, a[2+i].AsPtr(), n)
		if err != nil {
			return err // a length past the buffer faults, as on a GPU
		}
		for _, v := range h {
			y[i] += v
		}
	}
	return gpu.WriteF32(mem, a[0].AsPtr(), y)
}

// Example_ownKernel is the pattern docs/WRITING-A-STEP.md walks through:
// a kernel of one's own (a Go reference for sim; PTX from nvcc for CUDA),
// per-sequence buffers bound every step, lengths read on the device.
func Example_ownKernel() {
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

	module := &gpu.ModuleImage{
		Name: "mine",
		Kernels: []gpu.KernelSpec{{
			Name:   "sum_prefix2",
			Params: []gpu.ArgKind{gpu.ArgPtr, gpu.ArgPtr, gpu.ArgPtr, gpu.ArgPtr, gpu.ArgI32},
			Ref:    sumPrefix,
		}},
		Code: nil, // on CUDA: gpu.PTXCode(ptx), ptx the output of nvcc -ptx embedded with go:embed
	}
	const hist = 8 // floats of history per sequence
	p := stablegraph.NewProgram("sums")
	p.AddModule(module)
	lens := p.Param("lens", 4*2)
	h0, h1 := p.Param("h0", 4*hist), p.Param("h1", 4*hist)
	y := p.Output("y", 4*2)
	p.Launch("sum_prefix2", gpu.Linear(2, 32), stablegraph.Out(y.All()), stablegraph.In(lens.All()),
		stablegraph.In(h0.All()), stablegraph.In(h1.All()), stablegraph.I32(2))

	exe, err := stablegraph.Compile(ctx, backend, p, stablegraph.Options{Strategy: stablegraph.StrategyPatch})
	if err != nil {
		log.Fatal(err)
	}
	defer exe.Close()

	// Three sequences, each with its history; the batch has two rows.
	var seqs [3]gpu.DevicePtr
	for s := range seqs {
		seqs[s], _ = backend.MemAlloc(0, 4*hist)
		h := make([]float32, hist)
		for i := range h {
			h[i] = float32((s + 1) * (i + 1)) // 1 2 3 …, 2 4 6 …, 3 6 9 …
		}
		backend.MemcpyHtoD(seqs[s], gpu.F32ToBytes(h))
	}
	lp, _ := backend.MemAlloc(0, 8)
	yp, _ := backend.MemAlloc(0, 8)
	for step, rows := range [][2]int{{0, 1}, {0, 1}, {2, 1}} { // step 2: sequence 2 swaps in
		n := [2]int32{int32(2 + step), int32(3 + step)}
		backend.MemcpyHtoD(lp, binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, uint32(n[0])), uint32(n[1])))
		outs, err := exe.Run(ctx, stream, stablegraph.Bindings{lens: lp, h0: seqs[rows[0]], h1: seqs[rows[1]], y: yp})
		if err != nil {
			log.Fatal(err)
		}
		out, err := exe.ReadOutput(ctx, outs, y)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("step %d: rows hold sequences %v, lengths %v: sums %v\n", step, rows, n, gpu.BytesToF32(out))
	}
	st := exe.Stats()
	fmt.Printf("records %d, patched nodes %d\n", st.Records, st.PatchedNodes)
	// Output:
	// step 0: rows hold sequences [0 1], lengths [2 3]: sums [3 12]
	// step 1: rows hold sequences [0 1], lengths [3 4]: sums [6 20]
	// step 2: rows hold sequences [2 1], lengths [4 5]: sums [30 30]
	// records 1, patched nodes 1
}
