package cuda

import (
	"sort"
	"unsafe"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

// MemAlloc implements gpu.DeviceMemory.
func (b *Backend) MemAlloc(dev int, size uint64) (gpu.DevicePtr, error) {
	if _, err := b.device("MemAlloc", dev); err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, errf("MemAlloc", gpu.ErrInvalidValue, "size 0")
	}
	var p cu.DevicePtr
	if err := b.call(dev, "cuMemAlloc_v2", func() cu.Result { return b.d.MemAlloc(&p, size) }); err != nil {
		return 0, err
	}
	b.mu.Lock()
	b.mu.allocs[gpu.DevicePtr(p)] = allocInfo{dev: dev, size: size}
	b.mu.Unlock()
	b.ext.insert(extent{base: uint64(p), size: size, kind: extOwnAlloc})
	return gpu.DevicePtr(p), nil
}

// MemFree implements gpu.DeviceMemory.
func (b *Backend) MemFree(p gpu.DevicePtr) error {
	b.mu.Lock()
	ai, ok := b.mu.allocs[p]
	delete(b.mu.allocs, p)
	b.mu.Unlock()
	if !ok {
		return errf("MemFree", gpu.ErrInvalidHandle, "%#x is not the start of a live allocation", uint64(p))
	}
	// The extent goes before the memory: no answer outlives it.
	b.ext.drop(uint64(p), uint64(p)+ai.size, false)
	err := b.call(ai.dev, "cuMemFree_v2", func() cu.Result { return b.d.MemFree(cu.DevicePtr(p)) })
	if err != nil {
		b.mu.Lock()
		b.mu.allocs[p] = ai
		b.mu.Unlock()
		b.ext.insert(extent{base: uint64(p), size: ai.size, kind: extOwnAlloc})
	}
	return err
}

// MemGetInfo implements gpu.DeviceMemory.
func (b *Backend) MemGetInfo(dev int) (free, total uint64, err error) {
	if _, err := b.device("MemGetInfo", dev); err != nil {
		return 0, 0, err
	}
	err = b.call(dev, "cuMemGetInfo_v2", func() cu.Result { return b.d.MemGetInfo(&free, &total) })
	return free, total, err
}

// ptrDev returns the device whose context a synchronous copy or memset of
// p should run in: the device that owns the memory when the driver can tell
// (unified addressing), else device 0. Any context can address any device
// memory under UVA; the owner's context keeps the work on that device.
func (b *Backend) ptrDev(p gpu.DevicePtr) int {
	if len(b.devs) == 1 {
		return 0
	}
	var ord int32
	err := b.call(0, "cuPointerGetAttribute", func() cu.Result {
		return b.d.PointerGetAttributeInt(&ord, cu.PointerAttrDeviceOrdinal, cu.DevicePtr(p))
	})
	if err != nil || ord < 0 || int(ord) >= len(b.devs) {
		return 0
	}
	return int(ord)
}

// MemcpyHtoD implements gpu.DeviceMemory.
func (b *Backend) MemcpyHtoD(dst gpu.DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return b.call(b.ptrDev(dst), "cuMemcpyHtoD_v2", func() cu.Result { return b.d.MemcpyHtoD(cu.DevicePtr(dst), src) })
}

// MemcpyDtoH implements gpu.DeviceMemory.
func (b *Backend) MemcpyDtoH(dst []byte, src gpu.DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	return b.call(b.ptrDev(src), "cuMemcpyDtoH_v2", func() cu.Result { return b.d.MemcpyDtoH(dst, cu.DevicePtr(src)) })
}

// MemcpyDtoD implements gpu.DeviceMemory.
func (b *Backend) MemcpyDtoD(dst, src gpu.DevicePtr, size uint64) error {
	if size == 0 {
		return nil
	}
	return b.call(b.ptrDev(dst), "cuMemcpyDtoD_v2", func() cu.Result {
		return b.d.MemcpyDtoD(cu.DevicePtr(dst), cu.DevicePtr(src), size)
	})
}

