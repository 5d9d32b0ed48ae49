package gputest

import (
	"bytes"

	"github.com/stablegraph/stablegraph/gpu"
)

var vmmTests = []test{
	{name: "MapAccessKernel", run: testVMMBasic},
	{name: "Errors", run: testVMMErrors},
	{name: "TwoMappingsOneChunk", run: testVMMTwoMappings},
	{name: "ReleaseWhileMapped", run: testVMMReleaseWhileMapped},
	{name: "PeerAccess", run: testVMMPeerAccess},
}

func testVMMBasic(h *h) {
	gran := h.vmm(0)
	g, err := h.vm.AllocationGranularity(0)
	h.ok("AllocationGranularity", err)
	if g != gran {
		h.Errorf("AllocationGranularity = %d, DeviceProps.Granularity = %d", g, gran)
	}
	h.fn(0, "sg_fill") // load the module before counting
	before, _ := h.counters()
	c, err := h.vm.MemCreate(0, gran)
	h.ok("MemCreate", err)
	h.wantCounters("after MemCreate", before, func(c *gpu.HandleCounts) { c.Chunks++ })
	p, err := h.vm.MemAddressReserve(2*gran, 0)
	h.ok("MemAddressReserve", err)
	if p == 0 || uint64(p)%gran != 0 {
		h.Errorf("MemAddressReserve(align 0) = %#x, want a nonzero multiple of the granularity %d", uint64(p), gran)
	}
	q, err := h.vm.MemAddressReserve(gran, 4*gran)
	h.ok("MemAddressReserve(align 4*granularity)", err)
	if uint64(q)%(4*gran) != 0 {
		h.Errorf("MemAddressReserve(align %d) = %#x, misaligned", 4*gran, uint64(q))
	}
	if q >= p && q < p.Add(2*gran) || p >= q && p < q.Add(gran) {
		h.Errorf("reservations overlap: %#x+%d and %#x+%d", uint64(p), 2*gran, uint64(q), gran)
	}
	h.ok("MemAddressFree", h.vm.MemAddressFree(q, gran))
	h.wantCounters("after MemAddressReserve", before, func(c *gpu.HandleCounts) { c.Chunks++; c.Reservations++ })

	at := p.Add(gran) // the second half of the reservation
	h.ok("MemMap", h.vm.MemMap(at, gran, 0, c))
	h.wantCounters("after MemMap", before, func(c *gpu.HandleCounts) { c.Chunks++; c.Reservations++; c.Mappings++ })
	h.ok("MemSetAccess", h.vm.MemSetAccess(at, gran, []int{0}))

	// Copies and kernels through the mapping.
	data := bytes.Repeat([]byte{1, 2, 3, 4, 5, 6, 7}, 100)
	h.ok("MemcpyHtoD into the mapping", h.b.MemcpyHtoD(at.Add(100), data))
	if got := h.download(at.Add(100), len(data)); !bytes.Equal(got, data) {
		h.Errorf("roundtrip through a mapping differs")
	}
	n := int(gran / 4)
	s := h.stream(0)
	h.launch(h.fillParams(0, at, 2.5, n), s)
	h.sync(s)
	h.wantAllF32("kernel fill through a mapping", h.downloadF32(at, n), 2.5)
	x := h.alloc(0, uint64(4*n))
	h.setF32(x, 4, n)
	h.launch(h.axpbParams(0, at, x, 3, 1, n), s) // at = 3*x + 1, reads device memory, writes the mapping
	h.launch(h.axpbParams(0, x, at, 1, 1, n), s) // x = at + 1, reads the mapping
	h.sync(s)
	h.wantAllF32("kernel writes through a mapping", h.downloadF32(at, n), 13)
	h.wantAllF32("kernel reads through a mapping", h.downloadF32(x, n), 14)

	h.ok("MemUnmap", h.vm.MemUnmap(at, gran))
	h.ok("MemAddressFree", h.vm.MemAddressFree(p, 2*gran))
	h.ok("MemRelease", h.vm.MemRelease(c))
	h.wantCounters("after MemUnmap, MemAddressFree, MemRelease", before, func(c *gpu.HandleCounts) { c.Streams++; c.Allocations++ })
}

