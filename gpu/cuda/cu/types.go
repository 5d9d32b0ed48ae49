package cu

import (
	"structs"
	"unsafe"
)

// Opaque driver handles. Their values are C pointers owned by the driver
// (CUdevice is an int).
type (
	Device    int32   // CUdevice
	Context   uintptr // CUcontext
	Module    uintptr // CUmodule
	Function  uintptr // CUfunction
	Kernel    uintptr // CUkernel (context-independent kernel, CUDA 12+)
	Stream    uintptr // CUstream
	Event     uintptr // CUevent
	Graph     uintptr // CUgraph
	GraphNode uintptr // CUgraphNode
	GraphExec uintptr // CUgraphExec
)

// DevicePtr is CUdeviceptr.
type DevicePtr uint64

// MemHandle is CUmemGenericAllocationHandle, a physical allocation (VMM).
type MemHandle uint64

// KernelNodeParams is CUDA_KERNEL_NODE_PARAMS_v2 (72 bytes). KernelParams is
// a void** array with one pointer per kernel parameter, each pointing at the
// parameter's bytes. Kern is used only when Func is 0; Ctx 0 means the
// current context.
type KernelNodeParams struct {
	_              structs.HostLayout
	Func           Function
	GridDimX       uint32
	GridDimY       uint32
	GridDimZ       uint32
	BlockDimX      uint32
	BlockDimY      uint32
	BlockDimZ      uint32
	SharedMemBytes uint32
	KernelParams   unsafe.Pointer // void**
	Extra          unsafe.Pointer // void**
	Kern           Kernel
	Ctx            Context
}

// MemoryType is CUmemorytype.
type MemoryType uint32

const (
	MemoryTypeHost    MemoryType = 1
	MemoryTypeDevice  MemoryType = 2
	MemoryTypeArray   MemoryType = 3
	MemoryTypeUnified MemoryType = 4
)

// Memcpy3D is CUDA_MEMCPY3D (200 bytes), as graph memcpy nodes take it.
type Memcpy3D struct {
	_             structs.HostLayout
	SrcXInBytes   uint64
	SrcY          uint64
	SrcZ          uint64
	SrcLOD        uint64
	SrcMemoryType MemoryType
	SrcHost       unsafe.Pointer
	SrcDevice     DevicePtr
	SrcArray      uintptr
	Reserved0     unsafe.Pointer
	SrcPitch      uint64
	SrcHeight     uint64
	DstXInBytes   uint64
	DstY          uint64
	DstZ          uint64
	DstLOD        uint64
	DstMemoryType MemoryType
	DstHost       unsafe.Pointer
	DstDevice     DevicePtr
	DstArray      uintptr
	Reserved1     unsafe.Pointer
	DstPitch      uint64
	DstHeight     uint64
	WidthInBytes  uint64
	Height        uint64
	Depth         uint64
}

// MemsetNodeParams is CUDA_MEMSET_NODE_PARAMS (40 bytes). Width counts
// elements of ElementSize bytes (1, 2 or 4).
type MemsetNodeParams struct {
	_           structs.HostLayout
	Dst         DevicePtr
	Pitch       uint64
	Value       uint32
	ElementSize uint32
	Width       uint64
	Height      uint64
}

// MemLocation is CUmemLocation (8 bytes).
type MemLocation struct {
	_    structs.HostLayout
	Type MemLocationType
	ID   int32
}

// MemLocationType is CUmemLocationType.
type MemLocationType int32

// MemLocationTypeDevice: ID is a device ordinal.
const MemLocationTypeDevice MemLocationType = 1

// MemAllocationProp is CUmemAllocationProp (32 bytes).
type MemAllocationProp struct {
	_                    structs.HostLayout
	Type                 MemAllocationType
	RequestedHandleTypes uint32 // CUmemAllocationHandleType; 0 = none
	Location             MemLocation
	Win32HandleMetaData  unsafe.Pointer
	AllocFlags           MemAllocFlags
}

// MemAllocFlags is the allocFlags member of CUmemAllocationProp (8 bytes).
type MemAllocFlags struct {
	_                    structs.HostLayout
	CompressionType      uint8
	GPUDirectRDMACapable uint8
	Usage                uint16
	Reserved             [4]uint8
}

// MemAllocationType is CUmemAllocationType.
type MemAllocationType uint32

// MemAllocationTypePinned is ordinary device memory that stays resident.
const MemAllocationTypePinned MemAllocationType = 1

// MemAccessDesc is CUmemAccessDesc (12 bytes).
type MemAccessDesc struct {
	_        structs.HostLayout
	Location MemLocation
	Flags    MemAccessFlags
}

// MemAccessFlags is CUmemAccess_flags.
type MemAccessFlags uint32

const (
	MemAccessNone      MemAccessFlags = 0
	MemAccessRead      MemAccessFlags = 1
	MemAccessReadWrite MemAccessFlags = 3
)

// Granularity options of cuMemGetAllocationGranularity.
const (
	GranularityMinimum     = 0
	GranularityRecommended = 1
)

// GraphExecUpdateResultInfo is CUgraphExecUpdateResultInfo (24 bytes).
type GraphExecUpdateResultInfo struct {
	_             structs.HostLayout
	Result        GraphExecUpdateResult
	ErrorNode     GraphNode
	ErrorFromNode GraphNode
}

