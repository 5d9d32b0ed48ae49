package sim

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

func TestStreamsAreAsynchronousAndOrdered(t *testing.T) {
	b := newSim(t, Config{})
	k := loadKernels(t, b, 0)
	g := newGate(t, b, 0)
	s := newStream(t, b, 0)
	start, end := newEvent(t, b, 0, gpu.EventDefault), newEvent(t, b, 0, gpu.EventDefault)
	const n = 256
	x, y := alloc(t, b, 0, 4*n), alloc(t, b, 0, 4*n)

	must(t, b.EventRecord(start, s))
	g.launch(t, b, s)
	<-g.entry // the stream is now blocked inside the gate kernel
	must(t, b.LaunchKernel(k.fn(t, kernels.Fill), kernels.Elementwise(n), fillArgs(x, 2, n), s))
	must(t, b.LaunchKernel(k.fn(t, kernels.Axpb), kernels.Elementwise(n),
		[]gpu.Arg{gpu.Ptr(y), gpu.Ptr(x), gpu.F32(3), gpu.F32(1), gpu.I32(n)}, s))
	out := make([]byte, 4*n)
	must(t, b.MemcpyDtoHAsync(out, y, s))
	must(t, b.EventRecord(end, s))

	// Nothing after the gate has run.
	if idle, err := b.StreamQuery(s); idle || err != nil {
		t.Fatalf("StreamQuery = %v, %v while blocked", idle, err)
	}
	if done, err := b.EventQuery(end); done || err != nil {
		t.Fatalf("EventQuery = %v, %v while blocked", done, err)
	}
	_, err := b.EventElapsed(start, end)
	wantErr(t, err, gpu.ErrNotReady)
	wantAll(t, gpu.BytesToF32(out), 0)

	time.Sleep(2 * time.Millisecond)
	g.release()
	must(t, b.EventSynchronize(end))
	wantAll(t, gpu.BytesToF32(out), 7) // 3*2+1, in order
	d, err := b.EventElapsed(start, end)
	must(t, err)
	if d < 2*time.Millisecond {
		t.Fatalf("elapsed %v, want at least the 2ms the gate was held", d)
	}
	if idle, err := b.StreamQuery(s); !idle || err != nil {
		t.Fatalf("StreamQuery = %v, %v after completion", idle, err)
	}
}

func TestStreamWaitEventOrdersAcrossStreamsAndDevices(t *testing.T) {
	b := newSim(t, Config{Devices: 2})
	k0 := loadKernels(t, b, 0)
	g := newGate(t, b, 0)
	s0, s1 := newStream(t, b, 0), newStream(t, b, 1)
	e := newEvent(t, b, 0, gpu.EventDisableTiming)
	h, err := b.HostAlloc(4 * 64)
	must(t, err)
	defer func() { must(t, b.HostFree(h.Handle)) }()

	// s0: gate, then fill host memory; s1 (another device) waits and
	// writes a timeline value after it.
	g.launch(t, b, s0)
	must(t, b.LaunchKernel(k0.fn(t, kernels.Fill), kernels.Elementwise(64), fillArgs(h.Ptr, 5, 64), s0))
	must(t, b.EventRecord(e, s0))
	must(t, b.StreamWaitEvent(s1, e))
	must(t, b.StreamWriteValue64(s1, h.Ptr, 99))
	time.Sleep(time.Millisecond)
	if idle, _ := b.StreamQuery(s1); idle {
		t.Fatal("s1 ran past its wait while s0 was blocked")
	}
	g.release()
	must(t, b.StreamSynchronize(s1))
	if v := h.Load64(0); v != 99 {
		t.Fatalf("timeline %d", v)
	}
	wantAll(t, gpu.BytesToF32(h.Bytes[8:]), 5)

	// Timing disabled; records on another device's stream refused.
	_, err = b.EventElapsed(e, e)
	wantErr(t, err, gpu.ErrInvalidValue)
	wantErr(t, b.EventRecord(e, s1), gpu.ErrInvalidValue)
	never := newEvent(t, b, 0, gpu.EventDefault)
	_, err = b.EventElapsed(never, never)
	wantErr(t, err, gpu.ErrNotReady)
	if done, err := b.EventQuery(never); !done || err != nil {
		t.Fatalf("never-recorded EventQuery = %v, %v", done, err)
	}
	must(t, b.StreamWaitEvent(s1, never)) // no-op
	must(t, b.EventSynchronize(never))
}

