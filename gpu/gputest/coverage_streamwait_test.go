package gputest

import (
	"reflect"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
)

// TestStreamWaitCoverageTable checks the StreamWaits coverage table against
// the interface's methods and the suite's subtests.
func TestStreamWaitCoverageTable(t *testing.T) {
	methods := map[string]bool{}
	it := reflect.TypeFor[gpu.StreamWaits]()
	for i := range it.NumMethod() {
		m := it.Method(i).Name
		methods[m] = true
		if len(streamWaitCoverage[m]) == 0 {
			t.Errorf("gpu.StreamWaits.%s is not in the coverage table (coverage_streamwait.go)", m)
		}
	}
	names := suiteNames()
	for m, tests := range streamWaitCoverage {
		if !methods[m] {
			t.Errorf("coverage table names %s, which gpu.StreamWaits does not have", m)
		}
		for _, n := range tests {
			if !names[n] {
				t.Errorf("coverage table: %s is covered by %q, which is not a subtest of the suite", m, n)
			}
		}
	}
}
