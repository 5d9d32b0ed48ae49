package sim

import (
	"runtime"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
)

// Stream waits on memory values (gpu.StreamWaits), modelled on CUDA's
// cuStreamWaitValue64 with CU_STREAM_WAIT_VALUE_GEQ. A stream's worker
// (stream.go) reaches the wait and polls the word, as a GPU's front end
// does, until it holds a value at or past the one waited for, the device
// faults or the backend closes; the stream's later work waits behind it.
// Nothing tells the sim when the host stores into mapped memory
// (HostMem.Store64 is a plain atomic store), so polling is the model, not a
// shortcut: the poll starts with a few yields and backs off to sleeps of at
// most waitPollMax, so a released gate is seen within about that.

const (
	// waitSpins is how many polls yield the processor before the
	// poller sleeps.
	waitSpins = 16
	// waitPollMax bounds the sleep between two polls.
	waitPollMax = 200 * time.Microsecond
)

var _ gpu.StreamWaits = (*Backend)(nil)

// StreamWaitsSupported reports that every simulated device can wait for
// values (as a compute 9.0 device with 64-bit stream memory operations
// can).
func (b *Backend) StreamWaitsSupported(dev int) error {
	const op = "StreamWaitsSupported"
	if err := b.enter(op); err != nil {
		return err
	}
	return b.checkDev(op, dev)
}

// StreamWaitValue64 implements gpu.StreamWaits: later work on s waits until
// the word at p reaches v (gpu.WaitValueReached). p must be 8-byte aligned
// in live host or device memory when the wait is enqueued; memory freed
// while the stream waits on it faults the device when the poll next reads
// it, as a GPU reading freed memory does. On a capturing stream the call is
// refused and the capture is unchanged.
func (b *Backend) StreamWaitValue64(s gpu.Stream, p gpu.DevicePtr, v uint64) error {
	const op = "StreamWaitValue64"
	if err := b.enter(op); err != nil {
		return err
	}
	if p == 0 || p%8 != 0 {
		return gpu.Errorf(op, gpu.ErrInvalidValue, "address %#x is null or not 8-byte aligned", uint64(p))
	}
	return b.submit(op, s, capRefuse, func(*stream) (cmd, error) {
		if !b.mu.as.liveAt(uint64(p)) {
			return cmd{}, gpu.Errorf(op, gpu.ErrInvalidValue, "address %#x is not in live host or device memory", uint64(p))
		}
		return cmd{kind: cmdWaitValue, p: params{wv: writeValue{p: p, v: v}}}, nil
	})
}

// waitValue runs a cmdWaitValue on st's worker: it returns once the word
// reaches the value, the device faults (reading the word may fault it) or
// the backend closes.
func (st *stream) waitValue(wv writeValue) {
	b := st.b
	a := actor{dev: st.dev, kernel: "waitValue64"}
	sleep := time.Microsecond
	for i := 0; ; i++ {
		cur, err := b.readValue(a, wv.p)
		if err != nil || gpu.WaitValueReached(cur, wv.v) || b.closingNow() || b.faulted(st.dev) {
			return // a fault is already the device's sticky error
		}
		if i < waitSpins {
			runtime.Gosched()
			continue
		}
		time.Sleep(sleep)
		sleep = min(2*sleep, waitPollMax)
	}
}

// readValue atomically reads the 8-byte word at p (8-byte aligned) as the
// device a reads it.
func (b *Backend) readValue(a actor, p gpu.DevicePtr) (uint64, error) {
	var arr [1]piece
	b.mu.RLock()
	defer b.mu.RUnlock()
	ps, f := b.mu.as.resolve(p, 8, a.perm(), arr[:0])
	if f != nil {
		return 0, b.fault(a, p, 8, false, f)
	}
	// p is 8-aligned, and so is every region, mapping and page boundary:
	// the word lies in one piece and one page.
	return ps[0].mem.load64(ps[0].off), nil
}
