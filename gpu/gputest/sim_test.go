package gputest_test

import (
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/gputest"
	"github.com/stablegraph/stablegraph/gpu/sim"
)

// TestSim runs the conformance suite on the sim backend with two devices.
func TestSim(t *testing.T) {
	gputest.Run(t, func(t *testing.T) gpu.Backend {
		b, err := sim.New(sim.Config{Devices: 2})
		if err != nil {
			t.Fatalf("sim.New: %v", err)
		}
		return b
	})
}
