package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
)

// Completion callbacks: After records an event on the stream, and one helper
// goroutine per client polls the events of pending callbacks, with back-off,
// and runs each callback once its event completed.

// After arranges for fn to run on the client's helper goroutine once all
// work submitted to stream i of device dev so far has completed. fn gets
// the error that work reported (a fault), or an error wrapping
// gpu.ErrTimeout when Close gave up waiting for it. Callbacks of one
// stream run in order. Every callback registered before Close runs before
// Close returns.
func (c *Client) After(dev, i int, fn func(error)) error {
	if fn == nil {
		return fmt.Errorf("client: After with a nil callback: %w", gpu.ErrInvalidValue)
	}
	done, err := c.enter()
	if err != nil {
		return err
	}
	defer done()
	d, st, err := c.stream(dev, i)
	if err != nil {
		return err
	}
	ev, err := c.takeEvent(d)
	if err != nil {
		return err
	}
	if err := c.b.EventRecord(ev, st.s); err != nil {
		st.fail(err)
		c.putEvent(d, ev)
		return fmt.Errorf("client: After on device %d stream %d: record event: %w", dev, i, err)
	}
	c.startHelper().add(&clientCallback{dev: d, st: st, ev: ev, fn: fn})
	return nil
}

func (c *Client) takeEvent(d *clientDevice) (gpu.Event, error) {
	d.evMu.Lock()
	if n := len(d.events); n > 0 {
		ev := d.events[n-1]
		d.events = d.events[:n-1]
		d.evMu.Unlock()
		return ev, nil
	}
	d.evMu.Unlock()
	ev, err := c.b.EventCreate(d.ordinal, gpu.EventDisableTiming)
	if err != nil {
		return 0, fmt.Errorf("client: device %d: create event: %w", d.ordinal, err)
	}
	return ev, nil
}

func (c *Client) putEvent(d *clientDevice, ev gpu.Event) {
	d.evMu.Lock()
	d.events = append(d.events, ev)
	d.evMu.Unlock()
}

func (c *Client) startHelper() *clientHelper {
	c.helperMu.Lock()
	defer c.helperMu.Unlock()
	if c.helper == nil {
		c.helper = &clientHelper{c: c, wake: make(chan struct{}, 1), done: make(chan struct{})}
		go c.helper.run()
	}
	return c.helper
}

// clientCallback is one After registration: fn runs once ev, recorded on
// st, has completed.
type clientCallback struct {
	dev *clientDevice
	st  *clientStream
	ev  gpu.Event
	fn  func(error)
	err error // set when it completes
}

// clientHelper polls the events of pending callbacks and runs the callbacks,
// on one goroutine. It sleeps on wake when nothing is pending and backs off
// exponentially while events are outstanding, so it never spins.
type clientHelper struct {
	c    *Client
	wake chan struct{} // capacity 1: a pending wake-up is enough
	done chan struct{} // closed when run returns

	mu struct {
		sync.Mutex
		pending  []*clientCallback // registration order
		closing  bool
		deadline time.Time // when closing: give up on events after this
	}
	// errs collects event destruction errors; written by run only, read by
	// stop after run returned.
	errs []error
}

// Back-off of the helper's event polling: see package retire for the
// reasoning (short first sleeps, a cap of a millisecond).
const (
	helperMinBackoff = time.Microsecond
	helperMaxBackoff = time.Millisecond
)

func (h *clientHelper) add(cb *clientCallback) {
	h.mu.Lock()
	h.mu.pending = append(h.mu.pending, cb)
	h.mu.Unlock()
	h.notify()
}

func (h *clientHelper) notify() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// stop makes run finish every pending callback (giving up on events after
// deadline) and waits for it to return, until ctx ends: a callback that
// does not return is reported, not waited for.
func (h *clientHelper) stop(ctx context.Context, deadline time.Time) error {
	h.mu.Lock()
	h.mu.closing = true
	h.mu.deadline = deadline
	h.mu.Unlock()
	h.notify()
	select {
	case <-h.done:
	case <-ctx.Done():
		// The helper gives up on events at the deadline, so only a
		// callback that does not return keeps it: wait a little past the
		// deadline for it, then report it.
		select {
		case <-h.done:
		case <-time.After(helperGrace):
			return fmt.Errorf("client: close: a completion callback has not returned %v after the deadline; the helper goroutine is left to finish it: %w",
				helperGrace, ctx.Err())
		}
	}
	return errors.Join(h.errs...)
}

// helperGrace is how long Close waits past its deadline for the helper,
// which abandons pending events at the deadline itself.
const helperGrace = 100 * time.Millisecond

func (h *clientHelper) run() {
	defer close(h.done)
	backoff := helperMinBackoff
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		h.mu.Lock()
		pending := slices.Clone(h.mu.pending)
		closing, deadline := h.mu.closing, h.mu.deadline
		h.mu.Unlock()
		if len(pending) == 0 {
			if closing {
				return
			}
			<-h.wake
			continue
		}
		ready := h.poll(pending)
		if len(ready) == 0 && closing && time.Now().After(deadline) {
			// A hung device: fail what is left rather than wait forever.
			// The streams are marked failed so the cache destroys them.
			for _, cb := range pending {
				cb.err = fmt.Errorf("client: device %d stream %d: callback abandoned at close: %w",
					cb.dev.ordinal, cb.st.idx, gpu.ErrTimeout)
				cb.st.fail(cb.err)
			}
			ready = pending
		}
		if len(ready) > 0 {
			h.finish(ready)
			backoff = helperMinBackoff
			continue
		}
		timer.Reset(backoff)
		select {
		case <-timer.C:
		case <-h.wake:
			// Since Go 1.23 a stopped timer delivers no stale tick, so
			// Stop needs no drain.
			timer.Stop()
		}
		backoff = min(2*backoff, helperMaxBackoff)
	}
}

// poll queries the events of pending callbacks and returns those that
// completed, in registration order. Once a stream's event is found
// outstanding, later callbacks of that stream wait for the next round, so
// one stream's callbacks never run out of order.
func (h *clientHelper) poll(pending []*clientCallback) []*clientCallback {
	var ready []*clientCallback
	blocked := map[*clientStream]bool{}
	for _, cb := range pending {
		if blocked[cb.st] {
			continue
		}
		done, err := h.c.b.EventQuery(cb.ev)
		if errors.Is(err, gpu.ErrNotReady) {
			done, err = false, nil
		}
		if err == nil && !done {
			blocked[cb.st] = true
			continue
		}
		if err != nil {
			cb.err = fmt.Errorf("client: device %d stream %d: %w", cb.dev.ordinal, cb.st.idx, err)
			cb.st.fail(err)
		}
		ready = append(ready, cb)
	}
	return ready
}

// finish removes ready callbacks from the pending list, recycles their
// events, and runs them.
func (h *clientHelper) finish(ready []*clientCallback) {
	gone := make(map[*clientCallback]bool, len(ready))
	for _, cb := range ready {
		gone[cb] = true
	}
	h.mu.Lock()
	h.mu.pending = slices.DeleteFunc(h.mu.pending, func(cb *clientCallback) bool { return gone[cb] })
	h.mu.Unlock()
	for _, cb := range ready {
		if cb.err == nil {
			h.c.putEvent(cb.dev, cb.ev)
		} else if err := h.c.b.EventDestroy(cb.ev); err != nil {
			// An event that failed is not reused; its destruction is
			// reported by Close.
			h.errs = append(h.errs, fmt.Errorf("client: device %d: destroy failed event: %w", cb.dev.ordinal, err))
		}
	}
	for _, cb := range ready {
		cb.fn(cb.err)
	}
}
