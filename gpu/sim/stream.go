package sim

import (
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
)

// Streams: each stream has one worker goroutine that runs its commands in
// order; different streams run concurrently. The worker sleeps on a
// condition variable when the queue is empty.

const (
	prioLeast    = 0
	prioGreatest = -5
)

type cmdKind uint8

const (
	cmdKernel cmdKind = iota + 1
	cmdMemcpy         // device to device
	cmdMemset
	cmdWrite // StreamWriteValue64
	cmdGraph // GraphLaunch
	cmdHtoD
	cmdDtoH
	cmdRecord    // EventRecord
	cmdWait      // StreamWaitEvent
	cmdWaitValue // StreamWaitValue64 (streamwait.go): never captured
	cmdFunc      // internal work (GraphUpload): fn, when not nil
	// Graph memory, allocated and freed by the graph (the GEMM library's
	// workspace when it is given none and the stream is capturing). Only
	// ever captured: as stream work they do nothing.
	cmdMemAlloc
	cmdMemFree
)

// params are the parameters of a command or graph node of the kinds both
// have.
type params struct {
	kern kernelParams
	cp   gpu.MemcpyParams
	ms   gpu.Memset
	wv   writeValue
	ga   graphAlloc // mem-alloc and mem-free nodes
}

type kernelParams struct {
	fn   *function
	cfg  gpu.LaunchConfig
	args []gpu.Arg // owned, never modified once stored
}

type writeValue struct {
	p gpu.DevicePtr
	v uint64
}

// cmd is one unit of stream work. It is built when submitted, so that
// parameters are snapshots: later changes of the caller's values, of an
// exec graph or of a node do not affect work already queued.
type cmd struct {
	kind cmdKind
	p    params
	plan *plan         // cmdGraph
	dev  *devState     // cmdGraph: the exec's device state, nil when it has none
	fn   func()        // cmdFunc
	ptr  gpu.DevicePtr // cmdHtoD, cmdDtoH: device side
	host []byte        // cmdHtoD, cmdDtoH: host side, read or written when run
	rec  *record       // cmdRecord, cmdWait
}

type stream struct {
	b      *Backend
	handle gpu.Stream
	dev    int
	prio   int
	// cap is the capture this stream takes part in (begun on it, or
	// joined through an event), and capDeps the nodes its next captured
	// node depends on; both guarded by Backend.mu.
	cap     *capture
	capDeps []*node

	// Worker-only scratch for kernel arguments, so a reference kernel
	// cannot change a stored node by modifying its args.
	args []gpu.Arg

	mu        sync.Mutex
	work      sync.Cond // signalled when the queue grows or stop is set
	idle      sync.Cond // broadcast when done grows
	queue     []cmd
	head      int
	submitted uint64
	done      uint64
	// lastEnd is when the worker finished the stream's last command: an
	// event completes at the later of it and its own enqueueing (record).
	lastEnd time.Time
	stop    bool
	exited  chan struct{}
}

func (b *Backend) StreamCreate(dev int, flags gpu.StreamFlags, priority int) (gpu.Stream, error) {
	const op = "StreamCreate"
	if err := b.enter(op); err != nil {
		return 0, err
	}
	if err := b.checkDev(op, dev); err != nil {
		return 0, err
	}
	if flags&^gpu.StreamNonBlocking != 0 {
		return 0, gpu.Errorf(op, gpu.ErrInvalidValue, "unknown stream flags %#x", uint32(flags))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return 0, errClosed(op)
	}
	st := &stream{b: b, handle: gpu.Stream(b.newHandleLocked()), dev: dev,
		prio: min(max(priority, prioGreatest), prioLeast), exited: make(chan struct{})}
	st.work.L, st.idle.L = &st.mu, &st.mu
	b.mu.streams[st.handle] = st
	b.workers.Add(1)
	go st.loop()
	return st.handle, nil
}

// StreamPriorityRange returns CUDA's range, (0, -5). Priorities are kept
// but do not change scheduling in sim.
func (b *Backend) StreamPriorityRange(dev int) (least, greatest int, err error) {
	const op = "StreamPriorityRange"
	if err := b.enter(op); err != nil {
		return 0, 0, err
	}
	if err := b.checkDev(op, dev); err != nil {
		return 0, 0, err
	}
	return prioLeast, prioGreatest, nil
}

