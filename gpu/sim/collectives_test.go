package sim

import (
	"errors"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
)

// commRanks makes a communicator of n ranks on devices 0..n-1, joining
// from n goroutines (CommInit blocks until every rank joined), and destroys
// it when the test ends.
func commRanks(t testing.TB, b *Backend, n int) []gpu.Comm {
	t.Helper()
	id, err := b.CommUniqueID()
	must(t, err)
	comms := make([]gpu.Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { comms[r], errs[r] = b.CommInit(r, id, n, r) })
	}
	wg.Wait()
	must(t, errors.Join(errs...))
	t.Cleanup(func() {
		for _, c := range comms {
			must(t, b.CommDestroy(c))
		}
	})
	return comms
}

type rankBufs struct {
	s          gpu.Stream
	send, recv gpu.DevicePtr
}

func rankSetup(t testing.TB, b *Backend, n int, sendLen, recvLen uint64) []rankBufs {
	t.Helper()
	out := make([]rankBufs, n)
	for r := range out {
		out[r] = rankBufs{s: newStream(t, b, r), send: alloc(t, b, r, sendLen), recv: alloc(t, b, r, recvLen)}
	}
	return out
}

func syncAll(t testing.TB, b *Backend, rs []rankBufs) {
	t.Helper()
	for _, r := range rs {
		must(t, b.StreamSynchronize(r.s))
	}
}

// rankData is rank r's input: values whose float32 sum depends on the
// order of addition, so that the rank-order rule is tested.
func rankData(r, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(math.Pow(10, float64((r*7+i)%9-4))) * float32(1+r)
		if (i+r)%3 == 0 {
			v[i] = -v[i]
		}
	}
	return v
}

