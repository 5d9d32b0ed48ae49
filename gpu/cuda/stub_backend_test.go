package cuda

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
	"github.com/stablegraph/stablegraph/kernels"
)

// Tests of the backend's own logic over the stub driver (stub_test.go): no
// GPU needed. They pin down the behaviour of the hot paths: argument and
// handle checks before the driver is called, errors naming the call,
// context switching, live-handle counting, and the C view of arguments the
// driver receives.

// TestStubHotPathsRefuseBadHandles: every hot call refuses handles that are
// not live with ErrInvalidHandle naming the entry point, before the driver
// sees anything.
func TestStubHotPathsRefuseBadHandles(t *testing.T) {
	e := newOverheadEnv(t)
	b := e.b
	_, x, kn, mn := e.graph(t)
	ev := e.event(t, gpu.EventDefault)
	hm := e.hostMem(t)
	const bad = 0xdead_0000
	badFill := e.fill
	badFill.Func = bad
	e.sd.startCounting()
	for _, c := range []struct {
		op  string
		err error
	}{
		{"LaunchKernel", b.LaunchKernel(bad, e.fill.Config, e.fill.Args, e.s)},
		{"LaunchKernel", b.LaunchKernel(e.fill.Func, e.fill.Config, e.fill.Args, bad)},
		{"GraphExecKernelNodeSetParams", b.GraphExecKernelNodeSetParams(bad, kn, e.fill)},
		{"GraphExecKernelNodeSetParams", b.GraphExecKernelNodeSetParams(x, bad, e.fill)},
		{"GraphExecKernelNodeSetParams", b.GraphExecKernelNodeSetParams(x, kn, badFill)},
		{"GraphExecMemcpyNodeSetParams", b.GraphExecMemcpyNodeSetParams(bad, mn, gpu.MemcpyParams{Dst: e.p, Src: e.p, Size: 8})},
		{"GraphExecMemcpyNodeSetParams", b.GraphExecMemcpyNodeSetParams(x, bad, gpu.MemcpyParams{Dst: e.p, Src: e.p, Size: 8})},
		{"GraphAddKernelNode", func() error { _, err := b.GraphAddKernelNode(bad, nil, e.fill); return err }()},
		{"GraphAddKernelNode", func() error {
			g, _ := b.GraphCreate(0)
			defer b.GraphDestroy(g)
			_, err := b.GraphAddKernelNode(g, nil, badFill)
			return err
		}()},
		{"GraphAddKernelNode", func() error {
			g, _ := b.GraphCreate(0)
			defer b.GraphDestroy(g)
			_, err := b.GraphAddKernelNode(g, []gpu.GraphNode{bad}, e.fill)
			return err
		}()},
		{"GraphLaunch", b.GraphLaunch(bad, e.s)},
		{"GraphLaunch", b.GraphLaunch(x, bad)},
		{"StreamWriteValue64", b.StreamWriteValue64(bad, hm.Ptr, 1)},
		{"EventRecord", b.EventRecord(bad, e.s)},
		{"EventRecord", b.EventRecord(ev, bad)},
		{"MemcpyDtoDAsync", b.MemcpyDtoDAsync(e.p, e.p+8, 8, bad)},
	} {
		var ge *gpu.Error
		if !errors.Is(c.err, gpu.ErrInvalidHandle) || !errors.As(c.err, &ge) || ge.Op != c.op {
			t.Errorf("%s with a dead handle: %v, want ErrInvalidHandle from %s", c.op, c.err, c.op)
		}
	}
	for _, name := range []string{"cuLaunchKernel", "cuGraphExecKernelNodeSetParams_v2", "cuGraphExecMemcpyNodeSetParams",
		"cuGraphAddKernelNode_v2", "cuGraphLaunch", "cuStreamWriteValue64_v2", "cuEventRecord", "cuMemcpyDtoDAsync_v2"} {
		if n := e.sd.callCount(name); n != 0 {
			t.Errorf("%s reached the driver %d times with dead handles", name, n)
		}
	}
}

