package gputest

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
)

var hostMemTests = []test{
	{name: "AllocFree", run: testHostAllocFree},
	{name: "WriteValueVisible", run: testWriteValueVisible},
	{name: "WriteValueAfterKernel", run: testWriteValueOrdered},
	{name: "WriteValueDeviceMemory", run: testWriteValueDevice},
	{name: "WriteValueCaptured", run: testWriteValueCaptured},
}

// timelineWait is how long a test waits for a stream write to become visible.
const timelineWait = 10 * time.Second

// streamMemOps sets h.mo, skipping the test when the backend or dev has no
// stream memory operations.
func (h *h) streamMemOps(dev int) {
	h.Helper()
	mo, err := h.memOpsOf(dev)
	if errors.Is(err, gpu.ErrNotSupported) {
		h.Skipf("stream memory operations: %v", err)
	}
	h.ok("StreamMemOpsOf", err)
	h.mo = mo
}

func (h *h) hostAlloc(size uint64) gpu.HostMem {
	h.Helper()
	if h.mo == nil {
		h.streamMemOps(0)
	}
	m, err := h.mo.HostAlloc(size)
	h.ok("HostAlloc", err)
	h.track(hostKey(m.Handle), 0, func() error { return h.mo.HostFree(m.Handle) })
	return m
}

func testHostAllocFree(h *h) {
	h.streamMemOps(0)
	before, _ := h.counters()
	m, err := h.mo.HostAlloc(4096)
	h.ok("HostAlloc", err)
	h.wantCounters("after HostAlloc", before, func(c *gpu.HandleCounts) { c.HostAllocs++ })
	if m.Handle == 0 || m.Ptr == 0 || len(m.Bytes) != 4096 {
		h.Fatalf("HostAlloc(4096) = handle %#x, ptr %#x, %d bytes", uint64(m.Handle), uint64(m.Ptr), len(m.Bytes))
	}
	if m.Ptr%8 != 0 {
		h.Errorf("HostAlloc pointer %#x is not 8-byte aligned", uint64(m.Ptr))
	}
	for i, b := range m.Bytes {
		if b != 0 {
			h.Errorf("HostAlloc memory not zeroed: byte %d = %#x", i, b)
			break
		}
	}
	m.Store64(8, 42)
	if m.Load64(8) != 42 {
		h.Errorf("Store64/Load64 roundtrip")
	}
	h.ok("HostFree", h.mo.HostFree(m.Handle))
	h.wantCounters("after HostFree", before, nil)
	h.wantErr("second HostFree", h.mo.HostFree(m.Handle), gpu.ErrInvalidHandle)
	h.wantErr("HostFree(0)", h.mo.HostFree(0), gpu.ErrInvalidHandle)
}

func testWriteValueVisible(h *h) {
	h.streamMemOps(0)
	m := h.hostAlloc(64)
	s := h.stream(0)
	const v = 0x1122334455667788
	h.ok("StreamWriteValue64", h.mo.StreamWriteValue64(s, m.Ptr.Add(8), v))
	if !eventually(timelineWait, func() bool { return m.Load64(8) == v }) {
		h.Fatalf("StreamWriteValue64 not visible to Load64 after %v without a synchronize: %#x", timelineWait, m.Load64(8))
	}
	if m.Load64(0) != 0 || m.Load64(16) != 0 {
		h.Errorf("StreamWriteValue64 touched neighbouring words: %#x %#x", m.Load64(0), m.Load64(16))
	}
	// Later writes to the same word are seen in order.
	for i := uint64(1); i <= 100; i++ {
		h.ok("StreamWriteValue64", h.mo.StreamWriteValue64(s, m.Ptr.Add(8), i))
	}
	h.sync(s)
	if got := m.Load64(8); got != 100 {
		h.Errorf("after 100 writes and a synchronize the word is %d", got)
	}
	h.wantErr("StreamWriteValue64 at a misaligned address", h.mo.StreamWriteValue64(s, m.Ptr.Add(4), 1), gpu.ErrInvalidValue)
	h.wantErr("StreamWriteValue64 on stream 0", h.mo.StreamWriteValue64(0, m.Ptr, 1), gpu.ErrInvalidHandle)
	h.sync(s)
}

// testWriteValueOrdered checks that once the host sees a value written after
// a kernel, the kernel and an event recorded between them are complete.
func testWriteValueOrdered(h *h) {
	h.streamMemOps(0)
	m := h.hostAlloc(64)
	s := h.stream(0)
	const n = 1 << 16
	out := h.alloc(0, 4*n)
	h.setF32(out, 0, n)
	e := h.event(0, gpu.EventDisableTiming)
	h.busy(0, s)
	h.launch(h.fillParams(0, out, 4, n), s)
	h.ok("EventRecord", h.b.EventRecord(e, s))
	h.ok("StreamWriteValue64", h.mo.StreamWriteValue64(s, m.Ptr.Add(16), 7))
	if !eventually(timelineWait, func() bool { return m.Load64(16) == 7 }) {
		h.Fatalf("StreamWriteValue64 after a kernel not visible after %v", timelineWait)
	}
	if done, err := h.b.EventQuery(e); err != nil || !done {
		h.Errorf("value written after an event is visible but EventQuery(event) = %v, %v", done, err)
	}
	h.wantAllF32("kernel before the timeline write", h.downloadF32(out, n), 4)
	h.sync(s)
}

func testWriteValueDevice(h *h) {
	h.streamMemOps(0)
	p := h.alloc(0, 24)
	h.ok("Memset", h.b.Memset(gpu.Memset{Dst: p, ElemSize: 1, Count: 24}))
	s := h.stream(0)
	const v = 0xfedcba9876543210
	h.ok("StreamWriteValue64 into device memory", h.mo.StreamWriteValue64(s, p.Add(8), v))
	h.sync(s)
	got := h.download(p, 24)
	if binary.LittleEndian.Uint64(got[8:]) != v || binary.LittleEndian.Uint64(got[:8]) != 0 || binary.LittleEndian.Uint64(got[16:]) != 0 {
		h.Errorf("StreamWriteValue64 into device memory: %x", got)
	}
}

func testWriteValueCaptured(h *h) {
	h.streamMemOps(0)
	m := h.hostAlloc(64)
	s := h.stream(0)
	h.ok("StreamBeginCapture", h.b.StreamBeginCapture(s))
	h.ok("StreamWriteValue64 while capturing", h.mo.StreamWriteValue64(s, m.Ptr.Add(24), 5))
	g, err := h.b.StreamEndCapture(s)
	h.ok("StreamEndCapture", err)
	h.trackGraph(g)
	h.sync(s)
	if m.Load64(24) != 0 {
		h.Errorf("a captured StreamWriteValue64 ran at capture time")
	}
	nodes, err := h.b.GraphNodes(g)
	h.ok("GraphNodes", err)
	if len(nodes) != 1 {
		h.Fatalf("captured graph has %d nodes, want 1", len(nodes))
	}
	if typ, err := h.b.GraphNodeType(nodes[0]); err != nil || typ != gpu.NodeMemWriteValue {
		h.Errorf("captured StreamWriteValue64 node type = %v, %v; want %v", typ, err, gpu.NodeMemWriteValue)
	}
	x := h.instantiate(g)
	h.launchGraph(x, s)
	if got := m.Load64(24); got != 5 {
		h.Errorf("replayed write-value node wrote %d, want 5", got)
	}
}
