package gputest

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

// Seed, when nonzero, seeds the random inputs of the kernel and copy tests;
// when zero a seed is drawn from the clock. The seed used is logged by every
// test that draws random numbers, so a failure can be replayed by setting
// Seed before calling Run.
var Seed uint64

// A test is one subtest of the suite. Most take a harness (run); the few
// that manage the backend's life themselves take the opener (raw).
type test struct {
	name string
	run  func(h *h)
	raw  func(t *testing.T, open opener)
}

type group struct {
	name  string
	tests []test
}

type opener = func(t *testing.T) gpu.Backend

// suite is the whole conformance suite, in run order. The coverage table
// (coverage.go) names its subtests as "Group/Test" or "Group".
func suite() []group {
	return []group{
		{"Devices", devicesTests},
		{"Streams", streamsTests},
		{"Events", eventsTests},
		{"Memory", memoryTests},
		{"VirtualMemory", vmmTests},
		{"HostMemory", hostMemTests},
		{"Modules", moduleTests},
		{"Kernels", kernelTests()},
		{"Graphs", graphTests},
		{"Capture", captureTests},
		{"ExecUpdate", execUpdateTests},
		{"Extents", extentTests},
		{"DeviceUpdates", devUpdateTests},
		{"StreamWaits", streamWaitTests},
		{"Faults", faultTests},
		{"Lifecycle", lifecycleTests},
	}
}

// Run runs the conformance suite against the backend that open returns. Each
// subtest opens a fresh backend, releases everything it created, checks that
// the backend's live-handle counters (gpu.HandleCounter) are back to zero and
// closes it. open must return a backend with at least one device, or call
// t.Skip/t.Fatal; it must not close the backend itself.
//
// Run hands the tests a wrapper that notes which methods each subtest calls;
// at the end it checks the coverage table (coverage.go) against those calls,
// for the subtests that ran and passed.
func Run(t *testing.T, open func(t *testing.T) gpu.Backend) {
	log := newCallLog()
	for _, g := range suite() {
		t.Run(g.name, func(t *testing.T) {
			runGroup(t, g, open, log)
		})
	}
	log.check(t)
}

// Kernels runs only the kernel tests: every kernel of kernels.Specs() on
// random inputs, checked against its Go reference.
func Kernels(t *testing.T, open func(t *testing.T) gpu.Backend) {
	runGroup(t, group{"Kernels", kernelTests()}, open, nil)
}

func runGroup(t *testing.T, g group, open opener, log *callLog) {
	for _, c := range g.tests {
		t.Run(c.name, func(t *testing.T) {
			note := log.subtest(t, g.name+"/"+c.name)
			if c.raw != nil {
				c.raw(t, func(t *testing.T) gpu.Backend { return wrap(open(t), note) })
				return
			}
			c.run(newH(t, open, note))
		})
	}
}

// wrap returns b behind a recorder calling note, or b when note is nil.
func wrap(b gpu.Backend, note func(string)) gpu.Backend {
	if note == nil || b == nil {
		return b
	}
	return &recorder{b: b, note: note}
}

// unwrap returns the backend behind a recorder.
func unwrap(b gpu.Backend) gpu.Backend {
	if r, ok := b.(*recorder); ok {
		return r.b
	}
	return b
}

// callLog notes the methods each subtest calls, and which subtests failed
// or were skipped.
type callLog struct {
	mu     sync.Mutex
	calls  map[string]map[string]bool // "Group/Test" -> methods
	failed map[string]bool            // failed or skipped: not checked
}

func newCallLog() *callLog {
	return &callLog{calls: map[string]map[string]bool{}, failed: map[string]bool{}}
}

// subtest starts logging for subtest name and returns its note function.
func (l *callLog) subtest(t *testing.T, name string) func(string) {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	l.calls[name] = map[string]bool{}
	l.mu.Unlock()
	t.Cleanup(func() { // registered first, so it runs after the leak check
		if t.Failed() || t.Skipped() {
			l.mu.Lock()
			l.failed[name] = true
			l.mu.Unlock()
		}
	})
	return func(method string) {
		l.mu.Lock()
		l.calls[name][method] = true
		l.mu.Unlock()
	}
}

