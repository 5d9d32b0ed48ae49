package sim

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/patchtable"
	"github.com/stablegraph/stablegraph/kernels"
)

// Tests of the sim's model of device-updatable nodes beyond the conformance
// suite (gputest's DeviceUpdates group): what only the sim reports (a
// patcher racing with the nodes it changes), the device runtime's
// refusals, bookkeeping, and launches back to back over a ring of tables.

const duN = 64

type duRig struct {
	b      *Backend
	k      kern
	patch  gpu.Function
	s      gpu.Stream
	ctl    gpu.DevicePtr
	slots  gpu.DevicePtr
	nslots int
	tables gpu.HostMem
	ntab   int
	cap    int
}

func newDURig(t *testing.T, b *Backend, nslots, ntab, capacity int) *duRig {
	t.Helper()
	r := &duRig{b: b, k: loadKernels(t, b, 0), nslots: nslots, ntab: ntab, cap: capacity}
	m, err := b.ModuleLoad(0, kernels.PatcherModule())
	must(t, err)
	t.Cleanup(func() { must(t, b.ModuleUnload(m)) })
	r.patch, err = b.ModuleFunction(m, kernels.Patcher)
	must(t, err)
	r.s, err = b.StreamCreate(0, gpu.StreamNonBlocking, 0)
	must(t, err)
	t.Cleanup(func() { must(t, b.StreamDestroy(r.s)) })
	r.ctl = r.alloc(t, patchtable.CtlSize)
	r.slots = r.alloc(t, uint64(patchtable.SlotSize*max(nslots, 1)))
	r.tables, err = b.HostAlloc(patchtable.Stride(capacity) * uint64(ntab))
	must(t, err)
	t.Cleanup(func() { must(t, b.HostFree(r.tables.Handle)) })
	return r
}

func (r *duRig) setSlots(t *testing.T, slots ...patchtable.Slot) {
	t.Helper()
	if len(slots) != r.nslots {
		t.Fatalf("%d slots, the rig has %d", len(slots), r.nslots)
	}
	must(t, r.b.MemcpyHtoD(r.slots, patchtable.EncodeSlots(slots)))
}
func (r *duRig) alloc(t *testing.T, size uint64) gpu.DevicePtr {
	t.Helper()
	p, err := r.b.MemAlloc(0, size)
	must(t, err)
	t.Cleanup(func() { must(t, r.b.MemFree(p)) })
	return p
}

func (r *duRig) params() gpu.KernelParams {
	return gpu.KernelParams{Func: r.patch, Config: kernels.PatcherConfig(r.cap),
		Args: patchtable.Args(r.ctl, r.slots, r.nslots, r.tables.Ptr, patchtable.Stride(r.cap), r.ntab, r.cap)}
}

func (r *duRig) write(t *testing.T, seq uint64, ups []patchtable.Update) {
	t.Helper()
	st := patchtable.Stride(r.cap)
	i := seq % uint64(r.ntab)
	must(t, patchtable.Write(r.tables.Bytes[i*st:(i+1)*st], seq, ups))
}

func (r *duRig) ctlState(t *testing.T) patchtable.Ctl {
	t.Helper()
	b := make([]byte, patchtable.CtlSize)
	must(t, r.b.MemcpyDtoH(b, r.ctl))
	c, err := patchtable.DecodeCtl(b)
	must(t, err)
	return c
}

func (r *duRig) axpb(t *testing.T, y, x gpu.DevicePtr) gpu.KernelParams {
	return gpu.KernelParams{Func: r.k.fn(t, kernels.Axpb), Config: kernels.Elementwise(duN),
		Args: []gpu.Arg{gpu.Ptr(y), gpu.Ptr(x), gpu.F32(1), gpu.F32(1), gpu.I32(duN)}}
}

func (r *duRig) graph(t *testing.T) gpu.Graph {
	t.Helper()
	g, err := r.b.GraphCreate(0)
	must(t, err)
	t.Cleanup(func() { must(t, r.b.GraphDestroy(g)) })
	return g
}

