package stablegraph_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/stablegraph/stablegraph"
	"github.com/stablegraph/stablegraph/client"
	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/retire"
	"github.com/stablegraph/stablegraph/streamcache"
	"github.com/stablegraph/stablegraph/workload"
)

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
	b, err := sim.New(gpu.Config{Devices: 2, DeviceMemory: 1 << 30})
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

	compile := func(wl *ccWorkload, st stablegraph.Strategy, dev int) (*stablegraph.Executable, error) {
		exe, err := stablegraph.Compile(ctx, b, wl.w.Program, stablegraph.Options{Strategy: st, Device: dev})
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
		exe, err := compile(wls[sh.name], sh.st, i%2)
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
				exe, err := compile(wl, st, dev)
				if err != nil {
					fail(fmt.Errorf("compile %s with %s: %w", wl.w.Name, st, err))
					return
				}
				exes, wlsOf = append(exes, exe), append(wlsOf, wl)
				caller, err := workload.NewCaller(b, dev, wl.w, workload.Random, uint64(g*perG+m+1))
				if err != nil {
					fail(err)
					return
				}
				callers = append(callers, caller)
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
