package replay_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/internal/steptest"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/workload"
)

// TestDeviceMatchesEagerOnWorkloads runs the device strategy on every
// workload, small, under every movement of the caller's buffers, fresh
// addresses every step included: every output and state after every step
// equals eager's, and after the first step nothing is recorded, captured
// or uploaded again, and nothing moves from the host: every pointer moves
// on the device, the GEMMs' kernels at their templates' slots, the copies
// of train and dp as copy kernels. With DeviceOptions.HostLead (with the
// ring of tables, and with the inline patcher) the step's first command
// moves from the host (hostLead: a kernel's node, or a GEMM's one or two),
// and nothing else does.
func TestDeviceMatchesEagerOnWorkloads(t *testing.T) {
	const steps = 6
	for _, c := range []struct {
		name string
		cfg  workload.Config
	}{
		{"mlp", workload.Config{Layers: 3, Width: 16, Batch: 4}},
		{"mlp-large", workload.Config{Layers: 2, Width: 32, Batch: 8}},
		{"train", workload.Config{Layers: 2, Width: 16, Batch: 4}},
		{"chain", workload.Config{K: 12, N: 64}},
		{"chain-moving", workload.Config{K: 12, N: 64}},
		{"dp", workload.Config{Layers: 2, Width: 16, Batch: 4}},
		{"gpt2-decode-tiny", workload.Config{Batch: 3, Layers: 1}},
	} {
		w := steptest.MustWorkload(t, c.name, c.cfg)
		patterns := workload.Patterns()
		if strings.HasPrefix(c.name, "gpt2") {
			patterns = append(patterns, workload.Swap)
		}
		for _, pattern := range patterns {
			for _, v := range []struct {
				name string
				opts stablegraph.DeviceOptions
			}{
				{"", stablegraph.DeviceOptions{}},
				{"/inline", stablegraph.DeviceOptions{Inline: true}},
				{"/host-lead", stablegraph.DeviceOptions{HostLead: true}},
				{"/inline-host-lead", stablegraph.DeviceOptions{Inline: true, HostLead: true}},
			} {
				t.Run(c.name+"/"+string(pattern)+v.name, func(t *testing.T) {
					b := simtest.New(t, 1)
					want := steptest.RunWorkload(t, b, w, stablegraph.Options{Strategy: stablegraph.StrategyEager}, pattern, steps, true)
					got := steptest.RunWorkload(t, b, w, stablegraph.Options{Strategy: stablegraph.StrategyDevice,
						StrategyOptions: stablegraph.StrategyOptions{DeviceStrategy: v.opts}}, pattern, steps, true)
					steptest.SameResults(t, got, want)
					moves := 0
					for i, st := range got.Steps {
						last := st.Stats.Last
						if i == 0 {
							if last.Records != 1 || last.GraphLaunches != 1 {
								t.Errorf("first step: %+v", last)
							}
							continue
						}
						if last.Records != 0 || last.TracesCaptured != 0 || last.PatchedNodes > 2 || last.GraphUploads != 0 ||
							last.UpdateFallbacks != 0 || last.GraphLaunches != 1 || last.Launches != 0 ||
							((pattern == workload.Fixed || !v.opts.HostLead) && last.PatchedNodes != 0) {
							t.Errorf("step %d: %+v", i, last)
						}
						if last.DeviceUpdates > 0 {
							moves++
						} else if st.Moved && pattern != workload.Swap {
							// Under swap only rows of the caches move, and
							// they may come back where the device holds them.
							t.Errorf("step %d moved, but nothing moved on the device", i)
						}
					}
					if pattern != workload.Fixed && moves == 0 {
						t.Error("no pointer moved on the device")
					}
				})
			}
		}
	}
}

// stepper runs an executable with bindings chosen by the test: before each
// step the params' contents are written where they are bound, after it the
// outputs are read back.
type stepper struct {
	t   *testing.T
	b   gpu.Backend
	s   gpu.Stream
	exe *stablegraph.Executable
}

func newStepper(t *testing.T, b gpu.Backend, p *stablegraph.Program, opts stablegraph.Options) *stepper {
	t.Helper()
	return &stepper{t: t, b: b, s: simtest.Stream(t, b, 0), exe: steptest.Compile(t, b, p, opts)}
}

// step writes in to the params bound, runs one step and returns the
// contents of outs.
func (sp *stepper) step(bind stablegraph.Bindings, in map[stablegraph.Buffer][]byte, outs ...stablegraph.Buffer) [][]byte {
	sp.t.Helper()
	for buf, data := range in {
		if err := sp.b.MemcpyHtoD(bind[buf], data); err != nil {
			sp.t.Fatal(err)
		}
	}
	o, err := sp.exe.Run(context.Background(), sp.s, bind)
	if err != nil {
		sp.t.Fatal(err)
	}
	defer o.Release()
	var res [][]byte
	for _, buf := range outs {
		data, err := sp.exe.ReadOutput(context.Background(), o, buf)
		if err != nil {
			sp.t.Fatal(err)
		}
		res = append(res, data)
	}
	return res
}

