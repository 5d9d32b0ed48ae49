package sim

import (
	"fmt"
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
)

// Stream capture, modelled on CUDA's capture sequences. A capture is begun
// on an origin stream. Each stream taking part has a dependency set
// (stream.capDeps): the nodes its next captured node will depend on; adding
// a node makes the set that node alone. EventRecord on a capturing stream
// does not queue anything: the event takes a copy of the stream's set.
// StreamWaitEvent on such an event makes the waiting stream join the
// capture with that set (fork), or adds the set to its own when it already
// takes part (join). StreamEndCapture on the origin ends the capture on
// every stream, and requires every forked stream to have been joined back:
// each one's set must lie in the origin's set or before it. Everything here
// is guarded by Backend.mu.

type capture struct {
	g       *graph
	origin  *stream
	streams []*stream // every stream taking part, origin first
	invalid string    // why the capture was invalidated, "" while valid
	ended   bool
}

// capRecord is an event record made on a capturing stream.
type capRecord struct {
	cap  *capture
	deps []*node
}

func (c *capture) invalidate(op, why string) error {
	if c.invalid == "" {
		c.invalid = why
	}
	return gpu.Errorf(op, gpu.ErrCaptureInvalidated, "%s; the capture is invalidated: end it on its origin stream and discard it", why)
}

func (c *capture) invalidErr(op string) error {
	return gpu.Errorf(op, gpu.ErrCaptureInvalidated, "the capture begun on stream %#x was invalidated earlier (%s)", uint64(c.origin.handle), c.invalid)
}

// endLocked takes every stream out of the capture.
func (c *capture) endLocked() {
	c.ended = true
	for _, st := range c.streams {
		st.cap, st.capDeps = nil, nil
	}
}

// unjoined returns a stream of c whose dependencies the origin has not
// joined, or nil.
func (c *capture) unjoined() *stream {
	seen := map[*node]bool{}
	var walk func(n *node)
	walk = func(n *node) {
		if seen[n] {
			return
		}
		seen[n] = true
		for _, d := range n.deps {
			walk(d)
		}
	}
	for _, n := range c.origin.capDeps {
		walk(n)
	}
	for _, st := range c.streams[1:] {
		for _, n := range st.capDeps {
			if !seen[n] {
				return st
			}
		}
	}
	return nil
}

// leaveCaptureLocked takes a destroyed stream out of its capture: the
// capture is discarded when st is its origin, invalidated otherwise.
func (b *Backend) leaveCaptureLocked(st *stream) {
	c := st.cap
	if c == nil {
		return
	}
	if st == c.origin {
		c.endLocked()
		return
	}
	_ = c.invalidate("StreamDestroy", fmt.Sprintf("stream %#x was destroyed while taking part in the capture", uint64(st.handle)))
	c.streams = slices.DeleteFunc(c.streams, func(x *stream) bool { return x == st })
	st.cap, st.capDeps = nil, nil
}

// StreamBeginCapture starts recording the work submitted to s into a new
// graph instead of running it.
func (b *Backend) StreamBeginCapture(s gpu.Stream) error {
	const op = "StreamBeginCapture"
	if err := b.enter(op); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	st, err := getLocked(b, op, "stream", b.mu.streams, s)
	if err != nil {
		return err
	}
	if st.cap != nil {
		return gpu.Errorf(op, gpu.ErrIllegalState, "stream %#x is already capturing (capture begun on stream %#x)", uint64(s), uint64(st.cap.origin.handle))
	}
	if err := b.stickyErr(op, st.dev); err != nil {
		return err
	}
	st.cap = &capture{g: b.newGraphLocked(st.dev, nil, false), origin: st, streams: []*stream{st}}
	st.capDeps = nil
	return nil
}

