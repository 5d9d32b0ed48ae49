package sim

import (
	"errors"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
)

// The sim's own cases of StreamWaitValue64 (the conformance group
// StreamWaits of package gputest covers the shared contract): memory freed
// under a waiting stream, a backend closed under one, a faulted device, and
// injected faults.

// TestWaitValueMemoryFreed: host memory freed while a stream waits on it
// faults the device when the poll reads it, as a GPU reading freed memory
// does, and the stream's later work is skipped rather than left waiting.
func TestWaitValueMemoryFreed(t *testing.T) {
	b := newSim(t, Config{})
	s := newStream(t, b, 0)
	h, err := b.HostAlloc(64)
	must(t, err)
	must(t, b.StreamWaitValue64(s, h.Ptr, 1))
	must(t, b.HostFree(h.Handle))
	err = b.StreamSynchronize(s)
	if fe := wantFault(t, err); fe.Kernel != "waitValue64" || fe.Write || fe.Reason != "freed" {
		t.Errorf("fault %+v, want a read by waitValue64 of freed memory", fe)
	}
	must(t, b.ResetDevice(0))
	// Memory already freed when the wait is enqueued is refused up front.
	wantErr(t, b.StreamWaitValue64(s, h.Ptr, 1), gpu.ErrInvalidValue)
}

// TestWaitValueFaultedDevice: a device that faults while a stream waits
// releases the wait (its later work is skipped, as all work of a faulted
// device is), so synchronizing returns the fault instead of hanging.
func TestWaitValueFaultedDevice(t *testing.T) {
	b := newSim(t, Config{})
	waiter, other := newStream(t, b, 0), newStream(t, b, 0)
	h, err := b.HostAlloc(64)
	must(t, err)
	defer func() { must(t, b.HostFree(h.Handle)) }()
	must(t, b.StreamWaitValue64(waiter, h.Ptr, 1))
	// The other stream copies within memory freed before the copy runs
	// (held behind a second word until then): the device faults.
	must(t, b.StreamWaitValue64(other, h.Ptr+8, 1))
	d, err := b.MemAlloc(0, 64)
	must(t, err)
	must(t, b.MemcpyDtoDAsync(d, d+32, 32, other))
	must(t, b.MemFree(d))
	h.Store64(8, 1)
	wantFault(t, b.StreamSynchronize(other))
	done := make(chan error, 1)
	go func() { done <- b.StreamSynchronize(waiter) }()
	select {
	case err := <-done:
		wantFault(t, err)
	case <-time.After(10 * time.Second):
		h.Store64(0, 1)
		t.Fatal("a wait on a faulted device held its stream")
	}
	must(t, b.ResetDevice(0))
}

// TestWaitValueClose: closing the backend releases a stream waiting for a
// value nobody writes, so Close does not hang.
func TestWaitValueClose(t *testing.T) {
	b, err := New(Config{})
	must(t, err)
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	must(t, err)
	h, err := b.HostAlloc(64)
	must(t, err)
	must(t, b.StreamWaitValue64(s, h.Ptr, 1))
	done := make(chan error, 1)
	go func() { done <- b.Close() }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("Close with a stream and host memory live reported nothing")
		}
	case <-time.After(10 * time.Second):
		h.Store64(0, 1)
		t.Fatal("Close hung on a stream waiting for a value")
	}
}

// TestWaitValueInjected: the entry points count calls and fail when asked,
// before doing anything.
func TestWaitValueInjected(t *testing.T) {
	b := newSim(t, Config{})
	s := newStream(t, b, 0)
	h, err := b.HostAlloc(64)
	must(t, err)
	defer func() { must(t, b.HostFree(h.Handle)) }()
	for _, op := range []string{"StreamWaitValue64", "StreamWaitsSupported"} {
		b.InjectFault(op, 0, nil)
	}
	if err := b.StreamWaitValue64(s, h.Ptr, 1); !errors.Is(err, gpu.ErrInjected) {
		t.Errorf("StreamWaitValue64 with an injected fault: %v", err)
	}
	if _, err := gpu.StreamWaitsOf(b, 0); !errors.Is(err, gpu.ErrInjected) {
		t.Errorf("StreamWaitsOf with an injected fault: %v", err)
	}
	must(t, b.StreamSynchronize(s)) // the refused wait was not enqueued
	if n := b.Calls("StreamWaitValue64"); n != 1 {
		t.Errorf("Calls(StreamWaitValue64) = %d, want 1", n)
	}
}
