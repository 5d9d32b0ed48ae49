package faultcampaign

import (
	"fmt"
	"slices"
	"testing"
)

// TestSampleRotates: Every's sample takes one site in every, from the
// rotation on; neighbouring rotations take different sites, and the every
// rotations together take each site exactly once.
func TestSampleRotates(t *testing.T) {
	var sites []Site
	for i := range 10 {
		sites = append(sites, Site{Phase: "run[0]", Op: "Op", Nth: i})
	}
	if got := sample(sites, 1, 5); !slices.Equal(got, sites) {
		t.Fatalf("every 1 sampled: %v", got)
	}
	if got := sample(sites, 0, 5); !slices.Equal(got, sites) {
		t.Fatalf("every 0 sampled: %v", got)
	}
	for _, every := range []int{2, 3, 4} {
		seen := map[int]int{}
		for rot := range every {
			got := sample(sites, every, rot+every) // rotations wrap
			if want := (len(sites) - rot + every - 1) / every; len(got) != want {
				t.Fatalf("every %d, rotation %d: %d sites, want %d", every, rot, len(got), want)
			}
			if got[0].Nth != rot {
				t.Fatalf("every %d, rotation %d: starts at %v", every, rot, got[0])
			}
			for _, s := range got {
				seen[s.Nth]++
			}
		}
		for i := range sites {
			if seen[i] != 1 {
				t.Errorf("every %d: site %d taken %d times over the rotations", every, i, seen[i])
			}
		}
	}
	if got := fmt.Sprint(sample(sites, 3, -1)); got != fmt.Sprint(sample(sites, 3, 2)) {
		t.Errorf("a negative offset: %s", got)
	}
}
