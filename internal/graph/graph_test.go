package graph

import (
	"errors"
	"slices"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
)

// patchRecorder is an ExecPatcher that records the node updates it gets.
type patchRecorder struct {
	kernels  map[gpu.GraphNode]gpu.KernelParams
	memcpys  map[gpu.GraphNode]gpu.MemcpyParams
	memsets  map[gpu.GraphNode]gpu.Memset
	children int
	fail     error
}

func newPatchRecorder() *patchRecorder {
	return &patchRecorder{kernels: map[gpu.GraphNode]gpu.KernelParams{}, memcpys: map[gpu.GraphNode]gpu.MemcpyParams{},
		memsets: map[gpu.GraphNode]gpu.Memset{}}
}

func (r *patchRecorder) GraphExecKernelNodeSetParams(_ gpu.GraphExec, n gpu.GraphNode, p gpu.KernelParams) error {
	p.Args = slices.Clone(p.Args) // backends copy parameters at the call
	r.kernels[n] = p
	return r.fail
}
func (r *patchRecorder) GraphExecMemcpyNodeSetParams(_ gpu.GraphExec, n gpu.GraphNode, p gpu.MemcpyParams) error {
	r.memcpys[n] = p
	return r.fail
}
func (r *patchRecorder) GraphExecMemsetNodeSetParams(_ gpu.GraphExec, n gpu.GraphNode, p gpu.Memset) error {
	r.memsets[n] = p
	return r.fail
}
func (r *patchRecorder) GraphExecChildGraphNodeSetParams(gpu.GraphExec, gpu.GraphNode, gpu.Graph) error {
	r.children++
	return r.fail
}

// execFor makes an Exec as Instantiate would, without a device: node i is
// GraphNode(i+1).
func execFor(cb *CommandBuffer, addrs []gpu.DevicePtr) *Exec {
	nodes := make([]gpu.GraphNode, cb.Len())
	for i := range nodes {
		nodes[i] = gpu.GraphNode(i + 1)
	}
	return &Exec{Nodes: nodes, X: 1, addrs: slices.Clone(addrs), mark: make([]uint32, cb.Len())}
}

func ptrArg(buf int, off uint64) Arg {
	return Arg{Value: gpu.Arg{Kind: gpu.ArgPtr}, Ref: Ref{Buf: buf, Off: off}}
}

// TestPatchRewritesOnlyMovedPointers: buffers 0 and 1 move, 2 does not.
// Only commands that reference a moved buffer are updated; their pointers
// are resolved at the new addresses and their scalars, even one equal to an
// old address, are the program's.
func TestPatchRewritesOnlyMovedPointers(t *testing.T) {
	old := []gpu.DevicePtr{0x1000, 0x2000, 0x3000}
	cmds := []Command{
		{Name: "k0", Kind: KindKernel, Func: 1, Args: []Arg{ptrArg(0, 16), {Value: gpu.U64(0x1000)}, ptrArg(2, 0)}},
		{Name: "k1", Kind: KindKernel, Func: 1, Args: []Arg{ptrArg(2, 0), {Value: gpu.U64(0x2000)}}},
		{Name: "cp", Kind: KindMemcpy, Dst: Ref{Buf: 1, Off: 8}, Src: Ref{Buf: 2}, Size: 64},
		{Name: "ms", Kind: KindMemset, Dst: Ref{Buf: 0}, Value: 7, ElemSize: 4, Count: 4},
		{Name: "k2", Kind: KindKernel, Func: 1, Args: []Arg{ptrArg(1, 0), ptrArg(1, 4)}},
	}
	cb, err := New(0, 3, cmds, nil)
	if err != nil {
		t.Fatal(err)
	}
	x := execFor(cb, old)
	next := []gpu.DevicePtr{0x5000, 0x6000, 0x3000}
	if !cb.Moved(old, next) || cb.Moved(old, old) {
		t.Fatal("Moved is wrong")
	}
	r := newPatchRecorder()
	first := r
	n, err := cb.Patch(r, x, next)
	if err != nil {
		t.Fatal(err)
	}
	if n != 4 || len(r.kernels) != 2 || len(r.memcpys) != 1 || len(r.memsets) != 1 {
		t.Fatalf("patched %d nodes: kernels %v memcpys %v memsets %v", n, r.kernels, r.memcpys, r.memsets)
	}
	if _, ok := r.kernels[2]; ok {
		t.Fatal("k1 references no moved buffer but was patched")
	}
	k0 := r.kernels[1].Args
	if k0[0].AsPtr() != 0x5010 || k0[1].Kind != gpu.ArgU64 || k0[1].AsU64() != 0x1000 || k0[2].AsPtr() != 0x3000 {
		t.Errorf("k0 args %v", k0)
	}
	if k2 := r.kernels[5].Args; k2[0].AsPtr() != 0x6000 || k2[1].AsPtr() != 0x6004 {
		t.Errorf("k2 args %v", k2)
	}
	if cp := r.memcpys[3]; cp.Dst != 0x6008 || cp.Src != 0x3000 || cp.Size != 64 {
		t.Errorf("memcpy %+v", cp)
	}
	if ms := r.memsets[4]; ms.Dst != 0x5000 || ms.Value != 7 || ms.Count != 4 {
		t.Errorf("memset %+v", ms)
	}
	if !slices.Equal(x.Addrs(), next) {
		t.Errorf("exec addresses %v, want %v", x.Addrs(), next)
	}
	// Nothing moved: nothing patched.
	r = newPatchRecorder()
	if n, err := cb.Patch(r, x, next); err != nil || n != 0 || len(r.kernels) != 0 {
		t.Fatalf("second patch: %d nodes, %v", n, err)
	}
	// Only buffer 2 moves: the nodes keep the pointers into 0 and 1 that
	// the last patch set (a step writes only the moved pointer words).
	next = []gpu.DevicePtr{0x5000, 0x6000, 0x7000}
	// The exec's prepared node set calls the recorder it was prepared
	// with: the same one, emptied.
	r = first
	clear(r.kernels)
	clear(r.memcpys)
	clear(r.memsets)
	if n, err := cb.Patch(r, x, next); err != nil || n != 3 {
		t.Fatalf("third patch: %d nodes, %v", n, err)
	}
	if k0 := r.kernels[1].Args; k0[0].AsPtr() != 0x5010 || k0[1].AsU64() != 0x1000 || k0[2].AsPtr() != 0x7000 {
		t.Errorf("k0 args after buffer 2 moved: %v", k0)
	}
	if k1 := r.kernels[2].Args; k1[0].AsPtr() != 0x7000 || k1[1].AsU64() != 0x2000 {
		t.Errorf("k1 args after buffer 2 moved: %v", k1)
	}
	if cp := r.memcpys[3]; cp.Dst != 0x6008 || cp.Src != 0x7000 {
		t.Errorf("memcpy after buffer 2 moved: %+v", cp)
	}
	// A refused update is reported and the exec's addresses are not
	// advanced.
	r.fail = &gpu.UpdateError{Op: "test", Result: gpu.UpdateNotSupported}
	if _, err := cb.Patch(r, x, old); !errors.Is(err, gpu.ErrGraphUpdate) {
		t.Fatalf("err = %v", err)
	}
	if !slices.Equal(x.Addrs(), next) {
		t.Error("a failed patch advanced the exec's addresses")
	}
}

