package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/retire"
	"github.com/stablegraph/stablegraph/streamcache"
	"github.com/stablegraph/stablegraph/vmm"
)

// ErrClosed is returned by every Client method called after Close has
// begun. Nothing happened; the caller should open a new client.
var ErrClosed = errors.New("client: closed")

// Options configure Open. The zero value is valid: every zero
// field takes its documented default, applied in one place (withDefaults).
type Options struct {
	// Devices lists the device ordinals the client opens. Default: every
	// device of the backend.
	Devices []int
	// StreamsPerDevice is the number of streams taken per device. Stream 0
	// of each device carries that device's timeline (see Client). Default 1.
	StreamsPerDevice int
	// StreamFlags and StreamPriority are those of every stream taken.
	// Defaults gpu.StreamDefault and 0.
	StreamFlags    gpu.StreamFlags
	StreamPriority int
	// StreamCache is where streams come from and go back to. Default
	// streamcache.Default, the process-wide cache. A cache made with
	// streamcache.Options{MaxIdlePerKey: -1} caches nothing, so every open
	// creates streams and every close destroys them.
	StreamCache *streamcache.Cache
	// Retire configures each device's retirement queue (defaults: at most
	// 3 batches pending, 30 s wait deadline; see package retire). Its
	// WaitDeadline also bounds Close as a whole: the wait for calls in
	// progress, for the streams, for pending callbacks and for the retired
	// batches.
	Retire retire.Options
	// Logger receives debug logs. Default slog.Default().
	Logger *slog.Logger
}

// DefaultStreamsPerDevice is the default of Options.StreamsPerDevice.
const DefaultStreamsPerDevice = 1

