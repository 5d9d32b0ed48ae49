package sim

import (
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/stablegraph/stablegraph/gpu"
)

// Granularity is the VMM granularity of every simulated device (as on an
// H100): chunk sizes, mapping offsets and reservation addresses are
// multiples of it.
const Granularity = 2 << 20

// maxDevices bounds Config.Devices: per-mapping access is a 64-bit mask.
const maxDevices = 64

// maxAllocSize bounds one MemAlloc or MemCreate (its page table is
// allocated at once), maxHostSize one HostAlloc (Go memory, allocated at
// once): larger requests are gpu.ErrOutOfMemory instead of a crash of the
// Go runtime.
const (
	maxAllocSize = 1 << 40
	maxHostSize  = 1 << 36
)

// maxSharedMem is the largest dynamic shared memory of a launch (compute 9.0
// opt-in limit, 227 KiB).
const maxSharedMem = 227 << 10

func init() { gpu.Register("sim", driver{}) }

var (
	_ gpu.Backend       = (*Backend)(nil)
	_ gpu.HandleCounter = (*Backend)(nil)
)

type driver struct{}

func (driver) Open(cfg gpu.Config) (gpu.Backend, error) {
	b, err := New(configOf(cfg))
	if err != nil {
		return nil, err // not a typed nil inside the interface
	}
	return b, nil
}

// Priority is gpu.PrioritySimulator: "auto" takes the sim when no hardware
// backend opens.
func (driver) Priority() gpu.Priority { return gpu.PrioritySimulator }

// Backend is the simulated device backend. It is safe for concurrent use;
// graphs follow the serialisation rule of the gpu package doc.
//
// Lock order: Backend.mu, then exec.mu, then stream.mu. Nothing waits for a
// stream (synchronize, destroy, drain) while holding Backend.mu, because
// stream workers take Backend.mu for reading on every memory access.
type Backend struct {
	cfg     Config
	log     *slog.Logger
	devs    []device
	stall   atomic.Bool   // StallTimeline
	closed  atomic.Bool   // set once, under mu, by Close
	closing chan struct{} // closed by Close: workers drop remaining work
	workers sync.WaitGroup
	inj     injector
	coll    collState // communicators (collectives.go)
	blas    blasState // the GEMM library's kernels and workspaces (blas.go); guarded by mu

	// mu guards the handle tables and the address space. Page contents are
	// not guarded by it (see addrspace.go); kernels copy under mu.RLock so
	// that the mappings they resolved cannot go away mid-copy.
	mu struct {
		sync.RWMutex
		next    uint64 // last handle issued; handles of all kinds share it
		streams map[gpu.Stream]*stream
		events  map[gpu.Event]*event
		modules map[gpu.Module]*module
		funcs   map[gpu.Function]*function
		graphs  map[gpu.Graph]*graph
		nodes   map[gpu.GraphNode]*node
		execs   map[gpu.GraphExec]*exec
		as      addrSpace
		// devNodes resolves the DevNodes of device-updatable kernel
		// nodes (devupdate.go).
		devNodes map[gpu.DevNode]*node
	}
}

// device holds a device's sticky error: the first fault of its work, kept
// until ResetDevice.
type device struct {
	fault atomic.Pointer[stuck]
}

type stuck struct{ err error }

// New opens a simulated backend: cfg.Devices devices (at most 64) of
// cfg.DeviceMemory bytes each, zero fields taking Config's defaults.
func New(cfg Config) (*Backend, error) {
	cfg = cfg.withDefaults()
	if cfg.Devices > maxDevices {
		return nil, gpu.Errorf("New", gpu.ErrInvalidValue, "%d devices requested; the sim models at most %d", cfg.Devices, maxDevices)
	}
	b := &Backend{cfg: cfg, log: cfg.Logger, devs: make([]device, cfg.Devices), closing: make(chan struct{})}
	b.inj.calls = map[string]int{}
	b.coll.transport = cfg.Transport
	b.mu.streams = map[gpu.Stream]*stream{}
	b.mu.events = map[gpu.Event]*event{}
	b.mu.modules = map[gpu.Module]*module{}
	b.mu.funcs = map[gpu.Function]*function{}
	b.mu.graphs = map[gpu.Graph]*graph{}
	b.mu.nodes = map[gpu.GraphNode]*node{}
	b.mu.execs = map[gpu.GraphExec]*exec{}
	b.mu.devNodes = map[gpu.DevNode]*node{}
	b.mu.as.init(cfg.Devices)
	return b, nil
}

