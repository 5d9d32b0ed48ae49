package replay

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/graph"
	"github.com/stablegraph/stablegraph/internal/patchtable"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/kernels"
)

// chainSpec is the spec of a chain of k sg_axpb kernels over n floats,
// y = a·(...(a·x+b)...)+b, whose intermediates alternate between params t0
// and t1 (chain-moving's shape: every node's pointers move when the
// caller's buffers do). Buffers: x, y, t0, t1.
func chainSpec(t testing.TB, b *sim.Backend, k, n int) Spec {
	t.Helper()
	m, err := b.ModuleLoad(0, kernels.Module())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.ModuleUnload(m); err != nil {
			t.Error(err)
		}
	})
	lookup := func(name string) (gpu.Function, error) { return b.ModuleFunction(m, name) }
	axpb, err := lookup(kernels.Axpb)
	if err != nil {
		t.Fatal(err)
	}
	var cmds []graph.Command
	prev := 0
	for i := range k {
		out := 2 + i%2
		if i == k-1 {
			out = 1
		}
		cmds = append(cmds, graph.Command{Name: fmt.Sprintf("axpb %d", i), Kind: graph.KindKernel, Func: axpb,
			Config: kernels.Elementwise(n), Args: []graph.Arg{
				{Value: gpu.Arg{Kind: gpu.ArgPtr}, Ref: graph.Ref{Buf: out}},
				{Value: gpu.Arg{Kind: gpu.ArgPtr}, Ref: graph.Ref{Buf: prev}},
				{Value: gpu.F32(0.5)}, {Value: gpu.F32(1)}, {Value: gpu.I32(int32(n))},
			}})
		prev = out
	}
	cb, err := graph.New(0, 4, cmds, nil)
	if err != nil {
		t.Fatal(err)
	}
	size := int64(4 * n)
	return Spec{Program: "chain", Backend: b, Ordinal: 0, Commands: cb, Kernels: lookup,
		Alignment: 256, Costs: DefaultCosts(),
		Buffers: []Buffer{
			{Name: "x", Class: Param, Size: size, Flow: Flow{ReadFirst: true}},
			{Name: "y", Class: Output, Size: size, Flow: Flow{Written: true, Full: true}},
			{Name: "t0", Class: Param, Size: size, Flow: Flow{Written: true, Full: true}},
			{Name: "t1", Class: Param, Size: size, Flow: Flow{Written: true, Full: true}},
		}}
}

// noLaunch is the sim with graph launches that do nothing but count: what
// the strategy does on the host, apart from the launch itself.
type noLaunch struct {
	*sim.Backend
	launches int
	// The inline patcher's parameter updates: how many, and the table
	// words of the last (copied, as the driver copies them).
	inline  gpu.Function
	updates int
	words   [patchtable.InlineSize / 8]uint64
	// Exec updates of other kernel nodes (the lead command's).
	others int
	// set is the last node set prepared over it.
	set *wordCounter
}

func (b *noLaunch) GraphLaunch(gpu.GraphExec, gpu.Stream) error {
	b.launches++
	return nil
}

func (b *noLaunch) GraphExecKernelNodeSetParams(_ gpu.GraphExec, _ gpu.GraphNode, p gpu.KernelParams) error {
	if p.Func != b.inline {
		b.others++
		return nil
	}
	b.updates++
	for i, a := range p.Args[len(p.Args)-len(b.words):] {
		b.words[i] = a.AsU64()
	}
	return nil
}

// ops are the entry points of the sim a test counts calls of.
func ops() []string {
	var out []string
	for _, t := range []reflect.Type{reflect.TypeFor[gpu.Backend](), reflect.TypeFor[gpu.DeviceUpdates](),
		reflect.TypeFor[gpu.GEMM](), reflect.TypeFor[gpu.GraphNodeReader](), reflect.TypeFor[gpu.Collectives]()} {
		for i := range t.NumMethod() {
			if name := t.Method(i).Name; !slices.Contains(out, name) {
				out = append(out, name)
			}
		}
	}
	return out
}

// calls counts the sim's calls of every entry point.
func calls(b *sim.Backend) map[string]int {
	c := map[string]int{}
	for _, op := range ops() {
		if n := b.Calls(op); n > 0 {
			c[op] = n
		}
	}
	return c
}

// deviceOnChain builds the device strategy over chainSpec and records it
// with a first step at addrs[0] on s, waiting for it.
func deviceOnChain(t testing.TB, b *sim.Backend, k int, s gpu.Stream, addrs []gpu.DevicePtr, tables bool) *device {
	t.Helper()
	spec := chainSpec(t, b, k, 64)
	// The first command from the host, as before the defaults turned to
	// everything on the device: these tests count its updates.
	spec.Options.DeviceStrategy.Inline, spec.Options.DeviceStrategy.HostLead = !tables, true
	st, err := New(Device, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Error(err)
		}
	})
	if _, err := st.Run(context.Background(), s, addrs); err != nil {
		t.Fatal(err)
	}
	if err := b.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
	return st.(*device)
}