// GraphExecUpdateResult is CUgraphExecUpdateResult.
type GraphExecUpdateResult uint32

const (
	GraphExecUpdateSuccess                        GraphExecUpdateResult = 0
	GraphExecUpdateError                          GraphExecUpdateResult = 1
	GraphExecUpdateErrorTopologyChanged           GraphExecUpdateResult = 2
	GraphExecUpdateErrorNodeTypeChanged           GraphExecUpdateResult = 3
	GraphExecUpdateErrorFunctionChanged           GraphExecUpdateResult = 4
	GraphExecUpdateErrorParametersChanged         GraphExecUpdateResult = 5
	GraphExecUpdateErrorNotSupported              GraphExecUpdateResult = 6
	GraphExecUpdateErrorUnsupportedFunctionChange GraphExecUpdateResult = 7
	GraphExecUpdateErrorAttributesChanged         GraphExecUpdateResult = 8
)

// GraphEdgeData is CUgraphEdgeData (8 bytes), taken by the _v2 graph
// dependency calls of CUDA 12.3+.
type GraphEdgeData struct {
	_        structs.HostLayout
	FromPort uint8
	ToPort   uint8
	Type     uint8
	Reserved [5]uint8
}

// GraphNodeType is CUgraphNodeType.
type GraphNodeType uint32

const (
	GraphNodeKernel         GraphNodeType = 0
	GraphNodeMemcpy         GraphNodeType = 1
	GraphNodeMemset         GraphNodeType = 2
	GraphNodeHost           GraphNodeType = 3
	GraphNodeGraph          GraphNodeType = 4
	GraphNodeEmpty          GraphNodeType = 5
	GraphNodeWaitEvent      GraphNodeType = 6
	GraphNodeEventRecord    GraphNodeType = 7
	GraphNodeExtSemasSignal GraphNodeType = 8
	GraphNodeExtSemasWait   GraphNodeType = 9
	GraphNodeMemAlloc       GraphNodeType = 10
	GraphNodeMemFree        GraphNodeType = 11
	GraphNodeBatchMemOp     GraphNodeType = 12
	GraphNodeConditional    GraphNodeType = 13
)

// DeviceAttribute is CUdevice_attribute (the values this project reads).
type DeviceAttribute int32

const (
	AttrMultiprocessorCount DeviceAttribute = 16
	AttrUnifiedAddressing   DeviceAttribute = 41
	AttrComputeMajor        DeviceAttribute = 75
	AttrComputeMinor        DeviceAttribute = 76
	// AttrVirtualMemoryManagement: cuMemCreate/cuMemMap and friends work.
	AttrVirtualMemoryManagement DeviceAttribute = 102
	// AttrCanUse64BitStreamMemOps (v2 numbering, CUDA 12+): 64-bit
	// cuStreamWriteValue64 works. The legacy attributes 92/93 read 0 on
	// drivers that support the operations unconditionally.
	AttrCanUse64BitStreamMemOps DeviceAttribute = 122
)

// StreamWaitValueGEQ is CU_STREAM_WAIT_VALUE_GEQ, the flags of
// cuStreamWaitValue64 that wait until (int64_t)(*addr - value) >= 0, a
// cyclic greater-or-equal.
const StreamWaitValueGEQ uint32 = 0

// PointerAttribute is CUpointer_attribute.
type PointerAttribute int32

// PointerAttrDeviceOrdinal is the ordinal of the device the memory lives on
// (int).
const PointerAttrDeviceOrdinal PointerAttribute = 9

// PointerAttrIsLegacyIPCCapable is 1 when the memory can be shared by
// legacy IPC (cuIpcGetMemHandle): true of plain cuMemAlloc allocations,
// false of virtual memory, memory pools and host memory (a boolean, read
// into a zeroed int).
const PointerAttrIsLegacyIPCCapable PointerAttribute = 10

// Stream, event and host allocation flags.
const (
	StreamDefault     = 0x0
	StreamNonBlocking = 0x1

	EventDefault       = 0x0
	EventBlockingSync  = 0x1
	EventDisableTiming = 0x2

	MemHostAllocPortable  = 0x01
	MemHostAllocDeviceMap = 0x02
)

// StreamCaptureMode is CUstreamCaptureMode.
type StreamCaptureMode uint32

const (
	StreamCaptureModeGlobal      StreamCaptureMode = 0
	StreamCaptureModeThreadLocal StreamCaptureMode = 1
	// StreamCaptureModeRelaxed does not forbid "unsafe" calls on other
	// threads during a capture: goroutines move between OS threads, so the
	// thread-based modes would blame the wrong calls.
	StreamCaptureModeRelaxed StreamCaptureMode = 2
)

// StreamCaptureStatus is CUstreamCaptureStatus.
type StreamCaptureStatus uint32

const (
	StreamCaptureStatusNone        StreamCaptureStatus = 0
	StreamCaptureStatusActive      StreamCaptureStatus = 1
	StreamCaptureStatusInvalidated StreamCaptureStatus = 2
)

// JIT options of cuModuleLoadDataEx (CUjit_option) used to get the JIT log.
const (
	JITInfoLogBuffer           = 3
	JITInfoLogBufferSizeBytes  = 4
	JITErrorLogBuffer          = 5
	JITErrorLogBufferSizeBytes = 6
)
