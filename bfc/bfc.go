// Package bfc is a best-fit-with-coalescing allocator over a device address
// range, the kind of caching allocator PyTorch and TensorFlow put in front
// of the driver. stablegraph's callers allocate their buffers from it so that
// buffers move between steps the way they do in a real framework, which is
// the problem the replay strategies exist to solve.
//
// # Policy
//
// An Allocator manages one region [base, base+size) that it is given; it
// never calls the driver. The region is cut into chunks that tile it exactly,
// each either free or holding one allocation.
//
//   - Alignment. Every request is rounded up to Options.Alignment (256 bytes
//     by default, a power of two), and base must be aligned to it, so every
//     chunk starts and ends on an alignment boundary and every returned
//     pointer is aligned.
//   - Best fit. Alloc takes the smallest free chunk that can hold the rounded
//     request; among chunks of that size, the one at the lowest address. The
//     choice is deterministic: the same sequence of calls yields the same
//     addresses.
//   - Splitting. When the chosen chunk is larger than the request by at
//     least Options.MinSplit bytes (default: the alignment, that is, always),
//     the remainder becomes a new free chunk right after the allocation.
//     A smaller remainder stays with the allocation (Size reports it).
//   - Coalescing. Free merges the freed chunk with a free neighbour on
//     either side, so no two free chunks are ever adjacent.
//
// # Guarantees
//
//   - Live allocations never overlap and always lie inside the region.
//   - Every pointer returned is aligned to Options.Alignment.
//   - When every allocation has been freed, the region is again one free
//     chunk of its whole size (coalescing is complete, not lazy).
//   - Stats are exact at every moment: InUse + FreeBytes == Size.
//
// Nothing is promised about which address a request gets beyond the best-fit
// rule; callers must not rely on addresses repeating.
//
// # Data structures
//
// Chunks form a doubly linked list in address order, so the neighbours of a
// chunk are found in O(1) when it is freed. A map from start address to
// chunk finds the chunk of a pointer handed to Free in O(1).
//
// Free chunks are also kept in a slice sorted by (size, address). Best fit
// is a binary search for the first key not below (request, 0): O(log n).
// Inserting and removing shift the tail of the slice, which is O(n) in
// principle, but the slice holds 16-byte keys and moving a few thousand of
// them costs less than one pointer-chasing descent of a balanced tree of
// the same size. A device allocator holds hundreds to a few thousand free
// fragments, not millions, so the sorted slice was chosen over a tree for
// its simplicity and locality; BenchmarkAllocFree measures it.
//
// # Concurrency
//
// An Allocator is safe for concurrent use. One mutex guards all its state
// and is held for the whole of each call; calls are short and never block
// on the device, so finer locking would buy nothing.
package bfc

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"
	"sync"

	"github.com/stablegraph/stablegraph/gpu"
)

// Options configure an Allocator. The zero value is valid; each field's
// default is given with it and applied in New, the only place options are
// read.
type Options struct {
	// Name identifies the allocator in error messages. Default "bfc".
	Name string
	// Alignment is the granularity of chunk sizes and addresses, a power of
	// two. Default 256 (what cudaMalloc guarantees).
	Alignment uint64
	// MinSplit is the smallest remainder worth keeping as a separate free
	// chunk when a larger chunk is cut for a request; smaller remainders
	// stay with the allocation. It is rounded up to Alignment. Default
	// Alignment, which means every remainder is split off.
	MinSplit uint64
}

func (o Options) withDefaults() Options {
	if o.Name == "" {
		o.Name = "bfc"
	}
	if o.Alignment == 0 {
		o.Alignment = 256
	}
	if o.MinSplit == 0 {
		o.MinSplit = o.Alignment
	}
	return o
}

// Stats is a snapshot of an Allocator's state.
type Stats struct {
	Size        uint64 // bytes managed: the region's size
	InUse       uint64 // bytes held by live allocations (chunk sizes, after rounding)
	Requested   uint64 // bytes the live allocations asked for (InUse minus rounding and unsplit remainders)
	Peak        uint64 // highest InUse seen
	Allocations int    // live allocations
	FreeChunks  int    // free chunks (fragments); 1 when nothing is allocated
	FreeBytes   uint64 // Size - InUse
	LargestFree uint64 // size of the largest free chunk: the largest request that can succeed now
}

// chunk is one piece of the region: free, or holding one allocation.
type chunk struct {
	addr       gpu.DevicePtr
	size       uint64
	requested  uint64 // size the caller asked for; 0 while free
	free       bool
	prev, next *chunk // address-order neighbours; nil at the region's ends
}

// freeKey orders free chunks for best fit: by size, then address.
type freeKey struct {
	size uint64
	addr gpu.DevicePtr
}

