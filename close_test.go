package stablegraph_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/kernels"
)

// gatedProgram is y = x after a kernel that holds its stream until gate is
// closed: a step that stays on the device as long as the test wants.
func gatedProgram(gate <-chan struct{}) (p *stablegraph.Program, x, y stablegraph.Buffer) {
	p = stablegraph.NewProgram("gated")
	p.AddModule(simtest.GateModule(gate))
	x, y = p.Param("x", 64), p.Output("y", 64)
	p.Launch("gate", kernels.Elementwise(1))
	p.Launch(kernels.Copy, kernels.Elementwise(16), stablegraph.Out(y.All()), stablegraph.In(x.All()), stablegraph.I32(16))
	return p, x, y
}

// within runs f and fails the test when it has not returned after d (the
// gate is then opened, so that the test can end).
func within(t *testing.T, d time.Duration, gate chan struct{}, what string, f func()) time.Duration {
	t.Helper()
	done := make(chan struct{})
	start := time.Now()
	go func() { f(); close(done) }()
	select {
	case <-done:
		return time.Since(start)
	case <-time.After(d):
		close(gate)
		<-done
		t.Fatalf("%s still running after %v", what, d)
		return 0
	}
}

// TestCloseWakesSlotWaiterAndIsBounded: with a pool step stuck on the
// device and a second step waiting for the one slot, Close wakes the
// waiting Run at once with ErrClosed (not at its 30 s slot deadline), and
// returns itself at its deadline, naming what it left unreleased; the
// read-only accessors answer at once meanwhile. Once the device is done, a
// second Close releases everything (the sim's live-handle counters return
// to zero at cleanup).
func TestCloseWakesSlotWaiterAndIsBounded(t *testing.T) {
	ctx := context.Background()
	b := simtest.New(t, 1)
	s := simtest.Stream(t, b, 0)
	gate := make(chan struct{})
	p, x, y := gatedProgram(gate)
	xp, yp := simtest.Alloc(t, b, 0, 64), simtest.Alloc(t, b, 0, 64)
	exe, err := stablegraph.Compile(ctx, b, p, stablegraph.Options{Strategy: stablegraph.StrategyPool, StrategyOptions: stablegraph.StrategyOptions{Pool: stablegraph.PoolOptions{Slots: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	bind := stablegraph.Bindings{x: xp, y: yp}
	if _, err := exe.Run(ctx, s, bind); err != nil {
		t.Fatal(err)
	}
	waiter := make(chan error, 1)
	go func() {
		_, err := exe.Run(ctx, s, bind)
		waiter <- err
	}()
	// The second step waits for the slot (SlotWaits counts it).
	for deadline := time.Now().Add(5 * time.Second); exe.Stats().SlotWaits == 0; {
		if time.Now().After(deadline) {
			close(gate)
			t.Fatal("the second step never waited for the slot")
		}
		time.Sleep(time.Millisecond)
	}
	const closeWait = 300 * time.Millisecond
	closeCtx, cancel := context.WithTimeout(ctx, closeWait)
	defer cancel()
	closed := make(chan error, 1)
	closeStart := time.Now()
	go func() { closed <- exe.CloseContext(closeCtx) }()

	var werr error
	woke := within(t, 5*time.Second, gate, "the Run waiting for a slot", func() { werr = <-waiter })
	if !errors.Is(werr, stablegraph.ErrClosed) {
		t.Fatalf("the waiting Run: %v, want ErrClosed", werr)
	}
	if woke > closeWait {
		t.Errorf("the waiting Run woke %v after Close began, later than Close's own deadline", woke)
	}
	// Close is still waiting for the stuck step: the accessors answer.
	within(t, 2*time.Second, gate, "the accessors during Close", func() {
		for range 10 {
			_ = exe.Stats()
			_ = exe.Memory()
			_ = exe.Choice()
			_ = exe.Strategy()
			_ = exe.Traces()
		}
	})
	var cerr error
	within(t, closeWait+5*time.Second, gate, "Close", func() { cerr = <-closed })
	if took := time.Since(closeStart); took < closeWait {
		t.Errorf("Close returned after %v, before its deadline, with the step still stuck", took)
	}
	if !errors.Is(cerr, context.DeadlineExceeded) || !errors.Is(cerr, gpu.ErrTimeout) || !strings.Contains(cerr.Error(), "nothing was released") || !strings.Contains(cerr.Error(), "pool slots") {
		t.Fatalf("Close on a stuck stream: %v", cerr)
	}
	if _, err := exe.Run(ctx, s, bind); !errors.Is(err, stablegraph.ErrClosed) {
		t.Errorf("Run after Close: %v", err)
	}
	close(gate)
	if err := exe.Close(); err != nil {
		t.Fatalf("Close once the device is done: %v", err)
	}
	if err := exe.Close(); err != nil {
		t.Fatalf("third Close: %v", err)
	}
}

// TestCloseWakesReadWaiter: a read waiting for a stuck step (ReadOutput
// with no deadline of its own) wakes with ErrClosed when Close begins,
// instead of holding the executable and Close behind it.
func TestCloseWakesReadWaiter(t *testing.T) {
	ctx := context.Background()
	b := simtest.New(t, 1)
	s := simtest.Stream(t, b, 0)
	gate := make(chan struct{})
	p, x, y := gatedProgram(gate)
	xp, yp := simtest.Alloc(t, b, 0, 64), simtest.Alloc(t, b, 0, 64)
	exe, err := stablegraph.Compile(ctx, b, p, stablegraph.Options{Strategy: stablegraph.StrategyPatch, CloseWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	outs, err := exe.Run(ctx, s, stablegraph.Bindings{x: xp, y: yp})
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan error, 1)
	go func() {
		_, err := exe.ReadOutput(ctx, outs, y)
		read <- err
	}()
	time.Sleep(20 * time.Millisecond) // let the read start waiting
	var cerr error
	within(t, 5*time.Second, gate, "Close behind a waiting read", func() { cerr = exe.Close() })
	if err := <-read; !errors.Is(err, stablegraph.ErrClosed) {
		t.Errorf("the waiting read: %v, want ErrClosed", err)
	}
	if !errors.Is(cerr, gpu.ErrTimeout) {
		t.Errorf("Close (Options.CloseWait) on a stuck stream: %v", cerr)
	}
	close(gate)
	if err := exe.Close(); err != nil {
		t.Fatal(err)
	}
}
