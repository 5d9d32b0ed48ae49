package workload

import (
	"context"
	"errors"
	"strings"
	"testing"

	sg "github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/vmm"
)

// TestRemappableCaller: a remappable caller binds every buffer to a
// physical allocation of its own, which its Remappable finds; fixed keeps
// them, pingpong alternates two sets, random binds new ones (new chunks at
// new addresses) every step and frees the step before's; the inputs are
// the bfc caller's; Close frees everything. Only remap gets it.
func TestRemappableCaller(t *testing.T) {
	if CallerOptionsFor(sg.StrategyRemap) != (CallerOptions{Remappable: true}) || CallerOptionsFor(sg.StrategyPool).Remappable {
		t.Fatal("CallerOptionsFor gives remappable memory to another strategy than remap, or not to remap")
	}
	b := openSim(t)
	w := small(t, "mlp")
	for _, pat := range Patterns() {
		t.Run(string(pat), func(t *testing.T) {
			c, err := NewCallerWith(b, 0, w, pat, 1, CallerOptions{Remappable: true})
			if err != nil {
				t.Fatal(err)
			}
			plain, err := NewCaller(b, 0, w, pat, 1)
			if err != nil {
				t.Fatal(err)
			}
			if plain.Remappable() != nil || c.Remappable() == nil {
				t.Fatal("Remappable: the bfc caller has an allocator, or the remappable one none")
			}
			var prev map[*vmm.PhysicalAllocation]bool
			for step := range 4 {
				bind, err := c.Bind(step)
				if err != nil {
					t.Fatal(err)
				}
				want, err := plain.Bind(step)
				if err != nil {
					t.Fatal(err)
				}
				chunks := map[*vmm.PhysicalAllocation]bool{}
				for buf, p := range bind {
					chunk, off, err := c.Remappable().Chunk(p)
					if err != nil || off != 0 {
						t.Fatalf("step %d: %s at %#x: chunk offset %d, %v", step, buf.Name(), uint64(p), off, err)
					}
					chunks[chunk] = true
				}
				if len(chunks) != len(bind) {
					t.Errorf("step %d: %d chunks for %d buffers", step, len(chunks), len(bind))
				}
				for i, buf := range w.Params {
					got := make([]byte, buf.Size())
					if err := b.MemcpyDtoH(got, bind[buf]); err != nil {
						t.Fatal(err)
					}
					if string(got) != string(w.Input(step, i)) {
						t.Errorf("step %d: input %s not written", step, buf.Name())
					}
					if _, ok := want[buf]; !ok {
						t.Errorf("the bfc caller does not bind %s", buf.Name())
					}
				}
				if prev != nil {
					same := 0
					for ch := range chunks {
						if prev[ch] {
							same++
						}
					}
					wantSame := map[Pattern]int{Fixed: len(bind)}[pat] // pingpong: the other set; random: new ones
					if same != wantSame {
						t.Errorf("step %d: %d of %d chunks as the step before, want %d", step, same, len(bind), wantSame)
					}
				}
				prev = chunks
			}
			if err := errors.Join(c.Close(), plain.Close()); err != nil {
				t.Fatal(err)
			}
			if live, _ := gpu.LiveHandles(b); !live.IsZero() {
				t.Fatalf("live after Close: %s", live)
			}
		})
	}
}

