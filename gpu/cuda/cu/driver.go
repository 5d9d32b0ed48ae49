package cu

import (
	"sync"
	"unsafe"
)

// Driver is a loaded libcuda with its symbols resolved.
type Driver struct {
	// Path is the file that was loaded.
	Path string

	handle uintptr
	fns    []uintptr // indexed by sym; 0 where the symbol is missing
	stub   Stub      // answers every call instead of libcuda (NewStub); nil for a loaded library

	initOnce   sync.Once
	initResult Result
}

// sym indexes driverSyms.
type sym int

const (
	symInit sym = iota
	symDriverGetVersion
	symGetErrorName
	symGetErrorString
	symDeviceGetCount
	symDeviceGet
	symDeviceGetName
	symDeviceTotalMem
	symDeviceGetAttribute
	symDevicePrimaryCtxRetain
	symDevicePrimaryCtxRelease
	symCtxGetCurrent
	symCtxSetCurrent
	symCtxGetStreamPriorityRange
	symCtxSynchronize
	symStreamCreateWithPriority
	symStreamQuery
	symStreamSynchronize
	symStreamWaitEvent
	symStreamDestroy
	symStreamBeginCapture
	symStreamEndCapture
	symStreamIsCapturing
	symStreamWriteValue64
	symStreamWaitValue64
	symEventCreate
	symEventRecord
	symEventQuery
	symEventSynchronize
	symEventElapsedTime
	symEventDestroy
	symMemAlloc
	symMemFree
	symMemGetInfo
	symMemcpyHtoD
	symMemcpyDtoH
	symMemcpyDtoD
	symMemcpyHtoDAsync
	symMemcpyDtoHAsync
	symMemcpyDtoDAsync
	symMemsetD8
	symMemsetD16
	symMemsetD32
	symMemsetD8Async
	symMemsetD16Async
	symMemsetD32Async
	symMemGetAllocationGranularity
	symMemCreate
	symMemRelease
	symMemAddressReserve
	symMemAddressFree
	symMemMap
	symMemUnmap
	symMemSetAccess
	symMemHostAlloc
	symMemFreeHost
	symMemHostGetDevicePointer
	symPointerGetAttribute
	symModuleLoadDataEx
	symModuleUnload
	symModuleGetFunction
	symFuncGetParamInfo
	symFuncGetName
	symKernelGetFunction
	symLaunchKernel
	symGraphCreate
	symGraphDestroy
	symGraphAddKernelNode
	symGraphAddMemcpyNode
	symGraphAddMemsetNode
	symGraphAddChildGraphNode
	symGraphAddEmptyNode
	symGraphGetNodes
	symGraphNodeGetType
	symGraphNodeGetDependenciesV2
	symGraphNodeGetDependenciesV1
	symGraphKernelNodeGetParams
	symGraphChildGraphNodeGetGraph
	symGraphInstantiate
	symGraphExecDestroy
	symGraphLaunch
	symGraphExecUpdate
	symGraphExecKernelNodeSetParams
	symGraphExecMemcpyNodeSetParams
	symGraphExecMemsetNodeSetParams
	symGraphExecChildGraphNodeSetParams
	symMemGetAddressRange
	// Device-updatable kernel nodes and root nodes (devupdate.go).
	symGraphKernelNodeSetAttribute
	symGraphKernelNodeGetAttribute
	symGraphUpload
	symGraphGetRootNodes
	symGraphAddDependenciesV2
	symGraphAddDependenciesV1
	symGraphDestroyNode
	symGraphMemcpyNodeGetParams
	symGraphMemsetNodeGetParams
	// Host-side node parameters of a graph (a host template of an exec).
	symGraphKernelNodeSetParams
	symGraphMemcpyNodeSetParams
	symGraphMemsetNodeSetParams
	numSyms
)

