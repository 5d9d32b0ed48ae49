package gpu

import "fmt"

// This file holds every capability check in one place: callers ask here
// rather than reading DeviceProps flags themselves, and get ErrNotSupported
// with the reason when the device cannot do the thing.

// VirtualMemoryOf returns b's virtual memory interface for dev and the
// device's granularity, or ErrNotSupported when dev has no VMM. The caller
// falls back to MemAlloc-based strategies.
func VirtualMemoryOf(b interface {
	Devices
	VirtualMemory
}, dev int) (VirtualMemory, uint64, error) {
	p, err := b.DeviceProps(dev)
	if err != nil {
		return nil, 0, err
	}
	if !p.VMM || p.Granularity == 0 {
		return nil, 0, &Error{Op: "VirtualMemoryOf", Err: ErrNotSupported,
			Detail: fmt.Sprintf("device %d (%s) has no virtual memory management", dev, p.Name)}
	}
	return b, p.Granularity, nil
}

// StreamMemOpsOf returns b's stream memory operations for dev, or
// ErrNotSupported when dev cannot write values from a stream. The caller
// falls back to events for timelines.
func StreamMemOpsOf(b interface {
	Devices
	StreamMemOps
}, dev int) (StreamMemOps, error) {
	p, err := b.DeviceProps(dev)
	if err != nil {
		return nil, err
	}
	if !p.StreamMemOps {
		return nil, &Error{Op: "StreamMemOpsOf", Err: ErrNotSupported,
			Detail: fmt.Sprintf("device %d (%s) has no 64-bit stream memory operations", dev, p.Name)}
	}
	return b, nil
}

// StreamWaitsOf returns b's stream waits for device dev, or an error
// wrapping ErrNotSupported when b or dev cannot wait for values: the caller
// then does without a gate (workload.Run times steps with events alone).
func StreamWaitsOf(b Backend, dev int) (StreamWaits, error) {
	sw, ok := b.(StreamWaits)
	if !ok {
		return nil, &Error{Op: "StreamWaitsOf", Err: ErrNotSupported,
			Detail: fmt.Sprintf("backend %s has no stream waits on memory values", b.Name())}
	}
	if err := sw.StreamWaitsSupported(dev); err != nil {
		return nil, err
	}
	return sw, nil
}

// LiveHandles returns b's live-handle counters, and false when b does not
// count them.
func LiveHandles(b Backend) (Counters, bool) {
	if hc, ok := b.(HandleCounter); ok {
		return hc.LiveHandles(), true
	}
	return Counters{}, false
}

// RoundUp rounds n up to a multiple of align (a power of two or any
// positive number).
func RoundUp(n, align uint64) uint64 {
	if align == 0 {
		return n
	}
	return (n + align - 1) / align * align
}

// AddressRangerOf returns b's allocation extents (extent.go), and false
// when b cannot tell them: bindings are then not checked.
func AddressRangerOf(b Backend) (AddressRanger, bool) {
	ar, ok := b.(AddressRanger)
	return ar, ok
}
