package sim

import (
	"encoding/binary"
	"math"
	"unsafe"

	"github.com/stablegraph/stablegraph/gpu"
)

// ---- plain device memory ----

// MemAlloc allocates size bytes on dev at a 256-byte aligned address that
// is never reused. The allocation is accessible from dev only (sim does not
// model peer access to MemAlloc memory; use VMM and MemSetAccess to share),
// and only its size bytes are mapped: an access past the end faults.
func (b *Backend) MemAlloc(dev int, size uint64) (gpu.DevicePtr, error) {
	const op = "MemAlloc"
	if err := b.enter(op); err != nil {
		return 0, err
	}
	if err := b.checkDev(op, dev); err != nil {
		return 0, err
	}
	if size == 0 {
		return 0, gpu.Errorf(op, gpu.ErrInvalidValue, "size is zero")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return 0, errClosed(op)
	}
	as := &b.mu.as
	charge := gpu.RoundUp(size, allocAlign)
	if err := b.chargeLocked(op, dev, size, charge); err != nil {
		return 0, err
	}
	if err := checkAllocSize(op, size, maxAllocSize); err != nil {
		return 0, err
	}
	start, ok := as.carve(size, allocAlign, allocGuard)
	if !ok {
		return 0, gpu.Errorf(op, gpu.ErrOutOfMemory, "virtual address space exhausted")
	}
	r := &region{kind: regAlloc, start: start, size: size, dev: dev, mem: newBacking(size)}
	as.insert(r)
	as.allocs[gpu.DevicePtr(start)] = r
	as.used[dev] += charge
	return gpu.DevicePtr(start), nil
}

func checkAllocSize(op string, size, limit uint64) error {
	if size > limit {
		return gpu.Errorf(op, gpu.ErrOutOfMemory, "%d bytes requested; sim allocates at most %d bytes at once", size, limit)
	}
	return nil
}

// chargeLocked checks that dev has room for charge more bytes.
func (b *Backend) chargeLocked(op string, dev int, size, charge uint64) error {
	used, total := b.mu.as.used[dev], b.cfg.DeviceMemory
	if charge < size || charge > total-used {
		return gpu.Errorf(op, gpu.ErrOutOfMemory, "device %d: %d bytes requested, %d of %d bytes free", dev, size, total-used, total)
	}
	return nil
}

func (b *Backend) MemFree(p gpu.DevicePtr) error {
	const op = "MemFree"
	if err := b.enter(op); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r, err := getLocked(b, op, "allocation", b.mu.as.allocs, p)
	if err != nil {
		return err
	}
	delete(b.mu.as.allocs, p)
	b.mu.as.used[r.dev] -= gpu.RoundUp(r.size, allocAlign)
	b.mu.as.release(r)
	return nil
}

