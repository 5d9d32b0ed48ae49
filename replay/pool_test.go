package replay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/internal/steptest"
	"github.com/stablegraph/stablegraph/kernels"
	"github.com/stablegraph/stablegraph/vmm"
	"github.com/stablegraph/stablegraph/workload"
)

// noVMM hides capabilities of a sim backend, as a backend whose device
// lacks them reports: VMM, or stream memory operations.
type noVMM struct {
	*sim.Backend
	hideVMM, hideMemOps bool
}

func (b noVMM) DeviceProps(dev int) (gpu.DeviceProps, error) {
	p, err := b.Backend.DeviceProps(dev)
	if b.hideVMM {
		p.VMM, p.Granularity = false, 0
	}
	if b.hideMemOps {
		p.StreamMemOps = false
	}
	return p, err
}

func (b noVMM) AllocationGranularity(dev int) (uint64, error) {
	if b.hideVMM {
		return 0, gpu.Errorf("AllocationGranularity", gpu.ErrNotSupported, "device %d has no virtual memory management", dev)
	}
	return b.Backend.AllocationGranularity(dev)
}

func (b noVMM) StreamMemOpsSupported(dev int) error {
	if b.hideMemOps {
		return gpu.Errorf("StreamMemOpsSupported", gpu.ErrNotSupported, "device %d has no 64-bit stream memory operations", dev)
	}
	return b.Backend.StreamMemOpsSupported(dev)
}

// poolProgram is a small step: y = tanh(x·W + b) over a param x, a
// constant W, and an output y; plus an output s = x + state, with the state
// accumulating x, so a step's outputs depend on its own inputs.
type poolProgram struct {
	p        *stablegraph.Program
	x, y, s  stablegraph.Buffer
	acc      stablegraph.Buffer
	n, width int
}

func newPoolProgram() *poolProgram {
	const batch, width = 2, 8
	n := batch * width
	pp := &poolProgram{p: stablegraph.NewProgram("pool"), n: n, width: width}
	p := pp.p
	pp.x = p.Param("x", int64(4*n))
	w := p.Constant("w", gpu.F32ToBytes(steptest.RandF32(steptest.NewRand(11), width*width, 0.5)))
	h := p.Temp("h", int64(4*n))
	pp.y = p.Output("y", int64(4*n))
	pp.s = p.Output("s", int64(4*n))
	pp.acc = p.State("acc", int64(4*n))
	p.Gemm(h.All(), pp.x.All(), w.All(), stablegraph.GEMM{M: batch, N: width, K: width, Alpha: 1})
	p.Launch(kernels.Tanh, kernels.Elementwise(n), stablegraph.Out(pp.y.All()), stablegraph.In(h.All()), stablegraph.I32(int32(n)))
	p.Launch(kernels.Axpy, kernels.Elementwise(n), stablegraph.InOut(pp.acc.All()), stablegraph.In(pp.x.All()), stablegraph.F32(1), stablegraph.I32(int32(n)))
	p.Launch(kernels.Copy, kernels.Elementwise(n), stablegraph.Out(pp.s.All()), stablegraph.In(pp.acc.All()), stablegraph.I32(int32(n)))
	return pp
}

// inputs allocates one x per step with distinct contents.
func (pp *poolProgram) inputs(t testing.TB, b gpu.Backend, steps int) []gpu.DevicePtr {
	t.Helper()
	xs := make([]gpu.DevicePtr, steps)
	for i := range xs {
		xs[i] = simtest.Alloc(t, b, 0, uint64(pp.x.Size()))
		if err := b.MemcpyHtoD(xs[i], gpu.F32ToBytes(steptest.RandF32(steptest.NewRand(uint64(100+i)), pp.n, 1))); err != nil {
			t.Fatal(err)
		}
	}
	return xs
}