// check reports coverage-table entries whose subtests ran and passed
// without calling the method: the table (not the backend) is then wrong.
func (l *callLog) check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range slices.Sorted(maps.Keys(coverage)) {
		l.checkMethod(t, m, coverage[m])
	}
	for _, m := range slices.Sorted(maps.Keys(devUpdateCoverage)) {
		l.checkMethod(t, m, devUpdateCoverage[m])
	}
	for _, m := range slices.Sorted(maps.Keys(streamWaitCoverage)) {
		l.checkMethod(t, m, streamWaitCoverage[m])
	}
}

// checkMethod checks that every subtest in tests that ran and passed called
// method m.
func (l *callLog) checkMethod(t *testing.T, m string, tests []string) {
	t.Helper()
	for _, want := range tests {
		ran, called := false, false
		for name, ms := range l.calls {
			if name != want && !strings.HasPrefix(name, want+"/") {
				continue
			}
			if l.failed[name] {
				ran = false // a failed or skipped test may have stopped early
				break
			}
			ran, called = true, called || ms[m]
		}
		if ran && !called {
			t.Errorf("gputest coverage table (coverage.go): %s is listed as covering %s but never called it", want, m)
		}
	}
}

// OpenChecked opens a backend with open and registers a cleanup that, after
// every cleanup registered later has run (so after the test released what it
// made), asserts that every live-handle counter is zero (when the backend
// implements gpu.HandleCounter) and that Close returns nil. Tests of other
// packages can use it to get the same leak check.
func OpenChecked(t *testing.T, open func(t *testing.T) gpu.Backend) gpu.Backend {
	t.Helper()
	b := open(t)
	if b == nil {
		t.Fatal("gputest: open returned a nil backend")
	}
	t.Cleanup(func() {
		if c, ok := gpu.LiveHandles(b); ok && !c.IsZero() {
			t.Errorf("leak: live handles at the end of the test: %v", c)
		}
		if err := b.Close(); err != nil {
			t.Errorf("Close with nothing live: %v", err)
		}
	})
	return b
}

// h is the harness a subtest works with: the backend, the handles the test
// made (released at the end, newest first, whatever happened), and helpers
// that fail the test on unexpected errors.
type h struct {
	*testing.T
	b   gpu.Backend // what the tests call: raw, maybe behind a recorder
	raw gpu.Backend // the backend open returned, for its optional interfaces
	// vm and mo are raw's virtual memory and stream memory operations
	// (behind recorders too), set by vmm and streamMemOps: nil until a
	// test asked for them, and when the device lacks them (the test then
	// skipped).
	vm    gpu.VirtualMemory
	mo    gpu.StreamMemOps
	live  []*res
	mods  map[int]gpu.Module
	fns   map[string]gpu.Function
	rng   *rand.Rand
	reset bool         // a device was reset: releases may find handles already gone
	note  func(string) // notes a call for the coverage check (nil: none)
}

// res is one handle the test owns.
type res struct {
	key     string
	release func() error
	stream  gpu.Stream // nonzero for streams: synchronized before anything is released
	done    bool
}

func newH(t *testing.T, open opener, note func(string)) *h {
	raw := OpenChecked(t, open)
	x := &h{T: t, b: wrap(raw, note), raw: raw, mods: map[int]gpu.Module{}, fns: map[string]gpu.Function{}, note: note}
	t.Cleanup(x.releaseAll)
	return x
}

// releaseAll synchronizes every live stream, then releases every live handle,
// newest first (execs before graphs, mappings before chunks).
func (h *h) releaseAll() {
	for _, r := range h.live {
		if !r.done && r.stream != 0 {
			_ = h.b.StreamSynchronize(r.stream) // errors were the test's business
		}
	}
	for i := len(h.live) - 1; i >= 0; i-- {
		r := h.live[i]
		if r.done {
			continue
		}
		r.done = true
		if err := r.release(); err != nil && !(h.reset && errors.Is(err, gpu.ErrInvalidHandle)) {
			h.Errorf("cleanup: release %s: %v", r.key, err)
		}
	}
}