// StreamEndCapture ends the capture begun on s, on every stream taking part,
// and returns the graph. It returns gpu.ErrCaptureInvalidated and no graph
// when the capture was invalidated, or when a stream forked into it was not
// joined back (CUDA's "unjoined" error). Ending on a stream that only
// joined the capture is gpu.ErrIllegalState, and the capture goes on.
func (b *Backend) StreamEndCapture(s gpu.Stream) (gpu.Graph, error) {
	const op = "StreamEndCapture"
	if err := b.enter(op); err != nil {
		return 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	st, err := getLocked(b, op, "stream", b.mu.streams, s)
	if err != nil {
		return 0, err
	}
	c := st.cap
	switch {
	case c == nil:
		return 0, gpu.Errorf(op, gpu.ErrIllegalState, "stream %#x is not capturing", uint64(s))
	case c.origin != st:
		return 0, gpu.Errorf(op, gpu.ErrIllegalState, "stream %#x joined the capture begun on stream %#x; end it there", uint64(s), uint64(c.origin.handle))
	}
	if c.invalid == "" {
		if u := c.unjoined(); u != nil {
			c.invalid = fmt.Sprintf("stream %#x was forked into the capture and not joined back into the origin stream", uint64(u.handle))
		}
	}
	c.endLocked()
	if c.invalid != "" {
		return 0, gpu.Errorf(op, gpu.ErrCaptureInvalidated, "capture on stream %#x was invalidated (%s); no graph was made", uint64(s), c.invalid)
	}
	b.registerLocked(c.g)
	return c.g.handle, nil
}

// StreamIsCapturing reports whether s takes part in a capture (begun on it
// or joined through an event) that has not ended, including an invalidated
// one, which must still be ended.
func (b *Backend) StreamIsCapturing(s gpu.Stream) (bool, error) {
	const op = "StreamIsCapturing"
	if err := b.enter(op); err != nil {
		return false, err
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	st, err := getLocked(b, op, "stream", b.mu.streams, s)
	if err != nil {
		return false, err
	}
	return st.cap != nil, nil
}

// captureLocked records the command build makes as a node of st's capture,
// depending on st's dependency set.
func (b *Backend) captureLocked(op string, st *stream, mode capMode, build func(*stream) (cmd, error)) error {
	c := st.cap
	if err := b.stickyErr(op, st.dev); err != nil {
		return err
	}
	switch {
	case c.invalid != "":
		return c.invalidErr(op)
	case mode == capInvalidate:
		return c.invalidate(op, fmt.Sprintf("%s cannot be captured (only device-to-device copies become graph nodes)", op))
	case mode == capRefuse:
		return gpu.Errorf(op, gpu.ErrNotSupported, "%s on a capturing stream: the sim records no such node (the capture goes on without it)", op)
	}
	cm, err := build(st)
	if err != nil {
		return err
	}
	deps := slices.Clone(st.capDeps)
	var n *node
	switch cm.kind {
	case cmdKernel:
		n = b.addNodeLocked(c.g, gpu.NodeKernel, deps)
	case cmdMemcpy:
		n = b.addNodeLocked(c.g, gpu.NodeMemcpy, deps)
	case cmdMemset:
		n = b.addNodeLocked(c.g, gpu.NodeMemset, deps)
	case cmdWrite:
		n = b.addNodeLocked(c.g, gpu.NodeMemWriteValue, deps)
	case cmdMemAlloc:
		n = b.addNodeLocked(c.g, gpu.NodeMemAlloc, deps)
	case cmdMemFree:
		n = b.addNodeLocked(c.g, gpu.NodeMemFree, deps)
	case cmdGraph:
		n = b.addNodeLocked(c.g, gpu.NodeChildGraph, deps)
		b.adoptLocked(n, b.graphFromPlanLocked(cm.plan))
	default:
		return c.invalidate(op, fmt.Sprintf("%s cannot be captured", op))
	}
	n.p = cm.p
	st.capDeps = []*node{n}
	return nil
}

// eventAndStreamLocked looks up an event and a stream of the same device.
func (b *Backend) eventAndStreamLocked(op string, e gpu.Event, s gpu.Stream) (*event, *stream, error) {
	st, err := getLocked(b, op, "stream", b.mu.streams, s)
	if err != nil {
		return nil, nil, err
	}
	ev, err := getLocked(b, op, "event", b.mu.events, e)
	if err != nil {
		return nil, nil, err
	}
	return ev, st, nil
}

// eventAndStream runs plain, the call's work on event e and stream s
// outside any capture, under the read lock when s is not capturing and
// e's last record was not made in a capture: the common case, which thus
// runs concurrently with other streams' work. Otherwise it looks e and s
// up again under the write lock and runs capturing, which may change a
// capture.
func (b *Backend) eventAndStream(op string, e gpu.Event, s gpu.Stream, plain, capturing func(ev *event, st *stream) error) error {
	b.mu.RLock()
	ev, st, err := b.eventAndStreamLocked(op, e, s)
	if err == nil && st.cap == nil && ev.captured.Load() == nil {
		err = plain(ev, st)
		b.mu.RUnlock()
		return err
	}
	b.mu.RUnlock()
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if ev, st, err = b.eventAndStreamLocked(op, e, s); err != nil {
		return err
	}
	return capturing(ev, st)
}

// EventRecord records e on s; e completes when s reaches it. e and s must
// be on the same device. On a capturing stream, e instead marks the
// stream's point in the capture, for StreamWaitEvent to fork or join on.
func (b *Backend) EventRecord(e gpu.Event, s gpu.Stream) error {
	const op = "EventRecord"
	if err := b.enter(op); err != nil {
		return err
	}
	record := func(ev *event, st *stream) error {
		if ev.dev != st.dev {
			return gpu.Errorf(op, gpu.ErrInvalidValue, "event %#x of device %d recorded on stream %#x of device %d", uint64(e), ev.dev, uint64(s), st.dev)
		}
		if err := b.stickyErr(op, st.dev); err != nil {
			return err
		}
		// enqueue cannot fail under Backend.mu, so the record always
		// completes and EventSynchronize never waits forever.
		rec := newRecord()
		ev.last.Store(rec)
		st.enqueue(cmd{kind: cmdRecord, rec: rec})
		return nil
	}
	return b.eventAndStream(op, e, s, record, func(ev *event, st *stream) error {
		if st.cap == nil {
			ev.captured.Store(nil)
			return record(ev, st)
		}
		if ev.dev != st.dev {
			return gpu.Errorf(op, gpu.ErrInvalidValue, "event %#x of device %d recorded on stream %#x of device %d", uint64(e), ev.dev, uint64(s), st.dev)
		}
		if st.cap.invalid != "" {
			return st.cap.invalidErr(op)
		}
		ev.captured.Store(&capRecord{cap: st.cap, deps: slices.Clone(st.capDeps)})
		return nil
	})
}

// StreamWaitEvent makes later work on s wait for e's last record. When that
// record was made in a capture, s joins the capture (or, taking part
// already, adds the record's dependencies to its own). A capturing stream
// cannot wait on an event recorded outside its capture: that invalidates
// the capture (CUDA's capture isolation).
func (b *Backend) StreamWaitEvent(s gpu.Stream, e gpu.Event) error {
	const op = "StreamWaitEvent"
	if err := b.enter(op); err != nil {
		return err
	}
	wait := func(ev *event, st *stream) error {
		if err := b.stickyErr(op, st.dev); err != nil {
			return err
		}
		rec := ev.last.Load()
		if rec == nil {
			rec = completedRecord // CUDA: waiting on a never-recorded event is a no-op
		}
		st.enqueue(cmd{kind: cmdWait, rec: rec})
		return nil
	}
	return b.eventAndStream(op, e, s, wait, func(ev *event, st *stream) error {
		if err := b.stickyErr(op, st.dev); err != nil {
			return err
		}
		cr := ev.captured.Load()
		switch {
		case cr == nil && st.cap == nil:
			return wait(ev, st)
		case cr == nil:
			if st.cap.invalid != "" {
				return st.cap.invalidErr(op)
			}
			return st.cap.invalidate(op, fmt.Sprintf("stream %#x waited on event %#x, recorded outside the capture", uint64(s), uint64(e)))
		case cr.cap.ended:
			return gpu.Errorf(op, gpu.ErrIllegalState, "event %#x was recorded in a capture that has ended", uint64(e))
		case st.cap == nil: // fork: s joins the capture
			st.cap, st.capDeps = cr.cap, slices.Clone(cr.deps)
			cr.cap.streams = append(cr.cap.streams, st)
		case st.cap == cr.cap: // join
			for _, n := range cr.deps {
				if !slices.Contains(st.capDeps, n) {
					st.capDeps = append(st.capDeps, n)
				}
			}
		default:
			why := fmt.Sprintf("stream %#x of one capture waited on event %#x of another", uint64(s), uint64(e))
			_ = cr.cap.invalidate(op, why)
			return st.cap.invalidate(op, why)
		}
		if st.cap.invalid != "" {
			return st.cap.invalidErr(op)
		}
		return nil
	})
}
