package cu

import (
	"reflect"
	"testing"
	"unsafe"
)

// The expected sizes and offsets are those of the CUDA 13.0 headers
// (cuda.h), read with sizeof/offsetof by a C program compiled against them
// on the project's GPU machine (x86-64, LP64), and cross-checked with the
// struct definitions in the header. They need no GPU to check.

type layout struct {
	name   string
	size   uintptr
	fields map[string]uintptr // Go field name -> offset
	typ    reflect.Type
}

func fieldOffsets(t reflect.Type) map[string]uintptr {
	out := map[string]uintptr{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Name == "_" {
			continue
		}
		out[f.Name] = f.Offset
	}
	return out
}

func TestStructLayouts(t *testing.T) {
	for _, l := range []layout{
		{"CUDA_KERNEL_NODE_PARAMS_v2", 72, map[string]uintptr{
			"Func": 0, "GridDimX": 8, "GridDimY": 12, "GridDimZ": 16, "BlockDimX": 20, "BlockDimY": 24,
			"BlockDimZ": 28, "SharedMemBytes": 32, "KernelParams": 40, "Extra": 48, "Kern": 56, "Ctx": 64,
		}, reflect.TypeFor[KernelNodeParams]()},
		{"CUDA_MEMCPY3D", 200, map[string]uintptr{
			"SrcXInBytes": 0, "SrcY": 8, "SrcZ": 16, "SrcLOD": 24, "SrcMemoryType": 32, "SrcHost": 40,
			"SrcDevice": 48, "SrcArray": 56, "Reserved0": 64, "SrcPitch": 72, "SrcHeight": 80,
			"DstXInBytes": 88, "DstY": 96, "DstZ": 104, "DstLOD": 112, "DstMemoryType": 120, "DstHost": 128,
			"DstDevice": 136, "DstArray": 144, "Reserved1": 152, "DstPitch": 160, "DstHeight": 168,
			"WidthInBytes": 176, "Height": 184, "Depth": 192,
		}, reflect.TypeFor[Memcpy3D]()},
		{"CUDA_MEMSET_NODE_PARAMS", 40, map[string]uintptr{
			"Dst": 0, "Pitch": 8, "Value": 16, "ElementSize": 20, "Width": 24, "Height": 32,
		}, reflect.TypeFor[MemsetNodeParams]()},
		{"CUmemLocation", 8, map[string]uintptr{"Type": 0, "ID": 4}, reflect.TypeFor[MemLocation]()},
		{"CUmemAllocationProp", 32, map[string]uintptr{
			"Type": 0, "RequestedHandleTypes": 4, "Location": 8, "Win32HandleMetaData": 16, "AllocFlags": 24,
		}, reflect.TypeFor[MemAllocationProp]()},
		{"CUmemAllocationProp.allocFlags", 8, map[string]uintptr{
			// offsets relative to allocFlags (24, 25, 26 in the parent)
			"CompressionType": 0, "GPUDirectRDMACapable": 1, "Usage": 2, "Reserved": 4,
		}, reflect.TypeFor[MemAllocFlags]()},
		{"CUmemAccessDesc", 12, map[string]uintptr{"Location": 0, "Flags": 8}, reflect.TypeFor[MemAccessDesc]()},
		{"CUgraphExecUpdateResultInfo", 24, map[string]uintptr{
			"Result": 0, "ErrorNode": 8, "ErrorFromNode": 16,
		}, reflect.TypeFor[GraphExecUpdateResultInfo]()},
		{"CUgraphEdgeData", 8, map[string]uintptr{"FromPort": 0, "ToPort": 1, "Type": 2, "Reserved": 3},
			reflect.TypeFor[GraphEdgeData]()},
	} {
		t.Run(l.name, func(t *testing.T) {
			if got := l.typ.Size(); got != l.size {
				t.Errorf("sizeof %s: Go %s is %d bytes, C is %d", l.name, l.typ, got, l.size)
			}
			got := fieldOffsets(l.typ)
			for name, want := range l.fields {
				off, ok := got[name]
				if !ok {
					t.Errorf("%s: Go type has no field %s", l.name, name)
					continue
				}
				if off != want {
					t.Errorf("offsetof %s.%s: Go %d, C %d", l.name, name, off, want)
				}
			}
			if len(got) != len(l.fields) {
				t.Errorf("%s: Go type has %d fields, the table %d: update both together", l.name, len(got), len(l.fields))
			}
		})
	}
}

