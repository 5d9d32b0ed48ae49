package cuda

import (
	"errors"
	"sync"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

// Tests of StreamWaitValue64 over the stub driver (stub_test.go): no GPU
// needed. The conformance group StreamWaits (package gputest) checks the
// behaviour on a GPU.

// waitCalls opens a stub backend whose cuStreamWaitValue64_v2 calls are
// recorded, with the symbols in missing absent from the driver.
func waitCalls(t *testing.T, missing ...string) (*Backend, *stubDriver, func() [][4]uintptr) {
	t.Helper()
	sd := newStubDriver()
	var (
		mu    sync.Mutex
		calls [][4]uintptr
	)
	stub := func(name string, a cu.StubArgs) cu.Result {
		if name == "cuStreamWaitValue64_v2" {
			mu.Lock()
			calls = append(calls, [4]uintptr(a.A[:4]))
			mu.Unlock()
		}
		return sd.call(name, a)
	}
	b, err := openDriver(cu.NewStub("stub-libcuda", stub, missing...), resolveOptions(Config{}))
	if err != nil {
		t.Fatalf("open over the stub driver: %v", err)
	}
	t.Cleanup(func() {
		if c := b.LiveHandles(); !c.IsZero() {
			t.Errorf("leak: %v", c)
		}
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return b, sd, func() [][4]uintptr {
		mu.Lock()
		defer mu.Unlock()
		return append([][4]uintptr(nil), calls...)
	}
}

// TestStubStreamWaitValue64: the call reaches the driver as
// cuStreamWaitValue64_v2(stream, address, value, CU_STREAM_WAIT_VALUE_GEQ);
// bad handles, bad addresses and capturing streams are refused before it,
// naming the entry point; a failing driver call names the C function.
func TestStubStreamWaitValue64(t *testing.T) {
	b, sd, calls := waitCalls(t)
	sw, err := gpu.StreamWaitsOf(b, 0)
	if err != nil {
		t.Fatalf("StreamWaitsOf on a device with stream memory operations: %v", err)
	}
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.StreamDestroy(s)
	hm, err := b.HostAlloc(64)
	if err != nil {
		t.Fatal(err)
	}
	defer b.HostFree(hm.Handle)
	_, cs, _ := b.stream("test", s)

	if err := sw.StreamWaitValue64(s, hm.Ptr.Add(8), 0x1234_5678_9abc); err != nil {
		t.Fatalf("StreamWaitValue64: %v", err)
	}
	want := [4]uintptr{uintptr(cs), uintptr(hm.Ptr.Add(8)), 0x1234_5678_9abc, uintptr(cu.StreamWaitValueGEQ)}
	if got := calls(); len(got) != 1 || got[0] != want {
		t.Fatalf("driver saw %x, want one call %x", got, want)
	}

	if err := b.StreamBeginCapture(s); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what string
		err  error
		want error
	}{
		{"a dead stream", sw.StreamWaitValue64(0xdead_0000, hm.Ptr, 1), gpu.ErrInvalidHandle},
		{"the zero stream", sw.StreamWaitValue64(0, hm.Ptr, 1), gpu.ErrInvalidHandle},
		{"a misaligned address", sw.StreamWaitValue64(s, hm.Ptr.Add(4), 1), gpu.ErrInvalidValue},
		{"a null address", sw.StreamWaitValue64(s, 0, 1), gpu.ErrInvalidValue},
		{"a capturing stream", sw.StreamWaitValue64(s, hm.Ptr, 1), gpu.ErrNotSupported},
	} {
		var ge *gpu.Error
		if !errors.Is(c.err, c.want) || !errors.As(c.err, &ge) || ge.Op != "StreamWaitValue64" {
			t.Errorf("%s: %v, want %v from StreamWaitValue64", c.what, c.err, c.want)
		}
	}
	g, err := b.StreamEndCapture(s)
	if err != nil {
		t.Fatalf("the capture broke on a refused wait: %v", err)
	}
	if err := b.GraphDestroy(g); err != nil {
		t.Fatal(err)
	}
	if n := len(calls()); n != 1 {
		t.Errorf("refused waits reached the driver: %d calls", n)
	}

	sd.fail = func(name string) cu.Result {
		if name == "cuStreamWaitValue64_v2" {
			return cu.ErrorInvalidValue
		}
		return cu.Success
	}
	err = sw.StreamWaitValue64(s, hm.Ptr, 1)
	sd.fail = nil
	var ge *gpu.Error
	if !errors.Is(err, gpu.ErrInvalidValue) || !errors.As(err, &ge) || ge.Op != "cuStreamWaitValue64_v2" || ge.CodeName != "CUDA_ERROR_INVALID_VALUE" {
		t.Errorf("a failing driver call: %v", err)
	}
}

// TestStubStreamWaitsMissing: without the entry point (an old driver)
// StreamWaitsOf and the call itself say so with ErrNotSupported, and the
// driver is not called.
func TestStubStreamWaitsMissing(t *testing.T) {
	b, _, calls := waitCalls(t, "cuStreamWaitValue64_v2", "cuStreamWaitValue64")
	if _, err := gpu.StreamWaitsOf(b, 0); !errors.Is(err, gpu.ErrNotSupported) {
		t.Errorf("StreamWaitsOf without the entry point: %v", err)
	}
	if err := b.StreamWaitsSupported(7); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("StreamWaitsSupported(7) on one device: %v", err)
	}
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.StreamDestroy(s)
	err = b.StreamWaitValue64(s, 0x1000, 1)
	var ge *gpu.Error
	if !errors.Is(err, gpu.ErrNotSupported) || !errors.As(err, &ge) || ge.Op != "StreamWaitValue64" {
		t.Errorf("StreamWaitValue64 without the entry point: %v", err)
	}
	if n := len(calls()); n != 0 {
		t.Errorf("the missing entry point was called %d times", n)
	}
}
