package gputest

import (
	"errors"
	"fmt"

	"github.com/stablegraph/stablegraph/gpu"
)

// Allocation extents (gpu.AddressRanger, an optional capability): the
// tests skip on backends without it. They run through the raw backend: the
// recorder forwards gpu.Backend only.
var extentTests = []test{
	{name: "Alloc", run: testExtentAlloc},
	{name: "Freed", run: testExtentFreed},
	{name: "HostAlloc", run: testExtentHost},
	{name: "VirtualMemory", run: testExtentVMM},
	{name: "CheckBinding", run: testExtentCheckBinding},
}

// ranger returns the backend's gpu.AddressRanger, skipping without one.
func (h *h) ranger() gpu.AddressRanger {
	h.Helper()
	ar, ok := gpu.AddressRangerOf(h.raw)
	if !ok {
		h.Skipf("%s does not implement gpu.AddressRanger", h.raw.Name())
	}
	return ar
}

// wantExtent checks that p lies in the allocation [base, base+size).
func (h *h) wantExtent(ar gpu.AddressRanger, what string, p, base gpu.DevicePtr, size uint64) {
	h.Helper()
	gb, gs, err := ar.AddressRange(p)
	if err != nil {
		h.Errorf("%s: AddressRange(%#x): %v, want [%#x, +%d)", what, uint64(p), err, uint64(base), size)
		return
	}
	if gb != base || gs != size {
		h.Errorf("%s: AddressRange(%#x) = [%#x, +%d), want [%#x, +%d)", what, uint64(p), uint64(gb), gs, uint64(base), size)
	}
}

// wantNoExtent checks that p is in no live allocation.
func (h *h) wantNoExtent(ar gpu.AddressRanger, what string, p gpu.DevicePtr) {
	h.Helper()
	gb, gs, err := ar.AddressRange(p)
	if err == nil {
		h.Errorf("%s: AddressRange(%#x) = [%#x, +%d), want gpu.ErrNotFound", what, uint64(p), uint64(gb), gs)
		return
	}
	h.wantErr(what, err, gpu.ErrNotFound)
}

// wantNotIn checks that p is not reported inside the allocation at base:
// it lies in no allocation, or in another one starting at or after p.
func (h *h) wantNotIn(ar gpu.AddressRanger, what string, p, base gpu.DevicePtr) {
	h.Helper()
	gb, gs, err := ar.AddressRange(p)
	switch {
	case err != nil:
		h.wantErr(what, err, gpu.ErrNotFound)
	case gb == base || gb > p || p-gb >= gpu.DevicePtr(gs):
		h.Errorf("%s: AddressRange(%#x) = [%#x, +%d): the end of the allocation at %#x is not its end", what, uint64(p), uint64(gb), gs, uint64(base))
	}
}

func testExtentAlloc(h *h) {
	ar := h.ranger()
	for _, size := range []uint64{1, 1000, 4096, 3 << 20} {
		p := h.alloc(0, size)
		what := fmt.Sprintf("MemAlloc(%d)", size)
		h.wantExtent(ar, what+": base", p, p, size)
		h.wantExtent(ar, what+": interior", p.Add(size/2), p, size)
		h.wantExtent(ar, what+": last byte", p.Add(size-1), p, size)
		h.wantNotIn(ar, what+": one past the end", p.Add(size), p)
	}
	// Two live allocations answer for themselves, whatever the order asked.
	a, b := h.alloc(0, 512), h.alloc(0, 768)
	h.wantExtent(ar, "second allocation", b.Add(700), b, 768)
	h.wantExtent(ar, "first allocation", a.Add(10), a, 512)
	h.wantNoExtent(ar, "the null pointer", 0)
}

func testExtentFreed(h *h) {
	ar := h.ranger()
	p, err := h.b.MemAlloc(0, 4096)
	h.ok("MemAlloc", err)
	h.wantExtent(ar, "live allocation", p.Add(100), p, 4096)
	h.ok("MemFree", h.b.MemFree(p))
	// The extent was known (and may have been cached); freed, it is gone.
	h.wantNoExtent(ar, "freed allocation: base", p)
	h.wantNoExtent(ar, "freed allocation: interior", p.Add(100))
}

