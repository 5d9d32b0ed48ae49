package sim

import (
	"github.com/stablegraph/stablegraph/gpu"
)

var _ gpu.AddressRanger = (*Backend)(nil)

// AddressRange implements gpu.AddressRanger. The sim sees every allocation,
// so it always answers: MemAlloc and HostAlloc memory has the extent of its
// allocation, exactly the size asked for (an access past it faults); an
// address in a reservation has the extent of the run of contiguous mappings
// holding it, whatever their chunks and access rights (an access may cross
// mappings, as resolve allows). An address that is freed, unmapped or never
// allocated is gpu.ErrNotFound, with the reason a fault there would give.
// It costs a binary search under the read lock.
func (b *Backend) AddressRange(p gpu.DevicePtr) (gpu.DevicePtr, uint64, error) {
	const op = "AddressRange"
	if err := b.enter(op); err != nil {
		return 0, 0, err
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	base, size, reason := b.mu.as.extentAt(uint64(p))
	if reason != "" {
		return 0, 0, gpu.Errorf(op, gpu.ErrNotFound, "%#x is in no live allocation: %s", uint64(p), reason)
	}
	return gpu.DevicePtr(base), size, nil
}

// extentAt returns the extent of the allocation holding a (see
// AddressRange), or why there is none.
func (as *addrSpace) extentAt(a uint64) (base, size uint64, reason string) {
	r := as.regionAt(a)
	switch {
	case r == nil:
		return 0, 0, "unmapped"
	case r.freed:
		return 0, 0, "freed"
	case r.kind != regReserve:
		return r.start, r.size, ""
	}
	i := mappingIndex(r, a)
	if i >= len(r.maps) || r.maps[i].start > a {
		return 0, 0, "reserved but not mapped"
	}
	lo, hi := i, i
	for lo > 0 && r.maps[lo-1].end() == r.maps[lo].start {
		lo--
	}
	for hi+1 < len(r.maps) && r.maps[hi].end() == r.maps[hi+1].start {
		hi++
	}
	return r.maps[lo].start, r.maps[hi].end() - r.maps[lo].start, ""
}
