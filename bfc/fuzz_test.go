package bfc

import (
	"cmp"
	"errors"
	"slices"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
)

// FuzzAllocFree runs a random sequence of allocations and frees (good and
// bad) against a model of the live set, and after every step checks: the
// structural invariants (check), that Alloc chose the best fit computed
// independently from the address-ordered free list, that a request failed
// only when no free chunk could hold it, alignment, bounds, no overlap
// between live allocations, and that Stats agree with the model. At the end
// it frees everything and demands one free chunk covering the region.
//
// The input: alignShift picks the alignment (1 << (alignShift % 10)),
// units the region size in alignment units, minSplit the split threshold in
// units, and ops a byte pair per step (see the loop).
func FuzzAllocFree(f *testing.F) {
	f.Add(uint8(8), uint16(64), uint8(0), []byte{0, 10, 0, 20, 1, 0, 0, 5, 1, 1, 2, 0, 1, 0})
	f.Add(uint8(0), uint16(1), uint8(0), []byte{0, 0, 0, 1, 1, 0, 3, 0, 0, 1})
	f.Add(uint8(4), uint16(4095), uint8(3), []byte{
		0x40, 0xff, 0x20, 0x10, 0x06, 0x30, 0x01, 0x02, 0x02, 0x11, 0x03, 0x01, 0x10, 0x80, 0x05, 0x00,
		0x7e, 0x00, 0x09, 0x01, 0x0b, 0x01, 0x00, 0x40, 0x22, 0x22, 0x01, 0x00, 0x01, 0x00})
	f.Add(uint8(9), uint16(300), uint8(1), []byte{
		0x02, 0x01, 0x02, 0x02, 0x02, 0x03, 0x02, 0x04, 0x02, 0x05, 0x02, 0x06, 0x01, 0x01, 0x01, 0x03,
		0x01, 0x00, 0x02, 0x07, 0x02, 0x08, 0x07, 0x01, 0x01, 0x02, 0x00, 0x01, 0x01, 0x00})
	f.Add(uint8(8), uint16(16), uint8(0), []byte{0xfe, 0xff, 0x01, 0x00, 0xfe, 0xff, 0x00, 0x00, 0x03, 0x01})

	f.Fuzz(func(t *testing.T, alignShift uint8, units uint16, minSplit uint8, ops []byte) {
		align := uint64(1) << (alignShift % 10)
		region := (uint64(units)%4096 + 1) * align
		a, err := New(testBase, region, Options{Alignment: align, MinSplit: uint64(minSplit%8) * align})
		if err != nil {
			t.Fatal(err)
		}
		type live struct {
			p         gpu.DevicePtr
			requested uint64
		}
		var (
			lives []live
			peak  uint64
			freed []gpu.DevicePtr // recently freed starts, for double frees
		)
		verify := func(step int) {
			t.Helper()
			if err := a.check(); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			sorted := slices.Clone(lives)
			slices.SortFunc(sorted, func(x, y live) int { return cmp.Compare(x.p, y.p) })
			var inUse, requested uint64
			end := testBase.Add(region)
			for i, l := range sorted {
				n, err := a.Size(l.p)
				if err != nil {
					t.Fatalf("step %d: Size of live %#x: %v", step, uint64(l.p), err)
				}
				if uint64(l.p)%align != 0 || n%align != 0 || n < l.requested {
					t.Fatalf("step %d: allocation %#x of %d bytes (asked %d) breaks alignment %d", step, uint64(l.p), n, l.requested, align)
				}
				if l.p < testBase || l.p.Add(n) > end {
					t.Fatalf("step %d: allocation %#x+%d outside the region", step, uint64(l.p), n)
				}
				if i+1 < len(sorted) && l.p.Add(n) > sorted[i+1].p {
					t.Fatalf("step %d: allocations %#x+%d and %#x overlap", step, uint64(l.p), n, uint64(sorted[i+1].p))
				}
				inUse += n
				requested += l.requested
			}
			peak = max(peak, inUse)
			fc := a.freeChunks()
			var largest uint64
			for _, c := range fc {
				largest = max(largest, c.size)
			}
			want := Stats{Size: region, InUse: inUse, Requested: requested, Peak: peak, Allocations: len(lives),
				FreeChunks: len(fc), FreeBytes: region - inUse, LargestFree: largest}
			if s := a.Stats(); s != want {
				t.Fatalf("step %d: stats %+v, model says %+v", step, s, want)
			}
		}

		for step := 0; step+1 < len(ops); step += 2 {
			op, arg := ops[step], ops[step+1]
			switch op % 4 {
			case 0, 2: // alloc: bit 1 picks small sizes, else up to the region
				v := uint64(op>>2)<<8 | uint64(arg)
				size := v * region >> 14
				if op&2 != 0 {
					size = v % (3 * align)
				}
				need := gpu.RoundUp(size, align)
				// The expected best fit, from the address-ordered list.
				var best *freeKey
				for _, c := range a.freeChunks() {
					if c.size >= need && (best == nil || c.size < best.size) {
						best = &c
					}
				}
				p, err := a.Alloc(size)
				switch {
				case size == 0:
					if !errors.Is(err, gpu.ErrInvalidValue) {
						t.Fatalf("step %d: Alloc(0): %v", step, err)
					}
				case best == nil:
					if !errors.Is(err, gpu.ErrOutOfMemory) {
						t.Fatalf("step %d: Alloc(%d) with no chunk large enough: %v, %#x", step, size, err, uint64(p))
					}
				case err != nil:
					t.Fatalf("step %d: Alloc(%d) failed though %+v fits: %v", step, size, *best, err)
				case p != best.addr:
					t.Fatalf("step %d: Alloc(%d) at %#x, best fit is %+v", step, size, uint64(p), *best)
				default:
					lives = append(lives, live{p, size})
				}
			case 1: // free a live allocation
				if len(lives) == 0 {
					continue
				}
				i := int(arg) % len(lives)
				if err := a.Free(lives[i].p); err != nil {
					t.Fatalf("step %d: Free(%#x): %v", step, uint64(lives[i].p), err)
				}
				freed = append(freed, lives[i].p)
				lives = slices.Delete(lives, i, i+1)
			case 3: // a bad free: double, interior, or outside
				var p gpu.DevicePtr
				switch {
				case arg%3 == 0 && len(freed) > 0:
					p = freed[int(arg)%len(freed)]
				case arg%3 == 1 && len(lives) > 0:
					p = lives[int(arg)%len(lives)].p + 1
				default:
					p = testBase.Add(region + uint64(arg))
				}
				if slices.ContainsFunc(lives, func(l live) bool { return l.p == p }) {
					continue // the address was reused by a live allocation
				}
				before := a.Stats()
				if err := a.Free(p); !errors.Is(err, gpu.ErrInvalidHandle) {
					t.Fatalf("step %d: bad Free(%#x): %v, want ErrInvalidHandle", step, uint64(p), err)
				}
				if after := a.Stats(); after != before {
					t.Fatalf("step %d: bad Free changed stats %+v -> %+v", step, before, after)
				}
			}
			verify(step)
		}

		for len(lives) > 0 {
			// Free from the middle so that merges go both ways.
			i := len(lives) / 2
			if err := a.Free(lives[i].p); err != nil {
				t.Fatalf("final Free(%#x): %v", uint64(lives[i].p), err)
			}
			lives = slices.Delete(lives, i, i+1)
			verify(-1)
		}
		if got, want := a.freeChunks(), []freeKey{{region, testBase}}; !slices.Equal(got, want) {
			t.Fatalf("everything freed, free chunks %v, want %v", got, want)
		}
	})
}
