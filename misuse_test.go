package stablegraph_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/commtest"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/kernels"
)

// TestCollectiveLengthsDoNotWrap: size·len in the collective checks is
// computed without wrapping around. A receive of 6148914691236517208 bytes
// over 3 ranks "held" 3 times in an 8-byte send (3 × that = 2^64 + 8),
// which passed Validate; it and the all-gather mirror are refused, with
// the exact product.
func TestCollectiveLengthsDoNotWrap(t *testing.T) {
	b := newSimN(t, 3)
	c := commtest.Comms(t, b, 3)[0]
	const huge = 6148914691236517208 // ×3 = 2^64 + 8; a multiple of 4
	for _, kind := range []string{"reducescatter", "allgather"} {
		p := stablegraph.NewProgram("wrap")
		small, big := p.Param("small", 8), p.Output("big", huge)
		var want string
		if kind == "reducescatter" {
			p.ReduceScatter(c, small.All(), big.All(), gpu.Float32, gpu.Sum)
			want = "send small[0:8] must hold 3 times recv big[0:6148914691236517208] (3 ranks): 18446744073709551624 bytes"
		} else {
			p.AllGather(c, big.All(), small.All(), gpu.Float32)
			p.Memset(big.Slice(0, 4), 0, 4)
			want = "recv small[0:8] must hold 3 times send big[0:6148914691236517208] (3 ranks): 18446744073709551624 bytes"
		}
		err := p.Validate()
		if !errors.Is(err, stablegraph.ErrInvalidProgram) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", kind, err, want)
		}
	}
}

// TestSliceEndDoesNotWrap: a slice whose end is past 2^63 prints that end,
// not a negative one, in its String and in the bounds error.
func TestSliceEndDoesNotWrap(t *testing.T) {
	p := stablegraph.NewProgram("wrap")
	x, y := p.Param("x", 64), p.Output("y", 64)
	s := x.Slice(1<<62, 1<<62)
	if got, want := s.String(), "x[4611686018427387904:9223372036854775808]"; got != want {
		t.Errorf("String: %q, want %q", got, want)
	}
	p.Launch(kernels.Copy, kernels.Elementwise(16), stablegraph.Out(y.All()), stablegraph.In(s), stablegraph.I32(16))
	err := p.Validate()
	want := "argument 1: slice [4611686018427387904, 9223372036854775808) is out of bounds of the buffer's 64 bytes"
	if !errors.Is(err, stablegraph.ErrInvalidProgram) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "-") {
		t.Errorf("%v\nwant %q and no negative number", err, want)
	}
	// Two such slices of one buffer in a memcpy: their overlap is judged
	// on the true ends.
	q := stablegraph.NewProgram("wrap2")
	z := q.Output("z", 64)
	q.Memcpy(z.Slice(1<<62, 1<<62), z.Slice(1<<62+8, 1<<62))
	if err := q.Validate(); err == nil || !strings.Contains(err.Error(), "overlap") {
		t.Errorf("overlapping slices past 2^63: %v", err)
	}
}

// noPanic runs f and turns a panic into a test error.
func noPanic(t *testing.T, what string, f func() error) error {
	t.Helper()
	var err error
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("%s panicked: %v", what, r)
				err = fmt.Errorf("panic")
			}
		}()
		err = f()
	}()
	return err
}

// TestNilContext: Compile, Run, CloseContext and the reads and writes fail
// with an error that says what is wrong (wrapping gpu.ErrInvalidValue)
// instead of panicking on a nil context; nothing leaks.
func TestNilContext(t *testing.T) {
	var nilCtx context.Context
	ctx := context.Background()
	b := simtest.New(t, 1)
	p := stablegraph.NewProgram("nilctx")
	x, w, y := p.Param("x", 64), p.State("w", 64), p.Output("y", 64)
	p.Launch(kernels.Add, kernels.Elementwise(16), stablegraph.Out(y.All()), stablegraph.In(x.All()), stablegraph.In(w.All()), stablegraph.I32(16))
	wantNil := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, gpu.ErrInvalidValue) || !strings.Contains(err.Error(), "nil context.Context") {
			t.Errorf("%s with a nil context: %v", what, err)
		}
	}
	wantNil("Compile", noPanic(t, "Compile", func() error {
		exe, err := stablegraph.Compile(nilCtx, b, p, stablegraph.Options{})
		if err == nil {
			exe.Close()
		}
		return err
	}))
	simtest.WantZero(t, b, "after Compile with a nil context")
	s := simtest.Stream(t, b, 0)
	exe, err := stablegraph.Compile(ctx, b, p, stablegraph.Options{Strategy: stablegraph.StrategyPatch})
	if err != nil {
		t.Fatal(err)
	}
	xp, yp := simtest.Alloc(t, b, 0, 64), simtest.Alloc(t, b, 0, 64)
	bind := stablegraph.Bindings{x: xp, y: yp}
	wantNil("Run", noPanic(t, "Run", func() error { _, err := exe.Run(nilCtx, s, bind); return err }))
	outs, err := exe.Run(ctx, s, bind)
	if err != nil {
		t.Fatal(err)
	}
	wantNil("ReadOutput", noPanic(t, "ReadOutput", func() error { _, err := exe.ReadOutput(nilCtx, outs, y); return err }))
	wantNil("ReadBuffer", noPanic(t, "ReadBuffer", func() error { _, err := exe.ReadBuffer(nilCtx, w); return err }))
	wantNil("WriteBuffer", noPanic(t, "WriteBuffer", func() error { return exe.WriteBuffer(nilCtx, w, make([]byte, 64)) }))
	wantNil("BindState", noPanic(t, "BindState", func() error { return exe.BindState(nilCtx, w, yp) }))
	wantNil("CloseContext", noPanic(t, "CloseContext", func() error { return exe.CloseContext(nilCtx) }))
	if err := exe.Close(); err != nil {
		t.Fatal(err)
	}
	wantNil("CloseContext of a closed executable", noPanic(t, "CloseContext", func() error { return exe.CloseContext(nilCtx) }))
}