func (o Options) withDefaults(b gpu.Backend) Options {
	if len(o.Devices) == 0 {
		o.Devices = make([]int, b.DeviceCount())
		for i := range o.Devices {
			o.Devices[i] = i
		}
	} else {
		o.Devices = slices.Clone(o.Devices)
	}
	if o.StreamsPerDevice <= 0 {
		o.StreamsPerDevice = DefaultStreamsPerDevice
	}
	if o.StreamCache == nil {
		o.StreamCache = streamcache.Default
	}
	if o.Retire.MaxPending <= 0 {
		o.Retire.MaxPending = retire.DefaultMaxPending
	}
	if o.Retire.WaitDeadline <= 0 {
		o.Retire.WaitDeadline = retire.DefaultWaitDeadline
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Client holds what a program needs on its devices for its lifetime:
// streams from a stream cache, a timeline and a retirement queue per
// device, and a helper goroutine for completion callbacks (see the package
// doc).
//
// A Client is safe for concurrent use. Close waits for calls in progress
// (up to its deadline), and every call that starts after Close began
// returns ErrClosed.
// Callbacks passed to After run on the helper goroutine, one at a time; they
// may call Client methods but must not call Close, which waits for them.
type Client struct {
	b     gpu.Backend
	opts  Options
	cache *streamcache.Cache
	key   streamcache.Key // flags and priority of every stream; Device varies
	devs  map[int]*clientDevice
	order []*clientDevice // in opts.Devices order

	// life is held shared by every method for its whole duration and
	// exclusively by Close only to set closed, so Close waits for calls in
	// progress and later calls see closed. Internal code never takes it
	// twice in one call (a pending writer would deadlock a nested RLock).
	life struct {
		sync.RWMutex
		closed bool
	}
	// closing is set when Close begins, so that calls fail at once while
	// Close waits for those in progress; calls counts those.
	closing atomic.Bool
	calls   atomic.Int64
	// closeSem (capacity 1) serialises Closes; left are the devices a
	// Close has not released yet (busy at its deadline), guarded by it.
	closeSem chan struct{}
	left     []*clientDevice
	// released is set once a Close has released everything (left empty),
	// for a Close that cannot take closeSem to know there is nothing left.
	released atomic.Bool

	helperMu sync.Mutex // guards helper creation
	helper   *clientHelper
}

// clientDevice is the client's state on one device. streams is fixed at
// open; the rest is made lazily.
type clientDevice struct {
	ordinal int
	streams []*clientStream

	// mu serialises timeline creation and submission marks, so that the
	// join event is recorded and waited on as a pair and points reach
	// stream 0 in order.
	mu   sync.Mutex
	tl   *vmm.Timeline // nil until first needed, then bound to stream 0; guarded by mu
	q    *retire.Queue // with tl; set once under mu, then read-only
	join gpu.Event     // event joining stream i into stream 0; guarded by mu

	evMu   sync.Mutex  // guards events
	events []gpu.Event // idle events for After
}

// clientStream is one stream on loan from the cache and the first error
// seen on it: a stream with an error goes back to the cache as failed and
// is destroyed, never reused.
type clientStream struct {
	s   gpu.Stream
	idx int
	mu  sync.Mutex
	err error // guarded by mu
}

func (st *clientStream) fail(err error) {
	if err == nil {
		return
	}
	st.mu.Lock()
	if st.err == nil {
		st.err = err
	}
	st.mu.Unlock()
}

func (st *clientStream) failure() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.err
}

// Open opens a client on the devices opts names, taking
// opts.StreamsPerDevice streams per device from the stream cache. On error
// every stream already taken goes back.
func Open(b gpu.Backend, opts Options) (*Client, error) {
	if b == nil {
		return nil, fmt.Errorf("client: open client: nil backend: %w", gpu.ErrInvalidValue)
	}
	opts = opts.withDefaults(b)
	if len(opts.Devices) == 0 {
		return nil, fmt.Errorf("client: open client on %s: no devices: %w", b.Name(), gpu.ErrUnavailable)
	}
	c := &Client{
		b:     b,
		opts:  opts,
		cache: opts.StreamCache,
		key:   streamcache.Key{Flags: opts.StreamFlags, Priority: opts.StreamPriority},
		devs:  make(map[int]*clientDevice, len(opts.Devices)),

		closeSem: make(chan struct{}, 1),
	}
	n := b.DeviceCount()
	for _, dev := range opts.Devices {
		if dev < 0 || dev >= n {
			return nil, fmt.Errorf("client: open client: device %d of %d: %w", dev, n, gpu.ErrInvalidValue)
		}
		if c.devs[dev] != nil {
			return nil, fmt.Errorf("client: open client: device %d listed twice: %w", dev, gpu.ErrInvalidValue)
		}
		d := &clientDevice{ordinal: dev, streams: make([]*clientStream, 0, opts.StreamsPerDevice)}
		c.devs[dev] = d
		c.order = append(c.order, d)
	}
	for _, d := range c.order {
		for i := 0; i < opts.StreamsPerDevice; i++ {
			s, err := c.cache.Get(b, c.keyFor(d))
			if err != nil {
				return nil, errors.Join(
					fmt.Errorf("client: open client: device %d stream %d: %w", d.ordinal, i, err),
					c.returnStreams())
			}
			d.streams = append(d.streams, &clientStream{s: s, idx: i})
		}
	}
	return c, nil
}

func (c *Client) keyFor(d *clientDevice) streamcache.Key {
	k := c.key
	k.Device = d.ordinal
	return k
}

// Backend returns the backend the client runs on.
func (c *Client) Backend() gpu.Backend { return c.b }

// Devices returns the ordinals of the client's devices.
func (c *Client) Devices() []int { return slices.Clone(c.opts.Devices) }

// enter marks the start of a call; the returned func ends it.
func (c *Client) enter() (func(), error) {
	if c.closing.Load() {
		return nil, ErrClosed
	}
	c.life.RLock()
	if c.life.closed {
		c.life.RUnlock()
		return nil, ErrClosed
	}
	c.calls.Add(1)
	return c.leave, nil
}

// leave ends a call begun by enter.
func (c *Client) leave() {
	c.calls.Add(-1)
	c.life.RUnlock()
}

// enterDevice is enter for a call on device dev, which it looks up; on
// error the call has ended.
func (c *Client) enterDevice(dev int) (*clientDevice, func(), error) {
	done, err := c.enter()
	if err != nil {
		return nil, nil, err
	}
	d, err := c.device(dev)
	if err != nil {
		done()
		return nil, nil, err
	}
	return d, done, nil
}

// enterStream is enter for a call on stream i of device dev, which it
// looks up; on error the call has ended.
func (c *Client) enterStream(dev, i int) (*clientDevice, *clientStream, func(), error) {
	done, err := c.enter()
	if err != nil {
		return nil, nil, nil, err
	}
	d, st, err := c.stream(dev, i)
	if err != nil {
		done()
		return nil, nil, nil, err
	}
	return d, st, done, nil
}

func (c *Client) device(dev int) (*clientDevice, error) {
	d := c.devs[dev]
	if d == nil {
		return nil, fmt.Errorf("client: device %d is not open in this client (open: %v): %w", dev, c.opts.Devices, gpu.ErrInvalidValue)
	}
	return d, nil
}

func (c *Client) stream(dev, i int) (*clientDevice, *clientStream, error) {
	d, err := c.device(dev)
	if err != nil {
		return nil, nil, err
	}
	if i < 0 || i >= len(d.streams) {
		return nil, nil, fmt.Errorf("client: device %d has no stream %d (it has %d): %w", dev, i, len(d.streams), gpu.ErrInvalidValue)
	}
	return d, d.streams[i], nil
}

// Stream returns stream i of device dev. The stream stays the client's: do
// not destroy it. Report errors seen on it with ReportStreamError.
func (c *Client) Stream(dev, i int) (gpu.Stream, error) {
	_, st, done, err := c.enterStream(dev, i)
	if err != nil {
		return 0, err
	}
	defer done()
	return st.s, nil
}

// ReportStreamError records that work on stream i of device dev failed with
// err, so that Close destroys the stream instead of caching it. The client
// records the errors of its own calls by itself.
func (c *Client) ReportStreamError(dev, i int, err error) error {
	_, st, done, serr := c.enterStream(dev, i)
	if serr != nil {
		return serr
	}
	defer done()
	st.fail(err)
	return nil
}

// ensureTimelineLocked makes d's timeline and retirement queue. d.mu held.
func (c *Client) ensureTimelineLocked(d *clientDevice) error {
	if d.tl != nil {
		return nil
	}
	tl, err := vmm.NewTimeline(c.b, d.ordinal)
	if err != nil {
		return fmt.Errorf("client: device %d: %w", d.ordinal, err)
	}
	// Only stream 0 signals (Submitted joins the others into it first):
	// bound, the timeline enforces that, and its waits end at a fault of
	// stream 0 instead of waiting for a point it will never write.
	if err := tl.Bind(d.streams[0].s); err != nil {
		return errors.Join(fmt.Errorf("client: device %d: %w", d.ordinal, err), tl.Close())
	}
	d.tl = tl
	d.q = retire.NewQueue(tl, c.opts.Retire)
	return nil
}

// queue returns d's retirement queue, making it if needed.
func (c *Client) queue(d *clientDevice) (*retire.Queue, *vmm.Timeline, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := c.ensureTimelineLocked(d); err != nil {
		return nil, nil, err
	}
	return d.q, d.tl, nil
}

// Submitted marks the end of a submission on stream i of device dev: it
// joins stream i into stream 0 when i != 0, signals the device's timeline,
// and polls the retirement queue, releasing every batch the device has
// passed. The point it returns is what Retire takes for buffers that this
// submission (or earlier ones) used. A nonzero point with an error means
// the signal succeeded and only releases failed.
func (c *Client) Submitted(dev, i int) (uint64, error) {
	d, st, done, err := c.enterStream(dev, i)
	if err != nil {
		return 0, err
	}
	defer done()
	s0 := d.streams[0]
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := c.ensureTimelineLocked(d); err != nil {
		return 0, err
	}
	if st != s0 {
		if d.join == 0 {
			ev, err := c.b.EventCreate(d.ordinal, gpu.EventDisableTiming)
			if err != nil {
				return 0, fmt.Errorf("client: device %d: join event: %w", d.ordinal, err)
			}
			d.join = ev
		}
		if err := c.b.EventRecord(d.join, st.s); err != nil {
			st.fail(err)
			return 0, fmt.Errorf("client: device %d: join stream %d into stream 0: %w", d.ordinal, i, err)
		}
		if err := c.b.StreamWaitEvent(s0.s, d.join); err != nil {
			s0.fail(err)
			return 0, fmt.Errorf("client: device %d: join stream %d into stream 0: %w", d.ordinal, i, err)
		}
	}
	p, err := d.tl.Signal(s0.s)
	if err != nil {
		s0.fail(err)
		return 0, fmt.Errorf("client: device %d: %w", d.ordinal, err)
	}
	if err := d.q.Poll(); err != nil {
		return p, fmt.Errorf("client: device %d: %w", d.ordinal, err)
	}
	return p, nil
}

// Retire defers the release of b until device dev passes point, a point
// returned by Submitted (0: no submission used b; it is released at once).
// It polls the queue and, when the queue is full, waits for its oldest
// batch (package retire).
//
// Ownership: when Retire fails before reaching the queue (ErrClosed,
// an unknown device, a point never signalled, no timeline) b is not taken
// and the caller still owns it; those errors wrap ErrClosed,
// gpu.ErrInvalidValue or the timeline's error. Once queued, b belongs to the
// queue even when Retire returns an error (a failed wait or release). A
// closed client does not free b itself: a Retire racing with Close may come
// before the streams were synchronized.
func (c *Client) Retire(ctx context.Context, dev int, b retire.Batch, point uint64) error {
	d, done, err := c.enterDevice(dev)
	if err != nil {
		return err
	}
	defer done()
	q, tl, err := c.queue(d)
	if err != nil {
		return fmt.Errorf("client: retire %d bytes on device %d: %w", b.Bytes(), dev, err)
	}
	if last := tl.Signalled(); point > last {
		return fmt.Errorf("client: retire %d bytes on device %d at point %d, beyond the last signalled point %d: %w",
			b.Bytes(), dev, point, last, gpu.ErrInvalidValue)
	}
	if err := q.Retire(ctx, b, point); err != nil {
		return fmt.Errorf("client: device %d: %w", dev, err)
	}
	return nil
}

// Poll releases, on every device, the retired batches whose points the
// device has passed, without blocking. Submitted and Retire poll by
// themselves; Poll serves callers that free memory between submissions.
func (c *Client) Poll() error {
	done, err := c.enter()
	if err != nil {
		return err
	}
	defer done()
	var errs []error
	for _, d := range c.order {
		d.mu.Lock()
		q := d.q
		d.mu.Unlock()
		if q != nil {
			if err := q.Poll(); err != nil {
				errs = append(errs, fmt.Errorf("client: device %d: %w", d.ordinal, err))
			}
		}
	}
	return errors.Join(errs...)
}

// RetireStats returns the statistics of device dev's retirement queue (zero
// before its first Submitted or Retire).
func (c *Client) RetireStats(dev int) (retire.Stats, error) {
	d, done, err := c.enterDevice(dev)
	if err != nil {
		return retire.Stats{}, err
	}
	defer done()
	d.mu.Lock()
	q := d.q
	d.mu.Unlock()
	if q == nil {
		return retire.Stats{}, nil
	}
	return q.Stats(), nil
}

// signalled returns the last point signalled on d (0 without a timeline).
func (d *clientDevice) signalled() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.tl == nil {
		return 0
	}
	return d.tl.Signalled()
}

