package cuda

import (
	"testing"

	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

// OpenHostStub opens a Backend over hostStub, a stub libcuda that runs whole
// executables without a GPU (nothing is computed), for package cuda_test's
// host-path benchmarks and allocation tests: the backend's code is the real
// one down to the purego call, which the stub answers. calls returns how
// many times a driver call of a step was made (cuGraphLaunch,
// cuGraphExecKernelNodeSetParams_v2, cuCtxGetCurrent, ...). The backend is
// closed, and checked for leaks, at the end of the test.
func OpenHostStub(tb testing.TB) (b *Backend, calls func(name string) int64) {
	tb.Helper()
	h := newHostStub()
	b, err := openDriver(cu.NewStub("stub-libcuda", h.call), resolveOptions(Config{LibCUBLAS: "/nonexistent/stablegraph-stub/libcublas.so"}))
	if err != nil {
		tb.Fatalf("open over the host stub: %v", err)
	}
	tb.Cleanup(func() {
		if c := b.LiveHandles(); !c.IsZero() {
			tb.Errorf("leak: %v", c)
		}
		if err := b.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return b, h.count
}

// RaceEnabled says whether the test binary was built with -race, under
// which sync.Pool drops what it is given and allocation counts mean nothing.
const RaceEnabled = raceEnabled

// HostStubHot are the driver calls OpenHostStub's calls counts.
var HostStubHot = hostStubHot