// TestDeviceHostStepAllocatesNothing: once recorded, a step whose buffers
// all move allocates nothing and makes no driver call but the launch, one
// exec update of the first node (the lead command, moved from the host)
// and, with the inline patcher, one of the patcher node; and it writes one
// update per moved buffer (not one per pointer).
func TestDeviceHostStepAllocatesNothing(t *testing.T) {
	for _, tables := range []bool{true, false} {
		t.Run(fmt.Sprintf("tables=%v", tables), func(t *testing.T) { hostStepAllocatesNothing(t, tables) })
	}
}

func hostStepAllocatesNothing(t *testing.T, tables bool) {
	b := simtest.New(t, 1)
	s := simtest.Stream(t, b, 0)
	const k = 100
	sets := make([][]gpu.DevicePtr, 8) // fresh addresses: the host side never reads them
	for i := range sets {
		sets[i] = []gpu.DevicePtr{gpu.DevicePtr(1<<40 + i<<20), gpu.DevicePtr(1<<40 + i<<20 + 1<<16),
			gpu.DevicePtr(1<<40 + i<<20 + 2<<16), gpu.DevicePtr(1<<40 + i<<20 + 3<<16)}
	}
	first := []gpu.DevicePtr{simtest.Alloc(t, b, 0, 256), simtest.Alloc(t, b, 0, 256), simtest.Alloc(t, b, 0, 256), simtest.Alloc(t, b, 0, 256)}
	st := deviceOnChain(t, b, k, s, first, tables)
	if want := map[bool]patcherMode{false: patcherInline, true: patcherTables}[tables]; st.rig.mode != want {
		t.Fatalf("patcher %s with DeviceOptions.Tables %v, want %s", st.rig.mode, tables, want)
	}
	// The nodes that move from the host (the first, and the inline
	// patcher's) are prepared over nl at the first moving step.
	nl := &noLaunch{Backend: b, inline: st.inline}
	st.b = nl
	ctx := context.Background()
	before := calls(b)
	i := 0
	step := func() {
		if _, err := st.Run(ctx, s, sets[i%len(sets)]); err != nil {
			t.Fatal(err)
		}
		i++
		// The device's patcher would have run: the table is free again.
		st.rig.host.Store64(0, st.rig.launches)
	}
	if a := testing.AllocsPerRun(100, step); a != 0 {
		t.Errorf("%v allocations per step", a)
	}
	if after := calls(b); !sameCounts(before, after) {
		t.Errorf("driver calls during the steps: before %v, after %v", before, after)
	}
	if nl.launches != i {
		t.Errorf("%d launches for %d steps", nl.launches, i)
	}
	if nl.others != i {
		t.Errorf("%d exec updates of the first node for %d steps", nl.others, i)
	}
	// chain: y, t0, t1 move on the device (x only in the first node, from
	// the host): 3 updates, 2 pointers per node but the first.
	var count, total int
	if tables {
		tbl := st.rig.table(st.rig.launches - 1)
		count, total = leUint32(tbl[8:]), leUint32(tbl[12:])
	} else {
		if nl.updates != i {
			t.Errorf("%d updates of the inline patcher's parameters for %d steps", nl.updates, i)
		}
		count, total = int(uint32(nl.words[1])), int(nl.words[1]>>32)
		// Only the header and the updates in it are rewritten, not the
		// whole table.
		if nl.set == nil || nl.set.applies != i {
			t.Fatalf("the inline patcher and the first node were not applied together, once a step: %+v", nl.set)
		}
		if w, want := nl.set.words, i*(patchtable.HeaderSize+3*patchtable.UpdateSize)/8; w != want {
			t.Errorf("%d words of the inline patcher's table rewritten in %d steps, want %d", w, i, want)
		}
	}
	if count != 3 {
		t.Errorf("last table has %d updates, want 3 (one per buffer moved on the device)", count)
	}
	if total != 2*(k-1) {
		t.Errorf("last table moves %d pointers, want %d", total, 2*(k-1))
	}
	if c := st.Counters(); c.DeviceUpdates != int64(2*(k-1)*i) || c.PatchedNodes != int64(i) || c.Records != 1 || c.GraphUploads != 1 {
		t.Errorf("counters %+v after %d moving steps", c, i)
	}
}

// wordCounter counts the words a node set rewrites.
// wordCounter counts the words rewritten in the inline patcher's node of a
// set (node inline; -1: none) and the set's applies.
type wordCounter struct {
	gpu.KernelNodeSet
	inline         int
	words, applies int
}

func (c *wordCounter) SetWord(i, arg, off int, v uint64) error {
	if i == c.inline {
		c.words++
	}
	return c.KernelNodeSet.SetWord(i, arg, off, v)
}

func (c *wordCounter) Apply(idx []int32) (int, error) {
	c.applies++
	return c.KernelNodeSet.Apply(idx)
}