func TestCollectivesExactInRankOrder(t *testing.T) {
	const n, count = 4, 37
	b := newSim(t, Config{Devices: n})
	comms := commRanks(t, b, n)
	for r, c := range comms {
		rank, size, err := b.CommRank(c)
		must(t, err)
		if rank != r || size != n {
			t.Fatalf("CommRank = %d, %d; want %d, %d", rank, size, r, n)
		}
	}
	if got := b.LiveHandles().Comms; got != n {
		t.Fatalf("LiveHandles().Comms = %d, want %d", got, n)
	}
	inputs := make([][]float32, n)
	for r := range inputs {
		inputs[r] = rankData(r, n*count)
	}
	sumOf := func(i int) float32 {
		acc := inputs[0][i]
		for r := 1; r < n; r++ {
			acc += inputs[r][i]
		}
		return acc
	}
	maxOf := func(i int) float32 {
		acc := inputs[0][i]
		for r := 1; r < n; r++ {
			acc = max(acc, inputs[r][i])
		}
		return acc
	}

	t.Run("AllReduceSum", func(t *testing.T) {
		rs := rankSetup(t, b, n, 4*count, 4*count)
		for r, x := range rs {
			writeF32(t, b, x.send, inputs[r][:count])
			must(t, b.AllReduce(comms[r], x.send, x.recv, count, gpu.Float32, gpu.Sum, x.s))
		}
		syncAll(t, b, rs)
		for _, x := range rs {
			got := readF32(t, b, x.recv, count)
			for i := range got {
				if want := sumOf(i); math.Float32bits(got[i]) != math.Float32bits(want) {
					t.Fatalf("element %d = %v, want %v (rank-order sum)", i, got[i], want)
				}
			}
		}
	})
	t.Run("AllReduceMaxInPlace", func(t *testing.T) {
		rs := rankSetup(t, b, n, 4*count, 4)
		for r, x := range rs {
			writeF32(t, b, x.send, inputs[r][:count])
			must(t, b.AllReduce(comms[r], x.send, x.send, count, gpu.Float32, gpu.Max, x.s))
		}
		syncAll(t, b, rs)
		for _, x := range rs {
			got := readF32(t, b, x.send, count)
			for i := range got {
				if got[i] != maxOf(i) {
					t.Fatalf("element %d = %v, want %v", i, got[i], maxOf(i))
				}
			}
		}
	})
	t.Run("ReduceScatter", func(t *testing.T) {
		rs := rankSetup(t, b, n, 4*n*count, 4*count)
		for r, x := range rs {
			writeF32(t, b, x.send, inputs[r])
			must(t, b.ReduceScatter(comms[r], x.send, x.recv, count, gpu.Float32, gpu.Sum, x.s))
		}
		syncAll(t, b, rs)
		for r, x := range rs {
			got := readF32(t, b, x.recv, count)
			for i := range got {
				if want := sumOf(r*count + i); got[i] != want {
					t.Fatalf("rank %d element %d = %v, want %v", r, i, got[i], want)
				}
			}
		}
	})
	t.Run("AllGatherInt32", func(t *testing.T) {
		rs := rankSetup(t, b, n, 4*count, 4*n*count)
		for r, x := range rs {
			v := make([]byte, 4*count)
			for i := range count {
				v[4*i] = byte(r*count + i)
			}
			must(t, b.MemcpyHtoD(x.send, v))
			must(t, b.AllGather(comms[r], x.send, x.recv, count, gpu.Int32, x.s))
		}
		syncAll(t, b, rs)
		for _, x := range rs {
			got := make([]byte, 4*n*count)
			must(t, b.MemcpyDtoH(got, x.recv))
			for i := range n * count {
				if got[4*i] != byte(i) {
					t.Fatalf("element %d = %d, want %d", i, got[4*i], i)
				}
			}
		}
	})
	t.Run("Broadcast", func(t *testing.T) {
		rs := rankSetup(t, b, n, 4*count, 4*count)
		const root = 2
		for r, x := range rs {
			writeF32(t, b, x.send, inputs[r][:count])
			send := x.send
			if r != root {
				send = 0 // only the root's send buffer is read
			}
			must(t, b.Broadcast(comms[r], send, x.recv, count, gpu.Float32, root, x.s))
		}
		syncAll(t, b, rs)
		for _, x := range rs {
			if got := readF32(t, b, x.recv, count); !slices.Equal(got, inputs[root][:count]) {
				t.Fatalf("broadcast gave %v, want %v", got, inputs[root][:count])
			}
		}
	})
	t.Run("BadArguments", func(t *testing.T) {
		rs := rankSetup(t, b, n, 64, 64)
		x := rs[0]
		wantErr(t, b.AllReduce(comms[0], x.send, x.recv, 4, gpu.DataType(9), gpu.Sum, x.s), gpu.ErrInvalidValue)
		wantErr(t, b.AllReduce(comms[0], x.send, x.recv, 4, gpu.Float32, gpu.ReduceOp(7), x.s), gpu.ErrInvalidValue)
		wantErr(t, b.Broadcast(comms[0], x.send, x.recv, 4, gpu.Float32, n, x.s), gpu.ErrInvalidValue)
		wantErr(t, b.AllReduce(comms[0], 0, x.recv, 4, gpu.Float32, gpu.Sum, x.s), gpu.ErrInvalidValue)
		wantErr(t, b.AllReduce(comms[0], x.send, x.recv, 4, gpu.Float32, gpu.Sum, rs[1].s), gpu.ErrInvalidValue)
		wantErr(t, b.AllReduce(0, x.send, x.recv, 4, gpu.Float32, gpu.Sum, x.s), gpu.ErrInvalidHandle)
		wantErr(t, b.AllReduce(gpu.Comm(12345), x.send, x.recv, 4, gpu.Float32, gpu.Sum, x.s), gpu.ErrInvalidHandle)
		b.InjectFault("AllReduce", 0, nil)
		wantErr(t, b.AllReduce(comms[0], x.send, x.recv, 4, gpu.Float32, gpu.Sum, x.s), gpu.ErrInjected)
	})
}