// Synchronize waits for every stream of the client and releases every
// pending retired batch. ctx bounds only the waits that a failed
// synchronize leaves to the timeline.
func (c *Client) Synchronize(ctx context.Context) error {
	done, err := c.enter()
	if err != nil {
		return err
	}
	defer done()
	var errs []error
	for _, d := range c.order {
		errs = append(errs, c.syncDevice(ctx, d))
	}
	return errors.Join(errs...)
}

// syncDevice synchronizes every stream of d, then drains d's queue.
func (c *Client) syncDevice(ctx context.Context, d *clientDevice) error {
	upTo := d.signalled()
	var errs []error
	var sync0 error
	for _, st := range d.streams {
		err := c.b.StreamSynchronize(st.s)
		if err != nil {
			st.fail(err)
			errs = append(errs, fmt.Errorf("client: synchronize device %d stream %d: %w", d.ordinal, st.idx, err))
		}
		if st.idx == 0 {
			sync0 = err
		}
	}
	errs = append(errs, c.drainAfterSync(ctx, d, upTo, sync0))
	return errors.Join(errs...)
}

// drainAfterSync releases d's pending batches after stream 0 was
// synchronized. upTo is the last point signalled before that synchronize
// began and sync0 its result.
func (c *Client) drainAfterSync(ctx context.Context, d *clientDevice, upTo uint64, sync0 error) error {
	d.mu.Lock()
	q, tl := d.q, d.tl
	d.mu.Unlock()
	if q == nil {
		return nil
	}
	switch {
	case sync0 == nil:
		// The device passed upTo: release through it without waiting.
		var lost error
		if got := tl.Completed(); got < upTo {
			// The synchronize covered the writes, yet the word does not
			// show them: the timeline cannot be trusted (a stalled or
			// broken timeline), which the caller must hear about.
			lost = fmt.Errorf("client: device %d: timeline reads point %d after its stream synchronized through point %d: %w",
				d.ordinal, got, upTo, gpu.ErrIllegalState)
		}
		if err := q.DrainThrough(upTo); err != nil {
			return errors.Join(lost, fmt.Errorf("client: device %d: %w", d.ordinal, err))
		}
		return lost
	case errors.Is(sync0, gpu.ErrIllegalAddress) || errors.Is(sync0, gpu.ErrDeviceLost):
		// The device faulted: its streams run nothing more (the fault is
		// sticky), and the points after the fault will never be written.
		// Every pending buffer is safe to free.
		if err := q.ReleaseAll(); err != nil {
			return fmt.Errorf("client: device %d: release after fault: %w", d.ordinal, err)
		}
		return nil
	default:
		// The synchronize failed without proving the device idle or dead;
		// only the timeline can say what is safe.
		if err := q.Drain(ctx); err != nil {
			st := q.Stats()
			return fmt.Errorf("client: device %d: %d batches (%d bytes) stay pending: %w",
				d.ordinal, st.PendingBatches, st.PendingBytes, err)
		}
		return nil
	}
}

