package kernels

import (
	_ "embed"
	"fmt"

	"github.com/stablegraph/stablegraph/gpu"
)

// The PTX compiled from cuda/kernels.cu by cuda/gen.sh (nvcc 13.0). Both
// files hold every kernel of Specs(); ptx/SOURCE_SHA256 records the source
// they were made from (TestPTXMatchesSource).

// ptxPortable targets compute_75, the oldest architecture nvcc 13 accepts;
// the driver JIT-compiles it for any newer GPU. Its PTX ISA is 9.0, so the
// driver must be CUDA 13 (580) or newer.
//
//go:embed ptx/sm75.ptx
var ptxPortable []byte

// ptxSM90 targets compute_90 (Hopper: H100, H200).
//
//go:embed ptx/sm90.ptx
var ptxSM90 []byte

func init() { ptx = ptxPortable }

// ptxFor returns the PTX best suited to a device of compute capability
// major.minor: the sm_90 build on 9.x, the portable build otherwise.
func ptxFor(major, minor int) []byte {
	if major == 9 {
		return ptxSM90
	}
	return ptxPortable
}

// moduleCode is the built-in module's Code: PTX, ptxFor's pick for the
// device; the kernels ship as no other format.
func moduleCode(t gpu.Target) ([]byte, error) {
	if t.Format != gpu.CodePTX {
		return nil, fmt.Errorf("kernels: the built-in kernels ship as PTX only: %w", gpu.ErrNotSupported)
	}
	if len(ptx) == 0 {
		return nil, fmt.Errorf("kernels: the built-in kernels were not compiled to PTX (kernels/cuda/gen.sh): %w", gpu.ErrNotSupported)
	}
	return ptxFor(t.Major, t.Minor), nil
}
