package vmm

import (
	"fmt"

	"stablegraph/gpu"
)

// Driver is the part of a gpu.Backend the memory helpers use. Every
// gpu.Backend satisfies it; tests may wrap one.
type Driver interface {
	gpu.Devices
	gpu.VirtualMemory
}

// TimelineDriver is the part of a gpu.Backend a Timeline uses.
type TimelineDriver interface {
	gpu.Devices
	gpu.StreamMemOps
}

// This file holds vmm's two capability checks. Both defer to gpu's own
// checks (gpu/capability.go) when the driver is a whole gpu.Backend, which
// is the normal case; those take a gpu.Backend, so a narrower Driver gets
// the same check made here from what it offers.

// granularity returns dev's VMM allocation granularity, or an error wrapping
// gpu.ErrNotSupported when dev has no virtual memory management.
func granularity(drv Driver, dev int) (uint64, error) {
	var (
		g   uint64
		err error
	)
	if b, ok := drv.(gpu.Backend); ok {
		_, g, err = gpu.VirtualMemoryOf(b, dev)
	} else {
		g, err = drv.AllocationGranularity(dev)
	}
	if err != nil {
		return 0, err
	}
	if g == 0 {
		return 0, fmt.Errorf("device %d reports a zero allocation granularity: %w", dev, gpu.ErrNotSupported)
	}
	return g, nil
}

// checkStreamMemOps returns an error wrapping gpu.ErrNotSupported when dev
// cannot write timeline values from a stream.
func checkStreamMemOps(drv TimelineDriver, dev int) error {
	if b, ok := drv.(gpu.Backend); ok {
		_, err := gpu.StreamMemOpsOf(b, dev)
		return err
	}
	p, err := drv.DeviceProps(dev)
	if err != nil {
		return err
	}
	if !p.StreamMemOps {
		return fmt.Errorf("device %d (%s) has no 64-bit stream memory operations: %w", dev, p.Name, gpu.ErrNotSupported)
	}
	return nil
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
