package trace

import (
	"errors"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
)

// unreadable is a graph store whose kernel nodes' parameters cannot be read
// back, as CUDA's for NCCL kernels, which pass fewer parameter bytes than
// their layout declares.
type unreadable struct{ *fakeGraphs }

func (unreadable) GraphKernelNodeParams(gpu.GraphNode) (gpu.KernelParams, error) {
	return gpu.KernelParams{}, gpu.Errorf("GraphKernelNodeParams", gpu.ErrNotSupported, "parameter buffer has 512 bytes, layout needs 4096")
}

func TestDiffUnreadableParamsNotPatchable(t *testing.T) {
	f := newFake()
	f.layouts[1] = libLayout
	f.layouts[2] = []gpu.ParamInfo{{Offset: 0, Size: 8}, {Offset: 8, Size: 4}}
	ops1 := key(0x7f0000001000, 0x7f0000002000)
	ops2 := key(0x7f0000801000, 0x7f0000a02000)
	_, err := Diff(unreadable{f}, f.trace(ops1, 1, 7), f.trace(ops2, 1, 7), ops1, ops2, []uint64{256, 512})
	if !errors.Is(err, ErrNotPatchable) {
		t.Fatalf("Diff over unreadable parameters = %v, want ErrNotPatchable", err)
	}
}
