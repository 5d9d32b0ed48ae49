package gputest

import (
	"errors"
	"fmt"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
)

// The StreamWaits group tests the optional gpu.StreamWaits capability: a
// stream held behind a word of memory until the host or another stream
// writes a value at or past the one waited for (CUDA's cyclic
// greater-or-equal), events behind the wait timing only the work after it,
// and the refusals. The group skips when gpu.StreamWaitsOf reports
// ErrNotSupported. Its coverage table is coverage_streamwait.go.
var streamWaitTests = []test{
	{name: "GateHoldsStream", run: testWaitGate},
	{name: "Cyclic", run: testWaitCyclic},
	{name: "OpenedByStream", run: testWaitOpenedByStream},
	{name: "Errors", run: testWaitErrors},
}

// gateHold is how long a test keeps a gate closed before checking that the
// work behind it has not run.
const gateHold = 50 * time.Millisecond

// gateFailSafe is when a test's gate opens by itself (see gate).
const gateFailSafe = 20 * time.Second

// streamWaits returns the backend's stream waits for dev (behind a recorder
// for the coverage check), skipping the test without them.
func (h *h) streamWaits(dev int) gpu.StreamWaits {
	h.Helper()
	sw, err := gpu.StreamWaitsOf(h.raw, dev)
	if errors.Is(err, gpu.ErrNotSupported) {
		h.Skipf("stream waits: %v", err)
	}
	h.ok("StreamWaitsOf", err)
	if h.note == nil {
		return sw
	}
	h.note("StreamWaitsSupported")
	return streamWaitsRecorder{sw, h.note}
}

// streamWaitsRecorder notes the gpu.StreamWaits calls of a subtest.
type streamWaitsRecorder struct {
	w    gpu.StreamWaits
	note func(string)
}

func (r streamWaitsRecorder) StreamWaitsSupported(dev int) error {
	r.note("StreamWaitsSupported")
	return r.w.StreamWaitsSupported(dev)
}

func (r streamWaitsRecorder) StreamWaitValue64(s gpu.Stream, p gpu.DevicePtr, v uint64) error {
	r.note("StreamWaitValue64")
	return r.w.StreamWaitValue64(s, p, v)
}

// gate returns a word of mapped host memory holding v, which the test's
// cleanup sets to open before the harness synchronizes the streams (a
// failing test must not leave a stream waiting for ever).
func (h *h) gate(v, open uint64) gpu.HostMem {
	h.Helper()
	m := h.hostAlloc(64)
	m.Store64(0, v)
	// A backend that blocks behind the wait (in a call the test makes
	// while the gate is closed) must fail the test, not hang it: the gate
	// opens by itself after gateFailSafe, and the checks that the stream
	// is held then fail.
	t := time.AfterFunc(gateFailSafe, func() { m.Store64(0, open) })
	h.Cleanup(func() { t.Stop(); m.Store64(0, open) }) // runs before releaseAll
	return m
}

// recorded records a new timing event on s.
func (h *h) recorded(s gpu.Stream) gpu.Event {
	h.Helper()
	e := h.event(0, gpu.EventDefault)
	h.ok("EventRecord", h.b.EventRecord(e, s))
	return e
}

// wantHeld checks that e has not completed: the stream is still held.
func (h *h) wantHeld(what string, e gpu.Event) {
	h.Helper()
	if done, err := h.b.EventQuery(e); err != nil || done {
		h.Fatalf("%s: the event behind the wait completed (%v, %v): the stream did not wait", what, done, err)
	}
}

// wantReleased waits for e to complete.
func (h *h) wantReleased(what string, e gpu.Event) {
	h.Helper()
	if !eventually(timelineWait, func() bool { done, err := h.b.EventQuery(e); return err == nil && done }) {
		h.Fatalf("%s: the event behind the wait did not complete within %v", what, timelineWait)
	}
}

// testWaitGate: work behind a wait does not run until the host stores the
// value; an event recorded right after the wait completes when the gate
// opens, so the time from it to the end of the work is the work's alone; a
// wait for a value already reached does not hold the stream.
func testWaitGate(h *h) {
	sw := h.streamWaits(0)
	gate := h.gate(0, 1)
	s := h.stream(0)
	const n = 1 << 12
	out := h.alloc(0, 4*n)
	h.setF32(out, 0, n)
	// Loaded before the wait: CUDA may synchronize the context to load a
	// module, which would then wait for the gate.
	fill := h.fillParams(0, out, 3, n)
	h.ok("StreamWaitValue64", sw.StreamWaitValue64(s, gate.Ptr, 1))
	start := h.recorded(s)
	h.launch(fill, s)
	end := h.recorded(s)
	time.Sleep(gateHold)
	h.wantHeld("gate closed", end)
	if idle, err := h.b.StreamQuery(s); err != nil || idle {
		h.Errorf("StreamQuery of a stream held by a wait = %v, %v; want busy", idle, err)
	}
	h.wantAllF32("kernel behind a closed gate", h.downloadF32(out, n), 0)
	opened := time.Now()
	gate.Store64(0, 1)
	h.wantReleased("gate opened", end)
	h.sync(s)
	h.wantAllF32("kernel behind an opened gate", h.downloadF32(out, n), 3)
	el, err := h.b.EventElapsed(start, end)
	h.ok("EventElapsed", err)
	if el < 0 || el > time.Since(opened) {
		h.Errorf("from the event after the wait to the end of the kernel: %v; want the kernel's time alone (at most the %v since the gate opened)", el, time.Since(opened))
	}
	// Reached already (equal, then below): no hold.
	for _, v := range []uint64{1, 0} {
		h.ok("StreamWaitValue64", sw.StreamWaitValue64(s, gate.Ptr, v))
		h.wantReleased("a wait for a value already reached", h.recorded(s))
	}
}

