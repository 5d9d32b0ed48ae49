package sim

import (
	"crypto/rand"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/collref"
)

// Collectives: the sim implements gpu.Collectives with its devices as the
// ranks. A communicator is made by CommInit calls of every rank on distinct
// devices of one Backend, and each collective is stream work that completes
// when every rank's stream has reached it, as with NCCL. With a Transport
// (Config.Transport, SetTransport) the ranks are processes instead, one per
// process: see transport.go. Both run the same kernel, check the same
// arguments and combine the ranks' data with the same code (collCombine),
// so they give the same bits.
//
// # Model
//
// Each rank's collective is a kernel launch of an internal function of its
// device, "ncclDevKernel_sim" (one per device, made at the first CommInit on
// it; it belongs to no module). Its typed arguments are the communicator,
// the kind of collective, the send and receive pointers, the count, the data
// type, the reduction and the root. On a capturing stream a collective thus
// becomes an ordinary kernel node, which graphs replay, exec updates and
// per-node updates rewrite, and the differential tracing of package internal/trace
// reads back byte for byte like any captured library kernel: the pointer
// arguments move with their operands and nothing else changes. That is the
// path an NCCL kernel captured on CUDA takes too.
//
// When a rank's stream runs its collective, the rank arrives at the next
// operation of its communicator (operations are numbered per rank in the
// order they run). The last rank to arrive performs the whole operation:
// it reads every rank's send buffer (as that rank's device, so access is
// checked as on a GPU), reduces in rank order (rank 0's value, then rank 1's
// added, and so on, so results are exact and deterministic), writes every
// rank's receive buffer, and releases the others. Ranks must agree on the
// operation (kind, count, type, reduction, root); otherwise every rank gets
// an error.
//
// # Failure
//
// Nothing waits forever. CommInit and every collective wait at most the
// communicator timeout (SetCommTimeout, default DefaultCommTimeout) for the
// other ranks. A rank that passes it fails with gpu.ErrTimeout naming the
// ranks that did not arrive, and the communicator is aborted: every rank
// waiting in it, or arriving later, fails at once with the same reason. A
// communicator is also aborted when a rank's device faults (its later work
// is skipped, so it would never arrive) and when a rank destroys its handle
// while other ranks wait for it or arrive at an operation it will never
// join. A failed collective is the rank's sticky device error, as any
// failed stream work is. An aborted communicator cannot be used again:
// destroy every rank's handle and make a new one.
//
// # Locks
//
// The communicator table has its own mutex (Backend.coll.mu), and each
// communicator one for its operations (commGroup.mu). Lock order: Backend.mu,
// then Backend.coll.mu, then commGroup.mu. Collectives read and write memory
// through access, which takes Backend.mu, so they hold neither of the other
// two while doing it.

// DefaultCommTimeout is how long CommInit and collectives wait for the other
// ranks unless SetCommTimeout says otherwise.
const DefaultCommTimeout = 30 * time.Second

// collKernelName is the name of the internal collective function.
const collKernelName = "ncclDevKernel_sim"

// collParams are the kinds of the internal function's arguments.
var collParams = []gpu.ArgKind{
	gpu.ArgU64, // communicator
	gpu.ArgU32, // collKind
	gpu.ArgPtr, // send
	gpu.ArgPtr, // recv
	gpu.ArgU64, // count (per kind, as the entry point takes it)
	gpu.ArgU32, // gpu.DataType
	gpu.ArgU32, // gpu.ReduceOp
	gpu.ArgI32, // root
}

type collKind uint32

const (
	collAllReduce collKind = iota + 1
	collReduceScatter
	collAllGather
	collBroadcast
)

var collOps = [...]string{"", "AllReduce", "ReduceScatter", "AllGather", "Broadcast"}

func (k collKind) String() string {
	if int(k) < len(collOps) && k > 0 {
		return collOps[k]
	}
	return fmt.Sprintf("collKind(%d)", uint32(k))
}

var _ gpu.Collectives = (*Backend)(nil)

// collState is the backend's collective state.
type collState struct {
	timeout time.Duration // guarded by mu

	mu        sync.Mutex
	transport Transport                 // nil: communicators in this process
	pending   map[gpu.CommID]*commGroup // communicators still gathering ranks
	comms     map[gpu.Comm]*commRank    // live handles
	fns       map[int]*function         // per device, the internal function
}

