package retire_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/retire"
	"github.com/stablegraph/stablegraph/vmm"
)

// The deferred-free Allocator's tests (moved from package vmm with it).

const gran = sim.Granularity

// TestAllocatorNeverFreesEarly: memory freed while a kernel that reads it is
// still queued is not released until the timeline passes the kernel, and the
// kernel reads it without a fault. The stream is held by a gate kernel, so
// the kernel is certainly still queued when Poll runs.
func TestAllocatorNeverFreesEarly(t *testing.T) {
	b := simtest.New(t, 1)
	d0 := simtest.OpenDev(t, b, 0)
	gf, openGate := simtest.HeldGate(t, b, 0)

	tl := simtest.Timeline(t, b, 0)
	da, err := retire.NewAllocator(b, tl, retire.Options{WaitDeadline: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}

	const n = 4096
	x, err := da.Alloc(0, 4*n, nil)
	if err != nil {
		t.Fatal(err)
	}
	y, err := da.Alloc(0, 4*n, nil)
	if err != nil {
		t.Fatal(err)
	}
	simtest.Upload(t, b, x.Ptr(), simtest.Ramp(n, 3))

	if err := b.LaunchKernel(gf, gpu.Linear(1, 1), nil, d0.Stream); err != nil {
		t.Fatal(err)
	}
	d0.CopyF32(t, y.Ptr(), x.Ptr(), n) // the last use of x
	p := signal(t, tl, d0.Stream)
	if err := da.Free(x, p); err != nil {
		t.Fatal(err)
	}
	if err := da.Free(x, p); !errors.Is(err, gpu.ErrInvalidHandle) {
		t.Errorf("second Free of x: %v, want ErrInvalidHandle", err)
	}
	if err := da.Free(y, p+1); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("Free at a point never signalled: %v, want ErrInvalidValue", err)
	}
	for range 5 {
		if released, err := da.Poll(); released != 0 || err != nil {
			t.Fatalf("Poll while the reader is queued released %d (%v)", released, err)
		}
		time.Sleep(time.Millisecond)
	}
	if s := da.Stats(); s.Pending != 1 || s.PendingBytes != gran || s.Released != 0 {
		t.Fatalf("stats while the reader is queued: %+v", s)
	}
	if err := tl.Wait(context.Background(), p, 20*time.Millisecond); !errors.Is(err, gpu.ErrTimeout) {
		t.Fatalf("timeline passed the gate while it was closed: %v", err)
	}
	simtest.WantLive(t, b, "x still held", gpu.HandleCounts{Streams: 1, Modules: 2, HostAllocs: 1, Chunks: 2, Reservations: 2, Mappings: 2})

	openGate()
	if err := da.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := b.StreamSynchronize(d0.Stream); err != nil {
		t.Fatalf("the queued reader of freed-later memory faulted: %v", err)
	}
	simtest.WantF32(t, "the reader's output", simtest.Download(t, b, y.Ptr(), n), simtest.Ramp(n, 3))
	if s := da.Stats(); s.Pending != 0 || s.Released != 1 || s.ReleasedBytes != gran || s.PeakPendingBytes != gran {
		t.Fatalf("stats after Drain: %+v", s)
	}
	if err := y.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestAllocatorPollOrderAndDrainTimeout(t *testing.T) {
	b := simtest.New(t, 1)
	d0 := simtest.OpenDev(t, b, 0)
	tl := simtest.Timeline(t, b, 0)
	da, err := retire.NewAllocator(b, tl, retire.Options{WaitDeadline: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Free polls (Queue.Retire), so the stream is held by a gate kernel
	// until every free is queued: none is released before the Poll below.
	gf, openGate := simtest.HeldGate(t, b, 0)
	if err := b.LaunchKernel(gf, gpu.Linear(1, 1), nil, d0.Stream); err != nil {
		t.Fatal(err)
	}
	var points []uint64
	for i := range 3 {
		a, err := da.Alloc(0, uint64(i+1)*gran, nil)
		if err != nil {
			t.Fatal(err)
		}
		p := signal(t, tl, d0.Stream)
		points = append(points, p)
		if err := da.Free(a, p); err != nil {
			t.Fatal(err)
		}
	}
	if s := da.Stats(); s.Pending != 3 || s.Released != 0 {
		t.Fatalf("stats while the gate holds the stream: %+v", s)
	}
	openGate()
	if err := tl.Wait(context.Background(), points[2], 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if n, err := da.Poll(); n != 3 || err != nil {
		t.Fatalf("Poll after the timeline passed every point released %d (%v)", n, err)
	}
	if s := da.Stats(); s.PeakPendingBytes != 6*gran || s.PendingBytes != 0 || s.ReleasedBytes != 6*gran {
		t.Fatalf("stats: %+v", s)
	}

	// A hung device: Drain gives up at its timeout, keeps what it could
	// not release, and finishes once the device recovers.
	b.StallTimeline(true)
	a, err := da.Alloc(0, gran, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := signal(t, tl, d0.Stream)
	if err := da.Free(a, p); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := da.Drain(context.Background()); !errors.Is(err, gpu.ErrTimeout) {
		t.Fatalf("Drain on a stalled timeline: %v, want ErrTimeout", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Drain with a 50ms timeout took %v", took)
	}
	if s := da.Stats(); s.Pending != 1 {
		t.Fatalf("Drain released memory the timeline had not passed: %+v", s)
	}
	if err := b.StreamSynchronize(d0.Stream); err != nil {
		t.Fatal(err)
	}
	b.StallTimeline(false)
	if _, err := tl.Signal(d0.Stream); err != nil {
		t.Fatal(err)
	}
	if err := da.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := da.Stats(); s.Pending != 0 || s.Released != 4 {
		t.Fatalf("stats after recovery: %+v", s)
	}
}

// TestAllocatorReleaseFailureRetried: a release that fails stays queued and
// the next Poll finishes it.
func TestAllocatorReleaseFailureRetried(t *testing.T) {
	b := simtest.New(t, 1)
	d0 := simtest.OpenDev(t, b, 0)
	tl := simtest.Timeline(t, b, 0)
	da, err := retire.NewAllocator(b, tl, retire.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := da.Alloc(0, gran, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := signal(t, tl, d0.Stream)
	if err := tl.Wait(context.Background(), p, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// Free polls (Queue.Retire) and p has passed: the release runs in Free.
	b.InjectFault("MemUnmap", 0, nil)
	if err := da.Free(a, p); !errors.Is(err, gpu.ErrInjected) {
		t.Fatalf("Free past its point with the unmap failing: %v", err)
	}
	if n, err := da.Poll(); n != 1 || err != nil {
		t.Fatalf("Poll retrying the failed release: released %d, %v", n, err)
	}
	if s := da.Stats(); s.Pending != 0 || s.Released != 1 || s.ReleasedBytes != gran {
		t.Fatalf("stats after the retry: %+v", s)
	}

	// A failure in Poll itself: the release stays pending and the next
	// Poll finishes it.
	a, err = da.Alloc(0, gran, nil)
	if err != nil {
		t.Fatal(err)
	}
	gf, openGate := simtest.HeldGate(t, b, 0)
	if err := b.LaunchKernel(gf, gpu.Linear(1, 1), nil, d0.Stream); err != nil {
		t.Fatal(err)
	}
	p = signal(t, tl, d0.Stream)
	if err := da.Free(a, p); err != nil {
		t.Fatal(err)
	}
	openGate()
	if err := tl.Wait(context.Background(), p, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	b.InjectFault("MemUnmap", 0, nil)
	if n, err := da.Poll(); n != 0 || !errors.Is(err, gpu.ErrInjected) {
		t.Fatalf("Poll with the unmap failing: released %d, %v", n, err)
	}
	if s := da.Stats(); s.Pending != 1 {
		t.Fatalf("a failed release left the queue: %+v", s)
	}
	if n, err := da.Poll(); n != 1 || err != nil {
		t.Fatalf("retried Poll: released %d, %v", n, err)
	}
}

// signal enqueues tl's next point on s and returns it.
func signal(t *testing.T, tl *vmm.Timeline, s gpu.Stream) uint64 {
	t.Helper()
	p, err := tl.Signal(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
