package replay

import (
	"math"
	"testing"

	"github.com/stablegraph/stablegraph/internal/graph"
)

// TestPerNodeAtMost: patch asks the template exactly when the per-node
// updates of the moved nodes cost more than the update of the whole graph
// alone; a model without a per-node price never asks it.
func TestPerNodeAtMost(t *testing.T) {
	c := DefaultCosts()
	for _, graphNodes := range []int{1, 16, 300, 5000} {
		most := c.perNodeAtMost(graphNodes)
		whole := c.wholeUS(graph.Whole{Graph: graphNodes})
		for moved := 0; moved <= 2*most+2; moved++ {
			if got, want := moved > most, float64(moved)*c.NodeUpdateUS > whole; got != want {
				t.Fatalf("graph of %d nodes, %d moved: over the allowance %v, dearer than the whole update %v", graphNodes, moved, got, want)
			}
		}
	}
	c.NodeUpdateUS = 0
	if got := c.perNodeAtMost(16); got != math.MaxInt {
		t.Errorf("without a per-node price: %d, want no limit", got)
	}
}