// commGroup is one communicator: the ranks of every device taking part.
type commGroup struct {
	id     gpu.CommID
	nranks int
	ready  chan struct{} // closed once every rank joined

	mu     sync.Mutex
	ranks  []*commRank // by rank; nil until joined (and after a failed join)
	joined int
	gone   []bool             // ranks whose handle was destroyed
	ops    map[uint64]*collOp // operations some rank arrived at, by number
	failed error              // why the communicator was aborted
	abort  chan struct{}      // closed when failed is set
}

// commRank is one rank's handle.
type commRank struct {
	handle gpu.Comm
	g      *commGroup
	rank   int
	dev    int
	seq    uint64 // the number of its next operation; guarded by g.mu
	// t carries the communicator to the other processes' ranks (one per
	// process); nil when every rank is a device of this Backend.
	t Transport
}

// collArgs is one rank's part of an operation.
type collArgs struct {
	kind       collKind
	send, recv gpu.DevicePtr
	count      uint64
	dt         gpu.DataType
	op         gpu.ReduceOp
	root       int
	dev        int
}

// collOp is one operation of a communicator: the ranks that arrived, and
// its outcome once the last one has.
type collOp struct {
	args    []*collArgs // by rank
	arrived int
	done    chan struct{}
	err     error // set before done is closed
	faulted int   // the rank whose device faulted, -1 if none
}

// SetCommTimeout sets how long CommInit and collectives wait for the other
// ranks before failing with gpu.ErrTimeout (and aborting the communicator);
// d <= 0 restores DefaultCommTimeout. It applies to waits that begin after
// the call.
func (b *Backend) SetCommTimeout(d time.Duration) {
	b.coll.mu.Lock()
	defer b.coll.mu.Unlock()
	b.coll.timeout = d
}

func (b *Backend) commTimeout() time.Duration {
	b.coll.mu.Lock()
	defer b.coll.mu.Unlock()
	if b.coll.timeout <= 0 {
		return DefaultCommTimeout
	}
	return b.coll.timeout
}

// CommUniqueID returns a random communicator id.
func (b *Backend) CommUniqueID() (gpu.CommID, error) {
	const op = "CommUniqueID"
	if err := b.enter(op); err != nil {
		return gpu.CommID{}, err
	}
	if b.closed.Load() {
		return gpu.CommID{}, errClosed(op)
	}
	var id gpu.CommID
	if _, err := rand.Read(id[:]); err != nil {
		return gpu.CommID{}, gpu.Errorf(op, gpu.ErrIllegalState, "random id: %v", err)
	}
	return id, nil
}

// collFunction returns dev's internal collective function, making it at the
// first call.
func (b *Backend) collFunction(op string, dev int) (*function, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return nil, errClosed(op)
	}
	b.coll.mu.Lock()
	defer b.coll.mu.Unlock()
	if f := b.coll.fns[dev]; f != nil {
		return f, nil
	}
	spec := gpu.KernelSpec{Name: collKernelName, Params: slices.Clone(collParams), Ref: b.collKernel}
	f := &function{handle: gpu.Function(b.newHandleLocked()), dev: dev, spec: spec, params: paramLayout(spec.Params)}
	b.mu.funcs[f.handle] = f
	if b.coll.fns == nil {
		b.coll.fns = map[int]*function{}
	}
	b.coll.fns[dev] = f
	return f, nil
}