func (b *Backend) MemGetInfo(dev int) (free, total uint64, err error) {
	const op = "MemGetInfo"
	if err := b.enter(op); err != nil {
		return 0, 0, err
	}
	if err := b.checkDev(op, dev); err != nil {
		return 0, 0, err
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	total = b.cfg.DeviceMemory
	return total - b.mu.as.used[dev], total, nil
}

// ---- checked access, shared by kernels, copies and memsets ----

// actor is who performs an access: device dev running kernel (or "memcpy",
// "memset", "writeValue64"). Synchronous calls name no stream, so for them
// any device with access may reach the memory (any), and dev is only the
// device a fault is charged to.
type actor struct {
	dev    int
	any    bool
	kernel string
}

func (a actor) perm() int {
	if a.any {
		return anyDev
	}
	return a.dev
}

// fault turns f into a *gpu.FaultError and makes it a's device's sticky
// error.
func (b *Backend) fault(a actor, p gpu.DevicePtr, n uint64, write bool, f *fault) *gpu.FaultError {
	fe := &gpu.FaultError{Device: a.dev, Kernel: a.kernel, Addr: gpu.DevicePtr(f.addr), Size: n, Write: write, Reason: f.reason}
	b.stick(a.dev, fe)
	return fe
}

// access copies between buf and device memory at p, checking the whole
// range first.
func (b *Backend) access(a actor, p gpu.DevicePtr, buf []byte, write bool) error {
	var arr [4]piece
	b.mu.RLock()
	defer b.mu.RUnlock()
	ps, f := b.mu.as.resolve(p, uint64(len(buf)), a.perm(), arr[:0])
	if f != nil {
		return b.fault(a, p, uint64(len(buf)), write, f)
	}
	switch {
	case write && len(buf) == 8 && p%8 == 0:
		// An aligned 8-byte store is one store on a GPU: a host polling
		// with HostMem.Load64 (the patcher's mirror in mapped host memory)
		// sees the old or the new value, never a torn one. An aligned
		// range never crosses a page or a mapping.
		ps[0].mem.store64(ps[0].off, binary.LittleEndian.Uint64(buf))
	case write:
		writePieces(ps, buf)
	default:
		readPieces(ps, buf)
	}
	return nil
}

// check faults as an access of n bytes at p would, without copying: for
// a kernel that then reads the range piece by piece (the GEMM library's
// streamed operand), so that a bad range faults as one access of all of it.
func (b *Backend) check(a actor, p gpu.DevicePtr, n uint64, write bool) error {
	var arr [4]piece
	b.mu.RLock()
	defer b.mu.RUnlock()
	if _, f := b.mu.as.resolve(p, n, a.perm(), arr[:0]); f != nil {
		return b.fault(a, p, n, write, f)
	}
	return nil
}

// copyDtoD copies n bytes from src to dst.
func (b *Backend) copyDtoD(a actor, dst, src gpu.DevicePtr, n uint64) error {
	var da, sa [4]piece
	b.mu.RLock()
	defer b.mu.RUnlock()
	sp, f := b.mu.as.resolve(src, n, a.perm(), sa[:0])
	if f != nil {
		return b.fault(a, src, n, false, f)
	}
	dp, f := b.mu.as.resolve(dst, n, a.perm(), da[:0])
	if f != nil {
		return b.fault(a, dst, n, true, f)
	}
	copyPieces(dp, sp)
	return nil
}

// memset performs m.
func (b *Backend) memset(a actor, m gpu.Memset) error {
	var arr [4]piece
	n := m.Bytes()
	pat, zero := memsetPattern(m)
	b.mu.RLock()
	defer b.mu.RUnlock()
	ps, f := b.mu.as.resolve(m.Dst, n, a.perm(), arr[:0])
	if f != nil {
		return b.fault(a, m.Dst, n, true, f)
	}
	fillPieces(ps, pat, zero)
	return nil
}

// writeValue performs a stream value write.
func (b *Backend) writeValue(a actor, wv writeValue) error {
	if b.stall.Load() {
		return nil // a hung timeline: the write never lands
	}
	var arr [1]piece
	b.mu.RLock()
	defer b.mu.RUnlock()
	ps, f := b.mu.as.resolve(wv.p, 8, a.perm(), arr[:0])
	if f != nil {
		return b.fault(a, wv.p, 8, true, f)
	}
	// p is 8-aligned, and so is every region and mapping boundary and
	// page, so the value lies in one piece and one page.
	ps[0].mem.store64(ps[0].off, wv.v)
	return nil
}

func checkMemset(op string, m gpu.Memset) error {
	switch m.ElemSize {
	case 1, 2, 4:
	default:
		return gpu.Errorf(op, gpu.ErrInvalidValue, "memset element size %d (want 1, 2 or 4)", m.ElemSize)
	}
	if uint64(m.Dst)%uint64(m.ElemSize) != 0 {
		return gpu.Errorf(op, gpu.ErrInvalidValue, "memset destination %#x is not aligned to its %d-byte elements", uint64(m.Dst), m.ElemSize)
	}
	if m.Count > math.MaxUint64/uint64(m.ElemSize) {
		return gpu.Errorf(op, gpu.ErrInvalidValue, "memset of %d elements overflows", m.Count)
	}
	return nil
}

// ---- synchronous copies ----

// syncDevLocked picks the device a synchronous call runs on, which names no
// stream: the owner of the first pointer in device memory, else device 0.
// Faults of the call are sticky on that device.
func (b *Backend) syncDevLocked(ps ...gpu.DevicePtr) int {
	for _, p := range ps {
		if d := b.mu.as.ownerOf(uint64(p)); d >= 0 {
			return d
		}
	}
	return 0
}

// syncBegin runs the checks every synchronous call shares and returns the
// actor it runs as.
func (b *Backend) syncBegin(op, kernel string, ps ...gpu.DevicePtr) (actor, error) {
	if err := b.enter(op); err != nil {
		return actor{}, err
	}
	if b.closed.Load() {
		return actor{}, errClosed(op)
	}
	b.mu.RLock()
	dev := b.syncDevLocked(ps...)
	b.mu.RUnlock()
	return actor{dev: dev, any: true, kernel: kernel}, b.stickyErr(op, dev)
}

// wrapFault names op in an access error.
func wrapFault(op string, err error) error {
	if err == nil {
		return nil
	}
	return &gpu.Error{Op: op, Err: err}
}

// MemcpyHtoD copies src to dst now. Synchronous copies and memsets in sim
// do not wait for any stream (there is no legacy default stream); they
// check the memory, which any device with access may reach, and fault
// (stickily, on the memory's device) like a kernel would.
func (b *Backend) MemcpyHtoD(dst gpu.DevicePtr, src []byte) error {
	const op = "MemcpyHtoD"
	a, err := b.syncBegin(op, "memcpy", dst)
	if err != nil {
		return err
	}
	return wrapFault(op, b.access(a, dst, src, true))
}

func (b *Backend) MemcpyDtoH(dst []byte, src gpu.DevicePtr) error {
	const op = "MemcpyDtoH"
	a, err := b.syncBegin(op, "memcpy", src)
	if err != nil {
		return err
	}
	return wrapFault(op, b.access(a, src, dst, false))
}

func (b *Backend) MemcpyDtoD(dst, src gpu.DevicePtr, size uint64) error {
	const op = "MemcpyDtoD"
	a, err := b.syncBegin(op, "memcpy", dst, src)
	if err != nil {
		return err
	}
	return wrapFault(op, b.copyDtoD(a, dst, src, size))
}

func (b *Backend) Memset(m gpu.Memset) error {
	const op = "Memset"
	a, err := b.syncBegin(op, "memset", m.Dst)
	if err != nil {
		return err
	}
	if err := checkMemset(op, m); err != nil {
		return err
	}
	return wrapFault(op, b.memset(a, m))
}

// ---- asynchronous copies ----

// MemcpyHtoDAsync copies src to dst when s reaches the copy: src is read
// then, so it must stay alive and unmodified until then. It cannot be
// captured: on a capturing stream it invalidates the capture.
func (b *Backend) MemcpyHtoDAsync(dst gpu.DevicePtr, src []byte, s gpu.Stream) error {
	const op = "MemcpyHtoDAsync"
	if err := b.enter(op); err != nil {
		return err
	}
	return b.submit(op, s, capInvalidate, func(*stream) (cmd, error) {
		return cmd{kind: cmdHtoD, ptr: dst, host: src}, nil
	})
}

// MemcpyDtoHAsync copies src into dst when s reaches the copy. It cannot be
// captured: on a capturing stream it invalidates the capture.
func (b *Backend) MemcpyDtoHAsync(dst []byte, src gpu.DevicePtr, s gpu.Stream) error {
	const op = "MemcpyDtoHAsync"
	if err := b.enter(op); err != nil {
		return err
	}
	return b.submit(op, s, capInvalidate, func(*stream) (cmd, error) {
		return cmd{kind: cmdDtoH, ptr: src, host: dst}, nil
	})
}

func (b *Backend) MemcpyDtoDAsync(dst, src gpu.DevicePtr, size uint64, s gpu.Stream) error {
	const op = "MemcpyDtoDAsync"
	if err := b.enter(op); err != nil {
		return err
	}
	return b.submit(op, s, capNode, func(*stream) (cmd, error) {
		return cmd{kind: cmdMemcpy, p: params{cp: gpu.MemcpyParams{Dst: dst, Src: src, Size: size}}}, nil
	})
}

func (b *Backend) MemsetAsync(m gpu.Memset, s gpu.Stream) error {
	const op = "MemsetAsync"
	if err := b.enter(op); err != nil {
		return err
	}
	if err := checkMemset(op, m); err != nil {
		return err
	}
	return b.submit(op, s, capNode, func(*stream) (cmd, error) {
		return cmd{kind: cmdMemset, p: params{ms: m}}, nil
	})
}

// ---- host memory and stream value writes ----

// HostAlloc allocates zeroed host memory, 8-byte aligned, mapped into the
// address space at Ptr and accessible from every device.
func (b *Backend) HostAlloc(size uint64) (gpu.HostMem, error) {
	const op = "HostAlloc"
	if err := b.enter(op); err != nil {
		return gpu.HostMem{}, err
	}
	if size == 0 {
		return gpu.HostMem{}, gpu.Errorf(op, gpu.ErrInvalidValue, "size is zero")
	}
	if err := checkAllocSize(op, size, maxHostSize); err != nil {
		return gpu.HostMem{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return gpu.HostMem{}, errClosed(op)
	}
	as := &b.mu.as
	start, ok := as.carve(size, allocAlign, allocGuard)
	if !ok {
		return gpu.HostMem{}, gpu.Errorf(op, gpu.ErrOutOfMemory, "virtual address space exhausted")
	}
	// Backed by uint64s so that Bytes is 8-byte aligned for atomic stores.
	words := make([]uint64, (size+7)/8)
	flat := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), size)
	h := gpu.HostAlloc(b.newHandleLocked())
	r := &region{kind: regHost, start: start, size: size, mem: newHostBacking(flat), host: h}
	as.insert(r)
	as.hosts[h] = r
	return gpu.HostMem{Handle: h, Ptr: gpu.DevicePtr(start), Bytes: flat}, nil
}