func compareFreeKey(a, b freeKey) int {
	if c := cmp.Compare(a.size, b.size); c != 0 {
		return c
	}
	return cmp.Compare(a.addr, b.addr)
}

// Allocator is a best-fit-with-coalescing allocator over one region. It is
// safe for concurrent use; see the package doc for the policy.
type Allocator struct {
	// Immutable after New.
	name     string
	base     gpu.DevicePtr
	size     uint64
	align    uint64
	minSplit uint64

	mu struct {
		sync.Mutex
		head   *chunk                   // chunk at base; the list tiles the region
		chunks map[gpu.DevicePtr]*chunk // every chunk, free or not, by start address
		free   []freeKey                // free chunks, sorted by compareFreeKey

		inUse     uint64
		requested uint64
		peak      uint64
		allocs    int
	}
}

// New returns an allocator managing [base, base+size). base must be non-zero
// (zero is the null pointer) and aligned to opts.Alignment, size a non-zero
// multiple of it, and the region must not wrap around the address space.
// Errors wrap gpu.ErrInvalidValue.
func New(base gpu.DevicePtr, size uint64, opts Options) (*Allocator, error) {
	opts = opts.withDefaults()
	prefix := fmt.Sprintf("bfc %q: new", opts.Name)
	switch {
	case bits.OnesCount64(opts.Alignment) != 1:
		return nil, fmt.Errorf("%s: alignment %d is not a power of two: %w", prefix, opts.Alignment, gpu.ErrInvalidValue)
	case base == 0:
		return nil, fmt.Errorf("%s: base is the null pointer: %w", prefix, gpu.ErrInvalidValue)
	case uint64(base)%opts.Alignment != 0:
		return nil, fmt.Errorf("%s: base %#x is not aligned to %d: %w", prefix, uint64(base), opts.Alignment, gpu.ErrInvalidValue)
	case size == 0 || size%opts.Alignment != 0:
		return nil, fmt.Errorf("%s: size %d is not a non-zero multiple of the alignment %d: %w", prefix, size, opts.Alignment, gpu.ErrInvalidValue)
	case uint64(base)+size < uint64(base):
		return nil, fmt.Errorf("%s: region %#x+%d wraps around the address space: %w", prefix, uint64(base), size, gpu.ErrInvalidValue)
	}
	minSplit := opts.MinSplit
	if minSplit > size {
		// Larger than the region: nothing would ever split. Clamping keeps
		// the rounding below from overflowing.
		minSplit = size
	}
	a := &Allocator{
		name:     opts.Name,
		base:     base,
		size:     size,
		align:    opts.Alignment,
		minSplit: gpu.RoundUp(minSplit, opts.Alignment),
	}
	whole := &chunk{addr: base, size: size, free: true}
	a.mu.head = whole
	a.mu.chunks = map[gpu.DevicePtr]*chunk{base: whole}
	a.mu.free = []freeKey{{size, base}}
	return a, nil
}

// Base is the start of the managed region.
func (a *Allocator) Base() gpu.DevicePtr { return a.base }

// Alignment is the alignment of every chunk.
func (a *Allocator) Alignment() uint64 { return a.align }

// Alloc returns the start of a new allocation of at least size bytes,
// aligned to the allocator's alignment, chosen by best fit.
//
// A size of zero is gpu.ErrInvalidValue. A request no free chunk can hold is
// gpu.ErrOutOfMemory, with the request, the largest free chunk and the bytes
// in use in the message; nothing is changed and the caller may free and
// retry.
func (a *Allocator) Alloc(size uint64) (gpu.DevicePtr, error) {
	if size == 0 {
		return 0, fmt.Errorf("bfc %q: alloc of 0 bytes: %w", a.name, gpu.ErrInvalidValue)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	// Checked before rounding, which would overflow for sizes near 2^64.
	if size > a.size {
		return 0, a.oomLocked(size, size)
	}
	need := gpu.RoundUp(size, a.align)
	i, _ := slices.BinarySearchFunc(a.mu.free, freeKey{need, 0}, compareFreeKey)
	if i == len(a.mu.free) {
		return 0, a.oomLocked(size, need)
	}
	c := a.mu.chunks[a.mu.free[i].addr]
	a.mu.free = slices.Delete(a.mu.free, i, i+1)

	if rest := c.size - need; rest >= a.minSplit {
		r := &chunk{addr: c.addr.Add(need), size: rest, free: true, prev: c, next: c.next}
		if c.next != nil {
			c.next.prev = r
		}
		c.next = r
		c.size = need
		a.mu.chunks[r.addr] = r
		a.insertFreeLocked(r)
	}
	c.free = false
	c.requested = size
	a.mu.inUse += c.size
	a.mu.requested += size
	a.mu.allocs++
	a.mu.peak = max(a.mu.peak, a.mu.inUse)
	return c.addr, nil
}

// Free releases the allocation starting at p and merges its chunk with free
// neighbours. A pointer that is not the start of a live allocation (outside
// the region, inside an allocation, or already freed) is
// gpu.ErrInvalidHandle, naming the address and what lies there; nothing is
// changed.
func (a *Allocator) Free(p gpu.DevicePtr) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.mu.chunks[p]
	if !ok || c.free {
		return a.foreignLocked("free", p)
	}
	c.free = true
	a.mu.inUse -= c.size
	a.mu.requested -= c.requested
	a.mu.allocs--
	c.requested = 0

	if n := c.next; n != nil && n.free {
		a.removeFreeLocked(n)
		a.unlinkLocked(n)
		c.size += n.size
	}
	if pr := c.prev; pr != nil && pr.free {
		a.removeFreeLocked(pr)
		a.unlinkLocked(c)
		pr.size += c.size
		c = pr
	}
	a.insertFreeLocked(c)
	return nil
}

