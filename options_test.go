package stablegraph_test

import (
	"context"
	"testing"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/internal/steptest"
)

// TestOptions: every strategy's name parses back, an unknown one does not,
// and Compile refuses options out of range.
func TestOptions(t *testing.T) {
	for _, s := range stablegraph.Strategies() {
		if got, err := stablegraph.ParseStrategy(string(s)); err != nil || got != s {
			t.Errorf("ParseStrategy(%q) = %q, %v", s, got, err)
		}
	}
	if _, err := stablegraph.ParseStrategy("stable-ish"); err == nil {
		t.Error("ParseStrategy accepted an unknown name")
	}
	b := simtest.New(t, 1)
	w := steptest.NewMLP(2, 8, 1, 8, 2)
	for _, o := range []stablegraph.Options{
		{Strategy: "nope"}, {Alignment: 24}, {TraceCacheSize: -1}, {Device: 3},
	} {
		if exe, err := stablegraph.Compile(context.Background(), b, w.P, o); err == nil {
			exe.Close()
			t.Errorf("Compile accepted %+v", o)
		}
	}
	exe, err := stablegraph.Compile(context.Background(), b, w.P, stablegraph.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	if exe.Strategy() != stablegraph.StrategyPatch {
		t.Errorf("default strategy %s", exe.Strategy())
	}
}
