package gputest

import (
	"fmt"

	"github.com/stablegraph/stablegraph/gpu"
)

var captureTests = []test{
	{name: "KernelMemcpyMemset", run: testCapture},
	{name: "BeginEndErrors", run: testCaptureErrors},
	{name: "SynchronizeInvalidates", run: testCaptureSyncInvalidates},
	{name: "ForkJoin", run: testCaptureForkJoin},
}

// nodesByType returns g's nodes grouped by type.
func (h *h) nodesByType(g gpu.Graph) map[gpu.NodeType][]gpu.GraphNode {
	h.Helper()
	nodes, err := h.b.GraphNodes(g)
	h.ok("GraphNodes", err)
	m := map[gpu.NodeType][]gpu.GraphNode{}
	for _, n := range nodes {
		t, err := h.b.GraphNodeType(n)
		h.ok("GraphNodeType", err)
		m[t] = append(m[t], n)
	}
	return m
}

// one returns the only node of type t in byType, failing otherwise.
func (h *h) one(byType map[gpu.NodeType][]gpu.GraphNode, t gpu.NodeType) gpu.GraphNode {
	h.Helper()
	if len(byType[t]) != 1 {
		h.Fatalf("graph has %d %v nodes, want 1 (nodes by type: %v)", len(byType[t]), t, byType)
	}
	return byType[t][0]
}

func (h *h) capturing(s gpu.Stream, want bool) {
	h.Helper()
	got, err := h.b.StreamIsCapturing(s)
	if err != nil || got != want {
		h.Errorf("StreamIsCapturing = %v, %v; want %v", got, err, want)
	}
}

func (h *h) capture(s gpu.Stream, record func()) gpu.Graph {
	h.Helper()
	h.ok("StreamBeginCapture", h.b.StreamBeginCapture(s))
	record()
	g, err := h.b.StreamEndCapture(s)
	h.ok("StreamEndCapture", err)
	h.trackGraph(g)
	return g
}

func testCapture(h *h) {
	const n = 1500
	b := h.bufsF32(0, 3, n)
	A, B, C := b[0], b[1], b[2]
	h.setAll(b, 0, n)
	s := h.stream(0)
	axpb := h.axpbParams(0, B, A, 2, 1, n)
	h.capturing(s, false)
	before, _ := h.counters()
	h.ok("StreamBeginCapture", h.b.StreamBeginCapture(s))
	h.capturing(s, true)
	h.ok("MemsetAsync while capturing", h.b.MemsetAsync(f32Memset(A, 1, n), s))
	h.launch(axpb, s)
	h.ok("MemcpyDtoDAsync while capturing", h.b.MemcpyDtoDAsync(C, B, 4*n, s))
	g, err := h.b.StreamEndCapture(s)
	h.ok("StreamEndCapture", err)
	h.trackGraph(g)
	h.wantCounters("after a capture", before, func(c *gpu.HandleCounts) { c.Graphs++ })
	h.capturing(s, false)
	h.sync(s)
	for i, p := range b {
		h.wantAllF32(fmt.Sprintf("buffer %d after capture (captured work must not run)", i), h.downloadF32(p, n), 0)
	}

	byType := h.nodesByType(g)
	if len(byType) != 3 {
		h.Errorf("captured graph node types: %v, want one memset, one kernel, one memcpy", byType)
	}
	M, K, Cp := h.one(byType, gpu.NodeMemset), h.one(byType, gpu.NodeKernel), h.one(byType, gpu.NodeMemcpy)
	h.wantDeps(M)
	h.wantDeps(K, M)
	h.wantDeps(Cp, K)
	h.wantKernelParams(K, axpb)

	x := h.instantiate(g)
	for i := range 2 {
		h.setAll(b, 0, n)
		h.launchGraph(x, s)
		what := fmt.Sprintf("replay %d: ", i)
		h.wantAllF32(what+"captured memset", h.downloadF32(A, n), 1)
		h.wantAllF32(what+"captured kernel", h.downloadF32(B, n), 3)
		h.wantAllF32(what+"captured memcpy", h.downloadF32(C, n), 3)
	}
}

