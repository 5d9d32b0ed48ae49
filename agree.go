package stablegraph

import (
	"errors"
	"fmt"
	"math"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/replay"
)

// agreement is the replay.Agreement of an executable whose program holds
// collectives (compiled with StrategyAuto): an elementwise maximum of a
// few numbers over the ranks of every communicator the program's
// collectives use, in the order they first appear, run as eager
// all-reduces (float32, max) on the step's stream. So auto's choice is
// made together by the ranks (replay/collective.go). It allocates its
// device buffer and event at its first MaxOver, and the auto strategy
// that called it closes it. Used under the executable's lock, like the
// strategy.
type agreement struct {
	b     gpu.Backend
	dev   int
	comms []*Comm
	buf   gpu.DevicePtr
	ev    gpu.Event
	in    []byte // the host slices of the copies in flight
	out   []byte
}

// newAgreement is the agreement over the communicators of cmds'
// collectives, nil when there is none.
func newAgreement(b gpu.Backend, dev int, cmds []cmdDecl) *agreement {
	a := &agreement{b: b, dev: dev}
	for i := range cmds {
		if d := cmds[i].coll; d != nil && !containsComm(a.comms, d.comm) {
			a.comms = append(a.comms, d.comm)
		}
	}
	if len(a.comms) == 0 {
		return nil
	}
	return a
}

func containsComm(cs []*Comm, c *Comm) bool {
	for _, x := range cs {
		if x == c {
			return true
		}
	}
	return false
}

func (a *agreement) MaxOver(s gpu.Stream, v []float64) (func() ([]float64, error), error) {
	n := len(v)
	if n == 0 || n > replay.MaxAgreed {
		return nil, fmt.Errorf("stablegraph: agreement over %d values (1 to %d): %w", n, replay.MaxAgreed, gpu.ErrInvalidValue)
	}
	if a.buf == 0 {
		buf, err := a.b.MemAlloc(a.dev, 4*replay.MaxAgreed)
		if err != nil {
			return nil, fmt.Errorf("stablegraph: agreement buffer: %w", err)
		}
		ev, err := a.b.EventCreate(a.dev, gpu.EventDisableTiming)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("stablegraph: agreement event: %w", err), a.b.MemFree(buf))
		}
		a.buf, a.ev = buf, ev
	}
	f := make([]float32, n)
	for i, x := range v {
		f[i] = float32(x) // +Inf stays +Inf; times round to float32's 7 digits, the same on every rank
	}
	a.in, a.out = gpu.F32ToBytes(f), make([]byte, 4*n)
	if err := a.b.MemcpyHtoDAsync(a.buf, a.in, s); err != nil {
		return nil, fmt.Errorf("stablegraph: agreement: %w", err)
	}
	for _, c := range a.comms {
		if err := c.allReduceNow(a.buf, uint64(n), gpu.Max, s); err != nil {
			return nil, fmt.Errorf("stablegraph: agreement over %s: %w", c, err)
		}
	}
	if err := a.b.MemcpyDtoHAsync(a.out, a.buf, s); err != nil {
		return nil, fmt.Errorf("stablegraph: agreement: %w", err)
	}
	if err := a.b.EventRecord(a.ev, s); err != nil {
		return nil, fmt.Errorf("stablegraph: agreement: %w", err)
	}
	return func() ([]float64, error) {
		if err := a.b.EventSynchronize(a.ev); err != nil {
			return nil, fmt.Errorf("stablegraph: agreement: %w", err)
		}
		got := gpu.BytesToF32(a.out)
		a.in, a.out = nil, nil
		out := make([]float64, len(got))
		for i, x := range got {
			out[i] = float64(x)
			if math.IsInf(float64(x), 1) {
				out[i] = math.Inf(1)
			}
		}
		return out, nil
	}, nil
}

func (a *agreement) Close() error {
	var errs []error
	if a.ev != 0 {
		errs = append(errs, a.b.EventDestroy(a.ev))
		a.ev = 0
	}
	if a.buf != 0 {
		errs = append(errs, a.b.MemFree(a.buf))
		a.buf = 0
	}
	return errors.Join(errs...)
}

// allReduceNow enqueues an all-reduce of n float32 values in place at p
// on s, to run at once (not a program's collective: the agreement's). It
// counts as launched.
func (c *Comm) allReduceNow(p gpu.DevicePtr, n uint64, op gpu.ReduceOp, s gpu.Stream) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.closed {
		return fmt.Errorf("the %s is closed: %w", c, gpu.ErrInvalidHandle)
	}
	if err := c.coll.AllReduce(c.h, p, p, n, gpu.Float32, op, s); err != nil {
		return err
	}
	c.launched.Add(1)
	return nil
}
