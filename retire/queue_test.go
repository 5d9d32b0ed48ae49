package retire

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/vmm"
)

// manualTimeline is a Timeline the test advances by hand. Wait advances it
// to the point waited for when autoAdvance is set (a GPU that finishes on
// demand), and otherwise waits with the package's wait policy.
type manualTimeline struct {
	completed   atomic.Uint64
	autoAdvance bool
	waits       []uint64 // points waited for
	mu          sync.Mutex
}

func (m *manualTimeline) Completed() uint64 { return m.completed.Load() }

func (m *manualTimeline) Wait(ctx context.Context, point uint64, deadline time.Duration) error {
	m.mu.Lock()
	m.waits = append(m.waits, point)
	m.mu.Unlock()
	for m.autoAdvance {
		c := m.completed.Load()
		if c >= point || m.completed.CompareAndSwap(c, point) {
			break
		}
	}
	_, err := vmm.DefaultWaitPolicy().Poll(ctx, time.Now().Add(deadline), func() bool { return m.Completed() >= point }, nil)
	return err
}

func (m *manualTimeline) waited() []uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]uint64(nil), m.waits...)
}

// tracker records which buffers were released.
type tracker struct {
	mu       sync.Mutex
	released []string
}

func (tr *tracker) item(name string, bytes uint64) Item {
	return Item{Bytes: bytes, Release: func() error {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		tr.released = append(tr.released, name)
		return nil
	}}
}

func (tr *tracker) got() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.released...)
}

func equal(a, b []string) bool { return fmt.Sprint(a) == fmt.Sprint(b) }

func TestQueuePollReleasesPassedBatchesOnly(t *testing.T) {
	tl := &manualTimeline{}
	q := NewQueue(tl, Options{MaxPending: 10})
	var tr tracker
	ctx := context.Background()
	for p := uint64(1); p <= 3; p++ {
		if err := q.Retire(ctx, Batch{tr.item(fmt.Sprint("b", p), 100)}, p); err != nil {
			t.Fatal(err)
		}
	}
	if got := tr.got(); len(got) != 0 {
		t.Fatalf("released %v before the timeline moved", got)
	}
	tl.completed.Store(2)
	if got := tr.got(); len(got) != 0 {
		t.Fatalf("released %v without a poll", got)
	}
	if err := q.Poll(); err != nil {
		t.Fatal(err)
	}
	if got := tr.got(); !equal(got, []string{"b1", "b2"}) {
		t.Fatalf("after completed=2 and one poll released %v, want [b1 b2]", got)
	}
	st := q.Stats()
	if st.PendingBatches != 1 || st.PendingBytes != 100 || st.PeakPendingBytes != 300 || st.ReleasedByPoll != 2 {
		t.Fatalf("stats %+v", st)
	}
	if len(tl.waited()) != 0 {
		t.Fatalf("queue waited %v below its bound", tl.waited())
	}
}

