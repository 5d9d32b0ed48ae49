package retire_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/retire"
)

// simEnv is a one-device sim backend with one stream; done checks that
// nothing is left live.
func simEnv(t *testing.T) (*sim.Backend, gpu.Stream, func()) {
	t.Helper()
	b, err := sim.New(gpu.Config{Devices: 1, DeviceMemory: 1 << 28})
	if err != nil {
		t.Fatal(err)
	}
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	return b, s, func() {
		t.Helper()
		if err := b.StreamDestroy(s); err != nil {
			t.Error(err)
		}
		if live := b.LiveHandles(); !live.IsZero() {
			t.Errorf("handles left live: %v", live)
		}
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	}
}

func TestStreamTimelineSignalWait(t *testing.T) {
	b, s, done := simEnv(t)
	defer done()
	tl, err := retire.NewStreamTimeline(b, 0)
	if err != nil {
		t.Fatal(err)
	}
	var _ retire.Timeline = tl
	ctx := context.Background()
	var last uint64
	for i := 0; i < 5; i++ {
		p, err := tl.Signal(s)
		if err != nil {
			t.Fatal(err)
		}
		if p != last+1 {
			t.Fatalf("Signal returned %d after %d", p, last)
		}
		last = p
	}
	if err := tl.Wait(ctx, last, time.Second); err != nil {
		t.Fatal(err)
	}
	if got := tl.Completed(); got != last {
		t.Fatalf("Completed %d after waiting for %d", got, last)
	}
	if err := tl.Wait(ctx, last+1, time.Second); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Fatalf("Wait for a point never signalled = %v", err)
	}
	other, err := b.StreamCreate(0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.StreamDestroy(other)
	if _, err := tl.Signal(other); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Fatalf("Signal on a second stream = %v, want ErrInvalidValue", err)
	}
	if err := tl.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tl.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if got := tl.Completed(); got != last {
		t.Fatalf("Completed after Close = %d, want %d", got, last)
	}
	if _, err := tl.Signal(s); !errors.Is(err, gpu.ErrIllegalState) {
		t.Fatalf("Signal after Close = %v", err)
	}
}

