package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

func init() { gpu.Register("cuda", driver{}) }

var (
	_ gpu.Backend       = (*Backend)(nil)
	_ gpu.HandleCounter = (*Backend)(nil)
)

// driver is the gpu.Driver registered as "cuda".
type driver struct{}

func (driver) Open(cfg gpu.Config) (gpu.Backend, error) {
	b, err := Open(configOf(cfg))
	if err != nil {
		return nil, err
	}
	return b, nil
}

// Priority is gpu.PriorityHardware: "auto" prefers CUDA whenever its driver
// loads and finds a device.
func (driver) Priority() gpu.Priority { return gpu.PriorityHardware }

// Backend is the CUDA implementation of gpu.Backend. It also implements
// gpu.HandleCounter, gpu.Collectives, gpu.GEMM, gpu.GraphNodeReader and
// gpu.DeviceUpdates (devupdate.go). Safe for concurrent use (see the package
// doc for the graph rule).
type Backend struct {
	d    *cu.Driver
	opts options
	devs []*device

	blas blasLib     // cuBLAS and cuBLASLt, loaded at the first GEMM call
	nccl ncclState   // NCCL and the communicators (collectives.go)
	ext  extentCache // allocation extents (extent.go)

	// captures counts the stream captures begun through this backend and
	// not yet ended: while it is 0 no stream of the backend is capturing,
	// so launches need not ask the driver (devupdate.go).
	captures atomic.Int64

	// setByKernel makes prepared node sets (nodeset.go) name a library
	// kernel's node by its context-independent kernel, as the library
	// made it, rather than by its function in the context: set by
	// BenchmarkGemmNodeUpdate, which measures both.
	setByKernel bool

	// mu guards the handle tables. Driver calls are made without it.
	mu struct {
		sync.Mutex
		closed bool
		next   uint64 // the last handle value issued
		tables
	}
}

// tables map the handles the backend issued to the driver's objects. Handle
// values are the backend's own, issued from a counter and never reused:
// CUDA reuses the addresses of destroyed streams, events and graphs, and a
// stale handle must not alias a newer object (a second destroy would
// destroy someone else's). Device pointers are the one exception: they are
// addresses, and an allocation is known by its start.
type tables struct {
	streams map[gpu.Stream]streamInfo
	events  map[gpu.Event]eventInfo
	allocs  map[gpu.DevicePtr]allocInfo
	hosts   map[gpu.HostAlloc]hostInfo
	chunks  map[gpu.PhysMem]*chunkInfo
	resv    map[gpu.DevicePtr]uint64 // reservation -> size
	maps    map[gpu.DevicePtr]mapInfo
	modules map[gpu.Module]*moduleInfo
	funcs   map[gpu.Function]*funcInfo
	graphs  map[gpu.Graph]*graphInfo
	nodes   map[gpu.GraphNode]*nodeInfo
	execs   map[gpu.GraphExec]execInfo

	// Reverse maps for driver objects the backend meets again: kernels
	// and nodes read back from graphs, child graphs of nodes.
	funcByCU  map[cu.Function]gpu.Function
	graphByCU map[cu.Graph]gpu.Graph
	nodeByCU  map[cu.GraphNode]gpu.GraphNode
}

// newIDLocked issues a handle value: nonzero, unique within the backend.
func (b *Backend) newIDLocked() uint64 {
	b.mu.next++
	return b.mu.next
}

// device is one CUDA device and its primary context.
type device struct {
	ordinal int
	cuDev   cu.Device
	ctx     cu.Context
	props   gpu.DeviceProps

	gemm gemmState // cuBLAS handles and kept algorithms, made at the first GEMM call
}

type streamInfo struct {
	dev int
	s   cu.Stream
}

type eventInfo struct {
	dev int
	e   cu.Event
}

type allocInfo struct {
	dev  int
	size uint64
}

type hostInfo struct {
	p    unsafe.Pointer // host address (C memory)
	dp   cu.DevicePtr   // its device address
	size uint64
}

// chunkInfo is a physical chunk: one driver allocation per granule, so that
// any granule-aligned part of it can be mapped (cuMemMap maps only whole
// allocations from offset 0).
type chunkInfo struct {
	dev   int
	size  uint64
	gran  uint64
	parts []cu.MemHandle
}

