package cuda

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
	"github.com/stablegraph/stablegraph/kernels"
)

// Tests of the device-update logic over a stub driver (no GPU): the rules
// are enforced before the driver sees the calls, the attribute and graph
// edits reach the driver as they should, and old drivers are a missing
// capability.

// devStub extends stubDriver with what device updates read back: the
// device-updatable attribute of nodes and the edges of graphs.
type devStub struct {
	*stubDriver
	version     int32 // cuDriverGetVersion's answer; 0: the stub's (13000)
	failAddDeps bool

	mu        sync.Mutex
	graphOf   map[uintptr]uintptr   // node -> graph
	deps      map[uintptr][]uintptr // node -> dependencies
	updatable map[uintptr]bool
	destroyed []uintptr
	loaded    [][]byte // images given to cuModuleLoadDataEx
}

func newDevStub() *devStub {
	return &devStub{stubDriver: newStubDriver(), graphOf: map[uintptr]uintptr{}, deps: map[uintptr][]uintptr{}, updatable: map[uintptr]bool{}}
}

func devNodeOf(n uintptr) cu.GraphDeviceNode { return cu.GraphDeviceNode(0xd0_0000_0000 | n) }

func (s *devStub) call(name string, a cu.StubArgs) cu.Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch name {
	case "cuDriverGetVersion":
		if s.version != 0 {
			*out[int32](&a, 0) = s.version
			return cu.Success
		}
	case "cuGraphKernelNodeSetAttribute":
		s.stubDriver.call(name, a) // counts it
		v := out[cu.LaunchAttributeValue](&a, 2)
		if cu.LaunchAttributeID(a.A[1]) != cu.LaunchAttributeDeviceUpdatableKernelNode ||
			(v.DeviceUpdatableKernelNode.DeviceUpdatable == 0 && s.updatable[a.A[0]]) {
			return cu.ErrorInvalidValue
		}
		s.updatable[a.A[0]] = v.DeviceUpdatableKernelNode.DeviceUpdatable == 1
		return cu.Success
	case "cuGraphKernelNodeGetAttribute":
		s.stubDriver.call(name, a)
		v := out[cu.LaunchAttributeValue](&a, 2)
		*v = cu.LaunchAttributeValue{}
		if s.updatable[a.A[0]] {
			v.DeviceUpdatableKernelNode = cu.DeviceUpdatableKernelNode{DeviceUpdatable: 1, DevNode: devNodeOf(a.A[0])}
		}
		return cu.Success
	case "cuGraphAddKernelNode_v2", "cuGraphAddEmptyNode":
		r := s.stubDriver.call(name, a)
		n := *out[uintptr](&a, 0)
		s.graphOf[n] = a.A[1]
		if a.A[3] > 0 {
			s.deps[n] = slices.Clone(unsafe.Slice(out[uintptr](&a, 2), a.A[3]))
		}
		return r
	case "cuGraphAddDependencies_v2": // (graph, from, to, edges, n)
		s.stubDriver.call(name, a)
		if s.failAddDeps {
			return cu.ErrorOutOfMemory
		}
		from := unsafe.Slice(out[uintptr](&a, 1), a.A[4])
		to := unsafe.Slice(out[uintptr](&a, 2), a.A[4])
		for i := range from {
			s.deps[to[i]] = append(s.deps[to[i]], from[i])
		}
		return cu.Success
	case "cuGraphDestroyNode":
		s.stubDriver.call(name, a)
		s.destroyed = append(s.destroyed, a.A[0])
		return cu.Success
	case "cuModuleLoadDataEx":
		if a.A[2] == 0 { // no JIT options: a binary, copy what the driver would read
			s.loaded = append(s.loaded, slices.Clone(unsafe.Slice(out[byte](&a, 1), 4)))
		}
	}
	return s.stubDriver.call(name, a)
}

type devEnv struct {
	b    *Backend
	sd   *devStub
	s    gpu.Stream
	fill gpu.KernelParams
}