// eagerOutputs runs the steps eagerly and returns each step's y and s.
func (pp *poolProgram) eagerOutputs(t testing.TB, b gpu.Backend, xs []gpu.DevicePtr) [][2][]byte {
	t.Helper()
	ctx := context.Background()
	s := simtest.Stream(t, b, 0)
	exe, err := stablegraph.Compile(ctx, b, pp.p, stablegraph.Options{Strategy: stablegraph.StrategyEager})
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	yp, sp := simtest.Alloc(t, b, 0, uint64(pp.y.Size())), simtest.Alloc(t, b, 0, uint64(pp.s.Size()))
	var out [][2][]byte
	for _, x := range xs {
		outs, err := exe.Run(ctx, s, stablegraph.Bindings{pp.x: x, pp.y: yp, pp.s: sp})
		if err != nil {
			t.Fatal(err)
		}
		var r [2][]byte
		for k, o := range []stablegraph.Buffer{pp.y, pp.s} {
			if r[k], err = exe.ReadOutput(ctx, outs, o); err != nil {
				t.Fatal(err)
			}
		}
		out = append(out, r)
	}
	return out
}

func (pp *poolProgram) read(t testing.TB, exe *stablegraph.Executable, outs stablegraph.Outputs) [2][]byte {
	t.Helper()
	var r [2][]byte
	for k, o := range []stablegraph.Buffer{pp.y, pp.s} {
		var err error
		if r[k], err = exe.ReadOutput(context.Background(), outs, o); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// TestPoolZeroCopyOutputsFromTheSlotThatRan is rule 5 with N = 1, 2, 3: the
// caller keeps the zero-copy outputs of N consecutive steps, each in its
// own slot, and reads them all afterwards: each is its own step's result.
// With every slot leased, the next step waits for a release and fails at
// the deadline (ErrSlotWait); a release frees exactly that slot, whose
// reuse leaves the slots still leased untouched.
func TestPoolZeroCopyOutputsFromTheSlotThatRan(t *testing.T) {
	ctx := context.Background()
	for n := 1; n <= 3; n++ {
		t.Run(fmt.Sprintf("slots=%d", n), func(t *testing.T) {
			b := simtest.New(t, 1)
			s := simtest.Stream(t, b, 0)
			pp := newPoolProgram()
			steps := n + 2
			xs := pp.inputs(t, b, steps)
			want := pp.eagerOutputs(t, b, xs)
			exe, err := stablegraph.Compile(ctx, b, pp.p, stablegraph.Options{
				Strategy: stablegraph.StrategyPool, SlotWait: 30 * time.Millisecond, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: n, ZeroCopyOutputs: true}}})
			if err != nil {
				t.Fatal(err)
			}
			defer exe.Close()
			held := make([]stablegraph.Outputs, n)
			addrs := map[gpu.DevicePtr]bool{}
			for i := range n {
				// Outputs unbound: zero-copy needs no caller memory.
				if held[i], err = exe.Run(ctx, s, stablegraph.Bindings{pp.x: xs[i]}); err != nil {
					t.Fatal(err)
				}
				if !held[i].Leased() {
					t.Fatal("zero-copy outputs are not leased")
				}
				addrs[held[i].Addr(pp.y)] = true
			}
			if len(addrs) != n {
				t.Fatalf("%d steps left their outputs at %d distinct addresses, want one slot each", n, len(addrs))
			}
			for i := range n {
				if got := pp.read(t, exe, held[i]); !bytes.Equal(got[0], want[i][0]) || !bytes.Equal(got[1], want[i][1]) {
					t.Fatalf("step %d's leased outputs differ from eager", i)
				}
			}
			// Every slot leased: the next step waits, then fails.
			start := time.Now()
			_, err = exe.Run(ctx, s, stablegraph.Bindings{pp.x: xs[n]})
			if !errors.Is(err, stablegraph.ErrSlotWait) || !errors.Is(err, gpu.ErrTimeout) {
				t.Fatalf("step with every slot leased = %v, want ErrSlotWait", err)
			}
			if el := time.Since(start); el < 20*time.Millisecond || el > 5*time.Second {
				t.Errorf("gave up after %v with a 30ms deadline", el)
			}
			// Release the oldest: the next step takes that slot.
			oldest := held[0].Addr(pp.y)
			held[0].Release()
			held[0].Release() // idempotent
			if _, err := exe.ReadOutput(ctx, held[0], pp.y); !errors.Is(err, stablegraph.ErrReleased) {
				t.Errorf("ReadOutput after Release = %v", err)
			}
			next, err := exe.Run(ctx, s, stablegraph.Bindings{pp.x: xs[n]})
			if err != nil {
				t.Fatal(err)
			}
			if next.Addr(pp.y) != oldest {
				t.Errorf("the step after the release ran in %#x, not the released slot %#x", next.Addr(pp.y), oldest)
			}
			if got := pp.read(t, exe, next); !bytes.Equal(got[0], want[n][0]) || !bytes.Equal(got[1], want[n][1]) {
				t.Fatalf("step %d differs from eager", n)
			}
			for i := 1; i < n; i++ {
				if got := pp.read(t, exe, held[i]); !bytes.Equal(got[0], want[i][0]) {
					t.Fatalf("step %d's leased outputs changed while leased", i)
				}
			}
			// A release from another goroutine wakes a waiting step.
			go func() {
				time.Sleep(5 * time.Millisecond)
				next.Release()
			}()
			last, err := exe.Run(ctx, s, stablegraph.Bindings{pp.x: xs[n+1]})
			if err != nil {
				t.Fatalf("a step waiting for a release from another goroutine: %v", err)
			}
			if got := pp.read(t, exe, last); !bytes.Equal(got[1], want[n+1][1]) {
				t.Fatalf("step %d differs from eager", n+1)
			}
			last.Release()
			for i := 1; i < n; i++ {
				held[i].Release()
			}
			st := exe.Stats()
			if st.SlotWaits < 1 || st.Steps != int64(n+2) {
				t.Errorf("%d slot waits over %d steps", st.SlotWaits, st.Steps)
			}
			if err := exe.Close(); err != nil {
				t.Fatal(err)
			}
			held[1%n].Release() // after Close: a no-op
		})
	}
}

