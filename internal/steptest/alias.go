package steptest

import (
	"bytes"
	"context"
	"testing"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/kernels"
)

// Alias is the aliasing test program: buffers the caller may bind onto one
// another's memory, in the orders that make eager's semantics visible.
// Every buffer holds N floats:
//
//	y = 0.5·x + 1      (an output bound onto x: an in-place update)
//	u = 1.5·x2 − 2     (an output bound over x's tail: a partial overlap)
//	z = 2·x − 1        (reads x after y and u may have overwritten it)
//	w = 3·y + 0.25     (reads y after z, bound onto y, may have overwritten it)
//	acc += 0.5·z       (a state)
//	v = x              (a copy node reading x last)
//
// No command reads and writes overlapping memory except element for element
// (in place), so every binding has one result on any device.
type Alias struct {
	P                    *sg.Program
	N                    int
	X, X2, Y, U, Z, W, V sg.Buffer
	Acc                  sg.Buffer
}

// NewAlias declares the aliasing test program over n floats (n even).
func NewAlias(n int) *Alias {
	a := &Alias{N: n}
	p := sg.NewProgram("alias")
	a.P = p
	sz := int64(4 * n)
	a.X, a.X2 = p.Param("x", sz), p.Param("x2", sz)
	a.Y, a.U, a.Z, a.W, a.V = p.Output("y", sz), p.Output("u", sz), p.Output("z", sz), p.Output("w", sz), p.Output("v", sz)
	a.Acc = p.State("acc", sz)
	axpb := func(out, in sg.Buffer, k, c float32) {
		p.Launch(kernels.Axpb, kernels.Elementwise(n), sg.Out(out.All()), sg.In(in.All()), sg.F32(k), sg.F32(c), sg.I32(int32(n)))
	}
	axpb(a.Y, a.X, 0.5, 1)
	axpb(a.U, a.X2, 1.5, -2)
	axpb(a.Z, a.X, 2, -1)
	axpb(a.W, a.Y, 3, 0.25)
	p.Launch(kernels.Axpy, kernels.Elementwise(n), sg.InOut(a.Acc.All()), sg.In(a.Z.All()), sg.F32(0.5), sg.I32(int32(n)))
	p.Memcpy(a.V.All(), a.X.All())
	return a
}

// Bound lists the buffers the caller binds, in a fixed order.
func (a *Alias) Bound() []sg.Buffer { return []sg.Buffer{a.X, a.X2, a.Y, a.U, a.Z, a.W, a.V} }

// AliasCase places the bound buffers of one step in a region of the
// caller's memory: Off gives each buffer's offset in floats (by name), Span
// the region's size in floats. Hazard says whether a written buffer
// overlaps another (the strategies that copy then lay their copies out as
// the caller's).
type AliasCase struct {
	Name   string
	Off    map[string]int
	Span   int
	Hazard bool
}

// AliasCases are the placements tested: every buffer apart; an output
// onto the param it is computed from (in place); an output onto another
// output; an output over a param's tail; all outputs on one address;
// those together; and two params on one address, which is harmless.
func AliasCases(n int) []AliasCase {
	h := n / 2
	apart := func(order ...string) map[string]int {
		m := map[string]int{}
		for i, name := range order {
			m[name] = i * n
		}
		return m
	}
	with := func(m map[string]int, kv ...any) map[string]int {
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1].(int)
		}
		return m
	}
	return []AliasCase{
		{Name: "apart", Off: apart("x", "x2", "y", "u", "z", "w", "v"), Span: 7 * n},
		{Name: "in-place", Off: with(apart("x", "x2", "u", "z", "w", "v"), "y", 0), Span: 6 * n, Hazard: true},
		{Name: "two-outputs", Off: with(apart("x", "x2", "y", "u", "w", "v"), "z", 2*n), Span: 6 * n, Hazard: true},
		// u covers x's tail and y's head.
		{Name: "partial-tail", Off: with(apart("x", "y", "x2", "z", "w", "v"), "u", h), Span: 6 * n, Hazard: true},
		{Name: "outputs-shared", Off: map[string]int{"x": 0, "x2": n, "y": 2 * n, "u": 2 * n, "z": 2 * n, "w": 2 * n, "v": 3 * n}, Span: 4 * n, Hazard: true},
		{Name: "in-place-and-tail", Off: map[string]int{"x": 0, "y": 0, "u": h, "x2": 2 * n, "z": 3 * n, "w": 4 * n, "v": 5 * n}, Span: 6 * n, Hazard: true},
		{Name: "params-shared", Off: with(apart("x", "y", "u", "z", "w", "v"), "x2", 0), Span: 6 * n},
	}
}