// TestStubArgumentChecks: wrong arguments, wrong node types and device
// mismatches are refused before the driver, naming the entry point.
func TestStubArgumentChecks(t *testing.T) {
	e := newOverheadEnv(t)
	b := e.b
	g, x, kn, mn := e.graph(t)
	e.sd.startCounting()
	wrongKind := e.fill
	wrongKind.Args = []gpu.Arg{gpu.Ptr(e.p), gpu.I32(1), gpu.I32(256)}
	short := e.fill
	short.Args = e.fill.Args[:2]
	for _, c := range []struct {
		op   string
		err  error
		want error
	}{
		{"LaunchKernel", b.LaunchKernel(e.fill.Func, e.fill.Config, wrongKind.Args, e.s), gpu.ErrInvalidValue},
		{"LaunchKernel", b.LaunchKernel(e.fill.Func, e.fill.Config, short.Args, e.s), gpu.ErrInvalidValue},
		{"GraphExecKernelNodeSetParams", b.GraphExecKernelNodeSetParams(x, kn, wrongKind), gpu.ErrInvalidValue},
		{"GraphExecKernelNodeSetParams", b.GraphExecKernelNodeSetParams(x, mn, e.fill), gpu.ErrInvalidValue}, // a memcpy node
		{"GraphExecMemcpyNodeSetParams", b.GraphExecMemcpyNodeSetParams(x, kn, gpu.MemcpyParams{Dst: e.p, Src: e.p, Size: 8}), gpu.ErrInvalidValue},
		{"GraphExecMemcpyNodeSetParams", b.GraphExecMemcpyNodeSetParams(x, mn, gpu.MemcpyParams{Dst: e.p, Src: e.p}), gpu.ErrInvalidValue},
		{"GraphAddKernelNode", func() error { _, err := b.GraphAddKernelNode(g, nil, short); return err }(), gpu.ErrInvalidValue},
		{"StreamWriteValue64", b.StreamWriteValue64(e.s, 0x1001, 1), gpu.ErrInvalidValue},
	} {
		var ge *gpu.Error
		if !errors.Is(c.err, c.want) || !errors.As(c.err, &ge) || ge.Op != c.op {
			t.Errorf("%s: %v, want %v from %s", c.op, c.err, c.want, c.op)
		}
	}
	// A node of another graph.
	g2, err := b.GraphCreate(0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.GraphDestroy(g2)
	other, err := b.GraphAddKernelNode(g2, nil, e.fill)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.GraphExecKernelNodeSetParams(x, other, e.fill); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("a node of another graph: %v", err)
	}
	if _, err := b.GraphAddKernelNode(g, []gpu.GraphNode{other}, e.fill); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("a dependency in another graph: %v", err)
	}
	for _, name := range []string{"cuLaunchKernel", "cuGraphExecKernelNodeSetParams_v2", "cuGraphExecMemcpyNodeSetParams"} {
		if n := e.sd.callCount(name); n != 0 {
			t.Errorf("%s reached the driver %d times with bad arguments", name, n)
		}
	}
}

