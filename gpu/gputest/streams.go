package gputest

import (
	"fmt"

	"github.com/stablegraph/stablegraph/gpu"
)

var streamsTests = []test{
	{name: "CreateFlagsPriority", run: testStreamCreate},
	{name: "QueryBusyIdle", run: testStreamQuery},
	{name: "WaitEvent", run: testStreamWaitEvent},
	{name: "WaitEventCrossDevice", run: testStreamWaitEventCrossDevice},
	{name: "Destroy", run: testStreamDestroy},
	{name: "DestroyBusy", run: testStreamDestroyBusy},
}

func testStreamCreate(h *h) {
	least, greatest, err := h.b.StreamPriorityRange(0)
	h.ok("StreamPriorityRange", err)
	h.Logf("priority range: least %d, greatest %d", least, greatest)
	if greatest > least {
		h.Errorf("StreamPriorityRange: greatest %d > least %d (lower numbers are higher priority)", greatest, least)
	}
	before, _ := h.counters()
	var made []gpu.Stream
	for _, flags := range []gpu.StreamFlags{gpu.StreamDefault, gpu.StreamNonBlocking} {
		// Out-of-range priorities are clamped, not refused.
		for _, prio := range []int{least, greatest, (least + greatest) / 2, least + 1000, greatest - 1000} {
			s, err := h.b.StreamCreate(0, flags, prio)
			h.ok(fmt.Sprintf("StreamCreate(flags %d, priority %d)", flags, prio), err)
			h.track(streamKey(s), s, func() error { return h.b.StreamDestroy(s) })
			if s == 0 {
				h.Fatalf("StreamCreate returned the zero handle")
			}
			idle, err := h.b.StreamQuery(s)
			if err != nil || !idle {
				h.Errorf("StreamQuery of a new stream = %v, %v; want idle", idle, err)
			}
			made = append(made, s)
		}
	}
	h.wantCounters("after creating streams", before, func(c *gpu.HandleCounts) { c.Streams += len(made) })
	seen := map[gpu.Stream]bool{}
	for _, s := range made {
		if seen[s] {
			h.Errorf("StreamCreate returned handle %#x twice", uint64(s))
		}
		seen[s] = true
	}
	// Work on streams of each flavour runs.
	p := h.alloc(0, 4*1000)
	for i, s := range made {
		h.launch(h.fillParams(0, p, float32(i), 1000), s)
		h.sync(s)
		h.wantAllF32(fmt.Sprintf("fill on stream %d", i), h.downloadF32(p, 1000), float32(i))
	}
	for _, s := range made {
		h.release(streamKey(s))
	}
	h.wantCounters("after destroying streams", before, func(c *gpu.HandleCounts) { c.Allocations++; c.Modules++ })
}

func testStreamQuery(h *h) {
	s := h.stream(0)
	idle, err := h.b.StreamQuery(s)
	if err != nil || !idle {
		h.Errorf("StreamQuery of a new stream = %v, %v; want idle", idle, err)
	}
	if !h.busy(0, s) {
		h.Errorf("StreamQuery never reported a stream busy right after enqueueing work on it")
	}
	h.sync(s)
	idle, err = h.b.StreamQuery(s)
	if err != nil || !idle {
		h.Errorf("StreamQuery after StreamSynchronize = %v, %v; want idle", idle, err)
	}
	h.sync(s) // synchronizing an idle stream is fine
}

func testStreamWaitEvent(h *h) {
	const n = 4096
	s1, s2 := h.stream(0), h.stream(0)
	e := h.event(0, gpu.EventDisableTiming)
	buf, out := h.alloc(0, 4*n), h.alloc(0, 4*n)
	h.setF32(buf, 0, n)
	h.setF32(out, 0, n)

	// Waiting on an event never recorded is a no-op (CUDA).
	h.ok("StreamWaitEvent(never recorded)", h.b.StreamWaitEvent(s2, e))
	h.sync(s2)

	h.busy(0, s1)
	h.launch(h.fillParams(0, buf, 5, n), s1)
	h.ok("EventRecord", h.b.EventRecord(e, s1))
	h.ok("StreamWaitEvent", h.b.StreamWaitEvent(s2, e))
	h.ok("MemcpyDtoDAsync", h.b.MemcpyDtoDAsync(out, buf, 4*n, s2))
	e2 := h.event(0, gpu.EventDisableTiming)
	h.ok("EventRecord", h.b.EventRecord(e2, s2))
	h.ok("EventSynchronize", h.b.EventSynchronize(e2))
	done, err := h.b.EventQuery(e)
	if err != nil || !done {
		h.Errorf("work after StreamWaitEvent(e) completed before e: EventQuery(e) = %v, %v", done, err)
	}
	h.sync(s2)
	h.wantAllF32("copy ordered after the waited-for fill", h.downloadF32(out, n), 5)
	h.sync(s1)
}

