package stablegraph_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/client"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/internal/steptest"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/retire"
	"github.com/stablegraph/stablegraph/streamcache"
	"github.com/stablegraph/stablegraph/workload"
)

func TestBindingErrors(t *testing.T) {
	ctx := context.Background()
	b := simtest.New(t, 1)
	s := simtest.Stream(t, b, 0)
	w := steptest.NewMLP(2, 8, 1, 8, 2)
	exe, err := stablegraph.Compile(ctx, b, w.P, stablegraph.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	good := stablegraph.Bindings{}
	for _, buf := range append(append([]stablegraph.Buffer(nil), w.Params...), w.Outputs...) {
		good[buf] = simtest.Alloc(t, b, 0, uint64(buf.Size()))
	}
	alien := stablegraph.NewProgram("other").Param("x", 4)
	late := w.P.Param("declared-after-compile", 4)
	for name, mutate := range map[string]func(stablegraph.Bindings){
		"missing param":   func(bb stablegraph.Bindings) { delete(bb, w.X) },
		"missing output":  func(bb stablegraph.Bindings) { delete(bb, w.Z) },
		"null address":    func(bb stablegraph.Bindings) { bb[w.X2] = 0 },
		"state bound":     func(bb stablegraph.Bindings) { bb[w.Acc] = good[w.X] },
		"other program":   func(bb stablegraph.Bindings) { bb[alien] = good[w.X] },
		"zero buffer key": func(bb stablegraph.Bindings) { bb[stablegraph.Buffer{}] = good[w.X] },
		"late buffer":     func(bb stablegraph.Bindings) { bb[late] = good[w.X] },
	} {
		bb := maps.Clone(good)
		mutate(bb)
		if _, err := exe.Run(ctx, s, bb); !errors.Is(err, stablegraph.ErrInvalidBinding) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	if st := exe.Stats(); st.Steps != 0 || st.Records != 0 {
		t.Errorf("rejected bindings did work: %+v", st)
	}
	if _, err := exe.Run(ctx, s, good); err != nil {
		t.Fatal(err)
	}
	if _, err := exe.ReadBuffer(ctx, w.X); !errors.Is(err, stablegraph.ErrInvalidBinding) {
		t.Errorf("ReadBuffer of a param: %v", err)
	}
	if err := exe.WriteBuffer(ctx, w.Acc, []byte{1}); !errors.Is(err, stablegraph.ErrInvalidBinding) {
		t.Errorf("WriteBuffer of the wrong size: %v", err)
	}
	if _, err := exe.ReadOutput(ctx, stablegraph.Outputs{}, w.Y); !errors.Is(err, stablegraph.ErrInvalidBinding) {
		t.Errorf("ReadOutput of an output not given: %v", err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := exe.Run(canceled, s, good); !errors.Is(err, context.Canceled) {
		t.Errorf("Run with a canceled context: %v", err)
	}
	if err := exe.Close(); err != nil {
		t.Fatal(err)
	}
	if err := exe.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := exe.Run(ctx, s, good); !errors.Is(err, stablegraph.ErrClosed) {
		t.Errorf("Run after Close: %v", err)
	}
	if _, err := exe.ReadBuffer(ctx, w.Acc); !errors.Is(err, stablegraph.ErrClosed) {
		t.Errorf("ReadBuffer after Close: %v", err)
	}
}

// TestBindState moves a state into caller memory between steps: every
// strategy must follow it, and the result must equal eager's.
func TestBindState(t *testing.T) {
	ctx := context.Background()
	const n = 16
	run := func(st stablegraph.Strategy) []float32 {
		b := simtest.New(t, 1)
		s := simtest.Stream(t, b, 0)
		p := stablegraph.NewProgram("bind-state")
		x := p.Param("x", 4*n)
		acc := p.State("acc", 4*n)
		y := p.Output("y", 4*n)
		p.Launch(kernels.Axpy, kernels.Elementwise(n), stablegraph.InOut(acc.All()), stablegraph.In(x.All()), stablegraph.F32(1), stablegraph.I32(n))
		p.Launch(kernels.Copy, kernels.Elementwise(n), stablegraph.Out(y.All()), stablegraph.In(acc.All()), stablegraph.I32(n))
		opts := stablegraph.Options{Strategy: st}
		alloc := steptest.Memory(t, b, 0, &opts)
		exe, err := stablegraph.Compile(ctx, b, p, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer exe.Close()
		xp, yp := alloc(4*n), alloc(4*n)
		ones := make([]float32, n)
		for i := range ones {
			ones[i] = 1
		}
		if err := b.MemcpyHtoD(xp, gpu.F32ToBytes(ones)); err != nil {
			t.Fatal(err)
		}
		for step := range 4 {
			if step == 2 {
				// The caller's state memory starts at 10.
				mine := simtest.Alloc(t, b, 0, 4*n)
				ten := make([]float32, n)
				for i := range ten {
					ten[i] = 10
				}
				if err := b.MemcpyHtoD(mine, gpu.F32ToBytes(ten)); err != nil {
					t.Fatal(err)
				}
				if err := exe.BindState(ctx, acc, mine); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := exe.Run(ctx, s, stablegraph.Bindings{x: xp, y: yp}); err != nil {
				t.Fatal(err)
			}
		}
		got, err := exe.ReadBuffer(ctx, acc)
		if err != nil {
			t.Fatal(err)
		}
		if err := exe.Close(); err != nil {
			t.Fatal(err)
		}
		return gpu.BytesToF32(got)
	}
	for _, st := range stablegraph.Strategies() {
		if got := run(st); got[0] != 12 || got[n-1] != 12 {
			t.Errorf("%s: acc = %v, want 12 everywhere", st, got)
		}
	}
}

func TestTempSharing(t *testing.T) {
	ctx := context.Background()
	b := simtest.New(t, 1)
	w := steptest.NewMLP(4, 16, 3, 64, 8)
	shared, err := stablegraph.Compile(ctx, b, w.P, stablegraph.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Close()
	alone, err := stablegraph.Compile(ctx, b, w.P, stablegraph.Options{NoTempSharing: true})
	if err != nil {
		t.Fatal(err)
	}
	defer alone.Close()
	ms, ma := shared.Memory(), alone.Memory()
	// The MLP's temps: h0 a0 h1 a1 h2 (256 B each) and a chain of 7
	// (256 B each); each lives from its writer to its reader, so at most
	// two are live at once.
	if ms.TempsUnshared != 12*256 || ma.Temps != ma.TempsUnshared || ms.Temps != 2*256 {
		t.Errorf("shared %+v, unshared %+v", ms, ma)
	}
	if ms.States != 3*1024+256 || ms.Constants != 3*256 {
		t.Errorf("states %d, constants %d", ms.States, ms.Constants)
	}
}

// BenchmarkStep measures one step of the MLP workload per strategy on sim,
// with params and outputs ping-ponging: host time of Run plus the sim's
// execution, synchronised every step.
func BenchmarkStep(b *testing.B) {
	for _, st := range stablegraph.Strategies() {
		b.Run(fmt.Sprint(st), func(b *testing.B) {
			ctx := context.Background()
			be := simtest.New(b, 1)
			s := simtest.Stream(b, be, 0)
			w := steptest.NewMLP(8, 64, 4, 256, 16)
			opts := stablegraph.Options{Strategy: st}
			alloc := steptest.Memory(b, be, 0, &opts) // remappable memory for remap
			exe, err := stablegraph.Compile(ctx, be, w.P, opts)
			if err != nil {
				b.Fatal(err)
			}
			defer exe.Close()
			var sets [2]stablegraph.Bindings
			for i := range sets {
				sets[i] = stablegraph.Bindings{}
				for _, buf := range append(append([]stablegraph.Buffer(nil), w.Params...), w.Outputs...) {
					sets[i][buf] = alloc(uint64(buf.Size()))
				}
			}
			for i := 0; b.Loop(); i++ {
				if _, err := exe.Run(ctx, s, sets[i%2]); err != nil {
					b.Fatal(err)
				}
				if err := be.StreamSynchronize(s); err != nil {
					b.Fatal(err)
				}
			}
			st := exe.Stats()
			b.ReportMetric(float64(st.Rerecords)/float64(st.Steps), "rerecords/step")
			b.ReportMetric(float64(st.PatchedNodes)/float64(st.Steps), "patched/step")
		})
	}
}

// heldCopyModule is a kernel (y = x, n floats) that, while *hold holds a
// channel, waits for it to close before it runs: a step that stays on the
// device until the test lets it go.
func heldCopyModule(hold *atomic.Pointer[chan struct{}]) *gpu.ModuleImage {
	return &gpu.ModuleImage{Name: "campaign-test-held", Kernels: []gpu.KernelSpec{{
		Name:   "held_copy",
		Params: []gpu.ArgKind{gpu.ArgPtr, gpu.ArgPtr, gpu.ArgI32},
		Ref: func(mem gpu.Memory, cfg gpu.LaunchConfig, a []gpu.Arg) error {
			if ch := hold.Load(); ch != nil {
				<-*ch
			}
			buf := make([]byte, 4*int(a[2].AsI32()))
			if err := mem.Read(a[1].AsPtr(), buf); err != nil {
				return err
			}
			return mem.Write(a[0].AsPtr(), buf)
		},
	}}}
}

// TestFailedStepEventStillOrdersLaterWork: when the event that marks the
// end of a step cannot be recorded (the fault campaign's EventRecord sites
// in Run), the step's work is already enqueued and will run. Run reports
// the error, but what comes after it on the executable (a read of a state,
// the next step, Close) must still come after that work, as the Executable
// doc promises, and not after the previous step's event.
func TestFailedStepEventStillOrdersLaterWork(t *testing.T) {
	for _, st := range []stablegraph.Strategy{stablegraph.StrategyEager, stablegraph.StrategyPatch, stablegraph.StrategyPool} {
		t.Run(string(st), func(t *testing.T) {
			b := simtest.New(t, 1)
			s := simtest.Stream(t, b, 0)
			var hold atomic.Pointer[chan struct{}]
			const n = 16
			p := stablegraph.NewProgram("held")
			p.AddModule(heldCopyModule(&hold))
			x := p.Param("x", 4*n)
			acc := p.State("acc", 4*n)
			y := p.Output("y", 4*n)
			p.Launch("held_copy", gpu.Linear(n, 32), stablegraph.Out(acc.All()), stablegraph.In(x.All()), stablegraph.I32(n))
			p.Memcpy(y.All(), acc.All())
			ctx := context.Background()
			exe, err := stablegraph.Compile(ctx, b, p, stablegraph.Options{Strategy: st})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := exe.Close(); err != nil {
					t.Error(err)
				}
			}()
			xs := []gpu.DevicePtr{simtest.Alloc(t, b, 0, 4*n), simtest.Alloc(t, b, 0, 4*n)}
			ys := []gpu.DevicePtr{simtest.Alloc(t, b, 0, 4*n), simtest.Alloc(t, b, 0, 4*n)}
			vals := [][]float32{simtest.Ramp(n, 0.5), steptest.RandF32(steptest.NewRand(3), n, 1)}
			for i := range 2 {
				if err := b.MemcpyHtoD(xs[i], gpu.F32ToBytes(vals[i])); err != nil {
					t.Fatal(err)
				}
			}
			// Step 0 runs and completes normally.
			if _, err := exe.Run(ctx, s, stablegraph.Bindings{x: xs[0], y: ys[0]}); err != nil {
				t.Fatal(err)
			}
			if got, err := exe.ReadBuffer(ctx, acc); err != nil || string(got) != string(gpu.F32ToBytes(vals[0])) {
				t.Fatalf("step 0: %v", err)
			}
			// Step 1 is held on the device for a while, and the event that
			// marks its end fails to be recorded.
			ch := make(chan struct{})
			hold.Store(&ch)
			release := time.AfterFunc(200*time.Millisecond, func() { close(ch) })
			defer release.Stop()
			b.InjectFault("EventRecord", 0, nil)
			_, err = exe.Run(ctx, s, stablegraph.Bindings{x: xs[1], y: ys[1]})
			b.ClearFaults()
			if !errors.Is(err, gpu.ErrInjected) {
				t.Fatalf("step 1: %v, want the injected EventRecord failure", err)
			}
			got, err := exe.ReadBuffer(ctx, acc)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(gpu.F32ToBytes(vals[1])) {
				t.Fatalf("ReadBuffer after the step whose event failed returned before that step ran (stale state)")
			}
		})
	}
}

// ccWorkload is a workload of the concurrency test with its eager
// reference: the digest of every step's outputs.
type ccWorkload struct {
	w   *workload.Workload
	ref []workload.Digest
}

// ccDigest reads the outputs of a step and hashes them as workload.Run
// does.
func ccDigest(ctx context.Context, exe *stablegraph.Executable, w *workload.Workload, outs stablegraph.Outputs) (workload.Digest, error) {
	h := sha256.New()
	for _, buf := range w.Outputs {
		data, err := exe.ReadOutput(ctx, outs, buf)
		if err != nil {
			return workload.Digest{}, err
		}
		h.Write(data)
	}
	var d workload.Digest
	h.Sum(d[:0])
	return d, nil
}

// TestConcurrentExecutablesAndClients runs, on a two-device sim, several
// goroutines that each compile executables of every strategy and run them
// through one of two clients sharing a stream cache, submitting, retiring
// buffers and registering callbacks as they go; two more executables are
// each run by two goroutines at once. Every step's outputs must equal the
// eager reference computed beforehand, and once everything is closed no
// handle and no goroutine may be left. It is meant for go test -race.
func TestConcurrentExecutablesAndClients(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const (
		goroutines = 6
		perG       = 2 // executables per goroutine
		steps      = 20
	)
	ctx := context.Background()
	b, err := sim.New(sim.Config{Devices: 2, DeviceMemory: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if live := b.LiveHandles(); !live.IsZero() {
			t.Errorf("handles live at the end: %s", live)
		}
		if err := b.Close(); err != nil {
			t.Errorf("close sim: %v", err)
		}
	}()

	// The workloads and their eager references, computed one at a time.
	shapes := map[string]workload.Config{
		"mlp":          {Layers: 2, Width: 32, Batch: 4},
		"train":        {Layers: 2, Width: 32, Batch: 4},
		"chain-moving": {K: 6, N: 64},
	}
	wls := map[string]*ccWorkload{}
	for name, shape := range shapes {
		w, err := workload.New(name, shape)
		if err != nil {
			t.Fatal(err)
		}
		res, err := workload.Run(ctx, b, w, workload.RunOptions{Strategy: stablegraph.StrategyEager, Steps: steps,
			Pattern: workload.Random, WallBatches: -1})
		if err != nil {
			t.Fatal(err)
		}
		wls[name] = &ccWorkload{w: w, ref: res.Digests}
	}
	names := []string{"mlp", "train", "chain-moving"}

	cache := streamcache.New(streamcache.Options{})
	defer func() {
		if err := cache.Purge(b); err != nil {
			t.Errorf("purge: %v", err)
		}
	}()
	var clients [2]*client.Client
	for i := range clients {
		c, err := client.Open(b, client.Options{StreamsPerDevice: 2, StreamCache: cache})
		if err != nil {
			t.Fatal(err)
		}
		clients[i] = c
	}
	var callbacks atomic.Int64
	var registered atomic.Int64
	var checked atomic.Int64

	// step runs step i of exe on stream si of the client's device dev with
	// the caller's buffers, submits, retires a scratch buffer and checks
	// the outputs.
	step := func(cl *client.Client, dev, si int, exe *stablegraph.Executable, wl *ccWorkload, caller *workload.Caller, i int) error {
		s, err := cl.Stream(dev, si)
		if err != nil {
			return err
		}
		bind, err := caller.Bind(i)
		if err != nil {
			return err
		}
		outs, err := exe.Run(ctx, s, bind)
		if err != nil {
			return fmt.Errorf("run step %d: %w", i, err)
		}
		defer outs.Release()
		point, err := cl.Submitted(dev, si)
		if err != nil {
			return fmt.Errorf("submitted: %w", err)
		}
		scratch, err := b.MemAlloc(dev, 512)
		if err != nil {
			return err
		}
		if err := cl.Retire(ctx, dev, retire.Batch{{Bytes: 512, Release: func() error { return b.MemFree(scratch) }}}, point); err != nil {
			return fmt.Errorf("retire: %w", err)
		}
		if i%3 == 0 {
			registered.Add(1)
			if err := cl.After(dev, si, func(err error) {
				if err == nil {
					callbacks.Add(1)
				}
			}); err != nil {
				return fmt.Errorf("after: %w", err)
			}
		}
		d, err := ccDigest(ctx, exe, wl.w, outs)
		if err != nil {
			return fmt.Errorf("read step %d: %w", i, err)
		}
		if d != wl.ref[i] {
			return fmt.Errorf("step %d: outputs differ from eager", i)
		}
		checked.Add(1)
		return nil
	}

	compile := func(wl *ccWorkload, st stablegraph.Strategy, dev int, mem stablegraph.ChunkFinder) (*stablegraph.Executable, error) {
		exe, err := stablegraph.Compile(ctx, b, wl.w.Program, stablegraph.Options{Strategy: st, Device: dev, StrategyOptions: stablegraph.StrategyOptions{Remap: stablegraph.RemapOptions{Memory: mem}}})
		if err != nil {
			return nil, err
		}
		for _, s := range wl.w.States {
			if err := exe.WriteBuffer(ctx, s.Buffer, s.Data); err != nil {
				return nil, errors.Join(err, exe.Close())
			}
		}
		return exe, nil
	}

	// Two executables of stateless workloads, each run by two goroutines
	// at once: every step's outputs depend on its inputs only.
	type shared struct {
		exe *stablegraph.Executable
		wl  *ccWorkload
		dev int
	}
	var shareds []shared
	for i, sh := range []struct {
		name string
		st   stablegraph.Strategy
	}{{"mlp", stablegraph.StrategyPatch}, {"chain-moving", stablegraph.StrategyPool}} {
		exe, err := compile(wls[sh.name], sh.st, i%2, nil)
		if err != nil {
			t.Fatal(err)
		}
		shareds = append(shareds, shared{exe, wls[sh.name], i % 2})
	}

	strategies := stablegraph.Strategies()
	errs := make(chan error, goroutines+2*len(shareds))
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			dev, cl := g%2, clients[g/2%2]
			fail := func(err error) { errs <- fmt.Errorf("goroutine %d: %w", g, err) }
			var exes []*stablegraph.Executable
			var wlsOf []*ccWorkload
			var callers []*workload.Caller
			defer func() {
				for _, e := range exes {
					if err := e.Close(); err != nil {
						fail(err)
					}
				}
				for _, c := range callers {
					if err := c.Close(); err != nil {
						fail(err)
					}
				}
			}()
			for m := range perG {
				wl := wls[names[(g+m)%len(names)]]
				st := strategies[(g*perG+m)%len(strategies)]
				caller, err := workload.NewCallerWith(b, dev, wl.w, workload.Random, uint64(g*perG+m+1), workload.CallerOptionsFor(st))
				if err != nil {
					fail(err)
					return
				}
				callers = append(callers, caller)
				exe, err := compile(wl, st, dev, caller.Remappable())
				if err != nil {
					fail(fmt.Errorf("compile %s with %s: %w", wl.w.Name, st, err))
					return
				}
				exes, wlsOf = append(exes, exe), append(wlsOf, wl)
			}
			// Interleave the goroutine's executables step by step, on
			// alternating streams.
			for i := range steps {
				for m, exe := range exes {
					if err := step(cl, dev, (i+m)%2, exe, wlsOf[m], callers[m], i); err != nil {
						fail(fmt.Errorf("%s with %s: %w", wlsOf[m].w.Name, exe.Strategy(), err))
						return
					}
				}
				if i == steps/2 {
					if err := cl.Synchronize(ctx); err != nil {
						fail(err)
						return
					}
				}
			}
		})
	}
	for k, sh := range shareds {
		for r := range 2 {
			wg.Go(func() {
				cl := clients[r]
				caller, err := workload.NewCaller(b, sh.dev, sh.wl.w, workload.Random, uint64(100+2*k+r))
				if err != nil {
					errs <- err
					return
				}
				defer func() {
					if err := caller.Close(); err != nil {
						errs <- err
					}
				}()
				for i := range steps {
					if err := step(cl, sh.dev, r, sh.exe, sh.wl, caller, i); err != nil {
						errs <- fmt.Errorf("shared %s with %s, runner %d: %w", sh.wl.w.Name, sh.exe.Strategy(), r, err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, sh := range shareds {
		if err := sh.exe.Close(); err != nil {
			t.Error(err)
		}
	}
	for _, c := range clients {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}
	if want := int64((goroutines*perG + 2*len(shareds)) * steps); checked.Load() != want && !t.Failed() {
		t.Errorf("%d steps checked, want %d", checked.Load(), want)
	}
	t.Logf("%d steps checked against eager, %d callbacks", checked.Load(), callbacks.Load())
	if got, want := callbacks.Load(), registered.Load(); got != want {
		t.Errorf("%d of %d callbacks ran without error", got, want)
	}
}

// TestRunFaults fails, one at a time, the device calls the strategies make
// while running, at the first step (recording, differential tracing) and
// after warm-up (updates, patches, cache misses). A faulted step must
// return the injected error; every later step must succeed with eager's
// results; Close must leave no handle live.
func TestRunFaults(t *testing.T) {
	ops := []string{
		"GraphCreate", "GraphAddKernelNode", "GraphAddMemcpyNode", "GraphAddMemsetNode", "GraphAddChildGraphNode",
		"GraphAddEmptyNode", "StreamBeginCapture", "StreamEndCapture", "StreamIsCapturing", "LaunchKernel",
		"GraphInstantiate", "GraphLaunch", "GraphExecUpdate", "GraphExecKernelNodeSetParams",
		"GraphExecChildGraphNodeSetParams", "GraphExecMemcpyNodeSetParams", "GraphExecMemsetNodeSetParams",
		"GraphNodes", "GraphNodeType", "GraphNodeDeps", "GraphKernelNodeParams", "FuncParamInfo", "MemAlloc",
		"EventRecord", "StreamWaitEvent", "MemcpyDtoDAsync", "MemsetAsync", "StreamWriteValue64",
		"EventQuery", "MemUnmap", "MemMap", "MemSetAccess", // remap's per-step calls
		// The device strategy's recording: opt-in, the patcher's root
		// node and memory, the upload.
		"GraphKernelNodeSetDeviceUpdatable", "GraphAddKernelNodeBefore", "GraphUpload", "HostAlloc", "MemcpyHtoD", "Memset",
	}
	const steps = 5
	// Outputs that do not depend on the state a failed step may have half
	// updated: y, z and ycopy (m reads the accumulator).
	compared := []int{0, 1, 3}
	variants := map[string]stablegraph.Options{
		"stable-stream-copies": {Strategy: stablegraph.StrategyStable, StrategyOptions: stablegraph.StrategyOptions{Copies: stablegraph.CopyOptions{OnStream: true}}},
		"pool-1":               {Strategy: stablegraph.StrategyPool, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: 1}}},
		"pool-3":               {Strategy: stablegraph.StrategyPool, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: 3}}},
		"pool-stream-copies":   {Strategy: stablegraph.StrategyPool, StrategyOptions: stablegraph.StrategyOptions{Copies: stablegraph.CopyOptions{OnStream: true}}},
	}
	for _, st := range stablegraph.Strategies() {
		variants[string(st)] = stablegraph.Options{Strategy: st}
	}
	for name, opts := range variants {
		t.Run(name, func(t *testing.T) {
			b := simtest.New(t, 1)
			w := steptest.NewMLP(2, 8, 2, 10, 3)
			want, _ := steptest.RunMLP(t, b, w, stablegraph.StrategyEager, steptest.PingPong, steps)
			ctx := context.Background()
			s := simtest.Stream(t, b, 0)
			a := steptest.ArenaFor(t, b, 16<<20, &opts)
			firedOps := map[string]bool{}
			defer func() { t.Logf("faults injected into: %v", firedOps) }()
			trials, skipped := 0, 0
			defer func() { t.Logf("%d trials; %d skipped: a lower call index did not fire", trials, skipped) }()
			for _, op := range ops {
				for _, at := range []int{0, 1, 2} {
					// A step that made at most nth calls of op cannot fail
					// call nth or a later one: once a fault does not fire,
					// the higher indices would only repeat the clean run.
					firedHere := true
					for _, nth := range []int{0, 1, 3} {
						if !firedHere {
							skipped++
							continue
						}
						firedHere = false
						trials++
						base := b.LiveHandles()
						exe, err := stablegraph.Compile(ctx, b, w.P, opts)
						if err != nil {
							t.Fatal(err)
						}
						w.InitStates(t, exe)
						ad := steptest.NewAddresser(t, b, a, steptest.PingPong, append(append([]stablegraph.Buffer(nil), w.Params...), w.Outputs...), w)
						for i := range steps {
							bind, err := ad.Bind(i)
							if err != nil {
								t.Fatal(err)
							}
							calls := b.Calls(op)
							if i == at {
								b.InjectFault(op, nth, nil)
							}
							outs, err := exe.Run(ctx, s, bind)
							b.ClearFaults()
							fired := i == at && b.Calls(op)-calls > nth
							if fired {
								firedOps[op] = true
								firedHere = true
							}
							if err != nil {
								if !fired || !errors.Is(err, gpu.ErrInjected) {
									t.Fatalf("%s call %d at step %d: step %d failed: %v", op, nth, at, i, err)
								}
								if err := b.StreamSynchronize(s); err != nil {
									t.Fatal(err)
								}
								continue
							}
							if fired && op != "StreamIsCapturing" {
								t.Fatalf("%s call %d at step %d failed, but the step succeeded", op, nth, at)
							}
							for _, k := range compared {
								got, err := exe.ReadOutput(ctx, outs, w.Outputs[k])
								if err != nil {
									t.Fatal(err)
								}
								if string(got) != string(want[i].Outs[k]) {
									t.Fatalf("%s call %d at step %d: step %d output %s differs from eager", op, nth, at, i, w.Outputs[k].Name())
								}
							}
						}
						ad.Close()
						if err := exe.Close(); err != nil {
							t.Fatal(err)
						}
						if live := b.LiveHandles(); live != base {
							t.Fatalf("%s call %d at step %d: handles live after Close: %s, before Compile: %s", op, nth, at, live, base)
						}
					}
				}
			}
		})
	}
}