func newDevEnv(t *testing.T, sd *devStub, missing ...string) *devEnv {
	t.Helper()
	b, err := openDriver(cu.NewStub("stub-libcuda", sd.call, missing...), resolveOptions(Config{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c := b.LiveHandles(); !c.IsZero() {
			t.Errorf("leak: %v", c)
		}
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	m, err := b.ModuleLoad(0, kernels.Module())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.ModuleUnload(m) })
	f, err := b.ModuleFunction(m, kernels.Fill)
	if err != nil {
		t.Fatal(err)
	}
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.StreamDestroy(s) })
	return &devEnv{b: b, sd: sd, s: s,
		fill: gpu.KernelParams{Func: f, Config: kernels.Elementwise(256), Args: []gpu.Arg{gpu.Ptr(0x1000), gpu.F32(1), gpu.I32(256)}}}
}

func (e *devEnv) graph(t *testing.T) gpu.Graph {
	t.Helper()
	g, err := e.b.GraphCreate(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.b.GraphDestroy(g) })
	return g
}

func (e *devEnv) kernel(t *testing.T, g gpu.Graph, deps ...gpu.GraphNode) gpu.GraphNode {
	t.Helper()
	n, err := e.b.GraphAddKernelNode(g, deps, e.fill)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func wantSentinel(t *testing.T, what string, err, sentinel error) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Errorf("%s: %v, want %v", what, err, sentinel)
	}
}

func TestStubDeviceUpdateRules(t *testing.T) {
	e := newDevEnv(t, newDevStub())
	b, sd := e.b, e.sd
	du, err := gpu.DeviceUpdatesOf(b, 0)
	if err != nil {
		t.Fatal(err)
	}
	g := e.graph(t)
	n0 := e.kernel(t, g)
	n1 := e.kernel(t, g, n0)
	sd.startCounting()

	d, err := du.GraphKernelNodeSetDeviceUpdatable(n0, true)
	want := gpu.DevNode(devNodeOf(uintptr(b.mu.nodes[n0].n)))
	if err != nil || d != want {
		t.Fatalf("opt in: %#x, %v; want the devNode the driver reads back, %#x", uint64(d), err, uint64(want))
	}
	if got, err := du.GraphKernelNodeDevNode(n0); err != nil || got != d {
		t.Errorf("GraphKernelNodeDevNode = %#x, %v", uint64(got), err)
	}
	if got, err := du.GraphKernelNodeDevNode(n1); err != nil || got != 0 {
		t.Errorf("GraphKernelNodeDevNode of a node not opted in = %#x, %v", uint64(got), err)
	}
	if again, err := du.GraphKernelNodeSetDeviceUpdatable(n0, true); err != nil || again != d {
		t.Errorf("opting in again: %#x, %v", uint64(again), err)
	}
	_, err = du.GraphKernelNodeSetDeviceUpdatable(n0, false)
	wantSentinel(t, "opt-out", err, gpu.ErrNotSupported)
	if n := sd.callCount("cuGraphKernelNodeSetAttribute"); n != 1 {
		t.Errorf("cuGraphKernelNodeSetAttribute called %d times, want once (repeats and the opt-out are answered by the backend)", n)
	}

	x, err := b.GraphInstantiate(g)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.GraphInstantiate(g)
	wantSentinel(t, "second exec", err, gpu.ErrNotSupported)
	if n := sd.callCount("cuGraphInstantiateWithFlags"); n != 1 {
		t.Errorf("the second instantiation reached the driver")
	}
	wantSentinel(t, "launch before upload", b.GraphLaunch(x, e.s), gpu.ErrIllegalState)
	if err := du.GraphUpload(x, e.s); err != nil {
		t.Fatal(err)
	}
	if err := b.GraphLaunch(x, e.s); err != nil {
		t.Errorf("launch after the upload: %v", err)
	}
	if err := b.GraphExecKernelNodeSetParams(x, n1, e.fill); err != nil {
		t.Fatal(err)
	}
	if err := b.GraphLaunch(x, e.s); err != nil {
		t.Errorf("launch after a host-side change of a node that is not device-updatable: %v", err)
	}
	if err := b.GraphExecKernelNodeSetParams(x, n0, e.fill); err != nil {
		t.Fatal(err)
	}
	wantSentinel(t, "launch after a host-side change of a device-updatable node", b.GraphLaunch(x, e.s), gpu.ErrIllegalState)
	if err := du.GraphUpload(x, e.s); err != nil {
		t.Fatal(err)
	}
	if err := b.GraphLaunch(x, e.s); err != nil {
		t.Errorf("launch after the second upload: %v", err)
	}
	if n := sd.callCount("cuGraphLaunch"); n != 3 {
		t.Errorf("cuGraphLaunch called %d times, want 3 (refused launches must not reach it)", n)
	}
	if n := sd.callCount("cuStreamIsCapturing"); n != 0 {
		t.Errorf("launches asked the driver about captures %d times with none under way", n)
	}

	other := e.graph(t)
	e.kernel(t, other)
	var ue *gpu.UpdateError
	if err := b.GraphExecUpdate(x, other); !errors.As(err, &ue) || ue.Result != gpu.UpdateNotSupported {
		t.Errorf("GraphExecUpdate of an exec with device-updatable nodes: %v", err)
	}
	xo, err := b.GraphInstantiate(other)
	if err != nil {
		t.Fatal(err)
	}
	defer b.GraphExecDestroy(xo)
	if err := b.GraphExecUpdate(xo, g); !errors.As(err, &ue) || ue.Result != gpu.UpdateNotSupported {
		t.Errorf("GraphExecUpdate with a graph with device-updatable nodes: %v", err)
	}
	if n := sd.callCount("cuGraphExecUpdate_v2"); n != 0 {
		t.Errorf("refused exec updates reached the driver %d times", n)
	}
	_, err = b.GraphAddChildGraphNode(other, nil, g)
	wantSentinel(t, "child graph with device-updatable nodes", err, gpu.ErrNotSupported)

	if err := b.StreamBeginCapture(e.s); err != nil {
		t.Fatal(err)
	}
	wantSentinel(t, "captured launch", b.GraphLaunch(x, e.s), gpu.ErrNotSupported)
	cg, err := b.StreamEndCapture(e.s)
	if err != nil {
		t.Fatal(err)
	}
	b.GraphDestroy(cg)
	if b.captures.Load() != 0 {
		t.Errorf("capture count %d after the capture ended", b.captures.Load())
	}

	if err := b.GraphExecDestroy(x); err != nil {
		t.Fatal(err)
	}
	x2, err := b.GraphInstantiate(g)
	if err != nil {
		t.Fatalf("instantiating after the exec was destroyed: %v", err)
	}
	b.GraphExecDestroy(x2)
}