// checkMemset validates m's element size and alignment (CUDA's memsets
// need Dst aligned to the element size).
func checkMemset(op string, m gpu.Memset) error {
	switch m.ElemSize {
	case 1, 2, 4:
	default:
		return errf(op, gpu.ErrInvalidValue, "element size %d (want 1, 2 or 4)", m.ElemSize)
	}
	if uint64(m.Dst)%uint64(m.ElemSize) != 0 {
		return errf(op, gpu.ErrInvalidValue, "destination %#x not aligned to its %d-byte elements", uint64(m.Dst), m.ElemSize)
	}
	return nil
}

// Memset implements gpu.DeviceMemory.
func (b *Backend) Memset(m gpu.Memset) error {
	if err := checkMemset("Memset", m); err != nil || m.Count == 0 {
		return err
	}
	dst := cu.DevicePtr(m.Dst)
	switch m.ElemSize {
	case 1:
		return b.call(b.ptrDev(m.Dst), "cuMemsetD8_v2", func() cu.Result { return b.d.MemsetD8(dst, uint8(m.Value), m.Count) })
	case 2:
		return b.call(b.ptrDev(m.Dst), "cuMemsetD16_v2", func() cu.Result { return b.d.MemsetD16(dst, uint16(m.Value), m.Count) })
	}
	return b.call(b.ptrDev(m.Dst), "cuMemsetD32_v2", func() cu.Result { return b.d.MemsetD32(dst, m.Value, m.Count) })
}

// MemcpyHtoDAsync implements gpu.DeviceMemory.
func (b *Backend) MemcpyHtoDAsync(dst gpu.DevicePtr, src []byte, s gpu.Stream) error {
	dev, cs, err := b.stream("MemcpyHtoDAsync", s)
	if err != nil || len(src) == 0 {
		return err
	}
	return b.call(dev, "cuMemcpyHtoDAsync_v2", func() cu.Result { return b.d.MemcpyHtoDAsync(cu.DevicePtr(dst), src, cs) })
}

// MemcpyDtoHAsync implements gpu.DeviceMemory.
func (b *Backend) MemcpyDtoHAsync(dst []byte, src gpu.DevicePtr, s gpu.Stream) error {
	dev, cs, err := b.stream("MemcpyDtoHAsync", s)
	if err != nil || len(dst) == 0 {
		return err
	}
	return b.call(dev, "cuMemcpyDtoHAsync_v2", func() cu.Result { return b.d.MemcpyDtoHAsync(dst, cu.DevicePtr(src), cs) })
}

// MemcpyDtoDAsync implements gpu.DeviceMemory.
func (b *Backend) MemcpyDtoDAsync(dst, src gpu.DevicePtr, size uint64, s gpu.Stream) error {
	dev, cs, err := b.stream("MemcpyDtoDAsync", s)
	if err != nil || size == 0 {
		return err
	}
	return b.call(dev, "cuMemcpyDtoDAsync_v2", func() cu.Result {
		return b.d.MemcpyDtoDAsync(cu.DevicePtr(dst), cu.DevicePtr(src), size, cs)
	})
}

// MemsetAsync implements gpu.DeviceMemory.
func (b *Backend) MemsetAsync(m gpu.Memset, s gpu.Stream) error {
	dev, cs, err := b.stream("MemsetAsync", s)
	if err != nil {
		return err
	}
	if err := checkMemset("MemsetAsync", m); err != nil || m.Count == 0 {
		return err
	}
	dst := cu.DevicePtr(m.Dst)
	switch m.ElemSize {
	case 1:
		return b.call(dev, "cuMemsetD8Async", func() cu.Result { return b.d.MemsetD8Async(dst, uint8(m.Value), m.Count, cs) })
	case 2:
		return b.call(dev, "cuMemsetD16Async", func() cu.Result { return b.d.MemsetD16Async(dst, uint16(m.Value), m.Count, cs) })
	}
	return b.call(dev, "cuMemsetD32Async", func() cu.Result { return b.d.MemsetD32Async(dst, m.Value, m.Count, cs) })
}

// ---- virtual memory ----