// tinyProgram is y = x: nothing to wait for once its step is done.
func tinyProgram() (p *stablegraph.Program, x, y stablegraph.Buffer) {
	p = stablegraph.NewProgram("tiny")
	x, y = p.Param("x", 64), p.Output("y", 64)
	p.Launch(kernels.Copy, kernels.Elementwise(16), stablegraph.Out(y.All()), stablegraph.In(x.All()), stablegraph.I32(16))
	return p, x, y
}

// TestCloseCancelledContextIsDeterministic: ctx bounds Close's waits and
// nothing else. With nothing to wait for, a Close with a context already
// cancelled, or with CloseWait: 1ns, releases everything, every time (it
// used to pick at random between the free semaphore and the done context,
// and then release nothing); closing a closed executable returns nil,
// every time. Sampled by count, not by luck: 200 rounds each.
func TestCloseCancelledContextIsDeterministic(t *testing.T) {
	const rounds = 200
	bg := context.Background()
	done, cancel := context.WithCancel(bg)
	cancel()
	b := simtest.New(t, 1)
	s := simtest.Stream(t, b, 0)
	xp, yp := simtest.Alloc(t, b, 0, 64), simtest.Alloc(t, b, 0, 64)
	base := b.LiveHandles()
	for _, tc := range []struct {
		name  string
		opts  stablegraph.Options
		close func(*stablegraph.Executable) error
		step  bool
	}{
		{"idle, cancelled context", stablegraph.Options{}, func(e *stablegraph.Executable) error { return e.CloseContext(done) }, false},
		{"after a finished step, cancelled context", stablegraph.Options{Strategy: stablegraph.StrategyPatch},
			func(e *stablegraph.Executable) error { return e.CloseContext(done) }, true},
		{"after a finished step, CloseWait 1ns", stablegraph.Options{CloseWait: time.Nanosecond},
			func(e *stablegraph.Executable) error { return e.Close() }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range rounds {
				p, x, y := tinyProgram()
				exe, err := stablegraph.Compile(bg, b, p, tc.opts)
				if err != nil {
					t.Fatal(err)
				}
				if tc.step {
					if _, err := exe.Run(bg, s, stablegraph.Bindings{x: xp, y: yp}); err != nil {
						t.Fatal(err)
					}
					if err := b.StreamSynchronize(s); err != nil {
						t.Fatal(err)
					}
				}
				if err := tc.close(exe); err != nil {
					t.Fatalf("round %d: nothing to wait for, yet Close says %v", i, err)
				}
				if live := b.LiveHandles(); live != base {
					t.Fatalf("round %d: live handles %s after Close, want %s", i, live, base)
				}
				for j := range 5 {
					if err := tc.close(exe); err != nil {
						t.Fatalf("round %d: Close %d of a closed executable: %v", i, j+2, err)
					}
				}
			}
		})
	}
}

// TestCloseSaysWhatItWaitsFor: with a step stuck on the device, a Close
// with a cancelled context says it was waiting for the last step and
// releases nothing; while another Close (with time to wait) is in
// progress, a Close with a cancelled context says it was waiting for
// another Close; once that one has released everything, a Close with a
// cancelled context returns nil. Each state is reached by waiting for it,
// so every answer is deterministic.
func TestCloseSaysWhatItWaitsFor(t *testing.T) {
	bg := context.Background()
	done, cancel := context.WithCancel(bg)
	cancel()
	b := simtest.New(t, 1)
	s := simtest.Stream(t, b, 0)
	gate := make(chan struct{})
	var opened bool
	open := func() {
		if !opened {
			opened = true
			close(gate)
		}
	}
	p, x, y := gatedProgram(gate)
	xp, yp := simtest.Alloc(t, b, 0, 64), simtest.Alloc(t, b, 0, 64)
	bind := stablegraph.Bindings{x: xp, y: yp}
	var exes [2]*stablegraph.Executable
	for i := range exes {
		exe, err := stablegraph.Compile(bg, b, p, stablegraph.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer exe.Close()
		if _, err := exe.Run(bg, s, bind); err != nil { // held by the gate
			t.Fatal(err)
		}
		exes[i] = exe
	}
	defer open() // before the Closes deferred above
	for range 20 {
		err := exes[0].CloseContext(done)
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "the last step has not completed on the device, so nothing was released") {
			t.Fatalf("stuck step, cancelled context: %v", err)
		}
	}

	exe := exes[1]
	first := make(chan error, 1)
	go func() { first <- exe.CloseContext(bg) }()
	// The first Close marks the executable closed, which Run reports at
	// once, only once it holds the semaphore of Closes.
	for {
		if _, err := exe.Run(bg, s, bind); errors.Is(err, stablegraph.ErrClosed) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	for range 20 {
		err := exe.CloseContext(done)
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "waiting for another Close to finish") {
			t.Fatalf("another Close in progress, cancelled context: %v", err)
		}
	}
	open()
	if err := <-first; err != nil {
		t.Fatalf("the first Close, once the step completed: %v", err)
	}
	for range 20 {
		if err := exe.CloseContext(done); err != nil {
			t.Fatalf("closed executable, cancelled context: %v", err)
		}
	}
}
