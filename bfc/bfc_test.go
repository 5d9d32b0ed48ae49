package bfc

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
)

const (
	testBase = gpu.DevicePtr(1 << 40)
	u        = 256 // one alignment unit at the default alignment
)

func newAlloc(t testing.TB, size uint64, opts Options) *Allocator {
	t.Helper()
	a, err := New(testBase, size, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return a
}

func mustCheck(t testing.TB, a *Allocator) {
	t.Helper()
	if err := a.check(); err != nil {
		t.Fatal(err)
	}
}

func mustAlloc(t testing.TB, a *Allocator, size uint64) gpu.DevicePtr {
	t.Helper()
	p, err := a.Alloc(size)
	if err != nil {
		t.Fatalf("Alloc(%d): %v", size, err)
	}
	mustCheck(t, a)
	return p
}

func mustFree(t testing.TB, a *Allocator, p gpu.DevicePtr) {
	t.Helper()
	if err := a.Free(p); err != nil {
		t.Fatalf("Free(%#x): %v", uint64(p), err)
	}
	mustCheck(t, a)
}

// freeChunks returns the free chunks in address order, read from the address
// list rather than the best-fit index, so tests can compute the expected
// best fit independently.
func (a *Allocator) freeChunks() []freeKey {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []freeKey
	for c := a.mu.head; c != nil; c = c.next {
		if c.free {
			out = append(out, freeKey{c.size, c.addr})
		}
	}
	return out
}

func TestNewRejectsBadRegions(t *testing.T) {
	for _, tc := range []struct {
		name string
		base gpu.DevicePtr
		size uint64
		opts Options
	}{
		{"alignment not a power of two", testBase, 4096, Options{Alignment: 384}},
		{"null base", 0, 4096, Options{}},
		{"misaligned base", testBase + 16, 4096, Options{}},
		{"zero size", testBase, 0, Options{}},
		{"size not a multiple", testBase, 4096 + 1, Options{}},
		{"wraps", gpu.DevicePtr(math.MaxUint64 - 255), 512, Options{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.base, tc.size, tc.opts)
			if !errors.Is(err, gpu.ErrInvalidValue) {
				t.Fatalf("New: got %v, want ErrInvalidValue", err)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	a := newAlloc(t, 16*u, Options{})
	if a.Alignment() != 256 || a.Base() != testBase {
		t.Fatalf("alignment %d base %#x", a.Alignment(), uint64(a.Base()))
	}
	s := a.Stats()
	want := Stats{Size: 16 * u, FreeChunks: 1, FreeBytes: 16 * u, LargestFree: 16 * u}
	if s != want {
		t.Fatalf("fresh stats %+v, want %+v", s, want)
	}
	mustCheck(t, a)
}

// layout allocates the given sizes (in units) back to back from a fresh
// allocator whose region they fill exactly, and returns their addresses.
func layout(t *testing.T, units ...uint64) (*Allocator, []gpu.DevicePtr) {
	t.Helper()
	var total uint64
	for _, n := range units {
		total += n
	}
	a := newAlloc(t, total*u, Options{})
	ps := make([]gpu.DevicePtr, len(units))
	for i, n := range units {
		ps[i] = mustAlloc(t, a, n*u)
		if i > 0 && ps[i] != ps[i-1].Add(units[i-1]*u) {
			t.Fatalf("allocation %d at %#x, not right after the previous one", i, uint64(ps[i]))
		}
	}
	if s := a.Stats(); s.FreeChunks != 0 || s.InUse != total*u {
		t.Fatalf("layout did not fill the region: %+v", s)
	}
	return a, ps
}

func TestBestFit(t *testing.T) {
	// Holes of 4, 2, 3 and 2 units separated by 1-unit allocations.
	a, ps := layout(t, 1, 4, 1, 2, 1, 3, 1, 2, 1)
	for _, i := range []int{1, 3, 5, 7} {
		mustFree(t, a, ps[i])
	}
	// 2 units: two exact holes (ps[3], ps[7]); the lower address wins.
	if p := mustAlloc(t, a, 2*u); p != ps[3] {
		t.Errorf("2-unit request at %#x, want the lowest exact hole %#x", uint64(p), uint64(ps[3]))
	}
	// 1.5 units round up to 2: the other 2-unit hole, not the larger ones
	// before it.
	if p := mustAlloc(t, a, u+u/2); p != ps[7] {
		t.Errorf("1.5-unit request at %#x, want %#x", uint64(p), uint64(ps[7]))
	}
	// 3 units: the 3-unit hole, although the 4-unit hole comes first.
	if p := mustAlloc(t, a, 3*u); p != ps[5] {
		t.Errorf("3-unit request at %#x, want %#x", uint64(p), uint64(ps[5]))
	}
	// 1 unit: only the 4-unit hole is left; it is split from its start.
	if p := mustAlloc(t, a, 1); p != ps[1] {
		t.Errorf("1-byte request at %#x, want %#x", uint64(p), uint64(ps[1]))
	}
	if got, want := a.freeChunks(), []freeKey{{3 * u, ps[1].Add(u)}}; !slices.Equal(got, want) {
		t.Errorf("free chunks %v, want %v", got, want)
	}
}

func TestSplit(t *testing.T) {
	t.Run("remainder split off", func(t *testing.T) {
		a := newAlloc(t, 16*u, Options{})
		p := mustAlloc(t, a, 3*u-7)
		if p != testBase {
			t.Fatalf("first allocation at %#x", uint64(p))
		}
		if n, _ := a.Size(p); n != 3*u {
			t.Errorf("Size %d, want %d (rounded up to the alignment)", n, 3*u)
		}
		s := a.Stats()
		if s.FreeChunks != 1 || s.LargestFree != 13*u || s.InUse != 3*u || s.Requested != 3*u-7 {
			t.Errorf("stats after split: %+v", s)
		}
		if got, want := a.freeChunks(), []freeKey{{13 * u, testBase.Add(3 * u)}}; !slices.Equal(got, want) {
			t.Errorf("free chunks %v, want %v", got, want)
		}
	})
	t.Run("small remainder kept", func(t *testing.T) {
		a := newAlloc(t, 16*u, Options{MinSplit: 2*u - 1}) // rounds up to 2 units
		p := mustAlloc(t, a, 15*u)
		if n, _ := a.Size(p); n != 16*u {
			t.Errorf("Size %d, want the whole region %d: a 1-unit remainder is below MinSplit", n, 16*u)
		}
		if s := a.Stats(); s.FreeChunks != 0 || s.InUse != 16*u || s.Requested != 15*u {
			t.Errorf("stats: %+v", s)
		}
		mustFree(t, a, p)
		q := mustAlloc(t, a, 14*u) // 2-unit remainder: split
		if n, _ := a.Size(q); n != 14*u {
			t.Errorf("Size %d, want %d", n, 14*u)
		}
	})
	t.Run("exact fit", func(t *testing.T) {
		a := newAlloc(t, 4*u, Options{})
		mustAlloc(t, a, 4*u)
		if s := a.Stats(); s.FreeChunks != 0 || s.LargestFree != 0 || s.FreeBytes != 0 {
			t.Errorf("stats: %+v", s)
		}
	})
}

func TestCoalesce(t *testing.T) {
	for _, tc := range []struct {
		name  string
		order []int // indexes of A, B, C, D (1, 2, 3, 4 units) to free, in order
		want  func(ps []gpu.DevicePtr) []freeKey
	}{
		{"left", []int{0, 1}, func(ps []gpu.DevicePtr) []freeKey { return []freeKey{{3 * u, ps[0]}} }},
		{"right", []int{1, 0}, func(ps []gpu.DevicePtr) []freeKey { return []freeKey{{3 * u, ps[0]}} }},
		{"both", []int{0, 2, 1}, func(ps []gpu.DevicePtr) []freeKey { return []freeKey{{6 * u, ps[0]}} }},
		{"none", []int{0, 2}, func(ps []gpu.DevicePtr) []freeKey { return []freeKey{{1 * u, ps[0]}, {3 * u, ps[2]}} }},
		{"last chunk", []int{3, 2}, func(ps []gpu.DevicePtr) []freeKey { return []freeKey{{7 * u, ps[2]}} }},
		{"everything", []int{2, 0, 3, 1}, func(ps []gpu.DevicePtr) []freeKey { return []freeKey{{10 * u, ps[0]}} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, ps := layout(t, 1, 2, 3, 4)
			for _, i := range tc.order {
				mustFree(t, a, ps[i])
			}
			if got, want := a.freeChunks(), tc.want(ps); !slices.Equal(got, want) {
				t.Errorf("free chunks %v, want %v", got, want)
			}
		})
	}
}

func TestAllocErrors(t *testing.T) {
	a := newAlloc(t, 8*u, Options{Name: "weights"})
	if _, err := a.Alloc(0); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("Alloc(0): %v, want ErrInvalidValue", err)
	}
	for _, size := range []uint64{8*u + 1, math.MaxUint64, math.MaxUint64 - 100} {
		_, err := a.Alloc(size)
		if !errors.Is(err, gpu.ErrOutOfMemory) {
			t.Errorf("Alloc(%d): %v, want ErrOutOfMemory", size, err)
		}
	}
	// Fragmentation: 4 units free in total, but at most 2 in one piece.
	ps := []gpu.DevicePtr{mustAlloc(t, a, 2*u), mustAlloc(t, a, 2*u), mustAlloc(t, a, 2*u), mustAlloc(t, a, 2*u)}
	mustFree(t, a, ps[0])
	mustFree(t, a, ps[2])
	_, err := a.Alloc(3 * u)
	if !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Fatalf("fragmented Alloc: %v, want ErrOutOfMemory", err)
	}
	for _, want := range []string{`"weights"`, "768 bytes", "largest free chunk is 512 bytes", "1024 of 2048 bytes in use"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	mustCheck(t, a)
}

func TestFreeErrors(t *testing.T) {
	a, ps := layout(t, 2, 2, 4)
	mustFree(t, a, ps[2])
	end := testBase.Add(8 * u)
	for _, tc := range []struct {
		name string
		p    gpu.DevicePtr
		want string
	}{
		{"double free", ps[2], "double free"},
		{"inside a free chunk", ps[2].Add(u), "double free"},
		{"interior of allocation", ps[1].Add(16), "16 bytes inside the allocation at"},
		{"below the region", testBase - u, "outside the region"},
		{"at the end", end, "outside the region"},
		{"null", 0, "outside the region"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := a.Stats()
			err := a.Free(tc.p)
			if !errors.Is(err, gpu.ErrInvalidHandle) {
				t.Fatalf("Free(%#x): %v, want ErrInvalidHandle", uint64(tc.p), err)
			}
			addr := fmt.Sprintf("%#x", uint64(tc.p))
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), addr) {
				t.Errorf("error %q should name %s and say %q", err, addr, tc.want)
			}
			if _, err := a.Size(tc.p); !errors.Is(err, gpu.ErrInvalidHandle) {
				t.Errorf("Size(%#x): %v, want ErrInvalidHandle", uint64(tc.p), err)
			}
			if after := a.Stats(); after != before {
				t.Errorf("a failed Free changed the stats: %+v -> %+v", before, after)
			}
			mustCheck(t, a)
		})
	}
}