// leadIn makes p's first command one over a temp, so that no command of
// what follows is the step's first: the device strategy moves the first
// command from the host when it points into a bound buffer (hostLead), and
// these tests are about how the commands after it move.
func leadIn(p *stablegraph.Program) {
	t := p.Temp("lead-in", 4)
	p.Memset(t.All(), 0, 4)
}

// TestDeviceHostPath: copies and memsets the device strategy cannot make
// kernels (a size that is no whole number of 4-byte elements) move from
// the host, with no upload (they are not opted in), while the kernel's
// pointers move on the device; the bits are eager's.
func TestDeviceHostPath(t *testing.T) {
	b := simtest.New(t, 1)
	p := stablegraph.NewProgram("odd-copies")
	const n = 16
	x := p.Param("x", 4*n)
	y := p.Output("y", 4*n)
	raw := p.Output("raw", 6)
	pad := p.Output("pad", 7)
	leadIn(p)
	p.Launch(kernels.Axpb, kernels.Elementwise(n), stablegraph.Out(y.All()), stablegraph.In(x.All()), stablegraph.F32(2), stablegraph.F32(1), stablegraph.I32(n))
	p.Memcpy(raw.All(), x.Slice(2, 6))
	p.Memset(pad.All(), 0xab, 1)
	eager := newStepper(t, b, p, stablegraph.Options{Strategy: stablegraph.StrategyEager})
	dev := newStepper(t, b, p, stablegraph.Options{Strategy: stablegraph.StrategyDevice})
	a := steptest.NewArena(t, b, 1<<20)
	for i := range 5 {
		bind := stablegraph.Bindings{}
		for _, buf := range []stablegraph.Buffer{x, y, raw, pad} {
			ptr, err := a.Alloc(uint64(buf.Size()))
			if err != nil {
				t.Fatal(err)
			}
			defer a.Free(ptr)
			bind[buf] = ptr
		}
		in := map[stablegraph.Buffer][]byte{x: gpu.F32ToBytes(simtest.Ramp(n, float32(i)))}
		want := eager.step(bind, in, y, raw, pad)
		got := dev.step(bind, in, y, raw, pad)
		for k := range want {
			if !slices.Equal(got[k], want[k]) {
				t.Fatalf("step %d output %d: %x, eager %x", i, k, got[k], want[k])
			}
		}
		last := dev.exe.Stats().Last
		if i > 0 && (last.PatchedNodes != 2 || last.GraphUploads != 0 || last.DeviceUpdates != 2 || last.Records != 0) {
			t.Errorf("step %d: %+v; want the copy and the memset moved from the host, no upload, both pointers of the kernel moved", i, last)
		}
	}
}

// TestDeviceCopyKernelLeavesAlignment: a copy recorded as a copy kernel
// whose buffers move off 4-byte alignment is recorded again, as a copy
// node then (moved from the host while it stays unaligned); the bits are
// eager's throughout.
func TestDeviceCopyKernelLeavesAlignment(t *testing.T) {
	b := simtest.New(t, 1)
	p := stablegraph.NewProgram("copy")
	x := p.Param("x", 64)
	y := p.Output("y", 64)
	leadIn(p)
	p.Memcpy(y.All(), x.All())
	eager := newStepper(t, b, p, stablegraph.Options{Strategy: stablegraph.StrategyEager})
	dev := newStepper(t, b, p, stablegraph.Options{Strategy: stablegraph.StrategyDevice})
	for i, shift := range []uint64{0, 0, 2, 2, 6, 0} {
		bind := stablegraph.Bindings{x: simtest.Alloc(t, b, 0, 128).Add(shift), y: simtest.Alloc(t, b, 0, 128).Add(shift)}
		in := map[stablegraph.Buffer][]byte{x: []byte(strings.Repeat(fmt.Sprintf("step %d ", i), 16)[:64])}
		want := eager.step(bind, in, y)
		if got := dev.step(bind, in, y); !slices.Equal(got[0], want[0]) {
			t.Fatalf("step %d (shift %d): %q, eager %q", i, shift, got[0], want[0])
		}
		last := dev.exe.Stats().Last
		switch i {
		case 1:
			if last.DeviceUpdates != 2 || last.GraphUploads != 0 {
				t.Errorf("step %d: %+v; the copy kernel moves on the device", i, last)
			}
		case 2:
			if last.UpdateFallbacks != 1 || last.Rerecords != 1 {
				t.Errorf("step %d: %+v; want a fallback to recording at unaligned addresses", i, last)
			}
		case 3, 4, 5:
			if last.Records != 0 || last.PatchedNodes != 1 || last.GraphUploads != 0 {
				t.Errorf("step %d: %+v; want the copy node moved from the host, no upload", i, last)
			}
		}
	}
}

