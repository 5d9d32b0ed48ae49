package vmm

import (
	"fmt"
	"slices"
	"sync"

	"github.com/stablegraph/stablegraph/gpu"
)

// This file holds the three single-step handles: a physical chunk, an
// address reservation and a mapping. See doc.go for the states they move
// between.

// errReleased is wrapped by every second release of a handle.
func errReleased(what string) error {
	return fmt.Errorf("%s was already released: %w", what, gpu.ErrInvalidHandle)
}

// PhysicalAllocation is a physical chunk of device memory: the Created
// state. It is safe for concurrent use.
type PhysicalAllocation struct {
	drv  gpu.VirtualMemory
	dev  int
	size uint64

	mu struct {
		sync.Mutex
		h gpu.PhysMem // zero once released
	}
}

// Create makes a physical chunk of at least size bytes on dev, rounded up
// to the granularity (None → Created).
func Create(drv Driver, dev int, size uint64) (*PhysicalAllocation, error) {
	vm, rounded, err := roundSize(drv, dev, size)
	if err != nil {
		return nil, fmt.Errorf("vmm: create %d bytes on device %d: %w", size, dev, err)
	}
	p, err := create(vm, dev, rounded)
	if err != nil {
		return nil, fmt.Errorf("vmm: create %d bytes on device %d: %w", rounded, dev, err)
	}
	return p, nil
}

// create calls MemCreate for an already rounded size.
func create(drv gpu.VirtualMemory, dev int, size uint64) (*PhysicalAllocation, error) {
	h, err := drv.MemCreate(dev, size)
	if err != nil {
		return nil, err
	}
	p := &PhysicalAllocation{drv: drv, dev: dev, size: size}
	p.mu.h = h
	return p, nil
}

// Handle is the chunk's handle, zero once released.
func (p *PhysicalAllocation) Handle() gpu.PhysMem {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mu.h
}

// Size is the chunk's size in bytes, a multiple of the granularity.
func (p *PhysicalAllocation) Size() uint64 { return p.size }

// Device is the device that holds the chunk.
func (p *PhysicalAllocation) Device() int { return p.dev }

// Release releases the chunk (Created → None). If the driver refuses, the
// chunk stays owned and Release may be called again; a second Release after
// success is gpu.ErrInvalidHandle.
func (p *PhysicalAllocation) Release() error {
	if err := p.release(); err != nil {
		return fmt.Errorf("vmm: release chunk of %d bytes on device %d: %w", p.size, p.dev, err)
	}
	return nil
}

func (p *PhysicalAllocation) release() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.h == 0 {
		return errReleased("chunk")
	}
	if err := p.drv.MemRelease(p.mu.h); err != nil {
		return err
	}
	p.mu.h = 0
	return nil
}

func (p *PhysicalAllocation) live() bool { return p.Handle() != 0 }

// Reservation is a reserved virtual address range: the Reserved state. It
// is safe for concurrent use.
type Reservation struct {
	drv  gpu.VirtualMemory
	size uint64

	mu struct {
		sync.Mutex
		ptr gpu.DevicePtr // zero once freed
	}
}

// Reserve reserves an address range of at least size bytes, rounded up to
// dev's granularity, aligned to align (0: the granularity) (None →
// Reserved). dev only selects the granularity: address ranges are shared by
// all devices.
func Reserve(drv Driver, dev int, size, align uint64) (*Reservation, error) {
	vm, rounded, err := roundSize(drv, dev, size)
	if err != nil {
		return nil, fmt.Errorf("vmm: reserve %d bytes: %w", size, err)
	}
	r, err := reserve(vm, rounded, align)
	if err != nil {
		return nil, fmt.Errorf("vmm: reserve %d bytes aligned to %d: %w", rounded, align, err)
	}
	return r, nil
}

func reserve(drv gpu.VirtualMemory, size, align uint64) (*Reservation, error) {
	p, err := drv.MemAddressReserve(size, align)
	if err != nil {
		return nil, err
	}
	r := &Reservation{drv: drv, size: size}
	r.mu.ptr = p
	return r, nil
}

// Ptr is the start of the range, zero once freed.
func (r *Reservation) Ptr() gpu.DevicePtr {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mu.ptr
}

// Size is the range's size in bytes.
func (r *Reservation) Size() uint64 { return r.size }

// Free frees the range (Reserved → None). Nothing may be mapped in it. If
// the driver refuses, the range stays owned and Free may be called again; a
// second Free after success is gpu.ErrInvalidHandle.
func (r *Reservation) Free() error {
	if err := r.free(); err != nil {
		return fmt.Errorf("vmm: free reservation of %d bytes: %w", r.size, err)
	}
	return nil
}

func (r *Reservation) free() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.ptr == 0 {
		return errReleased("reservation")
	}
	if err := r.drv.MemAddressFree(r.mu.ptr, r.size); err != nil {
		return fmt.Errorf("range %#x: %w", uint64(r.mu.ptr), err)
	}
	r.mu.ptr = 0
	return nil
}

