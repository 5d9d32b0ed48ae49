package replay

import (
	"fmt"
	"testing"

	"github.com/stablegraph/stablegraph/internal/graph"
	"github.com/stablegraph/stablegraph/internal/simtest"
)

// copySpec1 is the spec of a one-command step: output y (buffer 1) is a
// copy of param x (buffer 0), both of size bytes.
func copySpec1(t testing.TB, size int64, opts Options) Spec {
	t.Helper()
	b := simtest.New(t, 1)
	cb, err := graph.New(0, 2, []graph.Command{{Name: "copy", Kind: graph.KindMemcpy,
		Dst: graph.Ref{Buf: 1}, Src: graph.Ref{Buf: 0}, Size: uint64(size)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return Spec{Program: "copy", Backend: b, Ordinal: 0, Commands: cb, Options: opts, Alignment: 256,
		Buffers: []Buffer{
			{Name: "x", Class: Param, Size: size, Flow: Flow{ReadFirst: true}},
			{Name: "y", Class: Output, Size: size, Flow: Flow{Written: true, Full: true}},
		}}
}

// BenchmarkSlotAcquireRelease measures the host side of taking a pool slot
// and handing it back: Acquire (the least recently used slot not leased,
// its timeline point checked without synchronising), a zero-copy lease
// taken and released, as a step does around its launch. The device work
// is not included (see BenchmarkStep and BenchmarkPoolStep for that).
func BenchmarkSlotAcquireRelease(b *testing.B) {
	for n := 1; n <= 3; n++ {
		b.Run(fmt.Sprintf("slots=%d", n), func(b *testing.B) {
			st, err := New(Pool, copySpec1(b, 256, Options{Pool: PoolOptions{Slots: n, ZeroCopyOutputs: true}}))
			if err != nil {
				b.Fatal(err)
			}
			defer func() {
				if err := st.Close(); err != nil {
					b.Error(err)
				}
			}()
			pl := st.(*pool)
			for b.Loop() {
				if pl.Acquire() != nil {
					b.Fatal("no slot ready")
				}
				slot := pl.next
				pl.next = nil
				pl.uses++
				slot.used = pl.uses
				pl.leases.Lock()
				slot.leased = true
				pl.leases.Unlock()
				l := &lease{p: pl, slot: slot}
				l.Release()
			}
		})
	}
}
