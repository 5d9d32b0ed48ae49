package stablegraph

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/trace"
)

// Collectives in programs: Comm, the communicator a collective command
// runs over, and the traced function that enqueues a command's part. The
// commands are declared with Program.AllReduce, ReduceScatter, AllGather
// and Broadcast (program.go) and checked with the rest of the program
// (validate.go).
//
// A collective command (AllReduce, ReduceScatter, AllGather, Broadcast) runs
// one rank's part of an operation of a communicator (Comm): every rank runs
// a program with the same collectives in the same order, each on its own
// device, usually one process per GPU (package rendezvous shares the
// communicator's id between processes; on sim the ranks are devices of one
// backend).
//
// A collective enters the executable as a traced command (see Program.Trace
// and package internal/trace) whose function enqueues the backend's collective on
// the stream it is given: eagerly under StrategyEager, and otherwise
// captured into a child graph of the step's graph. Its traces are cached by
// the addresses of its send and receive buffers like every traced
// command's, so a collective over buffers that do not move (the gradients
// of a data-parallel step, which are temps or states) is captured once and
// replayed from the cache by every strategy afterwards, however often the
// step is re-recorded; one over moving buffers is captured once per address
// set the cache holds, or moved by differential tracing where the backend's
// captured collective proves patchable (sim's always does; NCCL's may not,
// and is then captured again when its buffers move). Comm.Stats counts the
// captures, so a steady state without re-capture can be checked.
//
// Capture never communicates (sim's by construction; NCCL's with
// NCCL_GRAPH_REGISTER=0, which keeps captured collectives from registering
// buffers with their peers, and which NewCommID and NewComm see to:
// ncclenv.go), so ranks need not capture at the same steps:
// only the order in which collectives run must be the same on every rank,
// and it is, since every strategy runs a step's commands in program order.

// Comm is one rank's communicator for the collective commands of programs:
// a gpu.Comm of a backend with gpu.Collectives, bound to one device. Make
// one per rank with NewComm (one process per rank) or NewComms (every rank
// of one process), and Close it after the executables that use it.
//
// A Comm is safe for concurrent use: calls on the underlying communicator
// are serialised, as NCCL requires. The collectives of executables sharing
// a Comm must still run in the same order on every rank, so run them from
// one goroutine per rank.
type Comm struct {
	b    gpu.Backend
	coll gpu.Collectives
	h    gpu.Comm
	dev  int
	rank int
	size int

	captured atomic.Int64
	launched atomic.Int64

	mu struct {
		sync.Mutex
		closed bool
	}
}

// CommStats count the collectives a Comm enqueued.
type CommStats struct {
	// Captured counts collectives captured into graphs: every trace of a
	// collective command, differential tracing's second traces included.
	// A strategy in steady state over buffers that do not move adds none.
	Captured int64
	// Launched counts collectives enqueued on a stream to run at once
	// (StrategyEager). Collectives replayed by graphs are not counted.
	Launched int64
}

// NewCommID makes the id of a new communicator, which rank 0 shares with
// the other ranks (NCCL's unique id). It fails with an error wrapping
// gpu.ErrNotSupported on a backend without collectives.
func NewCommID(b gpu.Backend) (gpu.CommID, error) {
	if err := ncclGraphRegisterOff(b); err != nil {
		return gpu.CommID{}, err
	}
	coll, err := gpu.CollectivesOf(b)
	if err != nil {
		return gpu.CommID{}, fmt.Errorf("stablegraph: communicator id: %w", err)
	}
	id, err := coll.CommUniqueID()
	if err != nil {
		return gpu.CommID{}, fmt.Errorf("stablegraph: communicator id: %w", err)
	}
	return id, nil
}