// ---- the one entry helper: call counting and fault injection ----

type injector struct {
	mu      sync.Mutex
	calls   map[string]int
	pending []injection
}

type injection struct {
	op  string
	at  int // call index (0-based, since New) that fails
	err error
}

// enter is the first thing every entry point does: it counts the call and
// fails it, before anything else happens, when a fault was injected for it.
func (b *Backend) enter(op string) error {
	b.inj.mu.Lock()
	n := b.inj.calls[op]
	b.inj.calls[op] = n + 1
	var hit *injection
	for i := range b.inj.pending {
		if in := b.inj.pending[i]; in.op == op && in.at == n {
			hit = &in
			b.inj.pending = append(b.inj.pending[:i], b.inj.pending[i+1:]...)
			break
		}
	}
	b.inj.mu.Unlock()
	if hit == nil {
		return nil
	}
	err := error(&gpu.Error{Op: op, Err: gpu.ErrInjected, Detail: fmt.Sprintf("call %d failed by InjectFault", n)})
	if hit.err != nil {
		err = errors.Join(err, hit.err)
	}
	return err
}

// entryPointTypes are the gpu interfaces the sim implements: their methods
// are the entry points InjectFault may fail.
var entryPointTypes = []reflect.Type{
	reflect.TypeFor[gpu.Backend](),
	reflect.TypeFor[gpu.VirtualMemory](),
	reflect.TypeFor[gpu.StreamMemOps](),
	reflect.TypeFor[gpu.Collectives](),
	reflect.TypeFor[gpu.DeviceUpdates](),
	reflect.TypeFor[gpu.StreamWaits](),
	reflect.TypeFor[gpu.GEMM](),
	reflect.TypeFor[gpu.GraphNodeReader](),
}

// isEntryPoint reports whether op is an entry point InjectFault can fail.
func isEntryPoint(op string) bool {
	if op == "ResetDevice" || op == "AddressRange" {
		return true
	}
	for _, t := range entryPointTypes {
		if _, ok := t.MethodByName(op); ok {
			return true
		}
	}
	return false
}

// InjectFault makes the nth call (0: the next one) of the entry point op,
// counted from now, fail before doing anything with an *gpu.Error wrapping
// gpu.ErrInjected, joined with err when err is not nil (so errors.Is finds
// both). op is the gpu interface method name ("MemCreate", "GraphLaunch",
// ...), "ResetDevice" or "AddressRange". Each injection fires once. Entry
// points without an error result (Name, DeviceCount) are counted but cannot
// fail.
func (b *Backend) InjectFault(op string, nth int, err error) {
	if !isEntryPoint(op) {
		b.log.Warn("sim: InjectFault for an entry point that does not exist; it will never fire", "op", op)
	}
	b.inj.mu.Lock()
	defer b.inj.mu.Unlock()
	b.inj.pending = append(b.inj.pending, injection{op: op, at: b.inj.calls[op] + max(nth, 0), err: err})
}

// ClearFaults drops every pending injected fault.
func (b *Backend) ClearFaults() {
	b.inj.mu.Lock()
	defer b.inj.mu.Unlock()
	b.inj.pending = nil
}

