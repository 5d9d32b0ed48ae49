package replay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/internal/steptest"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/remappable"
	"github.com/stablegraph/stablegraph/workload"
)

// TestRemapMatchesEagerOnWorkloads runs mlp, train and chain under remap
// with fresh addresses every step (every buffer a new physical allocation
// at a new address) and with ping-pong buffers: every output and every
// state after every step equals eager's bit for bit, the graph is recorded
// once, nothing is copied, and every bound buffer is remapped every step.
func TestRemapMatchesEagerOnWorkloads(t *testing.T) {
	const steps = 6
	for _, name := range []string{"mlp", "train", "chain"} {
		for _, pat := range []workload.Pattern{workload.Random, workload.PingPong} {
			t.Run(name+"/"+string(pat), func(t *testing.T) {
				b := simtest.New(t, 1)
				w := steptest.MustWorkload(t, name, workload.Config{Layers: 2, Width: 16, Batch: 4, K: 8, N: 64})
				want := steptest.RunWorkload(t, b, w, stablegraph.Options{Strategy: stablegraph.StrategyEager}, pat, steps, true)
				got := steptest.RunWorkload(t, b, w, stablegraph.Options{Strategy: stablegraph.StrategyRemap}, pat, steps, true)
				steptest.SameResults(t, got, want)
				bound := len(w.Params) + len(w.Outputs)
				for i, st := range got.Steps {
					last := st.Stats.Last
					records := int64(0)
					if i == 0 {
						records = 1
					}
					if last.Records != records || last.Rerecords != 0 || last.BytesCopied != 0 || last.PatchedNodes != 0 ||
						last.GraphLaunches != 1 || last.Remaps != int64(bound) {
						t.Errorf("step %d: %+v; want %d records, one launch, %d remaps, nothing copied or patched", i, last, records, bound)
					}
					for k, o := range w.Outputs {
						if st.OutAddrs[k] != st.Bind[o] {
							t.Errorf("step %d: output %s handed back at %#x, bound at %#x", i, o.Name(), uint64(st.OutAddrs[k]), uint64(st.Bind[o]))
						}
					}
				}
			})
		}
	}
}

// remapSetup is a pool program compiled with remap over a remappable
// allocator, with eager's outputs for a list of inputs.
type remapSetup struct {
	b   *sim.Backend
	s   gpu.Stream
	pp  *poolProgram
	a   *remappable.Allocator
	exe *stablegraph.Executable
}

func newRemapSetup(t *testing.T, b *sim.Backend, opts stablegraph.Options) *remapSetup {
	t.Helper()
	rs := &remapSetup{b: b, s: simtest.Stream(t, b, 0), pp: newPoolProgram(), a: steptest.NewRemappable(t, b, 0)}
	opts.Strategy, opts.Remap.Memory = stablegraph.StrategyRemap, rs.a
	rs.exe = steptest.Compile(t, b, rs.pp.p, opts)
	return rs
}

// set allocates x, y and s from the remappable allocator, x holding input
// i of the pool program's inputs.
func (rs *remapSetup) set(t *testing.T, i int) stablegraph.Bindings {
	t.Helper()
	bind := stablegraph.Bindings{}
	for _, buf := range []stablegraph.Buffer{rs.pp.x, rs.pp.y, rs.pp.s} {
		p, err := rs.a.Alloc(uint64(buf.Size()))
		if err != nil {
			t.Fatal(err)
		}
		bind[buf] = p
	}
	rs.writeX(t, bind[rs.pp.x], i)
	return bind
}

func (rs *remapSetup) writeX(t *testing.T, p gpu.DevicePtr, i int) {
	t.Helper()
	if err := rs.b.MemcpyHtoD(p, gpu.F32ToBytes(steptest.RandF32(steptest.NewRand(uint64(100+i)), rs.pp.n, 1))); err != nil {
		t.Fatal(err)
	}
}