// Readback copies device memory at src into dst on stream 0 of device dev,
// waits for that stream, and then, as an explicit drain, releases every
// pending retired batch of the device. It sees all work submitted to
// stream 0 and all work joined into it by Submitted.
func (c *Client) Readback(ctx context.Context, dev int, dst []byte, src gpu.DevicePtr) error {
	d, done, err := c.enterDevice(dev)
	if err != nil {
		return err
	}
	defer done()
	s0 := d.streams[0]
	upTo := d.signalled()
	if err := c.b.MemcpyDtoHAsync(dst, src, s0.s); err != nil {
		s0.fail(err)
		return fmt.Errorf("client: readback of %d bytes at %#x on device %d: %w", len(dst), uint64(src), dev, err)
	}
	serr := c.b.StreamSynchronize(s0.s)
	if serr != nil {
		s0.fail(serr)
		serr = fmt.Errorf("client: readback of %d bytes at %#x on device %d: %w", len(dst), uint64(src), dev, serr)
	}
	return errors.Join(serr, c.drainAfterSync(ctx, d, upTo, serr))
}

// Close is CloseContext bounded by Options.Retire.WaitDeadline.
func (c *Client) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.Retire.WaitDeadline)
	defer cancel()
	return c.CloseContext(ctx)
}

// CloseContext releases the client: it waits for the calls in progress,
// for every stream, runs every pending callback, drains the retirement
// queues, frees timelines and events, and gives the streams back to the
// cache (which destroys those that failed). It returns every error met on
// the way. Every call that starts once Close has begun returns ErrClosed.
//
// Every wait ends when ctx does, and Close then reports what it could not
// release: with calls still in progress (waiting for the device) it
// releases nothing; a device whose streams are still busy is left whole
// (its streams, timeline, retired batches and events, which the device may
// still use); callbacks still pending run with an error wrapping
// gpu.ErrTimeout. A later Close tries again for what was left, and once
// everything is released Close does nothing and returns nil.
//
// ctx bounds the waits and nothing else: with nothing to wait for (no call
// in progress, idle streams, no other Close running) Close releases
// everything even when ctx has already ended. While another Close is
// running it waits for that one until ctx ends, then returns nil if that
// Close released everything, else an error saying it was waiting for
// another Close. A nil ctx is an error wrapping gpu.ErrInvalidValue.
func (c *Client) CloseContext(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("client: close: nil context.Context (pass context.Background() or a context with a deadline): %w", gpu.ErrInvalidValue)
	}
	c.closing.Store(true)
	if c.released.Load() {
		return nil
	}
	if err := c.lockLife(ctx); err != nil {
		return fmt.Errorf("client: close: %d calls still in progress (waiting for the device?); nothing was released, close again once they return: %w",
			c.calls.Load(), err)
	}
	first := !c.life.closed
	c.life.closed = true
	c.life.Unlock()
	// ctx bounds the waits only: the semaphore is taken at once when it is
	// free (a select of it against a done ctx would pick either at
	// random), and ctx consulted only while another Close holds it.
	select {
	case c.closeSem <- struct{}{}:
	default:
		select {
		case c.closeSem <- struct{}{}:
		case <-ctx.Done():
			if c.released.Load() {
				return nil // the other Close released everything
			}
			return fmt.Errorf("client: close: waiting for another Close to finish (it waits for the streams to go idle, then releases), nothing released by this one: %w", ctx.Err())
		}
	}
	defer func() { <-c.closeSem }()
	if first {
		c.left = slices.Clone(c.order)
	}
	if len(c.left) == 0 {
		c.released.Store(true)
		return nil
	}

	var errs []error
	// 1. Streams first, so that nothing the client queued is running and
	// every event of a pending callback has completed (or failed).
	var idle, busy []*clientDevice
	for _, d := range c.left {
		stuck, err := c.quiesce(ctx, d)
		errs = append(errs, err)
		if stuck {
			busy = append(busy, d)
		} else {
			idle = append(idle, d)
		}
	}
	// 2. The helper, before the events and streams it touches go away. At
	// its deadline it gives up on the events still pending (a busy
	// device's), failing their callbacks.
	c.helperMu.Lock()
	h := c.helper
	c.helper = nil
	c.helperMu.Unlock()
	if h != nil {
		deadline, ok := ctx.Deadline()
		if !ok {
			deadline = time.Now().Add(c.opts.Retire.WaitDeadline)
		}
		errs = append(errs, h.stop(ctx, deadline))
	}
	// 3. Timelines (the queues were drained by quiesce), events and
	// streams of the idle devices.
	for _, d := range idle {
		errs = append(errs, c.releaseDevice(d))
	}
	for _, d := range busy {
		var pending retire.Stats
		d.mu.Lock()
		if d.q != nil {
			pending = d.q.Stats()
		}
		d.mu.Unlock()
		errs = append(errs, fmt.Errorf("client: close: device %d: streams still busy at the deadline: left unreleased for a later Close, since the device may still use them: %d streams, its timeline, %d retired batches (%d bytes) and its events",
			d.ordinal, len(d.streams), pending.PendingBatches, pending.PendingBytes))
	}
	c.left = busy
	c.released.Store(len(busy) == 0)
	err := errors.Join(errs...)
	c.opts.Logger.Debug("client: client closed", "backend", c.b.Name(), "devices", c.opts.Devices,
		"streams_per_device", c.opts.StreamsPerDevice, "left", len(busy), "err", err)
	return err
}

