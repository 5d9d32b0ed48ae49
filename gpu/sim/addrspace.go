package sim

import (
	"fmt"
	"sort"
	"sync/atomic"

	"github.com/stablegraph/stablegraph/gpu"
)

// This file is the address space model described in doc.go: backing memory
// in lazily allocated pages, regions (reservations, plain allocations, host
// allocations) carved from a monotonically increasing cursor, mappings of
// physical chunks inside reservations, and the resolution of an access into
// pieces of backing memory. Everything here except the page contents is
// guarded by Backend.mu; page contents are reached through atomic page
// pointers so that kernels can copy under the read lock.

const (
	pageShift = 16
	pageSize  = 1 << pageShift

	// addrBase is the first address handed out; the space below it, and
	// address 0 in particular, is never mapped.
	addrBase = 1 << 44
	// addrLimit bounds the cursor; reaching it is ErrOutOfMemory.
	addrLimit = 1 << 62
	// allocAlign is the alignment of MemAlloc and HostAlloc addresses.
	allocAlign = 256
	// allocGuard is the unmapped gap left after every MemAlloc/HostAlloc
	// region, so that an overrun faults instead of landing in a neighbour.
	allocGuard = 4096

	// anyDev is the accessing "device" of synchronous copies and memsets,
	// which name no stream: any device with access will do.
	anyDev = -1

	// maxTombstones bounds how many freed regions are remembered for the
	// "freed" fault reason; older ones are forgotten and then fault as
	// "unmapped".
	maxTombstones = 1 << 16
)

// page is one page of backing memory.
type page struct{ b []byte }

// backing is the memory behind a chunk or an allocation. Pages are
// allocated on first write, so a large, mostly untouched chunk costs only
// its page table; unwritten pages read as zeros.
type backing struct {
	size  uint64
	pages []atomic.Pointer[page]
}

func newBacking(size uint64) *backing {
	return &backing{size: size, pages: make([]atomic.Pointer[page], (size+pageSize-1)>>pageShift)}
}

// newHostBacking wraps flat, which the host also sees, as backing memory.
func newHostBacking(flat []byte) *backing {
	m := newBacking(uint64(len(flat)))
	for i := range m.pages {
		lo := i << pageShift
		hi := min(lo+pageSize, len(flat))
		m.pages[i].Store(&page{b: flat[lo:hi:hi]})
	}
	return m
}

// pageAt returns page i, allocating it when create is set.
func (m *backing) pageAt(i uint64, create bool) *page {
	if p := m.pages[i].Load(); p != nil || !create {
		return p
	}
	n := min(uint64(pageSize), m.size-i<<pageShift)
	np := &page{b: make([]byte, n)}
	if m.pages[i].CompareAndSwap(nil, np) {
		return np
	}
	return m.pages[i].Load()
}

func (m *backing) read(off uint64, dst []byte) {
	for len(dst) > 0 {
		po := off & (pageSize - 1)
		n := min(uint64(len(dst)), pageSize-po)
		if p := m.pages[off>>pageShift].Load(); p != nil {
			copy(dst[:n], p.b[po:po+n])
		} else {
			clear(dst[:n])
		}
		dst, off = dst[n:], off+n
	}
}

func (m *backing) write(off uint64, src []byte) {
	for len(src) > 0 {
		po := off & (pageSize - 1)
		n := min(uint64(len(src)), pageSize-po)
		copy(m.pageAt(off>>pageShift, true).b[po:po+n], src[:n])
		src, off = src[n:], off+n
	}
}

// fill writes n bytes at off with the repeating pattern pat, whose phase is
// zero at off (pat's length is a multiple of the element size, and off is
// element aligned, so every page piece starts at phase zero too). Zero
// fills skip pages never written, which already read as zeros.
func (m *backing) fill(off, n uint64, pat []byte, zero bool) {
	for n > 0 {
		po := off & (pageSize - 1)
		k := min(n, pageSize-po)
		if p := m.pageAt(off>>pageShift, !zero); p != nil {
			dst := p.b[po : po+k]
			for len(dst) > 0 {
				dst = dst[copy(dst, pat):]
			}
		}
		n, off = n-k, off+k
	}
}

// store64 atomically stores v at off (8-byte aligned), as the GPU's stream
// memory operations do: a host polling with HostMem.Load64 sees either the
// old or the new value, never a torn one.
func (m *backing) store64(off, v uint64) {
	p := m.pageAt(off>>pageShift, true)
	gpu.HostMem{Bytes: p.b}.Store64(int(off&(pageSize-1)), v)
}