// TestRemapRefusals binds what remap cannot map, one case at a time, to an
// executable that has run a step: each is refused before anything is
// unmapped (the live handles do not change), with the sentinel and text
// the case calls for, and the next good step still gives eager's results.
// A buffer bound a whole number of granules into its allocation is
// accepted.
func TestRemapRefusals(t *testing.T) {
	ctx := context.Background()
	b := simtest.New(t, 1)
	rs := newRemapSetup(t, b, stablegraph.Options{})
	pp := rs.pp
	// The steps that run: input 0, input 0 again after the refusals,
	// input 2 from an offset.
	in := pp.inputs(t, b, 3)
	want := pp.eagerOutputs(t, b, []gpu.DevicePtr{in[0], in[0], in[2]})
	gran := rs.a.Granularity()

	plain := simtest.Alloc(t, b, 0, uint64(pp.x.Size()))
	two, err := rs.a.Alloc(2 * gran) // a buffer of two granules
	if err != nil {
		t.Fatal(err)
	}
	three, err := rs.a.Alloc(3 * gran)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		bind     func(good stablegraph.Bindings) stablegraph.Bindings
		sentinel error
		text     []string
	}{
		{"plain device memory", func(g stablegraph.Bindings) stablegraph.Bindings {
			g[pp.x] = plain
			return g
		}, gpu.ErrNotSupported, []string{`param "x"`, "not memory of the remappable allocator"}},
		{"offset not a whole granule", func(g stablegraph.Bindings) stablegraph.Bindings {
			g[pp.x] = two + 256
			return g
		}, stablegraph.ErrInvalidBinding, []string{`param "x"`, "256 bytes into its physical allocation", "granules"}},
		{"two buffers share a granule", func(g stablegraph.Bindings) stablegraph.Bindings {
			g[pp.s] = g[pp.y]
			return g
		}, stablegraph.ErrInvalidBinding, []string{`output "y"`, `output "s"`, "overlaps"}},
		{"the third buffer on a chunk shares the first's granule", func(g stablegraph.Bindings) stablegraph.Bindings {
			g[pp.x], g[pp.y], g[pp.s] = three, three+gpu.DevicePtr(2*gran), three
			return g
		}, stablegraph.ErrInvalidBinding, []string{`param "x"`, `output "s"`, "overlaps"}},
	}
	good := rs.set(t, 0)
	if _, err := rs.exe.Run(ctx, rs.s, good); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := b.StreamSynchronize(rs.s); err != nil {
				t.Fatal(err)
			}
			before := b.LiveHandles()
			bind := c.bind(stablegraph.Bindings{pp.x: good[pp.x], pp.y: good[pp.y], pp.s: good[pp.s]})
			_, err := rs.exe.Run(ctx, rs.s, bind)
			if !errors.Is(err, c.sentinel) {
				t.Fatalf("Run = %v, want %v", err, c.sentinel)
			}
			for _, s := range c.text {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
			if after := b.LiveHandles(); after != before {
				t.Errorf("a refused step changed the live handles: %s, then %s", before, after)
			}
		})
	}
	// Usable after the refusals; x a whole granule into its allocation is
	// mapped from there.
	outs, err := rs.exe.Run(ctx, rs.s, good)
	if err != nil {
		t.Fatal(err)
	}
	if got := pp.read(t, rs.exe, outs); !bytes.Equal(got[0], want[1][0]) || !bytes.Equal(got[1], want[1][1]) {
		t.Fatal("the step after the refusals differs from eager")
	}
	rs.writeX(t, two+gpu.DevicePtr(gran), 2)
	outs, err = rs.exe.Run(ctx, rs.s, stablegraph.Bindings{pp.x: two + gpu.DevicePtr(gran), pp.y: good[pp.y], pp.s: good[pp.s]})
	if err != nil {
		t.Fatalf("x one granule into its allocation: %v", err)
	}
	if got := pp.read(t, rs.exe, outs); !bytes.Equal(got[0], want[2][0]) || !bytes.Equal(got[1], want[2][1]) {
		t.Fatal("x bound a granule into its allocation: differs from eager")
	}
}