// enqueue appends c. It is called with Backend.mu held (read or write), so
// the stream cannot have been stopped: StreamDestroy and Close remove it
// from the table under the write lock before stopping it.
func (st *stream) enqueue(c cmd) {
	st.mu.Lock()
	st.queue = append(st.queue, c)
	st.submitted++
	st.work.Signal()
	st.mu.Unlock()
}

func (st *stream) loop() {
	defer st.b.workers.Done()
	defer close(st.exited)
	for {
		st.mu.Lock()
		for st.head == len(st.queue) && !st.stop {
			st.work.Wait()
		}
		if st.head == len(st.queue) {
			st.mu.Unlock()
			return
		}
		c := st.queue[st.head]
		st.queue[st.head] = cmd{} // drop references for the GC
		st.head++
		switch {
		case st.head == len(st.queue):
			st.queue, st.head = st.queue[:0], 0
		case st.head >= 1024 && st.head*2 >= len(st.queue):
			n := copy(st.queue, st.queue[st.head:])
			clear(st.queue[n:])
			st.queue, st.head = st.queue[:n], 0
		}
		st.mu.Unlock()

		st.runSafe(&c)

		st.mu.Lock()
		st.done++
		if c.kind == cmdRecord {
			// Completed under mu after done counts it, so that whoever
			// sees the event complete also sees the stream past it
			// (EventSynchronize then StreamQuery reports idle). Its time
			// is when the stream reached it, as a device's: the later of
			// its enqueueing and the end of the command before it, not
			// when this worker, which a busy host may leave unscheduled
			// for milliseconds, got to it.
			c.rec.completeAt(later(c.rec.enqueued, st.lastEnd))
		} else {
			st.lastEnd = time.Now()
		}
		st.idle.Broadcast()
		st.mu.Unlock()
	}
}

// runSafe runs c; a panic (a bug in a kernel reference or in sim) becomes
// the device's sticky error instead of killing the process.
func (st *stream) runSafe(c *cmd) {
	defer func() {
		if r := recover(); r != nil {
			st.b.stick(st.dev, gpu.Errorf("stream", gpu.ErrDeviceLost, "panic in stream %#x work: %v\n%s", uint64(st.handle), r, debug.Stack()))
		}
	}()
	st.run(c)
}

func (st *stream) run(c *cmd) {
	b := st.b
	switch c.kind {
	case cmdRecord:
		// Completed by loop, even when the device is faulted or the
		// backend closing, so that nobody waits forever.
		return
	case cmdWait:
		select {
		case <-c.rec.done:
		case <-b.closing:
		}
		return
	}
	if b.closingNow() || b.faulted(st.dev) {
		return // a faulted device skips its later work
	}
	a := actor{dev: st.dev}
	switch c.kind {
	case cmdKernel:
		st.runKernel(&c.p.kern)
	case cmdMemcpy:
		a.kernel = "memcpy"
		_ = b.copyDtoD(a, c.p.cp.Dst, c.p.cp.Src, c.p.cp.Size)
	case cmdMemset:
		a.kernel = "memset"
		_ = b.memset(a, c.p.ms)
	case cmdWrite:
		a.kernel = "writeValue64"
		_ = b.writeValue(a, c.p.wv)
	case cmdWaitValue:
		st.waitValue(c.p.wv)
	case cmdHtoD:
		a.kernel = "memcpy"
		_ = b.access(a, c.ptr, c.host, true)
	case cmdDtoH:
		a.kernel = "memcpy"
		_ = b.access(a, c.ptr, c.host, false)
	case cmdGraph:
		st.runPlan(c.plan, c.dev)
	case cmdFunc:
		if c.fn != nil {
			c.fn()
		}
	}
	// Errors above are already the device's sticky error.
}

// wait blocks until everything submitted to st before the call has run.
func (st *stream) wait() {
	st.mu.Lock()
	for t := st.submitted; st.done < t; {
		st.idle.Wait()
	}
	st.mu.Unlock()
}

func (st *stream) isIdle() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.done == st.submitted
}