// testWaitCyclic: the condition is CUDA's cyclic greater-or-equal,
// int64(*p - v) >= 0: a value past the one waited for opens the gate, and a
// value more than 2^63 ahead of the word counts as behind it.
func testWaitCyclic(h *h) {
	sw := h.streamWaits(0)
	s := h.stream(0)
	// One word per check, each opened at cleanup by the value waited for,
	// so that a backend comparing otherwise fails the check, not hangs.
	for _, v := range []uint64{^uint64(0), 5 + 1<<63 + 1} { // -1; more than 2^63 ahead
		behind := h.gate(5, v)
		h.ok("StreamWaitValue64", sw.StreamWaitValue64(s, behind.Ptr, v))
		h.wantReleased(fmt.Sprintf("wait for %#x with the word at 5", v), h.recorded(s))
	}
	gate := h.gate(5, 6)
	h.ok("StreamWaitValue64", sw.StreamWaitValue64(s, gate.Ptr, 6))
	e := h.recorded(s)
	time.Sleep(gateHold)
	h.wantHeld("wait for 6 with the word at 5", e)
	gate.Store64(0, 7) // past 6: greater-or-equal, not equal
	h.wantReleased("wait for 6 with the word at 7", e)
	h.sync(s)
}

// testWaitOpenedByStream: a word in device memory written by another
// stream (StreamWriteValue64, ordered after a kernel there) opens the wait.
func testWaitOpenedByStream(h *h) {
	sw := h.streamWaits(0)
	h.streamMemOps(0)
	word := h.alloc(0, 8)
	h.ok("Memset", h.b.Memset(gpu.Memset{Dst: word, ElemSize: 4, Count: 2}))
	waiter, writer := h.stream(0), h.stream(0)
	h.Cleanup(func() { _ = h.mo.StreamWriteValue64(writer, word, 1<<62) }) // never left waiting
	const n = 1 << 12
	out := h.alloc(0, 4*n)
	h.setF32(out, 0, n)
	fill := h.fillParams(0, out, 5, n) // the module loaded before the wait
	h.ok("StreamWaitValue64", sw.StreamWaitValue64(waiter, word, 2))
	h.launch(fill, waiter)
	e := h.recorded(waiter)
	time.Sleep(gateHold)
	h.wantHeld("device word at 0", e)
	h.launch(h.fillParams(0, out, 4, n), writer) // runs first: the waiter's fill overwrites it
	h.ok("StreamWriteValue64", h.mo.StreamWriteValue64(writer, word, 2))
	h.wantReleased("device word written by another stream", e)
	h.sync(waiter)
	h.sync(writer)
	h.wantAllF32("the waiter's kernel after the writer's", h.downloadF32(out, n), 5)
}

// testWaitErrors: bad arguments are refused; a wait on a capturing stream
// is refused with ErrNotSupported and the capture goes on.
func testWaitErrors(h *h) {
	sw := h.streamWaits(0)
	gate := h.gate(0, 1)
	s := h.stream(0)
	h.wantErr("StreamWaitsSupported(-1)", sw.StreamWaitsSupported(-1), gpu.ErrInvalidValue)
	h.wantErr("StreamWaitsSupported(DeviceCount)", sw.StreamWaitsSupported(h.b.DeviceCount()), gpu.ErrInvalidValue)
	h.wantErr("StreamWaitValue64 at a misaligned address", sw.StreamWaitValue64(s, gate.Ptr.Add(4), 1), gpu.ErrInvalidValue)
	h.wantErr("StreamWaitValue64 at address 0", sw.StreamWaitValue64(s, 0, 1), gpu.ErrInvalidValue)
	h.wantErr("StreamWaitValue64 on stream 0", sw.StreamWaitValue64(0, gate.Ptr, 1), gpu.ErrInvalidHandle)
	dead, err := h.b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	h.ok("StreamCreate", err)
	h.ok("StreamDestroy", h.b.StreamDestroy(dead))
	h.wantErr("StreamWaitValue64 on a destroyed stream", sw.StreamWaitValue64(dead, gate.Ptr, 1), gpu.ErrInvalidHandle)

	const n = 256
	out := h.alloc(0, 4*n)
	h.ok("StreamBeginCapture", h.b.StreamBeginCapture(s))
	h.launch(h.fillParams(0, out, 1, n), s)
	h.wantErr("StreamWaitValue64 while capturing", sw.StreamWaitValue64(s, gate.Ptr, 1), gpu.ErrNotSupported)
	h.launch(h.fillParams(0, out, 2, n), s)
	g, err := h.b.StreamEndCapture(s)
	h.ok("StreamEndCapture after a refused wait", err)
	h.trackGraph(g)
	nodes, err := h.b.GraphNodes(g)
	h.ok("GraphNodes", err)
	if len(nodes) != 2 {
		h.Errorf("the capture around a refused wait has %d nodes, want the 2 kernels", len(nodes))
	}
	h.launchGraph(h.instantiate(g), s)
	h.wantAllF32("the captured kernels", h.downloadF32(out, n), 2)
}
