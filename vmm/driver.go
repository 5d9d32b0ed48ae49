package vmm

import (
	"fmt"

	"github.com/stablegraph/stablegraph/gpu"
)

// Driver is the part of a gpu.Backend the memory helpers use. Every
// gpu.Backend satisfies it; tests may wrap one.
type Driver interface {
	gpu.Devices
	gpu.VirtualMemory
}

// TimelineDriver is the part of a gpu.Backend a Timeline uses: stream
// memory operations for the counter, and stream queries for a bound
// timeline (Timeline.Bind).
type TimelineDriver interface {
	gpu.Devices
	gpu.StreamMemOps
	StreamQuery(s gpu.Stream) (idle bool, err error)
}

// granularity returns dev's VMM allocation granularity, or an error wrapping
// gpu.ErrNotSupported when dev has no virtual memory management (the check
// lives in gpu/capability.go).
func granularity(drv Driver, dev int) (uint64, error) {
	_, g, err := gpu.VirtualMemoryOf(drv, dev)
	return g, err
}

// checkStreamMemOps returns an error wrapping gpu.ErrNotSupported when dev
// cannot write timeline values from a stream.
func checkStreamMemOps(drv TimelineDriver, dev int) error {
	_, err := gpu.StreamMemOpsOf(drv, dev)
	return err
}

// roundSize checks size and rounds it up to dev's granularity.
func roundSize(drv Driver, dev int, size uint64) (rounded, gran uint64, err error) {
	if size == 0 {
		return 0, 0, fmt.Errorf("size 0: %w", gpu.ErrInvalidValue)
	}
	gran, err = granularity(drv, dev)
	if err != nil {
		return 0, 0, err
	}
	rounded = gpu.RoundUp(size, gran)
	if rounded < size {
		return 0, 0, fmt.Errorf("size %d overflows when rounded to the granularity %d: %w", size, gran, gpu.ErrInvalidValue)
	}
	return rounded, gran, nil
}