// HostFree frees h. The Go slice stays valid memory for the host, but device
// accesses to its address fault as "freed".
func (b *Backend) HostFree(h gpu.HostAlloc) error {
	const op = "HostFree"
	if err := b.enter(op); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r, err := getLocked(b, op, "host allocation", b.mu.as.hosts, h)
	if err != nil {
		return err
	}
	delete(b.mu.as.hosts, h)
	b.mu.as.release(r)
	return nil
}

// StreamMemOpsSupported implements gpu.StreamMemOps: every simulated
// device writes values from its streams.
func (b *Backend) StreamMemOpsSupported(dev int) error {
	const op = "StreamMemOpsSupported"
	if err := b.enter(op); err != nil {
		return err
	}
	return b.checkDev(op, dev)
}

// StreamWriteValue64 atomically writes v at p (8-byte aligned, in host or
// device memory) when s reaches it; while StallTimeline is set the write is
// dropped. Captured, it becomes a NodeMemWriteValue node.
func (b *Backend) StreamWriteValue64(s gpu.Stream, p gpu.DevicePtr, v uint64) error {
	const op = "StreamWriteValue64"
	if err := b.enter(op); err != nil {
		return err
	}
	if p == 0 || p%8 != 0 {
		return gpu.Errorf(op, gpu.ErrInvalidValue, "address %#x is null or not 8-byte aligned", uint64(p))
	}
	return b.submit(op, s, capNode, func(*stream) (cmd, error) {
		if !b.mu.as.liveAt(uint64(p)) {
			return cmd{}, gpu.Errorf(op, gpu.ErrInvalidValue, "address %#x is not in live host or device memory", uint64(p))
		}
		return cmd{kind: cmdWrite, p: params{wv: writeValue{p: p, v: v}}}, nil
	})
}