func testExtentHost(h *h) {
	h.streamMemOps(0)
	ar := h.ranger()
	m := h.hostAlloc(3000)
	h.wantExtent(ar, "HostAlloc: base", m.Ptr, m.Ptr, 3000)
	h.wantExtent(ar, "HostAlloc: last byte", m.Ptr.Add(2999), m.Ptr, 3000)
	h.wantNotIn(ar, "HostAlloc: one past the end", m.Ptr.Add(3000), m.Ptr)
	h.release(hostKey(m.Handle))
	h.wantNoExtent(ar, "freed host allocation", m.Ptr.Add(8))
}

// testExtentVMM: the extent of virtual memory is the run of contiguous
// mappings, and it follows MemMap and MemUnmap.
func testExtentVMM(h *h) {
	gran := h.vmm(0)
	ar := h.ranger()
	c1, c2, c3 := h.chunk(0, gran), h.chunk(0, 2*gran), h.chunk(0, gran)
	p := h.reserve(8*gran, 0)
	h.wantNoExtent(ar, "reserved, nothing mapped", p.Add(5))

	h.mapAt(p, gran, 0, c1)
	h.wantExtent(ar, "one mapping", p.Add(gran-1), p, gran)
	h.mapAt(p.Add(3*gran), gran, 0, c3) // a hole at [1, 3) granules
	h.wantExtent(ar, "a mapping after a hole", p.Add(3*gran), p.Add(3*gran), gran)
	h.wantExtent(ar, "the first mapping still alone", p, p, gran)
	h.wantNoExtent(ar, "the hole", p.Add(2*gran))

	// Filling the hole joins the three mappings into one run (of three
	// chunks); the answers cached above must not survive it.
	h.mapAt(p.Add(gran), 2*gran, 0, c2)
	h.wantExtent(ar, "a run of three mappings: start", p, p, 4*gran)
	h.wantExtent(ar, "a run of three mappings: middle", p.Add(2*gran+7), p, 4*gran)
	h.wantExtent(ar, "a run of three mappings: end", p.Add(4*gran-1), p, 4*gran)
	h.wantNoExtent(ar, "after the run", p.Add(4*gran))

	// Unmapping the middle splits it again.
	h.release(mapKey(p.Add(gran)))
	h.wantExtent(ar, "after unmapping the middle: first", p.Add(5), p, gran)
	h.wantExtent(ar, "after unmapping the middle: last", p.Add(3*gran+5), p.Add(3*gran), gran)
	h.wantNoExtent(ar, "the unmapped middle", p.Add(gran+5))
	h.release(mapKey(p))
	h.release(mapKey(p.Add(3 * gran)))
	h.wantNoExtent(ar, "all unmapped", p.Add(3*gran+5))
}

func testExtentCheckBinding(h *h) {
	h.ranger()
	p := h.alloc(0, 64)
	for _, c := range []struct {
		what string
		ptr  gpu.DevicePtr
		size uint64
		ok   bool
	}{
		{"the whole allocation", p, 64, true},
		{"its second half", p.Add(32), 32, true},
		{"its last byte", p.Add(63), 1, true},
		{"zero bytes anywhere", p.Add(1 << 40), 0, true},
		{"8 bytes past a 64-byte allocation", p.Add(8), 64, false},
		{"one byte too many", p, 65, false},
		{"a size that overflows", p.Add(8), ^uint64(0) - 4, false},
	} {
		err := gpu.CheckBinding(h.raw, c.ptr, c.size)
		if c.ok {
			if err != nil {
				h.Errorf("CheckBinding(%s: %#x, %d): %v, want nil", c.what, uint64(c.ptr), c.size, err)
			}
			continue
		}
		var ee *gpu.ExtentError
		if !errors.Is(err, gpu.ErrOutOfBounds) || !errors.As(err, &ee) {
			h.Errorf("CheckBinding(%s: %#x, %d) = %v, want an *ExtentError", c.what, uint64(c.ptr), c.size, err)
			continue
		}
		if ee.Ptr != c.ptr || ee.Size != c.size || ee.Base != p || ee.Extent != 64 {
			h.Errorf("CheckBinding(%s): %+v, want Ptr %#x Size %d Base %#x Extent 64", c.what, *ee, uint64(c.ptr), c.size, uint64(p))
		}
	}
	q, err := h.b.MemAlloc(0, 64)
	h.ok("MemAlloc", err)
	h.ok("MemFree", h.b.MemFree(q))
	err = gpu.CheckBinding(h.raw, q, 8)
	var ee *gpu.ExtentError
	if !errors.As(err, &ee) || ee.Extent != 0 || ee.Reason == "" {
		h.Errorf("CheckBinding of freed memory = %v, want an *ExtentError with no extent and a reason", err)
	}
}