// TestRemapRefusesTooLittleMemory: a buffer larger than a granule bound to
// an allocation of one granule is refused with ErrInvalidBinding saying how
// many bytes the range maps; nothing is mapped.
func TestRemapRefusesTooLittleMemory(t *testing.T) {
	ctx := context.Background()
	b := simtest.New(t, 1)
	a := steptest.NewRemappable(t, b, 0)
	gran := a.Granularity()
	p := stablegraph.NewProgram("big")
	x := p.Param("x", int64(gran)+4)
	y := p.Output("y", 4)
	p.Launch(kernels.Copy, kernels.Elementwise(1), stablegraph.Out(y.All()), stablegraph.In(x.Slice(0, 4)), stablegraph.I32(1))
	exe := steptest.Compile(t, b, p, stablegraph.Options{Strategy: stablegraph.StrategyRemap, StrategyOptions: stablegraph.StrategyOptions{Remap: stablegraph.RemapOptions{Memory: a}}})
	small, err := a.Alloc(gran)
	if err != nil {
		t.Fatal(err)
	}
	yp, err := a.Alloc(4)
	if err != nil {
		t.Fatal(err)
	}
	before := b.LiveHandles()
	_, err = exe.Run(ctx, simtest.Stream(t, b, 0), stablegraph.Bindings{x: small, y: yp})
	// The executable's extent check (gpu.CheckBinding) refuses it before
	// remap's own, which would ask for the whole granules.
	if !errors.Is(err, stablegraph.ErrInvalidBinding) || !strings.Contains(err.Error(), fmt.Sprintf(`param "x" needs %d bytes`, gran+4)) {
		t.Fatalf("Run = %v, want ErrInvalidBinding saying param x needs %d bytes", err, gran+4)
	}
	if after := b.LiveHandles(); after.Mappings != before.Mappings {
		t.Errorf("mappings %d, then %d", before.Mappings, after.Mappings)
	}
}

// TestRemapNeedsItsMemory: remap is refused at Compile, with
// gpu.ErrNotSupported and nothing left live, without a remappable
// allocator or without VMM; memory of another device than the step's is
// refused at Run.
func TestRemapNeedsItsMemory(t *testing.T) {
	ctx := context.Background()
	pp := newPoolProgram()
	for _, c := range []struct {
		name string
		b    func(*sim.Backend) gpu.Backend
		text string
	}{
		{"no allocator", func(b *sim.Backend) gpu.Backend { return b }, "Options.Remap.Memory"},
		{"no VMM", func(b *sim.Backend) gpu.Backend { return noVMM{Backend: b, hideVMM: true} }, "virtual memory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			sb := simtest.New(t, 1)
			steptest.WantCompileRefused(t, c.b(sb), sb, pp.p, stablegraph.Options{Strategy: stablegraph.StrategyRemap}, gpu.ErrNotSupported, c.text)
		})
	}
	t.Run("another device", func(t *testing.T) {
		b := simtest.New(t, 2)
		other := steptest.NewRemappable(t, b, 1)
		exe := steptest.Compile(t, b, pp.p, stablegraph.Options{Strategy: stablegraph.StrategyRemap, StrategyOptions: stablegraph.StrategyOptions{Remap: stablegraph.RemapOptions{Memory: other}}})
		bind := stablegraph.Bindings{}
		for _, buf := range []stablegraph.Buffer{pp.x, pp.y, pp.s} {
			p, err := other.Alloc(uint64(buf.Size()))
			if err != nil {
				t.Fatal(err)
			}
			bind[buf] = p
		}
		_, err := exe.Run(ctx, simtest.Stream(t, b, 0), bind)
		if !errors.Is(err, gpu.ErrNotSupported) || !strings.Contains(err.Error(), "device 1") {
			t.Fatalf("Run = %v, want gpu.ErrNotSupported naming device 1", err)
		}
	})
}

