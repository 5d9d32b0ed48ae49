package vmm_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/vmm"
)

// TestWaitPolicyNext checks the policy as a function: yields for the yield
// budget, then sleeps from MinSleep doubling to MaxSleep; zero fields take
// the defaults; a negative yield budget sleeps at once.
func TestWaitPolicyNext(t *testing.T) {
	d := vmm.DefaultWaitPolicy()
	if d.Yield != time.Millisecond || d.MinSleep != 50*time.Microsecond || d.MaxSleep != time.Millisecond {
		t.Fatalf("defaults %+v", d)
	}
	for _, p := range []vmm.WaitPolicy{{}, d} {
		for _, el := range []time.Duration{0, time.Microsecond, 5 * time.Microsecond, 999 * time.Microsecond} {
			if got := p.Next(el, 0); got != 0 {
				t.Errorf("%+v: after %v of polling: sleep %v, want a yield", p, el, got)
			}
		}
		// The yield phase is bounded: after it, every step sleeps, and
		// the sleeps grow to the cap and stay there.
		want := []time.Duration{50, 100, 200, 400, 800, 1000, 1000, 1000}
		prev, el := time.Duration(0), time.Millisecond
		for i, w := range want {
			got := p.Next(el, prev)
			if got != w*time.Microsecond {
				t.Fatalf("%+v: sleep %d = %v, want %v", p, i, got, w*time.Microsecond)
			}
			prev, el = got, el+got
		}
	}
	if got := (vmm.WaitPolicy{Yield: -1}).Next(0, 0); got != vmm.DefaultWaitMinSleep {
		t.Errorf("no yield phase: first step %v, want a sleep of %v", got, vmm.DefaultWaitMinSleep)
	}
	if got := (vmm.WaitPolicy{MinSleep: time.Second, MaxSleep: time.Millisecond}).Next(time.Hour, 0); got != time.Millisecond {
		t.Errorf("MinSleep above MaxSleep: first sleep %v", got)
	}
	for _, p := range []vmm.WaitPolicy{{MinSleep: -1}, {MaxSleep: -1}} {
		if err := p.Validate(); !errors.Is(err, gpu.ErrInvalidValue) {
			t.Errorf("Validate(%+v) = %v", p, err)
		}
	}
}

