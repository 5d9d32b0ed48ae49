package gputest

import (
	"reflect"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
)

// TestDevUpdateCoverageTable checks the DeviceUpdates coverage table against
// the interface's methods and the suite's subtests.
func TestDevUpdateCoverageTable(t *testing.T) {
	methods := map[string]bool{}
	it := reflect.TypeFor[gpu.DeviceUpdates]()
	for i := range it.NumMethod() {
		m := it.Method(i).Name
		methods[m] = true
		if len(devUpdateCoverage[m]) == 0 {
			t.Errorf("gpu.DeviceUpdates.%s is not in the coverage table (coverage_devupdate.go)", m)
		}
	}
	names := suiteNames()
	for m, tests := range devUpdateCoverage {
		if !methods[m] {
			t.Errorf("coverage table names %s, which gpu.DeviceUpdates does not have", m)
		}
		for _, n := range tests {
			if !names[n] {
				t.Errorf("coverage table: %s is covered by %q, which is not a subtest of the suite", m, n)
			}
		}
	}
}