func (r *duRig) exec(t *testing.T, g gpu.Graph) gpu.GraphExec {
	t.Helper()
	x, err := r.b.GraphInstantiate(g)
	must(t, err)
	t.Cleanup(func() { must(t, r.b.GraphExecDestroy(x)) })
	return x
}

func (r *duRig) optIn(t *testing.T, n gpu.GraphNode) gpu.DevNode {
	t.Helper()
	d, err := r.b.GraphKernelNodeSetDeviceUpdatable(n, true)
	must(t, err)
	return d
}

func (r *duRig) readF32(t *testing.T, p gpu.DevicePtr) float32 {
	t.Helper()
	b := make([]byte, 4*duN)
	must(t, r.b.MemcpyDtoH(b, p))
	v := gpu.BytesToF32(b)
	for i := range v {
		if v[i] != v[0] {
			t.Fatalf("buffer %#x not uniform: [0]=%v [%d]=%v", uint64(p), v[0], i, v[i])
		}
	}
	return v[0]
}

func (r *duRig) set(t *testing.T, p gpu.DevicePtr, v float32) {
	t.Helper()
	must(t, r.b.Memset(gpu.Memset{Dst: p, Value: gpu.F32(v).AsU32(), ElemSize: 4, Count: duN}))
}

// TestDevUpdatePatcherRaceIsSticky: a patcher that changes a node of its
// own launch that does not depend on it races on a GPU; the sim fails the
// launch with a sticky error, although it happens to run the patcher first.
func TestDevUpdatePatcherRaceIsSticky(t *testing.T) {
	b := newSim(t, Config{})
	for _, ordered := range []bool{true, false} {
		t.Run(fmt.Sprintf("ordered=%v", ordered), func(t *testing.T) {
			r := newDURig(t, b, 1, 1, 2)
			x0, y0, y1 := r.alloc(t, 4*duN), r.alloc(t, 4*duN), r.alloc(t, 4*duN)
			g := r.graph(t)
			// Created first, so that the sim runs it first; only an edge
			// makes that order hold on a GPU.
			pn, err := b.GraphAddKernelNode(g, nil, r.params())
			must(t, err)
			var deps []gpu.GraphNode
			if ordered {
				mid, err := b.GraphAddEmptyNode(g, []gpu.GraphNode{pn})
				must(t, err)
				deps = []gpu.GraphNode{mid} // a transitive dependency is enough
			}
			n, err := b.GraphAddKernelNode(g, deps, r.axpb(t, y0, x0))
			must(t, err)
			r.setSlots(t, patchtable.Slot{Node: r.optIn(t, n), Offset: 0})
			x := r.exec(t, g)
			must(t, b.GraphUpload(x, r.s))
			r.set(t, x0, 1)
			r.set(t, y1, -1)
			r.write(t, 0, []patchtable.Update{{Slot: 0, Value: uint64(y1)}})
			must(t, b.GraphLaunch(x, r.s))
			err = b.StreamSynchronize(r.s)
			if ordered {
				must(t, err)
				if got := r.readF32(t, y1); got != 2 {
					t.Errorf("moved output = %v, want 2", got)
				}
				return
			}
			if !errors.Is(err, gpu.ErrIllegalState) || !strings.Contains(err.Error(), "does not depend on it") {
				t.Fatalf("patching a node that does not depend on the patcher: %v, want a sticky ErrIllegalState naming the race", err)
			}
			if err := b.GraphLaunch(x, r.s); !errors.Is(err, gpu.ErrIllegalState) {
				t.Errorf("the error is not sticky: %v", err)
			}
			must(t, b.ResetDevice(0))
		})
	}
}