func TestStreamDestroyWaitsForWork(t *testing.T) {
	b := newSim(t, Config{})
	k := loadKernels(t, b, 0)
	s, err := b.StreamCreate(0, 0, 10)
	must(t, err)
	p := alloc(t, b, 0, 4*1024)
	for i := range 50 {
		must(t, b.LaunchKernel(k.fn(t, kernels.Fill), kernels.Elementwise(1024), fillArgs(p, float32(i), 1024), s))
	}
	must(t, b.StreamDestroy(s))
	wantAll(t, readF32(t, b, p, 1024), 49)
	wantErr(t, b.StreamDestroy(s), gpu.ErrInvalidHandle)
	wantErr(t, b.StreamSynchronize(s), gpu.ErrInvalidHandle)
	least, greatest, err := b.StreamPriorityRange(0)
	if least != 0 || greatest != -5 || err != nil {
		t.Fatalf("priority range %d, %d, %v", least, greatest, err)
	}
	_, err = b.StreamCreate(0, 7, 0)
	wantErr(t, err, gpu.ErrInvalidValue)
}

func TestKernelErrorIsStickyLaunchKernelError(t *testing.T) {
	b := newSim(t, Config{})
	k := loadKernels(t, b, 0)
	s := newStream(t, b, 0)
	p := alloc(t, b, 0, 4*1024)
	// A launch too small for its problem: the reference refuses it.
	must(t, b.LaunchKernel(k.fn(t, kernels.Fill), kernels.Elementwise(10), fillArgs(p, 1, 1024), s))
	err := b.StreamSynchronize(s)
	wantErr(t, err, gpu.ErrInvalidValue)
	if !slices.Contains(errorOps(err), "LaunchKernel") {
		t.Fatalf("error %v has no LaunchKernel *gpu.Error", err)
	}
	wantErr(t, b.LaunchKernel(k.fn(t, kernels.Fill), kernels.Elementwise(1024), fillArgs(p, 1, 1024), s), gpu.ErrInvalidValue)
	must(t, b.ResetDevice(0))

	// Argument checks happen at launch, naming the kernel.
	err = b.LaunchKernel(k.fn(t, kernels.Fill), kernels.Elementwise(4), []gpu.Arg{gpu.Ptr(p), gpu.I32(1), gpu.I32(4)}, s)
	wantErr(t, err, gpu.ErrInvalidValue)
	if want := kernels.Fill; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not name %s", err, want)
	}
	wantErr(t, b.LaunchKernel(k.fn(t, kernels.Fill), kernels.Elementwise(4), fillArgs(p, 1, 4)[:2], s), gpu.ErrInvalidValue)
	wantErr(t, b.LaunchKernel(k.fn(t, kernels.Fill), gpu.LaunchConfig{}, fillArgs(p, 1, 4), s), gpu.ErrInvalidValue)
	wantErr(t, b.LaunchKernel(k.fn(t, kernels.Fill), gpu.Linear(4, 2048), fillArgs(p, 1, 4), s), gpu.ErrInvalidValue)
}

func TestModules(t *testing.T) {
	b := newSim(t, Config{})
	_, err := b.ModuleLoad(0, &gpu.ModuleImage{Name: "x", Kernels: []gpu.KernelSpec{{Name: "noref", Params: []gpu.ArgKind{gpu.ArgPtr}}}})
	wantErr(t, err, gpu.ErrInvalidValue)
	_, err = b.ModuleLoad(0, nil)
	wantErr(t, err, gpu.ErrInvalidValue)

	nop := func(gpu.Memory, gpu.LaunchConfig, []gpu.Arg) error { return nil }
	m, err := b.ModuleLoad(0, &gpu.ModuleImage{Name: "layout", Kernels: []gpu.KernelSpec{{
		Name: "mixed", Ref: nop,
		Params: []gpu.ArgKind{gpu.ArgI32, gpu.ArgPtr, gpu.ArgF32, gpu.ArgF32, gpu.ArgU64, gpu.ArgI32},
	}}})
	must(t, err)
	f, err := b.ModuleFunction(m, "mixed")
	must(t, err)
	info, err := b.FuncParamInfo(f)
	must(t, err)
	var want []gpu.ParamInfo
	for _, oz := range [][2]uint64{{0, 4}, {8, 8}, {16, 4}, {20, 4}, {24, 8}, {32, 4}} {
		want = append(want, gpu.ParamInfo{Offset: oz[0], Size: oz[1]})
	}
	if fmt.Sprint(info) != fmt.Sprint(want) {
		t.Fatalf("param layout %v, want %v", info, want)
	}
	if name, err := b.FuncName(f); name != "mixed" || err != nil {
		t.Fatalf("FuncName = %q, %v", name, err)
	}
	_, err = b.ModuleFunction(m, "nope")
	wantErr(t, err, gpu.ErrNotFound)
	must(t, b.ModuleUnload(m))
	_, err = b.FuncName(f)
	wantErr(t, err, gpu.ErrInvalidHandle)
	wantErr(t, b.ModuleUnload(m), gpu.ErrInvalidHandle)
}

