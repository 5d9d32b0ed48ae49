package cuda

// Device-side graph updates on a GPU; each test skips with the reason where
// there is no GPU, no CUDA 12.4 driver or no patcher built for the device.

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/patchtable"
	"github.com/stablegraph/stablegraph/kernels"
)

// devChainN is the length of every buffer of the chains below.
const devChainN = 1024

// devChain is the probe's graph through this backend: a chain of k sg_axpb
// nodes, y[i+1] = y[i] + 1 over devChainN values, so y[k] = y[0] + k; its
// nodes device-updatable and the patcher its root node (as its devChainKind says), with
// a ring of tables in mapped pinned memory.
type devChain struct {
	b        gpu.Backend
	du       gpu.DeviceUpdates
	s        gpu.Stream
	k        int
	g        gpu.Graph
	x        gpu.GraphExec
	built    []gpu.DevicePtr // the buffers the graph was built with
	ctl      gpu.DevicePtr
	tables   gpu.HostMem
	ntables  int
	capacity int
	stride   uint64
	launches uint64 // the next launch's number
	release  []func() error
}

// devChainKind is what a chain has besides its kernel nodes.
type devChainKind int

const (
	chainPlain   devChainKind = iota // nodes not opted in, no patcher: the floor
	chainOptedIn                     // every node opted in, no patcher
	chainPatcher                     // every node opted in, the patcher as root
)

