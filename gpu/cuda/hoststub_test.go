package cuda

import (
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
	"github.com/stablegraph/stablegraph/kernels"
)

// hostStub is a stub libcuda complete enough to run whole executables
// (package cuda_test's host-path benchmarks and allocation tests): devStub's
// device-side updates, plus stream capture that records the kernels
// launched into the capture's graph (so that traced commands flatten and
// prove their templates as on a GPU), kernel node parameters read back, the
// parameter layout of the built-in kernels, and call counts of the calls a
// step makes. It does no device work: outputs are never computed. The calls
// a step makes are answered first, without a lock.
type hostStub struct {
	*devStub

	counts map[string]*atomic.Int64 // the hot calls; immutable map

	hmu      sync.Mutex
	funcName map[uintptr]string
	capture  map[uintptr]*stubCapture // by stream
	kernels  map[uintptr]*stubKernel  // captured kernel nodes' parameters
}

// stubCapture is a capture in progress: its graph and its last node.
type stubCapture struct {
	g, last uintptr
}

// stubKernel is a captured kernel node's parameters, held for
// cuGraphKernelNodeGetParams_v2.
type stubKernel struct {
	kp    cu.KernelNodeParams
	words []uint64
	ptrs  []unsafe.Pointer
}

// hostStubHot are the calls counted: those of a step.
var hostStubHot = []string{"cuCtxGetCurrent", "cuCtxSetCurrent", "cuGraphExecKernelNodeSetParams_v2", "cuGraphLaunch",
	"cuEventRecord", "cuEventQuery", "cuStreamWriteValue64_v2", "cuGraphExecMemcpyNodeSetParams", "cuGraphExecMemsetNodeSetParams",
	"cuGraphExecChildGraphNodeSetParams", "cuGraphExecUpdate_v2", "cuGraphKernelNodeSetParams_v2", "cuStreamWaitEvent", "cuLaunchKernel",
	"cuMemGetAddressRange_v2", "cuStreamIsCapturing"}

func newHostStub() *hostStub {
	h := &hostStub{devStub: newDevStub(), counts: map[string]*atomic.Int64{},
		funcName: map[uintptr]string{}, capture: map[uintptr]*stubCapture{}, kernels: map[uintptr]*stubKernel{}}
	for _, n := range hostStubHot {
		h.counts[n] = new(atomic.Int64)
	}
	return h
}

// count returns how many times name was called (one of hostStubHot).
func (h *hostStub) count(name string) int64 { return h.counts[name].Load() }

func (h *hostStub) call(name string, a cu.StubArgs) cu.Result {
	if c := h.counts[name]; c != nil {
		c.Add(1)
	}
	switch name {
	case "cuCtxGetCurrent":
		*out[cu.Context](&a, 0) = cu.Context(h.current.Load())
		return cu.Success
	case "cuCtxSetCurrent":
		h.current.Store(a.A[0])
		return cu.Success
	case "cuGraphExecKernelNodeSetParams_v2", "cuGraphLaunch", "cuEventRecord", "cuEventQuery", "cuStreamWriteValue64_v2",
		"cuGraphExecMemcpyNodeSetParams", "cuGraphExecMemsetNodeSetParams", "cuStreamWaitEvent", "cuGraphKernelNodeSetParams_v2",
		"cuStreamSynchronize", "cuEventSynchronize", "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2", "cuStreamWaitValue64_v2":
		return cu.Success
	case "cuLaunchKernel":
		h.hmu.Lock()
		c := h.capture[a.A[8]]
		h.hmu.Unlock()
		if c != nil {
			h.captureKernel(c, a)
		}
		return cu.Success
	case "cuStreamBeginCapture_v2":
		r := h.devStub.call(name, a)
		h.hmu.Lock()
		h.capture[a.A[0]] = &stubCapture{g: h.handle()}
		h.hmu.Unlock()
		return r
	case "cuStreamEndCapture":
		h.devStub.call(name, a) // leaves capture mode
		h.hmu.Lock()
		c := h.capture[a.A[0]]
		delete(h.capture, a.A[0])
		h.hmu.Unlock()
		if c != nil {
			*out[uintptr](&a, 1) = c.g
		}
		return cu.Success
	case "cuGraphKernelNodeGetParams_v2":
		h.hmu.Lock()
		k := h.kernels[a.A[0]]
		h.hmu.Unlock()
		if k == nil {
			return h.devStub.call(name, a)
		}
		*out[cu.KernelNodeParams](&a, 1) = k.kp
		return cu.Success
	case "cuModuleGetFunction": // (f, module, name)
		r := h.devStub.call(name, a)
		f := *out[uintptr](&a, 0)
		h.hmu.Lock()
		h.funcName[f] = cString(out[byte](&a, 2))
		h.hmu.Unlock()
		return r
	case "cuFuncGetParamInfo": // (f, index, offset, size)
		h.hmu.Lock()
		fn := h.funcName[a.A[0]]
		h.hmu.Unlock()
		layout, ok := stubLayout(fn)
		if !ok || a.A[1] >= uintptr(len(layout)) {
			return cu.ErrorInvalidValue
		}
		*out[uint64](&a, 2), *out[uint64](&a, 3) = layout[a.A[1]].Offset, layout[a.A[1]].Size
		return cu.Success
	}
	return h.devStub.call(name, a)
}

