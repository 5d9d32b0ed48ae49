// Package commtest holds the test helpers shared by the tests of
// collectives in one process (the root package's and workload's). It is
// imported by tests only.
package commtest

import (
	"testing"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
)

// Comms makes a communicator over devices 0..n-1 of b, closed at cleanup.
func Comms(t testing.TB, b gpu.Backend, n int) []*sg.Comm {
	t.Helper()
	devs := make([]int, n)
	for i := range devs {
		devs[i] = i
	}
	comms, err := sg.NewComms(b, devs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range comms {
			if err := c.Close(); err != nil {
				t.Error(err)
			}
		}
	})
	return comms
}
