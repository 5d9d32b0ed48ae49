package sim

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

func TestRegisteredAndProps(t *testing.T) {
	b, reason, err := gpu.Open("sim", gpu.Config{Backends: []gpu.BackendConfig{Config{Devices: 2}}})
	must(t, err)
	defer func() { must(t, b.Close()) }()
	if b.Name() != "sim" || b.DeviceCount() != 2 || !strings.Contains(reason, "sim") {
		t.Fatalf("name %q, %d devices, reason %q", b.Name(), b.DeviceCount(), reason)
	}
	p, err := b.DeviceProps(1)
	must(t, err)
	want := gpu.DeviceProps{Ordinal: 1, Name: "sim device 1", TotalMemory: 8 << 30, ComputeMajor: 9, VMM: true,
		Granularity: 2 << 20, StreamMemOps: true, DriverVersion: 13000}
	if p != want {
		t.Fatalf("props %+v, want %+v", p, want)
	}
	_, err = b.DeviceProps(2)
	wantErr(t, err, gpu.ErrInvalidValue)
	if _, g, err := gpu.VirtualMemoryOf(b, 0); err != nil || g != Granularity {
		t.Fatalf("VirtualMemoryOf: %d, %v", g, err)
	}
}

func TestMemAllocRoundTripAndAccounting(t *testing.T) {
	b := newSim(t, Config{DeviceMemory: 1 << 20})
	p := alloc(t, b, 0, 1000)
	if p == 0 || p%256 != 0 {
		t.Fatalf("MemAlloc address %#x is not 256-byte aligned", p)
	}
	free, total, err := b.MemGetInfo(0)
	must(t, err)
	if total != 1<<20 || free != total-1024 {
		t.Fatalf("MemGetInfo = %d, %d", free, total)
	}
	src := make([]byte, 1000)
	for i := range src {
		src[i] = byte(i * 7)
	}
	must(t, b.MemcpyHtoD(p, src))
	got := make([]byte, 1000)
	must(t, b.MemcpyDtoH(got, p))
	if !bytes.Equal(got, src) {
		t.Fatal("round trip differs")
	}

	// Beyond the device's memory.
	_, err = b.MemAlloc(0, 1<<20)
	wantErr(t, err, gpu.ErrOutOfMemory)
	_, err = b.MemAlloc(0, 0)
	wantErr(t, err, gpu.ErrInvalidValue)
	_, err = b.MemAlloc(3, 16)
	wantErr(t, err, gpu.ErrInvalidValue)

	// Freeing anything but the start of a live allocation.
	wantErr(t, b.MemFree(p+256), gpu.ErrInvalidHandle)
	wantErr(t, b.MemFree(0), gpu.ErrInvalidHandle)
	q, err := b.MemAlloc(0, 64)
	must(t, err)
	must(t, b.MemFree(q))
	wantErr(t, b.MemFree(q), gpu.ErrInvalidHandle)

	// An overrun of one byte faults (sticky), naming the first bad address.
	err = b.MemcpyHtoD(p, make([]byte, 1001))
	fe := wantFault(t, err)
	if fe.Addr != p+1000 || fe.Reason != "unmapped" || fe.Kernel != "memcpy" || !fe.Write || fe.Size != 1001 {
		t.Fatalf("fault %+v", fe)
	}
	wantFault(t, b.MemcpyDtoH(got, p))
	must(t, b.ResetDevice(0))
	must(t, b.MemcpyDtoH(got, p))
}

