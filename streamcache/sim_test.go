package streamcache_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/streamcache"
)

// gatedSim is a sim backend whose StreamDestroy first opens a gate that
// holds a kernel in flight. The sim's StreamDestroy waits for queued work
// (CUDA's returns at once), so without this a Put of a busy stream would
// wait forever for a gate the test cannot open in time; with it, the
// query that precedes the destroy is sure to see the stream busy.
type gatedSim struct {
	*sim.Backend
	gate chan struct{}
	once sync.Once
}

func (g *gatedSim) StreamDestroy(s gpu.Stream) error {
	g.once.Do(func() { close(g.gate) })
	return g.Backend.StreamDestroy(s)
}

func newGatedSim(t *testing.T) (*gatedSim, gpu.Function, func()) {
	t.Helper()
	b, err := sim.New(sim.Config{Devices: 1, DeviceMemory: 1 << 28})
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedSim{Backend: b, gate: make(chan struct{})}
	img := &gpu.ModuleImage{Name: "gate", Kernels: []gpu.KernelSpec{{
		Name: "wait", Params: []gpu.ArgKind{gpu.ArgI32},
		Ref: func(gpu.Memory, gpu.LaunchConfig, []gpu.Arg) error { <-g.gate; return nil },
	}}}
	m, err := b.ModuleLoad(0, img)
	if err != nil {
		t.Fatal(err)
	}
	f, err := b.ModuleFunction(m, "wait")
	if err != nil {
		t.Fatal(err)
	}
	return g, f, func() {
		t.Helper()
		if err := b.ModuleUnload(m); err != nil {
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

func TestSimBusyStreamNotCached(t *testing.T) {
	g, wait, done := newGatedSim(t)
	defer done()
	c := streamcache.New(streamcache.Options{})
	k := streamcache.Key{Device: 0}
	s, err := c.Get(g, k)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.LaunchKernel(wait, gpu.Linear(1, 1), []gpu.Arg{gpu.I32(0)}, s); err != nil {
		t.Fatal(err)
	}
	if err := c.Put(g, k, s, nil); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.DiscardedBusy != 1 || st.Idle != 0 {
		t.Fatalf("a stream returned while busy was cached: %+v", st)
	}
	if err := c.Purge(g); err != nil {
		t.Fatal(err)
	}
}

func TestSimFaultedStreamNotCached(t *testing.T) {
	b, err := sim.New(sim.Config{Devices: 1, DeviceMemory: 1 << 28})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	m, err := b.ModuleLoad(0, kernels.Module())
	if err != nil {
		t.Fatal(err)
	}
	fill, _ := b.ModuleFunction(m, kernels.Fill)
	c := streamcache.New(streamcache.Options{})
	k := streamcache.Key{Device: 0, Flags: gpu.StreamNonBlocking}
	healthy, err := c.Get(b, k)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Put(b, k, healthy, nil); err != nil {
		t.Fatal(err)
	}
	s, err := c.Get(b, k)
	if err != nil || s != healthy {
		t.Fatalf("Get = %d, %v; want the cached %d", s, err, healthy)
	}
	x, _ := b.MemAlloc(0, 1024)
	if err := b.MemFree(x); err != nil {
		t.Fatal(err)
	}
	if err := b.LaunchKernel(fill, kernels.Elementwise(256), []gpu.Arg{gpu.Ptr(x), gpu.F32(1), gpu.I32(256)}, s); err != nil {
		t.Fatal(err)
	}
	if err := b.StreamSynchronize(s); !errors.Is(err, gpu.ErrIllegalAddress) {
		t.Fatalf("kernel on freed memory: %v", err)
	}
	// The caller forgets to report the fault: the query on Put catches it.
	if err := c.Put(b, k, s, nil); !errors.Is(err, gpu.ErrIllegalAddress) {
		t.Fatalf("Put of a faulted stream = %v, want the fault", err)
	}
	if err := b.ResetDevice(0); err != nil {
		t.Fatal(err)
	}
	s2, err := c.Get(b, k)
	if err != nil {
		t.Fatal(err)
	}
	if s2 == s {
		t.Fatal("a stream that failed was handed out again")
	}
	if st := c.Stats(); st.DiscardedFailed != 1 || st.Hits != 1 || st.Misses != 2 {
		t.Fatalf("stats %+v", st)
	}
	if err := c.Put(b, k, s2, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Purge(b); err != nil {
		t.Fatal(err)
	}
	if err := b.ModuleUnload(m); err != nil {
		t.Fatal(err)
	}
	if live := b.LiveHandles(); !live.IsZero() {
		t.Fatalf("handles left live: %v", live)
	}
}
