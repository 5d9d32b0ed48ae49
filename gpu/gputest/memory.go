package gputest

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/stablegraph/stablegraph/gpu"
)

var memoryTests = []test{
	{name: "AllocFree", run: testMemAllocFree},
	{name: "GetInfo", run: testMemGetInfo},
	{name: "OutOfMemory", run: testMemOutOfMemory},
	{name: "CopySync", run: testMemcpySync},
	{name: "CopyAsyncOrdered", run: testMemcpyAsync},
	{name: "Memset", run: testMemset},
	{name: "MemsetErrors", run: testMemsetErrors},
}

func testMemAllocFree(h *h) {
	before, _ := h.counters()
	var ps []gpu.DevicePtr
	for _, size := range []uint64{1, 3, 256, 4097, 1 << 20} {
		p, err := h.b.MemAlloc(0, size)
		h.ok(fmt.Sprintf("MemAlloc(%d)", size), err)
		if p == 0 {
			h.Fatalf("MemAlloc(%d) returned the null pointer", size)
		}
		if p%256 != 0 {
			h.Errorf("MemAlloc(%d) = %#x, not 256-byte aligned (CUDA guarantees 256)", size, uint64(p))
		}
		h.track(memKey(p), 0, func() error { return h.b.MemFree(p) })
		ps = append(ps, p)
	}
	h.wantCounters("after 5 MemAllocs", before, func(c *gpu.HandleCounts) { c.Allocations += len(ps) })
	_, err := h.b.MemAlloc(0, 0)
	h.wantErr("MemAlloc of 0 bytes", err, gpu.ErrInvalidValue)

	p := ps[len(ps)-1]
	h.wantErr("MemFree of an interior pointer", h.b.MemFree(p+16), gpu.ErrInvalidHandle)
	h.wantErr("MemFree of the null pointer", h.b.MemFree(0), gpu.ErrInvalidHandle)
	h.wantErr("MemFree of a pointer never allocated", h.b.MemFree(0xdead0000beef00), gpu.ErrInvalidHandle)
	h.wantCounters("after failed frees", before, func(c *gpu.HandleCounts) { c.Allocations += len(ps) })
	for _, p := range ps {
		h.release(memKey(p))
	}
	h.wantCounters("after MemFree", before, nil)
	h.wantErr("double MemFree", h.b.MemFree(p), gpu.ErrInvalidHandle)
}

func testMemGetInfo(h *h) {
	free0, total, err := h.b.MemGetInfo(0)
	h.ok("MemGetInfo", err)
	if total == 0 || free0 > total {
		h.Fatalf("MemGetInfo: free %d, total %d", free0, total)
	}
	const size = 64 << 20
	h.alloc(0, size)
	free1, total1, err := h.b.MemGetInfo(0)
	h.ok("MemGetInfo", err)
	if total1 != total {
		h.Errorf("MemGetInfo total changed from %d to %d", total, total1)
	}
	if free1 >= free0 {
		h.Errorf("MemGetInfo free %d before and %d after a %d-byte MemAlloc; want less", free0, free1, size)
	}
}

func testMemOutOfMemory(h *h) {
	_, total, err := h.b.MemGetInfo(0)
	h.ok("MemGetInfo", err)
	before, _ := h.counters()
	p, err := h.b.MemAlloc(0, 2*total)
	if h.wantErr("MemAlloc of twice the device memory", err, gpu.ErrOutOfMemory) && p != 0 {
		h.Errorf("failed MemAlloc returned pointer %#x", uint64(p))
	}
	if err == nil {
		h.track(memKey(p), 0, func() error { return h.b.MemFree(p) })
	}
	h.wantCounters("after the failed MemAlloc", before, nil)
	// The device is still usable.
	q := h.upload(0, []byte{1, 2, 3, 4})
	if got := h.download(q, 4); !bytes.Equal(got, []byte{1, 2, 3, 4}) {
		h.Errorf("roundtrip after an out-of-memory error: %v", got)
	}
}

func testMemcpySync(h *h) {
	r := h.random()
	const n = 4099 // odd, so no copy is a multiple of anything
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(r.Uint32())
	}
	a, b := h.alloc(0, n), h.alloc(0, n)
	h.ok("MemcpyHtoD", h.b.MemcpyHtoD(a, src))
	if got := h.download(a, n); !bytes.Equal(got, src) {
		h.Errorf("HtoD/DtoH roundtrip differs")
	}
	h.ok("MemcpyDtoD", h.b.MemcpyDtoD(b, a, n))
	if got := h.download(b, n); !bytes.Equal(got, src) {
		h.Errorf("DtoD copy differs")
	}
	// Copies at offsets touch exactly their bytes.
	patch := []byte{0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7}
	h.ok("MemcpyHtoD at an offset", h.b.MemcpyHtoD(a.Add(5), patch))
	h.ok("MemcpyDtoD at offsets", h.b.MemcpyDtoD(b.Add(n-3), a.Add(5), 3))
	wantA := bytes.Clone(src)
	copy(wantA[5:], patch)
	wantB := bytes.Clone(src)
	copy(wantB[n-3:], patch[:3])
	if got := h.download(a, n); !bytes.Equal(got, wantA) {
		h.Errorf("HtoD at offset 5: bytes differ")
	}
	if got := h.download(b, n); !bytes.Equal(got, wantB) {
		h.Errorf("DtoD at offsets: bytes differ")
	}
	mid := make([]byte, 11)
	h.ok("MemcpyDtoH at an offset", h.b.MemcpyDtoH(mid, a.Add(3)))
	if !bytes.Equal(mid, wantA[3:14]) {
		h.Errorf("DtoH at offset 3 = %x, want %x", mid, wantA[3:14])
	}
	// Zero-length copies are no-ops.
	h.ok("MemcpyHtoD of 0 bytes", h.b.MemcpyHtoD(a, nil))
	h.ok("MemcpyDtoH of 0 bytes", h.b.MemcpyDtoH(nil, a))
}