// Calls returns how many calls the entry point op has received since New,
// failed ones included. A test sweeps N = 0, 1, 2, ... with InjectFault(op,
// N) until its operation succeeds, so every error path runs once.
func (b *Backend) Calls(op string) int {
	b.inj.mu.Lock()
	defer b.inj.mu.Unlock()
	return b.inj.calls[op]
}

// StallTimeline makes stream value writes (StreamWriteValue64 and captured
// write nodes) complete without writing while stall is set, as on a hung
// GPU, so that deadline paths can be tested.
func (b *Backend) StallTimeline(stall bool) { b.stall.Store(stall) }

// ---- sticky device errors ----

// stick records err as dev's sticky error unless it already has one: the
// first fault wins, as on a GPU.
func (b *Backend) stick(dev int, err error) {
	if b.devs[dev].fault.CompareAndSwap(nil, &stuck{err}) {
		b.log.Debug("sim: device faulted; later work on it is skipped until ResetDevice", "device", dev, "err", err)
		b.abortCommsOf(dev, err) // its ranks will never arrive
	}
}

func (b *Backend) faulted(dev int) bool { return b.devs[dev].fault.Load() != nil }

// stickyErr returns dev's sticky error wrapped for op, or nil.
func (b *Backend) stickyErr(op string, dev int) error {
	f := b.devs[dev].fault.Load()
	if f == nil {
		return nil
	}
	return &gpu.Error{Op: op, Err: f.err, Detail: stickyDetail(dev)}
}

// stickyDetail says what a sticky error means and how to recover, in
// calls the caller has: gpu.Backend has no reset, so it names the optional
// interface the sim implements.
func stickyDetail(dev int) string {
	return fmt.Sprintf("this error, from earlier work, is sticky on device %d: its later work is skipped and every call that submits or waits on it fails; "+
		"to recover, reset the device through gpu.DeviceResetter, which the sim backend implements (r, _ := gpu.DeviceResetterOf(b); r.ResetDevice(%d)), "+
		"or close the backend and open a new one", dev, dev)
}

// ResetDevice clears dev's sticky error, as destroying and recreating a
// CUDA context would, after the work already queued on dev's streams has
// drained (it is skipped, since the device is faulted). Handles stay valid.
func (b *Backend) ResetDevice(dev int) error {
	const op = "ResetDevice"
	if err := b.enter(op); err != nil {
		return err
	}
	if err := b.checkDev(op, dev); err != nil {
		return err
	}
	b.mu.RLock()
	var sts []*stream
	for _, st := range b.mu.streams {
		if st.dev == dev {
			sts = append(sts, st)
		}
	}
	b.mu.RUnlock()
	for _, st := range sts {
		st.wait()
	}
	b.devs[dev].fault.Store(nil)
	return nil
}

// ---- handles and common checks ----

func errClosed(op string) error {
	return gpu.Errorf(op, gpu.ErrInvalidHandle, "the sim backend is closed")
}

// newHandleLocked issues a handle; zero is never issued, values never repeat.
func (b *Backend) newHandleLocked() uint64 {
	b.mu.next++
	return b.mu.next
}

// getLocked looks h up in m; b.mu must be held.
func getLocked[H ~uint64, T any](b *Backend, op, what string, m map[H]T, h H) (T, error) {
	var zero T
	if b.closed.Load() {
		return zero, errClosed(op)
	}
	if h == 0 {
		return zero, gpu.Errorf(op, gpu.ErrInvalidHandle, "%s handle is zero", what)
	}
	v, ok := m[h]
	if !ok {
		return zero, gpu.Errorf(op, gpu.ErrInvalidHandle, "%s %#x is not live (never issued, or already destroyed)", what, uint64(h))
	}
	return v, nil
}

func (b *Backend) checkDev(op string, dev int) error {
	if b.closed.Load() {
		return errClosed(op)
	}
	if dev < 0 || dev >= len(b.devs) {
		return gpu.Errorf(op, gpu.ErrInvalidValue, "device %d does not exist (%d devices)", dev, len(b.devs))
	}
	return nil
}