// shutdown lets the worker finish the queue and waits for it to exit.
func (st *stream) shutdown() {
	st.mu.Lock()
	st.stop = true
	st.work.Broadcast()
	st.mu.Unlock()
	<-st.exited
}

// capMode says what a stream operation does on a capturing stream.
type capMode uint8

const (
	capNode       capMode = iota + 1 // becomes a graph node
	capInvalidate                    // cannot be captured: invalidates the capture
	capRefuse                        // refused with ErrNotSupported; the capture goes on
)

// submit is the one path of every stream operation: look up s, refuse work
// on a faulted device, build the command (under Backend.mu, so build may
// look up handles), then queue it, or record it as a node when s is
// capturing.
func (b *Backend) submit(op string, s gpu.Stream, mode capMode, build func(st *stream) (cmd, error)) error {
	b.mu.RLock()
	st, err := getLocked(b, op, "stream", b.mu.streams, s)
	if err == nil && st.cap == nil {
		err = b.queueLocked(op, st, build)
		b.mu.RUnlock()
		return err
	}
	b.mu.RUnlock()
	if err != nil {
		return err
	}
	// Capturing: nodes are added under the write lock.
	b.mu.Lock()
	defer b.mu.Unlock()
	if st, err = getLocked(b, op, "stream", b.mu.streams, s); err != nil {
		return err
	}
	if st.cap == nil { // the capture ended meanwhile
		return b.queueLocked(op, st, build)
	}
	return b.captureLocked(op, st, mode, build)
}

func (b *Backend) queueLocked(op string, st *stream, build func(*stream) (cmd, error)) error {
	if err := b.stickyErr(op, st.dev); err != nil {
		return err
	}
	c, err := build(st)
	if err != nil {
		return err
	}
	st.enqueue(c)
	return nil
}

// ---- synchronization ----

// StreamQuery reports whether s is idle; the error is the device's sticky
// error, if any. On a capturing stream it invalidates the capture and
// returns gpu.ErrCaptureInvalidated.
func (b *Backend) StreamQuery(s gpu.Stream) (bool, error) {
	const op = "StreamQuery"
	if err := b.enter(op); err != nil {
		return false, err
	}
	st, err := b.syncStream(op, s)
	if err != nil {
		return false, err
	}
	return st.isIdle(), b.stickyErr(op, st.dev)
}

// StreamSynchronize waits for everything submitted to s, then returns the
// device's sticky error, if any. On a capturing stream it invalidates the
// capture and returns gpu.ErrCaptureInvalidated.
func (b *Backend) StreamSynchronize(s gpu.Stream) error {
	const op = "StreamSynchronize"
	if err := b.enter(op); err != nil {
		return err
	}
	st, err := b.syncStream(op, s)
	if err != nil {
		return err
	}
	st.wait()
	return b.stickyErr(op, st.dev)
}

