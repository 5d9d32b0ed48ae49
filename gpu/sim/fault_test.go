package sim

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

// poolSlot builds what the pool strategy builds per slot: a chunk mapped
// into a reservation, accessible from dev, a timeline, a captured graph and
// its exec. On any error it releases everything it created, as the vmm
// layer must.
type poolSlot struct {
	h    gpu.PhysMem
	r    gpu.DevicePtr
	tl   gpu.HostMem
	s    gpu.Stream
	g    gpu.Graph
	x    gpu.GraphExec
	mod  gpu.Module
	size uint64
}

func buildSlot(b *Backend, dev int) (_ *poolSlot, err error) {
	sl := &poolSlot{size: 2 * Granularity}
	var undo []func() error
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				err = errors.Join(err, undo[i]())
			}
		}
	}()
	if sl.h, err = b.MemCreate(dev, sl.size); err != nil {
		return nil, err
	}
	undo = append(undo, func() error { return b.MemRelease(sl.h) })
	if sl.r, err = b.MemAddressReserve(sl.size, 0); err != nil {
		return nil, err
	}
	undo = append(undo, func() error { return b.MemAddressFree(sl.r, sl.size) })
	if err = b.MemMap(sl.r, sl.size, 0, sl.h); err != nil {
		return nil, err
	}
	undo = append(undo, func() error { return b.MemUnmap(sl.r, sl.size) })
	if err = b.MemSetAccess(sl.r, sl.size, []int{dev}); err != nil {
		return nil, err
	}
	if sl.tl, err = b.HostAlloc(8); err != nil {
		return nil, err
	}
	undo = append(undo, func() error { return b.HostFree(sl.tl.Handle) })
	if sl.mod, err = b.ModuleLoad(dev, kernels.Module()); err != nil {
		return nil, err
	}
	undo = append(undo, func() error { return b.ModuleUnload(sl.mod) })
	fill, err := b.ModuleFunction(sl.mod, kernels.Fill)
	if err != nil {
		return nil, err
	}
	if sl.s, err = b.StreamCreate(dev, gpu.StreamNonBlocking, 0); err != nil {
		return nil, err
	}
	undo = append(undo, func() error { return b.StreamDestroy(sl.s) })
	if err = b.StreamBeginCapture(sl.s); err != nil {
		return nil, err
	}
	captured := func() error {
		if err := b.LaunchKernel(fill, kernels.Elementwise(64), fillArgs(sl.r, 1, 64), sl.s); err != nil {
			return err
		}
		return b.StreamWriteValue64(sl.s, sl.tl.Ptr, 1)
	}()
	sl.g, err = b.StreamEndCapture(sl.s)
	if err = errors.Join(captured, err); err != nil {
		if sl.g != 0 {
			err = errors.Join(err, b.GraphDestroy(sl.g))
		}
		return nil, err
	}
	undo = append(undo, func() error { return b.GraphDestroy(sl.g) })
	if sl.x, err = b.GraphInstantiate(sl.g); err != nil {
		return nil, err
	}
	undo = append(undo, func() error { return b.GraphExecDestroy(sl.x) })
	if err = b.GraphLaunch(sl.x, sl.s); err != nil {
		return nil, err
	}
	if err = b.StreamSynchronize(sl.s); err != nil {
		return nil, err
	}
	return sl, nil
}

func (sl *poolSlot) close(b *Backend) error {
	return errors.Join(b.GraphExecDestroy(sl.x), b.GraphDestroy(sl.g), b.StreamDestroy(sl.s), b.ModuleUnload(sl.mod),
		b.HostFree(sl.tl.Handle), b.MemUnmap(sl.r, sl.size), b.MemAddressFree(sl.r, sl.size), b.MemRelease(sl.h))
}

// TestFaultInjectionSweep fails call N of each entry point the slot
// construction uses, for N = 0, 1, ... until it succeeds, and checks that
// every failure is reported and releases everything.
func TestFaultInjectionSweep(t *testing.T) {
	b := newSim(t, Config{})
	ops := []string{"MemCreate", "MemAddressReserve", "MemMap", "MemSetAccess", "HostAlloc", "ModuleLoad",
		"ModuleFunction", "StreamCreate", "StreamBeginCapture", "LaunchKernel", "StreamWriteValue64",
		"StreamEndCapture", "GraphInstantiate", "GraphLaunch", "StreamSynchronize"}
	runs := 0
	for _, op := range ops {
		for n := 0; ; n++ {
			if n > 10 {
				t.Fatalf("%s: still failing after %d calls", op, n)
			}
			before := b.Calls(op)
			b.InjectFault(op, n, gpu.ErrOutOfMemory)
			sl, err := buildSlot(b, 0)
			runs++
			if b.Calls(op) <= before {
				t.Fatalf("%s was not called", op)
			}
			if c := b.LiveHandles(); err != nil && !c.IsZero() {
				t.Fatalf("%s call %d failed (%v) and leaked %s", op, n, err, c)
			}
			if err == nil {
				b.ClearFaults()
				if sl.tl.Load64(0) != 1 {
					t.Fatalf("slot built with %s injection at %d did not run", op, n)
				}
				must(t, sl.close(b))
				break
			}
			if !errors.Is(err, gpu.ErrInjected) || !errors.Is(err, gpu.ErrOutOfMemory) {
				t.Fatalf("%s call %d: error %v is not the injected one", op, n, err)
			}
			if !strings.Contains(err.Error(), op) {
				t.Fatalf("injected error %q does not name %s", err, op)
			}
		}
	}
	t.Logf("%d slot constructions", runs)
}

