package cuda

// Tests that need a GPU; each skips with the reason where there is none.

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
	"github.com/stablegraph/stablegraph/kernels"
)

// TestContextFromAnyThread makes calls from goroutines locked to threads
// whose current context was cleared: every call must make its handle's
// context current itself, including queries and destruction of handles
// created elsewhere.
func TestContextFromAnyThread(t *testing.T) {
	b := openOrSkip(t, Config{})
	closeClean(t, b)
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	const n = 1 << 12
	p, err := b.MemAlloc(0, 4*n)
	if err != nil {
		t.Fatal(err)
	}
	events := make([]gpu.Event, 8)
	for i := range events {
		if events[i], err = b.EventCreate(0, gpu.EventDisableTiming); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range events {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if r := b.d.CtxSetCurrent(0); r != cu.Success { // no context on this thread
				errs <- fmt.Errorf("cuCtxSetCurrent(NULL): %v", r)
				return
			}
			steps := []func() error{
				func() error { return b.MemsetAsync(gpu.Memset{Dst: p, Value: uint32(i), ElemSize: 4, Count: n}, s) },
				func() error { return b.EventRecord(events[i], s) },
				func() error { return b.EventSynchronize(events[i]) },
				func() error { _, err := b.StreamQuery(s); return err },
				func() error { _, _, err := b.MemGetInfo(0); return err },
				func() error { return b.EventDestroy(events[i]) }, // made on another goroutine
			}
			for j, f := range steps {
				if r := b.d.CtxSetCurrent(0); r != cu.Success {
					errs <- fmt.Errorf("cuCtxSetCurrent(NULL): %v", r)
					return
				}
				if err := f(); err != nil {
					errs <- fmt.Errorf("goroutine %d step %d: %w", i, j, err)
					return
				}
				var cur cu.Context
				if b.d.CtxGetCurrent(&cur); cur != b.devs[0].ctx {
					errs <- fmt.Errorf("goroutine %d step %d: context %#x current after the call, want device 0's %#x", i, j, cur, b.devs[0].ctx)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Destruction from yet another goroutine.
	done := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		b.d.CtxSetCurrent(0)
		if err := b.StreamSynchronize(s); err != nil {
			done <- err
			return
		}
		if err := b.MemFree(p); err != nil {
			done <- err
			return
		}
		done <- b.StreamDestroy(s)
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestCapturedOwnKernelIsTyped: a captured launch of one of our kernels
// reads back with typed arguments (its spec is known).
func TestCapturedOwnKernelIsTyped(t *testing.T) {
	b := openOrSkip(t, Config{})
	closeClean(t, b)
	m, err := b.ModuleLoad(0, kernels.Module())
	if err != nil {
		t.Fatal(err)
	}
	defer b.ModuleUnload(m)
	f, err := b.ModuleFunction(m, kernels.Axpb)
	if err != nil {
		t.Fatal(err)
	}
	const n = 1000
	y, err := b.MemAlloc(0, 4*n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.MemFree(y)
	s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.StreamDestroy(s)
	args := []gpu.Arg{gpu.Ptr(y), gpu.Ptr(y), gpu.F32(2), gpu.F32(3), gpu.I32(n)}
	if err := b.StreamBeginCapture(s); err != nil {
		t.Fatal(err)
	}
	if err := b.LaunchKernel(f, kernels.Elementwise(n), args, s); err != nil {
		t.Fatal(err)
	}
	g, err := b.StreamEndCapture(s)
	if err != nil {
		t.Fatal(err)
	}
	defer b.GraphDestroy(g)
	nodes, err := b.GraphNodes(g)
	if err != nil || len(nodes) != 1 {
		t.Fatalf("GraphNodes = %v, %v", nodes, err)
	}
	kp, err := b.GraphKernelNodeParams(nodes[0])
	if err != nil {
		t.Fatal(err)
	}
	if kp.Func != f || len(kp.Args) != len(args) {
		t.Fatalf("params %+v, want function %#x and %d args", kp, f, len(args))
	}
	for i := range args {
		if kp.Args[i].Kind != args[i].Kind || kp.Args[i].Bits != args[i].Bits {
			t.Errorf("arg %d = %v, want %v", i, kp.Args[i], args[i])
		}
	}
}