// TestDeviceGEMMNewAlignmentClass: a GEMM whose operand moves to an
// address of another alignment class is recorded again (the library may
// choose other kernels there); the bits are eager's.
func TestDeviceGEMMNewAlignmentClass(t *testing.T) {
	b := simtest.New(t, 1)
	const m, k, n = 4, 8, 8
	p := stablegraph.NewProgram("gemm")
	x := p.Param("x", 4*m*k)
	y := p.Output("y", 4*m*n)
	wt := p.Constant("w", gpu.F32ToBytes(simtest.Ramp(k*n, 0.25)))
	leadIn(p)
	p.Gemm(y.All(), x.All(), wt.All(), stablegraph.GEMM{M: m, N: n, K: k, Alpha: 1})
	eager := newStepper(t, b, p, stablegraph.Options{Strategy: stablegraph.StrategyEager})
	dev := newStepper(t, b, p, stablegraph.Options{Strategy: stablegraph.StrategyDevice})
	for i, shift := range []uint64{0, 0, 4, 4, 0} {
		bind := stablegraph.Bindings{x: simtest.Alloc(t, b, 0, 4*m*k+256).Add(shift), y: simtest.Alloc(t, b, 0, 4*m*n+256).Add(shift)}
		in := map[stablegraph.Buffer][]byte{x: gpu.F32ToBytes(simtest.Ramp(m*k, float32(i)))}
		want := eager.step(bind, in, y)
		if got := dev.step(bind, in, y); !slices.Equal(got[0], want[0]) {
			t.Fatalf("step %d (shift %d): y differs from eager", i, shift)
		}
		last := dev.exe.Stats().Last
		switch i {
		case 1, 3:
			if last.DeviceUpdates == 0 || last.Records != 0 || last.TracesCaptured != 0 {
				t.Errorf("step %d: %+v; the GEMM's kernels move on the device", i, last)
			}
		case 2, 4:
			if last.UpdateFallbacks != 1 || last.Rerecords != 1 {
				t.Errorf("step %d: %+v; want the step recorded again at the new class", i, last)
			}
		}
	}
}

// simOps are the entry points of the sim a test counts calls of.
func simOps() []string {
	var out []string
	for _, t := range []reflect.Type{reflect.TypeFor[gpu.Backend](), reflect.TypeFor[gpu.DeviceUpdates](),
		reflect.TypeFor[gpu.GEMM](), reflect.TypeFor[gpu.GraphNodeReader](), reflect.TypeFor[gpu.Collectives]()} {
		for i := range t.NumMethod() {
			if name := t.Method(i).Name; !slices.Contains(out, name) {
				out = append(out, name)
			}
		}
	}
	return out
}

