package cuda

import (
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

var _ gpu.AddressRanger = (*Backend)(nil)

// Allocation extents (gpu.AddressRanger), answered from a cache of address
// ranges so that the steady state of a runtime checking its bindings makes
// no driver call.
//
// Where the answer comes from, by kind of memory:
//
//   - MemAlloc and HostAlloc memory of this backend: its own tables, exact
//     (the size asked for). Entries are added when the memory is allocated
//     and dropped before it is freed, so an answer is never stale for
//     memory the backend freed itself.
//   - Virtual memory of this backend (an address inside one of its
//     reservations): the run of contiguous mappings holding the address,
//     from its mapping table, cached until a MemMap, MemUnmap or
//     MemAddressFree touches the run. A reserved, unmapped address is
//     gpu.ErrNotFound.
//   - Memory of other libraries (PyTorch's caching allocator, cuBLAS
//     workspaces, ...): cuMemGetAddressRange_v2 once per allocation, then
//     the cache. Only plain cuMemAlloc allocations are believed (the
//     driver marks them legacy-IPC capable): for virtual memory the driver
//     reports only the one physical allocation mapped at the address, not
//     the run of mappings an access may cross, and the same may hold for
//     memory pools, so for those the extent is unknown
//     (gpu.ErrNotSupported: not checked). An address the driver knows no
//     allocation for is gpu.ErrNotFound.
//
// What cannot be known: memory another library frees and reallocates at
// the same base with another size is reported with its old extent (the
// backend sees neither call; it learns of it only when its own MemAlloc or
// HostAlloc returns an overlapping range). A caching allocator's segment
// is one cuMemAlloc holding many tensors: its extent bounds a tensor's
// binding only at the segment's ends, not at its neighbours'.

// extentKind says where an extent came from.
type extentKind uint8

const (
	extOwnAlloc extentKind = iota + 1 // MemAlloc of this backend
	extOwnHost                        // HostAlloc of this backend
	extOwnVMM                         // a run of this backend's mappings
	extForeign                        // another library's cuMemAlloc, per the driver
	extUnknown                        // another library's memory of unknowable extent
)

func (k extentKind) own() bool { return k == extOwnAlloc || k == extOwnHost || k == extOwnVMM }

type extent struct {
	base, size uint64
	kind       extentKind
}

func (e extent) end() uint64 { return e.base + e.size }

// extentCache is a sorted set of disjoint extents. Reads take the read
// lock only; it nests inside Backend.mu, never the other way.
type extentCache struct {
	mu  sync.RWMutex
	ext []extent // sorted by base, disjoint
}

// find returns the index of the first extent ending after a.
func (c *extentCache) find(a uint64) int {
	return sort.Search(len(c.ext), func(i int) bool { return c.ext[i].end() > a })
}

// lookup returns the extent holding a.
func (c *extentCache) lookup(a uint64) (extent, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if i := c.find(a); i < len(c.ext) && c.ext[i].base <= a {
		return c.ext[i], true
	}
	return extent{}, false
}

// insert adds e, first dropping the extents it overlaps: they describe
// memory that was freed behind the backend's back. A learned extent
// (foreign or unknown) never displaces one of the backend's own.
func (c *extentCache) insert(e extent) {
	if e.size == 0 || e.end() < e.base {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	lo := c.find(e.base)
	hi := lo
	for hi < len(c.ext) && c.ext[hi].base < e.end() {
		if !e.kind.own() && c.ext[hi].kind.own() {
			return
		}
		hi++
	}
	c.ext = slices.Replace(c.ext, lo, hi, e)
}

// drop removes the extents overlapping [lo, hi), and with touch also the
// runs of mappings ending at lo or starting at hi (a mapping made or
// removed there changes the run).
func (c *extentCache) drop(lo, hi uint64, touch bool) {
	hit := func(e extent) bool {
		return e.base < hi && e.end() > lo || touch && e.kind == extOwnVMM && (e.end() == lo || e.base == hi)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	i := c.find(max(lo, 1) - 1) // the first extent ending at lo or later
	j := i
	for j < len(c.ext) && c.ext[j].base <= hi {
		j++
	}
	k := i
	for _, e := range c.ext[i:j] {
		if !hit(e) {
			c.ext[k] = e
			k++
		}
	}
	c.ext = append(c.ext[:k], c.ext[j:]...)
}

// AddressRange implements gpu.AddressRanger (see the top of extent.go for
// what it can see). A cached answer costs a binary search under a read
// lock; a miss costs, for memory of other libraries, one
// cuMemGetAddressRange_v2 and one cuPointerGetAttribute.
func (b *Backend) AddressRange(p gpu.DevicePtr) (gpu.DevicePtr, uint64, error) {
	const op = "AddressRange"
	if p == 0 {
		return 0, 0, errf(op, gpu.ErrNotFound, "the null pointer is in no allocation")
	}
	if e, ok := b.ext.lookup(uint64(p)); ok {
		return answer(op, p, e)
	}
	if _, err := b.device(op, 0); err != nil { // closed
		return 0, 0, err
	}
	if e, ok, err := b.vmmExtent(op, p); ok || err != nil {
		if err != nil {
			return 0, 0, err
		}
		return answer(op, p, e)
	}
	e, err := b.driverExtent(op, p)
	if err != nil {
		return 0, 0, err
	}
	b.ext.insert(e)
	return answer(op, p, e)
}

func answer(op string, p gpu.DevicePtr, e extent) (gpu.DevicePtr, uint64, error) {
	if e.kind == extUnknown {
		return 0, 0, errf(op, gpu.ErrNotSupported,
			"%#x is in memory of another library that is no plain cuMemAlloc allocation (virtual memory, a memory pool or host memory): its extent cannot be known", uint64(p))
	}
	return gpu.DevicePtr(e.base), e.size, nil
}

// vmmExtent answers for an address in one of the backend's reservations
// (ok), caching the run of mappings holding it.
func (b *Backend) vmmExtent(op string, p gpu.DevicePtr) (extent, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var rbase gpu.DevicePtr
	var rsize uint64
	for at, size := range b.mu.resv {
		if p >= at && uint64(p-at) < size {
			rbase, rsize = at, size
			break
		}
	}
	if rsize == 0 {
		return extent{}, false, nil
	}
	ms := b.mappedLocked(rbase, rsize) // sorted by address
	i := sort.Search(len(ms), func(i int) bool { return ms[i].Add(b.mu.maps[ms[i]].size) > p })
	if i == len(ms) || ms[i] > p {
		return extent{}, false, errf(op, gpu.ErrNotFound, "%#x is reserved (reservation [%#x, +%d)) but not mapped", uint64(p), uint64(rbase), rsize)
	}
	lo, hi := i, i
	for lo > 0 && ms[lo-1].Add(b.mu.maps[ms[lo-1]].size) == ms[lo] {
		lo--
	}
	for hi+1 < len(ms) && ms[hi].Add(b.mu.maps[ms[hi]].size) == ms[hi+1] {
		hi++
	}
	end := ms[hi].Add(b.mu.maps[ms[hi]].size)
	e := extent{base: uint64(ms[lo]), size: uint64(end - ms[lo]), kind: extOwnVMM}
	b.ext.insert(e) // under b.mu: a concurrent MemUnmap drops it after, not before
	return e, true, nil
}

// driverExtent asks the driver about memory the backend did not allocate.
func (b *Backend) driverExtent(op string, p gpu.DevicePtr) (extent, error) {
	var base cu.DevicePtr
	var size uint64
	var r cu.Result
	err := b.onDevice(0, func() error { r = b.d.MemGetAddressRange(&base, &size, cu.DevicePtr(p)); return nil })
	switch {
	case err != nil:
		return extent{}, err
	case r == cu.ErrorNotFound || r == cu.ErrorInvalidValue:
		return extent{}, errf(op, gpu.ErrNotFound, "%#x is in no allocation the driver knows (%s from cuMemGetAddressRange_v2): freed, never allocated, or pageable host memory",
			uint64(p), r.Name())
	case r == cu.ErrorNotLoaded:
		return extent{}, &gpu.Error{Op: "cuMemGetAddressRange_v2", Err: gpu.ErrNotSupported,
			Detail: fmt.Sprintf("symbol not exported by %s: the extent of %#x cannot be known", b.d.Path, uint64(p))}
	case r != cu.Success:
		return extent{}, b.check("cuMemGetAddressRange_v2", r)
	case size == 0 || uint64(p) < uint64(base) || uint64(p)-uint64(base) >= size:
		// In the driver's rounding of an allocation, past its size.
		return extent{}, errf(op, gpu.ErrNotFound, "%#x is past the end of the allocation [%#x, +%d) (cuMemGetAddressRange_v2)", uint64(p), uint64(base), size)
	}
	// The driver rounds allocations up: an address past the end of one of
	// the backend's own (which the cache would have answered for) is in
	// none, whatever the driver says.
	if own, osize, ok := b.ownAt(gpu.DevicePtr(base)); ok {
		return extent{}, errf(op, gpu.ErrNotFound, "%#x is past the end of the allocation [%#x, +%d) (%s)", uint64(p), uint64(own), osize,
			"the driver's allocation is rounded up")
	}
	// Only plain allocations are believed; a failed query counts as "not
	// plain": the binding goes unchecked rather than wrongly refused.
	var ipc int32
	err = b.call(0, "cuPointerGetAttribute", func() cu.Result {
		return b.d.PointerGetAttributeInt(&ipc, cu.PointerAttrIsLegacyIPCCapable, cu.DevicePtr(p))
	})
	kind := extForeign
	if err != nil || ipc == 0 {
		kind = extUnknown
	}
	return extent{base: uint64(base), size: size, kind: kind}, nil
}

// ownAt reports the backend's own MemAlloc or HostAlloc allocation
// starting at base.
func (b *Backend) ownAt(base gpu.DevicePtr) (gpu.DevicePtr, uint64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ai, ok := b.mu.allocs[base]; ok {
		return base, ai.size, true
	}
	for _, hi := range b.mu.hosts {
		if gpu.DevicePtr(hi.dp) == base {
			return base, hi.size, true
		}
	}
	return 0, 0, false
}
