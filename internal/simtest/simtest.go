// Package simtest holds the test helpers shared by every package whose
// tests drive the sim backend directly (the root package, replay, client,
// vmm, retire, streamcache): a backend that checks at cleanup that the
// test released every handle, streams and memory freed at cleanup, a
// kernel that holds its stream until released, a vmm timeline closed at
// cleanup, a device with a stream and the built-in kernels, and float32
// transfers. It is imported by tests only.
package simtest

import (
	"errors"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/vmm"
)

// DeviceMemory is the memory of each device New opens.
const DeviceMemory = 1 << 30

// New opens a sim backend with the given number of devices (DeviceMemory
// each). At cleanup it fails the test if any handle is still live
// (docs/ARCHITECTURE.md, rule 2), then closes the backend.
func New(t testing.TB, devices int) *sim.Backend {
	t.Helper()
	return NewWith(t, sim.Config{Devices: devices, DeviceMemory: DeviceMemory})
}

// NewWith is New with a configuration of the test's own.
func NewWith(t testing.TB, cfg sim.Config) *sim.Backend {
	t.Helper()
	b, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if live := b.LiveHandles(); !live.IsZero() {
			t.Errorf("handles live at the end of the test: %s", live)
		}
		if err := b.Close(); err != nil {
			t.Errorf("close sim: %v", err)
		}
	})
	return b
}

// WantZero fails the test at once if any handle of b is live.
func WantZero(t testing.TB, b *sim.Backend, when string) {
	t.Helper()
	if c := b.LiveHandles(); !c.IsZero() {
		t.Fatalf("%s: live handles: %s", when, c)
	}
}

// WantLive fails the test at once unless b's live handles are want.
func WantLive(t testing.TB, b *sim.Backend, when string, want gpu.HandleCounts) {
	t.Helper()
	if c := b.LiveHandles(); c != want {
		t.Fatalf("%s: live handles %s, want %s", when, c, want)
	}
}

// Stream creates a non-blocking stream on device dev, destroyed at
// cleanup.
func Stream(t testing.TB, b gpu.Backend, dev int) gpu.Stream {
	t.Helper()
	s, err := b.StreamCreate(dev, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.StreamDestroy(s); err != nil {
			t.Errorf("destroy stream: %v", err)
		}
	})
	return s
}

// Alloc allocates size bytes on device dev, freed at cleanup.
func Alloc(t testing.TB, b gpu.Backend, dev int, size uint64) gpu.DevicePtr {
	t.Helper()
	p, err := b.MemAlloc(dev, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.MemFree(p); err != nil {
			t.Errorf("free: %v", err)
		}
	})
	return p
}

// Freed returns the address of an allocation of size bytes on device dev
// that is already freed: memory no binding may name. Call it after what
// else the test allocates, so that nothing reuses the range.
func Freed(t testing.TB, b gpu.Backend, dev int, size uint64) gpu.DevicePtr {
	t.Helper()
	p, err := b.MemAlloc(dev, size)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.MemFree(p); err != nil {
		t.Fatal(err)
	}
	return p
}

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

// Gate loads GateModule on device dev and returns its kernel; the module
// is unloaded at cleanup.
func Gate(t testing.TB, b gpu.Backend, dev int, gate <-chan struct{}) gpu.Function {
	t.Helper()
	m, err := b.ModuleLoad(dev, GateModule(gate))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.ModuleUnload(m); err != nil {
			t.Errorf("unload the gate module: %v", err)
		}
	})
	f, err := b.ModuleFunction(m, "gate")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// HeldGate loads a gate (Gate) on device dev and returns its kernel and
// open, which opens the gate (again is a no-op). The gate is opened at
// cleanup, before the module is unloaded and the backend closed, so that
// a test that fails while the gate holds its stream still ends.
func HeldGate(t testing.TB, b gpu.Backend, dev int) (gate gpu.Function, open func()) {
	t.Helper()
	ch := make(chan struct{})
	var once sync.Once
	open = func() { once.Do(func() { close(ch) }) }
	gate = Gate(t, b, dev, ch)
	t.Cleanup(open)
	return gate, open
}

// Timeline makes a vmm.Timeline on device dev, closed at cleanup unless
// the test closed it (the cleanup's Close error is then ignored, as is
// any other: tests that care close it themselves and check).
func Timeline(t testing.TB, b gpu.Backend, dev int) *vmm.Timeline {
	t.Helper()
	tl, err := vmm.NewTimeline(b, dev)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tl.Close() })
	return tl
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
func OpenDev(t testing.TB, b *sim.Backend, d int) Dev {
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

// Kernel returns the built-in kernel name of the device's module.
func (d Dev) Kernel(t testing.TB, name string) gpu.Function {
	t.Helper()
	f, err := d.B.ModuleFunction(d.Mod, name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// CopyF32 enqueues y[i] = x[i] for n floats on the device's stream.
func (d Dev) CopyF32(t testing.TB, y, x gpu.DevicePtr, n int) {
	t.Helper()
	args := []gpu.Arg{gpu.Ptr(y), gpu.Ptr(x), gpu.I32(int32(n))}
	if err := d.B.LaunchKernel(d.CopyFn, kernels.Elementwise(n), args, d.Stream); err != nil {
		t.Fatal(err)
	}
}

// Upload writes v to p synchronously.
func Upload(t testing.TB, b gpu.Backend, p gpu.DevicePtr, v []float32) {
	t.Helper()
	if err := b.MemcpyHtoD(p, gpu.F32ToBytes(v)); err != nil {
		t.Fatal(err)
	}
}

// Download reads n floats from p synchronously.
func Download(t testing.TB, b gpu.Backend, p gpu.DevicePtr, n int) []float32 {
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
func WantF32(t testing.TB, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s: element %d is %v, want %v", what, i, got[i], want[i])
		}
	}
}

// Table reads a table of test cases from a testdata file: one case a
// line, fields separated by "|" and trimmed; blank lines and lines
// starting with "#" are skipped. Every case must have want fields.
func Table(t testing.TB, path string, want int) [][]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rows [][]string
	for n, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Split(line, "|")
		if len(fields) != want {
			t.Fatalf("%s:%d: %d fields, want %d", path, n+1, len(fields), want)
		}
		for i := range fields {
			fields[i] = strings.TrimSpace(fields[i])
		}
		rows = append(rows, fields)
	}
	if len(rows) == 0 {
		t.Fatalf("%s: no cases", path)
	}
	return rows
}