func testStreamWaitEventCrossDevice(h *h) {
	h.needDevices(2)
	s0, s1 := h.stream(0), h.stream(1)
	e0 := h.event(0, gpu.EventDisableTiming)
	e1 := h.event(1, gpu.EventDisableTiming)
	h.busy(0, s0)
	h.ok("EventRecord", h.b.EventRecord(e0, s0))
	h.ok("StreamWaitEvent(stream on device 1, event on device 0)", h.b.StreamWaitEvent(s1, e0))
	h.ok("EventRecord", h.b.EventRecord(e1, s1))
	h.ok("EventSynchronize", h.b.EventSynchronize(e1))
	if done, err := h.b.EventQuery(e0); err != nil || !done {
		h.Errorf("device 1 passed a wait on a device 0 event before it completed: EventQuery = %v, %v", done, err)
	}
	h.sync(s0)
}

func testStreamDestroy(h *h) {
	before, _ := h.counters()
	s, err := h.b.StreamCreate(0, gpu.StreamDefault, 0)
	h.ok("StreamCreate", err)
	h.wantCounters("after StreamCreate", before, func(c *gpu.HandleCounts) { c.Streams++ })
	h.ok("StreamDestroy", h.b.StreamDestroy(s))
	h.wantCounters("after StreamDestroy", before, nil)
	h.wantErr("second StreamDestroy", h.b.StreamDestroy(s), gpu.ErrInvalidHandle)
	_, err = h.b.StreamQuery(s)
	h.wantErr("StreamQuery of a destroyed stream", err, gpu.ErrInvalidHandle)
	h.wantErr("StreamSynchronize of a destroyed stream", h.b.StreamSynchronize(s), gpu.ErrInvalidHandle)
	p := h.alloc(0, 64)
	h.wantErr("MemsetAsync on a destroyed stream", h.b.MemsetAsync(gpu.Memset{Dst: p, ElemSize: 1, Count: 64}, s), gpu.ErrInvalidHandle)
	for _, bad := range []gpu.Stream{0, 0xdead0000beef} {
		what := fmt.Sprintf("stream %#x", uint64(bad))
		h.wantErr("StreamDestroy("+what+")", h.b.StreamDestroy(bad), gpu.ErrInvalidHandle)
		_, err := h.b.StreamQuery(bad)
		h.wantErr("StreamQuery("+what+")", err, gpu.ErrInvalidHandle)
		h.wantErr("StreamSynchronize("+what+")", h.b.StreamSynchronize(bad), gpu.ErrInvalidHandle)
		e := h.event(0, gpu.EventDefault)
		h.wantErr("StreamWaitEvent("+what+")", h.b.StreamWaitEvent(bad, e), gpu.ErrInvalidHandle)
		_, err = h.b.StreamIsCapturing(bad)
		h.wantErr("StreamIsCapturing("+what+")", err, gpu.ErrInvalidHandle)
	}
	h.wantCounters("after the failed calls", before, func(c *gpu.HandleCounts) { c.Allocations++; c.Events += 2 })
}

// testStreamDestroyBusy destroys a stream with work pending: the call
// returns at once and the work still completes.
func testStreamDestroyBusy(h *h) {
	const n = 1000
	before, _ := h.counters()
	s, err := h.b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	h.ok("StreamCreate", err)
	h.track(streamKey(s), s, func() error { return h.b.StreamDestroy(s) })
	out := h.alloc(0, 4*n)
	h.setF32(out, 0, n)
	e := h.event(0, gpu.EventDisableTiming)
	h.busy(0, s)
	h.launch(h.fillParams(0, out, 3, n), s)
	h.ok("EventRecord", h.b.EventRecord(e, s))
	h.ok("StreamDestroy with pending work", h.b.StreamDestroy(s))
	h.forget(streamKey(s))
	h.ok("EventSynchronize after the stream was destroyed", h.b.EventSynchronize(e))
	h.wantAllF32("work pending at StreamDestroy", h.downloadF32(out, n), 3)
	h.wantCounters("after StreamDestroy", before, func(c *gpu.HandleCounts) {
		c.Allocations += 2 // out and the busy buffer
		c.Events++
		c.Modules++
	})
}