// TestDevUpdateSetParamRefusals: the device runtime refuses updates of
// nodes that do not exist, are on another device, have no exec or no
// uploaded exec, or past the end of the parameters; the patcher counts each
// and applies the rest.
func TestDevUpdateSetParamRefusals(t *testing.T) {
	b := newSim(t, Config{Devices: 2})
	r := newDURig(t, b, 6, 1, 8)
	x0, y0, y1 := r.alloc(t, 4*duN), r.alloc(t, 4*duN), r.alloc(t, 4*duN)
	mk := func(dev int) (gpu.Graph, gpu.GraphNode) {
		g, err := b.GraphCreate(dev)
		must(t, err)
		t.Cleanup(func() { must(t, b.GraphDestroy(g)) })
		p := r.axpb(t, y0, x0)
		if dev != 0 {
			k := loadKernels(t, b, dev)
			p.Func = k.fn(t, kernels.Axpb)
		}
		n, err := b.GraphAddKernelNode(g, nil, p)
		must(t, err)
		return g, n
	}
	gOK, nOK := mk(0)
	_, nNoExec := mk(0)
	gNotUp, nNotUp := mk(0)
	_, nDev1 := mk(1)
	slots := []patchtable.Slot{
		{Node: r.optIn(t, nOK), Offset: 0},     // applied
		{Node: 0xdead, Offset: 0},              // no such node
		{Node: r.optIn(t, nNoExec), Offset: 0}, // its graph has no exec
		{Node: r.optIn(t, nNotUp), Offset: 0},  // its exec was never uploaded
		{Node: r.optIn(t, nDev1), Offset: 0},   // on device 1
		{Node: r.optIn(t, nOK), Offset: 24},    // 8 bytes at 24 of a 28-byte parameter buffer
	}
	r.setSlots(t, slots...)
	xOK := r.exec(t, gOK)
	r.exec(t, gNotUp)
	must(t, b.GraphUpload(xOK, r.s))
	var ups []patchtable.Update
	for i := range slots {
		ups = append(ups, patchtable.Update{Slot: uint32(i), Value: uint64(y1)})
	}
	r.write(t, 0, ups)
	p := r.params()
	must(t, b.LaunchKernel(p.Func, p.Config, p.Args, r.s)) // outside any graph
	must(t, b.GraphLaunch(xOK, r.s))
	must(t, b.StreamSynchronize(r.s))
	want := patchtable.Ctl{Seq: 1, Failed: 5, FirstEntry: 2, FirstCode: 1}
	if got := r.ctlState(t); got != want {
		t.Errorf("control block %+v, want %+v", got, want)
	}
	k, ok := b.mu.execs[xOK].dev.current(0)
	if !ok || k.args[0].AsPtr() != y1 || k.args[4].AsI32() != duN {
		t.Errorf("device state of the patched node: %v (want y moved to %#x, n intact)", k.args, uint64(y1))
	}
}

// TestDevUpdateBookkeeping: DevNodes stay resolvable while an exec holds
// their nodes (even after the graph is gone) and are dropped after.
func TestDevUpdateBookkeeping(t *testing.T) {
	b := newSim(t, Config{})
	r := newDURig(t, b, 1, 1, 2)
	x0, y0, y1 := r.alloc(t, 4*duN), r.alloc(t, 4*duN), r.alloc(t, 4*duN)
	g, err := b.GraphCreate(0)
	must(t, err)
	n, err := b.GraphAddKernelNode(g, nil, r.axpb(t, y0, x0))
	must(t, err)
	r.setSlots(t, patchtable.Slot{Node: r.optIn(t, n), Offset: 0})
	x, err := b.GraphInstantiate(g)
	must(t, err)
	must(t, b.GraphDestroy(g))
	must(t, b.GraphUpload(x, r.s))
	r.set(t, x0, 5)
	r.write(t, 0, []patchtable.Update{{Slot: 0, Value: uint64(y1)}})
	p := r.params()
	must(t, b.LaunchKernel(p.Func, p.Config, p.Args, r.s))
	must(t, b.GraphLaunch(x, r.s))
	must(t, b.StreamSynchronize(r.s))
	if got := r.readF32(t, y1); got != 6 {
		t.Errorf("exec of a destroyed graph, patched: %v, want 6", got)
	}
	if len(b.mu.devNodes) != 1 {
		t.Errorf("%d DevNodes known while the exec lives, want 1", len(b.mu.devNodes))
	}
	must(t, b.GraphExecDestroy(x))
	if len(b.mu.devNodes) != 0 {
		t.Errorf("%d DevNodes still known after the graph and its exec went", len(b.mu.devNodes))
	}
	// The other order: exec first, then graph.
	g, err = b.GraphCreate(0)
	must(t, err)
	n, err = b.GraphAddKernelNode(g, nil, r.axpb(t, y0, x0))
	must(t, err)
	r.optIn(t, n)
	x, err = b.GraphInstantiate(g)
	must(t, err)
	must(t, b.GraphExecDestroy(x))
	if len(b.mu.devNodes) != 1 {
		t.Errorf("DevNodes dropped while their graph lives")
	}
	must(t, b.GraphDestroy(g))
	if len(b.mu.devNodes) != 0 {
		t.Errorf("%d DevNodes still known after the exec and its graph went", len(b.mu.devNodes))
	}
}

