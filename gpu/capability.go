package gpu

import "fmt"

// This file holds every capability look-up in one place. Backend is the
// core every backend implements; everything else is an optional interface
// that a caller finds here, by type assertion, never by reading DeviceProps
// flags or a backend's name. Each helper's doc says what the caller does
// without the capability. A capability a backend has but a device lacks
// (VMM on an old GPU) is reported by the interface's own per-device method,
// which the helper calls, so that callers ask one question.
//
// The interfaces, where they are defined, and their fallbacks:
//
//	VirtualMemory   backend.go    VirtualMemoryOf: MemAlloc-based strategies
//	StreamMemOps    backend.go    StreamMemOpsOf: events for timelines
//	StreamWaits     streamwait.go StreamWaitsOf: no gate, events alone
//	DeviceUpdates   devupdate.go  DeviceUpdatesOf: pointers moved from the host
//	Collectives     collectives.go CollectivesOf: programs with collectives refused
//	GEMM            gemm.go       GemmOf: the traced GEMM kernel
//	GraphNodeReader gemm.go       GraphNodeReaderOf: nodes kept in a child graph
//	AddressRanger   extent.go     AddressRangerOf: bindings not checked
//	HandleCounter   backend.go    HandleCounterOf, LiveHandles: no leak check
//	DeviceResetter  backend.go    DeviceResetterOf: a fault ends the device
//	FaultInjector   backend.go    FaultInjectorOf: error-path sweeps skip
//	DeviceRuntime   devupdate.go  DeviceRuntimeOf: a reference needing it fails

// named is what a look-up needs of a backend to say which one lacks a
// capability: every Backend is one; the small interfaces of callers (vmm's
// Driver) need not be.
type named interface{ Name() string }

// backendName names b in an error: its Name when it has one, else its type.
func backendName(b any) string {
	if n, ok := b.(named); ok {
		return n.Name()
	}
	return fmt.Sprintf("%T", b)
}

// VirtualMemoryOf returns b's virtual memory for dev and the device's
// granularity, or an error wrapping ErrNotSupported when b has no virtual
// memory or dev has no VMM (an invalid dev is ErrInvalidValue). Without it,
// a caller allocates with MemAlloc: the pool and remap strategies, and
// package vmm, need it; patch, device and eager do not.
func VirtualMemoryOf(b Devices, dev int) (VirtualMemory, uint64, error) {
	p, err := b.DeviceProps(dev)
	if err != nil {
		return nil, 0, err
	}
	vm, ok := b.(VirtualMemory)
	if !ok {
		return nil, 0, &Error{Op: "VirtualMemoryOf", Err: ErrNotSupported,
			Detail: fmt.Sprintf("backend %s has no virtual memory management", backendName(b))}
	}
	gran, err := vm.AllocationGranularity(dev)
	if err != nil {
		return nil, 0, err
	}
	if gran == 0 {
		return nil, 0, &Error{Op: "VirtualMemoryOf", Err: ErrNotSupported,
			Detail: fmt.Sprintf("device %d (%s) reports a granularity of 0", dev, p.Name)}
	}
	return vm, gran, nil
}

// StreamMemOpsOf returns b's stream memory operations for dev, or an error
// wrapping ErrNotSupported when b has none or dev cannot write values from
// a stream (an invalid dev is ErrInvalidValue). Without them a caller keeps
// its timeline with events (package vmm's Timeline needs them).
func StreamMemOpsOf(b Devices, dev int) (StreamMemOps, error) {
	if _, err := b.DeviceProps(dev); err != nil {
		return nil, err
	}
	ops, ok := b.(StreamMemOps)
	if !ok {
		return nil, &Error{Op: "StreamMemOpsOf", Err: ErrNotSupported,
			Detail: fmt.Sprintf("backend %s has no stream memory operations", backendName(b))}
	}
	if err := ops.StreamMemOpsSupported(dev); err != nil {
		return nil, err
	}
	return ops, nil
}

// StreamWaitsOf returns b's stream waits for device dev, or an error
// wrapping ErrNotSupported when b or dev cannot wait for values: the caller
// then does without a gate (workload.Run times steps with events alone).
func StreamWaitsOf(b Backend, dev int) (StreamWaits, error) {
	sw, ok := b.(StreamWaits)
	if !ok {
		return nil, &Error{Op: "StreamWaitsOf", Err: ErrNotSupported,
			Detail: fmt.Sprintf("backend %s has no stream waits on memory values", b.Name())}
	}
	if err := sw.StreamWaitsSupported(dev); err != nil {
		return nil, err
	}
	return sw, nil
}

// DeviceUpdatesOf returns b's device-side graph updates for device dev, or
// an error wrapping ErrNotSupported when b or dev cannot do them: the caller
// then moves pointers from the host (GraphExecKernelNodeSetParams), and the
// device strategy is not offered.
func DeviceUpdatesOf(b Backend, dev int) (DeviceUpdates, error) {
	du, ok := b.(DeviceUpdates)
	if !ok {
		return nil, &Error{Op: "DeviceUpdatesOf", Err: ErrNotSupported,
			Detail: fmt.Sprintf("backend %s has no device-side graph updates", b.Name())}
	}
	if err := du.DeviceUpdatesSupported(dev); err != nil {
		return nil, err
	}
	return du, nil
}