// CommInit joins rank of the communicator id on device dev and waits, at
// most the communicator timeout, until all nranks ranks have joined. Every
// rank must name the same nranks, a distinct rank and a distinct device
// (NCCL's rule: one rank per GPU); nranks cannot exceed the number of
// devices, since the sim's ranks are its devices.
func (b *Backend) CommInit(dev int, id gpu.CommID, nranks, rank int) (gpu.Comm, error) {
	const op = "CommInit"
	if err := b.enter(op); err != nil {
		return 0, err
	}
	if err := b.checkDev(op, dev); err != nil {
		return 0, err
	}
	if t := b.transport(); t != nil {
		return b.commInitOver(t, dev, id, nranks, rank)
	}
	switch {
	case nranks < 1 || nranks > len(b.devs):
		return 0, gpu.Errorf(op, gpu.ErrInvalidValue, "%d ranks; the sim's ranks are its devices (%d), one per rank", nranks, len(b.devs))
	case rank < 0 || rank >= nranks:
		return 0, gpu.Errorf(op, gpu.ErrInvalidValue, "rank %d out of range [0, %d)", rank, nranks)
	}
	if _, err := b.collFunction(op, dev); err != nil {
		return 0, err
	}
	b.mu.Lock()
	h := gpu.Comm(b.newHandleLocked())
	b.mu.Unlock()
	timeout := b.commTimeout()

	b.coll.mu.Lock()
	if b.coll.pending == nil {
		b.coll.pending = map[gpu.CommID]*commGroup{}
		b.coll.comms = map[gpu.Comm]*commRank{}
	}
	g := b.coll.pending[id]
	if g == nil {
		g = &commGroup{id: id, nranks: nranks, ready: make(chan struct{}), ranks: make([]*commRank, nranks),
			gone: make([]bool, nranks), ops: map[uint64]*collOp{}, abort: make(chan struct{})}
		b.coll.pending[id] = g
	}
	g.mu.Lock()
	var bad error
	switch {
	case g.failed != nil:
		bad = g.failed
	case g.nranks != nranks:
		bad = gpu.Errorf(op, gpu.ErrInvalidValue, "rank %d says %d ranks, a rank before it %d", rank, nranks, g.nranks)
	case g.ranks[rank] != nil:
		bad = gpu.Errorf(op, gpu.ErrInvalidValue, "rank %d joined twice (devices %d and %d)", rank, g.ranks[rank].dev, dev)
	default:
		for _, r := range g.ranks {
			if r != nil && r.dev == dev {
				bad = gpu.Errorf(op, gpu.ErrInvalidValue, "ranks %d and %d both on device %d (one rank per device)", r.rank, rank, dev)
			}
		}
	}
	if bad != nil {
		g.mu.Unlock()
		b.coll.mu.Unlock()
		return 0, bad
	}
	cr := &commRank{handle: h, g: g, rank: rank, dev: dev}
	g.ranks[rank] = cr
	g.joined++
	if g.joined == nranks {
		delete(b.coll.pending, id)
		close(g.ready)
	}
	g.mu.Unlock()
	b.coll.mu.Unlock()

	t := time.NewTimer(timeout)
	defer t.Stop()
	var err error
	select {
	case <-g.ready:
	case <-g.abort:
	case <-b.closing:
		err = errClosed(op)
	case <-t.C:
		err = gpu.Errorf(op, gpu.ErrTimeout, "rank %d waited %v for ranks %s to join the communicator", rank, timeout, g.missing())
	}
	b.coll.mu.Lock()
	defer b.coll.mu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if err == nil {
		err = g.failed
	}
	select {
	case <-g.ready:
		if err == nil {
			b.coll.comms[h] = cr
			return h, nil
		}
	default:
	}
	// Leave the communicator; those still waiting fail now instead of at
	// their own deadlines, and the id can no longer be joined.
	g.ranks[rank] = nil
	g.joined--
	g.failLocked(err)
	if b.coll.pending[id] == g {
		delete(b.coll.pending, id)
	}
	return 0, err
}

// missing lists the ranks that have not joined, as "[1 3]".
func (g *commGroup) missing() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var m []int
	for r, cr := range g.ranks {
		if cr == nil {
			m = append(m, r)
		}
	}
	return fmt.Sprint(m)
}

// failLocked aborts the communicator with err, once; g.mu is held.
func (g *commGroup) failLocked(err error) {
	if g.failed != nil || err == nil {
		return
	}
	g.failed = err
	close(g.abort)
}

// abortCommsOf aborts the communicators with a rank on dev, whose later
// work will be skipped: called when dev faults.
func (b *Backend) abortCommsOf(dev int, cause error) {
	b.coll.mu.Lock()
	defer b.coll.mu.Unlock()
	for _, cr := range b.coll.comms {
		if cr.dev != dev {
			continue
		}
		cr.g.mu.Lock()
		cr.g.failLocked(&gpu.Error{Op: "collective", Err: gpu.ErrDeviceLost,
			Detail: fmt.Sprintf("the communicator was aborted: rank %d's device %d faulted: %v", cr.rank, dev, cause)})
		cr.g.mu.Unlock()
	}
}

// commLocked looks a handle up; b.coll.mu is held.
func (b *Backend) commLocked(op string, c gpu.Comm) (*commRank, error) {
	if b.closed.Load() {
		return nil, errClosed(op)
	}
	if c == 0 {
		return nil, gpu.Errorf(op, gpu.ErrInvalidHandle, "communicator handle is zero")
	}
	cr, ok := b.coll.comms[c]
	if !ok {
		return nil, gpu.Errorf(op, gpu.ErrInvalidHandle, "communicator %#x is not live (never issued, or already destroyed)", uint64(c))
	}
	return cr, nil
}

