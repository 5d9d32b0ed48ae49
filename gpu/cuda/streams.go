package cuda

import (
	"time"

	"stablegraph/gpu"
	"stablegraph/gpu/cuda/cu"
)

// streamDev returns the device of a live stream.
func (b *Backend) streamDev(op string, s gpu.Stream) (int, error) {
	b.mu.Lock()
	dev, ok := b.mu.streams[s]
	b.mu.Unlock()
	if !ok {
		return 0, errf(op, gpu.ErrInvalidHandle, "stream %#x is not live", uint64(s))
	}
	return dev, nil
}

// eventDev returns the device of a live event.
func (b *Backend) eventDev(op string, e gpu.Event) (int, error) {
	b.mu.Lock()
	dev, ok := b.mu.events[e]
	b.mu.Unlock()
	if !ok {
		return 0, errf(op, gpu.ErrInvalidHandle, "event %#x is not live", uint64(e))
	}
	return dev, nil
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
	b.mu.streams[gpu.Stream(s)] = dev
	b.mu.Unlock()
	return gpu.Stream(s), nil
}

// capturing reports whether s (on dev) is in a stream capture.
func (b *Backend) capturing(dev int, s gpu.Stream) (bool, error) {
	var st cu.StreamCaptureStatus
	err := b.call(dev, "cuStreamIsCapturing", func() cu.Result { return b.d.StreamIsCapturing(cu.Stream(s), &st) })
	return st != cu.StreamCaptureStatusNone, err
}

// StreamQuery implements gpu.Streams. CUDA_ERROR_NOT_READY is (false, nil).
// Querying a capturing stream invalidates its capture (CUDA's rule) and is
// ErrCaptureInvalidated.
func (b *Backend) StreamQuery(s gpu.Stream) (bool, error) {
	dev, err := b.streamDev("StreamQuery", s)
	if err != nil {
		return false, err
	}
	var r cu.Result
	err = b.onDevice(dev, func() error { r = b.d.StreamQuery(cu.Stream(s)); return nil })
	if err != nil {
		return false, err
	}
	switch r {
	case cu.Success:
		return true, nil
	case cu.ErrorNotReady:
		return false, nil
	}
	return false, b.check("cuStreamQuery", r)
}

// StreamSynchronize implements gpu.Streams. Synchronizing a capturing
// stream fails and invalidates the capture, as CUDA does: the error wraps
// ErrCaptureInvalidated (the capture must be ended and discarded).
func (b *Backend) StreamSynchronize(s gpu.Stream) error {
	dev, err := b.streamDev("StreamSynchronize", s)
	if err != nil {
		return err
	}
	return b.call(dev, "cuStreamSynchronize", func() cu.Result { return b.d.StreamSynchronize(cu.Stream(s)) })
}

// StreamWaitEvent implements gpu.Streams. The event may belong to another
// device.
func (b *Backend) StreamWaitEvent(s gpu.Stream, e gpu.Event) error {
	dev, err := b.streamDev("StreamWaitEvent", s)
	if err != nil {
		return err
	}
	if _, err := b.eventDev("StreamWaitEvent", e); err != nil {
		return err
	}
	return b.call(dev, "cuStreamWaitEvent", func() cu.Result { return b.d.StreamWaitEvent(cu.Stream(s), cu.Event(e), 0) })
}

// StreamDestroy implements gpu.Streams.
func (b *Backend) StreamDestroy(s gpu.Stream) error {
	b.mu.Lock()
	dev, ok := b.mu.streams[s]
	delete(b.mu.streams, s) // claimed: a concurrent second destroy fails here
	b.mu.Unlock()
	if !ok {
		return errf("StreamDestroy", gpu.ErrInvalidHandle, "stream %#x is not live", uint64(s))
	}
	err := b.call(dev, "cuStreamDestroy_v2", func() cu.Result { return b.d.StreamDestroy(cu.Stream(s)) })
	if err != nil {
		b.mu.Lock()
		b.mu.streams[s] = dev
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
	var e cu.Event
	if err := b.call(dev, "cuEventCreate", func() cu.Result { return b.d.EventCreate(&e, uint32(flags)) }); err != nil {
		return 0, err
	}
	b.mu.Lock()
	b.mu.events[gpu.Event(e)] = dev
	b.mu.Unlock()
	return gpu.Event(e), nil
}

// EventRecord implements gpu.Events.
func (b *Backend) EventRecord(e gpu.Event, s gpu.Stream) error {
	if _, err := b.eventDev("EventRecord", e); err != nil {
		return err
	}
	dev, err := b.streamDev("EventRecord", s)
	if err != nil {
		return err
	}
	return b.call(dev, "cuEventRecord", func() cu.Result { return b.d.EventRecord(cu.Event(e), cu.Stream(s)) })
}

// EventQuery implements gpu.Events; CUDA_ERROR_NOT_READY is (false, nil).
func (b *Backend) EventQuery(e gpu.Event) (bool, error) {
	dev, err := b.eventDev("EventQuery", e)
	if err != nil {
		return false, err
	}
	var r cu.Result
	if err := b.onDevice(dev, func() error { r = b.d.EventQuery(cu.Event(e)); return nil }); err != nil {
		return false, err
	}
	switch r {
	case cu.Success:
		return true, nil
	case cu.ErrorNotReady:
		return false, nil
	}
	return false, b.check("cuEventQuery", r)
}

// EventSynchronize implements gpu.Events.
func (b *Backend) EventSynchronize(e gpu.Event) error {
	dev, err := b.eventDev("EventSynchronize", e)
	if err != nil {
		return err
	}
	return b.call(dev, "cuEventSynchronize", func() cu.Result { return b.d.EventSynchronize(cu.Event(e)) })
}

// EventElapsed implements gpu.Events. Not-yet-complete records are
// ErrNotReady; events created with EventDisableTiming are ErrInvalidHandle
// (CUDA's answer), never ErrNotReady.
func (b *Backend) EventElapsed(start, end gpu.Event) (time.Duration, error) {
	dev, err := b.eventDev("EventElapsed", start)
	if err != nil {
		return 0, err
	}
	if _, err := b.eventDev("EventElapsed", end); err != nil {
		return 0, err
	}
	var ms float32
	err = b.call(dev, "cuEventElapsedTime_v2", func() cu.Result { return b.d.EventElapsedTime(&ms, cu.Event(start), cu.Event(end)) })
	if err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// EventDestroy implements gpu.Events.
func (b *Backend) EventDestroy(e gpu.Event) error {
	b.mu.Lock()
	dev, ok := b.mu.events[e]
	delete(b.mu.events, e)
	b.mu.Unlock()
	if !ok {
		return errf("EventDestroy", gpu.ErrInvalidHandle, "event %#x is not live", uint64(e))
	}
	err := b.call(dev, "cuEventDestroy_v2", func() cu.Result { return b.d.EventDestroy(cu.Event(e)) })
	if err != nil {
		b.mu.Lock()
		b.mu.events[e] = dev
		b.mu.Unlock()
	}
	return err
}