func TestStubNodeBefore(t *testing.T) {
	sd := newDevStub()
	e := newDevEnv(t, sd)
	b := e.b
	g := e.graph(t)
	a, c := e.kernel(t, g), e.kernel(t, g)
	d := e.kernel(t, g, a, c)
	r, err := b.GraphAddKernelNodeBefore(g, e.fill, []gpu.GraphNode{a, c})
	if err != nil {
		t.Fatal(err)
	}
	cn := func(n gpu.GraphNode) uintptr { return uintptr(b.mu.nodes[n].n) }
	sd.mu.Lock()
	for _, n := range []gpu.GraphNode{a, c} {
		if got := sd.deps[cn(n)]; !slices.Equal(got, []uintptr{cn(r)}) {
			t.Errorf("root %#x now depends on %v, want the new node %#x", cn(n), got, cn(r))
		}
	}
	if got := sd.deps[cn(d)]; len(got) != 2 || len(sd.deps[cn(r)]) != 0 {
		t.Errorf("dependent node's deps %v, new node's %v", got, sd.deps[cn(r)])
	}
	sd.mu.Unlock()
	if typ, err := b.GraphNodeType(r); err != nil || typ != gpu.NodeKernel {
		t.Errorf("new node type %v, %v", typ, err)
	}
	// Before a later node only: that node gains the edge, the roots none.
	r2, err := b.GraphAddKernelNodeBefore(g, e.fill, []gpu.GraphNode{d})
	if err != nil {
		t.Fatal(err)
	}
	sd.mu.Lock()
	if got := sd.deps[cn(d)]; len(got) != 3 || got[2] != cn(r2) || len(sd.deps[cn(r2)]) != 0 || len(sd.deps[cn(a)]) != 1 {
		t.Errorf("before a later node: its deps %v, the new node's %v, a root's %v", got, sd.deps[cn(r2)], sd.deps[cn(a)])
	}
	sd.mu.Unlock()

	// A failed edge leaves no node behind.
	sd.failAddDeps = true
	before := len(b.mu.nodes)
	_, err = b.GraphAddKernelNodeBefore(g, e.fill, []gpu.GraphNode{a})
	var ge *gpu.Error
	if !errors.Is(err, gpu.ErrOutOfMemory) || !errors.As(err, &ge) || ge.Op != "cuGraphAddDependencies_v2" {
		t.Errorf("failing edges: %v", err)
	}
	if len(sd.destroyed) != 1 || len(b.mu.nodes) != before {
		t.Errorf("the node of the failed edges was not removed: destroyed %v, %d nodes known (was %d)", sd.destroyed, len(b.mu.nodes), before)
	}
	sd.failAddDeps = false
	// Before nothing: no edges to add.
	empty := e.graph(t)
	sd.startCounting()
	if _, err := b.GraphAddKernelNodeBefore(empty, e.fill, nil); err != nil {
		t.Fatal(err)
	}
	if n := sd.callCount("cuGraphAddDependencies_v2"); n != 0 {
		t.Errorf("edges added before no node")
	}
	bad := e.fill
	bad.Args = bad.Args[:1]
	_, err = b.GraphAddKernelNodeBefore(g, bad, []gpu.GraphNode{a})
	wantSentinel(t, "bad arguments", err, gpu.ErrInvalidValue)
	_, err = b.GraphAddKernelNodeBefore(0, e.fill, nil)
	wantSentinel(t, "graph 0", err, gpu.ErrInvalidHandle)
	_, err = b.GraphAddKernelNodeBefore(g, e.fill, []gpu.GraphNode{a, a})
	wantSentinel(t, "a node listed twice", err, gpu.ErrInvalidValue)
	other := e.kernel(t, empty)
	_, err = b.GraphAddKernelNodeBefore(g, e.fill, []gpu.GraphNode{other})
	wantSentinel(t, "a node of another graph", err, gpu.ErrInvalidValue)
	_, err = b.GraphAddKernelNodeBefore(g, e.fill, []gpu.GraphNode{0})
	wantSentinel(t, "node 0", err, gpu.ErrInvalidHandle)
}