func (h *h) track(key string, stream gpu.Stream, release func() error) {
	h.live = append(h.live, &res{key: key, release: release, stream: stream})
}

func (h *h) find(key string) *res {
	for i := len(h.live) - 1; i >= 0; i-- {
		if r := h.live[i]; r.key == key && !r.done {
			return r
		}
	}
	return nil
}

// forget marks a handle the test released itself (to check the release).
func (h *h) forget(key string) {
	if r := h.find(key); r != nil {
		r.done = true
	}
}

// release releases a tracked handle now and expects success.
func (h *h) release(key string) {
	h.Helper()
	r := h.find(key)
	if r == nil {
		h.Fatalf("release %s: not live", key)
	}
	r.done = true
	if err := r.release(); err != nil {
		h.Fatalf("release %s: %v", key, err)
	}
}

func key(kind string, v uint64) string { return fmt.Sprintf("%s %#x", kind, v) }

func streamKey(s gpu.Stream) string     { return key("stream", uint64(s)) }
func eventKey(e gpu.Event) string       { return key("event", uint64(e)) }
func memKey(p gpu.DevicePtr) string     { return key("mem", uint64(p)) }
func hostKey(a gpu.HostAlloc) string    { return key("host", uint64(a)) }
func chunkKey(c gpu.PhysMem) string     { return key("chunk", uint64(c)) }
func reserveKey(p gpu.DevicePtr) string { return key("reservation", uint64(p)) }
func mapKey(p gpu.DevicePtr) string     { return key("mapping", uint64(p)) }
func moduleKey(m gpu.Module) string     { return key("module", uint64(m)) }
func graphKey(g gpu.Graph) string       { return key("graph", uint64(g)) }
func execKey(x gpu.GraphExec) string    { return key("exec", uint64(x)) }

// random returns the test's random source, seeded from Seed or the clock;
// the seed is logged.
func (h *h) random() *rand.Rand {
	if h.rng == nil {
		h.rng = newRand(h.T)
	}
	return h.rng
}

func newRand(t *testing.T) *rand.Rand {
	seed := Seed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("random seed %d (set gputest.Seed to replay)", seed)
	return rand.New(rand.NewPCG(seed, 0x5eed))
}

// ---- error checks ----

var sentinels = []error{
	gpu.ErrUnavailable, gpu.ErrNotSupported, gpu.ErrOutOfMemory, gpu.ErrInvalidValue,
	gpu.ErrInvalidHandle, gpu.ErrIllegalState, gpu.ErrIllegalAddress, gpu.ErrCaptureInvalidated,
	gpu.ErrGraphUpdate, gpu.ErrNotReady, gpu.ErrNotFound, gpu.ErrTimeout, gpu.ErrDeviceLost,
	gpu.ErrInjected,
}

// checkShape reports errors that wrap none of the gpu sentinels, which the
// gpu package requires of every backend error.
func (h *h) checkShape(what string, err error) {
	h.Helper()
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return
		}
	}
	h.Errorf("%s: error %q (%T) wraps none of the gpu sentinels", what, err, err)
}

// ok fails the test now when err is not nil.
func (h *h) ok(what string, err error) {
	h.Helper()
	if err != nil {
		h.Fatalf("%s: %v", what, err)
	}
}

// wantErr checks that err wraps one of targets (any error when none is
// given).
func (h *h) wantErr(what string, err error, targets ...error) bool {
	h.Helper()
	if err == nil {
		if len(targets) == 0 {
			h.Errorf("%s: got nil, want an error", what)
		} else {
			h.Errorf("%s: got nil, want an error wrapping %v", what, targets)
		}
		return false
	}
	h.checkShape(what, err)
	if len(targets) == 0 || slices.ContainsFunc(targets, func(t error) bool { return errors.Is(err, t) }) {
		return true
	}
	h.Errorf("%s: got %v, want an error wrapping %v", what, err, targets)
	return false
}