func TestPatchGenerationWrap(t *testing.T) {
	cmds := []Command{{Name: "k", Kind: KindKernel, Func: 1, Args: []Arg{ptrArg(0, 0), ptrArg(0, 8)}}}
	cb, err := New(0, 1, cmds, nil)
	if err != nil {
		t.Fatal(err)
	}
	x := execFor(cb, []gpu.DevicePtr{0x1000})
	x.gen = ^uint32(0)
	x.mark[0] = 1 // stale: would collide with the wrapped generation
	r := newPatchRecorder()
	if n, err := cb.Patch(r, x, []gpu.DevicePtr{0x2000}); err != nil || n != 1 {
		t.Fatalf("patched %d, %v; want 1", n, err)
	}
}

func TestNewRejectsBadCommands(t *testing.T) {
	for _, c := range []Command{
		{Name: "out of range", Kind: KindKernel, Args: []Arg{ptrArg(3, 0)}},
		{Name: "traced without tracer", Kind: KindTraced},
		{Name: "no kind"},
	} {
		if _, err := New(0, 2, []Command{c}, nil); !errors.Is(err, gpu.ErrInvalidValue) {
			t.Errorf("%s: err = %v", c.Name, err)
		}
	}
}

// BenchmarkPatch measures the host side of patch-table application: a step
// of 1000 kernels, each reading a param that ping-pongs between two
// addresses and a fixed state, every node rebuilt and handed to a no-op
// backend. Divide by 1000 for the cost per node.
func BenchmarkPatch(b *testing.B) {
	for _, k := range []int{10, 1000} {
		b.Run(map[int]string{10: "nodes=10", 1000: "nodes=1000"}[k], func(b *testing.B) {
			cmds := make([]Command, k)
			for i := range cmds {
				cmds[i] = Command{Name: "k", Kind: KindKernel, Func: 1, Args: []Arg{
					ptrArg(i%8, 0), ptrArg(8, uint64(i)*64), {Value: gpu.F32(1)}, {Value: gpu.I32(256)},
				}}
			}
			cb, err := New(0, 9, cmds, nil)
			if err != nil {
				b.Fatal(err)
			}
			sets := [2][]gpu.DevicePtr{make([]gpu.DevicePtr, 9), make([]gpu.DevicePtr, 9)}
			for i := range 9 {
				sets[0][i] = gpu.DevicePtr(0x7f0000000000 + i<<20)
				sets[1][i] = gpu.DevicePtr(0x7f0010000000 + i<<20)
			}
			sets[1][8] = sets[0][8] // the state does not move
			x := execFor(cb, sets[0])
			var r noopPatcher
			for i := 1; b.Loop(); i++ {
				if n, err := cb.Patch(r, x, sets[i%2]); err != nil || n != k {
					b.Fatalf("patched %d, %v", n, err)
				}
			}
		})
	}
}