func TestMemsetElementSizes(t *testing.T) {
	b := newSim(t, Config{})
	p := alloc(t, b, 0, 64)
	must(t, b.Memset(gpu.Memset{Dst: p, Value: 0xab, ElemSize: 1, Count: 64}))
	must(t, b.Memset(gpu.Memset{Dst: p + 8, Value: 0x1234, ElemSize: 2, Count: 4}))
	must(t, b.Memset(gpu.Memset{Dst: p + 32, Value: 0xdeadbeef, ElemSize: 4, Count: 2}))
	got := make([]byte, 64)
	must(t, b.MemcpyDtoH(got, p))
	if got[0] != 0xab || binary.LittleEndian.Uint16(got[8:]) != 0x1234 || binary.LittleEndian.Uint16(got[14:]) != 0x1234 ||
		got[16] != 0xab || binary.LittleEndian.Uint32(got[36:]) != 0xdeadbeef || got[40] != 0xab {
		t.Fatalf("memset result % x", got)
	}
	wantErr(t, b.Memset(gpu.Memset{Dst: p + 1, Value: 1, ElemSize: 2, Count: 1}), gpu.ErrInvalidValue)
	wantErr(t, b.Memset(gpu.Memset{Dst: p, Value: 1, ElemSize: 3, Count: 1}), gpu.ErrInvalidValue)
}

// vmmSetup maps one chunk of dev at the start of a reservation of size
// bytes; the caller owns the cleanup of all three.
func vmmMap(t *testing.T, b *Backend, dev int, size uint64) (gpu.DevicePtr, gpu.PhysMem) {
	t.Helper()
	h, err := b.MemCreate(dev, size)
	must(t, err)
	p, err := b.MemAddressReserve(size, 0)
	must(t, err)
	must(t, b.MemMap(p, size, 0, h))
	t.Cleanup(func() {
		must(t, b.MemUnmap(p, size))
		must(t, b.MemAddressFree(p, size))
		must(t, b.MemRelease(h))
	})
	return p, h
}

func TestVMMRules(t *testing.T) {
	const G = Granularity
	b := newSim(t, Config{DeviceMemory: 8 * G})

	// Alignment and size.
	_, err := b.MemCreate(0, G+1)
	wantErr(t, err, gpu.ErrInvalidValue)
	_, err = b.MemAddressReserve(G/2, 0)
	wantErr(t, err, gpu.ErrInvalidValue)
	_, err = b.MemAddressReserve(G, 3*G)
	wantErr(t, err, gpu.ErrInvalidValue)
	_, err = b.MemCreate(0, 16*G)
	wantErr(t, err, gpu.ErrOutOfMemory)

	h, err := b.MemCreate(0, 2*G)
	must(t, err)
	r, err := b.MemAddressReserve(4*G, 0)
	must(t, err)
	if r == 0 || r%G != 0 {
		t.Fatalf("reservation %#x not aligned", r)
	}
	wantErr(t, b.MemMap(r+1, G, 0, h), gpu.ErrInvalidValue)
	wantErr(t, b.MemMap(r, G, G/2, h), gpu.ErrInvalidValue)
	wantErr(t, b.MemMap(r, 3*G, 0, h), gpu.ErrInvalidValue)     // past the chunk
	wantErr(t, b.MemMap(r+3*G, 2*G, 0, h), gpu.ErrInvalidValue) // past the reservation
	wantErr(t, b.MemMap(r, G, 0, 12345), gpu.ErrInvalidHandle)

	// Two mappings of the two halves of the chunk, swapped, contiguous.
	must(t, b.MemMap(r, G, G, h))
	must(t, b.MemMap(r+G, G, 0, h))
	wantErr(t, b.MemMap(r+G, G, 0, h), gpu.ErrIllegalState) // overlap
	if c := b.LiveHandles(); c.Mappings != 2 || c.Chunks != 1 || c.Reservations != 1 {
		t.Fatalf("counters %s", c)
	}

	// A mapping starts with no access.
	err = b.MemcpyHtoD(r, []byte{1})
	if fe := wantFault(t, err); fe.Reason != "no access from any device" {
		t.Fatalf("fault %+v", fe)
	}
	must(t, b.ResetDevice(0))
	must(t, b.MemSetAccess(r, 2*G, []int{0}))

	// An access spanning both mappings sees the chunk's halves swapped.
	data := make([]byte, 16)
	for i := range data {
		data[i] = byte(i + 1)
	}
	must(t, b.MemcpyHtoD(r+G-8, data))
	must(t, b.MemUnmap(r, G))
	must(t, b.MemMap(r, G, 0, h)) // now the first half at r too
	must(t, b.MemSetAccess(r, G, []int{0}))
	got := make([]byte, 8)
	must(t, b.MemcpyDtoH(got, r)) // chunk offset 0, written through r+G
	if !bytes.Equal(got, data[8:]) {
		t.Fatalf("chunk bytes % x, want % x", got, data[8:])
	}

	// Unmap and access must cover whole mappings; a hole is not mapped.
	wantErr(t, b.MemUnmap(r, 3*G), gpu.ErrIllegalState)
	wantErr(t, b.MemSetAccess(r+2*G, G, []int{0}), gpu.ErrIllegalState)
	wantErr(t, b.MemAddressFree(r, 4*G), gpu.ErrIllegalState)
	wantErr(t, b.MemAddressFree(r, 2*G), gpu.ErrInvalidValue)

	// Release while mapped: the handle goes, the memory stays until the
	// last unmap.
	must(t, b.MemRelease(h))
	wantErr(t, b.MemRelease(h), gpu.ErrInvalidHandle)
	if c := b.LiveHandles(); c.Chunks != 0 || c.Mappings != 2 {
		t.Fatalf("counters after release %s", c)
	}
	if free, _, _ := b.MemGetInfo(0); free != 6*G {
		t.Fatalf("released but mapped chunk not charged: free %d", free)
	}
	must(t, b.MemcpyDtoH(got, r))
	if !bytes.Equal(got, data[8:]) {
		t.Fatal("released chunk lost its contents while mapped")
	}
	must(t, b.MemUnmap(r, 2*G))
	if free, _, _ := b.MemGetInfo(0); free != 8*G {
		t.Fatalf("chunk not freed with its last mapping: free %d", free)
	}
	err = b.MemcpyDtoH(got, r)
	if fe := wantFault(t, err); fe.Reason != "unmapped" {
		t.Fatalf("fault %+v", fe)
	}
	must(t, b.ResetDevice(0))
	must(t, b.MemAddressFree(r, 4*G))
	wantErr(t, b.MemAddressFree(r, 4*G), gpu.ErrInvalidHandle)
	err = b.MemcpyDtoH(got, r)
	if fe := wantFault(t, err); fe.Reason != "freed" || fe.Addr != r {
		t.Fatalf("fault %+v", fe)
	}
	must(t, b.ResetDevice(0))

	// Freed reservations are not reused.
	r2, err := b.MemAddressReserve(4*G, 0)
	must(t, err)
	if r2 < r+4*G {
		t.Fatalf("reservation %#x reuses freed range at %#x", r2, r)
	}
	must(t, b.MemAddressFree(r2, 4*G))
}