// TestPoolCopiedOutputsFromTheSlotThatRan: without zero copy, each step's
// outputs land in the caller's buffers whatever slot ran, for N = 1, 2, 3,
// reading every output only after all steps (no synchronisation between
// steps, so slots are reused while earlier steps may still run).
func TestPoolCopiedOutputsFromTheSlotThatRan(t *testing.T) {
	ctx := context.Background()
	for n := 1; n <= 3; n++ {
		t.Run(fmt.Sprintf("slots=%d", n), func(t *testing.T) {
			b := simtest.New(t, 1)
			s := simtest.Stream(t, b, 0)
			pp := newPoolProgram()
			const steps = 7
			xs := pp.inputs(t, b, steps)
			want := pp.eagerOutputs(t, b, xs)
			exe, err := stablegraph.Compile(ctx, b, pp.p, stablegraph.Options{Strategy: stablegraph.StrategyPool, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: n}}})
			if err != nil {
				t.Fatal(err)
			}
			defer exe.Close()
			var all []stablegraph.Outputs
			for i := range steps {
				bind := stablegraph.Bindings{pp.x: xs[i],
					pp.y: simtest.Alloc(t, b, 0, uint64(pp.y.Size())), pp.s: simtest.Alloc(t, b, 0, uint64(pp.s.Size()))}
				outs, err := exe.Run(ctx, s, bind)
				if err != nil {
					t.Fatal(err)
				}
				if outs.Leased() || outs.Addr(pp.y) != bind[pp.y] {
					t.Fatalf("copied outputs at %#x (leased %v), bound at %#x", outs.Addr(pp.y), outs.Leased(), bind[pp.y])
				}
				all = append(all, outs)
			}
			for i, outs := range all {
				if got := pp.read(t, exe, outs); !bytes.Equal(got[0], want[i][0]) || !bytes.Equal(got[1], want[i][1]) {
					t.Fatalf("step %d differs from eager", i)
				}
			}
			if st := exe.Stats(); st.Records != int64(n) || st.TimelineWrites != steps {
				t.Errorf("%d records, %d timeline writes; want %d and %d", st.Records, st.TimelineWrites, n, steps)
			}
		})
	}
}