// TestTimelineShortWaitYields: a wait on a point the device reaches shortly
// after the wait starts ends in the yield phase without a single sleep; a
// wait on a stalled timeline leaves the yield phase, sleeps, and fails at
// its deadline. Counted by WaitStats, not by the clock: the yield budget of
// the first part is set far above what the test needs, so a slow machine
// cannot make it sleep.
func TestTimelineShortWaitYields(t *testing.T) {
	b := simtest.New(t, 1)
	d0 := simtest.OpenDev(t, b, 0)
	// Each launch of the kernel "token" waits for one token.
	tokens := make(chan struct{})
	var closeTokens sync.Once
	t.Cleanup(func() { closeTokens.Do(func() { close(tokens) }) }) // before the backend closes
	gm, err := b.ModuleLoad(0, &gpu.ModuleImage{Name: "vmm-test-token", Kernels: []gpu.KernelSpec{{
		Name: "token",
		Ref: func(gpu.Memory, gpu.LaunchConfig, []gpu.Arg) error {
			<-tokens
			return nil
		},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.ModuleUnload(gm)
	gf, err := b.ModuleFunction(gm, "token")
	if err != nil {
		t.Fatal(err)
	}
	tl := simtest.Timeline(t, b, 0)
	if err := tl.SetWaitPolicy(vmm.WaitPolicy{Yield: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := tl.SetWaitPolicy(vmm.WaitPolicy{MaxSleep: -1}); !errors.Is(err, gpu.ErrInvalidValue) {
		t.Errorf("a negative sleep was accepted: %v", err)
	}
	if p := tl.WaitPolicy(); p.Yield != time.Minute || p.MinSleep != vmm.DefaultWaitMinSleep {
		t.Fatalf("policy %+v", p)
	}

	const rounds = 5
	for range rounds {
		if err := b.LaunchKernel(gf, gpu.Linear(1, 1), nil, d0.Stream); err != nil {
			t.Fatal(err)
		}
		p, err := tl.Signal(d0.Stream)
		if err != nil {
			t.Fatal(err)
		}
		// The point is reached a little after the wait starts.
		go func() { time.Sleep(200 * time.Microsecond); tokens <- struct{}{} }()
		if err := tl.Wait(context.Background(), p, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	st := tl.WaitStats()
	if st.Sleeps != 0 || st.Slept != 0 || st.Timeouts != 0 || (st.Waits > 0 && st.Yields == 0) {
		t.Fatalf("short waits slept: %+v", st)
	}
	t.Logf("%d short waits: %+v", rounds, st)

	// A hung device: the wait leaves the yield phase and sleeps. Bound to
	// its stream, the timeline queries it before every sleep: the first
	// StreamQuery proves the wait slept, and only then is it cancelled, so
	// that no scheduling delay can end it inside the yield phase.
	if err := tl.SetWaitPolicy(vmm.WaitPolicy{}); err != nil {
		t.Fatal(err)
	}
	if err := tl.Bind(d0.Stream); err != nil {
		t.Fatal(err)
	}
	b.StallTimeline(true)
	defer b.StallTimeline(false)
	p, err := tl.Signal(d0.Stream)
	if err != nil {
		t.Fatal(err)
	}
	queries := b.Calls("StreamQuery")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waited := make(chan error, 1)
	go func() { waited <- tl.Wait(ctx, p, time.Hour) }()
	// A watchdog, not a measure: the yield phase lasts 1 ms.
	watchdog := time.After(time.Minute)
	for b.Calls("StreamQuery") == queries {
		select {
		case err := <-waited:
			t.Fatalf("Wait on a stalled timeline returned %v before sleeping", err)
		case <-watchdog:
			cancel()
			t.Fatalf("Wait on a stalled timeline has not slept after a minute (then: %v)", <-waited)
		case <-time.After(time.Millisecond):
		}
	}
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) || errors.Is(err, gpu.ErrTimeout) {
		t.Fatalf("cancelled Wait on a stalled timeline: %v, want context.Canceled", err)
	}
	slept := tl.WaitStats()
	if slept.Waits-st.Waits != 1 || slept.Slept-st.Slept != 1 || slept.Sleeps-st.Sleeps < 1 || slept.Timeouts != 0 {
		t.Fatalf("stalled wait: %+v, before %+v", slept, st)
	}

	// ... and fails at its deadline: the timeout's or the context's. (How
	// long it yielded first depends on the scheduler, so it is not counted.)
	if err := tl.Wait(context.Background(), p, 20*time.Millisecond); !errors.Is(err, gpu.ErrTimeout) {
		t.Fatalf("Wait on a stalled timeline: %v, want ErrTimeout", err)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer dcancel()
	if err := tl.Wait(dctx, p, time.Hour); !errors.Is(err, gpu.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past the context's deadline: %v", err)
	}
	after := tl.WaitStats()
	if d := after.Waits - slept.Waits; d != 2 || after.Timeouts != 2 {
		t.Fatalf("stalled waits: %+v, before %+v", after, slept)
	}
	if err := b.StreamSynchronize(d0.Stream); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkTimelineWait measures a signal and a wait for it on sim, the
// point reached within microseconds (an empty stream), with the default
// policy and with sleeps only: the gap between them is what a sleep that
// is asked for microseconds really costs.
func BenchmarkTimelineWait(b *testing.B) {
	for _, c := range []struct {
		name string
		p    vmm.WaitPolicy
	}{{"default", vmm.WaitPolicy{}}, {"sleep-only", vmm.WaitPolicy{Yield: -1, MinSleep: time.Microsecond}}} {
		b.Run(c.name, func(b *testing.B) {
			be := simtest.New(b, 1)
			s := simtest.Stream(b, be, 0)
			tl, err := vmm.NewTimeline(be, 0)
			if err != nil {
				b.Fatal(err)
			}
			defer tl.Close()
			if err := tl.SetWaitPolicy(c.p); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				p, err := tl.Signal(s)
				if err != nil {
					b.Fatal(err)
				}
				if err := tl.Wait(context.Background(), p, time.Minute); err != nil {
					b.Fatal(err)
				}
			}
			st := tl.WaitStats()
			b.ReportMetric(float64(st.Sleeps)/float64(b.N), "sleeps/op")
			b.ReportMetric(float64(st.Yields)/float64(b.N), "yields/op")
			if err := be.StreamSynchronize(s); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// TestPollDoesNotSpin: a 20 ms wait on a counter that never moves sleeps,
// not spins, and a failing check ends the wait with its error, checked
// only once the wait sleeps.
func TestPollDoesNotSpin(t *testing.T) {
	// Without a yield phase, with sleeps doubling to 1 ms, the wait reads
	// the counter a few dozen times, not millions.
	var reads atomic.Int64
	done := func() bool { reads.Add(1); return false }
	_, err := vmm.WaitPolicy{Yield: -1}.Poll(context.Background(), time.Now().Add(20*time.Millisecond), done, nil)
	if !errors.Is(err, gpu.ErrTimeout) {
		t.Fatalf("err = %v", err)
	}
	if n := reads.Load(); n > 200 {
		t.Fatalf("%d counter reads in 20ms: the wait spins", n)
	}
	// With the default policy the wait yields first, then sleeps: the
	// check runs only once it sleeps, and its error ends the wait.
	var checks atomic.Int64
	boom := errors.New("boom")
	check := func() error {
		if checks.Add(1) == 3 {
			return boom
		}
		return nil
	}
	n, err := vmm.WaitPolicy{}.Poll(context.Background(), time.Now().Add(time.Minute), func() bool { return false }, check)
	if !errors.Is(err, boom) || checks.Load() != 3 || n.Sleeps != 2 {
		t.Fatalf("err = %v after %d checks and %d sleeps, want boom after 3 checks and 2 sleeps", err, checks.Load(), n.Sleeps)
	}
}
