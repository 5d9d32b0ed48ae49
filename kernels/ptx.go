package kernels

import (
	"bytes"
	_ "embed"
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

// PTXFor returns the PTX best suited to a device of compute capability
// major.minor: the sm_90 build on 9.x, the portable build otherwise. The
// portable build is what Module().PTX holds.
func PTXFor(major, minor int) []byte {
	if major == 9 {
		return ptxSM90
	}
	return ptxPortable
}

// IsBuiltinPTX reports whether b is one of the PTX builds of this package
// (so that a backend may swap in PTXFor's choice for the device).
func IsBuiltinPTX(b []byte) bool {
	return len(b) > 0 && (bytes.Equal(b, ptxPortable) || bytes.Equal(b, ptxSM90))
}