// TestPoolStalledTimeline: a timeline that never advances (a hung GPU)
// makes the step after the fresh slots fail with ErrSlotWait at the slot
// deadline instead of waiting forever; an earlier caller deadline ends the
// wait too; a cancelled caller gets context.Canceled, not ErrSlotWait.
// The caller's deadline and cancellation come only once the step waits
// (Stats.SlotWaits), on an executable whose own slot deadline is far, so
// that no scheduling delay decides which ends the wait.
func TestPoolStalledTimeline(t *testing.T) {
	ctx := context.Background()
	for n := 1; n <= 2; n++ {
		t.Run(fmt.Sprintf("slots=%d", n), func(t *testing.T) {
			b := simtest.New(t, 1)
			s := simtest.Stream(t, b, 0)
			pp := newPoolProgram()
			xs := pp.inputs(t, b, 1)
			bind := stablegraph.Bindings{pp.x: xs[0], pp.y: simtest.Alloc(t, b, 0, uint64(pp.y.Size())), pp.s: simtest.Alloc(t, b, 0, uint64(pp.s.Size()))}
			// stalled compiles an executable whose n slots are all used by
			// steps the stalled timeline will never finish.
			stalled := func(slotWait time.Duration) *stablegraph.Executable {
				exe, err := stablegraph.Compile(ctx, b, pp.p, stablegraph.Options{
					Strategy: stablegraph.StrategyPool, SlotWait: slotWait, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: n}}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = exe.Close() }) // after a failure; a second Close is nil
				for i := range n {
					if _, err := exe.Run(ctx, s, bind); err != nil {
						t.Fatalf("step %d with a fresh slot: %v", i, err)
					}
				}
				return exe
			}
			b.StallTimeline(true)
			defer b.StallTimeline(false)

			exe := stalled(40 * time.Millisecond)
			start := time.Now()
			_, err := exe.Run(ctx, s, bind)
			if !errors.Is(err, stablegraph.ErrSlotWait) || !errors.Is(err, gpu.ErrTimeout) {
				t.Fatalf("step on a stalled timeline = %v, want ErrSlotWait and gpu.ErrTimeout", err)
			}
			// The upper bound is a watchdog: the step gave up.
			if el := time.Since(start); el < 40*time.Millisecond || el > time.Minute {
				t.Errorf("gave up after %v with a 40ms deadline", el)
			}
			if err := exe.Close(); err != nil {
				t.Fatal(err)
			}

			exe = stalled(time.Hour)
			// The caller's own deadline, when earlier, ends the wait too.
			short := &testDeadline{Context: ctx, at: time.Now().Add(time.Minute), done: make(chan struct{})}
			err = waitingStep(t, exe, short, short.expire, s, bind)
			if !errors.Is(err, stablegraph.ErrSlotWait) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("step past the caller's deadline = %v", err)
			}
			canceled, cancel := context.WithCancel(ctx)
			defer cancel()
			if err := waitingStep(t, exe, canceled, cancel, s, bind); !errors.Is(err, context.Canceled) || errors.Is(err, stablegraph.ErrSlotWait) {
				t.Fatalf("step canceled while waiting = %v", err)
			}
			if err := exe.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// waitingStep runs a step of exe under ctx in a goroutine, calls end once
// the step waits for a slot (Stats.SlotWaits grew), and returns the
// step's error.
func waitingStep(t *testing.T, exe *stablegraph.Executable, ctx context.Context, end func(), s gpu.Stream, bind stablegraph.Bindings) error {
	t.Helper()
	waits := exe.Stats().SlotWaits
	ran := make(chan error, 1)
	go func() {
		_, err := exe.Run(ctx, s, bind)
		ran <- err
	}()
	watchdog := time.After(time.Minute)
	for exe.Stats().SlotWaits == waits {
		select {
		case err := <-ran:
			t.Fatalf("step returned before waiting for a slot: %v", err)
		case <-watchdog:
			t.Fatal("step did not wait for a slot within a minute")
		case <-time.After(time.Millisecond):
		}
	}
	end()
	return <-ran
}

// testDeadline is a context with a deadline that passes when the test
// says so (expire), not by the clock: Deadline reports at, an instant
// before the executable's slot deadline.
type testDeadline struct {
	context.Context
	at   time.Time
	done chan struct{}
	once sync.Once
}

func (c *testDeadline) Deadline() (time.Time, bool) { return c.at, true }
func (c *testDeadline) Done() <-chan struct{}       { return c.done }
func (c *testDeadline) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}
func (c *testDeadline) expire() { c.once.Do(func() { close(c.done) }) }

