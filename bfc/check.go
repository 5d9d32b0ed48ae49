package bfc

import (
	"fmt"
	"slices"
)

// check verifies every structural invariant of the allocator and returns the
// first violation. It is O(n) and meant for tests (bfc_test.go checks after
// every operation, fuzz_test.go after every fuzzed one); the allocator
// itself never calls it. There is no invariants build tag: nothing checks
// it in production builds.
//
// The invariants:
//  1. The address list starts at base, its chunks are contiguous, non-empty,
//     aligned, and end exactly at base+size; prev links mirror next links.
//  2. No two free chunks are adjacent (coalescing is complete).
//  3. The chunk map holds exactly the chunks of the list, by start address.
//  4. The free index is strictly sorted by (size, address) and holds exactly
//     the free chunks, with their current sizes.
//  5. The counters match the list: in-use bytes, requested bytes and live
//     allocations; requested <= chunk size for every allocation; the peak
//     is at least the current use.
func (a *Allocator) check() error {
	a.mu.Lock()
	defer a.mu.Unlock()

	var (
		next              = a.base
		prev              *chunk
		n, allocs         int
		inUse, requested  uint64
		wantFree          []freeKey
		prevFree          bool
		firstInconsistent error
	)
	fail := func(format string, args ...any) {
		if firstInconsistent == nil {
			firstInconsistent = fmt.Errorf("bfc %q: invariant: "+format, append([]any{a.name}, args...)...)
		}
	}
	for c := a.mu.head; c != nil && firstInconsistent == nil; c = c.next {
		n++
		if n > len(a.mu.chunks)+1 {
			fail("address list longer than the chunk map (%d chunks): a cycle?", len(a.mu.chunks))
			break
		}
		if c.prev != prev {
			fail("chunk %#x: prev link does not point at the previous chunk", uint64(c.addr))
		}
		if c.addr != next {
			fail("chunk %#x: expected to start at %#x (gap or overlap)", uint64(c.addr), uint64(next))
		}
		if c.size == 0 || c.size%a.align != 0 || uint64(c.addr)%a.align != 0 {
			fail("chunk %#x: size %d or address not aligned to %d", uint64(c.addr), c.size, a.align)
		}
		if a.mu.chunks[c.addr] != c {
			fail("chunk %#x: missing from the chunk map", uint64(c.addr))
		}
		if c.free {
			if prevFree {
				fail("chunk %#x: free and adjacent to a free chunk (not coalesced)", uint64(c.addr))
			}
			if c.requested != 0 {
				fail("chunk %#x: free but records a request of %d bytes", uint64(c.addr), c.requested)
			}
			wantFree = append(wantFree, freeKey{c.size, c.addr})
		} else {
			if c.requested == 0 || c.requested > c.size {
				fail("chunk %#x: request of %d bytes does not fit its %d-byte chunk", uint64(c.addr), c.requested, c.size)
			}
			allocs++
			inUse += c.size
			requested += c.requested
		}
		prevFree = c.free
		next = c.addr.Add(c.size)
		prev = c
	}
	if firstInconsistent != nil {
		return firstInconsistent
	}
	if end := a.base.Add(a.size); next != end {
		fail("chunks end at %#x, the region at %#x", uint64(next), uint64(end))
	}
	if n != len(a.mu.chunks) {
		fail("address list has %d chunks, the chunk map %d", n, len(a.mu.chunks))
	}
	for i := 1; i < len(a.mu.free); i++ {
		if compareFreeKey(a.mu.free[i-1], a.mu.free[i]) >= 0 {
			fail("free index not strictly sorted at %d: %+v then %+v", i, a.mu.free[i-1], a.mu.free[i])
		}
	}
	slices.SortFunc(wantFree, compareFreeKey)
	if !slices.Equal(wantFree, a.mu.free) {
		fail("free index %v does not match the free chunks %v", a.mu.free, wantFree)
	}
	if inUse != a.mu.inUse || requested != a.mu.requested || allocs != a.mu.allocs {
		fail("counters in-use=%d requested=%d allocations=%d, chunks say %d, %d, %d",
			a.mu.inUse, a.mu.requested, a.mu.allocs, inUse, requested, allocs)
	}
	if a.mu.peak < a.mu.inUse {
		fail("peak %d below in-use %d", a.mu.peak, a.mu.inUse)
	}
	return firstInconsistent
}
