package replay

import (
	"math/rand/v2"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
)

// TestOverlapsAgainstBruteForce checks Overlaps on random placements
// against the pairwise definition: two buffers are in one group exactly
// when a chain of overlapping pairs joins them, a group is hazardous when
// it has two or more members one of which is written, and Conflict names
// two buffers that overlap, one of them written.
func TestOverlapsAgainstBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var o Overlaps
	for trial := range 2000 {
		n := 1 + r.IntN(9)
		bufs := make([]Buffer, n)
		addrs := make([]gpu.DevicePtr, n)
		ids := make([]int, 0, n)
		for i := range bufs {
			bufs[i] = Buffer{Class: Param, Size: int64(1 + r.IntN(40))}
			if r.IntN(2) == 0 {
				bufs[i].Class = Output
			}
			if r.IntN(3) == 0 {
				bufs[i].Flow.Written = true
			}
			addrs[i] = gpu.DevicePtr(0x1000 + r.IntN(120))
			if r.IntN(5) > 0 {
				ids = append(ids, i)
			}
		}
		o.Find(bufs, ids, addrs)
		overlap := func(i, j int) bool {
			return addrs[i] < addrs[j]+gpu.DevicePtr(bufs[j].Size) && addrs[j] < addrs[i]+gpu.DevicePtr(bufs[i].Size)
		}
		written := func(i int) bool { return bufs[i].Class == Output || bufs[i].Flow.Written }
		// Components by union-find over the pairs.
		comp := make([]int, n)
		for i := range comp {
			comp[i] = i
		}
		var find func(int) int
		find = func(i int) int {
			if comp[i] != i {
				comp[i] = find(comp[i])
			}
			return comp[i]
		}
		for _, i := range ids {
			for _, j := range ids {
				if i < j && overlap(i, j) {
					comp[find(i)] = find(j)
				}
			}
		}
		size, hasWritten := map[int]int{}, map[int]bool{}
		for _, i := range ids {
			size[find(i)]++
			hasWritten[find(i)] = hasWritten[find(i)] || written(i)
		}
		wantHazard, wantAny := false, false
		for c, k := range size {
			wantAny = wantAny || k > 1
			wantHazard = wantHazard || k > 1 && hasWritten[c]
		}
		if o.Hazard() != wantHazard || o.Any() != wantAny {
			t.Fatalf("trial %d: hazard %v any %v, want %v %v (bufs %+v at %v, ids %v)", trial, o.Hazard(), o.Any(), wantHazard, wantAny, bufs, addrs, ids)
		}
		for _, i := range ids {
			sp := o.spanOf(i)
			if sp == nil {
				t.Fatalf("trial %d: buffer %d analysed but has no span", trial, i)
			}
			if alone := size[find(i)] == 1; alone != (sp.group < 0) {
				t.Fatalf("trial %d: buffer %d alone=%v but group %d", trial, i, alone, sp.group)
			}
			for _, j := range ids {
				if sj := o.spanOf(j); sp.group >= 0 && (find(i) == find(j)) != (sj.group == sp.group) {
					t.Fatalf("trial %d: buffers %d and %d grouped wrongly", trial, i, j)
				}
			}
		}
		a, b, ok := o.Conflict()
		if ok != wantHazard {
			t.Fatalf("trial %d: conflict %v, hazard %v", trial, ok, wantHazard)
		}
		if ok && (a == b || !overlap(a, b) || !written(a) && !written(b)) {
			t.Fatalf("trial %d: conflict %d and %d is no written overlap", trial, a, b)
		}
	}
}

// TestOverlapsAllocatesNothing: once its scratch has grown, Find makes no
// allocation, so the check costs a step nothing but the sort.
func TestOverlapsAllocatesNothing(t *testing.T) {
	bufs := make([]Buffer, 16)
	addrs := make([]gpu.DevicePtr, 16)
	ids := make([]int, 16)
	for i := range bufs {
		bufs[i] = Buffer{Class: Output, Size: 256}
		addrs[i] = gpu.DevicePtr(0x10000 + 256*(i/2)) // pairs on one address
		ids[i] = i
	}
	var o Overlaps
	o.Find(bufs, ids, addrs)
	if n := testing.AllocsPerRun(100, func() { o.Find(bufs, ids, addrs) }); n != 0 {
		t.Errorf("Find allocates %v times per call", n)
	}
	if !o.Hazard() {
		t.Error("outputs on one address are not a hazard")
	}
}

// BenchmarkOverlaps is the per-step cost of the overlap check for a step
// binding 8 buffers.
func BenchmarkOverlaps(b *testing.B) {
	bufs := make([]Buffer, 8)
	addrs := make([]gpu.DevicePtr, 8)
	ids := make([]int, 8)
	for i := range bufs {
		bufs[i] = Buffer{Class: Param, Size: 4096}
		addrs[i] = gpu.DevicePtr(0x100000 + 8192*((i*5)%8))
		ids[i] = i
	}
	var o Overlaps
	for b.Loop() {
		o.Find(bufs, ids, addrs)
	}
}
