package graph_test

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/trace"
)

// noSetter hides the sim's gpu.GraphNodeSetter.
type noSetter struct{ gpu.Backend }

// TestPatchWholeMatchesEager: whole-graph updates from the host template,
// mixed with per-node patches, fresh and returning addresses, give eager's
// bits at every step; the template sets only the nodes whose buffers it
// does not hold where asked; a move it cannot take (another alignment
// class) is refused with nothing changed, and after a per-node move to
// another class the template is no longer used.
func TestPatchWholeMatchesEager(t *testing.T) {
	m := newMLP(t, 8, 128, 4, trace.Options{})
	a0 := m.fresh(0)
	m.eager(a0)
	x, err := m.cb.Instantiate(m.b, a0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Destroy(m.b)
	if _, err := m.cb.PatchWhole(noSetter{m.b}, x, m.fresh(0)); !errors.Is(err, gpu.ErrNotSupported) {
		t.Fatalf("PatchWhole without graph node setters: %v, want ErrNotSupported", err)
	}
	a1 := m.fresh(0)
	r := rand.New(rand.NewPCG(3, 4))
	step := func(name string, a []gpu.DevicePtr, whole bool, wantTemplate int) {
		t.Helper()
		// New inputs every step: a node left reading another step's x
		// computes other bits.
		if err := m.b.MemcpyHtoD(a[0], gpu.F32ToBytes(randF32(r, m.rows*m.w, 1))); err != nil {
			t.Fatal(err)
		}
		want := m.eager(a)
		w := m.cb.WholeCounts(x, a)
		if whole {
			if w.Why != "" {
				t.Fatalf("%s: %s", name, w.Why)
			}
			if w.Template != wantTemplate {
				t.Errorf("%s: %d template nodes to set, want %d", name, w.Template, wantTemplate)
			}
			n, err := m.cb.PatchWhole(m.b, x, a)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if n != w.Template {
				t.Errorf("%s: set %d template nodes, counted %d", name, n, w.Template)
			}
		} else if _, err := m.cb.Patch(m.b, x, a); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := x.Launch(m.b, m.s); err != nil {
			t.Fatal(err)
		}
		if got := m.out(a); got != want {
			t.Fatalf("%s: the step differs from eager", name)
		}
	}
	// x feeds the first GEMM (both of its split-K kernels have slots), y
	// is the last tanh's: 3 nodes.
	step("whole, fresh", a1, true, 3)
	step("per node, fresh", m.fresh(0), false, 0)
	step("whole, fresh again", m.fresh(0), true, 3)
	step("per node, fresh", m.fresh(0), false, 0)
	// Back to the addresses the template holds: the update alone brings
	// the exec there.
	a3, aP := m.fresh(0), m.fresh(0)
	step("whole", a3, true, 3)
	step("per node", aP, false, 0)
	step("whole, to the template's addresses", a3, true, 0)
	// The per-node path after it: the prepared nodes and the flattened
	// parameters followed the update, so moving back to aP moves them.
	step("per node, back", aP, false, 0)
	step("whole, to the template's addresses again", a3, true, 0)
	// Only x moves.
	a4 := append([]gpu.DevicePtr(nil), a3...)
	a4[0] = m.upload(m.xs, 0)
	step("whole, x only", a4, true, 2)

	odd := m.fresh(8)
	if w := m.cb.WholeCounts(x, odd); w.Why == "" {
		t.Fatal("a move to another alignment class was found possible from the template")
	}
	if _, err := m.cb.PatchWhole(m.b, x, odd); !errors.Is(err, gpu.ErrNotSupported) {
		t.Fatalf("PatchWhole to another class: %v", err)
	}
	// Refused with nothing changed: the exec still runs at a4.
	want := m.eager(a4)
	if err := x.Launch(m.b, m.s); err != nil {
		t.Fatal(err)
	}
	if got := m.out(a4); got != want {
		t.Fatal("a refused PatchWhole changed the exec")
	}
	step("per node, other class", odd, false, 0)
	if w := m.cb.WholeCounts(x, m.fresh(8)); w.Why == "" {
		t.Error("the template is still used after a per-node move to another class")
	}
}

// TestPatchAtMost: a move that would update more nodes than allowed is
// refused with nothing changed (the exec still runs at its old addresses),
// with the count WholeCounts gives; within the allowance it is Patch.
func TestPatchAtMost(t *testing.T) {
	m := newMLP(t, 8, 128, 4, trace.Options{})
	a0 := m.fresh(0)
	m.eager(a0)
	x, err := m.cb.Instantiate(m.b, a0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Destroy(m.b)
	a1 := m.fresh(0)
	moved := m.cb.WholeCounts(x, a1).Nodes
	if moved == 0 {
		t.Fatal("a fresh address set moves no node")
	}
	n, patched, err := m.cb.PatchAtMost(m.b, x, a1, moved-1)
	if err != nil || patched || n != moved {
		t.Fatalf("PatchAtMost(%d) of a move of %d nodes: %d, %v, %v; want %d, false, nil", moved-1, moved, n, patched, err, moved)
	}
	want := m.eager(a0)
	if err := x.Launch(m.b, m.s); err != nil {
		t.Fatal(err)
	}
	if got := m.out(a0); got != want {
		t.Fatal("a refused PatchAtMost changed the exec")
	}
	if n, patched, err = m.cb.PatchAtMost(m.b, x, a1, moved); err != nil || !patched || n == 0 || n > moved {
		t.Fatalf("PatchAtMost(%d) of a move of %d nodes: %d, %v, %v", moved, moved, n, patched, err)
	}
	want = m.eager(a1)
	if err := x.Launch(m.b, m.s); err != nil {
		t.Fatal(err)
	}
	if got := m.out(a1); got != want {
		t.Fatal("the step after PatchAtMost differs from eager")
	}
}