func (b *Backend) comm(op string, c gpu.Comm) (*commRank, error) {
	b.coll.mu.Lock()
	defer b.coll.mu.Unlock()
	return b.commLocked(op, c)
}

// CommDestroy destroys a rank's handle. Graph nodes and queued work that
// name it fail when they run. Ranks waiting for this one in an operation it
// has not joined, or arriving later at one, fail at once.
func (b *Backend) CommDestroy(c gpu.Comm) error {
	const op = "CommDestroy"
	if err := b.enter(op); err != nil {
		return err
	}
	b.coll.mu.Lock()
	defer b.coll.mu.Unlock()
	cr, err := b.commLocked(op, c)
	if err != nil {
		return err
	}
	delete(b.coll.comms, c)
	g := cr.g
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gone[cr.rank] = true
	for seq, o := range g.ops {
		if o.args[cr.rank] == nil {
			g.failLocked(gpu.Errorf("collective", gpu.ErrDeviceLost,
				"the communicator was aborted: rank %d destroyed its handle while ranks wait for it in operation %d", cr.rank, seq))
		}
	}
	return nil
}

// CommRank reports the handle's rank and the communicator's size.
func (b *Backend) CommRank(c gpu.Comm) (rank, nranks int, err error) {
	const op = "CommRank"
	if err := b.enter(op); err != nil {
		return 0, 0, err
	}
	cr, err := b.comm(op, c)
	if err != nil {
		return 0, 0, err
	}
	return cr.rank, cr.g.nranks, nil
}

func (b *Backend) AllReduce(c gpu.Comm, send, recv gpu.DevicePtr, count uint64, dt gpu.DataType, op gpu.ReduceOp, s gpu.Stream) error {
	return b.collective("AllReduce", collArgs{kind: collAllReduce, send: send, recv: recv, count: count, dt: dt, op: op}, c, s)
}

func (b *Backend) ReduceScatter(c gpu.Comm, send, recv gpu.DevicePtr, recvCount uint64, dt gpu.DataType, op gpu.ReduceOp, s gpu.Stream) error {
	return b.collective("ReduceScatter", collArgs{kind: collReduceScatter, send: send, recv: recv, count: recvCount, dt: dt, op: op}, c, s)
}

func (b *Backend) AllGather(c gpu.Comm, send, recv gpu.DevicePtr, sendCount uint64, dt gpu.DataType, s gpu.Stream) error {
	return b.collective("AllGather", collArgs{kind: collAllGather, send: send, recv: recv, count: sendCount, dt: dt}, c, s)
}

func (b *Backend) Broadcast(c gpu.Comm, send, recv gpu.DevicePtr, count uint64, dt gpu.DataType, root int, s gpu.Stream) error {
	return b.collective("Broadcast", collArgs{kind: collBroadcast, send: send, recv: recv, count: count, dt: dt, root: root}, c, s)
}

// collective checks a collective's arguments and submits it to s as a
// launch of the device's internal function (a kernel node when s is
// capturing).
func (b *Backend) collective(op string, a collArgs, c gpu.Comm, s gpu.Stream) error {
	if err := b.enter(op); err != nil {
		return err
	}
	cr, err := b.comm(op, c)
	if err != nil {
		return err
	}
	if a.dt.Size() == 0 {
		return gpu.Errorf(op, gpu.ErrInvalidValue, "unknown data type %v", a.dt)
	}
	if (a.kind == collAllReduce || a.kind == collReduceScatter) && a.op != gpu.Sum && a.op != gpu.Max {
		return gpu.Errorf(op, gpu.ErrInvalidValue, "unknown reduction %v", a.op)
	}
	if a.kind == collBroadcast && (a.root < 0 || a.root >= cr.g.nranks) {
		return gpu.Errorf(op, gpu.ErrInvalidValue, "root %d out of range [0, %d)", a.root, cr.g.nranks)
	}
	if a.count > maxAllocSize/uint64(a.dt.Size())/uint64(cr.g.nranks) {
		return gpu.Errorf(op, gpu.ErrInvalidValue, "%d elements of %s: larger than any allocation", a.count, a.dt)
	}
	if a.count > 0 && (a.recv == 0 || (a.send == 0 && (a.kind != collBroadcast || cr.rank == a.root))) {
		return gpu.Errorf(op, gpu.ErrInvalidValue, "null buffer (send %#x, recv %#x)", uint64(a.send), uint64(a.recv))
	}
	args := []gpu.Arg{gpu.U64(uint64(c)), gpu.U32(uint32(a.kind)), gpu.Ptr(a.send), gpu.Ptr(a.recv),
		gpu.U64(a.count), gpu.U32(uint32(a.dt)), gpu.U32(uint32(a.op)), gpu.I32(int32(a.root))}
	return b.submit(op, s, capNode, func(st *stream) (cmd, error) {
		if st.dev != cr.dev {
			return cmd{}, gpu.Errorf(op, gpu.ErrInvalidValue, "communicator of rank %d is on device %d, stream %#x on device %d", cr.rank, cr.dev, uint64(s), st.dev)
		}
		f := b.coll.fnOf(cr.dev)
		if f == nil {
			return cmd{}, errClosed(op)
		}
		return cmd{kind: cmdKernel, p: params{kern: kernelParams{fn: f, cfg: gpu.Linear(1, 1), args: args}}}, nil
	})
}