func TestUseAfterFreeFaultsNamingAddressAndKernel(t *testing.T) {
	b := newSim(t, Config{})
	k := loadKernels(t, b, 0)
	fill := k.fn(t, kernels.Fill)
	s := newStream(t, b, 0)
	const n = 64
	p, err := b.MemAlloc(0, 4*n)
	must(t, err)
	live := alloc(t, b, 0, 4*n)
	must(t, b.LaunchKernel(fill, kernels.Elementwise(n), fillArgs(live, 1, n), s))
	must(t, b.MemFree(p))
	must(t, b.LaunchKernel(fill, kernels.Elementwise(n), fillArgs(p, 2, n), s))
	// Queued after the fault: skipped.
	must(t, b.LaunchKernel(fill, kernels.Elementwise(n), fillArgs(live, 3, n), s))

	err = b.StreamSynchronize(s)
	fe := wantFault(t, err)
	if fe.Addr != p || fe.Kernel != kernels.Fill || fe.Reason != "freed" || fe.Device != 0 || !fe.Write || fe.Size != 4*n {
		t.Fatalf("fault %+v", fe)
	}
	for _, s := range []string{"sg_fill", "freed", "StreamSynchronize"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
	// Sticky: every synchronizing call on the device reports it.
	wantFault(t, b.LaunchKernel(fill, kernels.Elementwise(n), fillArgs(live, 4, n), s))
	_, err = b.StreamQuery(s)
	wantFault(t, err)
	wantFault(t, b.MemcpyHtoD(live, make([]byte, 4)))
	wantFault(t, b.Memset(gpu.Memset{Dst: live, ElemSize: 4, Count: 1}))

	must(t, b.ResetDevice(0))
	must(t, b.StreamSynchronize(s))
	wantAll(t, readF32(t, b, live, n), 1) // the fill of 3 was skipped
	must(t, b.LaunchKernel(fill, kernels.Elementwise(n), fillArgs(live, 5, n), s))
	must(t, b.StreamSynchronize(s))
	wantAll(t, readF32(t, b, live, n), 5)
}

func TestNoAccessFromOtherDevice(t *testing.T) {
	b := newSim(t, Config{Devices: 2})
	k0, k1 := loadKernels(t, b, 0), loadKernels(t, b, 1)
	s0, s1 := newStream(t, b, 0), newStream(t, b, 1)
	const n = 16

	// VMM memory of device 0, accessible from device 0 only.
	p, _ := vmmMap(t, b, 0, Granularity)
	must(t, b.MemSetAccess(p, Granularity, []int{0}))
	must(t, b.LaunchKernel(k0.fn(t, kernels.Fill), kernels.Elementwise(n), fillArgs(p, 7, n), s0))
	must(t, b.StreamSynchronize(s0))
	must(t, b.LaunchKernel(k1.fn(t, kernels.Fill), kernels.Elementwise(n), fillArgs(p, 8, n), s1))
	fe := wantFault(t, b.StreamSynchronize(s1))
	if fe.Reason != "no access from device 1" || fe.Device != 1 || fe.Addr != p || fe.Kernel != kernels.Fill {
		t.Fatalf("fault %+v", fe)
	}
	// Device 0 is unaffected by device 1's fault.
	must(t, b.StreamSynchronize(s0))
	must(t, b.ResetDevice(1))

	// Granting access lets device 1 in (peer access through VMM).
	must(t, b.MemSetAccess(p, Granularity, []int{1}))
	must(t, b.LaunchKernel(k1.fn(t, kernels.Fill), kernels.Elementwise(n), fillArgs(p, 8, n), s1))
	must(t, b.StreamSynchronize(s1))
	wantAll(t, readF32(t, b, p, n), 8)

	// MemAlloc memory is reachable from its own device only.
	q := alloc(t, b, 0, 4*n)
	must(t, b.MemsetAsync(gpu.Memset{Dst: q, ElemSize: 4, Count: n}, s1))
	fe = wantFault(t, b.StreamSynchronize(s1))
	if fe.Reason != "no access from device 1" || fe.Kernel != "memset" {
		t.Fatalf("fault %+v", fe)
	}
	must(t, b.ResetDevice(1))

	// A kernel of device 0 cannot be launched on a stream of device 1.
	wantErr(t, b.LaunchKernel(k0.fn(t, kernels.Fill), kernels.Elementwise(n), fillArgs(q, 1, n), s1), gpu.ErrInvalidValue)
}

func TestHostMemoryAndStreamWriteValue(t *testing.T) {
	b := newSim(t, Config{Devices: 2})
	h, err := b.HostAlloc(64)
	must(t, err)
	if len(h.Bytes) != 64 || h.Ptr == 0 || h.Ptr%8 != 0 {
		t.Fatalf("host alloc %+v", h)
	}
	s1 := newStream(t, b, 1)
	must(t, b.StreamWriteValue64(s1, h.Ptr+8, 42))
	must(t, b.StreamSynchronize(s1))
	if v := h.Load64(8); v != 42 {
		t.Fatalf("timeline = %d, want 42", v)
	}
	// Device memory can be written too; bad addresses are refused up front.
	d := alloc(t, b, 1, 64)
	must(t, b.StreamWriteValue64(s1, d+16, 7))
	wantErr(t, b.StreamWriteValue64(s1, h.Ptr+4, 1), gpu.ErrInvalidValue)
	wantErr(t, b.StreamWriteValue64(s1, 0x1000, 1), gpu.ErrInvalidValue)
	must(t, b.StreamSynchronize(s1))
	got := make([]byte, 8)
	must(t, b.MemcpyDtoH(got, d+16))
	if binary.LittleEndian.Uint64(got) != 7 {
		t.Fatalf("device value % x", got)
	}

	// A stalled timeline completes writes without writing.
	b.StallTimeline(true)
	must(t, b.StreamWriteValue64(s1, h.Ptr+8, 43))
	must(t, b.StreamSynchronize(s1))
	if v := h.Load64(8); v != 42 {
		t.Fatalf("stalled timeline moved to %d", v)
	}
	b.StallTimeline(false)
	must(t, b.StreamWriteValue64(s1, h.Ptr+8, 44))
	must(t, b.StreamSynchronize(s1))
	if v := h.Load64(8); v != 44 {
		t.Fatalf("timeline = %d, want 44", v)
	}

	must(t, b.HostFree(h.Handle))
	wantErr(t, b.HostFree(h.Handle), gpu.ErrInvalidHandle)
	err = b.MemcpyHtoD(h.Ptr, []byte{1})
	if fe := wantFault(t, err); fe.Reason != "freed" {
		t.Fatalf("fault %+v", fe)
	}
	must(t, b.ResetDevice(0))
}

func TestLargeChunksAreLazy(t *testing.T) {
	// 8 GiB of chunks must not cost 8 GiB of host memory.
	b := newSim(t, Config{})
	const size = 4 << 30
	var hs []gpu.PhysMem
	for range 2 {
		h, err := b.MemCreate(0, size)
		must(t, err)
		hs = append(hs, h)
	}
	_, err := b.MemCreate(0, Granularity)
	wantErr(t, err, gpu.ErrOutOfMemory)
	r, err := b.MemAddressReserve(size, 0)
	must(t, err)
	must(t, b.MemMap(r, size, 0, hs[1]))
	must(t, b.MemSetAccess(r, size, []int{0}))
	must(t, b.MemcpyHtoD(r+size-4, []byte{1, 2, 3, 4}))
	must(t, b.Memset(gpu.Memset{Dst: r, ElemSize: 4, Count: size / 4})) // zero fill touches no page
	got := make([]byte, 4)
	must(t, b.MemcpyDtoH(got, r+size-4))
	if !bytes.Equal(got, make([]byte, 4)) {
		t.Fatalf("zero memset left % x", got)
	}
	must(t, b.MemUnmap(r, size))
	must(t, b.MemAddressFree(r, size))
	for _, h := range hs {
		must(t, b.MemRelease(h))
	}
}

func TestHugeRequestsAreOutOfMemoryNotCrashes(t *testing.T) {
	b := newSim(t, Config{DeviceMemory: 1 << 62})
	_, err := b.MemAlloc(0, 1<<61)
	wantErr(t, err, gpu.ErrOutOfMemory)
	_, err = b.MemCreate(0, 1<<61)
	wantErr(t, err, gpu.ErrOutOfMemory)
	_, err = b.HostAlloc(1 << 62)
	wantErr(t, err, gpu.ErrOutOfMemory)
	_, err = b.MemAddressReserve(1<<63, 0)
	wantErr(t, err, gpu.ErrOutOfMemory)
}

func TestOldTombstonesAreForgotten(t *testing.T) {
	b := newSim(t, Config{})
	first, err := b.MemAlloc(0, 8)
	must(t, err)
	must(t, b.MemFree(first))
	var last gpu.DevicePtr
	for range maxTombstones + 10 {
		p, err := b.MemAlloc(0, 8)
		must(t, err)
		must(t, b.MemFree(p))
		last = p
	}
	buf := make([]byte, 8)
	if fe := wantFault(t, b.MemcpyDtoH(buf, last)); fe.Reason != "freed" {
		t.Fatalf("recent free: %+v", fe)
	}
	must(t, b.ResetDevice(0))
	if fe := wantFault(t, b.MemcpyDtoH(buf, first)); fe.Reason != "unmapped" {
		t.Fatalf("old free: %+v", fe)
	}
	must(t, b.ResetDevice(0))
}