func TestStatsPeak(t *testing.T) {
	a := newAlloc(t, 64*u, Options{})
	p := mustAlloc(t, a, 10*u)
	q := mustAlloc(t, a, 20*u)
	mustFree(t, a, p)
	mustFree(t, a, q)
	mustAlloc(t, a, 5*u)
	s := a.Stats()
	if s.Peak != 30*u || s.InUse != 5*u || s.Allocations != 1 || s.FreeBytes != 59*u {
		t.Errorf("stats %+v", s)
	}
}

func TestFullCoalesceAfterChurn(t *testing.T) {
	a := newAlloc(t, 1<<20, Options{})
	r := rand.New(rand.NewPCG(1, 2))
	var live []gpu.DevicePtr
	for i := 0; i < 5000; i++ {
		if len(live) > 0 && r.IntN(3) == 0 {
			j := r.IntN(len(live))
			mustFree(t, a, live[j])
			live = slices.Delete(live, j, j+1)
			continue
		}
		if p, err := a.Alloc(1 + r.Uint64N(8<<10)); err == nil {
			live = append(live, p)
		} else if !errors.Is(err, gpu.ErrOutOfMemory) {
			t.Fatal(err)
		}
	}
	r.Shuffle(len(live), func(i, j int) { live[i], live[j] = live[j], live[i] })
	for _, p := range live {
		mustFree(t, a, p)
	}
	if got, want := a.freeChunks(), []freeKey{{1 << 20, testBase}}; !slices.Equal(got, want) {
		t.Fatalf("after freeing everything: %v, want %v", got, want)
	}
}

func TestConcurrent(t *testing.T) {
	a := newAlloc(t, 4<<20, Options{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 7))
			var live []gpu.DevicePtr
			for range 2000 {
				if len(live) > 0 && r.IntN(2) == 0 {
					j := r.IntN(len(live))
					if err := a.Free(live[j]); err != nil {
						t.Error(err)
						return
					}
					live = slices.Delete(live, j, j+1)
					continue
				}
				p, err := a.Alloc(1 + r.Uint64N(16<<10))
				if err != nil {
					if !errors.Is(err, gpu.ErrOutOfMemory) {
						t.Error(err)
						return
					}
					continue
				}
				live = append(live, p)
			}
			for _, p := range live {
				if err := a.Free(p); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	mustCheck(t, a)
	if s := a.Stats(); s.FreeChunks != 1 || s.InUse != 0 || s.LargestFree != 4<<20 {
		t.Fatalf("after concurrent churn: %+v", s)
	}
}