// TestPoolOutOfMemoryAtSlot: when slot k cannot be created (a fault
// injected into MemCreate call k, or a device too small for k+1 slots),
// Compile fails with the device's error after releasing slots 0..k-1.
func TestPoolOutOfMemoryAtSlot(t *testing.T) {
	ctx := context.Background()
	pp := newPoolProgram()
	const n = 3
	for k := range n {
		t.Run(fmt.Sprintf("inject-at-%d", k), func(t *testing.T) {
			b := simtest.New(t, 1)
			base := b.LiveHandles()
			b.InjectFault("MemCreate", k, gpu.ErrOutOfMemory)
			exe, err := stablegraph.Compile(ctx, b, pp.p, stablegraph.Options{Strategy: stablegraph.StrategyPool, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: n}}})
			b.ClearFaults()
			if err == nil {
				exe.Close()
				t.Fatal("Compile succeeded with slot creation failing")
			}
			if !errors.Is(err, gpu.ErrOutOfMemory) || !errors.Is(err, gpu.ErrInjected) {
				t.Fatalf("err = %v", err)
			}
			if live := b.LiveHandles(); live != base {
				t.Fatalf("live after the failure: %s, before: %s", live, base)
			}
		})
	}
	t.Run("small-device", func(t *testing.T) {
		// Room for the executable's own buffers and two 2 MiB slots.
		b, err := sim.New(sim.Config{Devices: 1, DeviceMemory: 5 << 20})
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := b.Close(); err != nil {
				t.Error(err)
			}
		}()
		// Three slots do not fit.
		steptest.WantCompileRefused(t, b, b, pp.p, stablegraph.Options{Strategy: stablegraph.StrategyPool, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: 3}}}, gpu.ErrOutOfMemory, "")
		// Two fit.
		exe, err := stablegraph.Compile(ctx, b, pp.p, stablegraph.Options{Strategy: stablegraph.StrategyPool, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: 2}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := exe.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestPoolCompileFaults fails, one call at a time, every device call the
// pool makes at Compile, and checks that each failure is returned and
// releases everything.
func TestPoolCompileFaults(t *testing.T) {
	b := simtest.New(t, 1)
	pp := newPoolProgram()
	steptest.CompileFaults(t, b, pp.p, stablegraph.Options{Strategy: stablegraph.StrategyPool, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: 3}}},
		[]string{"DeviceProps", "MemCreate", "MemAddressReserve", "MemMap", "MemSetAccess", "HostAlloc", "MemAlloc"}, false)
}

// TestPoolNeedsVMM: on a device without VMM or stream memory operations,
// pool is refused at Compile with gpu.ErrNotSupported before anything is
// created, and auto does not choose it, saying why.
func TestPoolNeedsVMM(t *testing.T) {
	ctx := context.Background()
	for _, hide := range []noVMM{{hideVMM: true}, {hideMemOps: true}} {
		name := map[bool]string{true: "no-vmm", false: "no-stream-mem-ops"}[hide.hideVMM]
		t.Run(name, func(t *testing.T) {
			sb := simtest.New(t, 1)
			hide.Backend = sb
			pp := newPoolProgram()
			steptest.WantCompileRefused(t, hide, sb, pp.p, stablegraph.Options{Strategy: stablegraph.StrategyPool}, gpu.ErrNotSupported, "")
			// Zero-copy outputs and cheap node updates would make pool
			// the cheapest; auto must still not choose it.
			exe, err := stablegraph.Compile(ctx, hide, pp.p, stablegraph.Options{Strategy: stablegraph.StrategyAuto,
				Costs: stablegraph.Costs{NodeUpdateUS: 100, TracedUpdateUS: 100}, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{ZeroCopyOutputs: true}}})
			if err != nil {
				t.Fatal(err)
			}
			defer exe.Close()
			ch := exe.Choice()
			if ch.Strategy == stablegraph.StrategyPool || exe.Strategy() != ch.Strategy {
				t.Fatalf("auto chose %s (%s)", ch.Strategy, ch.Reason)
			}
			var pool *stablegraph.Candidate
			for i := range ch.Candidates {
				if ch.Candidates[i].Strategy == stablegraph.StrategyPool {
					pool = &ch.Candidates[i]
				}
			}
			if pool == nil || pool.Usable || !bytes.Contains([]byte(ch.Reason), []byte("pool: not usable")) {
				t.Fatalf("pool candidate %+v; reason %q", pool, ch.Reason)
			}
		})
	}
}

