package gpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"unsafe"
)

// DevicePtr is a device virtual address. Zero is the null pointer.
type DevicePtr uint64

// Add returns p advanced by off bytes.
func (p DevicePtr) Add(off uint64) DevicePtr { return p + DevicePtr(off) }

// Opaque handles. The zero value of each is invalid.
type (
	Stream    uint64 // an in-order queue of device work
	Event     uint64 // a marker recorded into a stream
	PhysMem   uint64 // a physical memory chunk (VMM)
	HostAlloc uint64 // a pinned, device-mapped host allocation
	Module    uint64 // a loaded module of kernels
	Function  uint64 // a kernel in a loaded module
	Graph     uint64 // a graph being built (or captured)
	GraphNode uint64 // a node of a Graph; also names it inside the GraphExec
	GraphExec uint64 // an instantiated, launchable graph
)

// DeviceProps describes one device.
type DeviceProps struct {
	Ordinal      int
	Name         string
	TotalMemory  uint64 // bytes
	ComputeMajor int
	ComputeMinor int
	// VMM, Granularity and StreamMemOps describe the device, for
	// reports ("stablegraph info"); code that uses these capabilities
	// asks VirtualMemoryOf and StreamMemOpsOf (capability.go), which
	// consult the backend's optional interfaces, and must not read the
	// flags instead.
	//
	// VMM is true when the device supports virtual memory management
	// (gpu.VirtualMemory).
	VMM bool
	// Granularity is the minimum size and alignment of VMM chunks and
	// mappings, in bytes (2 MiB on an H100); zero without VMM.
	Granularity uint64
	// StreamMemOps is true when StreamWriteValue64 works on this device
	// (gpu.StreamMemOps).
	StreamMemOps bool
	// DriverVersion is the backend's driver version (CUDA: 13000 for 13.0).
	DriverVersion int
}

func (p DeviceProps) String() string {
	return fmt.Sprintf("device %d: %s, %d MiB, compute %d.%d, vmm=%v granularity=%d, stream-mem-ops=%v",
		p.Ordinal, p.Name, p.TotalMemory>>20, p.ComputeMajor, p.ComputeMinor, p.VMM, p.Granularity, p.StreamMemOps)
}

// StreamFlags are stream creation flags.
type StreamFlags uint32

const (
	// StreamDefault streams synchronize with the legacy default stream.
	StreamDefault StreamFlags = 0
	// StreamNonBlocking streams do not synchronize with the default stream.
	StreamNonBlocking StreamFlags = 1
)

// EventFlags are event creation flags.
type EventFlags uint32

const (
	EventDefault       EventFlags = 0
	EventBlockingSync  EventFlags = 1
	EventDisableTiming EventFlags = 2
)

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z uint32 }

// LaunchConfig is the shape of a kernel launch.
type LaunchConfig struct {
	Grid      Dim3
	Block     Dim3
	SharedMem uint32 // dynamic shared memory, bytes
}

// Linear returns a one-dimensional launch covering n threads in blocks of
// block threads (256 when block is 0).
func Linear(n int, block uint32) LaunchConfig {
	if block == 0 {
		block = 256
	}
	grid := (uint64(max(n, 1)) + uint64(block) - 1) / uint64(block)
	return LaunchConfig{Grid: Dim3{uint32(grid), 1, 1}, Block: Dim3{block, 1, 1}}
}

// ArgKind is the type of one kernel argument. The caller states it, so the
// runtime always knows which slots hold device pointers (and may be patched)
// and which hold scalars (and must never be).
type ArgKind uint8

const (
	ArgInvalid ArgKind = iota
	ArgPtr             // a DevicePtr, 8 bytes
	ArgI32
	ArgU32
	ArgI64
	ArgU64
	ArgF32
	ArgF64
	// ArgBytes is an argument of unknown type, known only by its size and
	// bytes, as the driver reports the parameters of a captured library
	// kernel. Raw holds the bytes.
	ArgBytes
)