func TestCollectiveCapturedIsAKernelNodeAndReplays(t *testing.T) {
	const n, count = 2, 16
	b := newSim(t, Config{Devices: n})
	comms := commRanks(t, b, n)
	rs := rankSetup(t, b, n, 4*count, 4*count)
	xs := make([]gpu.GraphExec, n)
	for r, x := range rs {
		must(t, b.StreamBeginCapture(x.s))
		must(t, b.AllReduce(comms[r], x.send, x.recv, count, gpu.Float32, gpu.Sum, x.s))
		g, err := b.StreamEndCapture(x.s)
		must(t, err)
		t.Cleanup(func() { must(t, b.GraphDestroy(g)) })
		nodes, err := b.GraphNodes(g)
		must(t, err)
		if len(nodes) != 1 {
			t.Fatalf("capture has %d nodes, want 1", len(nodes))
		}
		typ, err := b.GraphNodeType(nodes[0])
		must(t, err)
		p, err := b.GraphKernelNodeParams(nodes[0])
		must(t, err)
		name, err := b.FuncName(p.Func)
		must(t, err)
		if typ != gpu.NodeKernel || name != collKernelName || p.Args[2].AsPtr() != x.send || p.Args[3].AsPtr() != x.recv {
			t.Fatalf("captured node: %v %s %v", typ, name, p.Args)
		}
		xs[r] = instantiate(t, b, g)
	}
	// Nothing ran during capture.
	for _, x := range rs {
		wantAll(t, readF32(t, b, x.recv, count), 0)
	}
	for step := range 3 {
		for r, x := range rs {
			writeF32(t, b, x.send, slices.Repeat([]float32{float32(step*10 + r + 1)}, count))
			must(t, b.GraphLaunch(xs[r], x.s))
		}
		syncAll(t, b, rs)
		for _, x := range rs {
			wantAll(t, readF32(t, b, x.recv, count), float32(2*step*10+3))
		}
	}
}

func TestCommInitMissingRankTimesOut(t *testing.T) {
	b := newSim(t, Config{Devices: 3})
	b.SetCommTimeout(50 * time.Millisecond)
	id, err := b.CommUniqueID()
	must(t, err)
	start := time.Now()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 { // rank 2 never arrives
		wg.Go(func() {
			c, err := b.CommInit(r, id, 3, r)
			if err == nil {
				_ = b.CommDestroy(c)
			}
			errs[r] = err
		})
	}
	wg.Wait()
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("CommInit took %v with a 50ms timeout", d)
	}
	for _, err := range errs {
		wantErr(t, err, gpu.ErrTimeout)
	}
	if got := b.LiveHandles().Comms; got != 0 {
		t.Fatalf("%d communicators live after failed inits", got)
	}
	_, err = b.CommInit(0, id, 3, 0)
	_ = err // the id may be joined again; nothing to destroy if it times out
}

func TestCommInitRejectsBadJoins(t *testing.T) {
	b := newSim(t, Config{Devices: 2})
	b.SetCommTimeout(time.Second)
	id, err := b.CommUniqueID()
	must(t, err)
	_, err = b.CommInit(0, id, 3, 0)
	wantErr(t, err, gpu.ErrInvalidValue) // more ranks than devices
	_, err = b.CommInit(0, id, 2, 2)
	wantErr(t, err, gpu.ErrInvalidValue)
	// Two ranks on one device: the second join fails at once, and the
	// first, whose communicator can no longer complete, too.
	done := make(chan error, 1)
	go func() {
		c, err := b.CommInit(0, id, 2, 0)
		if err == nil {
			_ = b.CommDestroy(c)
		}
		done <- err
	}()
	time.Sleep(10 * time.Millisecond)
	_, err = b.CommInit(0, id, 2, 1)
	wantErr(t, err, gpu.ErrInvalidValue)
	b.SetCommTimeout(20 * time.Millisecond)
	if err := <-done; err == nil {
		t.Fatal("rank 0 joined a communicator whose rank 1 was refused")
	}
}

// failingRanks runs an all-reduce that rank 0 and 1 reach, and returns
// their errors and how long they took.
func waitRanks(t *testing.T, b *Backend, rs []rankBufs) ([]error, time.Duration) {
	t.Helper()
	start := time.Now()
	errs := make([]error, len(rs))
	for r, x := range rs {
		errs[r] = b.StreamSynchronize(x.s)
	}
	return errs, time.Since(start)
}

func TestCollectiveRankNeverArrives(t *testing.T) {
	const n = 3
	b := newSim(t, Config{Devices: n})
	comms := commRanks(t, b, n)
	b.SetCommTimeout(50 * time.Millisecond)
	rs := rankSetup(t, b, n, 16, 16)
	for r, x := range rs[:2] { // rank 2 never calls
		must(t, b.AllReduce(comms[r], x.send, x.recv, 4, gpu.Float32, gpu.Sum, x.s))
	}
	errs, d := waitRanks(t, b, rs[:2])
	if d > 2*time.Second {
		t.Fatalf("waiting took %v with a 50ms timeout", d)
	}
	for _, err := range errs {
		if !errors.Is(err, gpu.ErrTimeout) {
			t.Fatalf("got %v, want a timeout", err)
		}
	}
	// Aborted: rank 2 arriving now fails at once.
	must(t, b.AllReduce(comms[2], rs[2].send, rs[2].recv, 4, gpu.Float32, gpu.Sum, rs[2].s))
	if err := b.StreamSynchronize(rs[2].s); !errors.Is(err, gpu.ErrTimeout) {
		t.Fatalf("late rank got %v, want the communicator's timeout", err)
	}
	for r := range n {
		must(t, b.ResetDevice(r))
	}
}