// driverSyms names each symbol. Versioned names are the ones cuda.h maps the
// plain names to on CUDA 12/13 (cuMemAlloc -> cuMemAlloc_v2, ...); where an
// older name has the same signature it follows as a fallback.
var driverSyms = [numSyms]symSpec{
	symInit:                         {names: []string{"cuInit"}, required: true},
	symDriverGetVersion:             {names: []string{"cuDriverGetVersion"}, required: true},
	symGetErrorName:                 {names: []string{"cuGetErrorName"}},
	symGetErrorString:               {names: []string{"cuGetErrorString"}},
	symDeviceGetCount:               {names: []string{"cuDeviceGetCount"}, required: true},
	symDeviceGet:                    {names: []string{"cuDeviceGet"}, required: true},
	symDeviceGetName:                {names: []string{"cuDeviceGetName"}},
	symDeviceTotalMem:               {names: []string{"cuDeviceTotalMem_v2"}},
	symDeviceGetAttribute:           {names: []string{"cuDeviceGetAttribute"}, required: true},
	symDevicePrimaryCtxRetain:       {names: []string{"cuDevicePrimaryCtxRetain"}, required: true},
	symDevicePrimaryCtxRelease:      {names: []string{"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"}, required: true},
	symCtxGetCurrent:                {names: []string{"cuCtxGetCurrent"}, required: true},
	symCtxSetCurrent:                {names: []string{"cuCtxSetCurrent"}, required: true},
	symCtxGetStreamPriorityRange:    {names: []string{"cuCtxGetStreamPriorityRange"}},
	symCtxSynchronize:               {names: []string{"cuCtxSynchronize"}},
	symStreamCreateWithPriority:     {names: []string{"cuStreamCreateWithPriority"}},
	symStreamQuery:                  {names: []string{"cuStreamQuery"}},
	symStreamSynchronize:            {names: []string{"cuStreamSynchronize"}},
	symStreamWaitEvent:              {names: []string{"cuStreamWaitEvent"}},
	symStreamDestroy:                {names: []string{"cuStreamDestroy_v2"}},
	symStreamBeginCapture:           {names: []string{"cuStreamBeginCapture_v2"}},
	symStreamEndCapture:             {names: []string{"cuStreamEndCapture"}},
	symStreamIsCapturing:            {names: []string{"cuStreamIsCapturing"}},
	symStreamWriteValue64:           {names: []string{"cuStreamWriteValue64_v2", "cuStreamWriteValue64"}},
	symStreamWaitValue64:            {names: []string{"cuStreamWaitValue64_v2", "cuStreamWaitValue64"}},
	symEventCreate:                  {names: []string{"cuEventCreate"}},
	symEventRecord:                  {names: []string{"cuEventRecord"}},
	symEventQuery:                   {names: []string{"cuEventQuery"}},
	symEventSynchronize:             {names: []string{"cuEventSynchronize"}},
	symEventElapsedTime:             {names: []string{"cuEventElapsedTime_v2", "cuEventElapsedTime"}},
	symEventDestroy:                 {names: []string{"cuEventDestroy_v2"}},
	symMemAlloc:                     {names: []string{"cuMemAlloc_v2"}},
	symMemFree:                      {names: []string{"cuMemFree_v2"}},
	symMemGetInfo:                   {names: []string{"cuMemGetInfo_v2"}},
	symMemcpyHtoD:                   {names: []string{"cuMemcpyHtoD_v2"}},
	symMemcpyDtoH:                   {names: []string{"cuMemcpyDtoH_v2"}},
	symMemcpyDtoD:                   {names: []string{"cuMemcpyDtoD_v2"}},
	symMemcpyHtoDAsync:              {names: []string{"cuMemcpyHtoDAsync_v2"}},
	symMemcpyDtoHAsync:              {names: []string{"cuMemcpyDtoHAsync_v2"}},
	symMemcpyDtoDAsync:              {names: []string{"cuMemcpyDtoDAsync_v2"}},
	symMemsetD8:                     {names: []string{"cuMemsetD8_v2"}},
	symMemsetD16:                    {names: []string{"cuMemsetD16_v2"}},
	symMemsetD32:                    {names: []string{"cuMemsetD32_v2"}},
	symMemsetD8Async:                {names: []string{"cuMemsetD8Async"}},
	symMemsetD16Async:               {names: []string{"cuMemsetD16Async"}},
	symMemsetD32Async:               {names: []string{"cuMemsetD32Async"}},
	symMemGetAllocationGranularity:  {names: []string{"cuMemGetAllocationGranularity"}},
	symMemCreate:                    {names: []string{"cuMemCreate"}},
	symMemRelease:                   {names: []string{"cuMemRelease"}},
	symMemAddressReserve:            {names: []string{"cuMemAddressReserve"}},
	symMemAddressFree:               {names: []string{"cuMemAddressFree"}},
	symMemMap:                       {names: []string{"cuMemMap"}},
	symMemUnmap:                     {names: []string{"cuMemUnmap"}},
	symMemSetAccess:                 {names: []string{"cuMemSetAccess"}},
	symMemHostAlloc:                 {names: []string{"cuMemHostAlloc"}},
	symMemFreeHost:                  {names: []string{"cuMemFreeHost"}},
	symMemHostGetDevicePointer:      {names: []string{"cuMemHostGetDevicePointer_v2"}},
	symPointerGetAttribute:          {names: []string{"cuPointerGetAttribute"}},
	symModuleLoadDataEx:             {names: []string{"cuModuleLoadDataEx"}},
	symModuleUnload:                 {names: []string{"cuModuleUnload"}},
	symModuleGetFunction:            {names: []string{"cuModuleGetFunction"}},
	symFuncGetParamInfo:             {names: []string{"cuFuncGetParamInfo"}},
	symFuncGetName:                  {names: []string{"cuFuncGetName"}},
	symKernelGetFunction:            {names: []string{"cuKernelGetFunction"}},
	symLaunchKernel:                 {names: []string{"cuLaunchKernel"}},
	symGraphCreate:                  {names: []string{"cuGraphCreate"}},
	symGraphDestroy:                 {names: []string{"cuGraphDestroy"}},
	symGraphAddKernelNode:           {names: []string{"cuGraphAddKernelNode_v2"}},
	symGraphAddMemcpyNode:           {names: []string{"cuGraphAddMemcpyNode"}},
	symGraphAddMemsetNode:           {names: []string{"cuGraphAddMemsetNode"}},
	symGraphAddChildGraphNode:       {names: []string{"cuGraphAddChildGraphNode"}},
	symGraphAddEmptyNode:            {names: []string{"cuGraphAddEmptyNode"}},
	symGraphGetNodes:                {names: []string{"cuGraphGetNodes"}},
	symGraphNodeGetType:             {names: []string{"cuGraphNodeGetType"}},
	symGraphNodeGetDependenciesV2:   {names: []string{"cuGraphNodeGetDependencies_v2"}},
	symGraphNodeGetDependenciesV1:   {names: []string{"cuGraphNodeGetDependencies"}},
	symGraphKernelNodeGetParams:     {names: []string{"cuGraphKernelNodeGetParams_v2"}},
	symGraphChildGraphNodeGetGraph:  {names: []string{"cuGraphChildGraphNodeGetGraph"}},
	symGraphInstantiate:             {names: []string{"cuGraphInstantiateWithFlags"}},
	symGraphExecDestroy:             {names: []string{"cuGraphExecDestroy"}},
	symGraphLaunch:                  {names: []string{"cuGraphLaunch"}},
	symGraphExecUpdate:              {names: []string{"cuGraphExecUpdate_v2"}},
	symGraphExecKernelNodeSetParams: {names: []string{"cuGraphExecKernelNodeSetParams_v2"}},
	symGraphExecMemcpyNodeSetParams: {names: []string{"cuGraphExecMemcpyNodeSetParams"}},
	symGraphExecMemsetNodeSetParams: {names: []string{"cuGraphExecMemsetNodeSetParams"}},
	symGraphExecChildGraphNodeSetParams: {
		names: []string{"cuGraphExecChildGraphNodeSetParams"}},
	symMemGetAddressRange:          {names: []string{"cuMemGetAddressRange_v2"}},
	symGraphKernelNodeSetAttribute: {names: []string{"cuGraphKernelNodeSetAttribute"}},
	symGraphKernelNodeGetAttribute: {names: []string{"cuGraphKernelNodeGetAttribute"}},
	symGraphUpload:                 {names: []string{"cuGraphUpload"}},
	symGraphGetRootNodes:           {names: []string{"cuGraphGetRootNodes"}},
	symGraphAddDependenciesV2:      {names: []string{"cuGraphAddDependencies_v2"}},
	symGraphAddDependenciesV1:      {names: []string{"cuGraphAddDependencies"}},
	symGraphDestroyNode:            {names: []string{"cuGraphDestroyNode"}},
	symGraphMemcpyNodeGetParams:    {names: []string{"cuGraphMemcpyNodeGetParams"}},
	symGraphMemsetNodeGetParams:    {names: []string{"cuGraphMemsetNodeGetParams"}},
	symGraphKernelNodeSetParams:    {names: []string{"cuGraphKernelNodeSetParams_v2"}},
	symGraphMemcpyNodeSetParams:    {names: []string{"cuGraphMemcpyNodeSetParams"}},
	symGraphMemsetNodeSetParams:    {names: []string{"cuGraphMemsetNodeSetParams"}},
}

