package sim

import (
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
)

// VMM: physical chunks (MemCreate) mapped into reservations
// (MemAddressReserve) with MemMap, made accessible with MemSetAccess. See
// doc.go for the states and the rules checked.

func checkGran(op string, what string, v uint64) error {
	if v%Granularity != 0 {
		return gpu.Errorf(op, gpu.ErrInvalidValue, "%s %#x is not a multiple of the %d-byte granularity", what, v, Granularity)
	}
	return nil
}

func (b *Backend) AllocationGranularity(dev int) (uint64, error) {
	const op = "AllocationGranularity"
	if err := b.enter(op); err != nil {
		return 0, err
	}
	if err := b.checkDev(op, dev); err != nil {
		return 0, err
	}
	return Granularity, nil
}

// MemCreate creates a chunk of size bytes on dev, charged to dev's memory.
// Its bytes are zero (CUDA leaves them undefined).
func (b *Backend) MemCreate(dev int, size uint64) (gpu.PhysMem, error) {
	const op = "MemCreate"
	if err := b.enter(op); err != nil {
		return 0, err
	}
	if err := b.checkDev(op, dev); err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, gpu.Errorf(op, gpu.ErrInvalidValue, "size is zero")
	}
	if err := checkGran(op, "size", size); err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return 0, errClosed(op)
	}
	if err := b.chargeLocked(op, dev, size, size); err != nil {
		return 0, err
	}
	if err := checkAllocSize(op, size, maxAllocSize); err != nil {
		return 0, err
	}
	c := &chunk{handle: gpu.PhysMem(b.newHandleLocked()), dev: dev, size: size, mem: newBacking(size)}
	b.mu.as.chunks[c.handle] = c
	b.mu.as.used[dev] += size
	return c.handle, nil
}

// MemRelease releases h. Like CUDA, a chunk still mapped stays alive (and
// charged) until its last mapping is unmapped; its handle is gone at once.
func (b *Backend) MemRelease(h gpu.PhysMem) error {
	const op = "MemRelease"
	if err := b.enter(op); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	c, err := getLocked(b, op, "chunk", b.mu.as.chunks, h)
	if err != nil {
		return err
	}
	delete(b.mu.as.chunks, h)
	c.released = true
	if c.maps == 0 {
		b.freeChunkLocked(c)
	}
	return nil
}

func (b *Backend) freeChunkLocked(c *chunk) {
	b.mu.as.used[c.dev] -= c.size
	c.mem = nil
}

// MemAddressReserve reserves size bytes at a fresh address aligned to
// max(align, granularity). Addresses are never reused.
func (b *Backend) MemAddressReserve(size, align uint64) (gpu.DevicePtr, error) {
	const op = "MemAddressReserve"
	if err := b.enter(op); err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, gpu.Errorf(op, gpu.ErrInvalidValue, "size is zero")
	}
	if err := checkGran(op, "size", size); err != nil {
		return 0, err
	}
	if align != 0 && align&(align-1) != 0 {
		return 0, gpu.Errorf(op, gpu.ErrInvalidValue, "alignment %#x is not a power of two", align)
	}
	align = max(align, Granularity)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return 0, errClosed(op)
	}
	// The guard after the reservation keeps it from touching the next one,
	// so an overrun of the last mapping faults.
	start, ok := b.mu.as.carve(size, align, Granularity)
	if !ok {
		return 0, gpu.Errorf(op, gpu.ErrOutOfMemory, "cannot reserve %d bytes: virtual address space exhausted", size)
	}
	r := &region{kind: regReserve, start: start, size: size}
	b.mu.as.insert(r)
	b.mu.as.reserves[gpu.DevicePtr(start)] = r
	return gpu.DevicePtr(start), nil
}

// MemAddressFree frees the reservation at p; size must be its size and it
// must be wholly unmapped (else gpu.ErrIllegalState).
func (b *Backend) MemAddressFree(p gpu.DevicePtr, size uint64) error {
	const op = "MemAddressFree"
	if err := b.enter(op); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r, err := getLocked(b, op, "reservation", b.mu.as.reserves, p)
	if err != nil {
		return err
	}
	if size != r.size {
		return gpu.Errorf(op, gpu.ErrInvalidValue, "reservation at %#x has %d bytes, not %d", uint64(p), r.size, size)
	}
	if len(r.maps) > 0 {
		return gpu.Errorf(op, gpu.ErrIllegalState, "reservation at %#x still has %d mappings (first at %#x)", uint64(p), len(r.maps), r.maps[0].start)
	}
	delete(b.mu.as.reserves, p)
	b.mu.as.release(r)
	return nil
}

