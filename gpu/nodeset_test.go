package gpu_test

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
)

// execSetter records the exec updates a generic node set makes.
type execSetter struct {
	got  []gpu.KernelParams
	fail int // fail the call with this index (-1: none)
}

func (e *execSetter) GraphExecKernelNodeSetParams(_ gpu.GraphExec, _ gpu.GraphNode, p gpu.KernelParams) error {
	if len(e.got) == e.fail {
		return &gpu.UpdateError{Op: "test", Result: gpu.UpdateParametersChanged}
	}
	e.got = append(e.got, p)
	return nil
}

// TestGenericNodeSet: without the backend's own sets, PrepareKernelNodes
// keeps copies of the parameters (a caller's later change of its slices
// does not reach them), SetWord writes only 8-byte words of pointers and
// opaque arguments, SetArgs keeps the kinds, Apply sets the nodes asked
// for in order and says how many it set before a failure, and ApplyGraph
// needs a GraphNodeSetter.
func TestGenericNodeSet(t *testing.T) {
	raw := make([]byte, 24)
	args := []gpu.Arg{gpu.Ptr(0x1000), gpu.F32(2), gpu.Bytes(raw), gpu.I32(7)}
	e := &execSetter{fail: -1}
	set, err := gpu.PrepareKernelNodes(e, 1, []gpu.GraphNode{10, 11}, []gpu.KernelParams{{Func: 5, Args: args}, {Func: 6, Args: args}})
	if err != nil {
		t.Fatal(err)
	}
	args[0] = gpu.Ptr(0xdead) // the set holds its own copy
	if set.Len() != 2 {
		t.Fatalf("Len = %d", set.Len())
	}
	for _, c := range []struct {
		i, arg, off int
		ok          bool
	}{
		{0, 0, 0, true}, {0, 2, 16, true}, {0, 2, 3, true},
		{0, 0, 4, false}, {0, 1, 0, false}, {0, 3, 0, false}, {0, 2, 17, false}, {0, 4, 0, false}, {2, 0, 0, false}, {-1, 0, 0, false},
	} {
		err := set.SetWord(c.i, c.arg, c.off, 0x2000)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, gpu.ErrInvalidValue)) {
			t.Errorf("SetWord(%d, %d, %d): %v, want ok=%v", c.i, c.arg, c.off, err, c.ok)
		}
	}
	if n, err := set.Apply([]int32{1, 0}); err != nil || n != 2 {
		t.Fatalf("Apply = %d, %v", n, err)
	}
	if len(e.got) != 2 || e.got[0].Func != 6 || e.got[1].Func != 5 {
		t.Fatalf("applied %+v", e.got)
	}
	n0 := e.got[1]
	if n0.Args[0].AsPtr() != 0x2000 || n0.Args[1].AsF32() != 2 || n0.Args[3].AsI32() != 7 ||
		binary.LittleEndian.Uint64(n0.Args[2].Raw[16:]) != 0x2000 || binary.LittleEndian.Uint64(n0.Args[2].Raw[3:]) != 0x2000 {
		t.Errorf("node 0 was set with %v", n0.Args)
	}
	if e.got[0].Args[0].AsPtr() != 0x1000 {
		t.Errorf("node 1 was set with %v; its words were not written", e.got[0].Args)
	}
	if err := set.SetArgs(0, []gpu.Arg{gpu.Ptr(1), gpu.F32(1), gpu.Bytes(raw), gpu.F32(7)}); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("SetArgs of another kind: %v", err)
	}
	if err := set.SetArgs(0, []gpu.Arg{gpu.Ptr(0x3000), gpu.F32(1), gpu.Bytes(raw[:8]), gpu.I32(1)}); err != nil {
		t.Errorf("SetArgs: %v", err)
	}
	e.got, e.fail = nil, 1
	n, err := set.Apply([]int32{0, 1, 0})
	if n != 1 || !errors.Is(err, gpu.ErrGraphUpdate) || e.got[0].Args[0].AsPtr() != 0x3000 {
		t.Errorf("Apply failing at its second node: %d, %v (set %v)", n, err, e.got)
	}
	e.fail = -1
	if n, err := set.Apply([]int32{0, 2}); n != 0 || !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("Apply of a node out of range: %d, %v", n, err)
	}
	if _, err := set.ApplyGraph([]int32{0}); !errors.Is(err, gpu.ErrNotSupported) {
		t.Errorf("ApplyGraph without a GraphNodeSetter: %v", err)
	}
	if _, err := gpu.PrepareKernelNodes(e, 1, []gpu.GraphNode{10}, nil); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("one node and no parameters: %v", err)
	}
	if err := set.Close(); err != nil {
		t.Error(err)
	}
}

// TestGenericNodeSetWords: the generic set lends the word of a typed
// pointer argument, and a write through it is what the next Apply sets;
// an opaque argument's bytes, a 4-byte argument and anything out of range
// lend none.
func TestGenericNodeSetWords(t *testing.T) {
	args := []gpu.Arg{gpu.Ptr(0x1000), gpu.F32(2), gpu.Bytes(make([]byte, 16))}
	e := &execSetter{fail: -1}
	set, err := gpu.PrepareKernelNodes(e, 1, []gpu.GraphNode{10, 11}, []gpu.KernelParams{{Func: 5, Args: args}, {Func: 6, Args: args}})
	if err != nil {
		t.Fatal(err)
	}
	words, ok := set.(gpu.KernelNodeWords)
	if !ok {
		t.Fatal("the generic set lends no words")
	}
	w, err := words.Word(1, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	*w = 0x4000
	if n, err := set.Apply([]int32{1, 0}); err != nil || n != 2 {
		t.Fatalf("Apply = %d, %v", n, err)
	}
	if e.got[0].Args[0].AsPtr() != 0x4000 || e.got[1].Args[0].AsPtr() != 0x1000 {
		t.Errorf("after a write through node 1's word, Apply set %v and %v", e.got[0].Args[0], e.got[1].Args[0])
	}
	for _, c := range []struct{ i, arg, off int }{{0, 1, 0}, {0, 2, 0}, {0, 0, 8}, {0, 3, 0}, {2, 0, 0}, {-1, 0, 0}} {
		if w, err := words.Word(c.i, c.arg, c.off); w != nil || !errors.Is(err, gpu.ErrInvalidValue) {
			t.Errorf("Word(%d, %d, %d) = %v, %v; want ErrInvalidValue", c.i, c.arg, c.off, w, err)
		}
	}
}