// TestPoolSignalFailure: when the timeline write after a step cannot be
// enqueued, the step fails, the slot is waited for instead, and the next
// steps run on with eager's results.
func TestPoolSignalFailure(t *testing.T) {
	ctx := context.Background()
	b := simtest.New(t, 1)
	s := simtest.Stream(t, b, 0)
	pp := newPoolProgram()
	const steps = 5
	xs := pp.inputs(t, b, steps)
	want := pp.eagerOutputs(t, b, xs)
	exe, err := stablegraph.Compile(ctx, b, pp.p, stablegraph.Options{Strategy: stablegraph.StrategyPool, SlotWait: time.Second, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	y, sp := simtest.Alloc(t, b, 0, uint64(pp.y.Size())), simtest.Alloc(t, b, 0, uint64(pp.s.Size()))
	for i := range steps {
		if i == 2 {
			b.InjectFault("StreamWriteValue64", 0, nil)
		}
		outs, err := exe.Run(ctx, s, stablegraph.Bindings{pp.x: xs[i], pp.y: y, pp.s: sp})
		if i == 2 {
			if !errors.Is(err, gpu.ErrInjected) {
				t.Fatalf("step with a failed timeline write = %v", err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		// y depends on the step's input only; s on the state, which the
		// failed step (whose graph did run) also advanced, as eager's did.
		if got := pp.read(t, exe, outs); !bytes.Equal(got[0], want[i][0]) || !bytes.Equal(got[1], want[i][1]) {
			t.Fatalf("step %d differs from eager", i)
		}
	}
}

// TestZeroCopyNeedsWrittenOutputs: an output the step reads before writing
// it in full cannot be leased (there are no caller contents to start
// from); stable and copied pool copy it in and match eager.
func TestZeroCopyNeedsWrittenOutputs(t *testing.T) {
	ctx := context.Background()
	const n = 64
	p := stablegraph.NewProgram("read-first")
	x := p.Param("x", 4*n)
	y := p.Output("y", 4*n) // y += x: reads the caller's y
	z := p.Output("z", 4*n) // written in its first half only
	xw := p.Param("xw", 4*n)
	p.Launch(kernels.Axpy, kernels.Elementwise(n), stablegraph.InOut(y.All()), stablegraph.In(x.All()), stablegraph.F32(2), stablegraph.I32(n))
	p.Launch(kernels.Copy, kernels.Elementwise(n/2), stablegraph.Out(z.Slice(0, 2*n)), stablegraph.In(x.Slice(0, 2*n)), stablegraph.I32(n/2))
	// A param the step writes: eager writes the caller's buffer.
	p.Launch(kernels.Axpy, kernels.Elementwise(n), stablegraph.InOut(xw.All()), stablegraph.In(x.All()), stablegraph.F32(1), stablegraph.I32(n))
	b := simtest.New(t, 1)
	_, err := stablegraph.Compile(ctx, b, p, stablegraph.Options{Strategy: stablegraph.StrategyPool, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{ZeroCopyOutputs: true}}})
	if !errors.Is(err, stablegraph.ErrInvalidProgram) {
		t.Fatalf("zero-copy pool of an output read first = %v", err)
	}
	run := func(opts stablegraph.Options) [][]byte {
		s := simtest.Stream(t, b, 0)
		exe, err := stablegraph.Compile(ctx, b, p, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer exe.Close()
		var got [][]byte
		for step := range 3 {
			bind := stablegraph.Bindings{}
			for _, buf := range []stablegraph.Buffer{x, y, z, xw} {
				bind[buf] = simtest.Alloc(t, b, 0, uint64(buf.Size()))
				if err := b.MemcpyHtoD(bind[buf], gpu.F32ToBytes(steptest.RandF32(steptest.NewRand(uint64(step*10+len(bind))), n, 1))); err != nil {
					t.Fatal(err)
				}
			}
			outs, err := exe.Run(ctx, s, bind)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range []stablegraph.Buffer{y, z} {
				data, err := exe.ReadOutput(ctx, outs, o)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, data)
			}
			data := make([]byte, xw.Size())
			if err := b.MemcpyDtoH(data, bind[xw]); err != nil {
				t.Fatal(err)
			}
			got = append(got, data)
		}
		return got
	}
	want := run(stablegraph.Options{Strategy: stablegraph.StrategyEager})
	for _, opts := range []stablegraph.Options{
		{Strategy: stablegraph.StrategyStable},
		{Strategy: stablegraph.StrategyStable, StrategyOptions: stablegraph.StrategyOptions{Copies: stablegraph.CopyOptions{OnStream: true}}},
		{Strategy: stablegraph.StrategyPool, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: 3}}},
		// pool cannot lease: auto does not choose it
		{Strategy: stablegraph.StrategyAuto, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{ZeroCopyOutputs: true}}},
	} {
		got := run(opts)
		for i := range want {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("%+v: result %d differs from eager", opts, i)
			}
		}
	}
}