func TestStubDeviceUpdatesNeedCUDA124(t *testing.T) {
	sd := newDevStub()
	sd.version = 12030
	e := newDevEnv(t, sd)
	_, err := gpu.DeviceUpdatesOf(e.b, 0)
	if !errors.Is(err, gpu.ErrNotSupported) || !strings.Contains(err.Error(), "CUDA 12.3") {
		t.Errorf("driver 12.3: %v, want ErrNotSupported naming it", err)
	}
	g := e.graph(t)
	n := e.kernel(t, g)
	sd.startCounting()
	_, err = e.b.GraphKernelNodeSetDeviceUpdatable(n, true)
	wantSentinel(t, "opting in on driver 12.3", err, gpu.ErrNotSupported)
	if sd.callCount("cuGraphKernelNodeSetAttribute") != 0 {
		t.Errorf("the attribute reached a driver that does not know it")
	}

	e2 := newDevEnv(t, newDevStub(), "cuGraphUpload")
	if _, err := gpu.DeviceUpdatesOf(e2.b, 0); !errors.Is(err, gpu.ErrNotSupported) || !strings.Contains(err.Error(), "cuGraphUpload") {
		t.Errorf("driver without cuGraphUpload: %v", err)
	}
	e3 := newDevEnv(t, newDevStub(), "cuGraphAddDependencies_v2")
	if _, err := gpu.DeviceUpdatesOf(e3.b, 0); err != nil {
		t.Errorf("a driver with only the original cuGraphAddDependencies: %v", err)
	}
}