// load64 atomically loads the word at off (8-byte aligned), zero on a page
// never written.
func (m *backing) load64(off uint64) uint64 {
	p := m.pages[off>>pageShift].Load()
	if p == nil {
		return 0
	}
	return gpu.HostMem{Bytes: p.b}.Load64(int(off & (pageSize - 1)))
}

type regionKind uint8

const (
	regReserve regionKind = iota + 1 // MemAddressReserve
	regAlloc                         // MemAlloc
	regHost                          // HostAlloc
)

// region is a range of the address space handed out by the cursor. Regions
// are never reused: a freed region stays as a tombstone so that accesses to
// it fault with reason "freed".
type region struct {
	kind        regionKind
	start, size uint64
	freed       bool
	freeSeq     uint64
	dev         int           // regAlloc: owning device
	mem         *backing      // regAlloc, regHost
	maps        []*mapping    // regReserve: sorted by start, disjoint
	host        gpu.HostAlloc // regHost
}

func (r *region) end() uint64 { return r.start + r.size }

// mapping maps [offset, offset+size) of a chunk at start.
type mapping struct {
	start, size uint64
	chunk       *chunk
	offset      uint64
	access      uint64 // bit d set: device d may access (none at first, as in CUDA)
}

func (m *mapping) end() uint64 { return m.start + m.size }

// chunk is a physical allocation (MemCreate). A released chunk that is still
// mapped lives on, without a handle, until its last mapping goes.
type chunk struct {
	handle   gpu.PhysMem
	dev      int
	size     uint64
	mem      *backing
	released bool
	maps     int
}

// addrSpace is the one virtual address space shared by all devices (UVA).
type addrSpace struct {
	cursor   uint64
	regions  []*region // sorted by start: the cursor only grows
	freed    int       // tombstones in regions
	freeSeq  uint64
	allocs   map[gpu.DevicePtr]*region
	reserves map[gpu.DevicePtr]*region
	hosts    map[gpu.HostAlloc]*region
	chunks   map[gpu.PhysMem]*chunk
	mappings int
	used     []uint64 // per device: bytes of MemAlloc and MemCreate charged
}

func (as *addrSpace) init(devices int) {
	as.cursor = addrBase
	as.allocs = map[gpu.DevicePtr]*region{}
	as.reserves = map[gpu.DevicePtr]*region{}
	as.hosts = map[gpu.HostAlloc]*region{}
	as.chunks = map[gpu.PhysMem]*chunk{}
	as.used = make([]uint64, devices)
}

// carve takes [start, start+size) from the cursor, aligned to align, and
// leaves guard bytes unmapped after it.
func (as *addrSpace) carve(size, align, guard uint64) (uint64, bool) {
	start := gpu.RoundUp(as.cursor, align)
	if start < as.cursor || size > addrLimit || start > addrLimit-size-guard {
		return 0, false
	}
	as.cursor = start + size + guard
	return start, true
}

func (as *addrSpace) insert(r *region) { as.regions = append(as.regions, r) }

// release turns r into a tombstone and forgets the oldest tombstones when
// there are too many.
func (as *addrSpace) release(r *region) {
	as.freeSeq++
	r.freed, r.freeSeq, r.mem, r.maps = true, as.freeSeq, nil, nil
	as.freed++
	if as.freed <= maxTombstones {
		return
	}
	keep := as.regions[:0]
	as.freed = 0
	for _, x := range as.regions {
		if x.freed && x.freeSeq+maxTombstones/2 <= as.freeSeq {
			continue
		}
		if x.freed {
			as.freed++
		}
		keep = append(keep, x)
	}
	clear(as.regions[len(keep):])
	as.regions = keep
}

// regionAt returns the region containing a, live or freed, or nil.
func (as *addrSpace) regionAt(a uint64) *region {
	i := sort.Search(len(as.regions), func(i int) bool { return as.regions[i].start > a }) - 1
	if i < 0 || a >= as.regions[i].end() {
		return nil
	}
	return as.regions[i]
}

// mappingIndex returns the index of the first mapping of r ending after a.
func mappingIndex(r *region, a uint64) int {
	return sort.Search(len(r.maps), func(i int) bool { return r.maps[i].end() > a })
}

// ownerOf returns the device whose memory backs a, or -1 (host memory,
// unmapped).
func (as *addrSpace) ownerOf(a uint64) int {
	r := as.regionAt(a)
	if r == nil || r.freed {
		return -1
	}
	switch r.kind {
	case regAlloc:
		return r.dev
	case regReserve:
		if i := mappingIndex(r, a); i < len(r.maps) && r.maps[i].start <= a {
			return r.maps[i].chunk.dev
		}
	}
	return -1
}

