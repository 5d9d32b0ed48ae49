package gputest

import (
	"errors"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

var faultTests = []test{
	{name: "UseAfterFree", run: testFaultUseAfterFree},
	{name: "CopyFromFreed", run: testFaultCopyFreed},
	{name: "MappingWithoutAccess", run: testFaultNoAccess},
	{name: "AccessFromOtherDevice", run: testFaultOtherDevice},
}

// resetter skips the test unless the backend can reset a device
// (gpu.DeviceResetter). Fault tests run only against such backends: on a real
// GPU an illegal address poisons the CUDA context for the rest of the process.
func (h *h) resetter() gpu.DeviceResetter {
	h.Helper()
	r, ok := gpu.DeviceResetterOf(h.raw)
	if !ok {
		h.Skip("faults are fatal to a CUDA context: the backend has no ResetDevice")
	}
	return r
}

// wantFault checks err is a *gpu.FaultError on dev within [p, p+size) and
// wraps ErrIllegalAddress.
func (h *h) wantFault(what string, err error, dev int, p gpu.DevicePtr, size uint64) {
	h.Helper()
	if !h.wantErr(what, err, gpu.ErrIllegalAddress) {
		return
	}
	var fe *gpu.FaultError
	if !errors.As(err, &fe) {
		h.Errorf("%s: %v is not a *gpu.FaultError", what, err)
		return
	}
	if fe.Addr < p || fe.Addr >= p.Add(size) {
		h.Errorf("%s: fault at %#x, want inside [%#x, %#x): %v", what, uint64(fe.Addr), uint64(p), uint64(p.Add(size)), err)
	}
	if fe.Device != dev {
		h.Errorf("%s: fault names device %d, want %d: %v", what, fe.Device, dev, err)
	}
	h.Logf("%s: %v", what, err)
}

// runFault launches params on s and returns the launch's error, or the
// synchronize's if the launch was accepted.
func (h *h) runFault(p gpu.KernelParams, s gpu.Stream) error {
	if err := h.b.LaunchKernel(p.Func, p.Config, p.Args, s); err != nil {
		return err
	}
	return h.b.StreamSynchronize(s)
}

// recoverDevice resets dev, releases every handle the test made (the reset may
// have destroyed them already) and checks the device works again.
func (h *h) recoverDevice(r gpu.DeviceResetter, dev int) {
	h.Helper()
	h.ok("ResetDevice", r.ResetDevice(dev))
	h.reset = true
	h.releaseAll()
	h.mods, h.fns = map[int]gpu.Module{}, map[string]gpu.Function{}
	const n = 100
	p := h.alloc(dev, 4*n)
	s := h.stream(dev)
	h.launch(h.fillParams(dev, p, 3, n), s)
	h.sync(s)
	h.wantAllF32("a device after ResetDevice", h.downloadF32(p, n), 3)
}

func testFaultUseAfterFree(h *h) {
	r := h.resetter()
	const n = 4096
	p, err := h.b.MemAlloc(0, 4*n)
	h.ok("MemAlloc", err)
	h.ok("MemFree", h.b.MemFree(p))
	s := h.stream(0)
	err = h.runFault(h.fillParams(0, p, 1, n), s)
	h.wantFault("kernel writing freed memory", err, 0, p, 4*n)
	// Sticky: later synchronizing calls on the device report it too.
	h.wantErr("StreamSynchronize after a fault", h.b.StreamSynchronize(s), gpu.ErrIllegalAddress)
	s2, err := h.b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err == nil {
		h.track(streamKey(s2), s2, func() error { return h.b.StreamDestroy(s2) })
		h.wantErr("StreamSynchronize of another stream of a faulted device", h.b.StreamSynchronize(s2), gpu.ErrIllegalAddress)
	}
	h.recoverDevice(r, 0)
}

func testFaultCopyFreed(h *h) {
	r := h.resetter()
	p, err := h.b.MemAlloc(0, 256)
	h.ok("MemAlloc", err)
	h.ok("MemFree", h.b.MemFree(p))
	buf := make([]byte, 256)
	h.wantErr("MemcpyDtoH from freed memory", h.b.MemcpyDtoH(buf, p))
	h.wantErr("MemcpyHtoD into freed memory", h.b.MemcpyHtoD(p, buf))
	h.recoverDevice(r, 0)
}

// testFaultNoAccess runs a kernel over a mapping no device was granted
// access to.
func testFaultNoAccess(h *h) {
	r := h.resetter()
	gran := h.vmm(0)
	c := h.chunk(0, gran)
	p := h.reserve(gran, 0)
	h.mapAt(p, gran, 0, c)
	s := h.stream(0)
	err := h.runFault(h.fillParams(0, p, 1, int(gran/4)), s)
	h.wantFault("kernel over a mapping without MemSetAccess", err, 0, p, gran)
	h.recoverDevice(r, 0)
}

// testFaultOtherDevice runs a device 1 kernel over device 0 memory to which
// only device 0 was granted access: the fault names device 1.
func testFaultOtherDevice(h *h) {
	h.needDevices(2)
	r := h.resetter()
	gran := h.vmm(0)
	p, _ := h.mapped(0, gran)
	s := h.stream(1)
	err := h.runFault(h.fillParams(1, p, 1, int(gran/4)), s)
	h.wantFault("device 1 kernel over memory only device 0 may access", err, 1, p, gran)
	h.recoverDevice(r, 1)
}

var lifecycleTests = []test{
	{name: "CloseEmpty", raw: testCloseEmpty},
	{name: "CloseWithLiveHandles", raw: testCloseLive},
	{name: "ZeroHandles", run: testZeroHandles},
	{name: "InjectedFaults", run: testInjectedFaults},
}

// testInjectedFaults checks gpu.FaultInjector where the backend has it: the
// chosen call fails with ErrInjected and the given error, creates nothing,
// and the calls around it work.
func testInjectedFaults(h *h) {
	inj, ok := gpu.FaultInjectorOf(h.raw)
	if !ok {
		h.Skip("the backend does not implement gpu.FaultInjector")
	}
	defer inj.ClearFaults()
	before, _ := h.counters()
	n0 := inj.Calls("MemAlloc")
	inj.InjectFault("MemAlloc", 0, gpu.ErrOutOfMemory)
	p, err := h.b.MemAlloc(0, 256)
	if h.wantErr("MemAlloc with a fault injected", err, gpu.ErrInjected) {
		if !errors.Is(err, gpu.ErrOutOfMemory) {
			h.Errorf("injected error %v does not wrap the error given to InjectFault", err)
		}
	} else if p != 0 {
		h.track(memKey(p), 0, func() error { return h.b.MemFree(p) })
	}
	if got := inj.Calls("MemAlloc"); got != n0+1 {
		h.Errorf("Calls(MemAlloc) = %d after one call, want %d", got, n0+1)
	}
	h.wantCounters("after an injected MemAlloc failure", before, nil)
	h.alloc(0, 256) // the next call works

	inj.InjectFault("StreamCreate", 1, gpu.ErrInvalidValue) // the second call from now
	h.stream(0)
	_, err = h.b.StreamCreate(0, gpu.StreamDefault, 0)
	h.wantErr("the second StreamCreate after InjectFault(nth 1)", err, gpu.ErrInjected)
	h.stream(0)

	inj.InjectFault("EventCreate", 0, gpu.ErrInvalidValue)
	inj.ClearFaults()
	h.event(0, gpu.EventDefault) // cleared: works
}

func testCloseEmpty(t *testing.T, open opener) {
	b := open(t)
	if c, ok := gpu.LiveHandles(unwrap(b)); ok && !c.IsZero() {
		t.Errorf("a fresh backend has live handles: %v", c)
	}
	if err := b.Close(); err != nil {
		t.Errorf("Close of a backend with nothing live: %v", err)
	}
}

// testCloseLive closes a backend with handles live: Close releases them and,
// when the backend counts handles, reports them in its error.
func testCloseLive(t *testing.T, open opener) {
	b := open(t)
	if _, err := b.MemAlloc(0, 1024); err != nil {
		t.Fatalf("MemAlloc: %v", err)
	}
	if _, err := b.StreamCreate(0, gpu.StreamDefault, 0); err != nil {
		t.Fatalf("StreamCreate: %v", err)
	}
	if _, err := b.ModuleLoad(0, kernels.Module()); err != nil && !errors.Is(err, gpu.ErrNotSupported) {
		t.Fatalf("ModuleLoad: %v", err)
	}
	_, counts := gpu.LiveHandles(unwrap(b))
	err := b.Close()
	if counts && err == nil {
		t.Errorf("Close with an allocation and a stream live returned nil; a backend that counts handles reports them")
	}
	t.Logf("Close with live handles: %v", err)
}

// testZeroHandles passes the zero handle to every method that takes one,
// with every other argument valid.
func testZeroHandles(h *h) {
	const n = 64
	s := h.stream(0)
	e := h.event(0, gpu.EventDefault)
	p := h.alloc(0, 4*n)
	fill := h.fillParams(0, p, 1, n)
	set := f32Memset(p, 1, n)
	cp := gpu.MemcpyParams{Dst: p, Src: p.Add(4 * n / 2), Size: 4 * n / 2}
	g := h.graph(0)
	K := h.addKernel(g, nil, fill)
	M := h.addMemset(g, deps(K), set)
	Cp := h.addMemcpy(g, deps(M), cp)
	child := h.graph(0)
	h.addEmpty(child, nil)
	G := h.addChild(g, nil, child)
	x := h.instantiate(g)
	h.ok("EventRecord", h.b.EventRecord(e, s)) // so that only the zero handle is wrong below
	h.sync(s)
	inv := func(what string, err error) {
		h.Helper()
		h.wantErr(what+" of the zero handle", err, gpu.ErrInvalidHandle)
	}
	inv("StreamQuery", second(h.b.StreamQuery(0)))
	inv("StreamSynchronize", h.b.StreamSynchronize(0))
	inv("StreamWaitEvent(stream)", h.b.StreamWaitEvent(0, e))
	inv("StreamWaitEvent(event)", h.b.StreamWaitEvent(s, 0))
	inv("StreamDestroy", h.b.StreamDestroy(0))
	inv("EventRecord(event)", h.b.EventRecord(0, s))
	inv("EventRecord(stream)", h.b.EventRecord(e, 0))
	inv("EventQuery", second(h.b.EventQuery(0)))
	inv("EventSynchronize", h.b.EventSynchronize(0))
	inv("EventElapsed(start)", second(h.b.EventElapsed(0, e)))
	inv("EventElapsed(end)", second(h.b.EventElapsed(e, 0)))
	inv("EventDestroy", h.b.EventDestroy(0))
	inv("MemFree", h.b.MemFree(0))
	inv("MemcpyHtoDAsync(stream)", h.b.MemcpyHtoDAsync(p, make([]byte, 4), 0))
	inv("MemcpyDtoHAsync(stream)", h.b.MemcpyDtoHAsync(make([]byte, 4), p, 0))
	inv("MemcpyDtoDAsync(stream)", h.b.MemcpyDtoDAsync(p, p.Add(8), 4, 0))
	inv("MemsetAsync(stream)", h.b.MemsetAsync(set, 0))
	if vm, _, err := h.vmOf(0); err == nil {
		inv("MemRelease", vm.MemRelease(0))
	}
	if mo, err := h.memOpsOf(0); err == nil {
		inv("HostFree", mo.HostFree(0))
		inv("StreamWriteValue64 on the zero stream", mo.StreamWriteValue64(0, p, 1))
	}
	inv("ModuleUnload", h.b.ModuleUnload(0))
	inv("ModuleFunction", second(h.b.ModuleFunction(0, kernels.Fill)))
	inv("FuncName", second(h.b.FuncName(0)))
	inv("FuncParamInfo", second(h.b.FuncParamInfo(0)))
	inv("LaunchKernel(function)", h.b.LaunchKernel(0, fill.Config, fill.Args, s))
	inv("LaunchKernel(stream)", h.b.LaunchKernel(fill.Func, fill.Config, fill.Args, 0))
	inv("GraphDestroy", h.b.GraphDestroy(0))
	inv("GraphAddEmptyNode", second(h.b.GraphAddEmptyNode(0, nil)))
	inv("GraphAddKernelNode", second(h.b.GraphAddKernelNode(0, nil, fill)))
	inv("GraphAddMemcpyNode", second(h.b.GraphAddMemcpyNode(0, nil, cp)))
	inv("GraphAddMemsetNode", second(h.b.GraphAddMemsetNode(0, nil, set)))
	inv("GraphAddChildGraphNode(graph)", second(h.b.GraphAddChildGraphNode(0, nil, child)))
	inv("GraphAddChildGraphNode(child)", second(h.b.GraphAddChildGraphNode(g, nil, 0)))
	inv("GraphNodes", second(h.b.GraphNodes(0)))
	inv("GraphNodeType", second(h.b.GraphNodeType(0)))
	inv("GraphNodeDeps", second(h.b.GraphNodeDeps(0)))
	inv("GraphKernelNodeParams", second(h.b.GraphKernelNodeParams(0)))
	inv("GraphChildGraph", second(h.b.GraphChildGraph(0)))
	inv("StreamBeginCapture", h.b.StreamBeginCapture(0))
	inv("StreamEndCapture", second(h.b.StreamEndCapture(0)))
	inv("StreamIsCapturing", second(h.b.StreamIsCapturing(0)))
	inv("GraphInstantiate", second(h.b.GraphInstantiate(0)))
	inv("GraphExecDestroy", h.b.GraphExecDestroy(0))
	inv("GraphLaunch(exec)", h.b.GraphLaunch(0, s))
	inv("GraphLaunch(stream)", h.b.GraphLaunch(x, 0))
	inv("GraphExecUpdate(exec)", h.b.GraphExecUpdate(0, g))
	inv("GraphExecUpdate(graph)", h.b.GraphExecUpdate(x, 0))
	inv("GraphExecKernelNodeSetParams(exec)", h.b.GraphExecKernelNodeSetParams(0, K, fill))
	inv("GraphExecMemcpyNodeSetParams(exec)", h.b.GraphExecMemcpyNodeSetParams(0, Cp, cp))
	inv("GraphExecMemsetNodeSetParams(exec)", h.b.GraphExecMemsetNodeSetParams(0, M, set))
	inv("GraphExecChildGraphNodeSetParams(exec)", h.b.GraphExecChildGraphNodeSetParams(0, G, child))
	inv("GraphExecChildGraphNodeSetParams(child)", h.b.GraphExecChildGraphNodeSetParams(x, G, 0))
	// Zero nodes: ErrInvalidHandle, or ErrInvalidValue as for a node not in the exec's graph.
	for what, err := range map[string]error{
		"GraphExecKernelNodeSetParams(node 0)":     h.b.GraphExecKernelNodeSetParams(x, 0, fill),
		"GraphExecMemcpyNodeSetParams(node 0)":     h.b.GraphExecMemcpyNodeSetParams(x, 0, cp),
		"GraphExecMemsetNodeSetParams(node 0)":     h.b.GraphExecMemsetNodeSetParams(x, 0, set),
		"GraphExecChildGraphNodeSetParams(node 0)": h.b.GraphExecChildGraphNodeSetParams(x, 0, child),
	} {
		h.wantErr(what, err, gpu.ErrInvalidHandle, gpu.ErrInvalidValue)
	}
	// The exec is intact.
	h.launchGraph(x, s)
}

func second[T any](_ T, err error) error { return err }