// NewComm joins rank (0 <= rank < size) of the communicator id on device
// dev. It blocks until every rank has joined (on sim at most the backend's
// communicator timeout; NCCL's initialisation blocks until the ranks
// arrive, so share the id with a rendezvous that has a deadline first). It
// fails with an error wrapping gpu.ErrNotSupported on a backend without
// collectives.
func NewComm(b gpu.Backend, dev int, id gpu.CommID, size, rank int) (*Comm, error) {
	if err := ncclGraphRegisterOff(b); err != nil {
		return nil, fmt.Errorf("stablegraph: communicator rank %d of %d: %w", rank, size, err)
	}
	coll, err := gpu.CollectivesOf(b)
	if err != nil {
		return nil, fmt.Errorf("stablegraph: communicator rank %d of %d: %w", rank, size, err)
	}
	h, err := coll.CommInit(dev, id, size, rank)
	if err != nil {
		return nil, fmt.Errorf("stablegraph: communicator rank %d of %d on device %d: %w", rank, size, dev, err)
	}
	return &Comm{b: b, coll: coll, h: h, dev: dev, rank: rank, size: size}, nil
}

// NewComms makes one communicator whose rank i is on device devs[i], all in
// this process (NCCL's ncclCommInitAll), and returns the ranks in order.
// On error nothing is left open.
func NewComms(b gpu.Backend, devs []int) ([]*Comm, error) {
	id, err := NewCommID(b)
	if err != nil {
		return nil, err
	}
	comms := make([]*Comm, len(devs))
	errs := make([]error, len(devs))
	var wg sync.WaitGroup
	for r, dev := range devs {
		wg.Go(func() { comms[r], errs[r] = NewComm(b, dev, id, len(devs), r) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, c := range comms {
			if c != nil {
				err = errors.Join(err, c.Close())
			}
		}
		return nil, err
	}
	return comms, nil
}

// Rank is the communicator's rank of this Comm.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks.
func (c *Comm) Size() int { return c.size }

// Device is the device the rank runs on: executables using c must be
// compiled for it.
func (c *Comm) Device() int { return c.dev }

// Backend is the backend c belongs to.
func (c *Comm) Backend() gpu.Backend { return c.b }

// Stats returns what c has enqueued so far.
func (c *Comm) Stats() CommStats {
	return CommStats{Captured: c.captured.Load(), Launched: c.launched.Load()}
}

// Close destroys the rank's communicator. Executables that use it fail at
// their next collective. Close is idempotent.
func (c *Comm) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.closed {
		return nil
	}
	c.mu.closed = true
	if err := c.coll.CommDestroy(c.h); err != nil {
		return fmt.Errorf("stablegraph: close communicator rank %d: %w", c.rank, err)
	}
	return nil
}

func (c *Comm) String() string {
	if c == nil {
		return "<nil communicator>"
	}
	return fmt.Sprintf("communicator rank %d of %d on device %d", c.rank, c.size, c.dev)
}

// run is the collective's traced function: it enqueues the rank's part on
// env.Stream (captured when the stream is capturing).
func (d *collDecl) run(env *trace.Env) error {
	c := d.comm
	if env.Device != c.dev {
		return fmt.Errorf("%s runs on device %d, its %s: %w", d.kind, env.Device, c, gpu.ErrInvalidValue)
	}
	capturing, err := env.Backend.StreamIsCapturing(env.Stream)
	if err != nil {
		return err
	}
	send, recv := env.Ptrs[0], env.Ptrs[1]
	elems := uint64(d.send.n) / uint64(d.dt.Size())
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.closed {
		return fmt.Errorf("%s: the %s is closed: %w", d.kind, c, gpu.ErrInvalidHandle)
	}
	switch d.kind {
	case collAllReduce:
		err = c.coll.AllReduce(c.h, send, recv, elems, d.dt, d.op, env.Stream)
	case collReduceScatter:
		err = c.coll.ReduceScatter(c.h, send, recv, elems/uint64(c.size), d.dt, d.op, env.Stream)
	case collAllGather:
		err = c.coll.AllGather(c.h, send, recv, elems, d.dt, env.Stream)
	case collBroadcast:
		err = c.coll.Broadcast(c.h, send, recv, elems, d.dt, d.root, env.Stream)
	}
	if err != nil {
		return err
	}
	if capturing {
		c.captured.Add(1)
	} else {
		c.launched.Add(1)
	}
	return nil
}
