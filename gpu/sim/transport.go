package sim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/stablegraph/stablegraph/gpu"
)

// Collectives across processes. A sim given a Transport (Config.Transport,
// SetTransport) makes every communicator span processes, one rank per
// process, as NCCL does with one process per GPU: CommInit takes the
// transport's rank and world, and each collective exchanges the ranks' data
// through it. Everything else is the sim's own, so a process of such a job
// keeps every capability the sim has (GEMM, allocation extents, graph node
// read-back, device updates, fault injection) and the same code paths as
// one with every rank in-process.
//
// A collective is the same kernel launch as in-process (collectives.go):
// when the rank's stream reaches it, the rank reads its send buffer (as its
// device, so access is checked), all-gathers every rank's buffer together
// with a header naming the operation (in as many rounds as the transport's
// messages require), checks that every rank called the same operation,
// combines the buffers with collCombine and writes its receive buffer. A
// rank whose device faults reading its buffer still takes part in the
// first round, saying so, so that the other ranks fail at once with
// gpu.ErrDeviceLost instead of waiting for their deadline.
//
// Errors: ranks that disagree fail with gpu.ErrInvalidValue on every rank;
// a transport that times out, or a wait past the communicator timeout,
// gpu.ErrTimeout; any other transport error (a rank lost, the group
// aborted) gpu.ErrDeviceLost. As with any failed stream work, the error is
// sticky on the device, and the communicator is aborted.

// Transport carries the data of communicators whose ranks are processes,
// one rank per process (internal/netsim makes one of a rendezvous group).
// It is used by one collective at a time per process.
type Transport interface {
	// Rank is this process's rank, World the number of processes.
	Rank() int
	World() int
	// AllGather sends data to every rank and returns every rank's data,
	// by rank (this rank's included). Every rank calls it the same number
	// of times, in the same order. It returns when ctx is done at the
	// latest. An error wrapping gpu.ErrTimeout or context.DeadlineExceeded
	// is a timeout; any other means the group is lost.
	AllGather(ctx context.Context, data []byte) ([][]byte, error)
	// MaxMessage bounds what one AllGather returns: all parts together,
	// with 4 bytes of framing per part.
	MaxMessage() int
}

// SetTransport sets the transport of the communicators made from now on,
// as Config.Transport does at New: for a job whose ranks meet after the
// backend was opened. nil makes communicators in-process again. It is
// refused with gpu.ErrIllegalState while a communicator is live or being
// made.
func (b *Backend) SetTransport(t Transport) error {
	const op = "SetTransport"
	b.coll.mu.Lock()
	defer b.coll.mu.Unlock()
	if b.closed.Load() {
		return errClosed(op)
	}
	if n := len(b.coll.comms) + len(b.coll.pending); n > 0 {
		return gpu.Errorf(op, gpu.ErrIllegalState, "%d communicators are live or being made: destroy them first", n)
	}
	b.coll.transport = t
	return nil
}

func (b *Backend) transport() Transport {
	b.coll.mu.Lock()
	defer b.coll.mu.Unlock()
	return b.coll.transport
}

// initTag starts every rank's part of CommInit's exchange.
const initTag = "init"

// commInitOver joins this process's rank of the communicator id, whose
// other ranks are the other processes of t: it returns once every rank has
// called it with the same id.
func (b *Backend) commInitOver(t Transport, dev int, id gpu.CommID, nranks, rank int) (gpu.Comm, error) {
	const op = "CommInit"
	if nranks != t.World() || rank != t.Rank() {
		return 0, gpu.Errorf(op, gpu.ErrInvalidValue, "rank %d of %d, but this process is rank %d of %d of its transport (one rank per process)",
			rank, nranks, t.Rank(), t.World())
	}
	if _, err := b.collFunction(op, dev); err != nil {
		return 0, err
	}
	g := &commGroup{id: id, nranks: nranks, ready: make(chan struct{}), ranks: make([]*commRank, nranks),
		gone: make([]bool, nranks), ops: map[uint64]*collOp{}, abort: make(chan struct{})}
	close(g.ready)
	mine := append([]byte(initTag), id[:]...)
	parts, err := b.exchangeOnce(op, t, g, mine)
	if err != nil {
		return 0, err
	}
	for r, p := range parts {
		if string(p) != string(mine) {
			return 0, gpu.Errorf(op, gpu.ErrInvalidValue, "rank %d joined another communicator (or called another operation) than rank %d", r, rank)
		}
	}
	b.mu.Lock()
	h := gpu.Comm(b.newHandleLocked())
	b.mu.Unlock()
	cr := &commRank{handle: h, g: g, rank: rank, dev: dev, t: t}
	g.ranks[rank] = cr
	g.joined = 1
	b.coll.mu.Lock()
	defer b.coll.mu.Unlock()
	if b.closed.Load() {
		return 0, errClosed(op)
	}
	if b.coll.comms == nil {
		b.coll.pending = map[gpu.CommID]*commGroup{}
		b.coll.comms = map[gpu.Comm]*commRank{}
	}
	b.coll.comms[h] = cr
	return h, nil
}

// exchangeOnce all-gathers data over t, waiting at most the communicator
// timeout, and no longer once the backend closes or g is aborted.
func (b *Backend) exchangeOnce(op string, t Transport, g *commGroup, data []byte) ([][]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), b.commTimeout())
	defer cancel()
	go func() {
		select {
		case <-ctx.Done():
		case <-b.closing:
			cancel()
		case <-g.abort:
			cancel()
		}
	}()
	parts, err := t.AllGather(ctx, data)
	if err == nil && len(parts) != g.nranks {
		err = fmt.Errorf("the transport returned %d parts for %d ranks", len(parts), g.nranks)
	}
	if err == nil {
		return parts, nil
	}
	select {
	case <-b.closing:
		return nil, errClosed(op)
	case <-g.abort:
		g.mu.Lock()
		defer g.mu.Unlock()
		return nil, g.failed
	default:
	}
	sentinel := gpu.ErrDeviceLost
	if errors.Is(err, gpu.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		sentinel = gpu.ErrTimeout
	}
	return nil, fmt.Errorf("%w: %s across processes: %w", sentinel, op, err)
}