// TestRemapWaitsForTheStepBefore holds the stream behind a gate with a
// step queued: a step that binds the same buffers is enqueued at once (no
// wait: nothing is remapped), one that moves them waits for the queued
// step and, with the gate shut, fails at the deadline (Options.SlotWait,
// or ctx's) with gpu.ErrTimeout, having unmapped nothing. Once the gate
// opens, the queued steps give eager's results (their memory was not
// remapped under them) and the moving step runs.
func TestRemapWaitsForTheStepBefore(t *testing.T) {
	ctx := context.Background()
	b := simtest.New(t, 1)
	rs := newRemapSetup(t, b, stablegraph.Options{SlotWait: 40 * time.Millisecond})
	pp := rs.pp
	plain := pp.inputs(t, b, 2)
	want := pp.eagerOutputs(t, b, []gpu.DevicePtr{plain[0], plain[0], plain[1]})
	set0, set1 := rs.set(t, 0), rs.set(t, 1)

	gate := make(chan struct{})
	opened := false
	open := func() {
		if !opened {
			opened = true
			close(gate)
		}
	}
	defer open()
	if err := b.LaunchKernel(simtest.Gate(t, b, 0, gate), gpu.Linear(1, 1), nil, rs.s); err != nil {
		t.Fatal(err)
	}
	var queued stablegraph.Outputs
	for i := range 2 {
		outs, err := rs.exe.Run(ctx, rs.s, set0)
		if err != nil {
			t.Fatalf("step %d on the same buffers behind the gate: %v", i, err)
		}
		queued = outs
	}
	mappings := b.LiveHandles().Mappings
	start := time.Now()
	_, err := rs.exe.Run(ctx, rs.s, set1)
	if !errors.Is(err, gpu.ErrTimeout) {
		t.Fatalf("moving step behind the gate = %v, want gpu.ErrTimeout", err)
	}
	if el := time.Since(start); el < 30*time.Millisecond {
		t.Errorf("gave up after %v with a 40ms deadline", el)
	}
	short, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
	_, err = rs.exe.Run(short, rs.s, set1)
	cancel()
	if !errors.Is(err, gpu.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("moving step with a short context = %v", err)
	}
	if got := b.LiveHandles().Mappings; got != mappings {
		t.Errorf("mappings %d after the waits that failed, %d before", got, mappings)
	}
	if st := rs.exe.Stats(); st.Steps != 2 || st.Remaps != 3 {
		t.Errorf("steps %d, remaps %d; want 2 and 3 (the first step's)", st.Steps, st.Remaps)
	}
	open()
	if got := pp.read(t, rs.exe, queued); !bytes.Equal(got[0], want[1][0]) || !bytes.Equal(got[1], want[1][1]) {
		t.Fatal("the steps queued behind the gate differ from eager")
	}
	outs, err := rs.exe.Run(ctx, rs.s, set1)
	if err != nil {
		t.Fatal(err)
	}
	if got := pp.read(t, rs.exe, outs); !bytes.Equal(got[0], want[2][0]) || !bytes.Equal(got[1], want[2][1]) {
		t.Fatal("the moving step differs from eager")
	}
}

// TestRemapCompileFaults fails, one call at a time, every device call
// remap makes at Compile: each failure is returned and releases
// everything.
func TestRemapCompileFaults(t *testing.T) {
	b := simtest.New(t, 1)
	pp := newPoolProgram()
	a := steptest.NewRemappable(t, b, 0)
	steptest.CompileFaults(t, b, pp.p, stablegraph.Options{Strategy: stablegraph.StrategyRemap, StrategyOptions: stablegraph.StrategyOptions{Remap: stablegraph.RemapOptions{Memory: a}}},
		[]string{"DeviceProps", "EventCreate", "MemAddressReserve", "MemAlloc"}, true)
}