func testCaptureErrors(h *h) {
	s := h.stream(0)
	before, _ := h.counters()
	_, err := h.b.StreamEndCapture(s)
	h.wantErr("StreamEndCapture without a capture", err, gpu.ErrIllegalState)
	h.ok("StreamBeginCapture", h.b.StreamBeginCapture(s))
	h.wantErr("StreamBeginCapture while capturing", h.b.StreamBeginCapture(s), gpu.ErrIllegalState)
	h.capturing(s, true)
	g, err := h.b.StreamEndCapture(s)
	h.ok("StreamEndCapture of an empty capture", err)
	h.trackGraph(g)
	h.wantNodes("an empty capture", g)
	_, err = h.b.StreamEndCapture(s)
	h.wantErr("second StreamEndCapture", err, gpu.ErrIllegalState)
	h.wantCounters("after the capture errors", before, func(c *gpu.HandleCounts) { c.Graphs++ })

	h.wantErr("StreamBeginCapture(0)", h.b.StreamBeginCapture(0), gpu.ErrInvalidHandle)
	_, err = h.b.StreamEndCapture(0)
	h.wantErr("StreamEndCapture(0)", err, gpu.ErrInvalidHandle)
	_, err = h.b.StreamIsCapturing(0)
	h.wantErr("StreamIsCapturing(0)", err, gpu.ErrInvalidHandle)
}

// testCaptureSyncInvalidates synchronizes a capturing stream: as on CUDA the
// call fails with ErrCaptureInvalidated and breaks the capture, EndCapture
// reports ErrCaptureInvalidated and makes no graph, and the stream works
// afterwards.
func testCaptureSyncInvalidates(h *h) {
	const n = 256
	p := h.alloc(0, 4*n)
	h.setF32(p, 0, n)
	s := h.stream(0)
	fill := h.fillParams(0, p, 5, n)
	before, _ := h.counters()
	h.ok("StreamBeginCapture", h.b.StreamBeginCapture(s))
	h.launch(fill, s)
	h.wantErr("StreamSynchronize while capturing", h.b.StreamSynchronize(s), gpu.ErrCaptureInvalidated)
	g, err := h.b.StreamEndCapture(s)
	if h.wantErr("StreamEndCapture of an invalidated capture", err, gpu.ErrCaptureInvalidated) && g != 0 {
		h.Errorf("StreamEndCapture of an invalidated capture returned graph %#x", uint64(g))
	}
	if err == nil {
		h.trackGraph(g)
	}
	h.capturing(s, false)
	h.wantCounters("after an invalidated capture", before, nil)
	h.wantAllF32("memory after an invalidated capture", h.downloadF32(p, n), 0)
	h.launch(fill, s)
	h.sync(s)
	h.wantAllF32("the stream after an invalidated capture", h.downloadF32(p, n), 5)
}

// testCaptureForkJoin captures work forked to a second stream through an
// event and joined back: the graph has two branches between a common start
// and end, and the second stream is not capturing after the join.
func testCaptureForkJoin(h *h) {
	const n = 700
	b := h.bufsF32(0, 3, n)
	A, B, C := b[0], b[1], b[2]
	s1, s2 := h.stream(0), h.stream(0)
	fork, join := h.event(0, gpu.EventDisableTiming), h.event(0, gpu.EventDisableTiming)
	g := h.capture(s1, func() {
		h.ok("MemsetAsync", h.b.MemsetAsync(f32Memset(A, 2, n), s1))
		h.ok("EventRecord(fork)", h.b.EventRecord(fork, s1))
		h.ok("StreamWaitEvent(s2, fork)", h.b.StreamWaitEvent(s2, fork))
		h.capturing(s2, true)
		h.launch(h.axpbParams(0, B, A, 3, 0, n), s2) // B = 6 on the forked branch
		h.launch(h.axpbParams(0, C, A, 1, 1, n), s1) // C = 3 on the origin branch
		h.ok("EventRecord(join)", h.b.EventRecord(join, s2))
		h.ok("StreamWaitEvent(s1, join)", h.b.StreamWaitEvent(s1, join))
		h.ok("MemcpyDtoDAsync", h.b.MemcpyDtoDAsync(A, B, 4*n, s1)) // after both: A = 6
	})
	h.capturing(s2, false)
	byType := h.nodesByType(g)
	M, Cp := h.one(byType, gpu.NodeMemset), h.one(byType, gpu.NodeMemcpy)
	if len(byType[gpu.NodeKernel]) != 2 {
		h.Fatalf("fork/join capture has %d kernel nodes, want 2", len(byType[gpu.NodeKernel]))
	}
	K1, K2 := byType[gpu.NodeKernel][0], byType[gpu.NodeKernel][1]
	h.wantDeps(K1, M)
	h.wantDeps(K2, M)
	h.wantDeps(Cp, K1, K2)
	x := h.instantiate(g)
	h.setAll(b, 0, n)
	h.launchGraph(x, s1)
	h.wantAllF32("forked branch", h.downloadF32(B, n), 6)
	h.wantAllF32("origin branch", h.downloadF32(C, n), 3)
	h.wantAllF32("joined copy", h.downloadF32(A, n), 6)
}
