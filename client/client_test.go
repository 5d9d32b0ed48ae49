package client_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph/client"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/retire"
	"github.com/stablegraph/stablegraph/streamcache"
)

// clientEnv is a sim backend with the built-in kernels loaded on every
// device and a private stream cache.
type clientEnv struct {
	t     testing.TB
	b     *sim.Backend
	cache *streamcache.Cache
	mods  []gpu.Module
	funcs map[int]map[string]gpu.Function // device -> kernel name -> function
}

func newClientEnv(t testing.TB, devices int, cacheOpts streamcache.Options) *clientEnv {
	t.Helper()
	b, err := sim.New(sim.Config{Devices: devices, DeviceMemory: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	e := &clientEnv{t: t, b: b, cache: streamcache.New(cacheOpts), funcs: map[int]map[string]gpu.Function{}}
	for dev := 0; dev < devices; dev++ {
		e.load(dev, kernels.Module())
	}
	return e
}

// load loads img on dev and records its functions by name.
func (e *clientEnv) load(dev int, img *gpu.ModuleImage) {
	e.t.Helper()
	m, err := e.b.ModuleLoad(dev, img)
	if err != nil {
		e.t.Fatal(err)
	}
	e.mods = append(e.mods, m)
	if e.funcs[dev] == nil {
		e.funcs[dev] = map[string]gpu.Function{}
	}
	for _, k := range img.Kernels {
		f, err := e.b.ModuleFunction(m, k.Name)
		if err != nil {
			e.t.Fatal(err)
		}
		e.funcs[dev][k.Name] = f
	}
}

func (e *clientEnv) launch(dev int, name string, n int, s gpu.Stream, args ...gpu.Arg) {
	e.t.Helper()
	if err := e.b.LaunchKernel(e.funcs[dev][name], kernels.Elementwise(n), args, s); err != nil {
		e.t.Fatalf("launch %s: %v", name, err)
	}
}

func (e *clientEnv) alloc(dev int, size uint64) gpu.DevicePtr {
	e.t.Helper()
	p, err := e.b.MemAlloc(dev, size)
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *clientEnv) open(opts client.Options) *client.Client {
	e.t.Helper()
	opts.StreamCache = e.cache
	c, err := client.Open(e.b, opts)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// finish unloads the modules, purges the cache and checks that nothing is
// left live before closing the backend (docs/ARCHITECTURE.md rule 2).
func (e *clientEnv) finish() {
	e.t.Helper()
	for _, m := range e.mods {
		if err := e.b.ModuleUnload(m); err != nil {
			e.t.Error(err)
		}
	}
	e.mods = nil
	if err := e.cache.Purge(e.b); err != nil {
		e.t.Errorf("purge: %v", err)
	}
	if live := e.b.LiveHandles(); !live.IsZero() {
		e.t.Errorf("handles left live: %v", live)
	}
	if err := e.b.Close(); err != nil {
		e.t.Errorf("backend close: %v", err)
	}
}

// gateModule is a module with one kernel, gated_copy(y, x, n), that blocks
// until gate is closed and then copies n float32 values from x to y: a
// kernel that stays in flight for as long as the test wants.
func gateModule(gate <-chan struct{}) *gpu.ModuleImage {
	return &gpu.ModuleImage{Name: "client-test-gate", Kernels: []gpu.KernelSpec{{
		Name:   "gated_copy",
		Params: []gpu.ArgKind{gpu.ArgPtr, gpu.ArgPtr, gpu.ArgI32},
		Ref: func(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
			<-gate
			buf := make([]byte, 4*int(a[2].AsI32()))
			if err := mem.Read(a[1].AsPtr(), buf); err != nil {
				return err
			}
			return mem.Write(a[0].AsPtr(), buf)
		},
	}}}
}

func waitIdle(t testing.TB, b gpu.Backend, s gpu.Stream) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		idle, err := b.StreamQuery(s)
		if err != nil {
			t.Fatal(err)
		}
		if idle {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("stream never went idle")
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func TestClientOpenCloseReusesStreams(t *testing.T) {
	e := newClientEnv(t, 2, streamcache.Options{})
	defer e.finish()
	opts := client.Options{StreamsPerDevice: 4}
	c := e.open(opts)
	var first []gpu.Stream
	for _, dev := range c.Devices() {
		for i := 0; i < 4; i++ {
			s, err := c.Stream(dev, i)
			if err != nil {
				t.Fatal(err)
			}
			first = append(first, s)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.Stream(0, 0); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("Stream after Close: %v", err)
	}
	if st := e.cache.Stats(); st.Misses != 8 || st.Hits != 0 || st.Idle != 8 || st.Discards != 0 {
		t.Fatalf("after the first client: %+v", st)
	}
	c = e.open(opts)
	var second []gpu.Stream
	for _, dev := range c.Devices() {
		for i := 0; i < 4; i++ {
			s, _ := c.Stream(dev, i)
			second = append(second, s)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(first)
	slices.Sort(second)
	if !slices.Equal(first, second) {
		t.Fatalf("second client got streams %v, want the cached %v", second, first)
	}
	if st := e.cache.Stats(); st.Hits != 8 || st.Misses != 8 {
		t.Fatalf("after the second client: %+v", st)
	}
	if live := e.b.LiveHandles(); live.Streams != 8 || live.Events != 0 || live.HostAllocs != 0 {
		t.Fatalf("live after close (8 cached streams expected): %v", live)
	}
}

func TestClientOptionsErrors(t *testing.T) {
	e := newClientEnv(t, 1, streamcache.Options{})
	defer e.finish()
	for _, opts := range []client.Options{
		{Devices: []int{1}},
		{Devices: []int{0, 0}},
		{Devices: []int{-1}},
	} {
		opts.StreamCache = e.cache
		if _, err := client.Open(e.b, opts); !errors.Is(err, gpu.ErrInvalidValue) {
			t.Errorf("OpenClient(%v) = %v, want ErrInvalidValue", opts.Devices, err)
		}
	}
	if _, err := client.Open(nil, client.Options{}); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("OpenClient(nil) = %v", err)
	}
}

// TestClientNoPrematureFree is the first "done when": a kernel still
// in flight that reads a retired buffer never faults, and the buffer is
// released by the first poll after its timeline point passed. It runs with
// the kernel on stream 0 and on stream 1 (joined into stream 0's timeline
// by Submitted).
func TestClientNoPrematureFree(t *testing.T) {
	for _, idx := range []int{0, 1} {
		t.Run(fmt.Sprint("stream", idx), func(t *testing.T) {
			e := newClientEnv(t, 1, streamcache.Options{})
			defer e.finish()
			gate := make(chan struct{})
			e.load(0, gateModule(gate))
			c := e.open(client.Options{StreamsPerDevice: 2})
			defer func() {
				if err := c.Close(); err != nil {
					t.Error(err)
				}
			}()
			const n = 1024
			x, y := e.alloc(0, 4*n), e.alloc(0, 4*n)
			defer e.b.MemFree(y)
			if err := e.b.MemcpyHtoD(x, gpu.F32ToBytes(simtest.Ramp(n, 0.5))); err != nil {
				t.Fatal(err)
			}
			s, _ := c.Stream(0, idx)
			e.launch(0, "gated_copy", n, s, gpu.Ptr(y), gpu.Ptr(x), gpu.I32(n))
			p, err := c.Submitted(0, idx)
			if err != nil {
				t.Fatal(err)
			}
			var freed atomic.Bool
			batch := retire.Batch{{Bytes: 4 * n, Release: func() error {
				freed.Store(true)
				return e.b.MemFree(x)
			}}}
			if err := c.Retire(context.Background(), 0, batch, p); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 5; i++ {
				if err := c.Poll(); err != nil {
					t.Fatal(err)
				}
				time.Sleep(time.Millisecond)
			}
			if freed.Load() {
				t.Fatal("x was released while the kernel reading it was still in flight")
			}
			close(gate)
			s0, _ := c.Stream(0, 0)
			waitIdle(t, e.b, s)  // the kernel is done...
			waitIdle(t, e.b, s0) // ...and the timeline write after it too
			if freed.Load() {
				t.Fatal("x was released without a poll")
			}
			if err := c.Poll(); err != nil {
				t.Fatal(err)
			}
			if !freed.Load() {
				t.Fatal("x was not released by the first poll after its point passed")
			}
			st, _ := c.RetireStats(0)
			if st.ReleasedByPoll != 1 || st.PendingBatches != 0 {
				t.Fatalf("stats %+v", st)
			}
			got := make([]byte, 4*n)
			if err := c.Readback(context.Background(), 0, got, y); err != nil {
				t.Fatalf("readback (a fault would show here): %v", err)
			}
			if !slices.Equal(gpu.BytesToF32(got), simtest.Ramp(n, 0.5)) {
				t.Fatal("the in-flight kernel read wrong data")
			}
		})
	}
}

// TestClientEarlyFreeWouldFault is the control for TestClientNoPrematureFree:
// freeing the buffer while the kernel is in flight does fault in the sim,
// so the test above proves something. It also checks that the stream that
// saw the fault is destroyed, not cached, and that the device's pending
// batches are released at close.
func TestClientEarlyFreeWouldFault(t *testing.T) {
	e := newClientEnv(t, 1, streamcache.Options{})
	defer e.finish()
	gate := make(chan struct{})
	e.load(0, gateModule(gate))
	c := e.open(client.Options{})
	const n = 256
	x, y, z := e.alloc(0, 4*n), e.alloc(0, 4*n), e.alloc(0, 4*n)
	s, _ := c.Stream(0, 0)
	e.launch(0, "gated_copy", n, s, gpu.Ptr(y), gpu.Ptr(x), gpu.I32(n))
	p, err := c.Submitted(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	// z is retired properly; x is freed early, by mistake.
	if err := c.Retire(context.Background(), 0, retire.Batch{{Bytes: 4 * n, Release: func() error { return e.b.MemFree(z) }}}, p); err != nil {
		t.Fatal(err)
	}
	if err := e.b.MemFree(x); err != nil {
		t.Fatal(err)
	}
	close(gate)
	err = c.Synchronize(context.Background())
	var fe *gpu.FaultError
	if !errors.As(err, &fe) || fe.Addr != x {
		t.Fatalf("Synchronize after an early free = %v, want a fault at %#x", err, uint64(x))
	}
	if st, _ := c.RetireStats(0); st.PendingBatches != 0 || st.ReleasedForced != 1 {
		t.Fatalf("the faulted device's batch was not released: %+v", st)
	}
	if err := c.Close(); !errors.Is(err, gpu.ErrIllegalAddress) {
		t.Fatalf("Close after a fault = %v, want the fault reported", err)
	}
	if st := e.cache.Stats(); st.Idle != 0 || st.DiscardedFailed != 1 {
		t.Fatalf("the failed stream was cached: %+v", st)
	}
	if err := e.b.MemFree(y); err != nil {
		t.Fatal(err)
	}
	if err := e.b.ResetDevice(0); err != nil {
		t.Fatal(err)
	}
	c2 := e.open(client.Options{})
	s2, _ := c2.Stream(0, 0)
	if s2 == s {
		t.Fatal("the stream that failed was handed out again")
	}
	if err := c2.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestClientFailedQueryStreamNotReused(t *testing.T) {
	e := newClientEnv(t, 1, streamcache.Options{})
	defer e.finish()
	c := e.open(client.Options{StreamsPerDevice: 2})
	s0, _ := c.Stream(0, 0)
	s1, _ := c.Stream(0, 1)
	e.b.InjectFault("StreamQuery", 0, nil)
	if err := c.Close(); !errors.Is(err, gpu.ErrInjected) {
		t.Fatalf("Close with a failing stream query = %v, want the injected error", err)
	}
	if st := e.cache.Stats(); st.Idle != 1 || st.DiscardedFailed != 1 {
		t.Fatalf("stats %+v", st)
	}
	c = e.open(client.Options{StreamsPerDevice: 2})
	a, _ := c.Stream(0, 0)
	b, _ := c.Stream(0, 1)
	if a == s0 || b == s0 {
		t.Fatalf("the stream whose query failed (%d) was handed out again (%d, %d)", s0, a, b)
	}
	if a != s1 && b != s1 {
		t.Fatalf("the healthy stream %d was not reused (%d, %d)", s1, a, b)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestClientReportedStreamErrorNotReused(t *testing.T) {
	e := newClientEnv(t, 1, streamcache.Options{})
	defer e.finish()
	c := e.open(client.Options{})
	s, _ := c.Stream(0, 0)
	if err := c.ReportStreamError(0, 0, errors.New("capture failed")); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c = e.open(client.Options{})
	if s2, _ := c.Stream(0, 0); s2 == s {
		t.Fatal("a stream reported failed was handed out again")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestClientTenThousandSubmissions is the second "done when":
// pending memory stays under depth x batch size over 10 000 asynchronous
// submissions that each free a buffer, and a drain after a readback leaves
// nothing pending.
func TestClientTenThousandSubmissions(t *testing.T) {
	e := newClientEnv(t, 1, streamcache.Options{})
	defer e.finish()
	c := e.open(client.Options{})
	st, res := retireLoop(t, e, c, 10000)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	depth := uint64(retire.DefaultMaxPending)
	if st.PeakPendingBytes > depth*loopBatchBytes {
		t.Fatalf("peak pending %d bytes > depth %d x batch %d bytes", st.PeakPendingBytes, depth, loopBatchBytes)
	}
	if st.PendingBytes != 0 || st.PendingBatches != 0 {
		t.Fatalf("pending after readback: %+v", st)
	}
	if st.Released() != 10000 {
		t.Fatalf("released %d batches, want 10000: %+v", st.Released(), st)
	}
	if res != 10000 {
		t.Fatalf("accumulator read back %v, want 10000", res)
	}
	t.Logf("peak pending %d B (bound %d B); released by poll %d, wait %d, drain %d (%.1f%% by poll)",
		st.PeakPendingBytes, depth*loopBatchBytes, st.ReleasedByPoll, st.ReleasedByWait, st.ReleasedByDrain,
		100*float64(st.ReleasedByPoll)/float64(st.Released()))
}

const (
	loopElems      = 64
	loopBatchBytes = 4 * loopElems
)

// retireLoop submits n steps on device 0, stream 0, without ever waiting:
// each fills a fresh temporary with 1, adds it into an accumulator and
// retires the temporary. It then reads the accumulator back (an explicit
// drain) and returns the retirement stats after the readback and the value
// read.
func retireLoop(t testing.TB, e *clientEnv, c *client.Client, n int) (retire.Stats, float32) {
	ctx := context.Background()
	s, _ := c.Stream(0, 0)
	acc := e.alloc(0, loopBatchBytes)
	defer e.b.MemFree(acc)
	if err := e.b.Memset(gpu.Memset{Dst: acc, ElemSize: 4, Count: loopElems}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		tmp := e.alloc(0, loopBatchBytes)
		e.launch(0, kernels.Fill, loopElems, s, gpu.Ptr(tmp), gpu.F32(1), gpu.I32(loopElems))
		e.launch(0, kernels.Axpy, loopElems, s, gpu.Ptr(acc), gpu.Ptr(tmp), gpu.F32(1), gpu.I32(loopElems))
		p, err := c.Submitted(0, 0)
		if err != nil {
			t.Fatal(err)
		}
		b := retire.Batch{{Bytes: loopBatchBytes, Release: func() error { return e.b.MemFree(tmp) }}}
		if err := c.Retire(ctx, 0, b, p); err != nil {
			t.Fatal(err)
		}
	}
	out := make([]byte, loopBatchBytes)
	if err := c.Readback(ctx, 0, out, acc); err != nil {
		t.Fatal(err)
	}
	st, err := c.RetireStats(0)
	if err != nil {
		t.Fatal(err)
	}
	return st, gpu.BytesToF32(out)[loopElems-1]
}

// TestClientCallbacksDrainedBeforeRelease: callbacks queued to the helper
// run, in order per stream, before Close releases the events and streams
// they touch.
func TestClientCallbacksDrainedBeforeRelease(t *testing.T) {
	e := newClientEnv(t, 1, streamcache.Options{})
	defer e.finish()
	gate := make(chan struct{})
	e.load(0, gateModule(gate))
	c := e.open(client.Options{StreamsPerDevice: 2})
	const n = 64
	x, y := e.alloc(0, 4*n), e.alloc(0, 4*n)
	defer e.b.MemFree(x)
	defer e.b.MemFree(y)
	s1, _ := c.Stream(0, 1)
	var mu sync.Mutex
	var order []int
	var errs []error
	for i := 0; i < 5; i++ {
		e.launch(0, "gated_copy", n, s1, gpu.Ptr(y), gpu.Ptr(x), gpu.I32(n))
		if err := c.After(0, 1, func(err error) {
			mu.Lock()
			defer mu.Unlock()
			order = append(order, i)
			errs = append(errs, err)
		}); err != nil {
			t.Fatal(err)
		}
	}
	// A callback on an idle stream runs promptly.
	ran := make(chan struct{})
	if err := c.After(0, 0, func(error) { close(ran) }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("callback on an idle stream never ran")
	}
	closed := make(chan error)
	go func() { closed <- c.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while its stream's work was gated", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(gate)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(order) != "[0 1 2 3 4]" {
		t.Fatalf("callbacks ran in order %v before Close returned", order)
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if live := e.b.LiveHandles(); live.Events != 0 {
		t.Fatalf("events left: %v", live)
	}
	if err := c.After(0, 0, func(error) {}); !errors.Is(err, client.ErrClosed) {
		t.Fatalf("After on a closed client: %v", err)
	}
}

// TestClientStalledTimeline: a timeline that never advances (a hung GPU)
// makes the bounded wait time out with gpu.ErrTimeout and never frees a
// batch early; Close, having synchronized the streams, reports the stall and
// releases everything.
func TestClientStalledTimeline(t *testing.T) {
	e := newClientEnv(t, 1, streamcache.Options{})
	defer e.finish()
	c := e.open(client.Options{Retire: retire.Options{MaxPending: 1, WaitDeadline: 20 * time.Millisecond}})
	e.b.StallTimeline(true)
	var released atomic.Int32
	item := func() retire.Batch {
		return retire.Batch{{Bytes: 8, Release: func() error { released.Add(1); return nil }}}
	}
	ctx := context.Background()
	p1, err := c.Submitted(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Retire(ctx, 0, item(), p1); err != nil {
		t.Fatal(err)
	}
	p2, _ := c.Submitted(0, 0)
	start := time.Now()
	if err := c.Retire(ctx, 0, item(), p2); !errors.Is(err, gpu.ErrTimeout) {
		t.Fatalf("Retire past the bound on a stalled timeline = %v, want ErrTimeout", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("the bounded wait took %v with a 20ms deadline", el)
	}
	if released.Load() != 0 {
		t.Fatal("a batch was released although the timeline never passed it")
	}
	if err := c.Retire(ctx, 0, item(), p2+1); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Fatalf("Retire at a point never signalled = %v", err)
	}
	err = c.Close()
	if !errors.Is(err, gpu.ErrIllegalState) {
		t.Fatalf("Close on a stalled timeline = %v, want the stall reported", err)
	}
	if released.Load() != 2 {
		t.Fatalf("Close released %d batches, want 2", released.Load())
	}
}

// TestClientErrorPathsRelease fails the Nth call of each driver entry point
// the client uses, for N = 0, 1, ... until the scenario runs clean, and
// checks that every injected failure is reported and that nothing is left
// live (docs/ARCHITECTURE.md rule 2).
func TestClientErrorPathsRelease(t *testing.T) {
	ops := []string{
		"StreamCreate", "StreamQuery", "StreamSynchronize", "StreamDestroy", "StreamWaitEvent",
		"EventCreate", "EventRecord", "EventQuery", "EventDestroy",
		"HostAlloc", "HostFree", "StreamWriteValue64", "MemcpyDtoHAsync", "MemFree",
	}
	// A failed destroy or free leaves its handle live by definition; the
	// error must still be reported.
	leaks := map[string]bool{"StreamDestroy": true, "EventDestroy": true, "HostFree": true, "MemFree": true}
	for _, op := range ops {
		t.Run(op, func(t *testing.T) {
			for nth := 0; nth < 50; nth++ {
				fired, err := clientScenario(t, op, nth, leaks[op])
				if !fired {
					if err != nil {
						t.Fatalf("clean run: %v", err)
					}
					return
				}
				if !errors.Is(err, gpu.ErrInjected) {
					t.Fatalf("call %d of %s failed but no error reported it (got %v)", nth, op, err)
				}
			}
			t.Fatalf("%s: still failing after 50 calls", op)
		})
	}
}

// clientScenario opens a client on two streams, submits work on stream 1
// with a callback, retires a buffer, reads back and closes, with call nth of
// op failing (counted from the open). It returns whether the injection fired and every error seen.
func clientScenario(t *testing.T, op string, nth int, mayLeak bool) (bool, error) {
	// One idle stream per key: Close caches one stream and destroys the
	// other, so StreamDestroy is on the path too.
	e := newClientEnv(t, 1, streamcache.Options{MaxIdlePerKey: 1})
	ctx := context.Background()
	const n = 64
	acc := e.alloc(0, 4*n)
	x := e.alloc(0, 4*n)
	e.b.InjectFault(op, nth, nil)
	before := e.b.Calls(op)

	var errs []error
	note := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	xOwned := true // the test still owns x (not handed to a queue)
	xfree := func() error { return e.b.MemFree(x) }
	run := func() {
		c, err := client.Open(e.b, client.Options{StreamsPerDevice: 2, StreamCache: e.cache})
		if err != nil {
			note(err)
			return
		}
		var cbErr error
		defer func() {
			note(c.Close())
			note(cbErr) // Close ran every callback
		}()
		s1, _ := c.Stream(0, 1)
		note(e.b.LaunchKernel(e.funcs[0][kernels.Fill], kernels.Elementwise(n), []gpu.Arg{gpu.Ptr(x), gpu.F32(2), gpu.I32(n)}, s1))
		note(c.After(0, 1, func(err error) { cbErr = err }))
		p, err := c.Submitted(0, 1)
		note(err)
		if p == 0 {
			return // not on the timeline: freed after Close synchronized
		}
		err = c.Retire(ctx, 0, retire.Batch{{Bytes: 4 * n, Release: xfree}}, p)
		if !errors.Is(err, client.ErrClosed) && !errors.Is(err, gpu.ErrInvalidValue) {
			xOwned = false // taken, even with an error
		}
		note(err)
		out := make([]byte, 4*n)
		note(c.Readback(ctx, 0, out, acc))
	}
	run()
	fired := e.b.Calls(op) > before+nth
	e.b.ClearFaults()
	if xOwned {
		note(xfree())
	}
	note(e.b.MemFree(acc))
	for _, m := range e.mods {
		note(e.b.ModuleUnload(m))
	}
	note(e.cache.Purge(e.b))
	if live := e.b.LiveHandles(); !live.IsZero() && !mayLeak {
		t.Errorf("%s call %d failed: handles left live: %v (errors: %v)", op, nth, live, errors.Join(errs...))
	}
	_ = e.b.Close() // reports what a failed destroy leaked
	return fired, errors.Join(errs...)
}

func TestClientConcurrentUse(t *testing.T) {
	e := newClientEnv(t, 2, streamcache.Options{})
	defer e.finish()
	c := e.open(client.Options{StreamsPerDevice: 3})
	ctx := context.Background()
	var wg sync.WaitGroup
	var callbacks atomic.Int32
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dev, idx := g%2, g%3
			s, _ := c.Stream(dev, idx)
			for i := 0; i < 50; i++ {
				tmp, err := e.b.MemAlloc(dev, 256)
				if err != nil {
					t.Error(err)
					return
				}
				if err := e.b.LaunchKernel(e.funcs[dev][kernels.Fill], kernels.Elementwise(64), []gpu.Arg{gpu.Ptr(tmp), gpu.F32(1), gpu.I32(64)}, s); err != nil {
					t.Error(err)
					return
				}
				p, err := c.Submitted(dev, idx)
				if err != nil {
					t.Error(err)
					return
				}
				if err := c.Retire(ctx, dev, retire.Batch{{Bytes: 256, Release: func() error { return e.b.MemFree(tmp) }}}, p); err != nil {
					t.Error(err)
					return
				}
				if i%10 == 0 {
					if err := c.After(dev, idx, func(err error) {
						if err != nil {
							t.Error(err)
						}
						callbacks.Add(1)
					}); err != nil {
						t.Error(err)
					}
				}
				if i%17 == 0 {
					if err := c.Synchronize(ctx); err != nil {
						t.Error(err)
					}
				}
			}
		}()
	}
	wg.Wait()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if callbacks.Load() != 30 {
		t.Fatalf("%d callbacks ran, want 30", callbacks.Load())
	}
}

// BenchmarkClientOpenClose measures a client open/close cycle with 16
// streams on each of 2 sim devices, taking streams from a cache and, for
// comparison, creating and destroying them every time.
func BenchmarkClientOpenClose(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts streamcache.Options
	}{
		{"cache", streamcache.Options{}},
		{"nocache", streamcache.Options{MaxIdlePerKey: -1}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			e := newClientEnv(b, 2, bc.opts)
			defer e.finish()
			opts := client.Options{StreamsPerDevice: 16, StreamCache: e.cache}
			b.ReportAllocs()
			for b.Loop() {
				c, err := client.Open(e.b, opts)
				if err != nil {
					b.Fatal(err)
				}
				if err := c.Close(); err != nil {
					b.Fatal(err)
				}
			}
			st := e.cache.Stats()
			b.ReportMetric(float64(st.Hits)/float64(max(st.Hits+st.Misses, 1)), "hit-ratio")
		})
	}
}

// BenchmarkClientRetireLoop runs the asynchronous loop of 10 000
// submissions that each free a buffer, and reports the peak of pending
// bytes and the share of batches released by polling (the rest by the
// bounded wait, or by the final drain).
func BenchmarkClientRetireLoop(b *testing.B) {
	e := newClientEnv(b, 1, streamcache.Options{})
	defer e.finish()
	const n = 10000
	var peak uint64
	var poll, total uint64
	iters := 0
	for b.Loop() {
		iters++
		c := e.open(client.Options{})
		st, _ := retireLoop(b, e, c, n)
		if err := c.Close(); err != nil {
			b.Fatal(err)
		}
		peak = max(peak, st.PeakPendingBytes)
		poll += st.ReleasedByPoll
		total += st.Released()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(iters*n), "ns/submission")
	b.ReportMetric(float64(peak), "peak-pending-B")
	b.ReportMetric(float64(poll)/float64(max(total, 1)), "poll-share")
}

// TestClientCloseHonoursDeadline: with a stream stuck on the device, Close
// returns at its own wait deadline (Options.Retire.WaitDeadline), saying
// which device it could not release and keeping it whole (the device may
// still use its timeline and streams), and a later Close, once the device
// is done, releases it: nothing is left live. A call stuck in progress
// (Synchronize on the stuck stream) holds Close off only until the
// deadline too, and new calls fail at once.
func TestClientCloseHonoursDeadline(t *testing.T) {
	for _, stuckCall := range []bool{false, true} {
		t.Run(fmt.Sprintf("call-in-progress=%v", stuckCall), func(t *testing.T) {
			e := newClientEnv(t, 1, streamcache.Options{})
			defer e.finish()
			gate := make(chan struct{})
			e.load(0, gateModule(gate))
			const deadline = 150 * time.Millisecond
			c := e.open(client.Options{Retire: retire.Options{WaitDeadline: deadline}})
			s, err := c.Stream(0, 0)
			if err != nil {
				t.Fatal(err)
			}
			x, y := e.alloc(0, 64), e.alloc(0, 64)
			defer func() {
				for _, p := range []gpu.DevicePtr{x, y} {
					if err := e.b.MemFree(p); err != nil {
						t.Error(err)
					}
				}
			}()
			e.launch(0, "gated_copy", 16, s, gpu.Ptr(y), gpu.Ptr(x), gpu.I32(16))
			if _, err := c.Submitted(0, 0); err != nil {
				t.Fatal(err)
			}
			syncDone := make(chan error, 1)
			if stuckCall {
				go func() { syncDone <- c.Synchronize(context.Background()) }()
				time.Sleep(20 * time.Millisecond) // let it enter
			}
			start := time.Now()
			closed := make(chan error, 1)
			go func() { closed <- c.Close() }()
			select {
			case err = <-closed:
			case <-time.After(deadline + 5*time.Second):
				close(gate) // let the device and the test finish
				t.Fatalf("Close still waiting %v after its deadline of %v", 5*time.Second, deadline)
			}
			took := time.Since(start)
			if err == nil {
				t.Fatal("Close with a stuck stream reported nothing")
			}
			if took > deadline+2*time.Second {
				t.Fatalf("Close took %v with a wait deadline of %v", took, deadline)
			}
			want := "still busy"
			if stuckCall {
				want = "calls still in progress"
			}
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("Close error %q does not say %q", err, want)
			}
			if _, err := c.Stream(0, 0); !errors.Is(err, client.ErrClosed) {
				t.Fatalf("a call after Close began: %v, want ErrClosed", err)
			}
			close(gate)
			if stuckCall {
				if err := <-syncDone; err != nil {
					t.Fatalf("the Synchronize in progress: %v", err)
				}
			}
			if err := c.Close(); err != nil {
				t.Fatalf("second Close, the device done: %v", err)
			}
			if err := c.Close(); err != nil {
				t.Fatalf("third Close: %v", err)
			}
		})
	}
}
