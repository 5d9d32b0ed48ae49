package cuda

import (
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/gputest"
)

// TestConformance runs the backend-neutral conformance suite against CUDA.
// It skips (with the reason) where there is no driver or device.
func TestConformance(t *testing.T) {
	gputest.Run(t, func(t *testing.T) gpu.Backend { return openOrSkip(t, Config{}) })
}

// TestKernels runs only the kernel group of the suite: every built-in
// kernel on random inputs against its Go reference.
func TestKernels(t *testing.T) {
	gputest.Kernels(t, func(t *testing.T) gpu.Backend { return openOrSkip(t, Config{}) })
}
