package graph

import (
	"errors"
	"slices"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
)

// TestExtendPatchesOnlyCopies wraps a body over buffers 0 (a persistent
// param copy) and 1 (a state) in a copy-in from buffer 2 (the caller's
// param) and a copy-out of 0 into buffer 3 (the caller's output): when
// only the caller's buffers move, only the two copy nodes are patched.
func TestExtendPatchesOnlyCopies(t *testing.T) {
	body := []Command{
		{Name: "k0", Kind: KindKernel, Func: 1, Args: []Arg{ptrArg(0, 0), ptrArg(1, 0)}},
		{Name: "k1", Kind: KindKernel, Func: 1, Args: []Arg{ptrArg(0, 0), {Value: gpu.I32(3)}}},
	}
	cb, err := New(0, 2, body, nil)
	if err != nil {
		t.Fatal(err)
	}
	pre := []Command{{Name: "copy in", Kind: KindMemcpy, Dst: Ref{Buf: 0}, Src: Ref{Buf: 2}, Size: 64}}
	post := []Command{{Name: "copy out", Kind: KindMemcpy, Dst: Ref{Buf: 3}, Src: Ref{Buf: 0}, Size: 64}}
	ext, err := cb.Extend(4, pre, post)
	if err != nil {
		t.Fatal(err)
	}
	if ext.Len() != 4 || cb.Len() != 2 {
		t.Fatalf("extended %d commands, original %d", ext.Len(), cb.Len())
	}
	old := []gpu.DevicePtr{0x1000, 0x2000, 0x3000, 0x4000}
	x := execFor(ext, old)
	next := slices.Clone(old)
	next[2], next[3] = 0x5000, 0x6000
	r := newPatchRecorder()
	n, err := ext.Patch(r, x, next)
	if err != nil || n != 2 || len(r.kernels) != 0 {
		t.Fatalf("patched %d nodes (%d kernels), %v; want the 2 copies only", n, len(r.kernels), err)
	}
	if in, out := r.memcpys[1], r.memcpys[4]; in.Src != 0x5000 || in.Dst != 0x1000 || out.Dst != 0x6000 || out.Src != 0x1000 {
		t.Errorf("copy in %+v, copy out %+v", in, out)
	}
	if _, err := cb.Extend(1, nil, nil); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("Extend to fewer buffers: %v", err)
	}
	if _, err := cb.Extend(2, []Command{{Name: "bad", Kind: KindMemcpy, Dst: Ref{Buf: 5}}}, nil); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("Extend with a copy out of range: %v", err)
	}
}

func TestUsers(t *testing.T) {
	cmds := []Command{
		{Name: "k0", Kind: KindKernel, Func: 1, Args: []Arg{ptrArg(0, 0), ptrArg(1, 0)}},
		{Name: "k1", Kind: KindKernel, Func: 1, Args: []Arg{ptrArg(1, 0)}},
		{Name: "cp", Kind: KindMemcpy, Dst: Ref{Buf: 2}, Src: Ref{Buf: 0}, Size: 8},
	}
	cb, err := New(0, 3, cmds, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		bufs  []int
		nodes int
	}{{[]int{0}, 2}, {[]int{1}, 2}, {[]int{0, 1}, 3}, {[]int{2, 0}, 2}, {nil, 0}, {[]int{7, -1}, 0}} {
		if n, tr := cb.Users(c.bufs); n != c.nodes || tr != 0 {
			t.Errorf("Users(%v) = %d, %d; want %d, 0", c.bufs, n, tr, c.nodes)
		}
	}
}