// DeviceRuntimeOf returns the device runtime a kernel reference's memory
// offers, and false when the backend running the reference models none: a
// reference that needs it (the patcher's) then fails its launch.
func DeviceRuntimeOf(mem Memory) (DeviceRuntime, bool) {
	rt, ok := mem.(DeviceRuntime)
	return rt, ok
}

// CollectivesOf returns b's collectives, or an error wrapping
// ErrNotSupported when b has none: programs with collective commands then
// fail to compile for b.
func CollectivesOf(b Backend) (Collectives, error) {
	if c, ok := b.(Collectives); ok {
		return c, nil
	}
	return nil, &Error{Op: "CollectivesOf", Err: ErrNotSupported,
		Detail: fmt.Sprintf("backend %s has no collectives", b.Name())}
}

// GemmOf returns b's GEMM library, or an error wrapping ErrNotSupported
// when b has none: the caller launches a kernel of its own instead (package
// blas's traced GEMM command runs kernels.Gemm).
func GemmOf(b Backend) (GEMM, error) {
	if g, ok := b.(GEMM); ok {
		return g, nil
	}
	return nil, &Error{Op: "GemmOf", Err: ErrNotSupported,
		Detail: fmt.Sprintf("backend %s has no GEMM library", b.Name())}
}

// GraphNodeReaderOf returns b's read-back of memcpy and memset nodes, and
// false when b cannot read them: such nodes are then neither compared nor
// copied node by node (package internal/trace keeps them in a child graph).
func GraphNodeReaderOf(b any) (GraphNodeReader, bool) {
	nr, ok := b.(GraphNodeReader)
	return nr, ok
}

// AddressRangerOf returns b's allocation extents (extent.go), and false
// when b cannot tell them: bindings are then not checked.
func AddressRangerOf(b Backend) (AddressRanger, bool) {
	ar, ok := b.(AddressRanger)
	return ar, ok
}

// LiveHandles returns b's live-handle counters, and false when b does not
// count them: a test then cannot check for leaked handles.
func LiveHandles(b Backend) (HandleCounts, bool) {
	if hc, ok := b.(HandleCounter); ok {
		return hc.LiveHandles(), true
	}
	return HandleCounts{}, false
}

// HandleCounterOf returns b's live-handle counter, and false when b does
// not count its handles (see LiveHandles for one reading).
func HandleCounterOf(b Backend) (HandleCounter, bool) {
	hc, ok := b.(HandleCounter)
	return hc, ok
}

// DeviceResetterOf returns b's device reset, and false when a fault is
// fatal to the device on b (CUDA): tests that fault on purpose then skip,
// and a runtime that saw a fault reopens the backend.
func DeviceResetterOf(b Backend) (DeviceResetter, bool) {
	r, ok := b.(DeviceResetter)
	return r, ok
}

// FaultInjectorOf returns b's fault injection, and false when b cannot fail
// calls on request: sweeps of error paths then skip.
func FaultInjectorOf(b Backend) (FaultInjector, bool) {
	fi, ok := b.(FaultInjector)
	return fi, ok
}

// Capabilities names the optional capabilities b offers on device dev, in
// the order of the table at the top of this file: what a device can do
// beyond the Backend core, for a report or for comparing two backends
// (a wrapper must not hide what it wraps).
func Capabilities(b Backend, dev int) []string {
	var out []string
	add := func(name string, ok bool) {
		if ok {
			out = append(out, name)
		}
	}
	_, _, err := VirtualMemoryOf(b, dev)
	add("VirtualMemory", err == nil)
	_, err = StreamMemOpsOf(b, dev)
	add("StreamMemOps", err == nil)
	_, err = StreamWaitsOf(b, dev)
	add("StreamWaits", err == nil)
	_, err = DeviceUpdatesOf(b, dev)
	add("DeviceUpdates", err == nil)
	_, err = CollectivesOf(b)
	add("Collectives", err == nil)
	_, err = GemmOf(b)
	add("GEMM", err == nil)
	_, ok := GraphNodeReaderOf(b)
	add("GraphNodeReader", ok)
	_, ok = AddressRangerOf(b)
	add("AddressRanger", ok)
	_, ok = LiveHandles(b)
	add("HandleCounter", ok)
	_, ok = DeviceResetterOf(b)
	add("DeviceResetter", ok)
	_, ok = FaultInjectorOf(b)
	add("FaultInjector", ok)
	return out
}

// RoundUp rounds n up to a multiple of align (a power of two or any
// positive number).
func RoundUp(n, align uint64) uint64 {
	if align == 0 {
		return n
	}
	return (n + align - 1) / align * align
}