// AliasStep is what one step of RunAlias saw: the whole region after the
// step, and the state.
type AliasStep struct {
	Region []byte
	Acc    []byte
	Stats  sg.Stats
}

// RunAlias runs steps of a under opts on b and s, each with the buffers
// placed by c in a region of an arena that moves as move says (the same
// region, two in turn, or a new one every step among live allocations),
// filled before the step with inputs drawn from the step number. It
// returns the region and the state after every step.
func RunAlias(t testing.TB, b gpu.Backend, s gpu.Stream, a *Alias, c AliasCase, opts sg.Options, move Movement, steps int) []AliasStep {
	t.Helper()
	ctx := context.Background()
	arena := NewArena(t, b, 8<<20)
	exe := Compile(t, b, a.P, opts)
	r := NewRand(uint64(len(c.Name)))
	var sets []gpu.DevicePtr
	var spacers []gpu.DevicePtr
	alloc := func() gpu.DevicePtr {
		p, err := arena.Alloc(uint64(4 * c.Span))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	free := func(p gpu.DevicePtr) {
		if err := arena.Free(p); err != nil {
			t.Fatal(err)
		}
	}
	switch move {
	case Fixed:
		sets = []gpu.DevicePtr{alloc()}
	case PingPong:
		sets = []gpu.DevicePtr{alloc(), alloc()}
	}
	var prev gpu.DevicePtr
	defer func() {
		for _, p := range append(append(sets, spacers...), prev) {
			if p != 0 {
				free(p)
			}
		}
	}()
	var out []AliasStep
	for i := range steps {
		var region gpu.DevicePtr
		if move == Random {
			// A new region among live allocations; the last one is freed
			// after (a caching allocator's churn).
			p, err := arena.Alloc(uint64(256 * (1 + r.IntN(16))))
			if err != nil {
				t.Fatal(err)
			}
			spacers = append(spacers, p)
			region = alloc()
			if prev != 0 {
				free(prev)
			}
			prev = region
		} else {
			region = sets[i%len(sets)]
		}
		in := gpu.F32ToBytes(RandF32(NewRand(uint64(1000+i)), c.Span, 1))
		if err := b.MemcpyHtoD(region, in); err != nil {
			t.Fatal(err)
		}
		bind := sg.Bindings{}
		for _, buf := range a.Bound() {
			off, ok := c.Off[buf.Name()]
			if !ok {
				t.Fatalf("case %s places no %s", c.Name, buf.Name())
			}
			bind[buf] = region.Add(uint64(4 * off))
		}
		outs, err := exe.Run(ctx, s, bind)
		if err != nil {
			t.Fatalf("%s, %s, step %d: %v", c.Name, exe.Strategy(), i, err)
		}
		outs.Release()
		if err := b.StreamSynchronize(s); err != nil {
			t.Fatal(err)
		}
		st := AliasStep{Region: make([]byte, 4*c.Span), Stats: exe.Stats()}
		if err := b.MemcpyDtoH(st.Region, region); err != nil {
			t.Fatal(err)
		}
		if st.Acc, err = exe.ReadBuffer(ctx, a.Acc); err != nil {
			t.Fatal(err)
		}
		out = append(out, st)
	}
	return out
}

// SameAlias fails the test at the first step whose region or state differs
// from want's.
func SameAlias(t testing.TB, what string, got, want []AliasStep) {
	t.Helper()
	for i := range want {
		if !bytes.Equal(got[i].Region, want[i].Region) {
			t.Fatalf("%s: step %d (ran %s): the caller's memory differs from eager's at byte %d", what, i, got[i].Stats.Ran, firstDiff(got[i].Region, want[i].Region))
		}
		if !bytes.Equal(got[i].Acc, want[i].Acc) {
			t.Fatalf("%s: step %d (ran %s): the state differs from eager's", what, i, got[i].Stats.Ran)
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