func testVMMErrors(h *h) {
	gran := h.vmm(0)
	before, _ := h.counters()
	_, err := h.vm.MemCreate(0, gran+1)
	h.wantErr("MemCreate of a size not a multiple of the granularity", err, gpu.ErrInvalidValue)
	_, err = h.vm.MemCreate(0, gran/2)
	h.wantErr("MemCreate of half the granularity", err, gpu.ErrInvalidValue)
	_, err = h.vm.MemCreate(0, 0)
	h.wantErr("MemCreate of 0 bytes", err, gpu.ErrInvalidValue)
	_, err = h.vm.MemAddressReserve(gran+1, 0)
	h.wantErr("MemAddressReserve of a misaligned size", err, gpu.ErrInvalidValue)
	_, err = h.vm.MemAddressReserve(0, 0)
	h.wantErr("MemAddressReserve of 0 bytes", err, gpu.ErrInvalidValue)
	h.wantCounters("after failed creates", before, nil)

	c := h.chunk(0, 2*gran)
	p := h.reserve(4*gran, 0)
	base, _ := h.counters()
	for _, m := range []struct {
		what      string
		at        gpu.DevicePtr
		size, off uint64
	}{
		{"misaligned size", p, gran / 2, 0},
		{"misaligned offset", p, gran, gran / 2},
		{"misaligned address", p.Add(gran / 2), gran, 0},
		{"at the chunk's end", p, gran, 2 * gran},
		{"running past the chunk's end", p, 2 * gran, gran},
		{"larger than the chunk", p, 3 * gran, 0},
		{"zero size", p, 0, 0},
	} {
		h.wantErr("MemMap "+m.what, h.vm.MemMap(m.at, m.size, m.off, c), gpu.ErrInvalidValue)
	}
	h.wantErr("MemMap outside any reservation", h.vm.MemMap(p.Add(64*gran), gran, 0, c))
	h.wantErr("MemMap of chunk 0", h.vm.MemMap(p, gran, 0, 0), gpu.ErrInvalidHandle)
	h.wantErr("MemSetAccess of an unmapped range", h.vm.MemSetAccess(p, gran, []int{0}))
	h.wantErr("MemUnmap of a range never mapped", h.vm.MemUnmap(p, gran))
	h.wantCounters("after failed maps", base, nil)

	h.mapAt(p, gran, 0, c)
	h.wantErr("MemMap over a mapped range", h.vm.MemMap(p, gran, 0, c))
	h.wantErr("MemSetAccess for device -1", h.vm.MemSetAccess(p, gran, []int{-1}), gpu.ErrInvalidValue)
	h.wantErr("MemSetAccess for a device that does not exist", h.vm.MemSetAccess(p, gran, []int{h.b.DeviceCount()}), gpu.ErrInvalidValue)
	h.wantErr("MemSetAccess over a range only half mapped", h.vm.MemSetAccess(p, 2*gran, []int{0}))
	h.wantErr("MemUnmap of the unmapped half", h.vm.MemUnmap(p.Add(gran), gran))
	h.wantErr("MemUnmap of half a mapping", h.vm.MemUnmap(p, gran/2), gpu.ErrInvalidValue, gpu.ErrIllegalState)
	h.wantErr("MemAddressFree of a mapped reservation", h.vm.MemAddressFree(p, 4*gran))
	h.wantErr("MemAddressFree with the wrong size", h.vm.MemAddressFree(p, gran))
	h.wantCounters("after failed calls on a mapped range", base, func(c *gpu.HandleCounts) { c.Mappings++ })

	h.release(mapKey(p))
	h.wantErr("second MemUnmap", h.vm.MemUnmap(p, gran))
	h.release(reserveKey(p))
	h.wantErr("second MemAddressFree", h.vm.MemAddressFree(p, 4*gran))
	h.release(chunkKey(c))
	h.wantErr("second MemRelease", h.vm.MemRelease(c), gpu.ErrInvalidHandle)
	h.wantErr("MemRelease(0)", h.vm.MemRelease(0), gpu.ErrInvalidHandle)
	h.wantErr("MemAddressFree(0)", h.vm.MemAddressFree(0, gran))
	h.wantCounters("after releasing everything", before, nil)
}