type mapInfo struct {
	dev   int // the chunk's device
	size  uint64
	chunk gpu.PhysMem
}

// Open loads the CUDA driver, initializes it and retains the primary context
// of every device. It fails with an error wrapping gpu.ErrUnavailable when
// no driver library loads, cuInit fails or there is no device.
func Open(cfg Config) (*Backend, error) {
	o := resolveOptions(cfg)
	d, err := cu.Open(o.cudaLibrary)
	if err != nil {
		return nil, &gpu.Error{Op: "dlopen", Err: gpu.ErrUnavailable, Detail: err.Error()}
	}
	return openDriver(d, o)
}

// openDriver is Open over a loaded driver (or, in tests, a cu.NewStub).
func openDriver(d *cu.Driver, o options) (*Backend, error) {
	if r := d.Init(); r != cu.Success {
		return nil, &gpu.Error{Op: "cuInit", Code: int(r), CodeName: r.Name(), Err: gpu.ErrUnavailable,
			Detail: d.GetErrorString(r) + " (library " + d.Path + ")"}
	}
	var version, count int32
	if r := d.DriverGetVersion(&version); r != cu.Success {
		return nil, unavailable(d, "cuDriverGetVersion", r)
	}
	if r := d.DeviceGetCount(&count); r != cu.Success {
		return nil, unavailable(d, "cuDeviceGetCount", r)
	}
	if count == 0 {
		return nil, &gpu.Error{Op: "cuDeviceGetCount", Err: gpu.ErrUnavailable, Detail: "no CUDA devices (library " + d.Path + ")"}
	}
	b := &Backend{d: d, opts: o}
	b.initTablesLocked()
	for i := 0; i < int(count); i++ {
		dev, err := b.openDevice(i, int(version))
		if err != nil {
			b.releaseContexts()
			return nil, err
		}
		b.devs = append(b.devs, dev)
	}
	o.log.Debug("cuda: opened", "library", d.Path, "driver", version, "devices", count)
	return b, nil
}

// initTablesLocked makes empty handle tables.
func (b *Backend) initTablesLocked() {
	b.mu.tables = tables{
		streams: map[gpu.Stream]streamInfo{}, events: map[gpu.Event]eventInfo{},
		allocs: map[gpu.DevicePtr]allocInfo{}, hosts: map[gpu.HostAlloc]hostInfo{},
		chunks: map[gpu.PhysMem]*chunkInfo{}, resv: map[gpu.DevicePtr]uint64{}, maps: map[gpu.DevicePtr]mapInfo{},
		modules: map[gpu.Module]*moduleInfo{}, funcs: map[gpu.Function]*funcInfo{},
		graphs: map[gpu.Graph]*graphInfo{}, nodes: map[gpu.GraphNode]*nodeInfo{}, execs: map[gpu.GraphExec]execInfo{},
		funcByCU: map[cu.Function]gpu.Function{}, graphByCU: map[cu.Graph]gpu.Graph{}, nodeByCU: map[cu.GraphNode]gpu.GraphNode{},
	}
}

func unavailable(d *cu.Driver, op string, r cu.Result) error {
	return &gpu.Error{Op: op, Code: int(r), CodeName: r.Name(), Err: gpu.ErrUnavailable, Detail: d.GetErrorString(r)}
}

// keepAlive holds one extra retain of each primary context for the life of
// the process (keyed by library and device), so that closing the last
// backend does not destroy a context the next Open would recreate.
var keepAlive struct {
	sync.Mutex
	retained map[string]bool
}

