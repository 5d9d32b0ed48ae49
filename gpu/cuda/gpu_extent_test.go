package cuda

// AddressRange against a real driver; skips without a GPU. Lines starting
// CUDA-EXTENT record what the driver reported, for docs/GPU-TESTING.md.

import (
	"errors"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/cuda/cu"
)

// wantNotInAlloc checks that p is not reported inside the allocation at
// base: in none, or in another starting after base.
func wantNotInAlloc(t *testing.T, b *Backend, what string, p, base gpu.DevicePtr) {
	t.Helper()
	gb, gs, err := b.AddressRange(p)
	switch {
	case err != nil && !errors.Is(err, gpu.ErrNotFound):
		t.Errorf("%s: AddressRange(%#x): %v, want gpu.ErrNotFound", what, uint64(p), err)
	case err == nil && (gb == base || gb > p || uint64(p-gb) >= gs):
		t.Errorf("%s: AddressRange(%#x) = [%#x, +%d), want no allocation holding it but another than %#x", what, uint64(p), uint64(gb), gs, uint64(base))
	}
}

// TestAddressRangeGPU: the backend's own cuMemAlloc allocations at their
// base, inside and at their end; another library's (cuMemAlloc called
// directly) through cuMemGetAddressRange_v2; another library's virtual
// memory (unknown extent); the backend's own virtual memory and host
// memory; freed memory.
func TestAddressRangeGPU(t *testing.T) {
	b := openOrSkip(t, Config{})
	closeClean(t, b)

	// Own allocations: exact sizes from the tables.
	for _, size := range []uint64{1000, 1<<20 + 3} {
		p, err := b.MemAlloc(0, size)
		if err != nil {
			t.Fatal(err)
		}
		wantRange(t, b, "own: base", p, p, size)
		wantRange(t, b, "own: interior", p.Add(size/3), p, size)
		wantRange(t, b, "own: last byte", p.Add(size-1), p, size)
		wantNotInAlloc(t, b, "own: one past the end", p.Add(size), p)
		if err := gpu.CheckBinding(b, p.Add(8), size); !errors.Is(err, gpu.ErrOutOfBounds) {
			t.Errorf("CheckBinding(own+8, %d) = %v, want gpu.ErrOutOfBounds", size, err)
		}
		if err := b.MemFree(p); err != nil {
			t.Fatal(err)
		}
		wantRangeErr(t, b, "own, freed", p.Add(1), gpu.ErrNotFound)
	}

	// Another library's cuMemAlloc: the driver's extent, at least the size
	// asked for.
	const fsize = 3<<20 + 100
	var fp cu.DevicePtr
	if err := b.call(0, "cuMemAlloc_v2", func() cu.Result { return b.d.MemAlloc(&fp, fsize) }); err != nil {
		t.Fatal(err)
	}
	defer b.call(0, "cuMemFree_v2", func() cu.Result { return b.d.MemFree(fp) })
	p := gpu.DevicePtr(fp)
	base, size, err := b.AddressRange(p.Add(fsize / 2))
	t.Logf("CUDA-EXTENT foreign cuMemAlloc(%d) at %#x: [%#x, +%d), %v", fsize, uint64(p), uint64(base), size, err)
	if err != nil || base != p || size < fsize || size > gpu.RoundUp(fsize, 2<<20) {
		t.Fatalf("foreign cuMemAlloc(%d) at %#x: AddressRange = [%#x, +%d), %v", fsize, uint64(p), uint64(base), size, err)
	}
	wantRange(t, b, "foreign: base (cached)", p, p, size)
	wantRange(t, b, "foreign: last byte (cached)", p.Add(size-1), p, size)
	wantNotInAlloc(t, b, "foreign: one past the end", p.Add(size), p)
	var ee *gpu.ExtentError
	if err := gpu.CheckBinding(b, p.Add(size-8), 16); !errors.As(err, &ee) || ee.Base != p || ee.Extent != size {
		t.Errorf("CheckBinding past the foreign allocation: %v", err)
	}

	// Another library's virtual memory: two granules mapped separately,
	// as PyTorch's expandable segments do. The driver reports one
	// mapping; the backend says it cannot tell.
	gran := b.devs[0].props.Granularity
	if !b.devs[0].props.VMM || gran == 0 {
		t.Log("no VMM: foreign and own virtual memory not checked")
	} else {
		var va cu.DevicePtr
		var hs [2]cu.MemHandle
		prop := allocProp(0)
		err := b.onDevice(0, func() error {
			if r := b.d.MemAddressReserve(&va, 2*gran, 0, 0, 0); r != cu.Success {
				return b.check("cuMemAddressReserve", r)
			}
			for i := range hs {
				if r := b.d.MemCreate(&hs[i], gran, &prop, 0); r != cu.Success {
					return b.check("cuMemCreate", r)
				}
				if r := b.d.MemMap(va+cu.DevicePtr(uint64(i)*gran), gran, 0, hs[i], 0); r != cu.Success {
					return b.check("cuMemMap", r)
				}
			}
			desc := []cu.MemAccessDesc{{Location: cu.MemLocation{Type: cu.MemLocationTypeDevice, ID: 0}, Flags: cu.MemAccessReadWrite}}
			return b.check("cuMemSetAccess", b.d.MemSetAccess(va, 2*gran, desc))
		})
		defer b.onDevice(0, func() error {
			b.d.MemUnmap(va, 2*gran)
			for _, h := range hs {
				if h != 0 {
					b.d.MemRelease(h)
				}
			}
			b.d.MemAddressFree(va, 2*gran)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		var rb cu.DevicePtr
		var rs uint64
		b.onDevice(0, func() error {
			return b.check("cuMemGetAddressRange_v2", b.d.MemGetAddressRange(&rb, &rs, va+cu.DevicePtr(gran)+10))
		})
		t.Logf("CUDA-EXTENT foreign VMM, 2 granules of %d at %#x: the driver reports [%#x, +%d) for the second", gran, uint64(va), uint64(rb), rs)
		wantRangeErr(t, b, "foreign virtual memory", gpu.DevicePtr(va)+gpu.DevicePtr(gran)+10, gpu.ErrNotSupported)
		if err := gpu.CheckBinding(b, gpu.DevicePtr(va), 2*gran); err != nil {
			t.Errorf("CheckBinding across two foreign mappings: %v, want nil (unknown extent: not checked)", err)
		}

		// The backend's own virtual memory: a run of two mappings.
		c, err := b.MemCreate(0, 2*gran)
		if err != nil {
			t.Fatal(err)
		}
		defer b.MemRelease(c)
		q, err := b.MemAddressReserve(4*gran, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer b.MemAddressFree(q, 4*gran)
		for i := range uint64(2) {
			if err := b.MemMap(q.Add(i*gran), gran, i*gran, c); err != nil {
				t.Fatal(err)
			}
			defer b.MemUnmap(q.Add(i*gran), gran)
		}
		wantRange(t, b, "own virtual memory: a run of two mappings", q.Add(gran+10), q, 2*gran)
		wantRangeErr(t, b, "own virtual memory: reserved, unmapped", q.Add(3*gran), gpu.ErrNotFound)
	}

	// Own host memory.
	hm, err := b.HostAlloc(5000)
	if err != nil {
		t.Fatal(err)
	}
	wantRange(t, b, "own host memory", hm.Ptr.Add(4999), hm.Ptr, 5000)
	wantNotInAlloc(t, b, "own host memory: one past the end", hm.Ptr.Add(5000), hm.Ptr)
	if err := b.HostFree(hm.Handle); err != nil {
		t.Fatal(err)
	}
	wantRangeErr(t, b, "own host memory, freed", hm.Ptr, gpu.ErrNotFound)
}