// TestStubDriverErrors: a failing driver call is an error naming the C
// function, with its CUresult, wrapping the mapped sentinel; a failing
// context check names cuCtxGetCurrent.
func TestStubDriverErrors(t *testing.T) {
	e := newOverheadEnv(t)
	b := e.b
	_, x, kn, mn := e.graph(t)
	ev := e.event(t, gpu.EventDefault)
	calls := []struct {
		cname string
		call  func() error
	}{
		{"cuLaunchKernel", func() error { return b.LaunchKernel(e.fill.Func, e.fill.Config, e.fill.Args, e.s) }},
		{"cuGraphExecKernelNodeSetParams_v2", func() error { return b.GraphExecKernelNodeSetParams(x, kn, e.fill) }},
		{"cuGraphExecMemcpyNodeSetParams", func() error {
			return b.GraphExecMemcpyNodeSetParams(x, mn, gpu.MemcpyParams{Dst: e.p, Src: e.p + 64, Size: 8})
		}},
		{"cuGraphLaunch", func() error { return b.GraphLaunch(x, e.s) }},
		{"cuStreamWriteValue64_v2", func() error { return b.StreamWriteValue64(e.s, e.p, 1) }},
		{"cuEventRecord", func() error { return b.EventRecord(ev, e.s) }},
		{"cuMemcpyDtoDAsync_v2", func() error { return b.MemcpyDtoDAsync(e.p, e.p+64, 8, e.s) }},
	}
	for _, c := range calls {
		for _, failing := range []string{c.cname, "cuCtxGetCurrent"} {
			e.sd.fail = func(name string) cu.Result {
				if name == failing {
					return cu.ErrorInvalidHandle
				}
				return cu.Success
			}
			err := c.call()
			e.sd.fail = nil
			var ge *gpu.Error
			if !errors.Is(err, gpu.ErrInvalidHandle) || !errors.As(err, &ge) || ge.Op != failing ||
				ge.CodeName != "CUDA_ERROR_INVALID_HANDLE" || ge.Code != int(cu.ErrorInvalidHandle) {
				t.Errorf("%s failing under %s: %v", failing, c.cname, err)
			}
		}
		if err := c.call(); err != nil {
			t.Errorf("%s after the failure: %v", c.cname, err)
		}
	}
	// GraphAddKernelNode: a refused add issues no handle.
	g, err := b.GraphCreate(0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.GraphDestroy(g)
	e.sd.fail = func(name string) cu.Result {
		if name == "cuGraphAddKernelNode_v2" {
			return cu.ErrorOutOfMemory
		}
		return cu.Success
	}
	if _, err := b.GraphAddKernelNode(g, nil, e.fill); !errors.Is(err, gpu.ErrOutOfMemory) || !strings.HasPrefix(err.Error(), "cuGraphAddKernelNode_v2") {
		t.Errorf("failing cuGraphAddKernelNode_v2: %v", err)
	}
	e.sd.fail = nil
	if gi, _ := b.graphInfo("test", g); len(gi.nodes) != 0 {
		t.Errorf("a refused add left %d nodes in the graph's table", len(gi.nodes))
	}
}

// TestStubContextMadeCurrent: a call on a thread where another context is
// current makes the device's context current; one where it already is
// does not set it again.
func TestStubContextMadeCurrent(t *testing.T) {
	e := newOverheadEnv(t)
	ctx := e.b.devs[0].ctx
	e.sd.current.Store(0x1234)
	e.sd.startCounting()
	if err := e.b.LaunchKernel(e.fill.Func, e.fill.Config, e.fill.Args, e.s); err != nil {
		t.Fatal(err)
	}
	if got := cu.Context(e.sd.current.Load()); got != ctx {
		t.Errorf("context %#x current after the launch, want %#x", got, ctx)
	}
	if err := e.b.LaunchKernel(e.fill.Func, e.fill.Config, e.fill.Args, e.s); err != nil {
		t.Fatal(err)
	}
	if n := e.sd.callCount("cuCtxSetCurrent"); n != 1 {
		t.Errorf("cuCtxSetCurrent called %d times for two launches, want 1", n)
	}
	if n := e.sd.callCount("cuCtxGetCurrent"); n != 2 {
		t.Errorf("cuCtxGetCurrent called %d times for two launches, want 2", n)
	}
}

// TestStubKernelArgsReachDriver: the void** the driver receives, for
// launches and for node parameters, points at each argument's bytes,
// including byte arguments and argument lists longer than a frame holds.
func TestStubKernelArgsReachDriver(t *testing.T) {
	var mu sync.Mutex
	var got [][]byte
	sizes := []int{8, 4, 4}
	read := func(kp unsafe.Pointer) {
		ptrs := unsafe.Slice((*unsafe.Pointer)(kp), len(sizes))
		got = got[:0]
		for i, n := range sizes {
			got = append(got, append([]byte(nil), unsafe.Slice((*byte)(ptrs[i]), n)...))
		}
	}
	sd := newStubDriver()
	b2, err := openDriver(cu.NewStub("stub-args", func(name string, a cu.StubArgs) cu.Result {
		mu.Lock()
		defer mu.Unlock()
		switch name {
		case "cuLaunchKernel": // kernelParams is the tenth argument
			read(*(*unsafe.Pointer)(unsafe.Pointer(&a.A[9])))
		case "cuGraphExecKernelNodeSetParams_v2":
			kp := *(**cu.KernelNodeParams)(unsafe.Pointer(&a.A[2]))
			read(kp.KernelParams)
		}
		return sd.call(name, a)
	}), resolveOptions(Config{}))
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	m, err := b2.ModuleLoad(0, kernels.Module())
	if err != nil {
		t.Fatal(err)
	}
	defer b2.ModuleUnload(m)
	f, err := b2.ModuleFunction(m, kernels.Fill)
	if err != nil {
		t.Fatal(err)
	}
	s, err := b2.StreamCreate(0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.StreamDestroy(s)
	args := []gpu.Arg{gpu.Ptr(0x7f00_1234_5678), gpu.F32(-2.5), gpu.I32(-7)}
	want := [][]byte{{0x78, 0x56, 0x34, 0x12, 0x00, 0x7f, 0, 0}, {0, 0, 0x20, 0xc0}, {0xf9, 0xff, 0xff, 0xff}}
	check := func(what string) {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		for i := range want {
			if i >= len(got) || string(got[i]) != string(want[i]) {
				t.Errorf("%s: argument %d reached the driver as %x, want %x", what, i, got, want)
				return
			}
		}
	}
	cfg := kernels.Elementwise(1)
	if err := b2.LaunchKernel(f, cfg, args, s); err != nil {
		t.Fatal(err)
	}
	check("LaunchKernel")
	g, err := b2.GraphCreate(0)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.GraphDestroy(g)
	n, err := b2.GraphAddKernelNode(g, nil, gpu.KernelParams{Func: f, Config: cfg, Args: args})
	if err != nil {
		t.Fatal(err)
	}
	xx, err := b2.GraphInstantiate(g)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.GraphExecDestroy(xx)
	mu.Lock()
	got = nil
	mu.Unlock()
	if err := b2.GraphExecKernelNodeSetParams(xx, n, gpu.KernelParams{Func: f, Config: cfg, Args: args}); err != nil {
		t.Fatal(err)
	}
	check("GraphExecKernelNodeSetParams")
}

// TestFramePackOverflow: argument lists and byte arguments larger than a
// frame's inline arrays are packed into heap slices, correctly, and a
// released frame keeps none of them.
func TestFramePackOverflow(t *testing.T) {
	var args []gpu.Arg
	for i := range frameArgs + 5 {
		args = append(args, gpu.U64(uint64(i)*0x0101010101))
	}
	big := make([]byte, 8*frameWords+3)
	for i := range big {
		big[i] = byte(i)
	}
	args = append(args, gpu.Bytes(big), gpu.I32(-1))
	fr := packArgs(args)
	ptrs := unsafe.Slice(fr.params(), len(args))
	for i, a := range args {
		want := make([]byte, a.Size())
		a.Encode(want)
		if got := unsafe.Slice((*byte)(ptrs[i]), a.Size()); string(got) != string(want) {
			t.Errorf("argument %d packed as %x, want %x", i, got, want)
		}
		if uintptr(ptrs[i])%8 != 0 {
			t.Errorf("argument %d at %p, not 8-byte aligned", i, ptrs[i])
		}
	}
	fr.release()
	if fr.words != nil || fr.ptrs != nil || fr.deps != nil || fr.kp.KernelParams != nil {
		t.Error("a released frame still points at its arguments")
	}
	// Many arguments (heap words) but few enough for the inline pointer
	// array: released, the inline array must not keep the words alive.
	fr = packArgs([]gpu.Arg{gpu.Bytes(big), gpu.I32(1)})
	if len(fr.ptrs) != 2 || &fr.ptrs[0] != &fr.ptrBuf[0] {
		t.Fatal("two arguments did not use the inline pointer array")
	}
	fr.release()
	for i, p := range fr.ptrBuf {
		if p != nil && (uintptr(p) < uintptr(unsafe.Pointer(fr)) || uintptr(p) >= uintptr(unsafe.Pointer(fr))+unsafe.Sizeof(*fr)) {
			t.Errorf("released frame's pointer %d still points outside the frame", i)
		}
	}
}

// TestStubLiveHandles: creating and destroying on the hot-path-adjacent
// calls keeps the live-handle counters exact.
func TestStubLiveHandles(t *testing.T) {
	b, _ := newStubBackend(t)
	before := b.LiveHandles()
	var evs []gpu.Event
	for range 10 {
		ev, err := b.EventCreate(0, gpu.EventDisableTiming)
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	if c := b.LiveHandles(); c.Events != before.Events+10 {
		t.Errorf("%d live events after 10 creates", c.Events)
	}
	for _, ev := range evs {
		if err := b.EventDestroy(ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.EventDestroy(evs[0]); !errors.Is(err, gpu.ErrInvalidHandle) {
		t.Errorf("second EventDestroy: %v", err)
	}
	if c := b.LiveHandles(); c != before {
		t.Errorf("live handles %v after destroying all, want %v", c, before)
	}
}

// TestStubConcurrentHotPaths runs the hot calls from several goroutines at
// once (for the race detector: pooled frames, handle tables).
func TestStubConcurrentHotPaths(t *testing.T) {
	e := newOverheadEnv(t)
	b := e.b
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := b.GraphCreate(0)
			if err != nil {
				errs <- err
				return
			}
			defer b.GraphDestroy(g)
			var nodes []gpu.GraphNode
			for i := range 20 {
				var deps []gpu.GraphNode
				if i > 0 {
					deps = nodes[i-1:]
				}
				n, err := b.GraphAddKernelNode(g, deps, e.fill)
				if err != nil {
					errs <- err
					return
				}
				nodes = append(nodes, n)
			}
			x, err := b.GraphInstantiate(g)
			if err != nil {
				errs <- err
				return
			}
			defer b.GraphExecDestroy(x)
			p := e.fill
			p.Args = []gpu.Arg{gpu.Ptr(e.p), gpu.F32(float32(w)), gpu.I32(256)}
			for range 200 {
				if err := b.LaunchKernel(p.Func, p.Config, p.Args, e.s); err != nil {
					errs <- err
					return
				}
				for _, n := range nodes {
					if err := b.GraphExecKernelNodeSetParams(x, n, p); err != nil {
						errs <- err
						return
					}
				}
				if err := b.GraphLaunch(x, e.s); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestHotPathAllocations: the hot calls allocate nothing (pooled frames, no
// pinning, no variadic argument lists in cu). Not under the race detector,
// which makes sync.Pool drop items on purpose.
func TestHotPathAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	e := newOverheadEnv(t)
	b := e.b
	_, x, kn, mn := e.graph(t)
	ev := e.event(t, gpu.EventDisableTiming)
	hm := e.hostMem(t)
	for _, c := range []struct {
		name string
		f    func() error
	}{
		{"LaunchKernel", func() error { return b.LaunchKernel(e.fill.Func, e.fill.Config, e.fill.Args, e.s) }},
		{"GraphExecKernelNodeSetParams", func() error { return b.GraphExecKernelNodeSetParams(x, kn, e.fill) }},
		{"GraphExecMemcpyNodeSetParams", func() error {
			return b.GraphExecMemcpyNodeSetParams(x, mn, gpu.MemcpyParams{Dst: e.p, Src: e.p + 64, Size: 8})
		}},
		{"GraphLaunch", func() error { return b.GraphLaunch(x, e.s) }},
		{"StreamWriteValue64", func() error { return b.StreamWriteValue64(e.s, hm.Ptr, 1) }},
		{"EventRecord", func() error { return b.EventRecord(ev, e.s) }},
		{"MemcpyDtoDAsync", func() error { return b.MemcpyDtoDAsync(e.p, e.p+64, 8, e.s) }},
	} {
		var err error
		if n := testing.AllocsPerRun(200, func() { err = c.f() }); n > 0 {
			t.Errorf("%s: %v allocations per call, want 0", c.name, n)
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}