// TestPersistentConcurrentRuns runs one executable from several goroutines,
// each on its own stream with its own buffers, under stable, pool (1 to 3
// slots, copied and zero-copy outputs) and auto; every result must be
// eager's. Run under -race.
func TestPersistentConcurrentRuns(t *testing.T) {
	const workers, steps = 4, 12
	w := steptest.MustWorkload(t, "mlp", workload.Config{Layers: 2, Width: 16, Batch: 2})
	for _, v := range persistentVariants() {
		t.Run(v.name, func(t *testing.T) {
			b := simtest.New(t, 1)
			exe := steptest.Workers{
				Program: w.Program, X: w.Params[0], Y: w.Outputs[0], States: w.States,
				Input:   func(i int) []byte { return w.Input(i, 0) },
				Options: v.opts,
				Workers: workers, Steps: steps,
			}.Run(t, b)
			if st := exe.Stats(); st.Steps != workers*steps || st.Rerecords != 0 {
				t.Errorf("steps %d, re-records %d", st.Steps, st.Rerecords)
			}
		})
	}
}

// BenchmarkPoolStep measures one pool step on sim, Run to stream
// synchronisation, with 1 to 3 slots, outputs copied or leased (and
// released each step), the caller's buffers ping-ponging.
func BenchmarkPoolStep(b *testing.B) {
	ctx := context.Background()
	for _, zc := range []bool{false, true} {
		for n := 1; n <= 3; n++ {
			b.Run(fmt.Sprintf("slots=%d/zero-copy=%v", n, zc), func(b *testing.B) {
				be := simtest.New(b, 1)
				s := simtest.Stream(b, be, 0)
				pp := newPoolProgram()
				exe, err := stablegraph.Compile(ctx, be, pp.p, stablegraph.Options{Strategy: stablegraph.StrategyPool, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: n, ZeroCopyOutputs: zc}}})
				if err != nil {
					b.Fatal(err)
				}
				defer exe.Close()
				var sets [2]stablegraph.Bindings
				for i := range sets {
					sets[i] = stablegraph.Bindings{}
					for _, buf := range []stablegraph.Buffer{pp.x, pp.y, pp.s} {
						sets[i][buf] = simtest.Alloc(b, be, 0, uint64(buf.Size()))
					}
				}
				for i := 0; b.Loop(); i++ {
					outs, err := exe.Run(ctx, s, sets[i%2])
					if err != nil {
						b.Fatal(err)
					}
					if err := be.StreamSynchronize(s); err != nil {
						b.Fatal(err)
					}
					outs.Release()
				}
				st := exe.Stats()
				b.ReportMetric(float64(st.CopyNodeUpdates)/float64(st.Steps), "copy-node-updates/step")
				b.ReportMetric(float64(st.BytesCopied)/float64(st.Steps), "bytes-copied/step")
			})
		}
	}
}

