package cuda

import (
	"errors"
	"sync"
	"testing"
	"unsafe"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
	"github.com/stablegraph/stablegraph/kernels"
)

// setStub is the stub driver with the parameters of every kernel node
// update (exec or graph) it receives kept: function and argument words.
type setStub struct {
	*stubDriver
	mu      sync.Mutex
	updates []setCall
	fail    cu.Result // the result of the next update, once
}

type setCall struct {
	name  string
	node  uintptr
	fn    cu.Function
	words [3]uint64 // the fill kernel's (ptr, f32, i32)
}

func (s *setStub) call(name string, a cu.StubArgs) cu.Result {
	switch name {
	case "cuGraphExecKernelNodeSetParams_v2", "cuGraphKernelNodeSetParams_v2":
		s.stubDriver.call(name, a)
		p := out[cu.KernelNodeParams](&a, 1)
		node := a.A[0]
		if name == "cuGraphExecKernelNodeSetParams_v2" {
			p, node = out[cu.KernelNodeParams](&a, 2), a.A[1]
		}
		c := setCall{name: name, node: node, fn: p.Func}
		ptrs := unsafe.Slice((*unsafe.Pointer)(p.KernelParams), 3)
		for i := range c.words {
			c.words[i] = *(*uint64)(ptrs[i])
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.updates = append(s.updates, c)
		if r := s.fail; r != cu.Success {
			s.fail = cu.Success
			return r
		}
		return cu.Success
	}
	return s.stubDriver.call(name, a)
}

// TestStubKernelNodeSet: a prepared set checks its nodes and arguments at
// preparation, not at Apply; Apply makes the context current once and one
// driver call per node, with the arguments packed then and only the words
// written since changed; ApplyGraph sets the graph's nodes; a dead exec or
// graph is refused before the driver is called, and a driver refusal names
// the entry point.
func TestStubKernelNodeSet(t *testing.T) {
	sd := &setStub{stubDriver: newStubDriver()}
	b, err := openDriver(cu.NewStub("stub-libcuda", sd.call), resolveOptions(Config{}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	}()
	m, err := b.ModuleLoad(0, kernels.Module())
	if err != nil {
		t.Fatal(err)
	}
	defer b.ModuleUnload(m)
	f, _ := b.ModuleFunction(m, kernels.Fill)
	fill := gpu.KernelParams{Func: f, Config: kernels.Elementwise(256), Args: []gpu.Arg{gpu.Ptr(0x1000), gpu.F32(1.5), gpu.I32(256)}}
	g, _ := b.GraphCreate(0)
	n0, _ := b.GraphAddKernelNode(g, nil, fill)
	n1, _ := b.GraphAddKernelNode(g, []gpu.GraphNode{n0}, fill)
	mn, _ := b.GraphAddMemcpyNode(g, []gpu.GraphNode{n1}, gpu.MemcpyParams{Dst: 0x1000, Src: 0x2000, Size: 64})
	x, err := b.GraphInstantiate(g)
	if err != nil {
		t.Fatal(err)
	}
	bad := fill
	bad.Args = fill.Args[:2]
	for _, c := range []struct {
		nodes  []gpu.GraphNode
		params []gpu.KernelParams
		want   error
	}{
		{[]gpu.GraphNode{mn}, []gpu.KernelParams{fill}, gpu.ErrInvalidValue},
		{[]gpu.GraphNode{n0}, []gpu.KernelParams{bad}, gpu.ErrInvalidValue},
		{[]gpu.GraphNode{0xbad}, []gpu.KernelParams{fill}, gpu.ErrInvalidHandle},
		{[]gpu.GraphNode{n0, n1}, []gpu.KernelParams{fill}, gpu.ErrInvalidValue},
	} {
		if _, err := b.PrepareKernelNodes(x, c.nodes, c.params); !errors.Is(err, c.want) {
			t.Errorf("PrepareKernelNodes(%v): %v, want %v", c.nodes, err, c.want)
		}
	}
	set, err := gpu.PrepareKernelNodes(b, x, []gpu.GraphNode{n0, n1}, []gpu.KernelParams{fill, fill})
	if err != nil {
		t.Fatal(err)
	}
	// Node 1's pointer written through the word the set lends, as Patch
	// writes it: the same as SetWord.
	w, err := set.(gpu.KernelNodeWords).Word(1, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	*w = 0x3000
	for _, c := range []struct{ i, arg, off int }{{1, 1, 0}, {1, 0, 8}, {1, 3, 0}, {2, 0, 0}} {
		if w, err := set.(gpu.KernelNodeWords).Word(c.i, c.arg, c.off); w != nil || !errors.Is(err, gpu.ErrInvalidValue) {
			t.Errorf("Word(%d, %d, %d) = %v, %v; want ErrInvalidValue", c.i, c.arg, c.off, w, err)
		}
	}
	if err := set.SetWord(1, 1, 0, 1); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("SetWord of a 4-byte argument: %v", err)
	}
	sd.startCounting()
	if n, err := set.Apply([]int32{1, 0}); n != 2 || err != nil {
		t.Fatalf("Apply = %d, %v", n, err)
	}
	if c := sd.callCount("cuCtxGetCurrent"); c != 1 {
		t.Errorf("the context was made current %d times for one Apply", c)
	}
	fi, _ := b.funcInfo("test", f)
	want := []setCall{
		{"cuGraphExecKernelNodeSetParams_v2", uintptr(b.mu.nodes[n1].n), fi.f, [3]uint64{0x3000, 0x3fc00000, 256}},
		{"cuGraphExecKernelNodeSetParams_v2", uintptr(b.mu.nodes[n0].n), fi.f, [3]uint64{0x1000, 0x3fc00000, 256}},
	}
	if len(sd.updates) != 2 || sd.updates[0] != want[0] || sd.updates[1] != want[1] {
		t.Errorf("the driver got %+v, want %+v", sd.updates, want)
	}
	sd.updates = nil
	if n, err := set.ApplyGraph([]int32{1}); n != 1 || err != nil || len(sd.updates) != 1 ||
		sd.updates[0].name != "cuGraphKernelNodeSetParams_v2" || sd.updates[0].words[0] != 0x3000 {
		t.Errorf("ApplyGraph = %d, %v; the driver got %+v", n, err, sd.updates)
	}
	sd.updates, sd.fail = nil, cu.ErrorLaunchFailed
	if n, err := set.Apply([]int32{0, 1}); n != 0 || err == nil || len(sd.updates) != 1 {
		t.Errorf("Apply with the driver failing the first update: %d, %v (%d calls)", n, err, len(sd.updates))
	} else if ge := (*gpu.Error)(nil); !errors.As(err, &ge) || ge.Op != "cuGraphExecKernelNodeSetParams_v2" {
		t.Errorf("the failure does not name the entry point: %v", err)
	}
	if n, err := set.Apply([]int32{2}); n != 0 || !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("Apply of a node out of range: %d, %v", n, err)
	}
	if err := b.GraphExecDestroy(x); err != nil {
		t.Fatal(err)
	}
	sd.updates = nil
	if _, err := set.Apply([]int32{0}); !errors.Is(err, gpu.ErrInvalidHandle) || len(sd.updates) != 0 {
		t.Errorf("Apply on a destroyed exec: %v, %d driver calls", err, len(sd.updates))
	}
	if err := set.Close(); err != nil {
		t.Error(err)
	}
	if err := b.GraphDestroy(g); err != nil {
		t.Fatal(err)
	}
}
