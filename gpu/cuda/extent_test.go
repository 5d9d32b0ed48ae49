package cuda

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

// Tests of AddressRange over the stub driver (no GPU): where each answer
// comes from, what it costs in driver calls, and that no answer outlives
// the memory the backend frees. gpu_extent_test.go runs the same against a
// real driver.

func wantRange(t *testing.T, b *Backend, what string, p, base gpu.DevicePtr, size uint64) {
	t.Helper()
	gb, gs, err := b.AddressRange(p)
	if err != nil || gb != base || gs != size {
		t.Errorf("%s: AddressRange(%#x) = [%#x, +%d), %v; want [%#x, +%d)", what, uint64(p), uint64(gb), gs, err, uint64(base), size)
	}
}

func wantRangeErr(t *testing.T, b *Backend, what string, p gpu.DevicePtr, want error) {
	t.Helper()
	gb, gs, err := b.AddressRange(p)
	if !errors.Is(err, want) {
		t.Errorf("%s: AddressRange(%#x) = [%#x, +%d), %v; want an error wrapping %v", what, uint64(p), uint64(gb), gs, err, want)
	}
}

// TestStubAddressRangeOwn: the backend's own allocations are answered from
// its tables with no driver call, exactly, and forgotten when freed.
func TestStubAddressRangeOwn(t *testing.T) {
	b, sd := newStubBackend(t)
	p, err := b.MemAlloc(0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	hm, err := b.HostAlloc(3000)
	if err != nil {
		t.Fatal(err)
	}
	sd.startCounting()
	for _, off := range []uint64{0, 1, 500, 999} {
		wantRange(t, b, "MemAlloc(1000)", p.Add(off), p, 1000)
	}
	wantRange(t, b, "HostAlloc(3000)", hm.Ptr.Add(2999), hm.Ptr, 3000)
	if n := sd.callCount("cuMemGetAddressRange_v2") + sd.callCount("cuPointerGetAttribute"); n != 0 {
		t.Errorf("own allocations cost %d driver calls, want 0", n)
	}
	// Past the end: the stub's allocation is exactly 1000 bytes, so the
	// driver knows nothing there.
	wantRangeErr(t, b, "one past the end", p.Add(1000), gpu.ErrNotFound)

	if err := b.MemFree(p); err != nil {
		t.Fatal(err)
	}
	if err := b.HostFree(hm.Handle); err != nil {
		t.Fatal(err)
	}
	wantRangeErr(t, b, "freed allocation", p.Add(10), gpu.ErrNotFound)
	wantRangeErr(t, b, "freed host allocation", hm.Ptr, gpu.ErrNotFound)
	wantRangeErr(t, b, "null pointer", 0, gpu.ErrNotFound)
}

// TestStubAddressRangeRoundedOwn: when the driver reports one of the
// backend's allocations rounded up, an address past the size asked for is
// still in no allocation.
func TestStubAddressRangeRoundedOwn(t *testing.T) {
	b, sd := newStubBackend(t)
	p, err := b.MemAlloc(0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	defer b.MemFree(p)
	sd.addRange(uintptr(p), 1024, true) // what a rounding driver reports
	wantRangeErr(t, b, "past the size asked for, inside the rounding", p.Add(1010), gpu.ErrNotFound)
	wantRange(t, b, "inside", p.Add(999), p, 1000)
}

// TestStubAddressRangeForeign: memory of other libraries costs driver calls
// once per allocation; plain allocations are believed, others unknown.
func TestStubAddressRangeForeign(t *testing.T) {
	b, sd := newStubBackend(t)
	const plain, vmm = 0x7000_0000_0000, 0x7100_0000_0000
	sd.addRange(plain, 1<<20, true)
	sd.addRange(vmm, 2<<20, false)
	sd.startCounting()
	wantRange(t, b, "plain foreign allocation", plain+4096, plain, 1<<20)
	if n, m := sd.callCount("cuMemGetAddressRange_v2"), sd.callCount("cuPointerGetAttribute"); n != 1 || m != 1 {
		t.Errorf("first look-up: %d cuMemGetAddressRange_v2 and %d cuPointerGetAttribute calls, want 1 and 1", n, m)
	}
	for off := gpu.DevicePtr(0); off < 1<<20; off += 64 << 10 {
		wantRange(t, b, "plain foreign allocation, cached", plain+off, plain, 1<<20)
	}
	wantRangeErr(t, b, "foreign virtual memory", vmm+100, gpu.ErrNotSupported)
	wantRangeErr(t, b, "foreign virtual memory, cached", vmm+(1<<20), gpu.ErrNotSupported)
	if n := sd.callCount("cuMemGetAddressRange_v2"); n != 2 {
		t.Errorf("two foreign allocations looked up many times: %d driver look-ups, want 2", n)
	}
	wantRangeErr(t, b, "unknown to the driver", 0x7200_0000_0000, gpu.ErrNotFound)
	wantRangeErr(t, b, "unknown to the driver (not cached)", 0x7200_0000_0000, gpu.ErrNotFound)
	if n := sd.callCount("cuMemGetAddressRange_v2"); n != 4 {
		t.Errorf("%d driver look-ups, want 4: a miss is asked again", n)
	}
	if err := gpu.CheckBinding(b, vmm+100, 4<<20); err != nil {
		t.Errorf("CheckBinding in memory of unknown extent: %v, want nil (not checked)", err)
	}
	var ee *gpu.ExtentError
	if err := gpu.CheckBinding(b, plain+(1<<20)-8, 16); !errors.As(err, &ee) || ee.Base != plain || ee.Extent != 1<<20 {
		t.Errorf("CheckBinding past a foreign allocation: %v, want an *ExtentError naming [%#x, +%d)", err, plain, 1<<20)
	}
}

// TestStubAddressRangeReused: a foreign extent learned before the memory
// was freed behind the backend's back gives way to the backend's own
// allocation at that address.
func TestStubAddressRangeReused(t *testing.T) {
	b, sd := newStubBackend(t)
	next := gpu.DevicePtr((sd.next.Load() + 1) << 4 << 20) // the stub's next cuMemAlloc
	sd.addRange(uintptr(next), 8<<20, true)
	wantRange(t, b, "another library's allocation", next+100, next, 8<<20)
	sd.mu.Lock()
	delete(sd.ranges, uintptr(next)) // freed by the other library
	sd.mu.Unlock()
	p, err := b.MemAlloc(0, 256)
	if err != nil {
		t.Fatal(err)
	}
	defer b.MemFree(p)
	if p != next {
		t.Fatalf("MemAlloc = %#x, the test expected %#x", uint64(p), uint64(next))
	}
	wantRange(t, b, "the backend's allocation at the same base", next+100, next, 256)
	wantRangeErr(t, b, "past it, where the old extent reached", next+4096, gpu.ErrNotFound)
}

// TestStubAddressRangeVMM: the backend's virtual memory is answered from its
// mapping table (runs of contiguous mappings), following MemMap/MemUnmap.
func TestStubAddressRangeVMM(t *testing.T) {
	b, sd := newStubBackend(t)
	const gran = 2 << 20
	c, err := b.MemCreate(0, 3*gran)
	if err != nil {
		t.Fatal(err)
	}
	defer b.MemRelease(c)
	p, err := b.MemAddressReserve(4*gran, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.MemAddressFree(p, 4*gran)
	sd.startCounting()
	wantRangeErr(t, b, "reserved, unmapped", p, gpu.ErrNotFound)
	if err := b.MemMap(p, gran, 0, c); err != nil {
		t.Fatal(err)
	}
	wantRange(t, b, "one mapping", p.Add(gran-1), p, gran)
	if err := b.MemMap(p.Add(gran), 2*gran, gran, c); err != nil {
		t.Fatal(err)
	}
	wantRange(t, b, "two mappings, one run", p.Add(5), p, 3*gran)
	wantRange(t, b, "two mappings, one run: last byte", p.Add(3*gran-1), p, 3*gran)
	wantRangeErr(t, b, "past the run", p.Add(3*gran), gpu.ErrNotFound)
	if n := sd.callCount("cuMemGetAddressRange_v2"); n != 0 {
		t.Errorf("the backend's own virtual memory cost %d driver look-ups", n)
	}
	if err := b.MemUnmap(p, gran); err != nil {
		t.Fatal(err)
	}
	wantRange(t, b, "after unmapping the first", p.Add(2*gran), p.Add(gran), 2*gran)
	wantRangeErr(t, b, "the unmapped first", p.Add(5), gpu.ErrNotFound)
	if err := b.MemUnmap(p.Add(gran), 2*gran); err != nil {
		t.Fatal(err)
	}
	wantRangeErr(t, b, "all unmapped", p.Add(2*gran), gpu.ErrNotFound)
}

func TestStubAddressRangeClosed(t *testing.T) {
	sd := newStubDriver()
	b, err := openDriver(cu.NewStub("stub-libcuda", sd.call), resolveOptions(Config{}))
	if err != nil {
		t.Fatal(err)
	}
	p, err := b.MemAlloc(0, 64)
	if err != nil {
		t.Fatal(err)
	}
	b.Close() // reports the leaked allocation; what matters is what follows
	wantRangeErr(t, b, "after Close", p, gpu.ErrIllegalState)
}

// TestExtentCacheModel checks insert and drop against a byte-map model.
func TestExtentCacheModel(t *testing.T) {
	const space = 64
	rng := rand.New(rand.NewPCG(1, 2))
	var c extentCache
	for step := range 20000 {
		lo := uint64(rng.IntN(space))
		hi := lo + 1 + uint64(rng.IntN(8))
		kind := extentKind(1 + rng.IntN(5))
		before := append([]extent(nil), c.ext...)
		switch rng.IntN(3) {
		case 0:
			c.insert(extent{base: lo, size: hi - lo, kind: kind})
			var want []extent
			blocked := false
			for _, e := range before {
				overlaps := e.base < hi && e.end() > lo
				if overlaps && !kind.own() && e.kind.own() {
					blocked = true
				}
			}
			for _, e := range before {
				if blocked || !(e.base < hi && e.end() > lo) {
					want = append(want, e)
				}
			}
			if !blocked {
				want = append(want, extent{base: lo, size: hi - lo, kind: kind})
			}
			checkExtents(t, step, "insert", c.ext, want)
		default:
			touch := rng.IntN(2) == 0
			c.drop(lo, hi, touch)
			var want []extent
			for _, e := range before {
				hit := e.base < hi && e.end() > lo || touch && e.kind == extOwnVMM && (e.end() == lo || e.base == hi)
				if !hit {
					want = append(want, e)
				}
			}
			checkExtents(t, step, "drop", c.ext, want)
		}
		if t.Failed() {
			return
		}
	}
}

func checkExtents(t *testing.T, step int, op string, got, want []extent) {
	t.Helper()
	sortExtents(want)
	if len(got) != len(want) {
		t.Fatalf("step %d %s: %v, want %v", step, op, got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("step %d %s: %v, want %v", step, op, got, want)
		}
		if i > 0 && got[i-1].end() > got[i].base {
			t.Fatalf("step %d %s: overlapping extents %v", step, op, got)
		}
	}
}

func sortExtents(es []extent) {
	for i := 1; i < len(es); i++ {
		for j := i; j > 0 && es[j].base < es[j-1].base; j-- {
			es[j], es[j-1] = es[j-1], es[j]
		}
	}
}

// BenchmarkAddressRange: the cached paths make no driver call; the benchmark
// fails if they do, and reports driver calls per look-up.
func BenchmarkAddressRange(bm *testing.B) {
	for _, c := range []struct {
		name  string
		setup func(bm *testing.B, b *Backend, sd *stubDriver) gpu.DevicePtr
	}{
		{"own", func(bm *testing.B, b *Backend, sd *stubDriver) gpu.DevicePtr {
			var last gpu.DevicePtr
			for range 1000 { // a thousand live allocations to search
				p, err := b.MemAlloc(0, 4096)
				if err != nil {
					bm.Fatal(err)
				}
				bm.Cleanup(func() { b.MemFree(p) })
				last = p
			}
			return last.Add(100)
		}},
		{"foreign", func(_ *testing.B, b *Backend, sd *stubDriver) gpu.DevicePtr {
			sd.addRange(0x7000_0000_0000, 64<<20, true)
			return 0x7000_0000_0000 + 12345
		}},
	} {
		bm.Run(c.name, func(bm *testing.B) {
			b, sd := newStubBackend(bm)
			p := c.setup(bm, b, sd)
			if _, _, err := b.AddressRange(p); err != nil { // warm the cache
				bm.Fatal(err)
			}
			sd.startCounting()
			for i := 0; bm.Loop(); i++ {
				if _, _, err := b.AddressRange(p.Add(uint64(i & 1023))); err != nil {
					bm.Fatal(err)
				}
			}
			calls := sd.callCount("cuMemGetAddressRange_v2") + sd.callCount("cuPointerGetAttribute")
			bm.ReportMetric(float64(calls)/float64(bm.N), "driver-calls/op")
			if calls != 0 {
				bm.Fatalf("the cached path made %d driver calls", calls)
			}
		})
	}
}