// TestRemapCloseReportsFailedRelease: a range whose unmap or free fails at
// Close, or the event or graph whose destruction fails, is reported, and
// everything else is still released: exactly the handles of the failed
// call stay live.
func TestRemapCloseReportsFailedRelease(t *testing.T) {
	for _, c := range []struct {
		op   string
		kept gpu.HandleCounts
	}{
		{"MemUnmap", gpu.HandleCounts{Mappings: 1, Reservations: 1}},
		{"MemAddressFree", gpu.HandleCounts{Reservations: 1}},
		{"EventDestroy", gpu.HandleCounts{Events: 1}},
		{"GraphExecDestroy", gpu.HandleCounts{GraphExecs: 1}},
	} {
		t.Run(c.op, func(t *testing.T) {
			// Not simtest.New: what failed to be released stays live by definition.
			b, err := sim.New(sim.Config{Devices: 1, DeviceMemory: 1 << 30})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			ctx := context.Background()
			s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
			if err != nil {
				t.Fatal(err)
			}
			a, err := remappable.New(b, 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			pp := newPoolProgram()
			exe, err := stablegraph.Compile(ctx, b, pp.p, stablegraph.Options{Strategy: stablegraph.StrategyRemap, StrategyOptions: stablegraph.StrategyOptions{Remap: stablegraph.RemapOptions{Memory: a}}})
			if err != nil {
				t.Fatal(err)
			}
			for range 2 {
				bind := stablegraph.Bindings{}
				for _, buf := range []stablegraph.Buffer{pp.x, pp.y, pp.s} {
					p, err := a.Alloc(uint64(buf.Size()))
					if err != nil {
						t.Fatal(err)
					}
					bind[buf] = p
				}
				if _, err := exe.Run(ctx, s, bind); err != nil {
					t.Fatal(err)
				}
			}
			if err := b.StreamDestroy(s); err != nil {
				t.Fatal(err)
			}
			if err := a.Close(); err != nil { // the ranges keep the chunks they map alive
				t.Fatal(err)
			}
			b.InjectFault(c.op, 0, nil)
			if err := exe.Close(); !errors.Is(err, gpu.ErrInjected) || !strings.Contains(err.Error(), c.op) {
				t.Fatalf("Close with %s failing = %v", c.op, err)
			}
			b.ClearFaults()
			if live := b.LiveHandles(); live != c.kept {
				t.Fatalf("live after Close: %s, want %s", live, c.kept)
			}
		})
	}
}

// TestRemapConcurrentRuns runs one remap executable from several
// goroutines, each on its own stream with its own two sets of remappable
// buffers: every step moves buffers, so every step waits for the one
// before, whichever goroutine ran it; every result must be eager's. Run
// under -race.
func TestRemapConcurrentRuns(t *testing.T) {
	const workers, steps = 4, 12
	w := steptest.MustWorkload(t, "mlp", workload.Config{Layers: 2, Width: 16, Batch: 2})
	b := simtest.New(t, 1)
	exe := steptest.Workers{
		Program: w.Program, X: w.Params[0], Y: w.Outputs[0], States: w.States,
		Input:   func(i int) []byte { return w.Input(i, 0) },
		Options: stablegraph.Options{Strategy: stablegraph.StrategyRemap, StrategyOptions: stablegraph.StrategyOptions{Remap: stablegraph.RemapOptions{Memory: steptest.NewRemappable(t, b, 0)}}},
		Workers: workers, Steps: steps,
		During: func(exe *stablegraph.Executable) error {
			_ = exe.Stats()
			return nil
		},
	}.Run(t, b)
	if st := exe.Stats(); st.Steps != workers*steps || st.Records != 1 || st.Remaps == 0 {
		t.Errorf("steps %d, records %d, remaps %d", st.Steps, st.Records, st.Remaps)
	}
}