// Open loads libcuda: the file named by explicit, or else the first of
// Candidates("") that loads and exports the required symbols. It does not
// call cuInit (see Init). The result is cached per explicit path.
func Open(explicit string) (*Driver, error) {
	cache.Lock()
	defer cache.Unlock()
	if d, ok := cache.drivers[explicit]; ok {
		return d, nil
	}
	h, path, fns, err := resolve(cudaSpec, explicit, driverSyms[:])
	if err != nil {
		return nil, err
	}
	d := &Driver{Path: path, handle: h, fns: fns}
	if cache.drivers == nil {
		cache.drivers = map[string]*Driver{}
	}
	cache.drivers[explicit] = d
	return d, nil
}

// Has reports whether the C function name (as in cuda.h after its version
// mapping, e.g. "cuStreamWriteValue64_v2" or "cuStreamWriteValue64") was
// resolved, under that name or its fallback.
func (d *Driver) Has(name string) bool {
	for i, s := range driverSyms {
		for _, n := range s.names {
			if n == name {
				return d.fns[i] != 0
			}
		}
	}
	return false
}

// Missing lists the optional symbols the library does not export (by their
// preferred names).
func (d *Driver) Missing() []string {
	var out []string
	for i, s := range driverSyms {
		if d.fns[i] == 0 {
			out = append(out, s.names[0])
		}
	}
	return out
}