// counters returns the backend's live-handle counters, and false when it
// does not count them.
func (h *h) counters() (gpu.HandleCounts, bool) { return gpu.LiveHandles(h.raw) }

// wantCounters checks that the counters equal before changed by edit (when
// the backend counts handles).
func (h *h) wantCounters(what string, before gpu.HandleCounts, edit func(c *gpu.HandleCounts)) {
	h.Helper()
	now, ok := h.counters()
	if !ok {
		return
	}
	want := before
	if edit != nil {
		edit(&want)
	}
	if now != want {
		h.Errorf("%s: live handles %v, want %v", what, now, want)
	}
}

// ---- handle helpers: create, track, fail on error ----

func (h *h) stream(dev int) gpu.Stream {
	h.Helper()
	s, err := h.b.StreamCreate(dev, gpu.StreamNonBlocking, 0)
	h.ok(fmt.Sprintf("StreamCreate(%d)", dev), err)
	h.track(streamKey(s), s, func() error { return h.b.StreamDestroy(s) })
	return s
}

func (h *h) event(dev int, flags gpu.EventFlags) gpu.Event {
	h.Helper()
	e, err := h.b.EventCreate(dev, flags)
	h.ok(fmt.Sprintf("EventCreate(%d, %d)", dev, flags), err)
	h.track(eventKey(e), 0, func() error { return h.b.EventDestroy(e) })
	return e
}

func (h *h) alloc(dev int, size uint64) gpu.DevicePtr {
	h.Helper()
	p, err := h.b.MemAlloc(dev, size)
	h.ok(fmt.Sprintf("MemAlloc(%d, %d)", dev, size), err)
	if p == 0 {
		h.Fatalf("MemAlloc(%d, %d) returned the null pointer", dev, size)
	}
	h.track(memKey(p), 0, func() error { return h.b.MemFree(p) })
	return p
}

// upload allocates len(b) bytes on dev and copies b there.
func (h *h) upload(dev int, b []byte) gpu.DevicePtr {
	h.Helper()
	p := h.alloc(dev, uint64(len(b)))
	h.ok("MemcpyHtoD", h.b.MemcpyHtoD(p, b))
	return p
}

func (h *h) uploadF32(dev int, v []float32) gpu.DevicePtr {
	h.Helper()
	return h.upload(dev, gpu.F32ToBytes(v))
}

func (h *h) download(p gpu.DevicePtr, n int) []byte {
	h.Helper()
	b := make([]byte, n)
	h.ok(fmt.Sprintf("MemcpyDtoH(%#x, %d)", uint64(p), n), h.b.MemcpyDtoH(b, p))
	return b
}

func (h *h) downloadF32(p gpu.DevicePtr, n int) []float32 {
	h.Helper()
	return gpu.BytesToF32(h.download(p, 4*n))
}

// setF32 writes v to every one of the n float32 values at p, synchronously.
func (h *h) setF32(p gpu.DevicePtr, v float32, n int) {
	h.Helper()
	h.ok("Memset", h.b.Memset(f32Memset(p, v, n)))
}

func f32Memset(p gpu.DevicePtr, v float32, n int) gpu.Memset {
	return gpu.Memset{Dst: p, Value: gpu.F32(v).AsU32(), ElemSize: 4, Count: uint64(n)}
}

func (h *h) sync(s gpu.Stream) {
	h.Helper()
	h.ok("StreamSynchronize", h.b.StreamSynchronize(s))
}

func (h *h) graph(dev int) gpu.Graph {
	h.Helper()
	g, err := h.b.GraphCreate(dev)
	h.ok("GraphCreate", err)
	h.trackGraph(g)
	return g
}

func (h *h) trackGraph(g gpu.Graph) {
	h.track(graphKey(g), 0, func() error { return h.b.GraphDestroy(g) })
}

func (h *h) instantiate(g gpu.Graph) gpu.GraphExec {
	h.Helper()
	x, err := h.b.GraphInstantiate(g)
	h.ok("GraphInstantiate", err)
	h.track(execKey(x), 0, func() error { return h.b.GraphExecDestroy(x) })
	return x
}