// openDevice retains dev's primary context and reads its properties.
func (b *Backend) openDevice(ordinal, version int) (*device, error) {
	d := b.d
	dev := &device{ordinal: ordinal}
	if r := d.DeviceGet(&dev.cuDev, ordinal); r != cu.Success {
		return nil, unavailable(d, "cuDeviceGet", r)
	}
	if r := d.DevicePrimaryCtxRetain(&dev.ctx, dev.cuDev); r != cu.Success {
		return nil, unavailable(d, "cuDevicePrimaryCtxRetain", r)
	}
	keepAlive.Lock()
	key := fmt.Sprintf("%s#%d", d.Path, ordinal)
	if !keepAlive.retained[key] {
		var ctx cu.Context
		if d.DevicePrimaryCtxRetain(&ctx, dev.cuDev) == cu.Success {
			if keepAlive.retained == nil {
				keepAlive.retained = map[string]bool{}
			}
			keepAlive.retained[key] = true
		}
	}
	keepAlive.Unlock()

	p := gpu.DeviceProps{Ordinal: ordinal, DriverVersion: version}
	name := make([]byte, 256)
	if d.DeviceGetName(name, dev.cuDev) == cu.Success {
		p.Name = cu.GoString(&name[0])
	}
	attr := func(a cu.DeviceAttribute) int {
		var v int32
		if d.DeviceGetAttribute(&v, a, dev.cuDev) != cu.Success {
			return 0
		}
		return int(v)
	}
	p.ComputeMajor, p.ComputeMinor = attr(cu.AttrComputeMajor), attr(cu.AttrComputeMinor)
	p.StreamMemOps = attr(cu.AttrCanUse64BitStreamMemOps) == 1 && d.Has("cuStreamWriteValue64_v2")
	vmm := attr(cu.AttrVirtualMemoryManagement) == 1
	for _, s := range []string{"cuMemCreate", "cuMemRelease", "cuMemAddressReserve", "cuMemAddressFree",
		"cuMemMap", "cuMemUnmap", "cuMemSetAccess", "cuMemGetAllocationGranularity"} {
		vmm = vmm && d.Has(s)
	}
	err := b.onContext(dev.ctx, func() error {
		var free, total uint64
		if d.MemGetInfo(&free, &total) == cu.Success {
			p.TotalMemory = total
		} else if d.DeviceTotalMem(&total, dev.cuDev) == cu.Success {
			p.TotalMemory = total
		}
		if vmm {
			prop := allocProp(ordinal)
			var gran uint64
			if d.MemGetAllocationGranularity(&gran, &prop, cu.GranularityMinimum) == cu.Success && gran > 0 {
				p.VMM, p.Granularity = true, gran
			}
		}
		return nil
	})
	if err != nil {
		d.DevicePrimaryCtxRelease(dev.cuDev)
		return nil, err
	}
	dev.props = p
	return dev, nil
}

func allocProp(dev int) cu.MemAllocationProp {
	return cu.MemAllocationProp{
		Type:     cu.MemAllocationTypePinned,
		Location: cu.MemLocation{Type: cu.MemLocationTypeDevice, ID: int32(dev)},
	}
}

// releaseContexts releases the primary contexts this backend retained.
func (b *Backend) releaseContexts() error {
	var errs []error
	for _, dev := range b.devs {
		errs = append(errs, b.check("cuDevicePrimaryCtxRelease_v2", b.d.DevicePrimaryCtxRelease(dev.cuDev)))
	}
	return errors.Join(errs...)
}

// onDevice runs f with dev's primary context current on the calling OS
// thread, the goroutine locked to that thread until f returns. Every driver
// call goes through it, call or callFrame, all of which make the context
// current with enter (frame.go), the one place that does.
func (b *Backend) onDevice(dev int, f func() error) error {
	return b.onContext(b.devs[dev].ctx, f)
}

// onContext is onDevice for a context given directly (used while devices
// are being opened).
func (b *Backend) onContext(ctx cu.Context, f func() error) error {
	fr := getFrame()
	err := b.enter(ctx, fr)
	fr.release()
	if err != nil {
		return err
	}
	defer runtime.UnlockOSThread()
	return f()
}

// call runs one driver call on dev and checks its result. Calls that lend
// the driver Go memory take it from a frame and use callFrame.
func (b *Backend) call(dev int, op string, f func() cu.Result) error {
	fr := getFrame()
	defer fr.release()
	return b.callFrame(fr, dev, op, f)
}

// Name implements gpu.Backend.
func (b *Backend) Name() string { return "cuda" }

// Library is the path of the loaded libcuda.
func (b *Backend) Library() string { return b.d.Path }

// DeviceCount implements gpu.Devices.
func (b *Backend) DeviceCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.closed {
		return 0
	}
	return len(b.devs)
}

// device returns dev's state, or ErrInvalidValue for a bad ordinal.
func (b *Backend) device(op string, dev int) (*device, error) {
	b.mu.Lock()
	closed := b.mu.closed
	b.mu.Unlock()
	if closed {
		return nil, errf(op, gpu.ErrIllegalState, "backend closed")
	}
	if dev < 0 || dev >= len(b.devs) {
		return nil, errf(op, gpu.ErrInvalidValue, "device %d does not exist (%d devices)", dev, len(b.devs))
	}
	return b.devs[dev], nil
}