func TestInvalidHandles(t *testing.T) {
	b := newSim(t, Config{})
	for name, err := range map[string]error{
		"StreamSynchronize": b.StreamSynchronize(0),
		"StreamDestroy":     b.StreamDestroy(99999),
		"EventDestroy":      b.EventDestroy(0),
		"EventRecord":       b.EventRecord(1, 2),
		"MemRelease":        b.MemRelease(5),
		"HostFree":          b.HostFree(5),
		"ModuleUnload":      b.ModuleUnload(5),
		"GraphDestroy":      b.GraphDestroy(5),
		"GraphExecDestroy":  b.GraphExecDestroy(5),
		"GraphLaunch":       b.GraphLaunch(5, 6),
		"MemAddressFree":    b.MemAddressFree(Granularity, Granularity),
	} {
		if !strings.Contains(fmt.Sprint(err), name) {
			t.Errorf("%s: error %v does not name the entry point", name, err)
		}
		wantErr(t, err, gpu.ErrInvalidHandle)
	}
	// A handle of another kind is invalid too.
	s := newStream(t, b, 0)
	wantErr(t, b.EventDestroy(gpu.Event(s)), gpu.ErrInvalidHandle)
	_, err := b.GraphNodes(gpu.Graph(s))
	wantErr(t, err, gpu.ErrInvalidHandle)
}

func TestConcurrentLaunchesRaceClean(t *testing.T) {
	b := newSim(t, Config{Devices: 2})
	ks := []kern{loadKernels(t, b, 0), loadKernels(t, b, 1)}
	const workers, n, iters = 6, 512, 40
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		dev := w % 2
		s := newStream(t, b, dev)
		x, y := alloc(t, b, dev, 4*n), alloc(t, b, dev, 4*n)
		fill, axpy := ks[dev].fn(t, kernels.Fill), ks[dev].fn(t, kernels.Axpy)
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := func() error {
				if err := b.LaunchKernel(fill, kernels.Elementwise(n), fillArgs(y, 0, n), s); err != nil {
					return err
				}
				for i := range iters {
					if err := b.LaunchKernel(fill, kernels.Elementwise(n), fillArgs(x, float32(i), n), s); err != nil {
						return err
					}
					if err := b.LaunchKernel(axpy, kernels.Elementwise(n), []gpu.Arg{gpu.Ptr(y), gpu.Ptr(x), gpu.F32(1), gpu.I32(n)}, s); err != nil {
						return err
					}
					if i%10 == 0 {
						if _, err := b.StreamQuery(s); err != nil {
							return err
						}
						_ = b.LiveHandles()
					}
				}
				if err := b.StreamSynchronize(s); err != nil {
					return err
				}
				out := make([]byte, 4*n)
				if err := b.MemcpyDtoH(out, y); err != nil {
					return err
				}
				for _, v := range gpu.BytesToF32(out) {
					if v != iters*(iters-1)/2 {
						return fmt.Errorf("worker on device %d: got %v", dev, v)
					}
				}
				return nil
			}()
			errs <- err
		}()
	}
	// Meanwhile, churn the address space.
	for range 200 {
		p, err := b.MemAlloc(0, 1024)
		must(t, err)
		must(t, b.MemFree(p))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		must(t, err)
	}
}

// errorOps lists the Op of every *gpu.Error in err's chain.
func errorOps(err error) []string {
	var ops []string
	for err != nil {
		if ge, ok := err.(*gpu.Error); ok {
			ops = append(ops, ge.Op)
		}
		err = errors.Unwrap(err)
	}
	return ops
}

func TestPanickingKernelIsStickyDeviceLost(t *testing.T) {
	b := newSim(t, Config{})
	m, err := b.ModuleLoad(0, &gpu.ModuleImage{Name: "bad", Kernels: []gpu.KernelSpec{{
		Name: "boom", Params: []gpu.ArgKind{gpu.ArgI32},
		Ref: func(_ gpu.Memory, _ gpu.LaunchConfig, a []gpu.Arg) error {
			a[0] = gpu.I32(-1) // must not reach the stored launch
			var s []int
			_ = s[5]
			return nil
		},
	}}})
	must(t, err)
	defer func() { must(t, b.ModuleUnload(m)) }()
	f, _ := b.ModuleFunction(m, "boom")
	s := newStream(t, b, 0)
	must(t, b.LaunchKernel(f, gpu.Linear(1, 1), []gpu.Arg{gpu.I32(1)}, s))
	err = b.StreamSynchronize(s)
	wantErr(t, err, gpu.ErrDeviceLost)
	if !strings.Contains(err.Error(), "boom") {
		t.Fatalf("error %q does not name the kernel", err)
	}
	must(t, b.ResetDevice(0))
	must(t, b.StreamSynchronize(s))
}

func TestEventCompleteImpliesStreamPastIt(t *testing.T) {
	b := newSim(t, Config{})
	s := newStream(t, b, 0)
	e := newEvent(t, b, 0, gpu.EventDisableTiming)
	for i := range 2000 {
		must(t, b.EventRecord(e, s))
		must(t, b.EventSynchronize(e))
		if idle, err := b.StreamQuery(s); !idle || err != nil {
			t.Fatalf("iteration %d: StreamQuery = %v, %v right after the stream's last event completed", i, idle, err)
		}
	}
}