// Init calls cuInit(0) once per process and library and returns its result
// every time.
func (d *Driver) Init() Result {
	d.initOnce.Do(func() { d.initResult = d.call1(symInit, 0) })
	return d.initResult
}

func (d *Driver) DriverGetVersion(v *int32) Result {
	return d.call1(symDriverGetVersion, uintptr(unsafe.Pointer(v)))
}

// GetErrorName is the driver's name of r, or "" when it has none.
func (d *Driver) GetErrorName(r Result) string {
	var p *byte
	if d.call2(symGetErrorName, uintptr(r), uintptr(unsafe.Pointer(&p))) != Success {
		return ""
	}
	return GoString(p)
}

// GetErrorString is the driver's description of r, or "" when it has none.
func (d *Driver) GetErrorString(r Result) string {
	var p *byte
	if d.call2(symGetErrorString, uintptr(r), uintptr(unsafe.Pointer(&p))) != Success {
		return ""
	}
	return GoString(p)
}

// GoString copies the NUL-terminated C string at p (nil gives "").
func GoString(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

// CString returns s as a NUL-terminated byte slice for C.
func CString(s string) []byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return b
}

func (d *Driver) DeviceGetCount(n *int32) Result {
	return d.call1(symDeviceGetCount, uintptr(unsafe.Pointer(n)))
}

func (d *Driver) DeviceGet(dev *Device, ordinal int) Result {
	return d.call2(symDeviceGet, uintptr(unsafe.Pointer(dev)), uintptr(ordinal))
}

// DeviceGetName fills buf (NUL-terminated) with the device's name.
func (d *Driver) DeviceGetName(buf []byte, dev Device) Result {
	if len(buf) == 0 {
		return ErrorInvalidValue
	}
	return d.call3(symDeviceGetName, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(dev))
}

func (d *Driver) DeviceTotalMem(bytes *uint64, dev Device) Result {
	return d.call2(symDeviceTotalMem, uintptr(unsafe.Pointer(bytes)), uintptr(dev))
}

func (d *Driver) DeviceGetAttribute(v *int32, attr DeviceAttribute, dev Device) Result {
	return d.call3(symDeviceGetAttribute, uintptr(unsafe.Pointer(v)), uintptr(attr), uintptr(dev))
}

func (d *Driver) DevicePrimaryCtxRetain(ctx *Context, dev Device) Result {
	return d.call2(symDevicePrimaryCtxRetain, uintptr(unsafe.Pointer(ctx)), uintptr(dev))
}

func (d *Driver) DevicePrimaryCtxRelease(dev Device) Result {
	return d.call1(symDevicePrimaryCtxRelease, uintptr(dev))
}

func (d *Driver) CtxGetCurrent(ctx *Context) Result {
	return d.call1(symCtxGetCurrent, uintptr(unsafe.Pointer(ctx)))
}

func (d *Driver) CtxSetCurrent(ctx Context) Result {
	return d.call1(symCtxSetCurrent, uintptr(ctx))
}

func (d *Driver) CtxGetStreamPriorityRange(least, greatest *int32) Result {
	return d.call2(symCtxGetStreamPriorityRange, uintptr(unsafe.Pointer(least)), uintptr(unsafe.Pointer(greatest)))
}

func (d *Driver) CtxSynchronize() Result { return d.call0(symCtxSynchronize) }

func (d *Driver) StreamCreateWithPriority(s *Stream, flags uint32, priority int32) Result {
	return d.call3(symStreamCreateWithPriority, uintptr(unsafe.Pointer(s)), uintptr(flags), uintptr(priority))
}

func (d *Driver) StreamQuery(s Stream) Result       { return d.call1(symStreamQuery, uintptr(s)) }
func (d *Driver) StreamSynchronize(s Stream) Result { return d.call1(symStreamSynchronize, uintptr(s)) }
func (d *Driver) StreamDestroy(s Stream) Result     { return d.call1(symStreamDestroy, uintptr(s)) }

func (d *Driver) StreamWaitEvent(s Stream, e Event, flags uint32) Result {
	return d.call3(symStreamWaitEvent, uintptr(s), uintptr(e), uintptr(flags))
}

func (d *Driver) StreamBeginCapture(s Stream, mode StreamCaptureMode) Result {
	return d.call2(symStreamBeginCapture, uintptr(s), uintptr(mode))
}

func (d *Driver) StreamEndCapture(s Stream, g *Graph) Result {
	return d.call2(symStreamEndCapture, uintptr(s), uintptr(unsafe.Pointer(g)))
}

func (d *Driver) StreamIsCapturing(s Stream, status *StreamCaptureStatus) Result {
	return d.call2(symStreamIsCapturing, uintptr(s), uintptr(unsafe.Pointer(status)))
}

func (d *Driver) StreamWriteValue64(s Stream, addr DevicePtr, v uint64, flags uint32) Result {
	return d.call4(symStreamWriteValue64, uintptr(s), uintptr(addr), uintptr(v), uintptr(flags))
}