// TestDevUpdateRingBackToBack launches a patched chain back to back over a
// ring of tables, the host writing each table once the launch that last
// read it has finished (an event per launch), with no synchronization
// otherwise: under -race this checks that the host's table writes and the
// patcher's reads do not race when the protocol is kept.
func TestDevUpdateRingBackToBack(t *testing.T) {
	b := newSim(t, Config{})
	const K, ring, steps = 6, 4, 40
	r := newDURig(t, b, 2*K, ring, 2*K)
	sets := make([][]gpu.DevicePtr, ring) // one buffer set per table
	for i := range sets {
		for range K + 1 {
			sets[i] = append(sets[i], r.alloc(t, 4*duN))
		}
	}
	g := r.graph(t)
	var nodes []gpu.GraphNode
	var slots []patchtable.Slot
	for i := range K {
		var deps []gpu.GraphNode
		if i > 0 {
			deps = nodes[i-1:]
		}
		n, err := b.GraphAddKernelNode(g, deps, r.axpb(t, sets[0][i+1], sets[0][i]))
		must(t, err)
		nodes = append(nodes, n)
		d := r.optIn(t, n)
		slots = append(slots, patchtable.Slot{Node: d, Offset: 0}, patchtable.Slot{Node: d, Offset: 8})
	}
	r.setSlots(t, slots...)
	_, err := b.GraphAddKernelNodeBefore(g, r.params(), nodes[:1])
	must(t, err)
	x := r.exec(t, g)
	must(t, b.GraphUpload(x, r.s))
	events := make([]gpu.Event, ring)
	for i := range events {
		events[i], err = b.EventCreate(0, gpu.EventDisableTiming)
		must(t, err)
		t.Cleanup(func() { must(t, b.EventDestroy(events[i])) })
	}
	for k := range steps {
		j := k % ring
		if k >= ring { // launch k-ring read table j and wrote set j
			must(t, b.EventSynchronize(events[j]))
			if got := r.readF32(t, sets[j][K]); got != float32(k-ring+K) {
				t.Fatalf("launch %d: output %v, want %d", k-ring, got, k-ring+K)
			}
		}
		r.set(t, sets[j][0], float32(k))
		var ups []patchtable.Update
		for i := range K {
			ups = append(ups, patchtable.Update{Slot: uint32(2 * i), Value: uint64(sets[j][i+1])},
				patchtable.Update{Slot: uint32(2*i + 1), Value: uint64(sets[j][i])})
		}
		r.write(t, uint64(k), ups)
		must(t, b.GraphLaunch(x, r.s))
		must(t, b.EventRecord(events[j], r.s))
	}
	must(t, b.StreamSynchronize(r.s))
	if got := r.ctlState(t); got != (patchtable.Ctl{Seq: steps}) {
		t.Errorf("control block %+v, want %d launches and no failure", got, steps)
	}
}