func (h *h) launchGraph(x gpu.GraphExec, s gpu.Stream) {
	h.Helper()
	h.ok("GraphLaunch", h.b.GraphLaunch(x, s))
	h.sync(s)
}

// module returns the built-in kernel module loaded on dev, skipping the test
// when the backend cannot load it.
func (h *h) module(dev int) gpu.Module {
	h.Helper()
	if m, ok := h.mods[dev]; ok {
		return m
	}
	m, err := h.b.ModuleLoad(dev, kernels.Module())
	if errors.Is(err, gpu.ErrNotSupported) {
		h.Skipf("ModuleLoad of the built-in kernels: %v", err)
	}
	h.ok("ModuleLoad", err)
	h.mods[dev] = m
	h.track(moduleKey(m), 0, func() error { return h.b.ModuleUnload(m) })
	return m
}

// fn returns the built-in kernel name on dev.
func (h *h) fn(dev int, name string) gpu.Function {
	h.Helper()
	k := fmt.Sprintf("%d/%s", dev, name)
	if f, ok := h.fns[k]; ok {
		return f
	}
	f, err := h.b.ModuleFunction(h.module(dev), name)
	h.ok("ModuleFunction("+name+")", err)
	h.fns[k] = f
	return f
}

// fillParams is sg_fill over n float32 values at p.
func (h *h) fillParams(dev int, p gpu.DevicePtr, v float32, n int) gpu.KernelParams {
	h.Helper()
	return gpu.KernelParams{Func: h.fn(dev, kernels.Fill), Config: kernels.Elementwise(n),
		Args: []gpu.Arg{gpu.Ptr(p), gpu.F32(v), gpu.I32(int32(n))}}
}

// axpbParams is sg_axpb: y = a*x + b over n values.
func (h *h) axpbParams(dev int, y, x gpu.DevicePtr, a, b float32, n int) gpu.KernelParams {
	h.Helper()
	return gpu.KernelParams{Func: h.fn(dev, kernels.Axpb), Config: kernels.Elementwise(n),
		Args: []gpu.Arg{gpu.Ptr(y), gpu.Ptr(x), gpu.F32(a), gpu.F32(b), gpu.I32(int32(n))}}
}

func (h *h) launch(p gpu.KernelParams, s gpu.Stream) {
	h.Helper()
	h.ok("LaunchKernel", h.b.LaunchKernel(p.Func, p.Config, p.Args, s))
}

// busy enqueues kernels on s (device dev) until a StreamQuery right after
// enqueueing reports the stream busy, doubling the work each round, and
// reports whether it saw it busy. The stream is left running that work. It
// gives up after busyBudget, so a backend whose streams never look busy
// costs seconds, not minutes.
func (h *h) busy(dev int, s gpu.Stream) bool {
	h.Helper()
	const maxElems = 4 << 20 // 16 MiB of float32
	buf := h.alloc(dev, 4*maxElems)
	start := time.Now()
	for n, launches := 1<<16, 4; n <= maxElems && time.Since(start) < busyBudget; n, launches = 2*n, 2*launches {
		for i := range min(launches, 64) {
			h.launch(h.fillParams(dev, buf, float32(i), n), s)
		}
		idle, err := h.b.StreamQuery(s)
		h.ok("StreamQuery", err)
		if !idle {
			return true
		}
		h.sync(s) // instant if the query was right; bounds the work if not
	}
	h.Logf("stream %#x never seen busy after %v of enqueueing fills of up to %d MiB", uint64(s), time.Since(start), maxElems*4>>20)
	return false
}

// busyBudget bounds the time busy spends trying to make a stream busy.
const busyBudget = 2 * time.Second

// wantAllF32 checks that every value of got is want.
func (h *h) wantAllF32(what string, got []float32, want float32) {
	h.Helper()
	for i, g := range got {
		if g != want {
			h.Errorf("%s: [%d] = %v, want %v (all %d values)", what, i, g, want, len(got))
			return
		}
	}
}