func (c *collState) fnOf(dev int) *function {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fns[dev]
}

// sizes are the bytes a rank's send and receive buffers hold.
func (a *collArgs) sizes(nranks int) (send, recv uint64) {
	n := a.count * uint64(a.dt.Size())
	switch a.kind {
	case collReduceScatter:
		return n * uint64(nranks), n
	case collAllGather:
		return n, n * uint64(nranks)
	}
	return n, n
}

// collKernel is the internal function's reference: the rank's part of an
// operation, run on its stream's worker.
func (b *Backend) collKernel(_ gpu.Memory, _ gpu.LaunchConfig, args []gpu.Arg) error {
	a := &collArgs{kind: collKind(args[1].AsU32()), send: args[2].AsPtr(), recv: args[3].AsPtr(), count: args[4].AsU64(),
		dt: gpu.DataType(args[5].AsU32()), op: gpu.ReduceOp(args[6].AsU32()), root: int(args[7].AsI32())}
	opName := "nccl" + a.kind.String()
	cr, err := b.comm(opName, gpu.Comm(args[0].AsU64()))
	if err != nil {
		return err
	}
	a.dev = cr.dev
	if cr.t != nil {
		err = b.collectiveOver(opName, cr, a)
	} else {
		err = b.arrive(opName, cr, a)
	}
	if err != nil {
		// Sticky on this rank's device whatever the cause (a peer's
		// fault is not this device's, so it is not a *gpu.FaultError here).
		b.stick(cr.dev, err)
	}
	return err
}

// arrive adds the rank's part to its next operation, performs it when the
// rank is the last to arrive, and otherwise waits for the one that is.
func (b *Backend) arrive(opName string, cr *commRank, a *collArgs) error {
	g := cr.g
	timeout := b.commTimeout()
	g.mu.Lock()
	if g.failed != nil {
		g.mu.Unlock()
		return g.failed
	}
	seq := cr.seq
	cr.seq++
	o := g.ops[seq]
	if o == nil {
		o = &collOp{args: make([]*collArgs, g.nranks), done: make(chan struct{}), faulted: -1}
		g.ops[seq] = o
	}
	o.args[cr.rank] = a
	o.arrived++
	if o.arrived == g.nranks {
		delete(g.ops, seq)
		g.mu.Unlock()
		o.err = b.perform(opName, seq, o)
		close(o.done)
		return o.result(cr.rank)
	}
	for r, gone := range g.gone {
		if gone && o.args[r] == nil {
			g.failLocked(gpu.Errorf(opName, gpu.ErrDeviceLost,
				"the communicator was aborted: rank %d arrived at operation %d, which rank %d, whose handle was destroyed, will never join", cr.rank, seq, r))
		}
	}
	g.mu.Unlock()

	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-o.done:
		return o.result(cr.rank)
	case <-g.abort:
	case <-b.closing:
		return errClosed(opName)
	case <-t.C:
		g.mu.Lock()
		var missing []int
		for r, x := range o.args {
			if x == nil {
				missing = append(missing, r)
			}
		}
		g.failLocked(gpu.Errorf(opName, gpu.ErrTimeout,
			"rank %d waited %v in operation %d for ranks %v, which never arrived; the communicator is aborted", cr.rank, timeout, seq, missing))
		g.mu.Unlock()
	}
	// Aborted (by this rank's timeout or another cause); the last rank may
	// still have completed the operation meanwhile.
	select {
	case <-o.done:
		return o.result(cr.rank)
	default:
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.failed
}

