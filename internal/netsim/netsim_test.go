package netsim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/gpu/sim"
	"github.com/stablegraph/stablegraph/rendezvous"
)

const token = "netsim-test-token-0123456789"

// procs makes world "processes": a sim of one device each, joined by a
// rendezvous over loopback with messages of at most maxMsg bytes, each
// sim's collectives going through its group. Everything is closed, and
// checked for live handles, at the end.
func procs(t *testing.T, world, maxMsg int) []*sim.Backend {
	t.Helper()
	groups := join(t, world, maxMsg, 10*time.Second)
	bs := make([]*sim.Backend, world)
	for r, g := range groups {
		s, err := sim.New(sim.Config{Devices: 1, DeviceMemory: 1 << 28, Transport: New(g)})
		if err != nil {
			t.Fatal(err)
		}
		bs[r] = s
		t.Cleanup(func() {
			if c := s.LiveHandles(); !c.IsZero() {
				t.Errorf("rank %d: live handles at the end: %+v", r, c)
			}
			g.Close()
			if err := s.Close(); err != nil {
				t.Error(err)
			}
		})
	}
	return bs
}

// join joins world rendezvous groups over loopback.
func join(t *testing.T, world, maxMsg int, timeout time.Duration) []*rendezvous.Group {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	groups := make([]*rendezvous.Group, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		cfg := rendezvous.Config{Addr: l.Addr().String(), Rank: r, World: world, Token: token, Timeout: timeout, MaxMessage: maxMsg}
		if r == 0 {
			cfg.Listener = l
		}
		wg.Go(func() { groups[r], errs[r] = rendezvous.Join(context.Background(), cfg) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return groups
}

// initAll makes one communicator over the processes.
func initAll(t *testing.T, bs []*sim.Backend) []gpu.Comm {
	t.Helper()
	id, err := bs[0].CommUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	cs := make([]gpu.Comm, len(bs))
	errs := make([]error, len(bs))
	var wg sync.WaitGroup
	for r, b := range bs {
		wg.Go(func() { cs[r], errs[r] = b.CommInit(0, id, len(bs), r) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for r, b := range bs {
			if err := b.CommDestroy(cs[r]); err != nil {
				t.Error(err)
			}
		}
	})
	return cs
}

// op is one collective to run on every rank.
type op struct {
	name      string
	dt        gpu.DataType
	sendBytes int // per rank
	recvBytes int
	run       func(c gpu.Collectives, h gpu.Comm, send, recv gpu.DevicePtr, s gpu.Stream) error
}

func ops(n, world int) []op {
	var out []op
	for _, dt := range []gpu.DataType{gpu.Float32, gpu.Int32, gpu.Float64, gpu.Int64} {
		sz := dt.Size()
		for _, red := range []gpu.ReduceOp{gpu.Sum, gpu.Max} {
			out = append(out,
				op{fmt.Sprintf("AllReduce %s %s", dt, red), dt, n * sz, n * sz, func(c gpu.Collectives, h gpu.Comm, send, recv gpu.DevicePtr, s gpu.Stream) error {
					return c.AllReduce(h, send, recv, uint64(n), dt, red, s)
				}},
				op{fmt.Sprintf("ReduceScatter %s %s", dt, red), dt, n * world * sz, n * sz, func(c gpu.Collectives, h gpu.Comm, send, recv gpu.DevicePtr, s gpu.Stream) error {
					return c.ReduceScatter(h, send, recv, uint64(n), dt, red, s)
				}})
		}
		out = append(out,
			op{fmt.Sprintf("AllGather %s", dt), dt, n * sz, n * world * sz, func(c gpu.Collectives, h gpu.Comm, send, recv gpu.DevicePtr, s gpu.Stream) error {
				return c.AllGather(h, send, recv, uint64(n), dt, s)
			}},
			op{fmt.Sprintf("Broadcast %s", dt), dt, n * sz, n * sz, func(c gpu.Collectives, h gpu.Comm, send, recv gpu.DevicePtr, s gpu.Stream) error {
				return c.Broadcast(h, send, recv, uint64(n), dt, world-1, s)
			}})
	}
	return out
}

// runOn runs o on rank r of backend b (device dev, communicator h) with
// input in, and returns the receive buffer.
func runOn(b interface {
	gpu.Backend
	gpu.Collectives
}, dev int, h gpu.Comm, o op, in []byte) ([]byte, error) {
	s, err := b.StreamCreate(dev, gpu.StreamNonBlocking, 0)
	if err != nil {
		return nil, err
	}
	defer b.StreamDestroy(s)
	send, err := b.MemAlloc(dev, uint64(o.sendBytes))
	if err != nil {
		return nil, err
	}
	defer b.MemFree(send)
	recv, err := b.MemAlloc(dev, uint64(o.recvBytes))
	if err != nil {
		return nil, err
	}
	defer b.MemFree(recv)
	if err := b.MemcpyHtoD(send, in); err != nil {
		return nil, err
	}
	if err := o.run(b, h, send, recv, s); err != nil {
		return nil, err
	}
	if err := b.StreamSynchronize(s); err != nil {
		return nil, err
	}
	out := make([]byte, o.recvBytes)
	return out, b.MemcpyDtoH(out, recv)
}

// input is rank r's send buffer for o: random values of o's type (floats
// of every magnitude, so that the order of additions shows in the bits).
func input(o op, r, round int) []byte {
	rng := rand.New(rand.NewPCG(uint64(r), uint64(round)))
	b := make([]byte, o.sendBytes)
	switch o.dt {
	case gpu.Float32:
		v := make([]float32, o.sendBytes/4)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * float64(int(1)<<rng.IntN(20)))
		}
		copy(b, gpu.F32ToBytes(v))
	default:
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
	}
	return b
}

// TestCollectivesMatchTheSim: every collective of every type and reduction,
// across three processes with messages small enough to need several rounds,
// gives each rank the bits the sim gives with the three ranks as devices of
// one process.
func TestCollectivesMatchTheSim(t *testing.T) {
	const world, n = 3, 100
	bs := procs(t, world, 512) // 100 float64 per rank take several rounds
	cs := initAll(t, bs)
	ref, err := sim.New(sim.Config{Devices: world, DeviceMemory: 1 << 28})
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	id, _ := ref.CommUniqueID()
	refComms := make([]gpu.Comm, world)
	refErrs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Go(func() { refComms[r], refErrs[r] = ref.CommInit(r, id, world, r) })
	}
	wg.Wait()
	if err := errors.Join(refErrs...); err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range refComms {
			ref.CommDestroy(c)
		}
	}()
	for round, o := range ops(n, world) {
		t.Run(o.name, func(t *testing.T) {
			got := make([][]byte, world)
			want := make([][]byte, world)
			errs := make([]error, 2*world)
			var wg sync.WaitGroup
			for r := range world {
				wg.Go(func() { got[r], errs[r] = runOn(bs[r], 0, cs[r], o, input(o, r, round)) })
				wg.Go(func() { want[r], errs[world+r] = runOn(ref, r, refComms[r], o, input(o, r, round)) })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			for r := range world {
				if !bytes.Equal(got[r], want[r]) {
					t.Fatalf("rank %d: the result across processes differs from the sim's in one process", r)
				}
			}
		})
	}
}

// TestCapturedCollectiveReplays: a collective captured into a graph runs
// when the graph is replayed, on the data of that moment, every time.
func TestCapturedCollectiveReplays(t *testing.T) {
	const world, n = 2, 64
	bs := procs(t, world, 0)
	cs := initAll(t, bs)
	errs := make([]error, world)
	results := make([][][]float32, world)
	var wg sync.WaitGroup
	for r, b := range bs {
		wg.Go(func() {
			results[r], errs[r] = func() (_ [][]float32, err error) {
				s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
				if err != nil {
					return nil, err
				}
				defer func() { err = errors.Join(err, b.StreamDestroy(s)) }()
				buf, err := b.MemAlloc(0, 4*n)
				if err != nil {
					return nil, err
				}
				defer func() { err = errors.Join(err, b.MemFree(buf)) }()
				if err := b.StreamBeginCapture(s); err != nil {
					return nil, err
				}
				if err := b.AllReduce(cs[r], buf, buf, n, gpu.Float32, gpu.Sum, s); err != nil {
					return nil, err
				}
				g, err := b.StreamEndCapture(s)
				if err != nil {
					return nil, err
				}
				defer func() { err = errors.Join(err, b.GraphDestroy(g)) }()
				x, err := b.GraphInstantiate(g)
				if err != nil {
					return nil, err
				}
				defer func() { err = errors.Join(err, b.GraphExecDestroy(x)) }()
				var out [][]float32
				for step := range 3 {
					v := make([]float32, n)
					for i := range v {
						v[i] = float32((r + 1) * (step + 1) * i)
					}
					if err := b.MemcpyHtoD(buf, gpu.F32ToBytes(v)); err != nil {
						return nil, err
					}
					if err := b.GraphLaunch(x, s); err != nil {
						return nil, err
					}
					if err := b.StreamSynchronize(s); err != nil {
						return nil, err
					}
					got := make([]byte, 4*n)
					if err := b.MemcpyDtoH(got, buf); err != nil {
						return nil, err
					}
					out = append(out, gpu.BytesToF32(got))
				}
				return out, nil
			}()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r := range world {
		for step, v := range results[r] {
			for i, x := range v {
				if want := float32(3 * (step + 1) * i); x != want { // (1+2)·(step+1)·i
					t.Fatalf("rank %d, replay %d: element %d = %v, want %v", r, step, i, x, want)
				}
			}
		}
	}
}

// TestDisagreeingRanksFail: ranks calling different operations, or joining
// different communicators, or as another rank than their process's, get an
// error each instead of a wrong result or a hang.
func TestDisagreeingRanksFail(t *testing.T) {
	const world = 2
	bs := procs(t, world, 0)
	if _, err := bs[0].CommInit(0, gpu.CommID{}, 3, 0); !errors.Is(err, gpu.ErrInvalidValue) || !strings.Contains(err.Error(), "one rank per process") {
		t.Fatalf("CommInit of another world: %v", err)
	}
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r, b := range bs {
		wg.Go(func() {
			c, err := b.CommInit(0, gpu.CommID{byte(r)}, world, r)
			if err == nil {
				b.CommDestroy(c)
			}
			errs[r] = err
		})
	}
	wg.Wait()
	for r, err := range errs {
		if !errors.Is(err, gpu.ErrInvalidValue) || !strings.Contains(err.Error(), "another communicator") {
			t.Fatalf("rank %d with another id: %v", r, err)
		}
	}
	cs := initAll(t, bs)
	n := []int{4, 8}
	for r, b := range bs {
		o := ops(n[r], world)[0] // AllReduce float32 sum, of another count on each rank
		wg.Go(func() { _, errs[r] = runOn(b, 0, cs[r], o, input(o, r, 0)) })
	}
	wg.Wait()
	for r, err := range errs {
		if !errors.Is(err, gpu.ErrInvalidValue) || !strings.Contains(err.Error(), "ranks disagree") {
			t.Fatalf("rank %d: %v", r, err)
		}
		if err := bs[r].ResetDevice(0); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLostRankFails: a rank whose process is gone (its rendezvous aborted)
// fails the others' collectives with gpu.ErrDeviceLost at once.
func TestLostRankFails(t *testing.T) {
	const world = 3
	groups := join(t, world, 0, 30*time.Second)
	bs := make([]*sim.Backend, world)
	for r, g := range groups {
		s, err := sim.New(sim.Config{Devices: 1, Transport: New(g)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Close(); s.Close() })
		bs[r] = s
	}
	cs := initAll(t, bs)
	groups[2].Abort("the process was killed")
	start := time.Now()
	errs := make([]error, world-1)
	var wg sync.WaitGroup
	for r := range world - 1 {
		o := ops(16, world)[0]
		wg.Go(func() { _, errs[r] = runOn(bs[r], 0, cs[r], o, input(o, r, 0)) })
	}
	wg.Wait()
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the collectives took %v to fail", d)
	}
	for r, err := range errs {
		if !errors.Is(err, gpu.ErrDeviceLost) || !strings.Contains(err.Error(), "the process was killed") {
			t.Fatalf("rank %d: %v", r, err)
		}
		bs[r].ResetDevice(0)
	}
}

// TestFaultingRankFailsThePeers: a rank whose device faults reading its
// send buffer (freed memory) gets its fault, and the other ranks fail at
// once with gpu.ErrDeviceLost naming it, instead of waiting for their
// deadline.
func TestFaultingRankFailsThePeers(t *testing.T) {
	const world = 3
	bs := procs(t, world, 0)
	for _, b := range bs {
		b.SetCommTimeout(time.Minute) // must not be what ends the wait
	}
	cs := initAll(t, bs)
	errs := make([]error, world)
	start := time.Now()
	var wg sync.WaitGroup
	for r, b := range bs {
		wg.Go(func() {
			errs[r] = func() error {
				s, err := b.StreamCreate(0, gpu.StreamNonBlocking, 0)
				if err != nil {
					return err
				}
				defer b.StreamDestroy(s)
				buf, err := b.MemAlloc(0, 64)
				if err != nil {
					return err
				}
				send := buf
				if r == 1 {
					if err := b.MemFree(buf); err != nil {
						return err
					}
					if buf, err = b.MemAlloc(0, 64); err != nil {
						return err
					}
				}
				defer b.MemFree(buf)
				if err := b.AllReduce(cs[r], send, buf, 16, gpu.Float32, gpu.Sum, s); err != nil {
					return err
				}
				return b.StreamSynchronize(s)
			}()
		})
	}
	wg.Wait()
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("the collectives took %v to fail", d)
	}
	var fe *gpu.FaultError
	if !errors.As(errs[1], &fe) {
		t.Errorf("the faulting rank: %v, want its fault", errs[1])
	}
	for _, r := range []int{0, 2} {
		if !errors.Is(errs[r], gpu.ErrDeviceLost) || !strings.Contains(errs[r].Error(), "rank 1's device faulted") {
			t.Errorf("rank %d: %v, want ErrDeviceLost naming rank 1", r, errs[r])
		}
	}
	for _, b := range bs {
		if err := b.ResetDevice(0); err != nil {
			t.Fatal(err)
		}
	}
}

// timeoutGroup is a group whose every exchange times out.
type timeoutGroup struct{}

func (timeoutGroup) AllGather(context.Context, []byte) ([][]byte, error) {
	return nil, fmt.Errorf("rendezvous: all-gather: %w", rendezvous.ErrTimeout)
}
func (timeoutGroup) Rank() int       { return 0 }
func (timeoutGroup) World() int      { return 2 }
func (timeoutGroup) MaxMessage() int { return 1 << 20 }

// TestTimeoutIsGPUTimeout: a rendezvous timeout reaches the sim as
// gpu.ErrTimeout, which CommInit reports as such.
func TestTimeoutIsGPUTimeout(t *testing.T) {
	tr := New(timeoutGroup{})
	if _, err := tr.AllGather(context.Background(), nil); !errors.Is(err, gpu.ErrTimeout) || !errors.Is(err, rendezvous.ErrTimeout) {
		t.Fatalf("AllGather: %v, want gpu.ErrTimeout wrapping the rendezvous's", err)
	}
	b, err := sim.New(sim.Config{Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.CommInit(0, gpu.CommID{}, 2, 0); !errors.Is(err, gpu.ErrTimeout) || errors.Is(err, gpu.ErrDeviceLost) {
		t.Fatalf("CommInit over a transport that times out: %v, want gpu.ErrTimeout", err)
	}
}