// StreamWaitValue64 is cuStreamWaitValue64_v2: later work on s waits until
// the word at addr satisfies the condition flags name
// (StreamWaitValueGEQ: int64(*addr - v) >= 0).
func (d *Driver) StreamWaitValue64(s Stream, addr DevicePtr, v uint64, flags uint32) Result {
	return d.call4(symStreamWaitValue64, uintptr(s), uintptr(addr), uintptr(v), uintptr(flags))
}

func (d *Driver) EventCreate(e *Event, flags uint32) Result {
	return d.call2(symEventCreate, uintptr(unsafe.Pointer(e)), uintptr(flags))
}

func (d *Driver) EventRecord(e Event, s Stream) Result {
	return d.call2(symEventRecord, uintptr(e), uintptr(s))
}

func (d *Driver) EventQuery(e Event) Result       { return d.call1(symEventQuery, uintptr(e)) }
func (d *Driver) EventSynchronize(e Event) Result { return d.call1(symEventSynchronize, uintptr(e)) }
func (d *Driver) EventDestroy(e Event) Result     { return d.call1(symEventDestroy, uintptr(e)) }

func (d *Driver) EventElapsedTime(ms *float32, start, end Event) Result {
	return d.call3(symEventElapsedTime, uintptr(unsafe.Pointer(ms)), uintptr(start), uintptr(end))
}

func (d *Driver) MemAlloc(p *DevicePtr, size uint64) Result {
	return d.call2(symMemAlloc, uintptr(unsafe.Pointer(p)), uintptr(size))
}

func (d *Driver) MemFree(p DevicePtr) Result { return d.call1(symMemFree, uintptr(p)) }

func (d *Driver) MemGetInfo(free, total *uint64) Result {
	return d.call2(symMemGetInfo, uintptr(unsafe.Pointer(free)), uintptr(unsafe.Pointer(total)))
}

// MemcpyHtoD copies len(src) bytes; src must not be empty.
func (d *Driver) MemcpyHtoD(dst DevicePtr, src []byte) Result {
	return d.call3(symMemcpyHtoD, uintptr(dst), uintptr(unsafe.Pointer(unsafe.SliceData(src))), uintptr(len(src)))
}

// MemcpyDtoH copies len(dst) bytes; dst must not be empty.
func (d *Driver) MemcpyDtoH(dst []byte, src DevicePtr) Result {
	return d.call3(symMemcpyDtoH, uintptr(unsafe.Pointer(unsafe.SliceData(dst))), uintptr(src), uintptr(len(dst)))
}

func (d *Driver) MemcpyDtoD(dst, src DevicePtr, n uint64) Result {
	return d.call3(symMemcpyDtoD, uintptr(dst), uintptr(src), uintptr(n))
}

func (d *Driver) MemcpyHtoDAsync(dst DevicePtr, src []byte, s Stream) Result {
	return d.call4(symMemcpyHtoDAsync, uintptr(dst), uintptr(unsafe.Pointer(unsafe.SliceData(src))), uintptr(len(src)), uintptr(s))
}

func (d *Driver) MemcpyDtoHAsync(dst []byte, src DevicePtr, s Stream) Result {
	return d.call4(symMemcpyDtoHAsync, uintptr(unsafe.Pointer(unsafe.SliceData(dst))), uintptr(src), uintptr(len(dst)), uintptr(s))
}

func (d *Driver) MemcpyDtoDAsync(dst, src DevicePtr, n uint64, s Stream) Result {
	return d.call4(symMemcpyDtoDAsync, uintptr(dst), uintptr(src), uintptr(n), uintptr(s))
}

func (d *Driver) MemsetD8(dst DevicePtr, v uint8, n uint64) Result {
	return d.call3(symMemsetD8, uintptr(dst), uintptr(v), uintptr(n))
}

func (d *Driver) MemsetD16(dst DevicePtr, v uint16, n uint64) Result {
	return d.call3(symMemsetD16, uintptr(dst), uintptr(v), uintptr(n))
}

func (d *Driver) MemsetD32(dst DevicePtr, v uint32, n uint64) Result {
	return d.call3(symMemsetD32, uintptr(dst), uintptr(v), uintptr(n))
}

func (d *Driver) MemsetD8Async(dst DevicePtr, v uint8, n uint64, s Stream) Result {
	return d.call4(symMemsetD8Async, uintptr(dst), uintptr(v), uintptr(n), uintptr(s))
}

func (d *Driver) MemsetD16Async(dst DevicePtr, v uint16, n uint64, s Stream) Result {
	return d.call4(symMemsetD16Async, uintptr(dst), uintptr(v), uintptr(n), uintptr(s))
}

func (d *Driver) MemsetD32Async(dst DevicePtr, v uint32, n uint64, s Stream) Result {
	return d.call4(symMemsetD32Async, uintptr(dst), uintptr(v), uintptr(n), uintptr(s))
}

