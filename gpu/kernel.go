package gpu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
)

// ModuleImage is what ModuleLoad loads: a set of kernels, each with its typed
// signature and a Go reference implementation, and the device code of the
// backends that run it on hardware. The sim runs Ref; a GPU backend asks
// Code for the formats it loads (CodeFor) and looks the kernels up by name,
// and its tests check results against Ref.
type ModuleImage struct {
	Name    string
	Kernels []KernelSpec
	// Code returns the module's device code for target t: PTX, a cubin for
	// one architecture, an AMD code object. A module decides itself which
	// build suits t (the built-in kernels give sm_90 PTX to Hopper and a
	// portable build to the rest); it returns an error wrapping
	// ErrNotSupported that says why it has none for t (not built, not for
	// that architecture, not in that format). Nil when the module has no
	// device code: only backends that run the references (sim) load it.
	Code func(t Target) ([]byte, error)
}

// CodeFormat is a kind of device code.
type CodeFormat string

// The formats backends load. A new backend adds its own.
const (
	// CodePTX is NVIDIA PTX text, compiled for the device by the driver
	// (NUL-terminated or not).
	CodePTX CodeFormat = "ptx"
	// CodeCubin is an NVIDIA binary for one architecture, loaded as is,
	// never compiled or linked: code that needs linking (the device
	// runtime) ships this way.
	CodeCubin CodeFormat = "cubin"
	// CodeHSACO is an AMD code object (HIP) for one gfx architecture.
	CodeHSACO CodeFormat = "hsaco"
)

// Target is what a backend asks a module's Code for: a format, and the
// device's architecture in the terms of that format.
type Target struct {
	Format CodeFormat
	// Major and Minor are the device's architecture version: the compute
	// capability on CUDA (9.0 on an H100).
	Major, Minor int
	// Arch names the architecture where a version does not ("gfx942" on
	// ROCm); empty on CUDA.
	Arch string
}

func (t Target) String() string {
	if t.Arch != "" {
		return fmt.Sprintf("%s for %s", t.Format, t.Arch)
	}
	return fmt.Sprintf("%s for %d.%d", t.Format, t.Major, t.Minor)
}

// PTXCode is the Code of a module that ships one PTX build for every
// device (compiled for the oldest architecture it supports; the driver
// JIT-compiles it for newer ones): it returns ptx for CodePTX and
// ErrNotSupported for every other format.
func PTXCode(ptx []byte) func(Target) ([]byte, error) {
	return func(t Target) ([]byte, error) {
		if t.Format != CodePTX {
			return nil, fmt.Errorf("gpu: the module ships as PTX only, not %s: %w", t.Format, ErrNotSupported)
		}
		if len(ptx) == 0 {
			return nil, fmt.Errorf("gpu: the module's PTX is empty: %w", ErrNotSupported)
		}
		return ptx, nil
	}
}

// CodeFor returns the module's code for the first of targets it has, in
// the order given (a backend lists the formats it loads, the one it
// prefers first), and that target. When it has none, the error wraps
// ErrNotSupported and gives the module's reason for each target; an error
// from Code that is not ErrNotSupported is returned as is.
func (m *ModuleImage) CodeFor(targets ...Target) (Target, []byte, error) {
	if m.Code == nil {
		return Target{}, nil, Errorf("ModuleLoad", ErrNotSupported, "module %q has no device code (its kernels run only as Go references, on sim)", m.Name)
	}
	var why []string
	for _, t := range targets {
		code, err := m.Code(t)
		switch {
		case err == nil && len(code) > 0:
			return t, code, nil
		case err == nil:
			why = append(why, t.String()+": empty")
		case errors.Is(err, ErrNotSupported):
			why = append(why, t.String()+": "+err.Error())
		default:
			return t, nil, fmt.Errorf("gpu: module %q: code %s: %w", m.Name, t, err)
		}
	}
	return Target{}, nil, Errorf("ModuleLoad", ErrNotSupported, "module %q has no code for this device (%s)", m.Name, strings.Join(why, "; "))
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

// KernelSpec describes one kernel: its name (the entry name in the device
// code), the kinds of its parameters in order, and its Go reference.
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