// TestDeviceOneLaunchPerStep: in steady state with every buffer at a fresh
// address every step, a step makes one graph launch and, besides, only the
// executable's own step event: by default no exec update at all; one of the
// step's first node with HostLead (all three start with a command that
// reads x), and one of the patcher node with Inline (at most 16 buffers
// move, as in all three); no other driver call.
func TestDeviceOneLaunchPerStep(t *testing.T) {
	none := []string{"EventRecord×1", "GraphLaunch×1"}
	one := []string{"EventRecord×1", "GraphExecKernelNodeSetParams×1", "GraphLaunch×1"}
	two := []string{"EventRecord×1", "GraphExecKernelNodeSetParams×2", "GraphLaunch×1"}
	for _, tc := range []struct {
		name string
		opts stablegraph.DeviceOptions
		want []string
	}{
		{"chain-moving", stablegraph.DeviceOptions{}, none},
		{"chain-moving", stablegraph.DeviceOptions{Inline: true}, one},
		{"chain-moving", stablegraph.DeviceOptions{HostLead: true}, one},
		{"chain-moving", stablegraph.DeviceOptions{Inline: true, HostLead: true}, two},
		{"train", stablegraph.DeviceOptions{}, none},
		{"train", stablegraph.DeviceOptions{HostLead: true}, one},
		{"train", stablegraph.DeviceOptions{Inline: true, HostLead: true}, two},
		{"mlp", stablegraph.DeviceOptions{}, none},
		{"mlp", stablegraph.DeviceOptions{Inline: true}, one},
		{"mlp", stablegraph.DeviceOptions{Inline: true, HostLead: true}, two},
	} {
		t.Run(fmt.Sprintf("%s/inline=%v/host-lead=%v", tc.name, tc.opts.Inline, tc.opts.HostLead), func(t *testing.T) {
			name := tc.name
			b := simtest.New(t, 1)
			w := steptest.MustWorkload(t, name, workload.Config{K: 50, N: 64, Layers: 2, Width: 16, Batch: 4})
			exe, caller, done := steptest.StartWorkload(t, b, w, stablegraph.Options{Strategy: stablegraph.StrategyDevice, StrategyOptions: stablegraph.StrategyOptions{DeviceStrategy: tc.opts}}, workload.Random)
			defer done()
			s := simtest.Stream(t, b, 0)
			ctx := context.Background()
			for i := range 12 {
				bind, err := caller.Bind(i) // writes the inputs: not the step's calls
				if err != nil {
					t.Fatal(err)
				}
				before := map[string]int{}
				for _, op := range simOps() {
					before[op] = b.Calls(op)
				}
				outs, err := exe.Run(ctx, s, bind)
				if err != nil {
					t.Fatal(err)
				}
				var made []string
				for _, op := range simOps() {
					// The executable asks whether the stream captures before
					// every step; the CUDA backend answers from its own count
					// of captures, with no driver call, when none is under way.
					if op == "StreamIsCapturing" {
						continue
					}
					if d := b.Calls(op) - before[op]; d > 0 {
						made = append(made, fmt.Sprintf("%s×%d", op, d))
					}
				}
				outs.Release()
				if err := b.StreamSynchronize(s); err != nil {
					t.Fatal(err)
				}
				if i >= 2 && !slices.Equal(made, tc.want) {
					t.Errorf("step %d made %v; want %v", i, made, tc.want)
				}
			}
		})
	}
}

// noDeviceUpdates is the sim on a driver without device-updatable graph
// nodes.
type noDeviceUpdates struct{ *sim.Backend }

func (noDeviceUpdates) DeviceUpdatesSupported(int) error {
	return gpu.Errorf("DeviceUpdatesSupported", gpu.ErrNotSupported, "the driver is CUDA 12.2; device-updatable kernel nodes need CUDA 12.4 or newer")
}

// prebuiltOnly is the sim loading modules as CUDA does: a module needs
// device code for the device (a cubin, else PTX), and this build's patcher
// has none.
type prebuiltOnly struct{ *sim.Backend }

func (b prebuiltOnly) ModuleLoad(dev int, img *gpu.ModuleImage) (gpu.Module, error) {
	if img.Code != nil {
		if _, _, err := img.CodeFor(gpu.Target{Format: gpu.CodeCubin, Major: 9}, gpu.Target{Format: gpu.CodePTX, Major: 9}); err != nil {
			return 0, err
		}
	}
	return b.Backend.ModuleLoad(dev, img)
}

// TestDeviceNotSupported: without device-updatable nodes, or without the
// patcher built, Compile refuses the device strategy with an error
// wrapping gpu.ErrNotSupported that says why, and auto goes on without it,
// saying why too. Nothing is left behind.
func TestDeviceNotSupported(t *testing.T) {
	if len(kernels.PatcherArchs()) > 0 {
		t.Log("the patcher is built: the not-built case is checked with a stand-in binary")
	}
	ctx := context.Background()
	for _, c := range []struct {
		name      string
		wrap      func(*sim.Backend) gpu.Backend
		says      string
		modelSays bool // the model rules it out (else building it fails)
	}{
		{"old-driver", func(b *sim.Backend) gpu.Backend { return noDeviceUpdates{b} }, "need CUDA 12.4", true},
		{"patcher-not-built", func(b *sim.Backend) gpu.Backend { return prebuiltOnly{b} }, "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			raw := simtest.New(t, 1)
			b := c.wrap(raw)
			says := c.says
			if says == "" {
				_, err := kernels.PatcherBinary(9, 0)
				if err == nil {
					t.Skip("the patcher is built for compute 9.0")
				}
				says = "not built"
			}
			w := steptest.NewMLP(2, 8, 2, 10, 3)
			steptest.WantCompileRefused(t, b, raw, w.P, stablegraph.Options{Strategy: stablegraph.StrategyDevice}, gpu.ErrNotSupported, says)
			exe, err := stablegraph.Compile(ctx, b, w.P, stablegraph.Options{Strategy: stablegraph.StrategyAuto,
				Costs: stablegraph.Costs{PatcherUS: 1e-9}, StrategyOptions: stablegraph.StrategyOptions{Auto: stablegraph.AutoOptions{ProbeSteps: -1}}}) // the cheapest, were it usable
			if err != nil {
				t.Fatal(err)
			}
			defer exe.Close()
			ch := exe.Choice()
			if ch.Strategy == stablegraph.StrategyDevice {
				t.Fatalf("auto chose the device strategy: %s", ch.Reason)
			}
			var cand stablegraph.Candidate
			for _, cd := range ch.Candidates {
				if cd.Strategy == stablegraph.StrategyDevice {
					cand = cd
				}
			}
			if cand.Usable || !strings.Contains(cand.Note, says) || !strings.Contains(ch.Reason, says) {
				t.Errorf("auto's device candidate %+v; reason %q", cand, ch.Reason)
			}
			if !c.modelSays && !strings.Contains(ch.Reason, "fell back because device failed to build") {
				t.Errorf("reason %q does not say device failed to build", ch.Reason)
			}
		})
	}
}