func (d *Driver) MemGetAllocationGranularity(gran *uint64, prop *MemAllocationProp, option int) Result {
	return d.call3(symMemGetAllocationGranularity, uintptr(unsafe.Pointer(gran)), uintptr(unsafe.Pointer(prop)), uintptr(option))
}

func (d *Driver) MemCreate(h *MemHandle, size uint64, prop *MemAllocationProp, flags uint64) Result {
	return d.call4(symMemCreate, uintptr(unsafe.Pointer(h)), uintptr(size), uintptr(unsafe.Pointer(prop)), uintptr(flags))
}

func (d *Driver) MemRelease(h MemHandle) Result { return d.call1(symMemRelease, uintptr(h)) }

func (d *Driver) MemAddressReserve(p *DevicePtr, size, align uint64, addr DevicePtr, flags uint64) Result {
	return d.call5(symMemAddressReserve, uintptr(unsafe.Pointer(p)), uintptr(size), uintptr(align), uintptr(addr), uintptr(flags))
}

func (d *Driver) MemAddressFree(p DevicePtr, size uint64) Result {
	return d.call2(symMemAddressFree, uintptr(p), uintptr(size))
}

func (d *Driver) MemMap(p DevicePtr, size, offset uint64, h MemHandle, flags uint64) Result {
	return d.call5(symMemMap, uintptr(p), uintptr(size), uintptr(offset), uintptr(h), uintptr(flags))
}

func (d *Driver) MemUnmap(p DevicePtr, size uint64) Result {
	return d.call2(symMemUnmap, uintptr(p), uintptr(size))
}

// MemSetAccess applies descs (at least one) to [p, p+size).
func (d *Driver) MemSetAccess(p DevicePtr, size uint64, descs []MemAccessDesc) Result {
	if len(descs) == 0 {
		return ErrorInvalidValue
	}
	return d.call4(symMemSetAccess, uintptr(p), uintptr(size), uintptr(unsafe.Pointer(&descs[0])), uintptr(len(descs)))
}

// MemHostAlloc allocates pinned host memory; *pp receives its address (C
// memory, outside the Go heap).
func (d *Driver) MemHostAlloc(pp *unsafe.Pointer, size uint64, flags uint32) Result {
	return d.call3(symMemHostAlloc, uintptr(unsafe.Pointer(pp)), uintptr(size), uintptr(flags))
}

func (d *Driver) MemFreeHost(p unsafe.Pointer) Result {
	return d.call1(symMemFreeHost, uintptr(p))
}

func (d *Driver) MemHostGetDevicePointer(dp *DevicePtr, p unsafe.Pointer, flags uint32) Result {
	return d.call3(symMemHostGetDevicePointer, uintptr(unsafe.Pointer(dp)), uintptr(p), uintptr(flags))
}

// PointerGetAttributeInt reads an int-valued pointer attribute.
func (d *Driver) PointerGetAttributeInt(v *int32, attr PointerAttribute, p DevicePtr) Result {
	return d.call3(symPointerGetAttribute, uintptr(unsafe.Pointer(v)), uintptr(attr), uintptr(p))
}

// ModuleLoadDataEx loads a NUL-terminated PTX (or cubin) image. opts and
// vals are parallel: CUjit_option values and their void* values, written as
// integers. A value that points at Go memory (a log buffer) must be pinned by
// the caller for the duration of the call.
func (d *Driver) ModuleLoadDataEx(m *Module, image []byte, opts []uint32, vals []uintptr) Result {
	if len(image) == 0 || len(opts) != len(vals) {
		return ErrorInvalidValue
	}
	var po *uint32
	var pv *uintptr
	if len(opts) > 0 {
		po, pv = &opts[0], &vals[0]
	}
	return d.call5(symModuleLoadDataEx, uintptr(unsafe.Pointer(m)), uintptr(unsafe.Pointer(&image[0])),
		uintptr(len(opts)), uintptr(unsafe.Pointer(po)), uintptr(unsafe.Pointer(pv)))
}

func (d *Driver) ModuleUnload(m Module) Result { return d.call1(symModuleUnload, uintptr(m)) }

// ModuleGetFunction looks up the kernel named by the NUL-terminated name.
func (d *Driver) ModuleGetFunction(f *Function, m Module, name []byte) Result {
	if len(name) == 0 || name[len(name)-1] != 0 {
		return ErrorInvalidValue
	}
	return d.call3(symModuleGetFunction, uintptr(unsafe.Pointer(f)), uintptr(m), uintptr(unsafe.Pointer(&name[0])))
}

// FuncGetParamInfo is the offset and size of parameter index of f; an index
// past the last parameter gives ErrorInvalidValue (the way to count them on
// drivers without cuFuncGetParamCount, such as 580).
func (d *Driver) FuncGetParamInfo(f Function, index uint64, offset, size *uint64) Result {
	return d.call4(symFuncGetParamInfo, uintptr(f), uintptr(index), uintptr(unsafe.Pointer(offset)), uintptr(unsafe.Pointer(size)))
}