// testMemcpyAsync enqueues a chain of async copies and memsets whose result
// depends on their order, behind enough work that they run after the host
// returns.
func testMemcpyAsync(h *h) {
	r := h.random()
	const n = 1 << 16
	data1, data2 := make([]byte, n), make([]byte, n)
	for i := range data1 {
		data1[i], data2[i] = byte(r.Uint32()), byte(r.Uint32())
	}
	s := h.stream(0)
	a, b := h.alloc(0, n), h.alloc(0, n)
	out1, out2 := make([]byte, n), make([]byte, n)
	h.busy(0, s)
	h.ok("MemcpyHtoDAsync", h.b.MemcpyHtoDAsync(a, data1, s))
	h.ok("MemsetAsync", h.b.MemsetAsync(gpu.Memset{Dst: a, Value: 0xab, ElemSize: 1, Count: 16}, s))
	h.ok("MemcpyDtoDAsync", h.b.MemcpyDtoDAsync(b, a, n, s))
	h.ok("MemcpyHtoDAsync", h.b.MemcpyHtoDAsync(a, data2, s))
	h.ok("MemcpyDtoHAsync", h.b.MemcpyDtoHAsync(out1, b, s))
	h.ok("MemcpyDtoHAsync", h.b.MemcpyDtoHAsync(out2, a, s))
	h.sync(s)
	want1 := bytes.Clone(data1)
	copy(want1, bytes.Repeat([]byte{0xab}, 16))
	if !bytes.Equal(out1, want1) {
		h.Errorf("async chain: the DtoD copy did not see the HtoD then memset before it, or saw the HtoD after it")
	}
	if !bytes.Equal(out2, data2) {
		h.Errorf("async chain: the last HtoD was not ordered before the DtoH after it")
	}
	h.wantErr("MemcpyHtoDAsync on stream 0", h.b.MemcpyHtoDAsync(a, data1, 0), gpu.ErrInvalidHandle)
	h.wantErr("MemcpyDtoHAsync on stream 0", h.b.MemcpyDtoHAsync(out1, a, 0), gpu.ErrInvalidHandle)
	h.wantErr("MemcpyDtoDAsync on stream 0", h.b.MemcpyDtoDAsync(b, a, n, 0), gpu.ErrInvalidHandle)
}

func testMemset(h *h) {
	r := h.random()
	const size = 1024
	init := make([]byte, size)
	for i := range init {
		init[i] = byte(r.Uint32())
	}
	p := h.upload(0, init)
	s := h.stream(0)
	const value = 0x11223344
	for _, async := range []bool{false, true} {
		for _, es := range []int{1, 2, 4} {
			h.ok("MemcpyHtoD", h.b.MemcpyHtoD(p, init))
			off, count := uint64(4*es), uint64(37) // odd count, aligned offset
			m := gpu.Memset{Dst: p.Add(off), Value: value, ElemSize: es, Count: count}
			if m.Bytes() != count*uint64(es) {
				h.Fatalf("Memset.Bytes = %d", m.Bytes())
			}
			var err error
			if async {
				err = h.b.MemsetAsync(m, s)
				h.sync(s)
			} else {
				err = h.b.Memset(m)
			}
			h.ok(fmt.Sprintf("Memset(elem %d, async %v)", es, async), err)
			want := bytes.Clone(init)
			var elem [4]byte
			binary.LittleEndian.PutUint32(elem[:], value)
			for i := uint64(0); i < count; i++ {
				copy(want[off+i*uint64(es):], elem[:es])
			}
			if got := h.download(p, size); !bytes.Equal(got, want) {
				h.Errorf("Memset(elem %d, value %#x, async %v) wrote the wrong bytes or outside its range:\n got %x\nwant %x",
					es, value, async, got[:off+count*uint64(es)+8], want[:off+count*uint64(es)+8])
			}
		}
	}
	// A zero count does nothing.
	h.ok("MemcpyHtoD", h.b.MemcpyHtoD(p, init))
	h.ok("Memset of 0 elements", h.b.Memset(gpu.Memset{Dst: p, Value: 1, ElemSize: 4}))
	if got := h.download(p, size); !bytes.Equal(got, init) {
		h.Errorf("Memset of 0 elements changed memory")
	}
}

func testMemsetErrors(h *h) {
	p := h.alloc(0, 256)
	s := h.stream(0)
	for _, m := range []gpu.Memset{
		{Dst: p, ElemSize: 3, Count: 4},
		{Dst: p, ElemSize: 0, Count: 4},
		{Dst: p, ElemSize: 8, Count: 4},
		{Dst: p.Add(1), ElemSize: 2, Count: 4},
		{Dst: p.Add(2), ElemSize: 4, Count: 4},
	} {
		what := fmt.Sprintf("Memset(dst+%d, elem %d)", m.Dst-p, m.ElemSize)
		h.wantErr(what, h.b.Memset(m), gpu.ErrInvalidValue)
		h.wantErr("async "+what, h.b.MemsetAsync(m, s), gpu.ErrInvalidValue)
	}
	h.wantErr("MemsetAsync on stream 0", h.b.MemsetAsync(gpu.Memset{Dst: p, ElemSize: 1, Count: 1}, 0), gpu.ErrInvalidHandle)
	h.sync(s)
}