// reservationLocked returns the live reservation holding [p, p+size).
func (b *Backend) reservationLocked(op string, p gpu.DevicePtr, size uint64) (*region, error) {
	if b.closed.Load() {
		return nil, errClosed(op)
	}
	r := b.mu.as.regionAt(uint64(p))
	if r == nil || r.freed || r.kind != regReserve {
		return nil, gpu.Errorf(op, gpu.ErrInvalidValue, "%#x is not inside a live reservation", uint64(p))
	}
	if uint64(p)+size < uint64(p) || uint64(p)+size > r.end() {
		return nil, gpu.Errorf(op, gpu.ErrInvalidValue, "range [%#x, +%d) runs past the end of its reservation [%#x, +%d)", uint64(p), size, r.start, r.size)
	}
	return r, nil
}

// coverLocked returns the mappings r.maps[lo:hi] that exactly cover [p,
// p+size): no hole, no mapping cut.
func coverLocked(op string, r *region, p gpu.DevicePtr, size uint64) (lo, hi int, err error) {
	a, end := uint64(p), uint64(p)+size
	lo = mappingIndex(r, a)
	hi = lo
	for a < end {
		if hi >= len(r.maps) || r.maps[hi].start > a {
			return 0, 0, gpu.Errorf(op, gpu.ErrIllegalState, "%#x is not mapped", a)
		}
		m := r.maps[hi]
		if m.start < a || m.end() > end {
			return 0, 0, gpu.Errorf(op, gpu.ErrIllegalState,
				"range [%#x, +%d) cuts the mapping [%#x, +%d): it must cover whole mappings", uint64(p), size, m.start, m.size)
		}
		a = m.end()
		hi++
	}
	return lo, hi, nil
}

func (b *Backend) checkRange(op string, p gpu.DevicePtr, size uint64) error {
	if size == 0 {
		return gpu.Errorf(op, gpu.ErrInvalidValue, "size is zero")
	}
	if err := checkGran(op, "address", uint64(p)); err != nil {
		return err
	}
	return checkGran(op, "size", size)
}

// MemMap maps [offset, offset+size) of h at p, inside a reservation, over a
// range not mapped yet. The mapping starts with no access from any device.
func (b *Backend) MemMap(p gpu.DevicePtr, size, offset uint64, h gpu.PhysMem) error {
	const op = "MemMap"
	if err := b.enter(op); err != nil {
		return err
	}
	if err := b.checkRange(op, p, size); err != nil {
		return err
	}
	if err := checkGran(op, "offset", offset); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	c, err := getLocked(b, op, "chunk", b.mu.as.chunks, h)
	if err != nil {
		return err
	}
	if offset+size < offset || offset+size > c.size {
		return gpu.Errorf(op, gpu.ErrInvalidValue, "[%#x, +%d) is outside the %d-byte chunk %#x", offset, size, c.size, uint64(h))
	}
	r, err := b.reservationLocked(op, p, size)
	if err != nil {
		return err
	}
	i := mappingIndex(r, uint64(p))
	if i < len(r.maps) && r.maps[i].start < uint64(p)+size {
		m := r.maps[i]
		return gpu.Errorf(op, gpu.ErrIllegalState, "[%#x, +%d) overlaps the mapping [%#x, +%d)", uint64(p), size, m.start, m.size)
	}
	r.maps = slices.Insert(r.maps, i, &mapping{start: uint64(p), size: size, chunk: c, offset: offset})
	c.maps++
	b.mu.as.mappings++
	return nil
}

// MemUnmap unmaps [p, p+size), which must be exactly covered by whole
// mappings (else gpu.ErrIllegalState). A released chunk dies with its last
// mapping.
func (b *Backend) MemUnmap(p gpu.DevicePtr, size uint64) error {
	const op = "MemUnmap"
	if err := b.enter(op); err != nil {
		return err
	}
	if err := b.checkRange(op, p, size); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r, err := b.reservationLocked(op, p, size)
	if err != nil {
		return err
	}
	lo, hi, err := coverLocked(op, r, p, size)
	if err != nil {
		return err
	}
	for _, m := range r.maps[lo:hi] {
		m.chunk.maps--
		if m.chunk.released && m.chunk.maps == 0 {
			b.freeChunkLocked(m.chunk)
		}
	}
	r.maps = slices.Delete(r.maps, lo, hi)
	b.mu.as.mappings -= hi - lo
	return nil
}

// MemSetAccess grants read-write access to the whole mappings covering [p,
// p+size) to each device in devs (access of other devices is unchanged).
func (b *Backend) MemSetAccess(p gpu.DevicePtr, size uint64, devs []int) error {
	const op = "MemSetAccess"
	if err := b.enter(op); err != nil {
		return err
	}
	if err := b.checkRange(op, p, size); err != nil {
		return err
	}
	if len(devs) == 0 {
		return gpu.Errorf(op, gpu.ErrInvalidValue, "no devices given")
	}
	var mask uint64
	for _, d := range devs {
		if err := b.checkDev(op, d); err != nil {
			return err
		}
		mask |= 1 << uint(d)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r, err := b.reservationLocked(op, p, size)
	if err != nil {
		return err
	}
	lo, hi, err := coverLocked(op, r, p, size)
	if err != nil {
		return err
	}
	for _, m := range r.maps[lo:hi] {
		m.access |= mask
	}
	return nil
}