// BenchmarkPoolBackToBack measures pool steps run back to back on sim, as a
// training loop runs them (one stream synchronisation per 10 steps), so
// that most steps wait for their slot: with the default slot poll (yields,
// then sleeps) and with sleeps only, the old policy, whose short sleeps
// really last tens of microseconds on an idle host. It reports the waits
// per step and how many of them slept. On sim the device is a goroutine
// sharing the host's cores, so the process is never idle and short sleeps
// end on time: the times here do not show the cost that sleeping has with
// a real GPU (measure that with the bench command); the sleeping waits do
// show which policy sleeps.
func BenchmarkPoolBackToBack(b *testing.B) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		poll vmm.WaitPolicy
	}{{"yield-then-sleep", vmm.WaitPolicy{}}, {"sleep-only", vmm.WaitPolicy{Yield: -1, MinSleep: time.Microsecond}}} {
		for n := 1; n <= 2; n++ {
			b.Run(fmt.Sprintf("%s/slots=%d", c.name, n), func(b *testing.B) {
				be := simtest.New(b, 1)
				s := simtest.Stream(b, be, 0)
				pp := newPoolProgram()
				exe, err := stablegraph.Compile(ctx, be, pp.p, stablegraph.Options{Strategy: stablegraph.StrategyPool, SlotPoll: c.poll, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: n}}})
				if err != nil {
					b.Fatal(err)
				}
				defer exe.Close()
				var sets [2]stablegraph.Bindings
				for i := range sets {
					sets[i] = stablegraph.Bindings{}
					for _, buf := range []stablegraph.Buffer{pp.x, pp.y, pp.s} {
						sets[i][buf] = simtest.Alloc(b, be, 0, uint64(buf.Size()))
					}
				}
				before := exe.Stats()
				for i := 0; b.Loop(); i++ {
					if _, err := exe.Run(ctx, s, sets[i%2]); err != nil {
						b.Fatal(err)
					}
					if i%10 == 9 {
						if err := be.StreamSynchronize(s); err != nil {
							b.Fatal(err)
						}
					}
				}
				if err := be.StreamSynchronize(s); err != nil {
					b.Fatal(err)
				}
				st := exe.Stats()
				d := st.Counters.Sub(before.Counters)
				b.ReportMetric(float64(d.SlotWaits)/float64(st.Steps-before.Steps), "slot-waits/step")
				b.ReportMetric(float64(d.SlotWaitSleeps)/float64(st.Steps-before.Steps), "sleeping-waits/step")
			})
		}
	}
}

// TestPoolCloseReportsFailedRelease: a slot whose unmap or release fails at
// Close is reported, and the other slots are still released.
func TestPoolCloseReportsFailedRelease(t *testing.T) {
	for _, op := range []string{"MemUnmap", "MemRelease", "MemAddressFree", "HostFree", "GraphExecDestroy"} {
		t.Run(op, func(t *testing.T) {
			// Not simtest.New: what failed to be released stays live by definition.
			b, err := sim.New(sim.Config{Devices: 1, DeviceMemory: 1 << 30})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() }) // last: after the frees below
			ctx := context.Background()
			s := simtest.Stream(t, b, 0)
			pp := newPoolProgram()
			xs := pp.inputs(t, b, 3)
			exe, err := stablegraph.Compile(ctx, b, pp.p, stablegraph.Options{Strategy: stablegraph.StrategyPool, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: 3}}})
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range xs {
				bind := stablegraph.Bindings{pp.x: x, pp.y: simtest.Alloc(t, b, 0, uint64(pp.y.Size())), pp.s: simtest.Alloc(t, b, 0, uint64(pp.s.Size()))}
				if _, err := exe.Run(ctx, s, bind); err != nil {
					t.Fatal(err)
				}
			}
			before := b.Calls(op)
			b.InjectFault(op, 0, nil)
			if err := exe.Close(); !errors.Is(err, gpu.ErrInjected) {
				t.Fatalf("Close with %s failing = %v", op, err)
			}
			b.ClearFaults()
			if calls := b.Calls(op) - before; op != "HostFree" && calls < 3 {
				t.Errorf("Close called %s %d times after the first failed; want every slot tried", op, calls)
			}
		})
	}
}