// releaseDevice frees d's timeline and events and gives its streams back
// to the cache, once its streams are idle and its queue drained.
func (c *Client) releaseDevice(d *clientDevice) error {
	var errs []error
	d.mu.Lock()
	if d.q != nil {
		if st := d.q.Stats(); st.PendingBatches > 0 {
			errs = append(errs, fmt.Errorf("client: close: device %d: %d retired batches (%d bytes) could not be released safely and are leaked",
				d.ordinal, st.PendingBatches, st.PendingBytes))
		}
	}
	if d.tl != nil {
		errs = append(errs, wrapDev(d, "close timeline", d.tl.Close()))
		d.tl = nil
	}
	if d.join != 0 {
		errs = append(errs, wrapDev(d, "destroy join event", c.b.EventDestroy(d.join)))
		d.join = 0
	}
	d.mu.Unlock()
	d.evMu.Lock()
	for _, ev := range d.events {
		errs = append(errs, wrapDev(d, "destroy event", c.b.EventDestroy(ev)))
	}
	d.events = nil
	d.evMu.Unlock()
	errs = append(errs, c.returnDeviceStreams(d))
	return errors.Join(errs...)
}

// lockLife takes life exclusively, polling so that ctx can end the wait
// for the calls in progress (new ones fail at once: closing is set).
func (c *Client) lockLife(ctx context.Context) error {
	backoff := time.Microsecond
	for !c.life.TryLock() {
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, time.Millisecond)
	}
	return nil
}