// result is the operation's outcome for rank r: the error itself on the
// rank whose device faulted (already its sticky fault), a plain error for
// the others.
func (o *collOp) result(r int) error {
	if o.err == nil || r == o.faulted {
		return o.err
	}
	if o.faulted >= 0 {
		return gpu.Errorf("collective", gpu.ErrDeviceLost, "rank %d's device faulted in the operation: %v", o.faulted, o.err)
	}
	return o.err
}

// perform runs a complete operation: every rank's arguments are known.
func (b *Backend) perform(opName string, seq uint64, o *collOp) error {
	a0 := o.args[0]
	nranks := len(o.args)
	for r, a := range o.args[1:] {
		if a.kind != a0.kind || a.count != a0.count || a.dt != a0.dt ||
			(a.kind != collAllGather && a.kind != collBroadcast && a.op != a0.op) || (a.kind == collBroadcast && a.root != a0.root) {
			return gpu.Errorf(opName, gpu.ErrInvalidValue, "operation %d: ranks disagree: rank 0 calls %s, rank %d calls %s",
				seq, a0.describe(), r+1, a.describe())
		}
	}
	sendN, recvN := a0.sizes(nranks)
	read := func(r int, p gpu.DevicePtr, n uint64) ([]byte, error) {
		buf := make([]byte, n)
		if n == 0 {
			return buf, nil
		}
		err := b.access(actor{dev: o.args[r].dev, kernel: opName}, p, buf, false)
		if err != nil {
			o.faulted = r
		}
		return buf, err
	}
	write := func(r int, buf []byte) error {
		if len(buf) == 0 {
			return nil
		}
		err := b.access(actor{dev: o.args[r].dev, kernel: opName}, o.args[r].recv, buf, true)
		if err != nil {
			o.faulted = r
		}
		return err
	}
	// Read everything first: receive buffers may alias send buffers.
	var sends [][]byte
	for r, a := range o.args {
		if a.kind == collBroadcast && r != a.root {
			sends = append(sends, nil)
			continue
		}
		s, err := read(r, a.send, sendN)
		if err != nil {
			return err
		}
		sends = append(sends, s)
	}
	all := collCombine(a0, sends)
	for r := range nranks {
		if err := write(r, collPart(a0, all, r, recvN)); err != nil {
			return err
		}
	}
	return nil
}

// collCombine combines the ranks' send buffers (by rank; nil for the ranks
// a broadcast does not read) into what the operation produces: the
// reduction in rank order (rank 0's value, then rank 1's added, and so on,
// so that results are exact and deterministic), the concatenation, or the
// root's buffer.
func collCombine(a *collArgs, sends [][]byte) []byte {
	switch a.kind {
	case collAllReduce, collReduceScatter:
		return collref.Reduce(sends, a.dt, a.op)
	case collAllGather:
		return slices.Concat(sends...)
	case collBroadcast:
		return sends[a.root]
	}
	return nil
}

// collPart is rank r's receive buffer of recvN bytes, cut from what
// collCombine produced.
func collPart(a *collArgs, all []byte, r int, recvN uint64) []byte {
	if a.kind == collReduceScatter {
		return all[uint64(r)*recvN : uint64(r+1)*recvN]
	}
	return all
}

func (a *collArgs) describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s of %d %s", a.kind, a.count, a.dt)
	switch a.kind {
	case collAllReduce, collReduceScatter:
		fmt.Fprintf(&b, " (%s)", a.op)
	case collBroadcast:
		fmt.Fprintf(&b, " from root %d", a.root)
	}
	return b.String()
}

// liveComms counts live handles; b.mu is held.
func (b *Backend) liveComms() int {
	b.coll.mu.Lock()
	defer b.coll.mu.Unlock()
	return len(b.coll.comms)
}

// closeComms drops every communicator at Close: waiting ranks are released
// by Backend.closing.
func (b *Backend) closeComms() {
	b.coll.mu.Lock()
	defer b.coll.mu.Unlock()
	for _, cr := range b.coll.comms {
		cr.g.mu.Lock()
		cr.g.failLocked(errClosed("collective"))
		cr.g.mu.Unlock()
	}
	clear(b.coll.comms)
	clear(b.coll.pending)
	clear(b.coll.fns)
}