// vmmDev returns dev's granularity, or an error when dev is bad or has no
// VMM.
func (b *Backend) vmmDev(op string, dev int) (uint64, error) {
	d, err := b.device(op, dev)
	if err != nil {
		return 0, err
	}
	if !d.props.VMM {
		return 0, errf(op, gpu.ErrNotSupported, "device %d (%s) has no virtual memory management", dev, d.props.Name)
	}
	return d.props.Granularity, nil
}

// AllocationGranularity implements gpu.VirtualMemory.
func (b *Backend) AllocationGranularity(dev int) (uint64, error) {
	return b.vmmDev("AllocationGranularity", dev)
}

// MemCreate implements gpu.VirtualMemory. The chunk is made of one driver
// allocation per granule (size/granularity cuMemCreate calls, each priced
// in docs/GPU-MACHINE.md), because cuMemMap maps only whole allocations
// from offset 0 while MemMap may map any granule-aligned part of a chunk.
func (b *Backend) MemCreate(dev int, size uint64) (gpu.PhysMem, error) {
	gran, err := b.vmmDev("MemCreate", dev)
	if err != nil {
		return 0, err
	}
	if size == 0 || size%gran != 0 {
		return 0, errf("MemCreate", gpu.ErrInvalidValue, "size %d is not a positive multiple of the granularity %d", size, gran)
	}
	parts := make([]cu.MemHandle, 0, size/gran)
	prop := allocProp(dev)
	err = b.onDevice(dev, func() error {
		for range size / gran {
			var h cu.MemHandle
			if r := b.d.MemCreate(&h, gran, &prop, 0); r != cu.Success {
				return b.check("cuMemCreate", r)
			}
			parts = append(parts, h)
		}
		return nil
	})
	if err != nil {
		_ = b.releaseParts(dev, parts) // the error that matters is err
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	h := gpu.PhysMem(b.newIDLocked())
	b.mu.chunks[h] = &chunkInfo{dev: dev, size: size, gran: gran, parts: parts}
	return h, nil
}

// releaseParts releases a chunk's allocations (each stays alive in the
// driver while mapped).
func (b *Backend) releaseParts(dev int, parts []cu.MemHandle) error {
	return b.onDevice(dev, func() error {
		var first error
		for _, p := range parts {
			if r := b.d.MemRelease(p); r != cu.Success && first == nil {
				first = b.check("cuMemRelease", r)
			}
		}
		return first
	})
}

// MemRelease implements gpu.VirtualMemory. A mapped chunk stays alive (in
// the driver) until its last mapping is unmapped; its handle is gone at once.
func (b *Backend) MemRelease(h gpu.PhysMem) error {
	b.mu.Lock()
	ci, ok := b.mu.chunks[h]
	delete(b.mu.chunks, h)
	b.mu.Unlock()
	if !ok {
		return errf("MemRelease", gpu.ErrInvalidHandle, "chunk %#x is not live", uint64(h))
	}
	return b.releaseParts(ci.dev, ci.parts)
}

// MemAddressReserve implements gpu.VirtualMemory. Sizes and alignments are
// checked against device 0's granularity (reservations belong to no device).
func (b *Backend) MemAddressReserve(size, align uint64) (gpu.DevicePtr, error) {
	gran, err := b.vmmDev("MemAddressReserve", 0)
	if err != nil {
		return 0, err
	}
	if size == 0 || size%gran != 0 {
		return 0, errf("MemAddressReserve", gpu.ErrInvalidValue, "size %d is not a positive multiple of the granularity %d", size, gran)
	}
	if align != 0 && (align%gran != 0 || align&(align-1) != 0) {
		return 0, errf("MemAddressReserve", gpu.ErrInvalidValue, "alignment %d is not a power-of-two multiple of the granularity %d", align, gran)
	}
	var p cu.DevicePtr
	if err := b.call(0, "cuMemAddressReserve", func() cu.Result { return b.d.MemAddressReserve(&p, size, align, 0, 0) }); err != nil {
		return 0, err
	}
	b.mu.Lock()
	b.mu.resv[gpu.DevicePtr(p)] = size
	b.mu.Unlock()
	return gpu.DevicePtr(p), nil
}

// mappedLocked returns the mappings overlapping [p, p+size), by address.
func (b *Backend) mappedLocked(p gpu.DevicePtr, size uint64) []gpu.DevicePtr {
	var out []gpu.DevicePtr
	for at, mi := range b.mu.maps {
		if at < p.Add(size) && p < at.Add(mi.size) {
			out = append(out, at)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// MemAddressFree implements gpu.VirtualMemory.
func (b *Backend) MemAddressFree(p gpu.DevicePtr, size uint64) error {
	b.mu.Lock()
	rs, ok := b.mu.resv[p]
	var err error
	switch {
	case !ok:
		err = errf("MemAddressFree", gpu.ErrInvalidHandle, "%#x is not a live reservation", uint64(p))
	case rs != size:
		err = errf("MemAddressFree", gpu.ErrInvalidValue, "reservation %#x has %d bytes, not %d", uint64(p), rs, size)
	case len(b.mappedLocked(p, size)) > 0:
		err = errf("MemAddressFree", gpu.ErrIllegalState, "reservation %#x is still mapped", uint64(p))
	default:
		delete(b.mu.resv, p)
	}
	b.mu.Unlock()
	if err != nil {
		return err
	}
	b.ext.drop(uint64(p), uint64(p)+size, false) // learned extents of addresses reused
	err = b.call(0, "cuMemAddressFree", func() cu.Result { return b.d.MemAddressFree(cu.DevicePtr(p), size) })
	if err != nil {
		b.mu.Lock()
		b.mu.resv[p] = rs
		b.mu.Unlock()
	}
	return err
}

// inReservationLocked reports whether [p, p+size) lies inside one
// reservation.
func (b *Backend) inReservationLocked(p gpu.DevicePtr, size uint64) bool {
	for at, rs := range b.mu.resv {
		if p >= at && p.Add(size) <= at.Add(rs) {
			return true
		}
	}
	return false
}

// MemMap implements gpu.VirtualMemory. Everything CUDA would refuse is
// checked first, so that a bad mapping never reaches the driver.
func (b *Backend) MemMap(p gpu.DevicePtr, size, offset uint64, h gpu.PhysMem) error {
	const op = "MemMap"
	b.mu.Lock()
	ci, ok := b.mu.chunks[h]
	b.mu.Unlock()
	if !ok {
		return errf(op, gpu.ErrInvalidHandle, "chunk %#x is not live", uint64(h))
	}
	gran := ci.gran
	switch {
	case size == 0 || size%gran != 0 || offset%gran != 0 || uint64(p)%gran != 0:
		return errf(op, gpu.ErrInvalidValue, "address %#x, size %d and offset %d must be multiples of the granularity %d (size > 0)",
			uint64(p), size, offset, gran)
	case offset >= ci.size || size > ci.size-offset:
		return errf(op, gpu.ErrInvalidValue, "bytes [%d, %d) are outside the %d-byte chunk", offset, offset+size, ci.size)
	}
	b.mu.Lock()
	switch {
	case !b.inReservationLocked(p, size):
		b.mu.Unlock()
		return errf(op, gpu.ErrInvalidValue, "[%#x, %#x) is not inside one reservation", uint64(p), uint64(p.Add(size)))
	case len(b.mappedLocked(p, size)) > 0:
		b.mu.Unlock()
		return errf(op, gpu.ErrIllegalState, "[%#x, %#x) overlaps a mapping", uint64(p), uint64(p.Add(size)))
	}
	// Claim the range before the call so that a concurrent MemMap of an
	// overlapping range fails above. The runs of mappings it joins change.
	b.mu.maps[p] = mapInfo{dev: ci.dev, size: size, chunk: h}
	b.ext.drop(uint64(p), uint64(p)+size, true)
	b.mu.Unlock()
	// One cuMemMap per granule of the chunk's range, at consecutive
	// addresses; on failure the granules mapped so far are unmapped.
	first := offset / gran
	err := b.onDevice(ci.dev, func() error {
		for i := range size / gran {
			at := cu.DevicePtr(p) + cu.DevicePtr(i*gran)
			if r := b.d.MemMap(at, gran, 0, ci.parts[first+i], 0); r != cu.Success {
				if i > 0 {
					b.d.MemUnmap(cu.DevicePtr(p), i*gran)
				}
				return b.check("cuMemMap", r)
			}
		}
		return nil
	})
	if err != nil {
		b.mu.Lock()
		delete(b.mu.maps, p)
		b.ext.drop(uint64(p), uint64(p)+size, true)
		b.mu.Unlock()
	}
	return err
}

// coveredLocked returns the mappings that exactly tile [p, p+size), or an
// error saying why they do not.
func (b *Backend) coveredLocked(op string, p gpu.DevicePtr, size uint64) ([]gpu.DevicePtr, error) {
	if size == 0 {
		return nil, errf(op, gpu.ErrInvalidValue, "size 0")
	}
	ms := b.mappedLocked(p, size)
	if len(ms) == 0 {
		return nil, errf(op, gpu.ErrIllegalState, "[%#x, %#x) is not mapped", uint64(p), uint64(p.Add(size)))
	}
	at := p
	for _, m := range ms {
		if m != at {
			if m < p {
				return nil, errf(op, gpu.ErrInvalidValue, "[%#x, %#x) covers only part of the mapping at %#x", uint64(p), uint64(p.Add(size)), uint64(m))
			}
			return nil, errf(op, gpu.ErrIllegalState, "[%#x, %#x) is not mapped", uint64(at), uint64(m))
		}
		at = m.Add(b.mu.maps[m].size)
	}
	switch {
	case at > p.Add(size):
		return nil, errf(op, gpu.ErrInvalidValue, "[%#x, %#x) covers only part of the mapping at %#x", uint64(p), uint64(p.Add(size)), uint64(ms[len(ms)-1]))
	case at < p.Add(size):
		return nil, errf(op, gpu.ErrIllegalState, "[%#x, %#x) is not mapped", uint64(at), uint64(p.Add(size)))
	}
	return ms, nil
}

// MemUnmap implements gpu.VirtualMemory: the range must be tiled exactly by
// whole mappings. One cuMemUnmap covers them all, however many driver
// allocations they span.
func (b *Backend) MemUnmap(p gpu.DevicePtr, size uint64) error {
	b.mu.Lock()
	ms, err := b.coveredLocked("MemUnmap", p, size)
	claimed := map[gpu.DevicePtr]mapInfo{}
	for _, m := range ms {
		claimed[m] = b.mu.maps[m]
		delete(b.mu.maps, m)
	}
	if err == nil {
		b.ext.drop(uint64(p), uint64(p)+size, true)
	}
	b.mu.Unlock()
	if err != nil {
		return err
	}
	err = b.call(claimed[p].dev, "cuMemUnmap", func() cu.Result { return b.d.MemUnmap(cu.DevicePtr(p), size) })
	if err != nil {
		b.mu.Lock()
		for m, mi := range claimed {
			b.mu.maps[m] = mi
		}
		b.mu.Unlock()
	}
	return err
}

// MemSetAccess implements gpu.VirtualMemory.
func (b *Backend) MemSetAccess(p gpu.DevicePtr, size uint64, devs []int) error {
	const op = "MemSetAccess"
	if len(devs) == 0 {
		return errf(op, gpu.ErrInvalidValue, "no devices")
	}
	descs := make([]cu.MemAccessDesc, len(devs))
	for i, d := range devs {
		if d < 0 || d >= len(b.devs) {
			return errf(op, gpu.ErrInvalidValue, "device %d does not exist (%d devices)", d, len(b.devs))
		}
		descs[i] = cu.MemAccessDesc{Location: cu.MemLocation{Type: cu.MemLocationTypeDevice, ID: int32(d)}, Flags: cu.MemAccessReadWrite}
	}
	b.mu.Lock()
	ms, err := b.coveredLocked(op, p, size)
	var dev int
	if err == nil {
		dev = b.mu.maps[ms[0]].dev
	}
	b.mu.Unlock()
	if err != nil {
		return err
	}
	return b.call(dev, "cuMemSetAccess", func() cu.Result { return b.d.MemSetAccess(cu.DevicePtr(p), size, descs) })
}

// ---- host-visible timeline memory ----

// HostAlloc implements gpu.StreamMemOps: cuMemHostAlloc with DEVICEMAP (the
// device can write it) and PORTABLE (every context sees it), zeroed.
func (b *Backend) HostAlloc(size uint64) (gpu.HostMem, error) {
	if _, err := b.device("HostAlloc", 0); err != nil {
		return gpu.HostMem{}, err
	}
	if size == 0 {
		return gpu.HostMem{}, errf("HostAlloc", gpu.ErrInvalidValue, "size 0")
	}
	var hp unsafe.Pointer
	var dp cu.DevicePtr
	err := b.onDevice(0, func() error {
		if r := b.d.MemHostAlloc(&hp, size, cu.MemHostAllocDeviceMap|cu.MemHostAllocPortable); r != cu.Success {
			return b.check("cuMemHostAlloc", r)
		}
		if r := b.d.MemHostGetDevicePointer(&dp, hp, 0); r != cu.Success {
			err := b.check("cuMemHostGetDevicePointer_v2", r)
			b.d.MemFreeHost(hp) // nothing to report beyond err
			return err
		}
		return nil
	})
	if err != nil {
		return gpu.HostMem{}, err
	}
	bytes := unsafe.Slice((*byte)(hp), size)
	clear(bytes)
	b.mu.Lock()
	h := gpu.HostAlloc(b.newIDLocked())
	b.mu.hosts[h] = hostInfo{p: hp, dp: dp, size: size}
	b.mu.Unlock()
	b.ext.insert(extent{base: uint64(dp), size: size, kind: extOwnHost})
	return gpu.HostMem{Handle: h, Ptr: gpu.DevicePtr(dp), Bytes: bytes}, nil
}

// HostFree implements gpu.StreamMemOps.
func (b *Backend) HostFree(h gpu.HostAlloc) error {
	b.mu.Lock()
	hi, ok := b.mu.hosts[h]
	delete(b.mu.hosts, h)
	b.mu.Unlock()
	if !ok {
		return errf("HostFree", gpu.ErrInvalidHandle, "host allocation %#x is not live", uint64(h))
	}
	b.ext.drop(uint64(hi.dp), uint64(hi.dp)+hi.size, false)
	err := b.call(0, "cuMemFreeHost", func() cu.Result { return b.d.MemFreeHost(hi.p) })
	if err != nil {
		b.mu.Lock()
		b.mu.hosts[h] = hi
		b.mu.Unlock()
		b.ext.insert(extent{base: uint64(hi.dp), size: hi.size, kind: extOwnHost})
	}
	return err
}

// StreamMemOpsSupported implements gpu.StreamMemOps: dev must report
// 64-bit stream memory operations and the driver have cuStreamWriteValue64.
func (b *Backend) StreamMemOpsSupported(dev int) error {
	const op = "StreamMemOpsSupported"
	d, err := b.device(op, dev)
	if err != nil {
		return err
	}
	if !d.props.StreamMemOps {
		return errf(op, gpu.ErrNotSupported, "device %d (%s) has no 64-bit stream memory operations", dev, d.props.Name)
	}
	return nil
}

// StreamWriteValue64 implements gpu.StreamMemOps.
func (b *Backend) StreamWriteValue64(s gpu.Stream, p gpu.DevicePtr, v uint64) error {
	const op = "StreamWriteValue64"
	dev, cs, err := b.stream(op, s)
	if err != nil {
		return err
	}
	if !b.devs[dev].props.StreamMemOps {
		return errf(op, gpu.ErrNotSupported, "device %d (%s) has no 64-bit stream memory operations", dev, b.devs[dev].props.Name)
	}
	if p == 0 || p%8 != 0 {
		return errf(op, gpu.ErrInvalidValue, "address %#x is not 8-byte aligned and nonzero", uint64(p))
	}
	return b.call(dev, "cuStreamWriteValue64_v2", func() cu.Result { return b.d.StreamWriteValue64(cs, cu.DevicePtr(p), v, 0) })
}