// DeviceProps implements gpu.Devices.
func (b *Backend) DeviceProps(dev int) (gpu.DeviceProps, error) {
	d, err := b.device("DeviceProps", dev)
	if err != nil {
		return gpu.DeviceProps{}, err
	}
	return d.props, nil
}

// LiveHandles implements gpu.HandleCounter: the handles this backend issued
// that are still live. Child graphs owned by nodes and kernels discovered in
// captured graphs are not counted (the caller does not release them).
func (b *Backend) LiveHandles() gpu.HandleCounts {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.countersLocked()
}

func (b *Backend) countersLocked() gpu.HandleCounts {
	c := gpu.HandleCounts{
		Streams: len(b.mu.streams), Events: len(b.mu.events), Allocations: len(b.mu.allocs),
		HostAllocs: len(b.mu.hosts), Chunks: len(b.mu.chunks), Reservations: len(b.mu.resv),
		Mappings: len(b.mu.maps), Modules: len(b.mu.modules), GraphExecs: len(b.mu.execs),
		Comms: b.liveComms(),
	}
	for _, g := range b.mu.graphs {
		if g.owned {
			c.Graphs++
		}
	}
	return c
}

// Close releases every handle still live (reporting them as leaked in the
// error), then the backend's internal resources and its primary contexts.
// Work in flight is waited for first, so nothing is freed under a running
// kernel. A second Close returns nil.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.mu.closed {
		b.mu.Unlock()
		return nil
	}
	leaked := b.countersLocked()
	m := b.mu.tables
	b.mu.closed = true
	b.initTablesLocked() // empty: calls racing with Close find nothing
	b.ext.drop(0, ^uint64(0), false)
	b.mu.Unlock()

	d := b.d
	var errs []error
	for i := range b.devs {
		errs = append(errs, b.call(i, "cuCtxSynchronize", d.CtxSynchronize))
	}
	errs = append(errs, b.closeComms())
	for _, xi := range m.execs {
		errs = append(errs, b.call(xi.dev, "cuGraphExecDestroy", func() cu.Result { return d.GraphExecDestroy(xi.x) }))
	}
	for _, gi := range m.graphs {
		if gi.owned {
			errs = append(errs, b.call(gi.dev, "cuGraphDestroy", func() cu.Result { return d.GraphDestroy(gi.g) }))
		}
	}
	for _, mi := range m.modules {
		errs = append(errs, b.call(mi.dev, "cuModuleUnload", func() cu.Result { return d.ModuleUnload(mi.m) }))
	}
	for _, ei := range m.events {
		errs = append(errs, b.call(ei.dev, "cuEventDestroy_v2", func() cu.Result { return d.EventDestroy(ei.e) }))
	}
	for _, si := range m.streams {
		errs = append(errs, b.call(si.dev, "cuStreamDestroy_v2", func() cu.Result { return d.StreamDestroy(si.s) }))
	}
	for p, mi := range m.maps {
		errs = append(errs, b.call(mi.dev, "cuMemUnmap", func() cu.Result { return d.MemUnmap(cu.DevicePtr(p), mi.size) }))
	}
	for p, size := range m.resv {
		errs = append(errs, b.call(0, "cuMemAddressFree", func() cu.Result { return d.MemAddressFree(cu.DevicePtr(p), size) }))
	}
	for _, ci := range m.chunks {
		errs = append(errs, b.releaseParts(ci.dev, ci.parts))
	}
	for p, ai := range m.allocs {
		errs = append(errs, b.call(ai.dev, "cuMemFree_v2", func() cu.Result { return d.MemFree(cu.DevicePtr(p)) }))
	}
	for _, hi := range m.hosts {
		errs = append(errs, b.call(0, "cuMemFreeHost", func() cu.Result { return d.MemFreeHost(hi.p) }))
	}
	for i := range b.devs {
		errs = append(errs, b.closeGemm(i))
	}
	errs = append(errs, b.releaseContexts())
	if !leaked.IsZero() {
		errs = append(errs, &gpu.Error{Op: "Close", Err: gpu.ErrIllegalState,
			Detail: "handles still live at Close were released: " + leaked.String()})
	}
	return errors.Join(errs...)
}
