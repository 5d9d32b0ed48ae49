// Package simtest holds test helpers shared by the packages whose tests
// drive the sim backend directly (vmm, retire): a kernel that holds its
// stream until released, a device with a stream and the built-in kernels,
// and float32 transfers. It is imported by tests only.
package simtest

import (
	"errors"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/kernels"
)

// GateModule is a one-kernel module ("gate", no arguments) whose kernel
// blocks its stream until gate is closed: a deterministic way to keep work
// queued behind it.
func GateModule(gate <-chan struct{}) *gpu.ModuleImage {
	return &gpu.ModuleImage{Name: "simtest-gate", Kernels: []gpu.KernelSpec{{
		Name: "gate",
		Ref: func(gpu.Memory, gpu.LaunchConfig, []gpu.Arg) error {
			<-gate
			return nil
		},
	}}}
}

// Dev is a device of a sim backend with a stream and the built-in kernels.
type Dev struct {
	B      *sim.Backend
	Stream gpu.Stream
	Mod    gpu.Module
	CopyFn gpu.Function
}

// OpenDev makes a stream and loads the built-in kernels on device d; the
// test's cleanup destroys them.
func OpenDev(t *testing.T, b *sim.Backend, d int) Dev {
	t.Helper()
	s, err := b.StreamCreate(d, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	m, err := b.ModuleLoad(d, kernels.Module())
	if err != nil {
		t.Fatal(err)
	}
	f, err := b.ModuleFunction(m, kernels.Copy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := errors.Join(b.StreamDestroy(s), b.ModuleUnload(m)); err != nil {
			t.Error(err)
		}
	})
	return Dev{b, s, m, f}
}

// CopyF32 enqueues y[i] = x[i] for n floats on the device's stream.
func (d Dev) CopyF32(t *testing.T, y, x gpu.DevicePtr, n int) {
	t.Helper()
	args := []gpu.Arg{gpu.Ptr(y), gpu.Ptr(x), gpu.I32(int32(n))}
	if err := d.B.LaunchKernel(d.CopyFn, kernels.Elementwise(n), args, d.Stream); err != nil {
		t.Fatal(err)
	}
}

// Upload writes v to p synchronously.
func Upload(t *testing.T, b *sim.Backend, p gpu.DevicePtr, v []float32) {
	t.Helper()
	if err := b.MemcpyHtoD(p, gpu.F32ToBytes(v)); err != nil {
		t.Fatal(err)
	}
}

// Download reads n floats from p synchronously.
func Download(t *testing.T, b *sim.Backend, p gpu.DevicePtr, n int) []float32 {
	t.Helper()
	buf := make([]byte, 4*n)
	if err := b.MemcpyDtoH(buf, p); err != nil {
		t.Fatal(err)
	}
	return gpu.BytesToF32(buf)
}

// Ramp is start, start+1, ..., n values.
func Ramp(n int, start float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = start + float32(i)
	}
	return v
}

// WantF32 fails the test at the first element of got that differs from want.
func WantF32(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s: element %d is %v, want %v", what, i, got[i], want[i])
		}
	}
}