func TestQueuePointZeroReleasedAtOnce(t *testing.T) {
	q := NewQueue(&manualTimeline{}, Options{})
	var tr tracker
	if err := q.Retire(context.Background(), Batch{tr.item("a", 8)}, 0); err != nil {
		t.Fatal(err)
	}
	if got := tr.got(); !equal(got, []string{"a"}) {
		t.Fatalf("released %v", got)
	}
	if st := q.Stats(); st.PendingBatches != 0 || st.PendingBytes != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestQueueBoundWaitsForOldestOnly(t *testing.T) {
	tl := &manualTimeline{autoAdvance: true}
	q := NewQueue(tl, Options{}) // MaxPending 3
	if got := q.Options().MaxPending; got != DefaultMaxPending {
		t.Fatalf("default MaxPending %d", got)
	}
	var tr tracker
	ctx := context.Background()
	for p := uint64(1); p <= 3; p++ {
		if err := q.Retire(ctx, Batch{tr.item(fmt.Sprint("b", p), 10)}, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Retire(ctx, Batch{tr.item("b4", 10)}, 4); err != nil {
		t.Fatal(err)
	}
	if w := tl.waited(); fmt.Sprint(w) != "[1]" {
		t.Fatalf("waited for %v, want the oldest point only [1]", w)
	}
	if got := tr.got(); !equal(got, []string{"b1"}) {
		t.Fatalf("released %v, want [b1]", got)
	}
	st := q.Stats()
	if st.PendingBatches != 3 || st.PeakPendingBytes != 30 || st.ReleasedByWait != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestQueueWaitTimeoutKeepsBatches(t *testing.T) {
	tl := &manualTimeline{} // never advances: a hung GPU
	q := NewQueue(tl, Options{MaxPending: 1, WaitDeadline: 5 * time.Millisecond})
	var tr tracker
	ctx := context.Background()
	if err := q.Retire(ctx, Batch{tr.item("a", 1)}, 1); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := q.Retire(ctx, Batch{tr.item("b", 1)}, 2)
	if !errors.Is(err, gpu.ErrTimeout) {
		t.Fatalf("Retire past the bound on a hung timeline: %v, want ErrTimeout", err)
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("wait took %v with a 5ms deadline", el)
	}
	if got := tr.got(); len(got) != 0 {
		t.Fatalf("released %v although the timeline never moved", got)
	}
	if st := q.Stats(); st.PendingBatches != 2 {
		t.Fatalf("the batch was not kept: %+v", st)
	}
	if err := q.Drain(ctx); !errors.Is(err, gpu.ErrTimeout) {
		t.Fatalf("Drain on a hung timeline: %v", err)
	}
	tl.completed.Store(2)
	if err := q.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if got := tr.got(); !equal(got, []string{"a", "b"}) {
		t.Fatalf("released %v", got)
	}
	if st := q.Stats(); st.ReleasedByDrain != 2 || st.PendingBytes != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestQueueWaitHonoursContext(t *testing.T) {
	q := NewQueue(&manualTimeline{}, Options{MaxPending: 1})
	ctx, cancel := context.WithCancel(context.Background())
	if err := q.Retire(ctx, Batch{{Bytes: 1}}, 1); err != nil {
		t.Fatal(err)
	}
	go func() { time.Sleep(2 * time.Millisecond); cancel() }()
	if err := q.Retire(ctx, Batch{{Bytes: 1}}, 2); !errors.Is(err, context.Canceled) {
		t.Fatalf("Retire with a cancelled context: %v", err)
	}
}

func TestQueueReleaseErrorsAreReturned(t *testing.T) {
	tl := &manualTimeline{}
	q := NewQueue(tl, Options{})
	boom1, boom2 := errors.New("boom1"), errors.New("boom2")
	b := Batch{
		{Bytes: 4, Release: func() error { return boom1 }},
		{Bytes: 4, Release: func() error { return nil }},
		{Bytes: 4, Release: func() error { return boom2 }},
	}
	if err := q.Retire(context.Background(), b, 1); err != nil {
		t.Fatal(err)
	}
	tl.completed.Store(1)
	err := q.Poll()
	if !errors.Is(err, boom1) || !errors.Is(err, boom2) {
		t.Fatalf("Poll = %v, want both release errors", err)
	}
	if st := q.Stats(); st.ReleaseErrors != 2 || st.PendingBytes != 0 || st.ReleasedByPoll != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestQueueOutOfOrderPointsAndDrainThrough(t *testing.T) {
	tl := &manualTimeline{}
	q := NewQueue(tl, Options{MaxPending: 10})
	var tr tracker
	ctx := context.Background()
	for _, p := range []uint64{5, 2, 7, 3} {
		if err := q.Retire(ctx, Batch{tr.item(fmt.Sprint("p", p), 1)}, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.DrainThrough(5); err != nil {
		t.Fatal(err)
	}
	if got := tr.got(); !equal(got, []string{"p2", "p3", "p5"}) {
		t.Fatalf("released %v, want points up to 5 in order", got)
	}
	if err := q.ReleaseAll(); err != nil {
		t.Fatal(err)
	}
	st := q.Stats()
	if st.ReleasedByDrain != 3 || st.ReleasedForced != 1 || st.PendingBatches != 0 || st.Released() != 4 {
		t.Fatalf("stats %+v", st)
	}
}

func TestQueueConcurrent(t *testing.T) {
	tl := &manualTimeline{autoAdvance: true}
	q := NewQueue(tl, Options{})
	var released atomic.Int64
	var wg sync.WaitGroup
	var point atomic.Uint64
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				p := point.Add(1)
				err := q.Retire(context.Background(), Batch{{Bytes: 1, Release: func() error { released.Add(1); return nil }}}, p)
				if err != nil {
					t.Error(err)
					return
				}
				if i%7 == 0 {
					if err := q.Poll(); err != nil {
						t.Error(err)
					}
				}
			}
		}()
	}
	wg.Wait()
	if err := q.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := q.Stats()
	if released.Load() != 800 || st.Released() != 800 || st.PendingBytes != 0 {
		t.Fatalf("released %d, stats %+v", released.Load(), st)
	}
	if st.PeakPendingBytes > 3 {
		t.Fatalf("peak pending %d bytes exceeds MaxPending batches of 1 byte", st.PeakPendingBytes)
	}
}

// TestQueueOverTimeline runs a queue over a real timeline: a batch is
// not released while the kernel that used it is gated, and is released by
// the first poll once the timeline passed it.
func TestQueueOverTimeline(t *testing.T) {
	b := simtest.New(t, 1)
	s := simtest.Stream(t, b, 0)
	tl := simtest.Timeline(t, b, 0)
	if err := tl.Bind(s); err != nil {
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
	q := NewQueue(tl, Options{})
	freed := false
	if err := q.Retire(context.Background(), Batch{{Bytes: 64, Release: func() error {
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
