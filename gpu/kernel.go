package gpu

import (
	"encoding/binary"
	"fmt"
	"math"
)

// ModuleImage is what ModuleLoad loads: a set of kernels, each with its typed
// signature and a Go reference implementation, plus the PTX that GPU backends
// compile. The sim backend runs Ref; the CUDA backend loads PTX and looks the
// kernels up by name, and its tests check results against Ref.
type ModuleImage struct {
	Name    string
	Kernels []KernelSpec
	// PTX is the module's PTX text (NUL-terminated or not), for backends
	// that compile it. Nil when the module has no device code.
	PTX []byte
	// Binary, when set, returns prebuilt device code (a cubin) for a device
	// of compute capability major.minor, which a backend loads as is,
	// never compiling or linking it, in preference to PTX; or an error
	// wrapping ErrNotSupported that says why there is none (not built, or
	// not for that architecture). Modules whose code needs linking (the
	// device runtime) ship this way.
	Binary func(major, minor int) ([]byte, error)
}

// Kernel returns the spec named name.
func (m *ModuleImage) Kernel(name string) (KernelSpec, bool) {
	for _, k := range m.Kernels {
		if k.Name == name {
			return k, true
		}
	}
	return KernelSpec{}, false
}

// KernelSpec describes one kernel: its name (the PTX entry name), the kinds
// of its parameters in order, and its Go reference.
type KernelSpec struct {
	Name   string
	Params []ArgKind
	Ref    KernelFunc
}

// CheckArgs reports whether args match the spec's parameter kinds, with an
// error naming the kernel and the first mismatch (wraps ErrInvalidValue).
func (k KernelSpec) CheckArgs(op string, args []Arg) error {
	if len(args) != len(k.Params) {
		return Errorf(op, ErrInvalidValue, "kernel %s takes %d arguments, got %d", k.Name, len(k.Params), len(args))
	}
	for i, want := range k.Params {
		if args[i].Kind != want {
			return Errorf(op, ErrInvalidValue, "kernel %s argument %d is %s, got %s", k.Name, i, want, args[i].Kind)
		}
	}
	return nil
}

// KernelFunc is a kernel's Go implementation. It reads and writes device
// memory only through mem, which checks every access as a GPU's memory
// system would (unmapped, freed or inaccessible memory is a *FaultError).
// It computes the whole result regardless of cfg; cfg is passed so that a
// reference can reject a launch too small for its problem, as device code
// would silently compute only part of it.
type KernelFunc func(mem Memory, cfg LaunchConfig, args []Arg) error

// Memory is device memory as a kernel reference sees it.
type Memory interface {
	// Read copies len(dst) bytes from device address p.
	Read(p DevicePtr, dst []byte) error
	// Write copies src to device address p.
	Write(p DevicePtr, src []byte) error
}

// ReadF32 reads n float32 values from p.
func ReadF32(mem Memory, p DevicePtr, n int) ([]float32, error) {
	if n < 0 {
		return nil, fmt.Errorf("gpu: read of %d float32 values: %w", n, ErrInvalidValue)
	}
	b := make([]byte, 4*n)
	if err := mem.Read(p, b); err != nil {
		return nil, err
	}
	return BytesToF32(b), nil
}

// WriteF32 writes v to p.
func WriteF32(mem Memory, p DevicePtr, v []float32) error {
	return mem.Write(p, F32ToBytes(v))
}

// BytesToF32 decodes little-endian float32 values.
func BytesToF32(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

// F32ToBytes encodes float32 values little-endian.
func F32ToBytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}