type noopPatcher struct{}

func (noopPatcher) GraphExecKernelNodeSetParams(gpu.GraphExec, gpu.GraphNode, gpu.KernelParams) error {
	return nil
}
func (noopPatcher) GraphExecMemcpyNodeSetParams(gpu.GraphExec, gpu.GraphNode, gpu.MemcpyParams) error {
	return nil
}
func (noopPatcher) GraphExecMemsetNodeSetParams(gpu.GraphExec, gpu.GraphNode, gpu.Memset) error {
	return nil
}
func (noopPatcher) GraphExecChildGraphNodeSetParams(gpu.GraphExec, gpu.GraphNode, gpu.Graph) error {
	return nil
}

// wordlessSets is a recorder whose node sets lend no words
// (gpu.KernelNodeWords): Patch then writes through SetWord.
type wordlessSets struct {
	*patchRecorder
	setWords int
}

type wordlessSet struct {
	gpu.KernelNodeSet
	r *wordlessSets
}

func (s wordlessSet) SetWord(i, arg, off int, v uint64) error {
	s.r.setWords++
	return s.KernelNodeSet.SetWord(i, arg, off, v)
}

func (r *wordlessSets) PrepareKernelNodes(x gpu.GraphExec, nodes []gpu.GraphNode, params []gpu.KernelParams) (gpu.KernelNodeSet, error) {
	set, err := gpu.PrepareKernelNodes(r.patchRecorder, x, nodes, params)
	return wordlessSet{set, r}, err
}

// TestPatchWithoutLentWords: over node sets that lend no words, Patch
// writes the moved pointers with SetWord, one call per moved word, and
// the nodes get what they get from sets that lend them.
func TestPatchWithoutLentWords(t *testing.T) {
	old := []gpu.DevicePtr{0x1000, 0x2000, 0x3000}
	cmds := []Command{
		{Name: "k0", Kind: KindKernel, Func: 1, Args: []Arg{ptrArg(0, 16), {Value: gpu.U64(0x1000)}, ptrArg(2, 0)}},
		{Name: "k1", Kind: KindKernel, Func: 1, Args: []Arg{ptrArg(2, 0), ptrArg(1, 8), ptrArg(2, 4)}},
	}
	cb, err := New(0, 3, cmds, nil)
	if err != nil {
		t.Fatal(err)
	}
	x := execFor(cb, old)
	r := &wordlessSets{patchRecorder: newPatchRecorder()}
	if n, err := cb.Patch(r, x, []gpu.DevicePtr{0x5000, 0x2000, 0x7000}); err != nil || n != 2 {
		t.Fatalf("Patch = %d, %v", n, err)
	}
	if r.setWords != 4 {
		t.Errorf("%d SetWord calls; want 4 (k0's pointer into 0 and into 2, k1's two into 2)", r.setWords)
	}
	k0, k1 := r.kernels[1].Args, r.kernels[2].Args
	if k0[0].AsPtr() != 0x5010 || k0[1].AsU64() != 0x1000 || k0[2].AsPtr() != 0x7000 {
		t.Errorf("k0 args %v", k0)
	}
	if k1[0].AsPtr() != 0x7000 || k1[1].AsPtr() != 0x2008 || k1[2].AsPtr() != 0x7004 {
		t.Errorf("k1 args %v", k1)
	}
}

// TestFixSkipsFixedBuffers: once buffer 2 is fixed, a step in which only
// its address differs is no move, and a move of buffer 0 patches the
// commands over buffer 0 alone; an index out of range is ignored.
func TestFixSkipsFixedBuffers(t *testing.T) {
	old := []gpu.DevicePtr{0x1000, 0x2000, 0x3000}
	cmds := []Command{
		{Name: "k0", Kind: KindKernel, Func: 1, Args: []Arg{ptrArg(0, 0), ptrArg(2, 0)}},
		{Name: "k1", Kind: KindKernel, Func: 1, Args: []Arg{ptrArg(2, 0)}},
		{Name: "k2", Kind: KindKernel, Func: 1, Args: []Arg{ptrArg(1, 0)}},
	}
	cb, err := New(0, 3, cmds, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !cb.Moved(old, []gpu.DevicePtr{0x1000, 0x2000, 0x9000}) {
		t.Fatal("before Fix, buffer 2's move is not seen")
	}
	cb.Fix([]int{2, 7, -1})
	if cb.Moved(old, []gpu.DevicePtr{0x1000, 0x2000, 0x9000}) {
		t.Error("a fixed buffer's address counts as a move")
	}
	next := []gpu.DevicePtr{0x5000, 0x2000, 0x9000}
	if !cb.Moved(old, next) {
		t.Fatal("buffer 0's move is not seen")
	}
	r := newPatchRecorder()
	n, err := cb.Patch(r, execFor(cb, old), next)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.kernels[2]; n != 1 || ok {
		t.Errorf("patched %d nodes (%v); want k0 alone", n, r.kernels)
	}
}
