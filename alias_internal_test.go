package stablegraph

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/kernels"
)

// TestOverlapRefusedWithoutAliasSafety: a strategy that does not say it
// handles overlapping bindings (replay.AliasSafe; every built-in one
// does) has a step whose written buffer overlaps another refused with
// ErrInvalidBinding naming both, before anything is enqueued, while
// overlaps of buffers only read pass.
func TestOverlapRefusedWithoutAliasSafety(t *testing.T) {
	ctx := context.Background()
	b := simtest.New(t, 1)
	s := simtest.Stream(t, b, 0)
	p := NewProgram("inplace")
	x, x2, y := p.Param("x", 64), p.Param("x2", 64), p.Output("y", 64)
	p.Launch(kernels.Axpb, kernels.Elementwise(16), Out(y.All()), In(x.All()), F32(2), F32(1), I32(16))
	p.Launch(kernels.Axpy, kernels.Elementwise(16), InOut(y.All()), In(x2.All()), F32(1), I32(16))
	exe, err := Compile(ctx, b, p, Options{Strategy: StrategyPatch})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := exe.Close(); err != nil {
			t.Error(err)
		}
	}()
	if !exe.aliasSafe {
		t.Fatal("patch does not say it handles overlapping bindings")
	}
	exe.aliasSafe = false // as a strategy without the capability
	mem := simtest.Alloc(t, b, 0, 256)
	_, err = exe.Run(ctx, s, Bindings{x: mem, x2: mem.Add(64), y: mem.Add(32)})
	if !errors.Is(err, ErrInvalidBinding) || !strings.Contains(err.Error(), `param "x"`) || !strings.Contains(err.Error(), `output "y"`) {
		t.Fatalf("an output over a param's tail: %v", err)
	}
	if st := exe.Stats(); st.Records != 0 || st.Steps != 0 {
		t.Fatalf("the refused step did work: %+v", st)
	}
	// Two params on one address, neither written: no hazard.
	if _, err := exe.Run(ctx, s, Bindings{x: mem, x2: mem, y: mem.Add(128)}); err != nil {
		t.Fatalf("params sharing memory, only read: %v", err)
	}
	if err := b.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
}
