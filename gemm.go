package stablegraph

import (
	"errors"
	"fmt"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/trace"
)

// Gemmer is an optional interface of a backend with a BLAS library (CUDA
// with cuBLAS): C[m×n] = alpha·op(A)·op(B) + beta·C on row-major float32
// matrices enqueued on s, as kernels.Gemm defines it. When the backend does
// not implement it, or returns an error wrapping gpu.ErrNotSupported for a
// call, GEMM commands launch the built-in kernels.Gemm instead. Either way
// the call is traced: captured into graphs like any library call.
type Gemmer interface {
	Gemm(s gpu.Stream, c, a, b gpu.DevicePtr, m, n, k int, transA, transB bool, alpha, beta float32) error
}

// gemmFunc is the traced function of a GEMM command. Its slices are c, a, b.
func gemmFunc(g GEMM) trace.Func {
	return func(env *trace.Env) error {
		c, a, b := env.Ptrs[0], env.Ptrs[1], env.Ptrs[2]
		if blas, ok := env.Backend.(Gemmer); ok {
			err := blas.Gemm(env.Stream, c, a, b, g.M, g.N, g.K, g.TransA, g.TransB, g.Alpha, g.Beta)
			if !errors.Is(err, gpu.ErrNotSupported) {
				return err
			}
		}
		f, err := env.Kernel(kernels.Gemm)
		if err != nil {
			return fmt.Errorf("gemm fallback: %w", err)
		}
		return env.Backend.LaunchKernel(f, kernels.GemmConfig(g.M, g.N), []gpu.Arg{
			gpu.Ptr(c), gpu.Ptr(a), gpu.Ptr(b),
			gpu.I32(int32(g.M)), gpu.I32(int32(g.N)), gpu.I32(int32(g.K)),
			gpu.I32(boolI32(g.TransA)), gpu.I32(boolI32(g.TransB)),
			gpu.F32(g.Alpha), gpu.F32(g.Beta),
		}, env.Stream)
	}
}

func boolI32(b bool) int32 {
	if b {
		return 1
	}
	return 0
}
