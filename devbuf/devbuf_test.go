package devbuf_test

import (
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph/devbuf"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/simtest"
)

// open returns a sim backend whose live handles must be back to zero when
// the test ends.
func open(t *testing.T) *sim.Backend {
	t.Helper()
	b, err := sim.New(sim.Config{DeviceMemory: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if live := b.LiveHandles(); !live.IsZero() {
			t.Errorf("handles live at the end: %v", live)
		}
		b.Close()
	})
	return b
}

func TestUploadRead(t *testing.T) {
	b := open(t)
	d := simtest.OpenDev(t, b, 0)
	in := []float32{1, -2.5, float32(math.Inf(1)), 0, 3e-38, 7}
	x, err := devbuf.Upload(b, 0, in, 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	if x.Len() != 6 || x.Size() != 24 || !slices.Equal(x.Shape(), []int{2, 3}) || x.Device() != 0 || x.Ptr() == 0 {
		t.Errorf("buffer: len %d size %d shape %v device %d ptr %#x", x.Len(), x.Size(), x.Shape(), x.Device(), x.Ptr())
	}
	x.Shape()[0] = 99 // a copy
	if x.Shape()[0] != 2 {
		t.Error("Shape returned the buffer's own slice")
	}
	got, err := x.Read(d.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, in) {
		t.Errorf("read %v, want %v", got, in)
	}
	// The bytes are gpu.F32ToBytes's: what kernels read.
	if raw := simtest.Download(t, b, x.Ptr(), 6); !slices.Equal(raw, in) {
		t.Errorf("device holds %v, want %v", raw, in)
	}
	if err := x.Write(d.Stream, []float32{6, 5, 4, 3, 2, 1}); err != nil {
		t.Fatal(err)
	}
	if got, _ := x.Read(d.Stream); !slices.Equal(got, []float32{6, 5, 4, 3, 2, 1}) {
		t.Errorf("after Write: %v", got)
	}
	if err := x.Free(); err != nil {
		t.Fatal(err)
	}
}

type celsius float64

func TestOtherTypes(t *testing.T) {
	b := open(t)
	d := simtest.OpenDev(t, b, 0)
	ints, err := devbuf.Upload(b, 0, []int32{-1, 2, math.MaxInt32})
	if err != nil {
		t.Fatal(err)
	}
	defer ints.Free()
	if got, err := ints.Read(d.Stream); err != nil || !slices.Equal(got, []int32{-1, 2, math.MaxInt32}) || !slices.Equal(ints.Shape(), []int{3}) {
		t.Errorf("int32: %v %v shape %v", got, err, ints.Shape())
	}
	temps, err := devbuf.Upload(b, 0, []celsius{-40, 21.5})
	if err != nil {
		t.Fatal(err)
	}
	defer temps.Free()
	if got, err := temps.Read(d.Stream); err != nil || !slices.Equal(got, []celsius{-40, 21.5}) || temps.Size() != 16 {
		t.Errorf("celsius: %v %v size %d", got, err, temps.Size())
	}
}

// TestNewZeroedFreshAddresses: New's memory reads as zero even where the
// device memory held something before, and every buffer has its own
// address.
func TestNewZeroedFreshAddresses(t *testing.T) {
	b := open(t)
	d := simtest.OpenDev(t, b, 0)
	seen := map[gpu.DevicePtr]bool{}
	for range 4 {
		y, err := devbuf.New[float32](b, 0, 8, 4)
		if err != nil {
			t.Fatal(err)
		}
		if seen[y.Ptr()] {
			t.Errorf("address %#x handed out twice", y.Ptr())
		}
		seen[y.Ptr()] = true
		got, err := y.Read(d.Stream)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, make([]float32, 32)) {
			t.Errorf("new buffer holds %v", got)
		}
		if err := y.Write(d.Stream, simtest.Ramp(32, 1)); err != nil {
			t.Fatal(err)
		}
		if err := y.Free(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReadOrderedOnStream: Read waits for the work already on its stream:
// with a kernel holding the stream and a memset queued behind it, Read
// returns only after both, with the memset's values.
func TestReadOrderedOnStream(t *testing.T) {
	b := open(t)
	d := simtest.OpenDev(t, b, 0)
	gate := make(chan struct{})
	m, err := b.ModuleLoad(0, simtest.GateModule(gate))
	if err != nil {
		t.Fatal(err)
	}
	defer b.ModuleUnload(m)
	f, err := b.ModuleFunction(m, "gate")
	if err != nil {
		t.Fatal(err)
	}
	y, err := devbuf.New[float32](b, 0, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer y.Free()
	if err := b.LaunchKernel(f, gpu.LaunchConfig{Grid: gpu.Dim3{X: 1, Y: 1, Z: 1}, Block: gpu.Dim3{X: 1, Y: 1, Z: 1}}, nil, d.Stream); err != nil {
		close(gate)
		t.Fatal(err)
	}
	if err := b.MemsetAsync(gpu.Memset{Dst: y.Ptr(), Value: math.Float32bits(2.5), ElemSize: 4, Count: 4}, d.Stream); err != nil {
		close(gate)
		t.Fatal(err)
	}
	type result struct {
		v   []float32
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := y.Read(d.Stream)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		close(gate)
		t.Fatalf("Read returned before the work on its stream ran: %v %v", r.v, r.err)
	case <-time.After(20 * time.Millisecond):
	}
	close(gate)
	r := <-done
	if r.err != nil || !slices.Equal(r.v, []float32{2.5, 2.5, 2.5, 2.5}) {
		t.Errorf("Read: %v %v", r.v, r.err)
	}
}

// TestBadInput: every bad shape, length or use is an error naming it, and
// nothing leaks (open's cleanup checks the live handles).
func TestBadInput(t *testing.T) {
	b := open(t)
	d := simtest.OpenDev(t, b, 0)
	for name, err := range map[string]error{
		"no shape":       func() error { _, err := devbuf.New[float32](b, 0); return err }(),
		"zero dimension": func() error { _, err := devbuf.New[float32](b, 0, 4, 0); return err }(),
		"negative":       func() error { _, err := devbuf.New[float32](b, 0, -1); return err }(),
		"too large":      func() error { _, err := devbuf.New[float64](b, 0, 1<<40, 1<<40); return err }(),
		"length":         func() error { _, err := devbuf.Upload(b, 0, []float32{1, 2, 3}, 2, 2); return err }(),
		"empty data":     func() error { _, err := devbuf.Upload(b, 0, []float32{}); return err }(),
	} {
		if !errors.Is(err, gpu.ErrInvalidValue) {
			t.Errorf("%s: %v, want gpu.ErrInvalidValue", name, err)
		}
	}
	if _, err := devbuf.New[float32](b, 5, 4); err == nil {
		t.Error("device 5 of 1 accepted")
	}
	x, err := devbuf.New[float32](b, 0, 4)
	if err != nil {
		t.Fatal(err)
	}
	if err := x.Write(d.Stream, []float32{1}); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("short Write: %v", err)
	}
	if err := x.Free(); err != nil {
		t.Fatal(err)
	}
	if err := x.Free(); !errors.Is(err, gpu.ErrInvalidHandle) {
		t.Errorf("second Free: %v", err)
	}
	if _, err := x.Read(d.Stream); !errors.Is(err, gpu.ErrInvalidHandle) {
		t.Errorf("Read after Free: %v", err)
	}
	if err := x.Write(d.Stream, make([]float32, 4)); !errors.Is(err, gpu.ErrInvalidHandle) {
		t.Errorf("Write after Free: %v", err)
	}
}

// TestFailuresRelease: a New or Upload whose first fill fails frees its
// allocation and says what failed; a failed Read or Write says so.
func TestFailuresRelease(t *testing.T) {
	b := open(t)
	d := simtest.OpenDev(t, b, 0)
	for _, op := range []string{"MemAlloc", "Memset", "MemcpyHtoD"} {
		b.InjectFault(op, 0, nil)
		var err error
		if op == "MemcpyHtoD" {
			_, err = devbuf.Upload(b, 0, []float32{1, 2})
		} else {
			_, err = devbuf.New[float32](b, 0, 2)
		}
		b.ClearFaults()
		if !errors.Is(err, gpu.ErrInjected) {
			t.Errorf("%s failed: %v", op, err)
		}
	}
	x, err := devbuf.Upload(b, 0, []float32{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	for _, op := range []string{"MemcpyDtoHAsync", "StreamSynchronize"} {
		b.InjectFault(op, 0, nil)
		_, err := x.Read(d.Stream)
		b.ClearFaults()
		if !errors.Is(err, gpu.ErrInjected) {
			t.Errorf("Read with %s failing: %v", op, err)
		}
	}
	b.InjectFault("MemcpyHtoDAsync", 0, nil)
	err = x.Write(d.Stream, []float32{3, 4})
	b.ClearFaults()
	if !errors.Is(err, gpu.ErrInjected) {
		t.Errorf("Write with MemcpyHtoDAsync failing: %v", err)
	}
}