func TestStubModuleBinary(t *testing.T) {
	sd := newDevStub()
	e := newDevEnv(t, sd)
	b := e.b
	spec := kernels.PatcherSpec()
	// img offers bin's cubins and no PTX, as the patcher does.
	img := func(bin func(int, int) ([]byte, error)) *gpu.ModuleImage {
		return &gpu.ModuleImage{Name: "test-binary", Kernels: []gpu.KernelSpec{spec}, Code: func(t gpu.Target) ([]byte, error) {
			if t.Format != gpu.CodeCubin {
				return nil, fmt.Errorf("cubins only: %w", gpu.ErrNotSupported)
			}
			return bin(t.Major, t.Minor)
		}}
	}
	sd.startCounting()
	_, err := b.ModuleLoad(0, img(func(major, minor int) ([]byte, error) {
		return nil, errors.Join(errors.New("no cubin for this one"), gpu.ErrNotSupported)
	}))
	if !errors.Is(err, gpu.ErrNotSupported) || !strings.Contains(err.Error(), "compute 9.0") || !strings.Contains(err.Error(), "no cubin for this one") {
		t.Errorf("no binary for the device: %v", err)
	}
	if n := sd.callCount("cuModuleLoadDataEx"); n != 0 {
		t.Errorf("the driver was asked to load nothing")
	}
	var asked [2]int
	m, err := b.ModuleLoad(0, img(func(major, minor int) ([]byte, error) {
		asked = [2]int{major, minor}
		return []byte("\x7fELFcubin"), nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	if asked != [2]int{9, 0} || len(sd.loaded) != 1 || string(sd.loaded[0]) != "\x7fELF" {
		t.Errorf("Binary asked for %v; driver loaded %q (want the cubin as is, without JIT options)", asked, sd.loaded)
	}
	if _, err := b.ModuleFunction(m, kernels.Patcher); err != nil {
		t.Errorf("ModuleFunction in the binary module: %v", err)
	}
	b.ModuleUnload(m)
	for r, want := range map[cu.Result]error{cu.ErrorNoBinaryForGPU: gpu.ErrNotSupported, cu.ErrorInvalidImage: gpu.ErrNotSupported,
		cu.ErrorOutOfMemory: gpu.ErrOutOfMemory} {
		sd.fail = func(name string) cu.Result {
			if name == "cuModuleLoadDataEx" {
				return r
			}
			return cu.Success
		}
		_, err := b.ModuleLoad(0, img(func(int, int) ([]byte, error) { return []byte("\x7fELF"), nil }))
		var ge *gpu.Error
		if !errors.Is(err, want) || !errors.As(err, &ge) || ge.CodeName != r.Name() || !strings.Contains(err.Error(), "compute 9.0") {
			t.Errorf("driver refusing with %s: %v, want %v keeping the code", r.Name(), err, want)
		}
	}
	sd.fail = nil
	// A module with a cubin and PTX loads the cubin; one with PTX alone
	// is JIT-compiled (JIT options given, nothing loaded as built).
	both := &gpu.ModuleImage{Name: "both", Kernels: []gpu.KernelSpec{spec}, Code: func(t gpu.Target) ([]byte, error) {
		if t.Format == gpu.CodeCubin {
			return []byte("\x7fELFboth"), nil
		}
		return []byte(".version 9.0"), nil
	}}
	sd.loaded = nil
	if m, err := b.ModuleLoad(0, both); err != nil || len(sd.loaded) != 1 {
		t.Errorf("a module with a cubin and PTX: %v, %d loaded as built; want the cubin", err, len(sd.loaded))
	} else {
		b.ModuleUnload(m)
	}
	ptxOnly := &gpu.ModuleImage{Name: "ptx-only", Kernels: []gpu.KernelSpec{spec}, Code: func(t gpu.Target) ([]byte, error) {
		if t.Format != gpu.CodePTX {
			return nil, fmt.Errorf("PTX only: %w", gpu.ErrNotSupported)
		}
		return []byte(".version 9.0"), nil
	}}
	sd.loaded = nil
	before := sd.callCount("cuModuleLoadDataEx")
	if m, err := b.ModuleLoad(0, ptxOnly); err != nil || len(sd.loaded) != 0 || sd.callCount("cuModuleLoadDataEx") != before+1 {
		t.Errorf("a module with PTX only: %v, %d loaded as built; want it JIT-compiled", err, len(sd.loaded))
	} else {
		b.ModuleUnload(m)
	}
	// No device code at all: refused before the driver is asked.
	if _, err := b.ModuleLoad(0, &gpu.ModuleImage{Name: "refs-only", Kernels: []gpu.KernelSpec{spec}}); !errors.Is(err, gpu.ErrNotSupported) ||
		!strings.Contains(err.Error(), "no device code") {
		t.Errorf("a module without device code: %v", err)
	}
	if len(kernels.PatcherArchs()) == 0 {
		_, err := b.ModuleLoad(0, kernels.PatcherModule())
		if !errors.Is(err, gpu.ErrNotSupported) || !strings.Contains(err.Error(), "not built") {
			t.Errorf("loading the patcher before it is built: %v, want ErrNotSupported saying so", err)
		}
	}
}