// liveAt reports whether a is inside live host or device memory.
func (as *addrSpace) liveAt(a uint64) bool {
	r := as.regionAt(a)
	if r == nil || r.freed {
		return false
	}
	if r.kind != regReserve {
		return true
	}
	i := mappingIndex(r, a)
	return i < len(r.maps) && r.maps[i].start <= a
}

// piece is part of a resolved access: n bytes of mem at off.
type piece struct {
	mem    *backing
	off, n uint64
}

// fault is why an access cannot be made: the first bad address and a reason.
type fault struct {
	addr   uint64
	reason string
}

// resolve checks that all of [p, p+n) is mapped, live and accessible from
// dev (anyDev: from some device) and appends its pieces to buf. It checks
// the whole range before anything is copied, so a faulting access writes
// nothing.
func (as *addrSpace) resolve(p gpu.DevicePtr, n uint64, dev int, buf []piece) ([]piece, *fault) {
	if n == 0 {
		return buf, nil
	}
	a, end := uint64(p), uint64(p)+n
	if end < a {
		return buf, &fault{a, "unmapped"}
	}
	r := as.regionAt(a)
	switch {
	case r == nil:
		return buf, &fault{a, "unmapped"}
	case r.freed:
		return buf, &fault{a, "freed"}
	}
	if r.kind != regReserve {
		if r.kind == regAlloc && dev != anyDev && dev != r.dev {
			return buf, &fault{a, fmt.Sprintf("no access from device %d", dev)}
		}
		if end > r.end() {
			return buf, &fault{r.end(), "unmapped"}
		}
		return append(buf, piece{r.mem, a - r.start, n}), nil
	}
	for i := mappingIndex(r, a); a < end; i++ {
		if i >= len(r.maps) || r.maps[i].start > a {
			return buf, &fault{a, "unmapped"}
		}
		m := r.maps[i]
		switch {
		case dev == anyDev && m.access == 0:
			return buf, &fault{a, "no access from any device"}
		case dev != anyDev && m.access&(1<<uint(dev)) == 0:
			return buf, &fault{a, fmt.Sprintf("no access from device %d", dev)}
		}
		k := min(end, m.end()) - a
		buf = append(buf, piece{m.chunk.mem, m.offset + (a - m.start), k})
		a += k
	}
	return buf, nil
}

func readPieces(ps []piece, dst []byte) {
	for _, pc := range ps {
		pc.mem.read(pc.off, dst[:pc.n])
		dst = dst[pc.n:]
	}
}

func writePieces(ps []piece, src []byte) {
	for _, pc := range ps {
		pc.mem.write(pc.off, src[:pc.n])
		src = src[pc.n:]
	}
}

func fillPieces(ps []piece, pat []byte, zero bool) {
	for _, pc := range ps {
		pc.mem.fill(pc.off, pc.n, pat, zero)
	}
}

// copyPieces copies src to dst page by page, without a staging buffer.
// Pages of src never written are zeros: they are not materialised in dst
// when dst's page does not exist either. Overlapping ranges behave as with
// cuMemcpy: the result is undefined (here, a forward copy).
func copyPieces(dst, src []piece) {
	for len(dst) > 0 && len(src) > 0 {
		d, s := &dst[0], &src[0]
		do, so := d.off&(pageSize-1), s.off&(pageSize-1)
		k := min(d.n, s.n, pageSize-do, pageSize-so)
		sp := s.mem.pages[s.off>>pageShift].Load()
		dp := d.mem.pageAt(d.off>>pageShift, sp != nil)
		switch {
		case sp != nil:
			copy(dp.b[do:do+k], sp.b[so:so+k])
		case dp != nil:
			clear(dp.b[do : do+k])
		}
		d.off, d.n, s.off, s.n = d.off+k, d.n-k, s.off+k, s.n-k
		if d.n == 0 {
			dst = dst[1:]
		}
		if s.n == 0 {
			src = src[1:]
		}
	}
}

// memsetPattern returns the repeating byte pattern of m, at most one page
// long, and whether it is all zeros.
func memsetPattern(m gpu.Memset) ([]byte, bool) {
	n := min(m.Bytes(), pageSize)
	pat := make([]byte, n)
	for i := range pat {
		pat[i] = byte(m.Value >> (8 * uint(i%m.ElemSize)))
	}
	var mask uint32 = 1<<(8*uint(m.ElemSize)) - 1
	if m.ElemSize == 4 {
		mask = ^uint32(0)
	}
	return pat, m.Value&mask == 0
}