// ---- Backend: name, devices, counters, close ----

func (b *Backend) Name() string {
	_ = b.enter("Name")
	return "sim"
}

// DeviceCount returns the number of simulated devices (0 once closed).
func (b *Backend) DeviceCount() int {
	_ = b.enter("DeviceCount")
	if b.closed.Load() {
		return 0
	}
	return len(b.devs)
}

func (b *Backend) DeviceProps(dev int) (gpu.DeviceProps, error) {
	const op = "DeviceProps"
	if err := b.enter(op); err != nil {
		return gpu.DeviceProps{}, err
	}
	if err := b.checkDev(op, dev); err != nil {
		return gpu.DeviceProps{}, err
	}
	return gpu.DeviceProps{
		Ordinal:       dev,
		Name:          fmt.Sprintf("sim device %d", dev),
		TotalMemory:   b.cfg.DeviceMemory,
		ComputeMajor:  9,
		ComputeMinor:  0,
		VMM:           true,
		Granularity:   Granularity,
		StreamMemOps:  true,
		DriverVersion: 13000,
	}, nil
}

// LiveHandles counts the live handles of each kind. Child graphs owned by
// nodes are not counted (they go with their node); chunks released while
// still mapped are not counted (their handle is gone), their mappings are.
func (b *Backend) LiveHandles() gpu.HandleCounts {
	_ = b.enter("LiveHandles") // counted like every entry point; cannot fail
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.countersLocked()
}

func (b *Backend) countersLocked() gpu.HandleCounts {
	c := gpu.HandleCounts{
		Streams:      len(b.mu.streams),
		Events:       len(b.mu.events),
		Allocations:  len(b.mu.as.allocs),
		HostAllocs:   len(b.mu.as.hosts),
		Chunks:       len(b.mu.as.chunks),
		Reservations: len(b.mu.as.reserves),
		Mappings:     b.mu.as.mappings,
		Modules:      len(b.mu.modules),
		GraphExecs:   len(b.mu.execs),
		Comms:        b.liveComms(),
	}
	for _, g := range b.mu.graphs {
		if g.owner == nil {
			c.Graphs++
		}
	}
	return c
}

// Close drops the work still queued, stops every stream goroutine, releases
// every handle and returns an error (wrapping gpu.ErrIllegalState) listing
// what was still live. Later calls fail with gpu.ErrInvalidHandle. An
// injected Close failure leaves the backend open: call Close again.
func (b *Backend) Close() error {
	const op = "Close"
	if err := b.enter(op); err != nil {
		return err
	}
	b.mu.Lock()
	if b.closed.Load() {
		b.mu.Unlock()
		return gpu.Errorf(op, gpu.ErrInvalidHandle, "the sim backend is already closed")
	}
	leaked := b.countersLocked()
	b.closed.Store(true)
	sts := make([]*stream, 0, len(b.mu.streams))
	for _, st := range b.mu.streams {
		sts = append(sts, st)
	}
	for _, f := range b.mu.funcs {
		f.unloaded.Store(true)
	}
	clear(b.mu.streams)
	clear(b.mu.events)
	clear(b.mu.modules)
	clear(b.mu.funcs)
	clear(b.mu.graphs)
	clear(b.mu.nodes)
	clear(b.mu.execs)
	clear(b.mu.devNodes)
	b.mu.as = addrSpace{}
	b.mu.as.init(len(b.devs))
	b.mu.as.cursor = addrLimit // nothing can be carved any more
	b.closeComms()
	b.mu.Unlock()

	close(b.closing)
	for _, st := range sts {
		st.shutdown()
	}
	b.workers.Wait()
	if !leaked.IsZero() {
		return gpu.Errorf(op, gpu.ErrIllegalState, "handles still live at Close (released now): %s", leaked)
	}
	return nil
}

func (b *Backend) closingNow() bool {
	select {
	case <-b.closing:
		return true
	default:
		return false
	}
}