// PrepareKernelNodes prepares the sim's node set over b, counting (set).
func (b *noLaunch) PrepareKernelNodes(x gpu.GraphExec, nodes []gpu.GraphNode, params []gpu.KernelParams) (gpu.KernelNodeSet, error) {
	// The interface alone: no KernelNodeSets, so the generic set.
	set, err := gpu.PrepareKernelNodes(struct{ gpu.ExecKernelNodeSetter }{b}, x, nodes, params)
	if err != nil {
		return nil, err
	}
	b.set = &wordCounter{KernelNodeSet: set, inline: slices.IndexFunc(params, func(p gpu.KernelParams) bool { return p.Func == b.inline })}
	return b.set, nil
}

func leUint32(b []byte) int { return int(b[0]) | int(b[1])<<8 | int(b[2])<<16 | int(b[3])<<24 }

func sameCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestDevicePatcherFailure: pointer updates the device runtime refuses (a
// slot naming no node) are seen by the next step, which fails without
// enqueuing anything; the step after records afresh and computes the
// right values.
func TestDevicePatcherFailure(t *testing.T) {
	for _, tables := range []bool{true, false} {
		t.Run(fmt.Sprintf("tables=%v", tables), func(t *testing.T) { patcherFailure(t, tables) })
	}
}

func patcherFailure(t *testing.T, tables bool) {
	b := simtest.New(t, 1)
	s := simtest.Stream(t, b, 0)
	const k, n = 4, 64
	alloc := func() []gpu.DevicePtr {
		var a []gpu.DevicePtr
		for range 4 {
			a = append(a, simtest.Alloc(t, b, 0, 4*n))
		}
		simtest.Upload(t, b, a[0], simtest.Ramp(n, 1))
		return a
	}
	want := simtest.Ramp(n, 1)
	for i := range want {
		for range k {
			want[i] = 0.5*want[i] + 1
		}
	}
	st := deviceOnChain(t, b, k, s, alloc(), tables)
	// The first slot now names no node.
	if err := b.MemcpyHtoD(st.rig.mem.Slots, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	moved := alloc()
	if _, err := st.Run(ctx, s, moved); err != nil {
		t.Fatal(err)
	}
	if err := b.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
	launches := st.Counters().GraphLaunches
	_, err := st.Run(ctx, s, alloc())
	if !errors.Is(err, gpu.ErrIllegalState) || !strings.Contains(err.Error(), "could not apply 1 pointer updates") {
		t.Fatalf("the step after a refused update: %v", err)
	}
	if st.Counters().GraphLaunches != launches {
		t.Error("the failed step launched")
	}
	again := alloc()
	if _, err := st.Run(ctx, s, again); err != nil {
		t.Fatal(err)
	}
	if err := b.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
	if got := simtest.Download(t, b, again[1], n); !slices.Equal(got, want) {
		t.Errorf("after recording afresh: y = %v, want %v", got[:4], want[:4])
	}
	// The failed step dropped the graph: recorded again for a retry.
	if c := st.Counters(); c.Rerecords != 1 || c.RetryRerecords != 1 {
		t.Errorf("counters %+v, want one re-record, for a retry", c)
	}
}

// BenchmarkDeviceHostStep is the host side of a device step on a chain of
// 1000 kernels whose every pointer moves (chain-moving): the table written
// and the launch call, which does nothing here. Run with -benchmem: it
// allocates nothing.
func BenchmarkDeviceHostStep(bm *testing.B) {
	b := simtest.New(bm, 1)
	s := simtest.Stream(bm, b, 0)
	first := []gpu.DevicePtr{simtest.Alloc(bm, b, 0, 256), simtest.Alloc(bm, b, 0, 256), simtest.Alloc(bm, b, 0, 256), simtest.Alloc(bm, b, 0, 256)}
	st := deviceOnChain(bm, b, 1000, s, first, true)
	st.b = &noLaunch{Backend: b}
	sets := [2][]gpu.DevicePtr{{1 << 40, 2 << 40, 3 << 40, 4 << 40}, {5 << 40, 6 << 40, 7 << 40, 8 << 40}}
	ctx := context.Background()
	bm.ReportAllocs()
	i := 0
	for bm.Loop() {
		if _, err := st.Run(ctx, s, sets[i%2]); err != nil {
			bm.Fatal(err)
		}
		i++
		st.rig.host.Store64(0, st.rig.launches)
	}
}

// BenchmarkDeviceStep is a whole device step on the sim (simulated device
// work included; not a GPU figure), chain of 100 kernels, every pointer
// moving, a synchronization every 8 steps.
func BenchmarkDeviceStep(bm *testing.B) {
	b := simtest.New(bm, 1)
	s := simtest.Stream(bm, b, 0)
	var sets [2][]gpu.DevicePtr
	for j := range sets {
		for range 4 {
			sets[j] = append(sets[j], simtest.Alloc(bm, b, 0, 256))
		}
	}
	st := deviceOnChain(bm, b, 100, s, sets[0], true)
	ctx := context.Background()
	bm.ReportAllocs()
	i := 0
	for bm.Loop() {
		i++
		if _, err := st.Run(ctx, s, sets[i%2]); err != nil {
			bm.Fatal(err)
		}
		if i%8 == 0 {
			if err := b.StreamSynchronize(s); err != nil {
				bm.Fatal(err)
			}
		}
	}
	if err := b.StreamSynchronize(s); err != nil {
		bm.Fatal(err)
	}
}