// collectiveOver is this rank's part of an operation of a communicator
// across processes, run when its stream reaches it.
func (b *Backend) collectiveOver(opName string, cr *commRank, a *collArgs) error {
	g := cr.g
	g.mu.Lock()
	if g.failed != nil {
		defer g.mu.Unlock()
		return g.failed
	}
	seq := cr.seq
	cr.seq++
	g.mu.Unlock()
	sendN, recvN := a.sizes(g.nranks)
	var send []byte
	var fault error
	if a.kind != collBroadcast || cr.rank == a.root {
		send = make([]byte, sendN)
		if sendN > 0 {
			fault = b.access(actor{dev: cr.dev, kernel: opName}, a.send, send, false)
		}
	}
	sends, err := b.exchangeOver(opName, cr, seq, a, send, sendN, fault != nil)
	if fault != nil {
		return fault
	}
	if err != nil {
		return err
	}
	out := collPart(a, collCombine(a, sends), cr.rank, recvN)
	if len(out) == 0 {
		return nil
	}
	return b.access(actor{dev: cr.dev, kernel: opName}, a.recv, out, true)
}

// headerLen is the size of an operation's header: its number, kind, count,
// data type, reduction and root.
const headerLen = 8 + 4 + 8 + 4 + 4 + 4

// header is what every rank says of operation seq, checked against the
// others': the arguments that must agree (pointers aside). A rank whose
// device faulted says kind 0.
func (a *collArgs) header(seq uint64, faulted bool) []byte {
	kind, op, root := a.kind, a.op, int32(a.root)
	if a.kind == collAllGather || a.kind == collBroadcast {
		op = 0 // not part of the operation
	}
	if a.kind != collBroadcast {
		root = 0
	}
	if faulted {
		kind = 0
	}
	h := make([]byte, 0, headerLen)
	h = binary.BigEndian.AppendUint64(h, seq)
	h = binary.BigEndian.AppendUint32(h, uint32(kind))
	h = binary.BigEndian.AppendUint64(h, a.count)
	h = binary.BigEndian.AppendUint32(h, uint32(a.dt))
	h = binary.BigEndian.AppendUint32(h, uint32(op))
	return binary.BigEndian.AppendUint32(h, uint32(root))
}

func decodeHeader(h []byte) (seq uint64, a *collArgs) {
	be := binary.BigEndian
	return be.Uint64(h), &collArgs{kind: collKind(be.Uint32(h[8:])), count: be.Uint64(h[12:]), dt: gpu.DataType(be.Uint32(h[20:])),
		op: gpu.ReduceOp(be.Uint32(h[24:])), root: int(int32(be.Uint32(h[28:])))}
}

// exchangeOver all-gathers operation seq's header and every rank's send
// buffer over the communicator's transport, in as many rounds as the
// transport's message size requires, and returns the send buffers by rank.
// faulted says this rank's device faulted reading its buffer: it sends its
// header alone, and every rank stops after the first round.
func (b *Backend) exchangeOver(opName string, cr *commRank, seq uint64, a *collArgs, send []byte, sendN uint64, faulted bool) ([][]byte, error) {
	nranks := cr.g.nranks
	chunk := uint64(max(cr.t.MaxMessage()/nranks-8-headerLen, 1))
	rounds := max((sendN+chunk-1)/chunk, 1)
	sends := make([][]byte, nranks)
	mine := a.header(seq, faulted)
	if faulted {
		send = nil
	}
	for round := range rounds {
		lo := min(round*chunk, uint64(len(send)))
		hi := min(lo+chunk, uint64(len(send)))
		part := send[lo:hi]
		if round == 0 {
			part = append(slices.Clip(mine), part...)
		}
		parts, err := b.exchangeOnce(opName, cr.t, cr.g, part)
		if err != nil {
			return nil, err
		}
		for r, p := range parts {
			if round == 0 {
				if len(p) < headerLen {
					return nil, gpu.Errorf(opName, gpu.ErrInvalidValue, "rank %d sent no operation", r)
				}
				if string(p[:headerLen]) != string(mine) {
					theirSeq, theirs := decodeHeader(p[:headerLen])
					switch {
					case faulted:
						return nil, nil // the caller returns the fault
					case theirs.kind == 0:
						return nil, gpu.Errorf(opName, gpu.ErrDeviceLost, "rank %d's device faulted in operation %d", r, theirSeq)
					}
					return nil, gpu.Errorf(opName, gpu.ErrInvalidValue, "operation %d: ranks disagree: rank %d calls %s, rank %d calls %s (its operation %d)",
						seq, cr.rank, a.describe(), r, theirs.describe(), theirSeq)
				}
				p = p[headerLen:]
			}
			sends[r] = append(sends[r], p...)
		}
		if faulted {
			return nil, nil
		}
	}
	for r, s := range sends {
		if (a.kind != collBroadcast || r == a.root) && uint64(len(s)) != sendN {
			return nil, gpu.Errorf(opName, gpu.ErrInvalidValue, "rank %d sent %d bytes, want %d", r, len(s), sendN)
		}
	}
	return sends, nil
}
