package stablegraph_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/simtest"
	"github.com/stablegraph/stablegraph/internal/steptest"
)

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