var argKindNames = [...]string{"invalid", "ptr", "i32", "u32", "i64", "u64", "f32", "f64", "bytes"}

func (k ArgKind) String() string {
	if int(k) < len(argKindNames) {
		return argKindNames[k]
	}
	return fmt.Sprintf("ArgKind(%d)", int(k))
}

// Size is the size in bytes of an argument of kind k (0 for ArgBytes and
// ArgInvalid, whose size is the length of Raw).
func (k ArgKind) Size() int {
	switch k {
	case ArgPtr, ArgI64, ArgU64, ArgF64:
		return 8
	case ArgI32, ArgU32, ArgF32:
		return 4
	}
	return 0
}

// Arg is one typed kernel argument. Build it with Ptr, I32, F32, ...
type Arg struct {
	Kind ArgKind
	Bits uint64 // the value, zero-extended, for every kind but ArgBytes
	Raw  []byte // the bytes, for ArgBytes only
}

func Ptr(p DevicePtr) Arg { return Arg{Kind: ArgPtr, Bits: uint64(p)} }
func I32(v int32) Arg     { return Arg{Kind: ArgI32, Bits: uint64(uint32(v))} }
func U32(v uint32) Arg    { return Arg{Kind: ArgU32, Bits: uint64(v)} }
func I64(v int64) Arg     { return Arg{Kind: ArgI64, Bits: uint64(v)} }
func U64(v uint64) Arg    { return Arg{Kind: ArgU64, Bits: v} }
func F32(v float32) Arg   { return Arg{Kind: ArgF32, Bits: uint64(math.Float32bits(v))} }
func F64(v float64) Arg   { return Arg{Kind: ArgF64, Bits: math.Float64bits(v)} }
func Bytes(b []byte) Arg  { return Arg{Kind: ArgBytes, Raw: append([]byte(nil), b...)} }

func (a Arg) AsPtr() DevicePtr { return DevicePtr(a.Bits) }
func (a Arg) AsI32() int32     { return int32(uint32(a.Bits)) }
func (a Arg) AsU32() uint32    { return uint32(a.Bits) }
func (a Arg) AsI64() int64     { return int64(a.Bits) }
func (a Arg) AsU64() uint64    { return a.Bits }
func (a Arg) AsF32() float32   { return math.Float32frombits(uint32(a.Bits)) }
func (a Arg) AsF64() float64   { return math.Float64frombits(a.Bits) }

// Size is the argument's size in bytes.
func (a Arg) Size() int {
	if a.Kind == ArgBytes {
		return len(a.Raw)
	}
	return a.Kind.Size()
}

// Encode writes the argument's little-endian bytes into dst, which must be
// at least Size bytes long.
func (a Arg) Encode(dst []byte) {
	if a.Kind == ArgBytes {
		copy(dst, a.Raw)
		return
	}
	switch a.Size() {
	case 4:
		binary.LittleEndian.PutUint32(dst, uint32(a.Bits))
	case 8:
		binary.LittleEndian.PutUint64(dst, a.Bits)
	}
}

func (a Arg) String() string {
	switch a.Kind {
	case ArgPtr:
		return fmt.Sprintf("ptr(%#x)", a.Bits)
	case ArgF32:
		return fmt.Sprintf("f32(%g)", a.AsF32())
	case ArgF64:
		return fmt.Sprintf("f64(%g)", a.AsF64())
	case ArgI32:
		return fmt.Sprintf("i32(%d)", a.AsI32())
	case ArgI64:
		return fmt.Sprintf("i64(%d)", a.AsI64())
	case ArgBytes:
		return fmt.Sprintf("bytes(%x)", a.Raw)
	}
	return fmt.Sprintf("%s(%d)", a.Kind, a.Bits)
}

// ParamInfo is the driver's layout of one kernel parameter
// (cuFuncGetParamInfo): its offset and size in the parameter buffer. It says
// nothing of the type: an 8-byte slot may be a pointer or an integer.
type ParamInfo struct {
	Offset uint64
	Size   uint64
}

