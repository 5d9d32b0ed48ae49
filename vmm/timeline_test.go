package vmm_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/kernels"
)

func TestTimelineSignalAndWait(t *testing.T) {
	b := simtest.New(t, 1)
	d0 := simtest.OpenDev(t, b, 0)
	tl := simtest.Timeline(t, b, 0)
	if tl.Completed() != 0 || tl.Signalled() != 0 {
		t.Fatalf("fresh timeline at %d/%d", tl.Completed(), tl.Signalled())
	}
	var last uint64
	for i := 1; i <= 3; i++ {
		p, err := tl.Signal(d0.Stream)
		if err != nil {
			t.Fatal(err)
		}
		if p != uint64(i) {
			t.Fatalf("point %d, want %d", p, i)
		}
		last = p
	}
	if err := tl.Wait(context.Background(), last, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if !tl.Reached(last) || tl.Completed() != last {
		t.Fatalf("after Wait: completed %d", tl.Completed())
	}
	if err := tl.Wait(context.Background(), last+1, time.Second); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("Wait for a point never signalled: %v, want ErrInvalidValue", err)
	}
	p, err := tl.Signal(d0.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if err := tl.Wait(context.Background(), p, 0); !errors.Is(err, gpu.ErrInvalidValue) && err != nil {
		t.Errorf("Wait with no deadline at all: %v, want ErrInvalidValue (or nil if already reached)", err)
	}
	b.InjectFault("StreamWriteValue64", 0, nil)
	if _, err := tl.Signal(d0.Stream); !errors.Is(err, gpu.ErrInjected) {
		t.Fatalf("Signal with the write failing: %v", err)
	}
	if tl.Signalled() != p {
		t.Errorf("a failed Signal consumed a point: %d", tl.Signalled())
	}
	if err := b.StreamSynchronize(d0.Stream); err != nil {
		t.Fatal(err)
	}
	if err := tl.Close(); err != nil {
		t.Fatal(err)
	}
	if tl.Completed() != p {
		t.Errorf("Completed after Close = %d, want the last value %d", tl.Completed(), p)
	}
	if _, err := tl.Signal(d0.Stream); !errors.Is(err, gpu.ErrInvalidHandle) {
		t.Errorf("Signal after Close: %v, want ErrInvalidHandle", err)
	}
}

// TestTimelineDeadline: on a hung device (writes stalled) Wait returns
// ErrTimeout soon after its deadline, for a timeout and for a context
// deadline, and cancellation returns the context's error.
func TestTimelineDeadline(t *testing.T) {
	b := simtest.New(t, 1)
	d0 := simtest.OpenDev(t, b, 0)
	tl := simtest.Timeline(t, b, 0)
	b.StallTimeline(true)
	defer b.StallTimeline(false)
	p, err := tl.Signal(d0.Stream)
	if err != nil {
		t.Fatal(err)
	}
	const deadline = 50 * time.Millisecond

	start := time.Now()
	err = tl.Wait(context.Background(), p, deadline)
	took := time.Since(start)
	if !errors.Is(err, gpu.ErrTimeout) {
		t.Fatalf("Wait on a stalled timeline: %v, want ErrTimeout", err)
	}
	if took < deadline || took > deadline+time.Second {
		t.Errorf("Wait returned after %v, deadline %v", took, deadline)
	}

	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start = time.Now()
	err = tl.Wait(ctx, p, time.Hour)
	if !errors.Is(err, gpu.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past the context's deadline: %v, want ErrTimeout and DeadlineExceeded", err)
	}
	if took := time.Since(start); took > deadline+time.Second {
		t.Errorf("Wait with a context deadline returned after %v", took)
	}

	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(10*time.Millisecond, cancel)
	if err := tl.Wait(ctx, p, time.Hour); !errors.Is(err, context.Canceled) || errors.Is(err, gpu.ErrTimeout) {
		t.Fatalf("Wait cancelled: %v, want context.Canceled", err)
	}

	// The stalled write completed without writing; a later point, written
	// once the device recovers, covers it.
	if err := b.StreamSynchronize(d0.Stream); err != nil {
		t.Fatal(err)
	}
	b.StallTimeline(false)
	q, err := tl.Signal(d0.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if err := tl.Wait(context.Background(), p, 5*time.Second); err != nil {
		t.Fatalf("Wait for %d after the device recovered (signalled %d): %v", p, q, err)
	}
}

// TestTimelineBind: a bound timeline refuses a signal from another stream
// and a second binding, and keeps working on its own stream.
func TestTimelineBind(t *testing.T) {
	b := simtest.New(t, 1)
	d0 := simtest.OpenDev(t, b, 0)
	other := simtest.Stream(t, b, 0)
	tl := simtest.Timeline(t, b, 0)
	if err := tl.Bind(0); !errors.Is(err, gpu.ErrInvalidHandle) {
		t.Fatalf("Bind to stream 0 = %v, want ErrInvalidHandle", err)
	}
	if err := tl.Bind(d0.Stream); err != nil {
		t.Fatal(err)
	}
	if err := tl.Bind(d0.Stream); err != nil {
		t.Fatalf("binding again to the same stream = %v", err)
	}
	if err := tl.Bind(other); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Fatalf("Bind to a second stream = %v, want ErrInvalidValue", err)
	}
	if _, err := tl.Signal(other); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Fatalf("Signal on a second stream = %v, want ErrInvalidValue", err)
	}
	p, err := tl.Signal(d0.Stream)
	if err != nil || p != 1 {
		t.Fatalf("Signal on the bound stream = %d, %v; want point 1", p, err)
	}
	if err := tl.Wait(context.Background(), p, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := tl.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestTimelineBoundFaultEndsWait: a wait on a bound timeline whose stream
// faulted before writing the point ends at the fault, long before its
// deadline.
func TestTimelineBoundFaultEndsWait(t *testing.T) {
	b := simtest.New(t, 1)
	d0 := simtest.OpenDev(t, b, 0)
	tl := simtest.Timeline(t, b, 0)
	if err := tl.Bind(d0.Stream); err != nil {
		t.Fatal(err)
	}
	x, err := b.MemAlloc(0, 1024)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.MemFree(x); err != nil {
		t.Fatal(err)
	}
	// A kernel writing freed memory faults; the signal after it is skipped.
	// A gate holds the stream until both are enqueued: a fault reached
	// before the Signal call would make the Signal itself fail.
	gate, openGate := simtest.HeldGate(t, b, 0)
	if err := b.LaunchKernel(gate, gpu.Linear(1, 1), nil, d0.Stream); err != nil {
		t.Fatal(err)
	}
	fill := d0.Kernel(t, kernels.Fill)
	if err := b.LaunchKernel(fill, kernels.Elementwise(256), []gpu.Arg{gpu.Ptr(x), gpu.F32(1), gpu.I32(256)}, d0.Stream); err != nil {
		t.Fatal(err)
	}
	p, err := tl.Signal(d0.Stream)
	if err != nil {
		t.Fatal(err)
	}
	openGate()
	start := time.Now()
	err = tl.Wait(context.Background(), p, 10*time.Second)
	if !errors.Is(err, gpu.ErrIllegalAddress) {
		t.Fatalf("Wait behind a fault = %v, want the fault", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("a wait behind a fault took %v: it should end at the first stream query", el)
	}
	// The faulted stream writes nothing more: Close proceeds.
	if err := tl.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.ResetDevice(0); err != nil {
		t.Fatal(err)
	}
}

// TestTimelineBoundCloseRefusesWhileBusy: a bound timeline is not freed
// while its stream still has a point to write; once the stream is idle it
// is, even when the write never landed (a stalled timeline).
func TestTimelineBoundCloseRefusesWhileBusy(t *testing.T) {
	b := simtest.New(t, 1)
	d0 := simtest.OpenDev(t, b, 0)
	tl := simtest.Timeline(t, b, 0)
	if err := tl.Bind(d0.Stream); err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	if err := b.LaunchKernel(simtest.Gate(t, b, 0, gate), gpu.Linear(1, 1), nil, d0.Stream); err != nil {
		t.Fatal(err)
	}
	p, err := tl.Signal(d0.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if err := tl.Close(); !errors.Is(err, gpu.ErrIllegalState) {
		t.Fatalf("Close with a write outstanding = %v, want ErrIllegalState", err)
	}
	close(gate)
	if err := tl.Wait(context.Background(), p, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	b.StallTimeline(true)
	defer b.StallTimeline(false)
	if _, err := tl.Signal(d0.Stream); err != nil {
		t.Fatal(err)
	}
	if err := b.StreamSynchronize(d0.Stream); err != nil {
		t.Fatal(err)
	}
	if err := tl.Close(); err != nil {
		t.Fatalf("Close with the stream idle and the last write lost = %v", err)
	}
	if err := tl.Close(); !errors.Is(err, gpu.ErrInvalidHandle) {
		t.Fatalf("second Close = %v, want ErrInvalidHandle", err)
	}
}
