package gpu

import (
	"errors"
	"fmt"
)

// AddressRanger is an optional capability: a backend that implements it can
// tell the extent of the allocation an address lies in, so that a runtime
// can refuse a buffer bound to less memory than it needs (CheckBinding)
// instead of letting device work overrun into a neighbour. Find it with
// AddressRangerOf; a backend without it is not checked.
//
// AddressRange returns [base, base+size), the extent of the live allocation
// holding p: an access that starts at p and ends at or before base+size
// touches that allocation only. What an allocation is, per kind of memory:
//
//   - MemAlloc memory: the allocation, of exactly the size asked for.
//   - HostAlloc memory: the allocation's device range [Ptr, Ptr+size).
//   - Virtual memory: the run of contiguous mappings holding p, inside
//     its reservation (device work may cross from one mapping into the
//     next, so one mapping alone would be too small). A reserved but
//     unmapped address is in no allocation.
//
// The error wraps ErrNotFound when p lies in no live allocation the backend
// can see (freed, never allocated, unmapped), and ErrNotSupported when the
// backend cannot tell the extent of the memory at p; see each backend's
// documentation for what it can see. AddressRange is safe for concurrent
// use and cheap enough to call for every binding of every step.
type AddressRanger interface {
	AddressRange(p DevicePtr) (base DevicePtr, size uint64, err error)
}

// ExtentError reports a range of device memory that does not fit in the
// allocation its start lies in. It wraps ErrOutOfBounds.
type ExtentError struct {
	Ptr  DevicePtr // start of the range
	Size uint64    // bytes the range needs
	// Base and Extent are the allocation holding Ptr; both are zero when
	// Ptr lies in no live allocation, and Reason then says why.
	Base   DevicePtr
	Extent uint64
	Reason string
}

func (e *ExtentError) Error() string {
	if e.Extent == 0 {
		return fmt.Sprintf("gpu: range [%#x, +%d) is in no live allocation: %s", uint64(e.Ptr), e.Size, e.Reason)
	}
	end := uint64(e.Base) + e.Extent
	return fmt.Sprintf("gpu: range [%#x, +%d) runs past the end of its allocation [%#x, +%d): %d bytes are left from %#x",
		uint64(e.Ptr), e.Size, uint64(e.Base), e.Extent, end-uint64(e.Ptr), uint64(e.Ptr))
}

func (e *ExtentError) Unwrap() error { return ErrOutOfBounds }

// CheckBinding checks that size bytes starting at p lie in one live
// allocation of b. It returns nil when they do, when size is zero, and when
// b cannot tell (b is not an AddressRanger, or its AddressRange reports
// ErrNotSupported for p); an *ExtentError (wrapping ErrOutOfBounds) when
// the range runs past the allocation holding p or p lies in no live
// allocation; and any other error AddressRange returns, wrapped.
//
// A range inside one allocation is not proof of a correct binding: two
// buffers sub-allocated from one allocation (a pool, a caching allocator's
// segment, a virtual memory reservation) can still overlap, and memory
// another library frees and reallocates behind the backend's back may be
// reported with its old extent (see the backends' docs).
func CheckBinding(b Backend, p DevicePtr, size uint64) error {
	if size == 0 {
		return nil
	}
	ar, ok := AddressRangerOf(b)
	if !ok {
		return nil
	}
	base, extent, err := ar.AddressRange(p)
	switch {
	case errors.Is(err, ErrNotSupported):
		return nil
	case errors.Is(err, ErrNotFound):
		return &ExtentError{Ptr: p, Size: size, Reason: err.Error()}
	case err != nil:
		return fmt.Errorf("gpu.CheckBinding: extent of %#x: %w", uint64(p), err)
	}
	end := uint64(base) + extent
	if p < base || uint64(p) >= end || size > end-uint64(p) {
		return &ExtentError{Ptr: p, Size: size, Base: base, Extent: extent}
	}
	return nil
}