// newDevChain builds the chain on b (closed by the caller) and uploads its
// exec. noUpload: leave the exec not uploaded.
func newDevChain(tb testing.TB, b gpu.Backend, k, ntables int, kind devChainKind, noUpload ...bool) *devChain {
	tb.Helper()
	c := &devChain{b: b, k: k, ntables: ntables, capacity: 2 * k}
	tb.Cleanup(func() {
		if c.s != 0 {
			b.StreamSynchronize(c.s)
		}
		for i := len(c.release) - 1; i >= 0; i-- {
			if err := c.release[i](); err != nil {
				tb.Errorf("release: %v", err)
			}
		}
	})
	du, err := gpu.DeviceUpdatesOf(b, 0)
	if errors.Is(err, gpu.ErrNotSupported) {
		tb.Skipf("device-side graph updates: %v", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	c.du = du
	m, err := b.ModuleLoad(0, kernels.Module())
	c.must(tb, err)
	c.release = append(c.release, func() error { return b.ModuleUnload(m) })
	axpb, err := b.ModuleFunction(m, kernels.Axpb)
	c.must(tb, err)
	plain, patched := kind == chainPlain, kind == chainPatcher
	var patcher gpu.Function
	if patched {
		pm, err := b.ModuleLoad(0, kernels.PatcherModule())
		if errors.Is(err, gpu.ErrNotSupported) {
			tb.Skipf("the patcher: %v", err)
		}
		c.must(tb, err)
		c.release = append(c.release, func() error { return b.ModuleUnload(pm) })
		patcher, err = b.ModuleFunction(pm, kernels.Patcher)
		c.must(tb, err)
	}
	c.s, err = b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	c.must(tb, err)
	s := c.s
	c.release = append(c.release, func() error { return b.StreamDestroy(s) })
	c.built = c.bufs(tb, -1)
	c.g, err = b.GraphCreate(0)
	c.must(tb, err)
	g := c.g
	c.release = append(c.release, func() error { return b.GraphDestroy(g) })
	var slots []patchtable.Slot
	var prev, first gpu.GraphNode
	for i := range k {
		var deps []gpu.GraphNode
		if i > 0 {
			deps = []gpu.GraphNode{prev}
		}
		n, err := b.GraphAddKernelNode(c.g, deps, gpu.KernelParams{Func: axpb, Config: kernels.Elementwise(devChainN),
			Args: []gpu.Arg{gpu.Ptr(c.built[i+1]), gpu.Ptr(c.built[i]), gpu.F32(1), gpu.F32(1), gpu.I32(devChainN)}})
		c.must(tb, err)
		prev = n
		if i == 0 {
			first = n
		}
		if plain {
			continue
		}
		d, err := du.GraphKernelNodeSetDeviceUpdatable(n, true)
		c.must(tb, err)
		slots = append(slots, patchtable.Slot{Node: d, Offset: 0}, patchtable.Slot{Node: d, Offset: 8})
	}
	if patched {
		c.stride = patchtable.Stride(c.capacity)
		c.ctl = c.alloc(tb, patchtable.CtlSize)
		c.must(tb, b.Memset(gpu.Memset{Dst: c.ctl, ElemSize: 4, Count: patchtable.CtlSize / 4}))
		sl := c.alloc(tb, uint64(len(slots)*patchtable.SlotSize))
		c.must(tb, b.MemcpyHtoD(sl, patchtable.EncodeSlots(slots)))
		ops, err := gpu.StreamMemOpsOf(b, 0)
		c.must(tb, err)
		c.tables, err = ops.HostAlloc(c.stride * uint64(ntables))
		c.must(tb, err)
		h := c.tables.Handle
		c.release = append(c.release, func() error { return ops.HostFree(h) })
		_, err = du.GraphAddKernelNodeBefore(c.g, gpu.KernelParams{Func: patcher, Config: kernels.PatcherConfig(c.capacity),
			Args: patchtable.Args(c.ctl, sl, len(slots), c.tables.Ptr, c.stride, ntables, c.capacity)}, []gpu.GraphNode{first})
		c.must(tb, err)
	}
	c.x, err = b.GraphInstantiate(c.g)
	c.must(tb, err)
	x := c.x
	c.release = append(c.release, func() error { return b.GraphExecDestroy(x) })
	if !plain && len(noUpload) == 0 {
		c.must(tb, du.GraphUpload(c.x, c.s))
	}
	c.must(tb, b.StreamSynchronize(c.s))
	return c
}

func (c *devChain) must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

func (c *devChain) alloc(tb testing.TB, size uint64) gpu.DevicePtr {
	tb.Helper()
	p, err := c.b.MemAlloc(0, size)
	c.must(tb, err)
	c.release = append(c.release, func() error { return c.b.MemFree(p) })
	return p
}

// bufs allocates a set of k+1 buffers, y[0] = v0 and the others -1.
func (c *devChain) bufs(tb testing.TB, v0 float32) []gpu.DevicePtr {
	tb.Helper()
	out := make([]gpu.DevicePtr, c.k+1)
	for i := range out {
		out[i] = c.alloc(tb, 4*devChainN)
		v := float32(-1)
		if i == 0 {
			v = v0
		}
		c.must(tb, c.b.Memset(gpu.Memset{Dst: out[i], Value: gpu.F32(v).AsU32(), ElemSize: 4, Count: devChainN}))
	}
	return out
}

// updates move every node onto bufs.
func (c *devChain) updates(bufs []gpu.DevicePtr) []patchtable.Update {
	u := make([]patchtable.Update, 0, 2*c.k)
	for i := range c.k {
		u = append(u, patchtable.Update{Slot: uint32(2 * i), Value: uint64(bufs[i+1])},
			patchtable.Update{Slot: uint32(2*i + 1), Value: uint64(bufs[i])})
	}
	return u
}

// next writes the next launch's table; the launch that read it before must
// have finished.
func (c *devChain) next(tb testing.TB, ups []patchtable.Update) {
	i := c.launches % uint64(c.ntables)
	if err := patchtable.Write(c.tables.Bytes[i*c.stride:(i+1)*c.stride], c.launches, ups); err != nil {
		tb.Fatal(err)
	}
	c.launches++
}

func (c *devChain) ctlState(tb testing.TB) patchtable.Ctl {
	tb.Helper()
	raw := make([]byte, patchtable.CtlSize)
	c.must(tb, c.b.MemcpyDtoH(raw, c.ctl))
	st, err := patchtable.DecodeCtl(raw)
	c.must(tb, err)
	return st
}

// wantAll checks that every value of p is v.
func (c *devChain) wantAll(tb testing.TB, what string, p gpu.DevicePtr, v float32) {
	tb.Helper()
	raw := make([]byte, 4*devChainN)
	c.must(tb, c.b.MemcpyDtoH(raw, p))
	for i, got := range gpu.BytesToF32(raw) {
		if got != v {
			tb.Errorf("%s: [%d] = %v, want %v", what, i, got, v)
			return
		}
	}
}

// TestDeviceUpdatesChain1000 is the probe's in-graph case through this
// backend: every pointer of a 1000-node chain moved to fresh buffers by the
// patcher root node, in the same launch, five launches in a row.
func TestDeviceUpdatesChain1000(t *testing.T) {
	b := openOrSkip(t, Config{})
	closeClean(t, b)
	checkDevChain(t, b, 1000) // 2000 pointer writes: the patcher in one block
	checkDevChain(t, b, 1500) // 3000: in several blocks
}

// TestDevChainHarnessOnSim runs the chain test and the benchmark's loop of
// this file on the sim, which models device updates: it checks the GPU
// tests themselves (their protocol and checks) where no GPU is.
func TestDevChainHarnessOnSim(t *testing.T) {
	b, err := sim.New(sim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c := b.LiveHandles(); !c.IsZero() {
			t.Errorf("leak: %v", c)
		}
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	checkDevChain(t, b, 64)
	for _, mode := range []string{"floor", "opted-in", "patcher-idle", "moving"} {
		t.Run(mode, func(t *testing.T) {
			n := 0
			gpuPer, hostPer := runDevChain(t, b, 16, mode, func() bool { n++; return n <= 53 })
			t.Logf("sim (simulated times, not GPU time): %s %.1f µs/step, host %.1f µs/step", mode, gpuPer, hostPer)
		})
	}
}

func checkDevChain(t *testing.T, b gpu.Backend, K int) {
	c := newDevChain(t, b, K, 2, chainPatcher)
	var prev []gpu.DevicePtr
	for step := range 5 {
		v0 := float32(10 * step)
		bufs := c.bufs(t, v0)
		c.next(t, c.updates(bufs))
		c.must(t, b.GraphLaunch(c.x, c.s))
		c.must(t, b.StreamSynchronize(c.s))
		for _, i := range []int{1, K / 2, K} {
			c.wantAll(t, fmt.Sprintf("launch %d: y[%d]", step, i), bufs[i], v0+float32(i))
		}
		c.wantAll(t, fmt.Sprintf("launch %d: the buffers the graph was built with", step), c.built[K], -1)
		if prev != nil {
			c.wantAll(t, fmt.Sprintf("launch %d: the previous launch's output", step), prev[K], float32(10*(step-1)+K))
		}
		prev = bufs
	}
	if st := c.ctlState(t); st != (patchtable.Ctl{Seq: 5}) {
		t.Errorf("patcher control block %+v, want 5 launches and no failure", st)
	}
	t.Logf("DEVUPDATE-CHAIN k=%d launches=5: every output in the moved buffers, the built ones untouched", K)
}

// TestDeviceUpdatesDriverRules asks the driver itself about each rule of
// gpu.DeviceUpdates, below the backend (which refuses before the driver
// sees the calls): where CUDA documents an error it must map to the
// backend's sentinel; the rest is logged. Lines starting DEVUPDATE-RULE
// say what the driver did.
func TestDeviceUpdatesDriverRules(t *testing.T) {
	b := openOrSkip(t, Config{})
	closeClean(t, b)
	if _, err := gpu.DeviceUpdatesOf(b, 0); err != nil {
		t.Skipf("device-side graph updates: %v", err)
	}
	d := b.d
	c := newDevChain(t, b, 4, 1, chainPlain) // for its stream and buffers
	m, err := b.ModuleLoad(0, kernels.Module())
	c.must(t, err)
	defer b.ModuleUnload(m)
	fill, err := b.ModuleFunction(m, kernels.Fill)
	c.must(t, err)
	fillP := gpu.KernelParams{Func: fill, Config: kernels.Elementwise(devChainN), Args: []gpu.Arg{gpu.Ptr(c.built[1]), gpu.F32(2), gpu.I32(devChainN)}}
	g, err := b.GraphCreate(0)
	c.must(t, err)
	defer b.GraphDestroy(g)
	n0, err := b.GraphAddKernelNode(g, nil, fillP)
	c.must(t, err)
	n1, err := b.GraphAddKernelNode(g, []gpu.GraphNode{n0}, fillP)
	c.must(t, err)
	_, err = b.GraphKernelNodeSetDeviceUpdatable(n0, true)
	c.must(t, err)
	same, err := b.GraphCreate(0) // g's topology, nothing device-updatable
	c.must(t, err)
	defer b.GraphDestroy(same)
	s0, err := b.GraphAddKernelNode(same, nil, fillP)
	c.must(t, err)
	_, err = b.GraphAddKernelNode(same, []gpu.GraphNode{s0}, fillP)
	c.must(t, err)
	cuNode := func(n gpu.GraphNode) cu.GraphNode { return b.mu.nodes[n].n }
	report := func(rule string, r cu.Result, want error) {
		t.Helper()
		t.Logf("DEVUPDATE-RULE %s: driver returned %s (%d) -> %v", rule, r.Name(), int(r), sentinel(r))
		if want != nil && (r == cu.Success || !errors.Is(sentinel(r), want)) {
			t.Errorf("%s: the driver returned %s, which maps to %v; the backend and the sim refuse it with %v: make them agree (gpu/devupdate.go documents the rule)",
				rule, r.Name(), sentinel(r), want)
		}
	}
	err = b.onDevice(0, func() error {
		off := cu.LaunchAttributeValue{}
		report("opt-out", d.GraphKernelNodeSetAttribute(cuNode(n0), cu.LaunchAttributeDeviceUpdatableKernelNode, &off), gpu.ErrNotSupported)
		var v cu.LaunchAttributeValue
		r := d.GraphKernelNodeGetAttribute(cuNode(n1), cu.LaunchAttributeDeviceUpdatableKernelNode, &v)
		t.Logf("DEVUPDATE-RULE attribute of a node not opted in: %s, deviceUpdatable=%d devNode=%#x", r.Name(),
			v.DeviceUpdatableKernelNode.DeviceUpdatable, uintptr(v.DeviceUpdatableKernelNode.DevNode))
		return nil
	})
	c.must(t, err)
	x1, err := b.GraphInstantiate(g)
	c.must(t, err)
	defer b.GraphExecDestroy(x1)
	gi := b.mu.graphs[g]
	err = b.onDevice(0, func() error {
		var x2 cu.GraphExec
		r := d.GraphInstantiate(&x2, gi.g, 0)
		if r == cu.Success {
			d.GraphExecDestroy(x2)
		}
		report("second exec of a graph with device-updatable nodes", r, gpu.ErrNotSupported)
		var info cu.GraphExecUpdateResultInfo
		r = d.GraphExecUpdate(b.mu.execs[x1].x, b.mu.graphs[same].g, &info)
		t.Logf("DEVUPDATE-RULE exec update: CUgraphExecUpdateResult %d", info.Result)
		// The backend refuses it before the driver sees it, with ErrGraphUpdate
		// (re-record), where the driver says CUDA_ERROR_NOT_SUPPORTED: only
		// that the driver refuses it too is checked.
		report("exec update of an exec with device-updatable nodes", r, gpu.ErrNotSupported)
		// Not asked of the driver: a graph with device-updatable nodes added
		// as a child (a clone) is taken (CUDA_SUCCESS on driver 580), but
		// destroying the two graphs afterwards crashed the process inside
		// the driver, twice. The backend and the sim refuse it
		// (ErrNotSupported).
		return nil
	})
	c.must(t, err)

	// A launch without the upload, the patcher moving the chain in it.
	mc := newDevChain(t, b, 8, 1, chainPatcher, true)
	bufs := mc.bufs(t, 3)
	mc.next(t, mc.updates(bufs))
	var r cu.Result
	mc.must(t, b.onDevice(0, func() error { r = d.GraphLaunch(b.mu.execs[mc.x].x, b.mu.streams[mc.s].s); return nil }))
	serr := b.StreamSynchronize(mc.s)
	moved := make([]byte, 4)
	mc.must(t, b.MemcpyDtoH(moved, bufs[8]))
	t.Logf("DEVUPDATE-RULE launch without upload: cuGraphLaunch %s, synchronize %v, moves applied in that launch: %v (y[8] = %v, want 11)",
		r.Name(), serr, gpu.BytesToF32(moved)[0] == 11, gpu.BytesToF32(moved)[0])
}

// BenchmarkDeviceUpdatesChain measures the probe's figures through this
// backend: a chain of K nodes replayed back to back, as the floor (nodes
// not device-updatable, no patcher), with every node opted in to device
// updates but no patcher (opted-in: what opting in alone costs), with the
// patcher root node moving nothing (patcher-idle), and moving every pointer
// of every node each step (moving, between two buffer sets). It reports GPU time per step (events
// around the whole run) and the host time of the backend's calls per step
// (writing the table and GraphLaunch; waits on the ring of 16 tables, an
// event every 8 launches, excluded).
func BenchmarkDeviceUpdatesChain(bm *testing.B) {
	for _, k := range []int{16, 1000} {
		for _, mode := range []string{"floor", "opted-in", "patcher-idle", "moving"} {
			bm.Run(fmt.Sprintf("K=%d/%s", k, mode), func(bm *testing.B) { benchDevChain(bm, k, mode) })
		}
	}
}

func benchDevChain(bm *testing.B, k int, mode string) {
	b, err := Open(Config{})
	if errors.Is(err, gpu.ErrUnavailable) {
		bm.Skipf("no CUDA here: %v", err)
	}
	if err != nil {
		bm.Fatal(err)
	}
	bm.Cleanup(func() { b.Close() })
	gpuPer, hostPer := runDevChain(bm, b, k, mode, bm.Loop)
	bm.ReportMetric(gpuPer, "gpu-µs/step")
	bm.ReportMetric(hostPer, "host-µs/step")
}

// runDevChain launches the chain back to back while loop says so and
// returns the GPU and host microseconds per step (see
// BenchmarkDeviceUpdatesChain), after checking the last launch's outputs
// and the patcher's control block.
func runDevChain(tb testing.TB, b gpu.Backend, k int, mode string, loop func() bool) (gpuPer, hostPer float64) {
	const ring, every = 16, 8
	kind := map[string]devChainKind{"floor": chainPlain, "opted-in": chainOptedIn}[mode]
	if mode == "patcher-idle" || mode == "moving" {
		kind = chainPatcher
	}
	c := newDevChain(tb, b, k, ring, kind)
	var sets [2][]gpu.DevicePtr
	var ups [2][]patchtable.Update
	for i := range sets {
		sets[i] = c.bufs(tb, float32(i))
		ups[i] = c.updates(sets[i])
	}
	var events [2]gpu.Event
	for i := range events {
		e, err := b.EventCreate(0, gpu.EventDisableTiming)
		c.must(tb, err)
		events[i] = e
		c.release = append(c.release, func() error { return b.EventDestroy(e) })
	}
	start, end := c.timingEvents(tb)
	c.must(tb, b.EventRecord(start, c.s))
	var host time.Duration
	steps := 0
	for i := 0; loop(); i++ {
		if kind == chainPatcher && i%every == 0 && i >= ring {
			c.must(tb, b.EventSynchronize(events[(i/every)%2])) // launch i-ring has read its table
		}
		t0 := time.Now()
		switch mode {
		case "moving":
			c.next(tb, ups[i%2])
		case "patcher-idle":
			c.next(tb, nil)
		}
		if err := b.GraphLaunch(c.x, c.s); err != nil {
			tb.Fatal(err)
		}
		host += time.Since(t0)
		if i%every == every-1 {
			c.must(tb, b.EventRecord(events[(i/every)%2], c.s))
		}
		steps++
	}
	c.must(tb, b.EventRecord(end, c.s))
	c.must(tb, b.EventSynchronize(end))
	gpuTime, err := b.EventElapsed(start, end)
	c.must(tb, err)
	if steps == 0 {
		return 0, 0
	}
	// The run was real: the last launch's outputs, and no failed update.
	out, want := c.built[k], float32(k-1) // the built buffers: y[0] = -1
	if mode == "moving" {
		last := (steps - 1) % 2 // set i has y[0] = i
		out, want = sets[last][k], float32(last+k)
	}
	c.wantAll(tb, mode+": last output", out, want)
	if kind == chainPatcher {
		if st := c.ctlState(tb); st.Seq != uint64(steps) || st.Failed != 0 || st.Skipped != 0 {
			tb.Errorf("patcher control block %+v after %d launches", st, steps)
		}
	}
	return float64(gpuTime.Nanoseconds()) / 1e3 / float64(steps), float64(host.Nanoseconds()) / 1e3 / float64(steps)
}

// timingEvents makes the two events around a timed run.
func (c *devChain) timingEvents(tb testing.TB) (gpu.Event, gpu.Event) {
	tb.Helper()
	var ev [2]gpu.Event
	for i := range ev {
		e, err := c.b.EventCreate(0, gpu.EventDefault)
		c.must(tb, err)
		ev[i] = e
		c.release = append(c.release, func() error { return c.b.EventDestroy(e) })
	}
	return ev[0], ev[1]
}