// FuncGetName returns f's (possibly mangled) name.
func (d *Driver) FuncGetName(f Function) (string, Result) {
	var p *byte
	r := d.call2(symFuncGetName, uintptr(unsafe.Pointer(&p)), uintptr(f))
	if r != Success {
		return "", r
	}
	return GoString(p), Success
}

func (d *Driver) KernelGetFunction(f *Function, k Kernel) Result {
	return d.call2(symKernelGetFunction, uintptr(unsafe.Pointer(f)), uintptr(k))
}

// LaunchKernel launches f; params is the void** array of argument pointers
// (nil for a kernel without parameters).
func (d *Driver) LaunchKernel(f Function, gx, gy, gz, bx, by, bz, shared uint32, s Stream, params *unsafe.Pointer) Result {
	return d.call11(symLaunchKernel, uintptr(f), uintptr(gx), uintptr(gy), uintptr(gz), uintptr(bx), uintptr(by), uintptr(bz),
		uintptr(shared), uintptr(s), uintptr(unsafe.Pointer(params)), 0)
}

func (d *Driver) GraphCreate(g *Graph, flags uint32) Result {
	return d.call2(symGraphCreate, uintptr(unsafe.Pointer(g)), uintptr(flags))
}

func (d *Driver) GraphDestroy(g Graph) Result { return d.call1(symGraphDestroy, uintptr(g)) }

// nodesArg returns the pointer and count C takes for a dependency list.
func nodesArg(deps []GraphNode) (*GraphNode, uintptr) {
	if len(deps) == 0 {
		return nil, 0
	}
	return &deps[0], uintptr(len(deps))
}

func (d *Driver) GraphAddKernelNode(n *GraphNode, g Graph, deps []GraphNode, p *KernelNodeParams) Result {
	dp, nd := nodesArg(deps)
	return d.call5(symGraphAddKernelNode, uintptr(unsafe.Pointer(n)), uintptr(g), uintptr(unsafe.Pointer(dp)), nd, uintptr(unsafe.Pointer(p)))
}

func (d *Driver) GraphAddMemcpyNode(n *GraphNode, g Graph, deps []GraphNode, p *Memcpy3D, ctx Context) Result {
	dp, nd := nodesArg(deps)
	return d.call6(symGraphAddMemcpyNode, uintptr(unsafe.Pointer(n)), uintptr(g), uintptr(unsafe.Pointer(dp)), nd, uintptr(unsafe.Pointer(p)), uintptr(ctx))
}

func (d *Driver) GraphAddMemsetNode(n *GraphNode, g Graph, deps []GraphNode, p *MemsetNodeParams, ctx Context) Result {
	dp, nd := nodesArg(deps)
	return d.call6(symGraphAddMemsetNode, uintptr(unsafe.Pointer(n)), uintptr(g), uintptr(unsafe.Pointer(dp)), nd, uintptr(unsafe.Pointer(p)), uintptr(ctx))
}

func (d *Driver) GraphAddChildGraphNode(n *GraphNode, g Graph, deps []GraphNode, child Graph) Result {
	dp, nd := nodesArg(deps)
	return d.call5(symGraphAddChildGraphNode, uintptr(unsafe.Pointer(n)), uintptr(g), uintptr(unsafe.Pointer(dp)), nd, uintptr(child))
}

func (d *Driver) GraphAddEmptyNode(n *GraphNode, g Graph, deps []GraphNode) Result {
	dp, nd := nodesArg(deps)
	return d.call4(symGraphAddEmptyNode, uintptr(unsafe.Pointer(n)), uintptr(g), uintptr(unsafe.Pointer(dp)), nd)
}

// GraphGetNodes fills nodes (nil to only count) and sets *count to the
// number of nodes of g.
func (d *Driver) GraphGetNodes(g Graph, nodes []GraphNode, count *uint64) Result {
	*count = uint64(len(nodes))
	var p *GraphNode
	if len(nodes) > 0 {
		p = &nodes[0]
	}
	return d.call3(symGraphGetNodes, uintptr(g), uintptr(unsafe.Pointer(p)), uintptr(unsafe.Pointer(count)))
}

func (d *Driver) GraphNodeGetType(n GraphNode, t *GraphNodeType) Result {
	return d.call2(symGraphNodeGetType, uintptr(n), uintptr(unsafe.Pointer(t)))
}

// GraphNodeGetDependencies fills deps (nil to only count) and sets *count.
// It uses cuGraphNodeGetDependencies_v2 (CUDA 12.3+, edge data not asked
// for) and falls back to the three-argument original.
func (d *Driver) GraphNodeGetDependencies(n GraphNode, deps []GraphNode, count *uint64) Result {
	*count = uint64(len(deps))
	var p *GraphNode
	if len(deps) > 0 {
		p = &deps[0]
	}
	if d.fns[symGraphNodeGetDependenciesV2] != 0 {
		return d.call4(symGraphNodeGetDependenciesV2, uintptr(n), uintptr(unsafe.Pointer(p)), 0, uintptr(unsafe.Pointer(count)))
	}
	return d.call3(symGraphNodeGetDependenciesV1, uintptr(n), uintptr(unsafe.Pointer(p)), uintptr(unsafe.Pointer(count)))
}

