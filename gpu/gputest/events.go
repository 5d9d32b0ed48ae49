package gputest

import (
	"errors"
	"fmt"

	"github.com/stablegraph/stablegraph/gpu"
)

var eventsTests = []test{
	{name: "RecordQuerySynchronize", run: testEventRecord},
	{name: "Elapsed", run: testEventElapsed},
	{name: "ElapsedErrors", run: testEventElapsedErrors},
	{name: "Destroy", run: testEventDestroy},
}

func testEventRecord(h *h) {
	s := h.stream(0)
	for _, flags := range []gpu.EventFlags{gpu.EventDefault, gpu.EventBlockingSync, gpu.EventDisableTiming,
		gpu.EventBlockingSync | gpu.EventDisableTiming} {
		e := h.event(0, flags)
		// An event never recorded counts as complete (CUDA).
		done, err := h.b.EventQuery(e)
		if err != nil || !done {
			h.Errorf("EventQuery of an event never recorded (flags %d) = %v, %v; want done", flags, done, err)
		}
		h.ok("EventSynchronize of an event never recorded", h.b.EventSynchronize(e))

		h.busy(0, s)
		h.ok("EventRecord", h.b.EventRecord(e, s))
		if _, err := h.b.EventQuery(e); err != nil {
			h.Errorf("EventQuery of a pending event: %v (want done=false, nil)", err)
		}
		h.ok("EventSynchronize", h.b.EventSynchronize(e))
		done, err = h.b.EventQuery(e)
		if err != nil || !done {
			h.Errorf("EventQuery after EventSynchronize = %v, %v; want done", done, err)
		}
		if idle, err := h.b.StreamQuery(s); err != nil || !idle {
			h.Errorf("StreamQuery after synchronizing the stream's last event = %v, %v; want idle", idle, err)
		}
	}
	// Re-recording moves the event to the new point: wait for the second.
	e := h.event(0, gpu.EventDefault)
	s2 := h.stream(0)
	h.ok("EventRecord", h.b.EventRecord(e, s))
	h.sync(s)
	const n = 1000
	out := h.alloc(0, 4*n)
	h.setF32(out, 0, n)
	h.busy(0, s2)
	h.launch(h.fillParams(0, out, 8, n), s2)
	h.ok("EventRecord again, on another stream", h.b.EventRecord(e, s2))
	h.ok("EventSynchronize", h.b.EventSynchronize(e))
	h.wantAllF32("work before the event's last record", h.downloadF32(out, n), 8)
}

func testEventElapsed(h *h) {
	s := h.stream(0)
	start, end := h.event(0, gpu.EventDefault), h.event(0, gpu.EventDefault)
	h.ok("EventRecord(start)", h.b.EventRecord(start, s))
	h.busy(0, s)
	h.ok("EventRecord(end)", h.b.EventRecord(end, s))
	// Asked too early, it is ErrNotReady; once done, a duration.
	if d, err := h.b.EventElapsed(start, end); err != nil {
		h.wantErr("EventElapsed before end completed", err, gpu.ErrNotReady)
	} else if d <= 0 {
		h.Errorf("EventElapsed = %v, want > 0", d)
	}
	h.ok("EventSynchronize(end)", h.b.EventSynchronize(end))
	d, err := h.b.EventElapsed(start, end)
	h.ok("EventElapsed", err)
	if d <= 0 {
		h.Errorf("EventElapsed over real work = %v, want > 0", d)
	}
	h.Logf("elapsed: %v", d)
	same, err := h.b.EventElapsed(start, start)
	if err != nil || same != 0 {
		h.Errorf("EventElapsed(start, start) = %v, %v; want 0", same, err)
	}
}

func testEventElapsedErrors(h *h) {
	s := h.stream(0)
	start, end := h.event(0, gpu.EventDefault), h.event(0, gpu.EventDefault)
	h.ok("EventRecord", h.b.EventRecord(start, s))
	h.sync(s)
	_, err := h.b.EventElapsed(start, end)
	h.wantErr("EventElapsed with end never recorded", err)
	_, err = h.b.EventElapsed(end, start)
	h.wantErr("EventElapsed with start never recorded", err)

	a, b := h.event(0, gpu.EventDisableTiming), h.event(0, gpu.EventDisableTiming)
	h.ok("EventRecord", h.b.EventRecord(a, s))
	h.ok("EventRecord", h.b.EventRecord(b, s))
	h.sync(s)
	_, err = h.b.EventElapsed(a, b)
	if h.wantErr("EventElapsed of DisableTiming events", err) && errors.Is(err, gpu.ErrNotReady) {
		h.Errorf("EventElapsed of completed DisableTiming events is ErrNotReady, which invites a retry that never succeeds: %v", err)
	}
	_, err = h.b.EventElapsed(start, b)
	h.wantErr("EventElapsed with a DisableTiming end", err)
}

func testEventDestroy(h *h) {
	before, _ := h.counters()
	e, err := h.b.EventCreate(0, gpu.EventDefault)
	h.ok("EventCreate", err)
	h.wantCounters("after EventCreate", before, func(c *gpu.HandleCounts) { c.Events++ })
	s := h.stream(0)
	h.busy(0, s)
	h.ok("EventRecord", h.b.EventRecord(e, s))
	h.ok("EventDestroy of a pending event", h.b.EventDestroy(e))
	h.wantCounters("after EventDestroy", before, func(c *gpu.HandleCounts) { c.Streams++; c.Allocations++; c.Modules++ })
	h.wantErr("second EventDestroy", h.b.EventDestroy(e), gpu.ErrInvalidHandle)
	h.wantErr("EventRecord of a destroyed event", h.b.EventRecord(e, s), gpu.ErrInvalidHandle)
	h.sync(s)

	good := h.event(0, gpu.EventDefault)
	for _, bad := range []gpu.Event{0, e, 0xdead0000beef} {
		what := fmt.Sprintf("(event %#x)", uint64(bad))
		h.wantErr("EventDestroy"+what, h.b.EventDestroy(bad), gpu.ErrInvalidHandle)
		h.wantErr("EventRecord"+what, h.b.EventRecord(bad, s), gpu.ErrInvalidHandle)
		h.wantErr("EventSynchronize"+what, h.b.EventSynchronize(bad), gpu.ErrInvalidHandle)
		_, err := h.b.EventQuery(bad)
		h.wantErr("EventQuery"+what, err, gpu.ErrInvalidHandle)
		_, err = h.b.EventElapsed(bad, good)
		h.wantErr("EventElapsed"+what, err, gpu.ErrInvalidHandle)
		h.wantErr("StreamWaitEvent"+what, h.b.StreamWaitEvent(s, bad), gpu.ErrInvalidHandle)
	}
	h.wantErr("EventRecord on stream 0", h.b.EventRecord(good, 0), gpu.ErrInvalidHandle)
}