// captureKernel records a launch on a capturing stream as a kernel node of
// the capture's graph, after the stream's last node.
func (h *hostStub) captureKernel(c *stubCapture, a cu.StubArgs) {
	h.hmu.Lock()
	layout, _ := stubLayout(h.funcName[a.A[0]])
	h.hmu.Unlock()
	k := &stubKernel{words: make([]uint64, len(layout)), ptrs: make([]unsafe.Pointer, len(layout))}
	params := unsafe.Slice(out[unsafe.Pointer](&a, 9), len(layout))
	for i, p := range layout {
		if p.Size == 4 {
			k.words[i] = uint64(*(*uint32)(params[i]))
		} else {
			k.words[i] = *(*uint64)(params[i])
		}
		k.ptrs[i] = unsafe.Pointer(&k.words[i])
	}
	k.kp = cu.KernelNodeParams{Func: cu.Function(a.A[0]), GridDimX: uint32(a.A[1]), GridDimY: uint32(a.A[2]), GridDimZ: uint32(a.A[3]),
		BlockDimX: uint32(a.A[4]), BlockDimY: uint32(a.A[5]), BlockDimZ: uint32(a.A[6]), SharedMemBytes: uint32(a.A[7])}
	if len(k.ptrs) > 0 {
		k.kp.KernelParams = unsafe.Pointer(&k.ptrs[0])
	}
	n := h.handle()
	sd := h.stubDriver
	sd.mu.Lock()
	sd.nodeTypes[n] = cu.GraphNodeKernel
	sd.graphNodes[c.g] = append(sd.graphNodes[c.g], n)
	if c.last != 0 {
		sd.nodeDeps[n] = []uintptr{c.last}
	}
	sd.kernelFunc[n] = a.A[0]
	sd.mu.Unlock()
	h.hmu.Lock()
	h.kernels[n] = k
	c.last = n
	h.hmu.Unlock()
}

// stubLayout is the parameter layout of a built-in kernel named name: C's,
// each parameter at the next multiple of its size.
func stubLayout(name string) ([]gpu.ParamInfo, bool) {
	for _, img := range []*gpu.ModuleImage{kernels.Module(), kernels.PatcherModule()} {
		if k, ok := img.Kernel(name); ok {
			var out []gpu.ParamInfo
			var off uint64
			for _, kind := range k.Params {
				n := uint64(kind.Size())
				off = (off + n - 1) / n * n
				out = append(out, gpu.ParamInfo{Offset: off, Size: n})
				off += n
			}
			return out, true
		}
	}
	return nil, false
}

func cString(p *byte) string {
	var b []byte
	for q := p; *q != 0; q = (*byte)(unsafe.Add(unsafe.Pointer(q), 1)) {
		b = append(b, *q)
	}
	return string(b)
}