// TestRemapRunUsesRemappableCaller: Run of remap on a device without VMM
// fails making the remappable caller, saying so, with nothing left live;
// with VMM, remap's outputs match eager's under every pattern (Bench).
func TestRemapRunUsesRemappableCaller(t *testing.T) {
	b := openSim(t)
	w := small(t, "chain")
	rep, err := Bench(context.Background(), b, w, []sg.Strategy{sg.StrategyRemap}, RunOptions{Steps: 3, Pattern: Random, NoFloor: true, WallBatches: 1, WallBatchSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := rep.Result("remap"); !ok || !r.OutputsMatchEager || r.BytesCopied != 0 {
		t.Fatalf("remap row %+v", r)
	}
	_, err = Run(context.Background(), noVMM{b}, w, RunOptions{Strategy: sg.StrategyRemap, Steps: 1})
	if !errors.Is(err, gpu.ErrNotSupported) {
		t.Fatalf("remap without VMM = %v, want gpu.ErrNotSupported", err)
	}
	if live, _ := gpu.LiveHandles(b); !live.IsZero() {
		t.Fatalf("live: %s", live)
	}
}

// noVMM is a backend whose devices report no virtual memory management.
type noVMM struct{ gpu.Backend }

func (b noVMM) DeviceProps(dev int) (gpu.DeviceProps, error) {
	p, err := b.Backend.DeviceProps(dev)
	p.VMM, p.Granularity = false, 0
	return p, err
}

// TestCallerMakesInputsAhead: the inputs a caller writes are each step's
// own, whether the loader made them ahead (steps bound in order), made
// them for a step that was not bound next (a jump, and back), or the same
// knob writes step 0's; BindBatch's too; and after Close no making is left
// in flight.
func TestCallerMakesInputsAhead(t *testing.T) {
	b := openSim(t)
	w := small(t, "train") // two params
	c, err := NewCaller(b, 0, w, Random, 1)
	if err != nil {
		t.Fatal(err)
	}
	check := func(bind sg.Bindings, step int) {
		t.Helper()
		for i := range w.Params {
			checkInput(t, b, w, bind, step, i)
		}
	}
	for _, step := range []int{0, 1, 2, 7, 3, 4} {
		bind, err := c.Bind(step)
		if err != nil {
			t.Fatal(err)
		}
		check(bind, step)
	}
	binds, release, err := c.BindBatch(10, 3)
	if err != nil {
		t.Fatal(err)
	}
	for i, bind := range binds {
		check(bind, 10+i)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	c.sameInput = true
	bind, err := c.Bind(20)
	if err != nil {
		t.Fatal(err)
	}
	check(bind, 0)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if c.loader.pending {
		t.Error("an input is still being made after Close")
	}
}

// TestCallerPinnedInputs: with PinnedInputs the caller makes every step's
// inputs in page-locked host memory of its own (two sets, one per param)
// and writes each step's own; Close frees it; a gpt2-decode workload and a
// backend without page-locked memory are refused with errors that say so.
func TestCallerPinnedInputs(t *testing.T) {
	b := openSim(t)
	hc := b.(gpu.HandleCounter)
	before := hc.LiveHandles().HostAllocs
	w := small(t, "train")
	c, err := NewCallerWith(b, 0, w, Random, 1, CallerOptions{PinnedInputs: true})
	if err != nil {
		t.Fatal(err)
	}
	if n := hc.LiveHandles().HostAllocs - before; n != 2*len(w.Params) {
		t.Errorf("%d page-locked buffers for %d params; want two sets", n, len(w.Params))
	}
	pinned := func(p []byte) bool {
		for _, m := range c.pinned {
			if len(p) > 0 && len(m.Bytes) > 0 && &p[0] == &m.Bytes[0] {
				return true
			}
		}
		return false
	}
	for _, step := range []int{0, 1, 2, 5, 6} {
		bind, err := c.Bind(step)
		if err != nil {
			t.Fatal(err)
		}
		for i, buf := range w.Params {
			checkInput(t, b, w, bind, step, i)
			if !pinned(c.loader.cur[i]) {
				t.Fatalf("step %d: input %s was not made in the page-locked buffers", step, buf.Name())
			}
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n := hc.LiveHandles().HostAllocs; n != before {
		t.Errorf("%d page-locked buffers live after Close, %d before", n, before)
	}
	if _, err := NewCallerWith(b, 0, small(t, "gpt2-decode-tiny"), Fixed, 1, CallerOptions{PinnedInputs: true}); err == nil || !strings.Contains(err.Error(), "pinned inputs") {
		t.Errorf("gpt2-decode with pinned inputs: %v", err)
	}
	type plain struct{ gpu.Backend }
	if _, err := NewCallerWith(plain{b}, 0, w, Fixed, 1, CallerOptions{PinnedInputs: true}); !errors.Is(err, gpu.ErrNotSupported) {
		t.Errorf("a backend without page-locked memory: %v", err)
	}
	if n := hc.LiveHandles().HostAllocs; n != before {
		t.Errorf("%d page-locked buffers live after the refusals, %d before", n, before)
	}
}

// checkInput fails t unless param i of w, bound in bind, holds step's input.
func checkInput(t *testing.T, b gpu.Backend, w *Workload, bind sg.Bindings, step, i int) {
	t.Helper()
	buf := w.Params[i]
	got := make([]byte, buf.Size())
	if err := b.MemcpyDtoH(got, bind[buf]); err != nil {
		t.Fatal(err)
	}
	if string(got) != string(w.Input(step, i)) {
		t.Fatalf("step %d: input %s is not the step's", step, buf.Name())
	}
}

// countingAlloc counts a caller's allocations and frees.
type countingAlloc struct {
	allocator
	allocs, frees int
}

func (a *countingAlloc) Alloc(size uint64) (gpu.DevicePtr, error) {
	a.allocs++
	return a.allocator.Alloc(size)
}

func (a *countingAlloc) Free(p gpu.DevicePtr) error {
	a.frees++
	return a.allocator.Free(p)
}

// dtodCounter counts device-to-device copies.
type dtodCounter struct {
	gpu.Backend
	n int
}

func (b *dtodCounter) MemcpyDtoD(dst, src gpu.DevicePtr, size uint64) error {
	b.n++
	return b.Backend.MemcpyDtoD(dst, src, size)
}

// TestCallerShadowMoves: a fixed caller with ShadowMoves binds the same
// buffers every step, with every step's inputs, while every Bind allocates
// and frees what a random caller's does (the fillers churned, a fresh set)
// and, for gpt2-decode, copies every cache from the second step on, each
// cache keeping its address and its contents; a moving pattern refuses it.
func TestCallerShadowMoves(t *testing.T) {
	b := openSim(t)
	w := small(t, "train")
	c, err := NewCallerWith(b, 0, w, Fixed, 1, CallerOptions{ShadowMoves: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	count := &countingAlloc{allocator: c.alloc}
	c.alloc = count
	var first sg.Bindings
	for step := range 4 {
		allocs, frees := count.allocs, count.frees
		bind, err := c.Bind(step)
		if err != nil {
			t.Fatal(err)
		}
		if step == 0 {
			first = bind
		}
		for _, buf := range w.movable() {
			if bind[buf] != first[buf] {
				t.Fatalf("step %d: %s moved from %#x to %#x", step, buf.Name(), first[buf], bind[buf])
			}
		}
		for i := range w.Params {
			checkInput(t, b, w, bind, step, i)
		}
		if n := count.allocs - allocs; n < len(w.movable()) {
			t.Errorf("step %d: %d allocations; want a fresh set of %d at least", step, n, len(w.movable()))
		}
		// The fillers are made at the first Bind and churned after it;
		// the fresh set is freed at once.
		if live := (count.allocs - count.frees) - (allocs - frees); step > 0 && live != 0 {
			t.Errorf("step %d: %d allocations left live", step, live)
		}
		if len(c.filler) != fillers {
			t.Errorf("step %d: %d fillers; want %d, churned", step, len(c.filler), fillers)
		}
	}

	dc := &dtodCounter{Backend: b}
	gw := small(t, "gpt2-decode-tiny")
	gc, err := NewCallerWith(dc, 0, gw, Fixed, 1, CallerOptions{ShadowMoves: true})
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	caches := func() [][]byte {
		var out [][]byte
		for _, p := range gc.seq.seqs {
			data := make([]byte, 4*gw.gpt2.cacheFloats())
			if err := b.MemcpyDtoH(data, p); err != nil {
				t.Fatal(err)
			}
			out = append(out, data)
		}
		return out
	}
	seqs := append([]gpu.DevicePtr(nil), gc.seq.seqs...)
	before := caches()
	for step := range 3 {
		n := dc.n
		bind, err := gc.Bind(step)
		if err != nil {
			t.Fatal(err)
		}
		want := 0
		if step > 0 {
			want = len(seqs)
		}
		if got := dc.n - n; got != want {
			t.Errorf("step %d: %d cache copies; want %d", step, got, want)
		}
		for r, buf := range gw.gpt2.caches {
			if bind[buf] != seqs[r] {
				t.Errorf("step %d: the cache of row %d moved from %#x to %#x", step, r, seqs[r], bind[buf])
			}
		}
	}
	for i, data := range caches() {
		if string(data) != string(before[i]) {
			t.Errorf("the cache of sequence %d changed under the shadow moves", i)
		}
	}
	if _, err := NewCallerWith(b, 0, w, Random, 1, CallerOptions{ShadowMoves: true}); err == nil || !strings.Contains(err.Error(), "shadow moves") {
		t.Errorf("random with shadow moves: %v", err)
	}
}