func TestInjectFaultIsOneShotAndCounted(t *testing.T) {
	b := newSim(t, Config{})
	b.InjectFault("MemAlloc", 1, nil)
	p, err := b.MemAlloc(0, 8)
	must(t, err)
	_, err = b.MemAlloc(0, 8)
	wantErr(t, err, gpu.ErrInjected)
	var ge *gpu.Error
	if !errors.As(err, &ge) || ge.Op != "MemAlloc" {
		t.Fatalf("injected error %#v", err)
	}
	q, err := b.MemAlloc(0, 8)
	must(t, err)
	if got := b.Calls("MemAlloc"); got != 3 {
		t.Fatalf("Calls = %d, want 3", got)
	}
	must(t, b.MemFree(p))
	must(t, b.MemFree(q))
	b.InjectFault("Close", 0, nil)
	b.InjectFault("NoSuchEntryPoint", 0, nil) // logs, never fires
	wantErr(t, b.Close(), gpu.ErrInjected)    // Close failed: still open
	if b.DeviceCount() != 1 {
		t.Fatal("backend closed by a failed Close")
	}
}

func TestCloseReportsLeaksAndStopsGoroutines(t *testing.T) {
	base := runtime.NumGoroutine()
	b, err := New(Config{Devices: 2})
	must(t, err)
	k, err := b.ModuleLoad(0, kernels.Module())
	must(t, err)
	fill, _ := b.ModuleFunction(k, kernels.Fill)
	var ss []gpu.Stream
	for range 4 {
		s, err := b.StreamCreate(0, 0, 0)
		must(t, err)
		ss = append(ss, s)
	}
	p, err := b.MemAlloc(0, 4096)
	must(t, err)
	_, err = b.HostAlloc(64)
	must(t, err)
	e, _ := b.EventCreate(0, 0)
	must(t, b.EventRecord(e, ss[0]))
	for range 100 {
		must(t, b.LaunchKernel(fill, kernels.Elementwise(1024), fillArgs(p, 1, 1024), ss[1]))
	}
	// A stream waiting on another blocked stream must be released too.
	gt := &gate{open: make(chan struct{}), entry: make(chan struct{}, 1)}
	gm, err := b.ModuleLoad(0, &gpu.ModuleImage{Name: "gate", Kernels: []gpu.KernelSpec{{Name: "gate",
		Ref: func(gpu.Memory, gpu.LaunchConfig, []gpu.Arg) error { gt.entry <- struct{}{}; <-gt.open; return nil }}}})
	must(t, err)
	gf, _ := b.ModuleFunction(gm, "gate")
	must(t, b.LaunchKernel(gf, gpu.Linear(1, 1), nil, ss[2]))
	e2, _ := b.EventCreate(0, 0)
	must(t, b.EventRecord(e2, ss[2]))
	must(t, b.StreamWaitEvent(ss[3], e2))
	<-gt.entry
	go func() { time.Sleep(10 * time.Millisecond); close(gt.open) }()

	err = b.Close()
	wantErr(t, err, gpu.ErrIllegalState)
	for _, s := range []string{"streams=4", "events=2", "allocations=1", "host-allocs=1", "modules=2"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("Close error %q does not report %s", err, s)
		}
	}
	if c := b.LiveHandles(); !c.IsZero() {
		t.Fatalf("live after Close: %s", c)
	}
	// Every call after Close fails cleanly.
	wantErr(t, b.LaunchKernel(fill, kernels.Elementwise(1), fillArgs(p, 1, 1), ss[0]), gpu.ErrInvalidHandle)
	_, err = b.MemAlloc(0, 8)
	wantErr(t, err, gpu.ErrInvalidHandle)
	_, err = b.StreamCreate(0, 0, 0)
	wantErr(t, err, gpu.ErrInvalidHandle)
	wantErr(t, b.MemcpyHtoD(p, []byte{1}), gpu.ErrInvalidHandle)
	wantErr(t, b.Close(), gpu.ErrInvalidHandle)
	if b.DeviceCount() != 0 {
		t.Fatal("DeviceCount after Close")
	}
	// No goroutine outlives Close (allow the gate opener to finish).
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines after Close, %d before:\n%s", n, base, buf[:runtime.Stack(buf, true)])
	}
}

func TestCountersFollowEveryKind(t *testing.T) {
	b := newSim(t, Config{})
	c0 := b.LiveHandles()
	s := newStream(t, b, 0)
	_ = newEvent(t, b, 0, 0)
	_ = alloc(t, b, 0, 8)
	_ = newGraph(t, b, 0)
	_ = loadKernels(t, b, 0)
	_, _ = vmmMap(t, b, 0, Granularity)
	g := newGraph(t, b, 0)
	_ = instantiate(t, b, g)
	_ = s
	want := gpu.HandleCounts{Streams: 1, Events: 1, Allocations: 1, Chunks: 1, Reservations: 1, Mappings: 1, Modules: 1, Graphs: 2, GraphExecs: 1}
	if got := b.LiveHandles(); got != want || !c0.IsZero() {
		t.Fatalf("counters %s, want %s", got, want)
	}
}
