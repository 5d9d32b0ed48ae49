package gputest

import (
	"reflect"

	"github.com/stablegraph/stablegraph/gpu"
)

// coverageTypes are the interfaces whose methods the coverage table lists.
var coverageTypes = []reflect.Type{
	reflect.TypeFor[gpu.Backend](),
	reflect.TypeFor[gpu.VirtualMemory](),
	reflect.TypeFor[gpu.StreamMemOps](),
}

// coverage maps every method of gpu.Backend, and of the optional
// gpu.VirtualMemory and gpu.StreamMemOps (coverageTypes), to the subtests
// that exercise it, named "Group/Test" (or "Group" for every test of a
// group). Each entry lists tests that check both results and, where the
// method can fail, errors.
//
// TestCoverageTable checks this table against those interfaces by reflection
// (every method present, no stale names) and against the suite (every named
// subtest exists); TestCoverageCalls runs the suite on sim through a
// recording wrapper and checks that each listed subtest really calls the
// method.
var coverage = map[string][]string{
	// Backend
	"Name":  {"Devices/Count"},
	"Close": {"Lifecycle/CloseEmpty", "Lifecycle/CloseWithLiveHandles"},

	// Devices
	"DeviceCount": {"Devices/Count", "Devices/Props", "Devices/BadOrdinal"},
	"DeviceProps": {"Devices/Props", "Devices/BadOrdinal"},

	// Streams
	"StreamCreate":        {"Streams/CreateFlagsPriority", "Streams/Destroy", "Devices/BadOrdinal"},
	"StreamPriorityRange": {"Streams/CreateFlagsPriority", "Devices/BadOrdinal"},
	"StreamQuery":         {"Streams/QueryBusyIdle", "Streams/Destroy", "Lifecycle/ZeroHandles"},
	"StreamSynchronize":   {"Streams/QueryBusyIdle", "Streams/Destroy", "Capture/SynchronizeInvalidates", "Faults/UseAfterFree"},
	"StreamWaitEvent":     {"Streams/WaitEvent", "Streams/WaitEventCrossDevice", "Capture/ForkJoin", "Events/Destroy"},
	"StreamDestroy":       {"Streams/Destroy", "Streams/DestroyBusy", "Streams/CreateFlagsPriority"},

	// Events
	"EventCreate":      {"Events/RecordQuerySynchronize", "Events/Destroy", "Devices/BadOrdinal"},
	"EventRecord":      {"Events/RecordQuerySynchronize", "Events/Destroy", "Streams/WaitEvent"},
	"EventQuery":       {"Events/RecordQuerySynchronize", "Events/Destroy", "HostMemory/WriteValueAfterKernel"},
	"EventSynchronize": {"Events/RecordQuerySynchronize", "Events/Destroy", "Streams/DestroyBusy"},
	"EventElapsed":     {"Events/Elapsed", "Events/ElapsedErrors", "Events/Destroy"},
	"EventDestroy":     {"Events/Destroy"},

	// Device memory
	"MemAlloc":        {"Memory/AllocFree", "Memory/OutOfMemory", "Devices/BadOrdinal"},
	"MemFree":         {"Memory/AllocFree", "Faults/UseAfterFree"},
	"MemGetInfo":      {"Memory/GetInfo", "Memory/OutOfMemory", "Devices/Props", "Devices/BadOrdinal"},
	"MemcpyHtoD":      {"Memory/CopySync", "Faults/CopyFromFreed"},
	"MemcpyDtoH":      {"Memory/CopySync", "Faults/CopyFromFreed"},
	"MemcpyDtoD":      {"Memory/CopySync"},
	"Memset":          {"Memory/Memset", "Memory/MemsetErrors"},
	"MemcpyHtoDAsync": {"Memory/CopyAsyncOrdered"},
	"MemcpyDtoHAsync": {"Memory/CopyAsyncOrdered"},
	"MemcpyDtoDAsync": {"Memory/CopyAsyncOrdered", "Streams/WaitEvent", "Capture/KernelMemcpyMemset"},
	"MemsetAsync":     {"Memory/Memset", "Memory/MemsetErrors", "Memory/CopyAsyncOrdered", "Streams/Destroy"},

	// Virtual memory (optional)
	"AllocationGranularity": {"VirtualMemory/MapAccessKernel", "Devices/Props", "Devices/BadOrdinal"},
	"MemCreate":             {"VirtualMemory/MapAccessKernel", "VirtualMemory/Errors", "Devices/BadOrdinal"},
	"MemRelease":            {"VirtualMemory/MapAccessKernel", "VirtualMemory/Errors", "VirtualMemory/ReleaseWhileMapped"},
	"MemAddressReserve":     {"VirtualMemory/MapAccessKernel", "VirtualMemory/Errors"},
	"MemAddressFree":        {"VirtualMemory/MapAccessKernel", "VirtualMemory/Errors"},
	"MemMap":                {"VirtualMemory/MapAccessKernel", "VirtualMemory/Errors", "VirtualMemory/TwoMappingsOneChunk"},
	"MemUnmap":              {"VirtualMemory/MapAccessKernel", "VirtualMemory/Errors"},
	"MemSetAccess":          {"VirtualMemory/MapAccessKernel", "VirtualMemory/Errors", "VirtualMemory/PeerAccess", "Faults/AccessFromOtherDevice"},

	// Host timeline memory (optional)
	"StreamMemOpsSupported": {"HostMemory/AllocFree", "Devices/Props", "Devices/BadOrdinal"},
	"HostAlloc":             {"HostMemory/AllocFree", "HostMemory/WriteValueVisible"},
	"HostFree":              {"HostMemory/AllocFree"},
	"StreamWriteValue64":    {"HostMemory/WriteValueVisible", "HostMemory/WriteValueAfterKernel", "HostMemory/WriteValueDeviceMemory", "HostMemory/WriteValueCaptured"},

	// Modules
	"ModuleLoad":     {"Modules/LoadFunctions", "Modules/Unload", "Devices/BadOrdinal"},
	"ModuleUnload":   {"Modules/Unload"},
	"ModuleFunction": {"Modules/LoadFunctions", "Modules/Unload"},
	"FuncName":       {"Modules/LoadFunctions", "Modules/ParamInfo", "Modules/Unload"},
	"FuncParamInfo":  {"Modules/ParamInfo", "Modules/Unload"},
	"LaunchKernel":   {"Kernels", "Modules/LaunchErrors", "Modules/Unload"},

	// Graphs
	"GraphCreate":            {"Graphs/BuildInspectLaunch", "Devices/BadOrdinal"},
	"GraphDestroy":           {"Graphs/Destroy", "Graphs/ChildGraphCopied"},
	"GraphAddKernelNode":     {"Graphs/BuildInspectLaunch", "Graphs/AddErrors"},
	"GraphAddMemcpyNode":     {"Graphs/BuildInspectLaunch", "Graphs/AddErrors"},
	"GraphAddMemsetNode":     {"Graphs/BuildInspectLaunch", "Graphs/AddErrors"},
	"GraphAddChildGraphNode": {"Graphs/BuildInspectLaunch", "Graphs/AddErrors", "Graphs/ChildGraphCopied"},
	"GraphAddEmptyNode":      {"Graphs/BuildInspectLaunch", "Graphs/AddErrors", "Graphs/EmptyGraph"},
	"GraphNodes":             {"Graphs/BuildInspectLaunch", "Graphs/AddErrors", "Capture/KernelMemcpyMemset"},
	"GraphNodeType":          {"Graphs/BuildInspectLaunch", "Graphs/Destroy", "Capture/KernelMemcpyMemset"},
	"GraphNodeDeps":          {"Graphs/BuildInspectLaunch", "Capture/KernelMemcpyMemset", "Capture/ForkJoin"},
	"GraphKernelNodeParams":  {"Graphs/BuildInspectLaunch", "Capture/KernelMemcpyMemset", "ExecUpdate/NodeSetParams"},
	"GraphChildGraph":        {"Graphs/BuildInspectLaunch", "Graphs/ChildGraphCopied"},
	"StreamBeginCapture":     {"Capture/KernelMemcpyMemset", "Capture/BeginEndErrors", "Capture/SynchronizeInvalidates"},
	"StreamEndCapture":       {"Capture/KernelMemcpyMemset", "Capture/BeginEndErrors", "Capture/SynchronizeInvalidates"},
	"StreamIsCapturing":      {"Capture/KernelMemcpyMemset", "Capture/BeginEndErrors", "Capture/ForkJoin"},
	"GraphInstantiate":       {"Graphs/BuildInspectLaunch", "Graphs/Destroy", "Graphs/AddErrors"},
	"GraphExecDestroy":       {"Graphs/Destroy"},
	"GraphLaunch":            {"Graphs/BuildInspectLaunch", "Graphs/ReplayOrdered", "Graphs/Destroy"},
	"GraphExecUpdate":        {"ExecUpdate/WholeGraph", "ExecUpdate/WholeGraphFromCapture", "ExecUpdate/Refused"},

	"GraphExecKernelNodeSetParams":     {"ExecUpdate/NodeSetParams", "ExecUpdate/NodeSetParamsErrors"},
	"GraphExecMemcpyNodeSetParams":     {"ExecUpdate/NodeSetParams", "ExecUpdate/NodeSetParamsErrors", "ExecUpdate/NodeRefused"},
	"GraphExecMemsetNodeSetParams":     {"ExecUpdate/NodeSetParams", "ExecUpdate/NodeSetParamsErrors", "ExecUpdate/NodeRefused"},
	"GraphExecChildGraphNodeSetParams": {"ExecUpdate/NodeSetParams", "ExecUpdate/NodeSetParamsErrors", "ExecUpdate/NodeRefused"},
}