// syncStream looks s up for a synchronizing call, which breaks a capture.
func (b *Backend) syncStream(op string, s gpu.Stream) (*stream, error) {
	b.mu.RLock()
	st, err := getLocked(b, op, "stream", b.mu.streams, s)
	capturing := err == nil && st.cap != nil
	b.mu.RUnlock()
	if !capturing {
		return st, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if st, err = getLocked(b, op, "stream", b.mu.streams, s); err != nil || st.cap == nil {
		return st, err
	}
	return nil, st.cap.invalidate(op, fmt.Sprintf("%s on a capturing stream", op))
}

// StreamDestroy waits for the work queued on s (run, or skipped on a
// faulted device), then stops its goroutine. Destroying the origin stream
// of a capture discards the capture; destroying a stream that joined one
// invalidates it.
func (b *Backend) StreamDestroy(s gpu.Stream) error {
	const op = "StreamDestroy"
	if err := b.enter(op); err != nil {
		return err
	}
	b.mu.Lock()
	st, err := getLocked(b, op, "stream", b.mu.streams, s)
	if err != nil {
		b.mu.Unlock()
		return err
	}
	delete(b.mu.streams, s)
	b.leaveCaptureLocked(st)
	b.mu.Unlock()
	st.shutdown()
	return nil
}

// ---- events ----

type event struct {
	handle gpu.Event
	dev    int
	flags  gpu.EventFlags
	last   atomic.Pointer[record] // the last record, nil before the first
	// captured is set while the last record was made on a capturing
	// stream: it holds that stream's dependencies instead of a point in a
	// queue. Written under Backend.mu's write lock.
	captured atomic.Pointer[capRecord]
}

// record is one EventRecord: done is closed when the stream reaches it, and
// at is set just before; enqueued is when EventRecord enqueued it.
type record struct {
	done     chan struct{}
	at       time.Time
	enqueued time.Time
}

func newRecord() *record { return &record{done: make(chan struct{}), enqueued: time.Now()} }

func (r *record) complete() { r.completeAt(time.Now()) }

func (r *record) completeAt(t time.Time) {
	r.at = t
	close(r.done)
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (r *record) isDone() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

var completedRecord = func() *record { r := newRecord(); r.complete(); return r }()

func (b *Backend) EventCreate(dev int, flags gpu.EventFlags) (gpu.Event, error) {
	const op = "EventCreate"
	if err := b.enter(op); err != nil {
		return 0, err
	}
	if err := b.checkDev(op, dev); err != nil {
		return 0, err
	}
	if flags&^(gpu.EventBlockingSync|gpu.EventDisableTiming) != 0 {
		return 0, gpu.Errorf(op, gpu.ErrInvalidValue, "unknown event flags %#x", uint32(flags))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return 0, errClosed(op)
	}
	ev := &event{handle: gpu.Event(b.newHandleLocked()), dev: dev, flags: flags}
	b.mu.events[ev.handle] = ev
	return ev.handle, nil
}

func (b *Backend) eventRecord(op string, e gpu.Event) (*event, *record, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	ev, err := getLocked(b, op, "event", b.mu.events, e)
	if err != nil {
		return nil, nil, err
	}
	if ev.captured.Load() != nil {
		return nil, nil, gpu.Errorf(op, gpu.ErrIllegalState, "event %#x was last recorded on a capturing stream: it marks a point of the capture, not of a stream", uint64(e))
	}
	return ev, ev.last.Load(), nil
}

// EventQuery reports whether e's last record completed (true when never
// recorded, as in CUDA); the error is the device's sticky error.
func (b *Backend) EventQuery(e gpu.Event) (bool, error) {
	const op = "EventQuery"
	if err := b.enter(op); err != nil {
		return false, err
	}
	ev, rec, err := b.eventRecord(op, e)
	if err != nil {
		return false, err
	}
	if err := b.stickyErr(op, ev.dev); err != nil {
		return false, err
	}
	return rec == nil || rec.isDone(), nil
}

func (b *Backend) EventSynchronize(e gpu.Event) error {
	const op = "EventSynchronize"
	if err := b.enter(op); err != nil {
		return err
	}
	ev, rec, err := b.eventRecord(op, e)
	if err != nil {
		return err
	}
	if rec != nil {
		select {
		case <-rec.done:
		case <-b.closing:
			return errClosed(op)
		}
	}
	return b.stickyErr(op, ev.dev)
}

// EventElapsed returns the time between the completions of start's and
// end's last records: gpu.ErrNotReady when either is not complete or was
// never recorded, gpu.ErrInvalidValue when either disables timing.
func (b *Backend) EventElapsed(start, end gpu.Event) (time.Duration, error) {
	const op = "EventElapsed"
	if err := b.enter(op); err != nil {
		return 0, err
	}
	var recs [2]*record
	for i, e := range [2]gpu.Event{start, end} {
		ev, rec, err := b.eventRecord(op, e)
		if err != nil {
			return 0, err
		}
		if ev.flags&gpu.EventDisableTiming != 0 {
			return 0, gpu.Errorf(op, gpu.ErrInvalidValue, "event %#x was created with EventDisableTiming", uint64(e))
		}
		if rec == nil || !rec.isDone() {
			return 0, gpu.Errorf(op, gpu.ErrNotReady, "event %#x has not completed (or was never recorded)", uint64(e))
		}
		recs[i] = rec
	}
	return recs[1].at.Sub(recs[0].at), nil
}

func (b *Backend) EventDestroy(e gpu.Event) error {
	const op = "EventDestroy"
	if err := b.enter(op); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, err := getLocked(b, op, "event", b.mu.events, e); err != nil {
		return err
	}
	delete(b.mu.events, e)
	return nil
}
