package gputest

import (
	"errors"
	"reflect"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
)

// suiteNames lists every group and "Group/Test" of the suite.
func suiteNames() map[string]bool {
	names := map[string]bool{}
	for _, g := range suite() {
		names[g.name] = true
		for _, c := range g.tests {
			names[g.name+"/"+c.name] = true
		}
	}
	return names
}

// TestCoverageTable checks the coverage table against the methods of
// coverageTypes (by reflection) and against the suite's subtests.
func TestCoverageTable(t *testing.T) {
	methods := map[string]bool{}
	for _, it := range coverageTypes {
		for i := range it.NumMethod() {
			m := it.Method(i).Name
			methods[m] = true
			if len(coverage[m]) == 0 {
				t.Errorf("%s.%s is not in the coverage table (coverage.go): add a subtest that covers it", it, m)
			}
		}
	}
	names := suiteNames()
	for m, tests := range coverage {
		if !methods[m] {
			t.Errorf("coverage table names %s, which none of %v has", m, coverageTypes)
		}
		for _, n := range tests {
			if !names[n] {
				t.Errorf("coverage table: %s is covered by %q, which is not a subtest of the suite", m, n)
			}
		}
	}
	seen := map[string]bool{}
	for _, g := range suite() {
		if seen[g.name] {
			t.Errorf("two groups named %s", g.name)
		}
		seen[g.name] = true
		for _, c := range g.tests {
			if seen[g.name+"/"+c.name] {
				t.Errorf("two subtests named %s/%s", g.name, c.name)
			}
			seen[g.name+"/"+c.name] = true
			if (c.run == nil) == (c.raw == nil) {
				t.Errorf("%s/%s must set exactly one of run and raw", g.name, c.name)
			}
		}
	}
}

func TestMapMemory(t *testing.T) {
	m := NewMapMemory()
	a := m.Alloc([]byte{1, 2, 3, 4})
	b := m.Alloc(make([]byte, 300))
	if a == 0 || b <= a.Add(4) || a%256 != 0 || b%256 != 0 {
		t.Fatalf("addresses %#x %#x", uint64(a), uint64(b))
	}
	got := make([]byte, 2)
	if err := m.Read(a.Add(1), got); err != nil || got[0] != 2 || got[1] != 3 {
		t.Errorf("Read = %v, %v", got, err)
	}
	if err := m.Write(b.Add(298), []byte{9, 9}); err != nil || m.Bytes(b)[299] != 9 {
		t.Errorf("Write at the end: %v", err)
	}
	for _, bad := range []struct {
		p gpu.DevicePtr
		n int
	}{{a.Add(3), 2}, {a.Add(4), 1}, {b.Add(299), 2}, {0, 1}, {a - 1, 1}} {
		err := m.Read(bad.p, make([]byte, bad.n))
		var fe *gpu.FaultError
		if !errors.As(err, &fe) || fe.Addr != bad.p || !errors.Is(err, gpu.ErrIllegalAddress) {
			t.Errorf("Read(%#x, %d) = %v, want a fault at that address", uint64(bad.p), bad.n, err)
		}
	}
}

func TestNaturalLayout(t *testing.T) {
	got := naturalLayout([]gpu.ArgKind{gpu.ArgI32, gpu.ArgPtr, gpu.ArgF32, gpu.ArgF64, gpu.ArgU32})
	want := []gpu.ParamInfo{{Offset: 0, Size: 4}, {Offset: 8, Size: 8}, {Offset: 16, Size: 4}, {Offset: 24, Size: 8}, {Offset: 32, Size: 4}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("naturalLayout = %v, want %v", got, want)
	}
}