// TestDevUpdateInjectedFaults: each entry point fails cleanly when a fault
// is injected, and works on the next call.
func TestDevUpdateInjectedFaults(t *testing.T) {
	b := newSim(t, Config{})
	r := newDURig(t, b, 1, 1, 2)
	x0, y0 := r.alloc(t, 4*duN), r.alloc(t, 4*duN)
	g := r.graph(t)
	n, err := b.GraphAddKernelNode(g, nil, r.axpb(t, y0, x0))
	must(t, err)
	calls := []struct {
		op   string
		call func() error
	}{
		{"DeviceUpdatesSupported", func() error { return b.DeviceUpdatesSupported(0) }},
		{"GraphKernelNodeSetDeviceUpdatable", func() error { _, err := b.GraphKernelNodeSetDeviceUpdatable(n, true); return err }},
		{"GraphKernelNodeDevNode", func() error { _, err := b.GraphKernelNodeDevNode(n); return err }},
		{"GraphAddKernelNodeBefore", func() error { _, err := b.GraphAddKernelNodeBefore(g, r.params(), nil); return err }},
	}
	for _, c := range calls {
		b.InjectFault(c.op, 0, nil)
		if err := c.call(); !errors.Is(err, gpu.ErrInjected) {
			t.Errorf("%s with an injected fault: %v", c.op, err)
		}
		if err := c.call(); err != nil {
			t.Errorf("%s after the injected fault: %v", c.op, err)
		}
	}
	if nodes, _ := b.GraphNodes(g); len(nodes) != 2 {
		t.Errorf("graph has %d nodes after one failed and one added root node, want 2", len(nodes))
	}
	x := r.exec(t, g)
	b.InjectFault("GraphUpload", 0, nil)
	if err := b.GraphUpload(x, r.s); !errors.Is(err, gpu.ErrInjected) {
		t.Errorf("GraphUpload with an injected fault: %v", err)
	}
	if err := b.GraphLaunch(x, r.s); !errors.Is(err, gpu.ErrIllegalState) {
		t.Errorf("a failed upload counted as an upload: launch gave %v", err)
	}
	must(t, b.GraphUpload(x, r.s))
	r.write(t, 0, nil)
	must(t, b.GraphLaunch(x, r.s))
	must(t, b.StreamSynchronize(r.s))
}

// TestDevUpdateUploadResetsDeviceState: an upload replaces the device-side
// parameters of every device-updatable node with the host-side ones.
func TestDevUpdateUploadResetsDeviceState(t *testing.T) {
	b := newSim(t, Config{})
	r := newDURig(t, b, 1, 1, 2)
	x0, y0, y1 := r.alloc(t, 4*duN), r.alloc(t, 4*duN), r.alloc(t, 4*duN)
	g := r.graph(t)
	n, err := b.GraphAddKernelNode(g, nil, r.axpb(t, y0, x0))
	must(t, err)
	r.setSlots(t, patchtable.Slot{Node: r.optIn(t, n), Offset: 0})
	x := r.exec(t, g)
	must(t, b.GraphUpload(x, r.s))
	r.write(t, 0, []patchtable.Update{{Slot: 0, Value: uint64(y1)}})
	p := r.params()
	must(t, b.LaunchKernel(p.Func, p.Config, p.Args, r.s))
	r.set(t, x0, 1)
	r.set(t, y0, -1)
	r.set(t, y1, -1)
	must(t, b.GraphLaunch(x, r.s))
	must(t, b.StreamSynchronize(r.s))
	if r.readF32(t, y1) != 2 || r.readF32(t, y0) != -1 {
		t.Fatalf("patched launch wrote y0=%v y1=%v", r.readF32(t, y0), r.readF32(t, y1))
	}
	r.set(t, y1, -1)
	must(t, b.GraphLaunch(x, r.s)) // the change holds
	must(t, b.StreamSynchronize(r.s))
	if r.readF32(t, y1) != 2 {
		t.Fatalf("the device-side change did not hold for the next launch")
	}
	must(t, b.GraphUpload(x, r.s))
	r.set(t, y1, -1)
	r.set(t, y0, -1)
	must(t, b.GraphLaunch(x, r.s)) // back on the host-side parameters
	must(t, b.StreamSynchronize(r.s))
	if r.readF32(t, y1) != -1 || r.readF32(t, y0) != 2 {
		t.Errorf("after an upload: y0=%v y1=%v, want the host-side output y0 written", r.readF32(t, y0), r.readF32(t, y1))
	}
}
