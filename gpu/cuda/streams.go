package cuda

import (
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

// stream returns a live stream's device and driver handle.
func (b *Backend) stream(op string, s gpu.Stream) (int, cu.Stream, error) {
	b.mu.Lock()
	si, ok := b.mu.streams[s]
	b.mu.Unlock()
	if !ok {
		return 0, 0, errNoStream(op, s)
	}
	return si.dev, si.s, nil
}

func errNoStream(op string, s gpu.Stream) error {
	return errf(op, gpu.ErrInvalidHandle, "stream %#x is not live", uint64(s))
}

func errNoEvent(op string, e gpu.Event) error {
	return errf(op, gpu.ErrInvalidHandle, "event %#x is not live", uint64(e))
}

// event returns a live event's device and driver handle.
func (b *Backend) event(op string, e gpu.Event) (int, cu.Event, error) {
	b.mu.Lock()
	ei, ok := b.mu.events[e]
	b.mu.Unlock()
	if !ok {
		return 0, 0, errNoEvent(op, e)
	}
	return ei.dev, ei.e, nil
}

// StreamPriorityRange implements gpu.Streams.
func (b *Backend) StreamPriorityRange(dev int) (least, greatest int, err error) {
	if _, err := b.device("StreamPriorityRange", dev); err != nil {
		return 0, 0, err
	}
	var l, g int32
	err = b.call(dev, "cuCtxGetStreamPriorityRange", func() cu.Result { return b.d.CtxGetStreamPriorityRange(&l, &g) })
	return int(l), int(g), err
}

// StreamCreate implements gpu.Streams. Priorities outside the device's
// range are clamped, as CUDA does.
func (b *Backend) StreamCreate(dev int, flags gpu.StreamFlags, priority int) (gpu.Stream, error) {
	if _, err := b.device("StreamCreate", dev); err != nil {
		return 0, err
	}
	if flags&^gpu.StreamNonBlocking != 0 {
		return 0, errf("StreamCreate", gpu.ErrInvalidValue, "unknown stream flags %#x", uint32(flags))
	}
	var s cu.Stream
	err := b.onDevice(dev, func() error {
		var least, greatest int32
		if r := b.d.CtxGetStreamPriorityRange(&least, &greatest); r == cu.Success {
			priority = min(max(priority, int(greatest)), int(least))
		} else {
			priority = 0
		}
		return b.check("cuStreamCreateWithPriority", b.d.StreamCreateWithPriority(&s, uint32(flags), int32(priority)))
	})
	if err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	h := gpu.Stream(b.newIDLocked())
	b.mu.streams[h] = streamInfo{dev: dev, s: s}
	return h, nil
}

// capturing reports whether s (on dev) is in a stream capture (active or
// invalidated but not yet ended).
func (b *Backend) capturing(dev int, s cu.Stream) (bool, error) {
	var st cu.StreamCaptureStatus
	err := b.call(dev, "cuStreamIsCapturing", func() cu.Result { return b.d.StreamIsCapturing(s, &st) })
	return st != cu.StreamCaptureStatusNone, err
}

// StreamQuery implements gpu.Streams. CUDA_ERROR_NOT_READY is (false, nil).
// Querying a capturing stream invalidates its capture (CUDA's rule) and is
// ErrCaptureInvalidated.
func (b *Backend) StreamQuery(s gpu.Stream) (bool, error) {
	dev, cs, err := b.stream("StreamQuery", s)
	if err != nil {
		return false, err
	}
	return b.query(dev, "cuStreamQuery", func() cu.Result { return b.d.StreamQuery(cs) })
}

// query runs a driver query on dev: CUDA_SUCCESS is (true, nil),
// CUDA_ERROR_NOT_READY is (false, nil), anything else an error naming op.
func (b *Backend) query(dev int, op string, f func() cu.Result) (bool, error) {
	var r cu.Result
	if err := b.onDevice(dev, func() error { r = f(); return nil }); err != nil {
		return false, err
	}
	switch r {
	case cu.Success:
		return true, nil
	case cu.ErrorNotReady:
		return false, nil
	}
	return false, b.check(op, r)
}

// StreamSynchronize implements gpu.Streams. Synchronizing a capturing
// stream fails and invalidates the capture, as CUDA does: the error wraps
// ErrCaptureInvalidated (the capture must be ended and discarded).
func (b *Backend) StreamSynchronize(s gpu.Stream) error {
	dev, cs, err := b.stream("StreamSynchronize", s)
	if err != nil {
		return err
	}
	return b.call(dev, "cuStreamSynchronize", func() cu.Result { return b.d.StreamSynchronize(cs) })
}

// StreamWaitEvent implements gpu.Streams. The event may belong to another
// device.
func (b *Backend) StreamWaitEvent(s gpu.Stream, e gpu.Event) error {
	dev, cs, err := b.stream("StreamWaitEvent", s)
	if err != nil {
		return err
	}
	_, ce, err := b.event("StreamWaitEvent", e)
	if err != nil {
		return err
	}
	return b.call(dev, "cuStreamWaitEvent", func() cu.Result { return b.d.StreamWaitEvent(cs, ce, 0) })
}

// StreamDestroy implements gpu.Streams. Pending work still completes.
func (b *Backend) StreamDestroy(s gpu.Stream) error {
	b.mu.Lock()
	si, ok := b.mu.streams[s]
	delete(b.mu.streams, s) // claimed: a concurrent second destroy fails here
	b.mu.Unlock()
	if !ok {
		return errf("StreamDestroy", gpu.ErrInvalidHandle, "stream %#x is not live", uint64(s))
	}
	err := b.call(si.dev, "cuStreamDestroy_v2", func() cu.Result { return b.d.StreamDestroy(si.s) })
	if err != nil {
		b.mu.Lock()
		b.mu.streams[s] = si
		b.mu.Unlock()
	}
	return err
}

// EventCreate implements gpu.Events.
func (b *Backend) EventCreate(dev int, flags gpu.EventFlags) (gpu.Event, error) {
	if _, err := b.device("EventCreate", dev); err != nil {
		return 0, err
	}
	if flags&^(gpu.EventBlockingSync|gpu.EventDisableTiming) != 0 {
		return 0, errf("EventCreate", gpu.ErrInvalidValue, "unknown event flags %#x", uint32(flags))
	}
	fr := getFrame()
	defer fr.release()
	if err := b.callFrame(fr, dev, "cuEventCreate", func() cu.Result { return b.d.EventCreate(&fr.event, uint32(flags)) }); err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	h := gpu.Event(b.newIDLocked())
	b.mu.events[h] = eventInfo{dev: dev, e: fr.event}
	return h, nil
}

// EventRecord implements gpu.Events.
func (b *Backend) EventRecord(e gpu.Event, s gpu.Stream) error {
	const op = "EventRecord"
	b.mu.Lock()
	ei, eok := b.mu.events[e]
	si, sok := b.mu.streams[s]
	b.mu.Unlock()
	switch {
	case !eok:
		return errNoEvent(op, e)
	case !sok:
		return errNoStream(op, s)
	}
	return b.call(si.dev, "cuEventRecord", func() cu.Result { return b.d.EventRecord(ei.e, si.s) })
}

// EventQuery implements gpu.Events; CUDA_ERROR_NOT_READY is (false, nil).
func (b *Backend) EventQuery(e gpu.Event) (bool, error) {
	dev, ce, err := b.event("EventQuery", e)
	if err != nil {
		return false, err
	}
	return b.query(dev, "cuEventQuery", func() cu.Result { return b.d.EventQuery(ce) })
}

// EventSynchronize implements gpu.Events.
func (b *Backend) EventSynchronize(e gpu.Event) error {
	dev, ce, err := b.event("EventSynchronize", e)
	if err != nil {
		return err
	}
	return b.call(dev, "cuEventSynchronize", func() cu.Result { return b.d.EventSynchronize(ce) })
}

// EventElapsed implements gpu.Events. Not-yet-complete records are
// ErrNotReady; events never recorded or created with EventDisableTiming are
// ErrInvalidHandle (CUDA's answer), never ErrNotReady.
func (b *Backend) EventElapsed(start, end gpu.Event) (time.Duration, error) {
	dev, cstart, err := b.event("EventElapsed", start)
	if err != nil {
		return 0, err
	}
	_, cend, err := b.event("EventElapsed", end)
	if err != nil {
		return 0, err
	}
	var ms float32
	err = b.call(dev, "cuEventElapsedTime_v2", func() cu.Result { return b.d.EventElapsedTime(&ms, cstart, cend) })
	if err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// EventDestroy implements gpu.Events. A pending record still completes.
func (b *Backend) EventDestroy(e gpu.Event) error {
	b.mu.Lock()
	ei, ok := b.mu.events[e]
	delete(b.mu.events, e)
	b.mu.Unlock()
	if !ok {
		return errf("EventDestroy", gpu.ErrInvalidHandle, "event %#x is not live", uint64(e))
	}
	err := b.call(ei.dev, "cuEventDestroy_v2", func() cu.Result { return b.d.EventDestroy(ei.e) })
	if err != nil {
		b.mu.Lock()
		b.mu.events[e] = ei
		b.mu.Unlock()
	}
	return err
}