func (d *Driver) GraphKernelNodeGetParams(n GraphNode, p *KernelNodeParams) Result {
	return d.call2(symGraphKernelNodeGetParams, uintptr(n), uintptr(unsafe.Pointer(p)))
}

// GraphKernelNodeSetParams sets a kernel node's parameters in its graph (not
// in an exec made from it).
func (d *Driver) GraphKernelNodeSetParams(n GraphNode, p *KernelNodeParams) Result {
	return d.call2(symGraphKernelNodeSetParams, uintptr(n), uintptr(unsafe.Pointer(p)))
}

// GraphMemcpyNodeSetParams sets a memcpy node's parameters in its graph.
func (d *Driver) GraphMemcpyNodeSetParams(n GraphNode, p *Memcpy3D) Result {
	return d.call2(symGraphMemcpyNodeSetParams, uintptr(n), uintptr(unsafe.Pointer(p)))
}

// GraphMemsetNodeSetParams sets a memset node's parameters in its graph.
func (d *Driver) GraphMemsetNodeSetParams(n GraphNode, p *MemsetNodeParams) Result {
	return d.call2(symGraphMemsetNodeSetParams, uintptr(n), uintptr(unsafe.Pointer(p)))
}

func (d *Driver) GraphChildGraphNodeGetGraph(n GraphNode, g *Graph) Result {
	return d.call2(symGraphChildGraphNodeGetGraph, uintptr(n), uintptr(unsafe.Pointer(g)))
}

func (d *Driver) GraphInstantiate(x *GraphExec, g Graph, flags uint64) Result {
	return d.call3(symGraphInstantiate, uintptr(unsafe.Pointer(x)), uintptr(g), uintptr(flags))
}

func (d *Driver) GraphExecDestroy(x GraphExec) Result {
	return d.call1(symGraphExecDestroy, uintptr(x))
}

func (d *Driver) GraphLaunch(x GraphExec, s Stream) Result {
	return d.call2(symGraphLaunch, uintptr(x), uintptr(s))
}

func (d *Driver) GraphExecUpdate(x GraphExec, g Graph, info *GraphExecUpdateResultInfo) Result {
	return d.call3(symGraphExecUpdate, uintptr(x), uintptr(g), uintptr(unsafe.Pointer(info)))
}

func (d *Driver) GraphExecKernelNodeSetParams(x GraphExec, n GraphNode, p *KernelNodeParams) Result {
	return d.call3(symGraphExecKernelNodeSetParams, uintptr(x), uintptr(n), uintptr(unsafe.Pointer(p)))
}

func (d *Driver) GraphExecMemcpyNodeSetParams(x GraphExec, n GraphNode, p *Memcpy3D, ctx Context) Result {
	return d.call4(symGraphExecMemcpyNodeSetParams, uintptr(x), uintptr(n), uintptr(unsafe.Pointer(p)), uintptr(ctx))
}

func (d *Driver) GraphExecMemsetNodeSetParams(x GraphExec, n GraphNode, p *MemsetNodeParams, ctx Context) Result {
	return d.call4(symGraphExecMemsetNodeSetParams, uintptr(x), uintptr(n), uintptr(unsafe.Pointer(p)), uintptr(ctx))
}

func (d *Driver) GraphExecChildGraphNodeSetParams(x GraphExec, n GraphNode, child Graph) Result {
	return d.call3(symGraphExecChildGraphNodeSetParams, uintptr(x), uintptr(n), uintptr(child))
}

// MemGetAddressRange sets *base and *size to the allocation holding p. For
// virtual memory it reports the one physical allocation mapped at p, not
// the run of mappings around it.
func (d *Driver) MemGetAddressRange(base *DevicePtr, size *uint64, p DevicePtr) Result {
	return d.call3(symMemGetAddressRange, uintptr(unsafe.Pointer(base)), uintptr(unsafe.Pointer(size)), uintptr(p))
}

// GraphMemcpyNodeGetParams reads a memcpy node's parameters (captured
// copies included).
func (d *Driver) GraphMemcpyNodeGetParams(n GraphNode, p *Memcpy3D) Result {
	return d.call2(symGraphMemcpyNodeGetParams, uintptr(n), uintptr(unsafe.Pointer(p)))
}

// GraphMemsetNodeGetParams reads a memset node's parameters.
func (d *Driver) GraphMemsetNodeGetParams(n GraphNode, p *MemsetNodeParams) Result {
	return d.call2(symGraphMemsetNodeGetParams, uintptr(n), uintptr(unsafe.Pointer(p)))
}
