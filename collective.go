package stablegraph

import (
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/trace"
)

// Collectives in programs.
//
// A collective command (AllReduce, ReduceScatter, AllGather, Broadcast) runs
// one rank's part of an operation of a communicator (Comm): every rank runs
// a program with the same collectives in the same order, each on its own
// device, usually one process per GPU (package rendezvous shares the
// communicator's id between processes; on sim the ranks are devices of one
// backend).
//
// A collective enters the executable as a traced command (see Program.Trace
// and package trace) whose function enqueues the backend's collective on
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
// buffers with their peers), so ranks need not capture at the same steps:
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

// collKind is the kind of a collective command.
type collKind uint8

const (
	collAllReduce collKind = iota + 1
	collReduceScatter
	collAllGather
	collBroadcast
)

func (k collKind) String() string {
	switch k {
	case collAllReduce:
		return "allreduce"
	case collReduceScatter:
		return "reducescatter"
	case collAllGather:
		return "allgather"
	case collBroadcast:
		return "broadcast"
	}
	return fmt.Sprintf("collKind(%d)", uint8(k))
}

// collDecl is the part of a command declaration only collectives have.
type collDecl struct {
	kind       collKind
	comm       *Comm
	dt         gpu.DataType
	op         gpu.ReduceOp
	root       int
	send, recv Slice
}

// collective appends a collective command: a traced command over send (read)
// and recv (written), in that order, even when they are the same slice.
func (p *Program) collective(d *collDecl) {
	p.cmds = append(p.cmds, cmdDecl{kind: cmdTrace, name: d.kind.String(), fn: d.run,
		args: []Arg{In(d.send), Out(d.recv)}, coll: d})
}

// AllReduce appends an all-reduce over comm: every rank's recv receives the
// element-wise reduction (op: gpu.Sum or gpu.Max), in rank order, of every
// rank's send, both holding elements of dt. send and recv have the same
// length; send == recv is in place, and they may not overlap otherwise.
func (p *Program) AllReduce(comm *Comm, send, recv Slice, dt gpu.DataType, op gpu.ReduceOp) {
	p.collective(&collDecl{kind: collAllReduce, comm: comm, dt: dt, op: op, send: send, recv: recv})
}

// ReduceScatter appends a reduce-scatter over comm: the element-wise
// reduction of every rank's send is split into comm.Size() blocks and rank
// r's recv receives block r. len(send) = comm.Size()·len(recv); in place
// when recv is block r of send.
func (p *Program) ReduceScatter(comm *Comm, send, recv Slice, dt gpu.DataType, op gpu.ReduceOp) {
	p.collective(&collDecl{kind: collReduceScatter, comm: comm, dt: dt, op: op, send: send, recv: recv})
}

// AllGather appends an all-gather over comm: every rank's recv receives the
// send of every rank, rank r's at byte r·len(send). len(recv) =
// comm.Size()·len(send); in place when send is block r of recv.
func (p *Program) AllGather(comm *Comm, send, recv Slice, dt gpu.DataType) {
	p.collective(&collDecl{kind: collAllGather, comm: comm, dt: dt, send: send, recv: recv})
}

// Broadcast appends a broadcast over comm: every rank's recv receives the
// root rank's send (other ranks' send is not read, but must be declared:
// pass recv for an in-place broadcast). send and recv have the same length.
func (p *Program) Broadcast(comm *Comm, send, recv Slice, dt gpu.DataType, root int) {
	p.collective(&collDecl{kind: collBroadcast, comm: comm, dt: dt, root: root, send: send, recv: recv})
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

// checkCollective checks what can be checked without a device: the
// communicator is given, the type and reduction are known, slices hold
// whole elements, lengths follow the collective's rule, and send and recv
// overlap only in the collective's in-place form.
func (p *Program) checkCollective(ck *checker, i int, c *cmdDecl, op string) {
	d := c.coll
	if d.comm == nil {
		ck.add(i, op, "", "no communicator")
		return
	}
	size := int64(d.comm.size)
	elem := int64(d.dt.Size())
	if elem == 0 {
		ck.add(i, op, "", "unknown data type %v", d.dt)
		return
	}
	if (d.kind == collAllReduce || d.kind == collReduceScatter) && d.op != gpu.Sum && d.op != gpu.Max {
		ck.add(i, op, "", "unknown reduction %v", d.op)
	}
	if d.kind == collBroadcast && (d.root < 0 || int64(d.root) >= size) {
		ck.add(i, op, "", "root %d is not a rank of the %d", d.root, size)
	}
	for _, s := range []Slice{d.send, d.recv} {
		if s.off%elem != 0 || s.n%elem != 0 {
			ck.add(i, op, s.buf.Name(), "slice %s does not hold whole %d-byte %s elements", s, elem, d.dt)
			return
		}
	}
	send, recv := d.send, d.recv
	block := int64(-1) // the in-place position allowed, as an offset into the larger slice
	switch d.kind {
	case collAllReduce, collBroadcast:
		if send.n != recv.n {
			ck.add(i, op, recv.buf.Name(), "send %s and recv %s differ in length", send, recv)
		}
		block = 0
	case collReduceScatter:
		if send.n != size*recv.n {
			ck.add(i, op, recv.buf.Name(), "send %s must hold %d times recv %s (%d ranks)", send, size, recv, size)
		}
		block = int64(d.comm.rank) * recv.n
	case collAllGather:
		if recv.n != size*send.n {
			ck.add(i, op, recv.buf.Name(), "recv %s must hold %d times send %s (%d ranks)", recv, size, send, size)
		}
		block = int64(d.comm.rank) * send.n
	}
	if send.buf != recv.buf || send.off+send.n <= recv.off || recv.off+recv.n <= send.off {
		return
	}
	inPlace := false
	switch d.kind {
	case collAllReduce, collBroadcast:
		inPlace = send == recv
	case collReduceScatter:
		inPlace = recv.off == send.off+block && recv.n <= send.n
	case collAllGather:
		inPlace = send.off == recv.off+block && send.n <= recv.n
	}
	if !inPlace {
		ck.add(i, op, recv.buf.Name(), "send %s and recv %s overlap, and not as the in-place form of %s", send, recv, d.kind)
	}
}

// checkComms checks the communicators of p's collectives against the
// backend and device Compile binds to: the backend must have collectives
// (else an error wrapping gpu.ErrNotSupported), and each communicator must
// belong to it and to the device, and be open.
func (p *Program) checkComms(b gpu.Backend, dev int) error {
	ck := &checker{p: p}
	for i := range p.cmds {
		d := p.cmds[i].coll
		if d == nil || d.comm == nil {
			continue
		}
		op := p.cmds[i].label()
		if _, err := gpu.CollectivesOf(b); err != nil {
			return fmt.Errorf("stablegraph: compile %q: command %d (%s): %w", p.name, i, op, err)
		}
		c := d.comm
		c.mu.Lock()
		closed := c.mu.closed
		c.mu.Unlock()
		switch {
		case !sameBackend(c.b, b):
			ck.add(i, op, "", "the %s belongs to backend %s, not the backend compiled for (%s)", c, c.b.Name(), b.Name())
		case c.dev != dev:
			ck.add(i, op, "", "the %s is not on device %d, which the program is compiled for", c, dev)
		case closed:
			ck.add(i, op, "", "the %s is closed", c)
		}
	}
	return errors.Join(ck.errs...)
}

// sameBackend reports whether a and b are the same backend, without the
// panic of comparing interfaces holding uncomparable values.
func sameBackend(a, b gpu.Backend) bool {
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	if ta != tb || ta == nil || !ta.Comparable() {
		return false
	}
	return a == b
}
