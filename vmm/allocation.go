package vmm

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/stablegraph/stablegraph/gpu"
)

// Steps of Allocate, named after the gpu method each one calls; they are
// the values of AllocateError.Step.
const (
	StepCreate    = "MemCreate"
	StepReserve   = "MemAddressReserve"
	StepMap       = "MemMap"
	StepSetAccess = "MemSetAccess"
)

// AllocateError reports the step of Allocate that failed. Everything the
// earlier steps created has been released, unless Cleanup says otherwise.
// It unwraps to both Err and Cleanup, so errors.Is sees the sentinels of
// either.
type AllocateError struct {
	Dev     int
	Size    uint64 // the rounded size
	Peers   []int
	Step    string // StepCreate, StepReserve, StepMap or StepSetAccess
	Err     error  // the step's error
	Cleanup error  // errors from undoing the earlier steps; nil when all were undone
}

func (e *AllocateError) Error() string {
	msg := fmt.Sprintf("vmm: allocate %d bytes on device %d (peers %v): %s failed: %v", e.Size, e.Dev, e.Peers, e.Step, e.Err)
	if e.Cleanup != nil {
		msg += fmt.Sprintf("; cleanup also failed, handles may have leaked: %v", e.Cleanup)
	}
	return msg
}

func (e *AllocateError) Unwrap() []error {
	if e.Cleanup == nil {
		return []error{e.Err}
	}
	return []error{e.Err, e.Cleanup}
}

// Allocation is device memory made usable in one call: a chunk, a
// reservation of the same size, the chunk mapped over the whole range, and
// access for the owner and its peers (the Accessible state). It is safe for
// concurrent use.
type Allocation struct {
	dev    int
	size   uint64
	access []int // owner first, then peers, without duplicates

	// The parts, in the order they were made; Close undoes them in reverse.
	phys    *PhysicalAllocation
	res     *Reservation
	mapping *Mapping

	mu struct {
		sync.Mutex
		closed bool
	}
}

// Allocate creates size bytes (rounded up to dev's granularity) on dev,
// reserves an address range for them, maps them and grants read-write
// access to dev and every device in peers (None → Accessible).
//
// Bad arguments (size 0, a device out of range) are gpu.ErrInvalidValue and
// a device without VMM is gpu.ErrNotSupported, both before anything is
// created. When a driver step fails, the steps before it are undone in
// reverse order and the error is an *AllocateError naming the step.
func Allocate(drv Driver, dev int, size uint64, peers []int) (*Allocation, error) {
	vm, rounded, err := roundSize(drv, dev, size)
	if err != nil {
		return nil, fmt.Errorf("vmm: allocate %d bytes on device %d: %w", size, dev, err)
	}
	access := []int{dev}
	n := drv.DeviceCount()
	for _, p := range peers {
		if p < 0 || p >= n {
			return nil, fmt.Errorf("vmm: allocate %d bytes on device %d: peer %d is not a device (have %d): %w",
				size, dev, p, n, gpu.ErrInvalidValue)
		}
		if !slices.Contains(access, p) {
			access = append(access, p)
		}
	}

	// undo holds the releases of the steps done so far, last first.
	var undo []func() error
	fail := func(step string, err error) error {
		var cleanup []error
		for _, u := range undo {
			cleanup = append(cleanup, u())
		}
		return &AllocateError{Dev: dev, Size: rounded, Peers: slices.Clone(peers), Step: step, Err: err,
			Cleanup: errors.Join(cleanup...)}
	}

	phys, err := create(vm, dev, rounded)
	if err != nil {
		return nil, fail(StepCreate, err)
	}
	undo = slices.Insert(undo, 0, phys.Release)

	res, err := reserve(vm, rounded, 0)
	if err != nil {
		return nil, fail(StepReserve, err)
	}
	undo = slices.Insert(undo, 0, res.Free)

	m, err := mapChunk(res, 0, phys, 0, rounded)
	if err != nil {
		return nil, fail(StepMap, err)
	}
	undo = slices.Insert(undo, 0, m.Close)

	if err := m.setAccess(access); err != nil {
		return nil, fail(StepSetAccess, err)
	}
	return &Allocation{dev: dev, size: rounded, access: access, phys: phys, res: res, mapping: m}, nil
}

// Ptr is the start of the allocation. It stays valid until Close.
func (a *Allocation) Ptr() gpu.DevicePtr { return a.mapping.ptr }

// Size is the allocation's size: the request rounded up to the granularity.
func (a *Allocation) Size() uint64 { return a.size }

// Chunk is the physical chunk behind the allocation, which another range
// may map too (vmm.MapRange; the remap strategy of package replay does).
// Its handle is zero once the allocation is closed.
func (a *Allocation) Chunk() *PhysicalAllocation { return a.phys }

// Device is the device that holds the memory.
func (a *Allocation) Device() int { return a.dev }

// Access lists the devices that may use the memory: the owner, then the
// peers.
func (a *Allocation) Access() []int { return slices.Clone(a.access) }

// Close releases the allocation (Accessible → None): it unmaps the range,
// frees the reservation and releases the chunk, in that order. It attempts
// every step that can still succeed and returns all failures joined; the
// reservation is not freed while the unmap has failed, since a mapped range
// cannot be freed. After a failure the allocation stays open and Close may
// be called again to finish the steps left; a second Close after success is
// gpu.ErrInvalidHandle.
func (a *Allocation) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.mu.closed {
		return fmt.Errorf("vmm: close allocation: %w", errReleased("allocation"))
	}
	var errs []error
	if a.mapping.live() {
		if err := a.mapping.unmap(); err != nil {
			errs = append(errs, fmt.Errorf("MemUnmap: %w", err))
		}
	}
	if a.res.live() && !a.mapping.live() {
		if err := a.res.free(); err != nil {
			errs = append(errs, fmt.Errorf("MemAddressFree: %w", err))
		}
	}
	if a.phys.live() {
		// Released even when the unmap failed: like CUDA, the chunk then
		// lives until its last mapping goes, which a retried Close does.
		if err := a.phys.release(); err != nil {
			errs = append(errs, fmt.Errorf("MemRelease: %w", err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("vmm: close allocation %#x+%d on device %d: %w", uint64(a.mapping.ptr), a.size, a.dev, errors.Join(errs...))
	}
	a.mu.closed = true
	return nil
}

// Closed reports whether Close has succeeded.
func (a *Allocation) Closed() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mu.closed
}