// ringProgram is y = 2x+1 over n floats, and the bindings of step i with
// x holding i+1 everywhere.
func ringProgram(t *testing.T, b gpu.Backend, steps, n int) (*stablegraph.Program, []stablegraph.Bindings, stablegraph.Buffer) {
	t.Helper()
	p := stablegraph.NewProgram("ring")
	x := p.Param("x", int64(4*n))
	y := p.Output("y", int64(4*n))
	leadIn(p) // else the kernel is the first command, moved from the host: no ring
	p.Launch(kernels.Axpb, kernels.Elementwise(n), stablegraph.Out(y.All()), stablegraph.In(x.All()), stablegraph.F32(2), stablegraph.F32(1), stablegraph.I32(int32(n)))
	var binds []stablegraph.Bindings
	for i := range steps {
		bx := simtest.Alloc(t, b, 0, uint64(4*n))
		simtest.Upload(t, b, bx, slices.Repeat([]float32{float32(i + 1)}, n))
		binds = append(binds, stablegraph.Bindings{x: bx, y: simtest.Alloc(t, b, 0, uint64(4*n))})
	}
	return p, binds, y
}

// TestDeviceRingWait: with the device held, the host enqueues one ring of
// steps, each moving every pointer; the next step waits for the device to
// run the patcher of the step that last used its table, without the
// executable's lock, and every step computes on its own buffers.
func TestDeviceRingWait(t *testing.T) {
	b := simtest.New(t, 1)
	const n, ring = 64, 16
	p, binds, y := ringProgram(t, b, ring+2, n)
	// The ring is what a step waits on (the default; the inline patcher
	// has none).
	exe := steptest.Compile(t, b, p, stablegraph.Options{Strategy: stablegraph.StrategyDevice, StrategyOptions: stablegraph.StrategyOptions{DeviceStrategy: stablegraph.DeviceOptions{}}})
	s := simtest.Stream(t, b, 0)
	ctx := context.Background()
	if _, err := exe.Run(ctx, s, binds[0]); err != nil {
		t.Fatal(err)
	}
	if err := b.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	if err := b.LaunchKernel(simtest.Gate(t, b, 0, gate), gpu.Linear(1, 1), nil, s); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= ring; i++ {
		if _, err := exe.Run(ctx, s, binds[i]); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := exe.Run(ctx, s, binds[ring+1])
		done <- err
	}()
	select {
	case err := <-done:
		close(gate)
		t.Fatalf("the step after a ring of steps did not wait for the device: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	_ = exe.Choice() // the executable's lock is free while it waits
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := b.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
	for i, bind := range binds {
		if got := simtest.Download(t, b, bind[y], n); got[0] != float32(2*(i+1)+1) || got[n-1] != got[0] {
			t.Errorf("step %d: y = %v..., want %d", i, got[:2], 2*(i+1)+1)
		}
	}
	if st := exe.Stats(); st.SlotWaits != 1 {
		t.Errorf("%d waits, want 1", st.SlotWaits)
	}
}

// TestDeviceRingWaitTimeout: a device that does not advance makes the
// step that waits for it fail at the executable's slot wait, with
// gpu.ErrTimeout, having enqueued nothing; once the device runs, the next
// steps are right.
func TestDeviceRingWaitTimeout(t *testing.T) {
	b := simtest.New(t, 1)
	const n, ring = 16, 16
	p, binds, y := ringProgram(t, b, ring+3, n)
	exe := steptest.Compile(t, b, p, stablegraph.Options{Strategy: stablegraph.StrategyDevice, SlotWait: 20 * time.Millisecond, StrategyOptions: stablegraph.StrategyOptions{DeviceStrategy: stablegraph.DeviceOptions{}}})
	s := simtest.Stream(t, b, 0)
	ctx := context.Background()
	if _, err := exe.Run(ctx, s, binds[0]); err != nil {
		t.Fatal(err)
	}
	if err := b.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	if err := b.LaunchKernel(simtest.Gate(t, b, 0, gate), gpu.Linear(1, 1), nil, s); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= ring; i++ {
		if _, err := exe.Run(ctx, s, binds[i]); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	launches := exe.Stats().GraphLaunches
	_, err := exe.Run(ctx, s, binds[ring+1])
	close(gate)
	if !errors.Is(err, gpu.ErrTimeout) || !strings.Contains(err.Error(), "has not run") {
		t.Fatalf("a step waiting on a stalled device: %v; want gpu.ErrTimeout", err)
	}
	if exe.Stats().GraphLaunches != launches {
		t.Error("the step that timed out launched")
	}
	for _, i := range []int{ring + 1, ring + 2} {
		if _, err := exe.Run(ctx, s, binds[i]); err != nil {
			t.Fatalf("step %d after the device ran: %v", i, err)
		}
	}
	if err := b.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
	for i, bind := range binds {
		if got := simtest.Download(t, b, bind[y], n); got[0] != float32(2*(i+1)+1) {
			t.Errorf("step %d: y[0] = %v, want %d", i, got[0], 2*(i+1)+1)
		}
	}
}

// TestDeviceConcurrentWorkers runs one device executable from several
// goroutines, each on its own stream with its own buffers, under -race;
// every result is eager's.
func TestDeviceConcurrentWorkers(t *testing.T) {
	w := steptest.MustWorkload(t, "mlp", workload.Config{Layers: 2, Width: 16, Batch: 2})
	b := simtest.New(t, 1)
	exe := steptest.Workers{
		Program: w.Program, X: w.Params[0], Y: w.Outputs[0], States: w.States,
		Input:   func(i int) []byte { return w.Input(i, 0) },
		Options: stablegraph.Options{Strategy: stablegraph.StrategyDevice},
		Workers: 4, Steps: 12,
	}.Run(t, b)
	if c := exe.Stats().Counters; c.Records != 1 || c.DeviceUpdates == 0 || c.GraphUploads != 1 {
		t.Errorf("counters %+v", c)
	}
}

// TestDeviceModel: the model prices the table patcher in front of the
// first command and the cost per node moved on the device by default, so
// that a small graph with few moves keeps patch and a long chain that moves
// everywhere takes device; with HostLead the first command's host update
// (the patcher beside it, hidden), and with Inline the inline patcher and
// its update.
func TestDeviceModel(t *testing.T) {
	ctx := context.Background()
	b := simtest.New(t, 1)
	d := stablegraph.DefaultCosts()
	for _, c := range []struct {
		name string
		w    *workload.Workload
		want stablegraph.Strategy
		// nodes: the nodes pointing into x and y (the chain's first and
		// last kernels, or all of them).
		nodes int
	}{
		{"chain-moving", steptest.MustWorkload(t, "chain-moving", workload.Config{K: 200, N: 64}), stablegraph.StrategyDevice, 200},
		{"chain", steptest.MustWorkload(t, "chain", workload.Config{K: 200, N: 64}), stablegraph.StrategyPatch, 2},
	} {
		for _, v := range []struct {
			name string
			opts stablegraph.DeviceOptions
			want float64
		}{
			{"default", stablegraph.DeviceOptions{}, d.PatcherUS + float64(c.nodes)*d.PatcherNodeUS},
			// At most 16 buffers move a step: the inline patcher fits.
			{"inline", stablegraph.DeviceOptions{Inline: true}, d.PatcherInlineUS + d.NodeUpdateUS + float64(c.nodes)*d.PatcherNodeUS},
			// The first kernel from the host, the patcher beside it.
			{"host-lead", stablegraph.DeviceOptions{HostLead: true}, d.NodeUpdateUS + float64(c.nodes-1)*d.PatcherNodeUS},
			{"inline-host-lead", stablegraph.DeviceOptions{Inline: true, HostLead: true}, 2*d.NodeUpdateUS + float64(c.nodes-1)*d.PatcherNodeUS},
		} {
			opts := stablegraph.Options{Strategy: stablegraph.StrategyAuto}
			opts.Auto.ProbeSteps = -1
			opts.DeviceStrategy = v.opts
			exe, err := stablegraph.Compile(ctx, b, c.w.Program, opts)
			if err != nil {
				t.Fatal(err)
			}
			ch := exe.Choice()
			if err := exe.Close(); err != nil {
				t.Fatal(err)
			}
			if v.name == "default" && ch.Strategy != c.want {
				t.Errorf("%s: chose %s, want %s: %s", c.name, ch.Strategy, c.want, ch.Reason)
			}
			if !slices.ContainsFunc(ch.Candidates, func(c stablegraph.Candidate) bool { return c.Strategy == stablegraph.StrategyDevice }) {
				t.Errorf("%s/%s: no device candidate: %+v", c.name, v.name, ch.Candidates)
			}
			for _, cand := range ch.Candidates {
				if cand.Strategy == stablegraph.StrategyDevice && (!cand.Usable || math.Abs(cand.StepUS-v.want) > 1e-9) {
					t.Errorf("%s/%s: device candidate %+v, want %.3f us", c.name, v.name, cand, v.want)
				}
			}
		}
	}
}

// libraryRefused is the sim on a driver that will not opt library kernels
// (opaque parameters) in to device-side updates.
type libraryRefused struct{ *sim.Backend }

func (b libraryRefused) GraphKernelNodeSetDeviceUpdatable(n gpu.GraphNode, on bool) (gpu.DevNode, error) {
	p, err := b.GraphKernelNodeParams(n)
	if err != nil {
		return 0, err
	}
	if len(p.Args) > 0 && p.Args[0].Kind == gpu.ArgBytes {
		return 0, gpu.Errorf("GraphKernelNodeSetDeviceUpdatable", gpu.ErrInvalidValue, "this kernel cannot be device-updatable")
	}
	return b.Backend.GraphKernelNodeSetDeviceUpdatable(n, on)
}

// TestDeviceLibraryKernelRefused: where the driver will not opt a GEMM's
// kernels in, the GEMM moves from the host (with no upload: its nodes are
// not opted in) while the rest moves on the device; the bits are eager's.
func TestDeviceLibraryKernelRefused(t *testing.T) {
	raw := simtest.New(t, 1)
	b := libraryRefused{raw}
	w := steptest.MustWorkload(t, "mlp", workload.Config{Layers: 2, Width: 16, Batch: 4})
	want := steptest.RunWorkload(t, b, w, stablegraph.Options{Strategy: stablegraph.StrategyEager}, workload.Random, 5, true)
	got := steptest.RunWorkload(t, b, w, stablegraph.Options{Strategy: stablegraph.StrategyDevice}, workload.Random, 5, true)
	steptest.SameResults(t, got, want)
	for i, st := range got.Steps[1:] {
		if last := st.Stats.Last; st.Moved && (last.PatchedNodes == 0 || last.GraphUploads != 0 || last.DeviceUpdates == 0 || last.Records != 0) {
			t.Errorf("step %d: %+v; want the GEMM from the host, no upload, the rest on the device", i+1, last)
		}
	}
}

// TestDevicePartialMoves: buffers move one or two at a time, so that the
// device holds some where the patcher put them steps ago while others
// move, the first command (a GEMM) on the device and, with HostLead, from
// the host with no upload;
// every step's outputs are eager's. A host-side change that reset the
// device-side parameters, or a patcher that rewrote buffers that did not
// move, would show here and not with every buffer moving every step.
func TestDevicePartialMoves(t *testing.T) {
	devicePartialMoves(t, simtest.New(t, 1))
}

func devicePartialMoves(t *testing.T, b gpu.Backend) {
	const m, k, n = 4, 16, 16
	p := stablegraph.NewProgram("partial-moves")
	x := p.Param("x", 4*m*k)
	u := p.Param("u", 4*m*n)
	y := p.Output("y", 4*m*n)
	v := p.Output("v", 4*m*n)
	wt := p.Constant("w", gpu.F32ToBytes(simtest.Ramp(k*n, 0.125)))
	tmp := p.Temp("t", 4*m*n)
	p.Gemm(tmp.All(), x.All(), wt.All(), stablegraph.GEMM{M: m, N: n, K: k, Alpha: 1})
	p.Launch(kernels.Add, kernels.Elementwise(m*n), stablegraph.Out(y.All()), stablegraph.In(tmp.All()), stablegraph.In(u.All()), stablegraph.I32(m*n))
	p.Launch(kernels.Axpb, kernels.Elementwise(m*n), stablegraph.Out(v.All()), stablegraph.In(u.All()), stablegraph.F32(0.5), stablegraph.F32(3), stablegraph.I32(m*n))
	eager := newStepper(t, b, p, stablegraph.Options{Strategy: stablegraph.StrategyEager})
	// By default everything moves on the device; with HostLead the GEMM
	// moves from the host beside the patcher's moves.
	for _, hostLead := range []bool{false, true} {
		dev := newStepper(t, b, p, stablegraph.Options{Strategy: stablegraph.StrategyDevice,
			StrategyOptions: stablegraph.StrategyOptions{DeviceStrategy: stablegraph.DeviceOptions{HostLead: hostLead}}})
		bufs := []stablegraph.Buffer{x, u, y, v}
		bind := stablegraph.Bindings{}
		for i, moves := range [][]stablegraph.Buffer{bufs, nil, {x}, {u}, {y}, nil, {v, x}, {u, y}, bufs, {v}, {x}} {
			for _, buf := range moves {
				bind[buf] = simtest.Alloc(t, b, 0, uint64(buf.Size())) // fresh, and never freed during the test
			}
			in := map[stablegraph.Buffer][]byte{x: gpu.F32ToBytes(simtest.Ramp(m*k, float32(i))), u: gpu.F32ToBytes(simtest.Ramp(m*n, -float32(i)))}
			want := eager.step(bind, in, y, v)
			got := dev.step(bind, in, y, v)
			for j := range want {
				if !slices.Equal(got[j], want[j]) {
					t.Fatalf("host lead %v, step %d (moved %v): output %d differs from eager", hostLead, i, moves, j)
				}
			}
			last := dev.exe.Stats().Last
			hosted := hostLead && slices.Contains(moves, x)
			if i > 0 && (last.Records != 0 || last.GraphUploads != 0 || (len(moves) == 0) != (last.DeviceUpdates == 0 && last.PatchedNodes == 0) ||
				(last.PatchedNodes > 0) != hosted) {
				t.Errorf("host lead %v, step %d (moved %v): %+v", hostLead, i, moves, last)
			}
		}
	}
}

// TestDeviceNoPatcher: with DeviceOptions.HostLead, when the step's first
// command is the only one that points into bound buffers, it moves from
// the host and the graph gets no patcher (a node that would cost the step
// its time for nothing); the bits are eager's.
func TestDeviceNoPatcher(t *testing.T) {
	b := simtest.New(t, 1)
	p := stablegraph.NewProgram("one-kernel")
	const n = 16
	x := p.Param("x", 4*n)
	y := p.Output("y", 4*n)
	tmp := p.Temp("t", 4*n)
	p.Launch(kernels.Axpb, kernels.Elementwise(n), stablegraph.Out(tmp.All()), stablegraph.In(x.All()), stablegraph.F32(2), stablegraph.F32(1), stablegraph.I32(n))
	p.Launch(kernels.Axpb, kernels.Elementwise(n), stablegraph.Out(tmp.All()), stablegraph.In(tmp.All()), stablegraph.F32(3), stablegraph.F32(0), stablegraph.I32(n))
	p.Memset(y.All(), 0, 4)
	p.Launch(kernels.Copy, kernels.Elementwise(n), stablegraph.Out(y.All()), stablegraph.In(tmp.All()), stablegraph.I32(n))
	// p: the first command reads x, later ones write y (the memset as a
	// fill kernel): a patcher for y. q: its first command is the only
	// one, and moves from the host: no patcher.
	q := stablegraph.NewProgram("first-only")
	xq := q.Param("x", 4*n)
	yq := q.Output("y", 4*n)
	q.Launch(kernels.Axpb, kernels.Elementwise(n), stablegraph.Out(yq.All()), stablegraph.In(xq.All()), stablegraph.F32(2), stablegraph.F32(1), stablegraph.I32(n))
	for _, c := range []struct {
		p       *stablegraph.Program
		x, y    stablegraph.Buffer
		patcher bool
	}{{p, x, y, true}, {q, xq, yq, false}} {
		before := b.Calls("GraphAddKernelNodeBefore")
		eager := newStepper(t, b, c.p, stablegraph.Options{Strategy: stablegraph.StrategyEager})
		dev := newStepper(t, b, c.p, stablegraph.Options{Strategy: stablegraph.StrategyDevice,
			StrategyOptions: stablegraph.StrategyOptions{DeviceStrategy: stablegraph.DeviceOptions{HostLead: true}}})
		for i := range 4 {
			bind := stablegraph.Bindings{c.x: simtest.Alloc(t, b, 0, 4*n), c.y: simtest.Alloc(t, b, 0, 4*n)}
			in := map[stablegraph.Buffer][]byte{c.x: gpu.F32ToBytes(simtest.Ramp(n, float32(i)))}
			want := eager.step(bind, in, c.y)
			if got := dev.step(bind, in, c.y); !slices.Equal(got[0], want[0]) {
				t.Fatalf("%s step %d: y differs from eager", c.p.Name(), i)
			}
			if last := dev.exe.Stats().Last; i > 0 && (last.PatchedNodes != 1 || (last.DeviceUpdates > 0) != c.patcher || last.Records != 0) {
				t.Errorf("%s step %d: %+v", c.p.Name(), i, last)
			}
		}
		if added := b.Calls("GraphAddKernelNodeBefore") - before; (added == 1) != c.patcher || added > 1 {
			t.Errorf("%s: %d patcher nodes added, want one: %v", c.p.Name(), added, c.patcher)
		}
	}
}