// KernelParams are the parameters of a kernel launch or kernel graph node.
type KernelParams struct {
	Func   Function
	Config LaunchConfig
	Args   []Arg
}

// MemcpyParams describe a device-to-device copy node.
type MemcpyParams struct {
	Dst, Src DevicePtr
	Size     uint64
}

// Memset describes a memset: Count elements of ElemSize bytes (1, 2 or 4)
// starting at Dst, each set to the low ElemSize bytes of Value.
type Memset struct {
	Dst      DevicePtr
	Value    uint32
	ElemSize int
	Count    uint64
}

// Bytes is the number of bytes the memset writes.
func (m Memset) Bytes() uint64 { return m.Count * uint64(m.ElemSize) }

// NodeType is the type of a graph node.
type NodeType int

const (
	NodeKernel NodeType = iota + 1
	NodeMemcpy
	NodeMemset
	NodeChildGraph
	NodeEmpty
	NodeMemWriteValue // a stream value write captured into a graph
	NodeOther         // a node kind this interface does not model
	// NodeMemAlloc and NodeMemFree are graph memory nodes: an allocation
	// made, and freed, by the graph itself (a library allocating its
	// workspace inside a capture). The address is fixed when the node is
	// made, so every capture of such a call holds a different one.
	NodeMemAlloc
	NodeMemFree
)

var nodeTypeNames = map[NodeType]string{
	NodeKernel: "kernel", NodeMemcpy: "memcpy", NodeMemset: "memset",
	NodeChildGraph: "child-graph", NodeEmpty: "empty", NodeMemWriteValue: "mem-write-value",
	NodeOther: "other", NodeMemAlloc: "mem-alloc", NodeMemFree: "mem-free",
}

func (t NodeType) String() string {
	if s, ok := nodeTypeNames[t]; ok {
		return s
	}
	return fmt.Sprintf("NodeType(%d)", int(t))
}

// HostMem is pinned host memory mapped into the device address space, used
// for timelines: the device writes it with StreamWriteValue64, the host reads
// it without synchronizing.
type HostMem struct {
	Handle HostAlloc
	Ptr    DevicePtr // device address of Bytes[0]
	Bytes  []byte    // host view, valid until HostFree
}

// Load64 atomically reads the little-endian uint64 at byte offset off (a
// multiple of 8) of the host view: the value most recently written by the
// device, without synchronizing with any stream.
func (h HostMem) Load64(off int) uint64 {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&h.Bytes[off])))
}

// Store64 atomically writes v at byte offset off (a multiple of 8).
func (h HostMem) Store64(off int, v uint64) {
	atomic.StoreUint64((*uint64)(unsafe.Pointer(&h.Bytes[off])), v)
}

// HandleCounts count live handles of each kind (HandleCounter). A test that
// opened a backend and closed everything it made sees all of them at zero.
type HandleCounts struct {
	Streams      int
	Events       int
	Allocations  int // MemAlloc
	HostAllocs   int // HostAlloc
	Chunks       int // MemCreate
	Reservations int // MemAddressReserve
	Mappings     int // MemMap
	Modules      int
	Graphs       int
	GraphExecs   int
	Comms        int // Collectives.CommInit
}

// IsZero reports whether no handle is live.
func (c HandleCounts) IsZero() bool { return c == HandleCounts{} }

func (c HandleCounts) String() string {
	var parts []string
	add := func(name string, n int) {
		if n != 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", name, n))
		}
	}
	add("streams", c.Streams)
	add("events", c.Events)
	add("allocations", c.Allocations)
	add("host-allocs", c.HostAllocs)
	add("chunks", c.Chunks)
	add("reservations", c.Reservations)
	add("mappings", c.Mappings)
	add("modules", c.Modules)
	add("graphs", c.Graphs)
	add("graph-execs", c.GraphExecs)
	add("comms", c.Comms)
	if len(parts) == 0 {
		return "none live"
	}
	return strings.Join(parts, " ")
}