// Size returns the usable size of the allocation starting at p: the chunk
// it holds, which is at least the requested size rounded up to the
// alignment (more when the remainder was too small to split). A pointer
// that is not the start of a live allocation is gpu.ErrInvalidHandle.
func (a *Allocator) Size(p gpu.DevicePtr) (uint64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.mu.chunks[p]
	if !ok || c.free {
		return 0, a.foreignLocked("size", p)
	}
	return c.size, nil
}

// Stats returns a consistent snapshot of the allocator's counters.
func (a *Allocator) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := Stats{
		Size:        a.size,
		InUse:       a.mu.inUse,
		Requested:   a.mu.requested,
		Peak:        a.mu.peak,
		Allocations: a.mu.allocs,
		FreeChunks:  len(a.mu.free),
		FreeBytes:   a.size - a.mu.inUse,
	}
	if n := len(a.mu.free); n > 0 {
		// Sorted by size first: the last key is the largest.
		s.LargestFree = a.mu.free[n-1].size
	}
	return s
}

// insertFreeLocked adds free chunk c to the best-fit index.
func (a *Allocator) insertFreeLocked(c *chunk) {
	k := freeKey{c.size, c.addr}
	i, _ := slices.BinarySearchFunc(a.mu.free, k, compareFreeKey)
	a.mu.free = slices.Insert(a.mu.free, i, k)
}

// removeFreeLocked removes free chunk c from the best-fit index. The key is
// there by the invariants; if it were not, removing nothing is the least
// harmful outcome, and check reports the corruption in tests.
func (a *Allocator) removeFreeLocked(c *chunk) {
	if i, found := slices.BinarySearchFunc(a.mu.free, freeKey{c.size, c.addr}, compareFreeKey); found {
		a.mu.free = slices.Delete(a.mu.free, i, i+1)
	}
}

// unlinkLocked removes c from the address list and the chunk map; the
// caller gives its bytes to a neighbour.
func (a *Allocator) unlinkLocked(c *chunk) {
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		a.mu.head = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	}
	c.prev, c.next = nil, nil
	delete(a.mu.chunks, c.addr)
}

func (a *Allocator) oomLocked(size, need uint64) error {
	var largest uint64
	if n := len(a.mu.free); n > 0 {
		largest = a.mu.free[n-1].size
	}
	return fmt.Errorf("bfc %q: alloc of %d bytes (%d after rounding to %d): largest free chunk is %d bytes, %d of %d bytes in use in %d allocations, %d free in %d chunks: %w",
		a.name, size, need, a.align, largest, a.mu.inUse, a.size, a.mu.allocs,
		a.size-a.mu.inUse, len(a.mu.free), gpu.ErrOutOfMemory)
}

// foreignLocked builds the error for a pointer that is not the start of a
// live allocation, saying what lies at p. Finding the chunk that contains
// p walks the address list: O(n), but only on this error path.
func (a *Allocator) foreignLocked(op string, p gpu.DevicePtr) error {
	end := a.base.Add(a.size)
	where := fmt.Sprintf("outside the region [%#x, %#x)", uint64(a.base), uint64(end))
	for c := a.mu.head; c != nil && p >= a.base && p < end; c = c.next {
		if p >= c.addr.Add(c.size) {
			continue
		}
		if c.free {
			where = fmt.Sprintf("inside the free chunk [%#x, %#x) (double free?)", uint64(c.addr), uint64(c.addr.Add(c.size)))
		} else {
			where = fmt.Sprintf("%d bytes inside the allocation at %#x", uint64(p-c.addr), uint64(c.addr))
		}
		break
	}
	return fmt.Errorf("bfc %q: %s %#x: not the start of a live allocation, the address is %s: %w",
		a.name, op, uint64(p), where, gpu.ErrInvalidHandle)
}