func (r *Reservation) live() bool { return r.Ptr() != 0 }

// Mapping is a chunk mapped into part of a reservation: the Mapped state,
// Accessible once SetAccess succeeds. It is scoped: Close unmaps it, and
// should be deferred by whoever maps. It is safe for concurrent use.
type Mapping struct {
	drv  gpu.VirtualMemory
	ptr  gpu.DevicePtr
	size uint64

	mu struct {
		sync.Mutex
		mapped bool
		access []int // devices granted access, in the order given
	}
}

// Map maps the whole of phys at offset off of r (Created+Reserved →
// Mapped). off must be a multiple of the granularity and the chunk must fit
// in the range. No device has access until SetAccess.
func Map(r *Reservation, off uint64, phys *PhysicalAllocation) (*Mapping, error) {
	m, err := mapChunk(r, off, phys, 0, phys.size)
	if err != nil {
		return nil, fmt.Errorf("vmm: map %d-byte chunk at offset %d of reservation: %w", phys.size, off, err)
	}
	return m, nil
}

// MapRange maps size bytes of phys, from byte from of the chunk on, at
// offset off of r (Created+Reserved → Mapped): part of a chunk, which may
// be mapped elsewhere too (a chunk can back several ranges at once, as
// in CUDA). off, from and size must be multiples of the granularity (the
// driver refuses others) and the bytes must lie in the chunk and in the
// range. No device has access until SetAccess.
func MapRange(r *Reservation, off uint64, phys *PhysicalAllocation, from, size uint64) (*Mapping, error) {
	m, err := mapChunk(r, off, phys, from, size)
	if err != nil {
		return nil, fmt.Errorf("vmm: map bytes [%d, +%d) of a %d-byte chunk at offset %d of reservation: %w",
			from, size, phys.size, off, err)
	}
	return m, nil
}

func mapChunk(r *Reservation, off uint64, phys *PhysicalAllocation, from, size uint64) (*Mapping, error) {
	base, h := r.Ptr(), phys.Handle()
	switch {
	case base == 0:
		return nil, errReleased("reservation")
	case h == 0:
		return nil, errReleased("chunk")
	case from > phys.size || size > phys.size-from:
		return nil, fmt.Errorf("bytes [%d, +%d) are not in the %d-byte chunk: %w", from, size, phys.size, gpu.ErrInvalidValue)
	case off > r.size || size > r.size-off:
		return nil, fmt.Errorf("%d bytes at offset %d do not fit in the %d-byte range %#x: %w",
			size, off, r.size, uint64(base), gpu.ErrInvalidValue)
	}
	p := base.Add(off)
	if err := r.drv.MemMap(p, size, from, h); err != nil {
		return nil, fmt.Errorf("at %#x: %w", uint64(p), err)
	}
	m := &Mapping{drv: r.drv, ptr: p, size: size}
	m.mu.mapped = true
	return m, nil
}

// Ptr is the mapped address.
func (m *Mapping) Ptr() gpu.DevicePtr { return m.ptr }

// Size is the mapped size in bytes.
func (m *Mapping) Size() uint64 { return m.size }

// Access returns the devices granted access so far.
func (m *Mapping) Access() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.mu.access)
}

// SetAccess grants read-write access to each device in devs (Mapped →
// Accessible). Devices granted earlier keep their access.
func (m *Mapping) SetAccess(devs []int) error {
	if err := m.setAccess(devs); err != nil {
		return fmt.Errorf("vmm: set access for devices %v to %#x+%d: %w", devs, uint64(m.ptr), m.size, err)
	}
	return nil
}

func (m *Mapping) setAccess(devs []int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.mu.mapped {
		return errReleased("mapping")
	}
	if err := m.drv.MemSetAccess(m.ptr, m.size, devs); err != nil {
		return err
	}
	for _, d := range devs {
		if !slices.Contains(m.mu.access, d) {
			m.mu.access = append(m.mu.access, d)
		}
	}
	return nil
}

// Close unmaps the range (Mapped/Accessible → Created+Reserved); access
// goes with the mapping. If the driver refuses, the mapping stays and Close
// may be called again; a second Close after success is gpu.ErrInvalidHandle.
func (m *Mapping) Close() error {
	if err := m.unmap(); err != nil {
		return fmt.Errorf("vmm: unmap %#x+%d: %w", uint64(m.ptr), m.size, err)
	}
	return nil
}

func (m *Mapping) unmap() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.mu.mapped {
		return errReleased("mapping")
	}
	if err := m.drv.MemUnmap(m.ptr, m.size); err != nil {
		return err
	}
	m.mu.mapped = false
	m.mu.access = nil
	return nil
}

func (m *Mapping) live() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.mapped
}
