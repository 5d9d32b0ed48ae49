package vmm

import (
	"fmt"

	"github.com/stablegraph/stablegraph/gpu"
)

// Driver is the part of a gpu.Backend the memory helpers need to be given:
// its devices. Its virtual memory, an optional capability, is found with
// gpu.VirtualMemoryOf (a driver without it gives gpu.ErrNotSupported).
// Every gpu.Backend satisfies Driver; tests may wrap one, implementing
// gpu.VirtualMemory too.
type Driver interface {
	gpu.Devices
}

// TimelineDriver is the part of a gpu.Backend a Timeline needs to be
// given: its devices, and stream queries for a bound timeline
// (Timeline.Bind). Its stream memory operations, an optional capability,
// are found with gpu.StreamMemOpsOf.
type TimelineDriver interface {
	gpu.Devices
	StreamQuery(s gpu.Stream) (idle bool, err error)
}

// roundSize checks size and rounds it up to dev's granularity, returning
// drv's virtual memory; a driver or device without it gives an error
// wrapping gpu.ErrNotSupported (the look-up lives in gpu/capability.go).
func roundSize(drv Driver, dev int, size uint64) (vm gpu.VirtualMemory, rounded uint64, err error) {
	if size == 0 {
		return nil, 0, fmt.Errorf("size 0: %w", gpu.ErrInvalidValue)
	}
	vm, gran, err := gpu.VirtualMemoryOf(drv, dev)
	if err != nil {
		return nil, 0, err
	}
	rounded = gpu.RoundUp(size, gran)
	if rounded < size {
		return nil, 0, fmt.Errorf("size %d overflows when rounded to the granularity %d: %w", size, gran, gpu.ErrInvalidValue)
	}
	return vm, rounded, nil
}