func TestCollectivePeerDestroysOrFaults(t *testing.T) {
	for _, how := range []string{"destroy", "fault"} {
		t.Run(how, func(t *testing.T) {
			const n = 3
			b := newSim(t, Config{Devices: n})
			b.SetCommTimeout(time.Minute) // must not be what ends the wait
			id, err := b.CommUniqueID()
			must(t, err)
			comms := make([]gpu.Comm, n)
			var wg sync.WaitGroup
			for r := range n {
				wg.Go(func() { comms[r], _ = b.CommInit(r, id, n, r) })
			}
			wg.Wait()
			rs := rankSetup(t, b, n, 16, 16)
			for r, x := range rs[:2] {
				must(t, b.AllReduce(comms[r], x.send, x.recv, 4, gpu.Float32, gpu.Sum, x.s))
			}
			switch how {
			case "destroy":
				must(t, b.CommDestroy(comms[2]))
			case "fault":
				// Rank 2's device faults before its all-reduce.
				k := loadKernels(t, b, 2)
				must(t, b.LaunchKernel(k.fn(t, "sg_fill"), gpu.Linear(4, 0), fillArgs(gpu.DevicePtr(1<<20), 1, 4), rs[2].s))
				// Refused once the fault is sticky; skipped otherwise.
				_ = b.AllReduce(comms[2], rs[2].send, rs[2].recv, 4, gpu.Float32, gpu.Sum, rs[2].s)
			}
			errs, d := waitRanks(t, b, rs[:2])
			if d > 5*time.Second {
				t.Fatalf("waiting took %v", d)
			}
			for _, err := range errs {
				if !errors.Is(err, gpu.ErrDeviceLost) {
					t.Fatalf("got %v, want the communicator aborted (ErrDeviceLost)", err)
				}
			}
			for r, c := range comms {
				if how != "destroy" || r != 2 {
					must(t, b.CommDestroy(c))
				}
				must(t, b.ResetDevice(r))
			}
		})
	}
}

func TestCollectiveRanksDisagree(t *testing.T) {
	const n = 2
	b := newSim(t, Config{Devices: n})
	comms := commRanks(t, b, n)
	rs := rankSetup(t, b, n, 16, 16)
	must(t, b.AllReduce(comms[0], rs[0].send, rs[0].recv, 4, gpu.Float32, gpu.Sum, rs[0].s))
	must(t, b.AllReduce(comms[1], rs[1].send, rs[1].recv, 3, gpu.Float32, gpu.Sum, rs[1].s))
	for _, err := range []error{b.StreamSynchronize(rs[0].s), b.StreamSynchronize(rs[1].s)} {
		if !errors.Is(err, gpu.ErrInvalidValue) {
			t.Fatalf("got %v, want ErrInvalidValue (ranks disagree)", err)
		}
	}
	for r := range n {
		must(t, b.ResetDevice(r))
	}
}

func TestCloseWithWaitingCollective(t *testing.T) {
	b, err := New(Config{Devices: 2})
	must(t, err)
	id, err := b.CommUniqueID()
	must(t, err)
	comms := make([]gpu.Comm, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() { comms[r], _ = b.CommInit(r, id, 2, r) })
	}
	wg.Wait()
	s, err := b.StreamCreate(0, 0, 0)
	must(t, err)
	p, err := b.MemAlloc(0, 16)
	must(t, err)
	must(t, b.AllReduce(comms[0], p, p, 4, gpu.Float32, gpu.Sum, s))
	time.Sleep(5 * time.Millisecond)
	done := make(chan error)
	go func() { done <- b.Close() }()
	select {
	case err := <-done:
		if err == nil || !errors.Is(err, gpu.ErrIllegalState) {
			t.Fatalf("Close = %v, want the leaked handles reported", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close hangs on a stream waiting in a collective")
	}
}