// testVMMTwoMappings maps one chunk at two addresses (all of it at one,
// its second half at the other) and checks both see the same bytes.
func testVMMTwoMappings(h *h) {
	gran := h.vmm(0)
	c := h.chunk(0, 2*gran)
	r1, r2 := h.reserve(2*gran, 0), h.reserve(gran, 0)
	h.mapAt(r1, 2*gran, 0, c)
	h.mapAt(r2, gran, gran, c)
	h.ok("MemSetAccess", h.vm.MemSetAccess(r1, 2*gran, []int{0}))
	h.ok("MemSetAccess", h.vm.MemSetAccess(r2, gran, []int{0}))

	r := h.random()
	data := make([]byte, 4096)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	h.ok("MemcpyHtoD via the first mapping", h.b.MemcpyHtoD(r1.Add(gran+512), data))
	if got := h.download(r2.Add(512), len(data)); !bytes.Equal(got, data) {
		h.Errorf("bytes written through one mapping differ through the other")
	}
	n := int(gran / 4)
	s := h.stream(0)
	h.launch(h.fillParams(0, r1, 1, 2*n), s)
	h.launch(h.fillParams(0, r2, 6, n), s)
	h.sync(s)
	h.wantAllF32("first half via the first mapping", h.downloadF32(r1, n), 1)
	h.wantAllF32("second half via the first mapping after a kernel wrote the second", h.downloadF32(r1.Add(gran), n), 6)
}

// testVMMReleaseWhileMapped checks the CUDA rule MemRelease documents: a
// chunk released while mapped stays alive until its last mapping goes.
func testVMMReleaseWhileMapped(h *h) {
	gran := h.vmm(0)
	c := h.chunk(0, gran)
	p := h.reserve(gran, 0)
	h.mapAt(p, gran, 0, c)
	h.ok("MemSetAccess", h.vm.MemSetAccess(p, gran, []int{0}))
	data := []byte("still here after MemRelease")
	h.ok("MemcpyHtoD", h.b.MemcpyHtoD(p, data))
	if err := h.vm.MemRelease(c); err != nil {
		h.Fatalf("MemRelease of a mapped chunk: %v (MemRelease's doc: it stays alive until unmapped)", err)
	}
	h.forget(chunkKey(c))
	if got := h.download(p, len(data)); !bytes.Equal(got, data) {
		h.Errorf("mapping of a released chunk reads %q", got)
	}
	h.wantErr("second MemRelease", h.vm.MemRelease(c), gpu.ErrInvalidHandle)
	h.wantErr("MemMap of a released chunk", h.vm.MemMap(p, gran, 0, c), gpu.ErrInvalidHandle, gpu.ErrIllegalState)
	h.release(mapKey(p))
	if cnt, ok := h.counters(); ok && cnt.Chunks != 0 {
		h.Errorf("released chunk still counted after its last mapping went: %v", cnt)
	}
}

func testVMMPeerAccess(h *h) {
	h.needDevices(2)
	gran := h.vmm(0)
	h.vmm(1)
	c := h.chunk(0, gran)
	p := h.reserve(gran, 0)
	h.mapAt(p, gran, 0, c)
	h.ok("MemSetAccess for devices 0 and 1", h.vm.MemSetAccess(p, gran, []int{0, 1}))
	n := int(gran / 4)
	s1 := h.stream(1)
	h.launch(h.fillParams(1, p, 9, n), s1)
	h.sync(s1)
	h.wantAllF32("device 1 kernel writing device 0 memory", h.downloadF32(p, n), 9)
	s0 := h.stream(0)
	h.launch(h.fillParams(0, p, 10, n), s0)
	h.sync(s0)
	h.wantAllF32("device 0 kernel after granting device 1", h.downloadF32(p, n), 10)
}