// TestHandleSizes: handles travel through uintptr arguments and C structs.
func TestHandleSizes(t *testing.T) {
	for name, got := range map[string]uintptr{
		"CUdevice": unsafe.Sizeof(Device(0)), "CUdeviceptr": unsafe.Sizeof(DevicePtr(0)),
		"CUmemGenericAllocationHandle": unsafe.Sizeof(MemHandle(0)), "CUcontext": unsafe.Sizeof(Context(0)),
		"CUgraphNode": unsafe.Sizeof(GraphNode(0)), "CUresult": unsafe.Sizeof(Result(0)),
	} {
		want := uintptr(8)
		if name == "CUdevice" || name == "CUresult" {
			want = 4
		}
		if got != want {
			t.Errorf("sizeof %s = %d, want %d", name, got, want)
		}
	}
}

// TestEnumValues pins the enum values read from the CUDA 13.0 headers.
func TestEnumValues(t *testing.T) {
	for name, c := range map[string][2]int64{
		"CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED": {int64(AttrVirtualMemoryManagement), 102},
		"CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS":       {int64(AttrCanUse64BitStreamMemOps), 122},
		"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR":            {int64(AttrComputeMajor), 75},
		"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR":            {int64(AttrComputeMinor), 76},
		"CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING":                  {int64(AttrUnifiedAddressing), 41},
		"CU_STREAM_CAPTURE_MODE_RELAXED":                          {int64(StreamCaptureModeRelaxed), 2},
		"CU_GRAPH_NODE_TYPE_BATCH_MEM_OP":                         {int64(GraphNodeBatchMemOp), 12},
		"CU_GRAPH_NODE_TYPE_CONDITIONAL":                          {int64(GraphNodeConditional), 13},
		"CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED":           {int64(GraphExecUpdateErrorAttributesChanged), 8},
		"CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL":                     {int64(PointerAttrDeviceOrdinal), 9},
		"CU_MEM_ALLOCATION_TYPE_PINNED":                           {int64(MemAllocationTypePinned), 1},
		"CU_MEM_LOCATION_TYPE_DEVICE":                             {int64(MemLocationTypeDevice), 1},
		"CU_MEM_ACCESS_FLAGS_PROT_READWRITE":                      {int64(MemAccessReadWrite), 3},
		"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED":                   {int64(ErrorStreamCaptureInvalidated), 901},
		"CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE":                    {int64(ErrorGraphExecUpdateFailure), 910},
		"CUDA_ERROR_ILLEGAL_STATE":                                {int64(ErrorIllegalState), 401},
		"CU_JIT_ERROR_LOG_BUFFER":                                 {JITErrorLogBuffer, 5},
		"CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES":                      {JITErrorLogBufferSizeBytes, 6},
	} {
		if c[0] != c[1] {
			t.Errorf("%s = %d, want %d", name, c[0], c[1])
		}
	}
}

func TestResultNames(t *testing.T) {
	for r, want := range map[Result]string{
		Success: "CUDA_SUCCESS", ErrorOutOfMemory: "CUDA_ERROR_OUT_OF_MEMORY",
		ErrorNotReady: "CUDA_ERROR_NOT_READY", ErrorUnknown: "CUDA_ERROR_UNKNOWN",
		ErrorNotLoaded: "STABLEGRAPH_SYMBOL_NOT_LOADED", Result(12345): "CUresult(12345)",
	} {
		if got := r.Name(); got != want {
			t.Errorf("Result(%d).Name() = %q, want %q", int32(r), got, want)
		}
	}
	if len(resultNames) < 100 {
		t.Errorf("only %d result names", len(resultNames))
	}
	if BLASStatus(7).Name() != "CUBLAS_STATUS_INVALID_VALUE" || BLASStatus(99).Name() != "cublasStatus_t(99)" {
		t.Errorf("BLAS status names wrong")
	}
}