// wantF32 checks got against want exactly.
func (h *h) wantF32(what string, got, want []float32) {
	h.Helper()
	if len(got) != len(want) {
		h.Errorf("%s: %d values, want %d", what, len(got), len(want))
		return
	}
	for i := range got {
		if got[i] != want[i] {
			h.Errorf("%s: [%d] = %v, want %v", what, i, got[i], want[i])
			return
		}
	}
}

// props returns DeviceProps(dev) or fails.
func (h *h) props(dev int) gpu.DeviceProps {
	h.Helper()
	p, err := h.b.DeviceProps(dev)
	h.ok(fmt.Sprintf("DeviceProps(%d)", dev), err)
	return p
}

// needDevices skips the test when the backend has fewer than n devices.
func (h *h) needDevices(n int) {
	h.Helper()
	if c := h.b.DeviceCount(); c < n {
		h.Skipf("needs %d devices, backend has %d", n, c)
	}
}

// vmm sets h.vm and returns dev's granularity, skipping the test when the
// backend or dev has no VMM.
func (h *h) vmm(dev int) uint64 {
	h.Helper()
	vm, gran, err := h.vmOf(dev)
	if errors.Is(err, gpu.ErrNotSupported) {
		h.Skipf("virtual memory: %v", err)
	}
	h.ok("VirtualMemoryOf", err)
	h.vm = vm
	return gran
}

// vmOf is gpu.VirtualMemoryOf of the raw backend, behind a recorder for the
// coverage check (the look-up asks AllocationGranularity).
func (h *h) vmOf(dev int) (gpu.VirtualMemory, uint64, error) {
	vm, gran, err := gpu.VirtualMemoryOf(h.raw, dev)
	if err != nil || h.note == nil {
		return vm, gran, err
	}
	h.note("AllocationGranularity")
	return &vmRecorder{b: vm, note: h.note}, gran, nil
}

// memOpsOf is gpu.StreamMemOpsOf of the raw backend, behind a recorder for
// the coverage check (the look-up asks StreamMemOpsSupported).
func (h *h) memOpsOf(dev int) (gpu.StreamMemOps, error) {
	mo, err := gpu.StreamMemOpsOf(h.raw, dev)
	if err != nil || h.note == nil {
		return mo, err
	}
	h.note("StreamMemOpsSupported")
	return &memOpsRecorder{b: mo, note: h.note}, nil
}

func (h *h) chunk(dev int, size uint64) gpu.PhysMem {
	h.Helper()
	c, err := h.vm.MemCreate(dev, size)
	h.ok(fmt.Sprintf("MemCreate(%d, %d)", dev, size), err)
	h.track(chunkKey(c), 0, func() error { return h.vm.MemRelease(c) })
	return c
}

func (h *h) reserve(size, align uint64) gpu.DevicePtr {
	h.Helper()
	p, err := h.vm.MemAddressReserve(size, align)
	h.ok(fmt.Sprintf("MemAddressReserve(%d, %d)", size, align), err)
	h.track(reserveKey(p), 0, func() error { return h.vm.MemAddressFree(p, size) })
	return p
}

func (h *h) mapAt(p gpu.DevicePtr, size, off uint64, c gpu.PhysMem) {
	h.Helper()
	h.ok(fmt.Sprintf("MemMap(%#x, %d, %d)", uint64(p), size, off), h.vm.MemMap(p, size, off, c))
	h.track(mapKey(p), 0, func() error { return h.vm.MemUnmap(p, size) })
}

// mapped creates a chunk of size bytes on dev, reserves a range, maps the
// chunk there and grants dev access.
func (h *h) mapped(dev int, size uint64) (gpu.DevicePtr, gpu.PhysMem) {
	h.Helper()
	c := h.chunk(dev, size)
	p := h.reserve(size, 0)
	h.mapAt(p, size, 0, c)
	h.ok("MemSetAccess", h.vm.MemSetAccess(p, size, []int{dev}))
	return p, c
}

// eventually polls cond with backoff until it holds or the deadline passes.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	wait := 10 * time.Microsecond
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(wait)
		wait = min(2*wait, 10*time.Millisecond)
	}
	return true
}
