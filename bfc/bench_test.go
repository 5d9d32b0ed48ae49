package bfc

import (
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
)

// BenchmarkAllocFree measures one Alloc plus one Free.
//
//   - pair: allocate and free the same size from an empty allocator, the
//     best case (one split, one merge, a one-entry index).
//   - churn/N: N allocations of random sizes (256 B to 1 MiB) stay live; each
//     iteration frees a random one and allocates a new one, so the free
//     index holds many fragments, as in a framework's steady state.
func BenchmarkAllocFree(b *testing.B) {
	b.Run("pair", func(b *testing.B) {
		a := newAlloc(b, 1<<30, Options{})
		b.ReportAllocs()
		for b.Loop() {
			p, err := a.Alloc(4096)
			if err != nil {
				b.Fatal(err)
			}
			if err := a.Free(p); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, n := range []int{64, 1024, 8192} {
		b.Run("churn/"+strconv.Itoa(n), func(b *testing.B) {
			// 1 MiB per live allocation against a mean request of about
			// 160 KiB: requests never fail, fragmentation still builds up.
			a := newAlloc(b, uint64(n)<<20, Options{})
			r := rand.New(rand.NewPCG(3, 4))
			size := func() uint64 { return 256 << r.IntN(13) }
			live := make([]gpu.DevicePtr, 0, n)
			for len(live) < n {
				p, err := a.Alloc(size())
				if err != nil {
					b.Fatal(err)
				}
				live = append(live, p)
			}
			b.ReportAllocs()
			for b.Loop() {
				i := r.IntN(len(live))
				if err := a.Free(live[i]); err != nil {
					b.Fatal(err)
				}
				p, err := a.Alloc(size())
				if err != nil {
					b.Fatal(err)
				}
				live[i] = p
			}
			b.ReportMetric(float64(a.Stats().FreeChunks), "fragments")
		})
	}
}