// quiesce waits, until ctx ends, for every stream of d to be idle, then
// drains d's retirement queue. busy reports streams still running at the
// deadline: they are marked failed, and d's queue is left alone.
func (c *Client) quiesce(ctx context.Context, d *clientDevice) (busy bool, err error) {
	upTo := d.signalled()
	var errs []error
	var sync0 error
	for _, st := range d.streams {
		err := waitIdle(ctx, c.b, st.s)
		switch {
		case err != nil && ctx.Err() != nil:
			busy = true
			err = fmt.Errorf("client: close: device %d stream %d still busy at the deadline: %w (%w)", d.ordinal, st.idx, gpu.ErrTimeout, err)
			st.fail(err)
			errs = append(errs, err)
		case err != nil:
			st.fail(err)
			errs = append(errs, fmt.Errorf("client: close: device %d stream %d: %w", d.ordinal, st.idx, err))
		}
		if st.idx == 0 {
			sync0 = err
		}
	}
	if busy {
		return true, errors.Join(errs...)
	}
	errs = append(errs, c.drainAfterSync(ctx, d, upTo, sync0))
	return false, errors.Join(errs...)
}

// waitIdle polls s with back-off until its work has completed (nil), it
// reports a fault (the error), or ctx ends (ctx's error).
func waitIdle(ctx context.Context, b gpu.Backend, s gpu.Stream) error {
	backoff := time.Microsecond
	for {
		idle, err := b.StreamQuery(s)
		if errors.Is(err, gpu.ErrNotReady) {
			idle, err = false, nil
		}
		if err != nil || idle {
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, time.Millisecond)
	}
}

func wrapDev(d *clientDevice, what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("client: close: device %d: %s: %w", d.ordinal, what, err)
}

// returnStreams gives every stream back to the cache with the first error
// seen on it.
func (c *Client) returnStreams() error {
	var errs []error
	for _, d := range c.order {
		errs = append(errs, c.returnDeviceStreams(d))
	}
	return errors.Join(errs...)
}

// returnDeviceStreams gives d's streams back to the cache with the first
// error seen on each.
func (c *Client) returnDeviceStreams(d *clientDevice) error {
	var errs []error
	for _, st := range d.streams {
		if err := c.cache.Put(c.b, c.keyFor(d), st.s, st.failure()); err != nil {
			errs = append(errs, fmt.Errorf("client: close: device %d stream %d: %w", d.ordinal, st.idx, err))
		}
	}
	d.streams = nil
	return errors.Join(errs...)
}