func TestStreamTimelineStallTimesOut(t *testing.T) {
	b, s, done := simEnv(t)
	defer done()
	tl, err := retire.NewStreamTimeline(b, 0)
	if err != nil {
		t.Fatal(err)
	}
	b.StallTimeline(true)
	p, err := tl.Signal(s)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = tl.Wait(context.Background(), p, 30*time.Millisecond)
	if !errors.Is(err, gpu.ErrTimeout) {
		t.Fatalf("Wait on a stalled timeline = %v, want ErrTimeout", err)
	}
	if el := time.Since(start); el < 30*time.Millisecond || el > 5*time.Second {
		t.Fatalf("Wait with a 30ms deadline returned after %v", el)
	}
	// The stream is idle, so Close may free the word although the write
	// never landed.
	if err := b.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
	if err := tl.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestStreamTimelineFaultEndsWait(t *testing.T) {
	b, s, done := simEnv(t)
	defer done()
	tl, err := retire.NewStreamTimeline(b, 0)
	if err != nil {
		t.Fatal(err)
	}
	m, err := b.ModuleLoad(0, kernels.Module())
	if err != nil {
		t.Fatal(err)
	}
	defer b.ModuleUnload(m)
	fill, err := b.ModuleFunction(m, kernels.Fill)
	if err != nil {
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
	gate := make(chan struct{})
	var openGate sync.Once
	defer openGate.Do(func() { close(gate) })
	gm, err := b.ModuleLoad(0, &gpu.ModuleImage{Name: "retire-test-gate", Kernels: []gpu.KernelSpec{{
		Name: "gate",
		Ref: func(gpu.Memory, gpu.LaunchConfig, []gpu.Arg) error {
			<-gate
			return nil
		},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.ModuleUnload(gm)
	gf, err := b.ModuleFunction(gm, "gate")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.LaunchKernel(gf, gpu.Linear(1, 1), nil, s); err != nil {
		t.Fatal(err)
	}
	if err := b.LaunchKernel(fill, kernels.Elementwise(256), []gpu.Arg{gpu.Ptr(x), gpu.F32(1), gpu.I32(256)}, s); err != nil {
		t.Fatal(err)
	}
	p, err := tl.Signal(s)
	if err != nil {
		t.Fatal(err)
	}
	openGate.Do(func() { close(gate) })
	start := time.Now()
	err = tl.Wait(context.Background(), p, 10*time.Second)
	if !errors.Is(err, gpu.ErrIllegalAddress) {
		t.Fatalf("Wait behind a fault = %v, want the fault", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("a wait behind a fault took %v: it should end at the first stream query", el)
	}
	if err := tl.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.ResetDevice(0); err != nil {
		t.Fatal(err)
	}
}

func TestStreamTimelineCloseRefusesWhileBusy(t *testing.T) {
	b, s, done := simEnv(t)
	defer done()
	tl, err := retire.NewStreamTimeline(b, 0)
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	m, err := b.ModuleLoad(0, &gpu.ModuleImage{Name: "gate", Kernels: []gpu.KernelSpec{{
		Name: "wait", Params: []gpu.ArgKind{gpu.ArgI32},
		Ref: func(gpu.Memory, gpu.LaunchConfig, []gpu.Arg) error { <-gate; return nil },
	}}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.ModuleUnload(m)
	f, _ := b.ModuleFunction(m, "wait")
	if err := b.LaunchKernel(f, gpu.Linear(1, 1), []gpu.Arg{gpu.I32(0)}, s); err != nil {
		t.Fatal(err)
	}
	p, err := tl.Signal(s)
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
	if err := tl.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestQueueOverStreamTimeline runs a queue over a real timeline: a batch is
// not released while the kernel that used it is gated, and is released by
// the first poll once the timeline passed it.
func TestQueueOverStreamTimeline(t *testing.T) {
	b, s, done := simEnv(t)
	defer done()
	tl, err := retire.NewStreamTimeline(b, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	gate := make(chan struct{})
	m, err := b.ModuleLoad(0, &gpu.ModuleImage{Name: "gate", Kernels: []gpu.KernelSpec{{
		Name: "read", Params: []gpu.ArgKind{gpu.ArgPtr},
		Ref: func(mem gpu.Memory, _ gpu.LaunchConfig, a []gpu.Arg) error {
			<-gate
			return mem.Read(a[0].AsPtr(), make([]byte, 64))
		},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.ModuleUnload(m)
	f, _ := b.ModuleFunction(m, "read")
	x, err := b.MemAlloc(0, 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.LaunchKernel(f, gpu.Linear(1, 1), []gpu.Arg{gpu.Ptr(x)}, s); err != nil {
		t.Fatal(err)
	}
	p, err := tl.Signal(s)
	if err != nil {
		t.Fatal(err)
	}
	q := retire.NewQueue(tl, retire.Options{})
	freed := false
	if err := q.Retire(context.Background(), retire.Batch{{Bytes: 64, Release: func() error {
		freed = true
		return b.MemFree(x)
	}}}, p); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := q.Poll(); err != nil {
			t.Fatal(err)
		}
	}
	if freed {
		t.Fatal("released while the kernel reading it was in flight")
	}
	close(gate)
	if err := b.StreamSynchronize(s); err != nil {
		t.Fatalf("the in-flight kernel faulted: %v", err)
	}
	if err := q.Poll(); err != nil {
		t.Fatal(err)
	}
	if !freed {
		t.Fatal("not released by the first poll after its point passed")
	}
	if st := q.Stats(); st.ReleasedByPoll != 1 || st.PendingBytes != 0 || st.PeakPendingBytes != 64 {
		t.Fatalf("stats %+v", st)
	}
}
