// Package netsim gives the sim backend collectives between processes, so
// that the one-process-per-GPU path (launchers, the rendezvous, each rank's
// set-up and run) works, and is tested, without GPUs. The sim's own
// collectives join the devices of one process only.
//
// A Backend wraps one process's sim (it needs a backend that runs kernels as
// their Go reference, which only the sim does; it does not import the sim,
// so that a library linking it does not register one): every method is the
// sim's except the
// collectives (gpu.Collectives), which are one rank per process, as with
// NCCL, and meet the other processes' through an Exchanger (a
// rendezvous.Group) in the order they run. Each collective is a launch of a
// kernel of a module the communicator loads on its device, so it is stream
// work that graphs capture, replay and patch like the sim's own
// ncclDevKernel_sim: when the stream reaches it, the kernel reads the rank's
// send buffer, all-gathers every rank's part (in chunks that fit the
// exchanger's messages) and writes the result, reduced in rank order (rank
// 0's value, then rank 1's added, and so on) exactly as the sim reduces, so
// the results are the bits the sim gives with every rank in one process.
//
// Every rank checks that all ranks called the same operation (kind, count,
// type, reduction, root) and fails otherwise. A lost or aborted exchanger
// fails the collective with gpu.ErrDeviceLost, one that times out with
// gpu.ErrTimeout; as with any failed stream work, the error is sticky on the
// device.
package netsim

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/stablegraph/stablegraph/gpu"
	"github.com/stablegraph/stablegraph/internal/collref"
	"github.com/stablegraph/stablegraph/rendezvous"
)

// Exchanger moves every rank's bytes to every rank (AllGather returns the
// parts by rank), for a group of World ranks of which this process is Rank.
// *rendezvous.Group is one.
type Exchanger interface {
	AllGather(ctx context.Context, data []byte) ([][]byte, error)
	Rank() int
	World() int
	// MaxMessage bounds what one AllGather returns, every part with 4
	// bytes of framing besides.
	MaxMessage() int
}

// Backend is a sim backend whose collectives span processes. Close closes
// the sim, as its own Close would.
type Backend struct {
	gpu.Backend
	ex Exchanger

	mu    sync.Mutex
	comms map[gpu.Comm]*comm
	next  gpu.Comm
}

var (
	_ gpu.Collectives    = (*Backend)(nil)
	_ gpu.HandleCounter  = (*Backend)(nil)
	_ gpu.DeviceResetter = (*Backend)(nil)
	_ gpu.DeviceUpdates  = (*Backend)(nil)
	_ gpu.StreamWaits    = (*Backend)(nil)
)

// New wraps b, a sim, whose collectives then go through ex.
func New(b gpu.Backend, ex Exchanger) (*Backend, error) {
	if b.Name() != "sim" {
		return nil, fmt.Errorf("netsim: backend %s: only the sim's collectives go through a rendezvous (its kernels run on the host)", b.Name())
	}
	return &Backend{Backend: b, ex: ex, comms: map[gpu.Comm]*comm{}}, nil
}

// ResetDevice is the sim's (gpu.DeviceResetter).
func (b *Backend) ResetDevice(dev int) error {
	if r, ok := b.Backend.(gpu.DeviceResetter); ok {
		return r.ResetDevice(dev)
	}
	return gpu.Errorf("ResetDevice", gpu.ErrNotSupported, "backend %s cannot reset a device", b.Name())
}

// The sim's device-side graph updates (gpu.DeviceUpdates), so that every
// rank can run the device strategy: the wrapper would hide them otherwise.

// devUpdates returns the wrapped backend's, or why there are none.
func (b *Backend) devUpdates(op string) (gpu.DeviceUpdates, error) {
	if du, ok := b.Backend.(gpu.DeviceUpdates); ok {
		return du, nil
	}
	return nil, gpu.Errorf(op, gpu.ErrNotSupported, "backend %s has no device-side graph updates", b.Name())
}

// DeviceUpdatesSupported is the sim's.
func (b *Backend) DeviceUpdatesSupported(dev int) error {
	du, err := b.devUpdates("DeviceUpdatesSupported")
	if err != nil {
		return err
	}
	return du.DeviceUpdatesSupported(dev)
}

// GraphKernelNodeSetDeviceUpdatable is the sim's.
func (b *Backend) GraphKernelNodeSetDeviceUpdatable(n gpu.GraphNode, updatable bool) (gpu.DevNode, error) {
	du, err := b.devUpdates("GraphKernelNodeSetDeviceUpdatable")
	if err != nil {
		return 0, err
	}
	return du.GraphKernelNodeSetDeviceUpdatable(n, updatable)
}

// GraphKernelNodeDevNode is the sim's.
func (b *Backend) GraphKernelNodeDevNode(n gpu.GraphNode) (gpu.DevNode, error) {
	du, err := b.devUpdates("GraphKernelNodeDevNode")
	if err != nil {
		return 0, err
	}
	return du.GraphKernelNodeDevNode(n)
}

// GraphAddKernelNodeBefore is the sim's.
func (b *Backend) GraphAddKernelNodeBefore(g gpu.Graph, p gpu.KernelParams, before []gpu.GraphNode) (gpu.GraphNode, error) {
	du, err := b.devUpdates("GraphAddKernelNodeBefore")
	if err != nil {
		return 0, err
	}
	return du.GraphAddKernelNodeBefore(g, p, before)
}

// GraphUpload is the sim's.
func (b *Backend) GraphUpload(x gpu.GraphExec, s gpu.Stream) error {
	du, err := b.devUpdates("GraphUpload")
	if err != nil {
		return err
	}
	return du.GraphUpload(x, s)
}

// The sim's stream waits (gpu.StreamWaits), so that every rank's steps are
// timed behind a gate (package workload): the wrapper would hide them
// otherwise.

// streamWaits returns the wrapped backend's, or why there are none.
func (b *Backend) streamWaits(op string) (gpu.StreamWaits, error) {
	if sw, ok := b.Backend.(gpu.StreamWaits); ok {
		return sw, nil
	}
	return nil, gpu.Errorf(op, gpu.ErrNotSupported, "backend %s has no stream waits on memory values", b.Name())
}

// StreamWaitsSupported is the sim's.
func (b *Backend) StreamWaitsSupported(dev int) error {
	sw, err := b.streamWaits("StreamWaitsSupported")
	if err != nil {
		return err
	}
	return sw.StreamWaitsSupported(dev)
}

// StreamWaitValue64 is the sim's.
func (b *Backend) StreamWaitValue64(s gpu.Stream, p gpu.DevicePtr, v uint64) error {
	sw, err := b.streamWaits("StreamWaitValue64")
	if err != nil {
		return err
	}
	return sw.StreamWaitValue64(s, p, v)
}

// comm is one communicator: this process's rank.
type comm struct {
	dev          int
	rank, nranks int
	mod          gpu.Module
	fn           gpu.Function

	mu  sync.Mutex
	seq uint64 // the number of its next operation
}

const kernelName = "netsimCollective"

// kernelParams are the kinds of the kernel's arguments, the sim's
// ncclDevKernel_sim's.
var kernelParams = []gpu.ArgKind{
	gpu.ArgU64, // communicator
	gpu.ArgU32, // kind
	gpu.ArgPtr, // send
	gpu.ArgPtr, // recv
	gpu.ArgU64, // count
	gpu.ArgU32, // gpu.DataType
	gpu.ArgU32, // gpu.ReduceOp
	gpu.ArgI32, // root
}

type kind uint32

const (
	allReduce kind = iota + 1
	reduceScatter
	allGather
	broadcast
)

func (k kind) String() string {
	switch k {
	case allReduce:
		return "AllReduce"
	case reduceScatter:
		return "ReduceScatter"
	case allGather:
		return "AllGather"
	case broadcast:
		return "Broadcast"
	}
	return fmt.Sprintf("kind(%d)", uint32(k))
}

// CommUniqueID returns a random communicator id.
func (b *Backend) CommUniqueID() (gpu.CommID, error) {
	var id gpu.CommID
	if _, err := rand.Read(id[:]); err != nil {
		return gpu.CommID{}, gpu.Errorf("CommUniqueID", gpu.ErrIllegalState, "random id: %v", err)
	}
	return id, nil
}

// CommInit joins rank of the communicator id on device dev. nranks and rank
// must be the exchanger's (one rank per process), and every rank must pass
// the same id: CommInit exchanges them, and so returns once every rank has
// called it.
func (b *Backend) CommInit(dev int, id gpu.CommID, nranks, rank int) (gpu.Comm, error) {
	const op = "CommInit"
	switch {
	case dev < 0 || dev >= b.DeviceCount():
		return 0, gpu.Errorf(op, gpu.ErrInvalidValue, "device %d of %d", dev, b.DeviceCount())
	case nranks != b.ex.World() || rank != b.ex.Rank():
		return 0, gpu.Errorf(op, gpu.ErrInvalidValue, "rank %d of %d, but this process is rank %d of %d of its rendezvous (one rank per process)",
			rank, nranks, b.ex.Rank(), b.ex.World())
	}
	ids, err := b.ex.AllGather(context.Background(), append([]byte("init"), id[:]...))
	if err != nil {
		return 0, exchangeErr(op, err)
	}
	for r, other := range ids {
		if string(other) != "init"+string(id[:]) {
			return 0, gpu.Errorf(op, gpu.ErrInvalidValue, "rank %d joined another communicator (or called another operation) than rank %d", r, rank)
		}
	}
	c := &comm{dev: dev, rank: rank, nranks: nranks}
	img := &gpu.ModuleImage{Name: "netsim", Kernels: []gpu.KernelSpec{{Name: kernelName, Params: slices.Clone(kernelParams), Ref: b.kernel}}}
	if c.mod, err = b.ModuleLoad(dev, img); err != nil {
		return 0, err
	}
	if c.fn, err = b.ModuleFunction(c.mod, kernelName); err != nil {
		return 0, errors.Join(err, b.ModuleUnload(c.mod))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.next++
	b.comms[b.next] = c
	return b.next, nil
}

func (b *Backend) comm(op string, h gpu.Comm) (*comm, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.comms[h]
	if c == nil {
		return nil, gpu.Errorf(op, gpu.ErrInvalidHandle, "communicator %#x", uint64(h))
	}
	return c, nil
}

// CommDestroy destroys a communicator: its module is unloaded, so destroy
// the graphs that captured its collectives first.
func (b *Backend) CommDestroy(h gpu.Comm) error {
	b.mu.Lock()
	c := b.comms[h]
	delete(b.comms, h)
	b.mu.Unlock()
	if c == nil {
		return gpu.Errorf("CommDestroy", gpu.ErrInvalidHandle, "communicator %#x", uint64(h))
	}
	return b.ModuleUnload(c.mod)
}

// CommRank reports the communicator's rank and size.
func (b *Backend) CommRank(h gpu.Comm) (rank, nranks int, err error) {
	c, err := b.comm("CommRank", h)
	if err != nil {
		return 0, 0, err
	}
	return c.rank, c.nranks, nil
}

// LiveHandles is the sim's, with this backend's communicators
// (gpu.HandleCounter).
func (b *Backend) LiveHandles() gpu.Counters {
	n, _ := gpu.LiveHandles(b.Backend)
	b.mu.Lock()
	defer b.mu.Unlock()
	n.Comms += len(b.comms)
	return n
}

func (b *Backend) AllReduce(c gpu.Comm, send, recv gpu.DevicePtr, count uint64, dt gpu.DataType, op gpu.ReduceOp, s gpu.Stream) error {
	return b.collective("AllReduce", args{kind: allReduce, send: send, recv: recv, count: count, dt: dt, op: op}, c, s)
}

func (b *Backend) ReduceScatter(c gpu.Comm, send, recv gpu.DevicePtr, recvCount uint64, dt gpu.DataType, op gpu.ReduceOp, s gpu.Stream) error {
	return b.collective("ReduceScatter", args{kind: reduceScatter, send: send, recv: recv, count: recvCount, dt: dt, op: op}, c, s)
}

func (b *Backend) AllGather(c gpu.Comm, send, recv gpu.DevicePtr, sendCount uint64, dt gpu.DataType, s gpu.Stream) error {
	return b.collective("AllGather", args{kind: allGather, send: send, recv: recv, count: sendCount, dt: dt}, c, s)
}

func (b *Backend) Broadcast(c gpu.Comm, send, recv gpu.DevicePtr, count uint64, dt gpu.DataType, root int, s gpu.Stream) error {
	return b.collective("Broadcast", args{kind: broadcast, send: send, recv: recv, count: count, dt: dt, root: root}, c, s)
}

// args is one rank's part of an operation.
type args struct {
	kind       kind
	send, recv gpu.DevicePtr
	count      uint64
	dt         gpu.DataType
	op         gpu.ReduceOp
	root       int
}

// sizes are the bytes a rank's send and receive buffers hold.
func (a args) sizes(nranks int) (send, recv uint64) {
	n := a.count * uint64(a.dt.Size())
	switch a.kind {
	case reduceScatter:
		return n * uint64(nranks), n
	case allGather:
		return n, n * uint64(nranks)
	}
	return n, n
}

func (a args) describe() string {
	s := fmt.Sprintf("%s of %d %s", a.kind, a.count, a.dt)
	switch a.kind {
	case allReduce, reduceScatter:
		s += fmt.Sprintf(" (%s)", a.op)
	case broadcast:
		s += fmt.Sprintf(" from root %d", a.root)
	}
	return s
}

// maxBytes bounds a collective's buffers, as the sim bounds allocations.
const maxBytes = 1 << 40

// collective checks a collective's arguments as the sim does and launches
// the communicator's kernel on s (a kernel node when s is capturing).
func (b *Backend) collective(op string, a args, h gpu.Comm, s gpu.Stream) error {
	c, err := b.comm(op, h)
	if err != nil {
		return err
	}
	switch {
	case a.dt.Size() == 0:
		return gpu.Errorf(op, gpu.ErrInvalidValue, "unknown data type %v", a.dt)
	case (a.kind == allReduce || a.kind == reduceScatter) && a.op != gpu.Sum && a.op != gpu.Max:
		return gpu.Errorf(op, gpu.ErrInvalidValue, "unknown reduction %v", a.op)
	case a.kind == broadcast && (a.root < 0 || a.root >= c.nranks):
		return gpu.Errorf(op, gpu.ErrInvalidValue, "root %d out of range [0, %d)", a.root, c.nranks)
	case a.count > maxBytes/uint64(a.dt.Size())/uint64(c.nranks):
		return gpu.Errorf(op, gpu.ErrInvalidValue, "%d elements of %s: larger than any allocation", a.count, a.dt)
	case a.count > 0 && (a.recv == 0 || (a.send == 0 && (a.kind != broadcast || c.rank == a.root))):
		return gpu.Errorf(op, gpu.ErrInvalidValue, "null buffer (send %#x, recv %#x)", uint64(a.send), uint64(a.recv))
	}
	kargs := []gpu.Arg{gpu.U64(uint64(h)), gpu.U32(uint32(a.kind)), gpu.Ptr(a.send), gpu.Ptr(a.recv),
		gpu.U64(a.count), gpu.U32(uint32(a.dt)), gpu.U32(uint32(a.op)), gpu.I32(int32(a.root))}
	return b.LaunchKernel(c.fn, gpu.Linear(1, 1), kargs, s)
}

// header is what every rank says of an operation, checked against the
// others': its number and arguments (pointers aside).
func (a args) header(seq uint64) []byte {
	h := make([]byte, 0, 36)
	h = binary.BigEndian.AppendUint64(h, seq)
	h = binary.BigEndian.AppendUint32(h, uint32(a.kind))
	h = binary.BigEndian.AppendUint64(h, a.count)
	h = binary.BigEndian.AppendUint32(h, uint32(a.dt))
	op := a.op
	if a.kind == allGather || a.kind == broadcast {
		op = 0 // not part of the operation
	}
	h = binary.BigEndian.AppendUint32(h, uint32(op))
	root := int32(a.root)
	if a.kind != broadcast {
		root = 0
	}
	h = binary.BigEndian.AppendUint32(h, uint32(root))
	return h
}

const headerLen = 8 + 4 + 8 + 4 + 4 + 4

func decodeHeader(h []byte) (seq uint64, a args) {
	be := binary.BigEndian
	return be.Uint64(h), args{kind: kind(be.Uint32(h[8:])), count: be.Uint64(h[12:]), dt: gpu.DataType(be.Uint32(h[20:])),
		op: gpu.ReduceOp(be.Uint32(h[24:])), root: int(int32(be.Uint32(h[28:])))}
}

// kernel is the collective kernel's reference: this rank's part of an
// operation, run when its stream reaches it.
func (b *Backend) kernel(mem gpu.Memory, _ gpu.LaunchConfig, kargs []gpu.Arg) error {
	a := args{kind: kind(kargs[1].AsU32()), send: kargs[2].AsPtr(), recv: kargs[3].AsPtr(), count: kargs[4].AsU64(),
		dt: gpu.DataType(kargs[5].AsU32()), op: gpu.ReduceOp(kargs[6].AsU32()), root: int(kargs[7].AsI32())}
	op := "nccl" + a.kind.String()
	c, err := b.comm(op, gpu.Comm(kargs[0].AsU64()))
	if err != nil {
		return err
	}
	c.mu.Lock()
	seq := c.seq
	c.seq++
	c.mu.Unlock()
	sendN, recvN := a.sizes(c.nranks)
	var send []byte
	if a.kind != broadcast || c.rank == a.root {
		send = make([]byte, sendN)
		if err := mem.Read(a.send, send); err != nil {
			return err
		}
	}
	sends, err := b.exchange(op, c, seq, a, send, sendN)
	if err != nil {
		return err
	}
	var out []byte
	switch a.kind {
	case allReduce:
		out = collref.Reduce(sends, a.dt, a.op)
	case reduceScatter:
		out = collref.Reduce(sends, a.dt, a.op)[uint64(c.rank)*recvN : uint64(c.rank+1)*recvN]
	case allGather:
		out = slices.Concat(sends...)
	case broadcast:
		out = sends[a.root]
	}
	if len(out) == 0 {
		return nil
	}
	return mem.Write(a.recv, out)
}

// exchange all-gathers the operation's header and every rank's send
// buffer, in as many rounds as the exchanger's message size requires, and
// returns the send buffers by rank.
func (b *Backend) exchange(op string, c *comm, seq uint64, a args, send []byte, sendN uint64) ([][]byte, error) {
	chunk := uint64(max(b.ex.MaxMessage()/c.nranks-8-headerLen, 1))
	rounds := max((sendN+chunk-1)/chunk, 1)
	sends := make([][]byte, c.nranks)
	mine := a.header(seq)
	for round := range rounds {
		lo := min(round*chunk, uint64(len(send)))
		hi := min(lo+chunk, uint64(len(send)))
		part := send[lo:hi]
		if round == 0 {
			part = append(slices.Clip(mine), part...)
		}
		parts, err := b.ex.AllGather(context.Background(), part)
		if err != nil {
			return nil, exchangeErr(op, err)
		}
		for r, p := range parts {
			if round == 0 {
				if len(p) < headerLen {
					return nil, gpu.Errorf(op, gpu.ErrInvalidValue, "rank %d sent no operation", r)
				}
				if string(p[:headerLen]) != string(mine) {
					theirSeq, theirs := decodeHeader(p[:headerLen])
					return nil, gpu.Errorf(op, gpu.ErrInvalidValue, "operation %d: ranks disagree: rank %d calls %s, rank %d calls %s (its operation %d)",
						seq, c.rank, a.describe(), r, theirs.describe(), theirSeq)
				}
				p = p[headerLen:]
			}
			sends[r] = append(sends[r], p...)
		}
	}
	for r, s := range sends {
		if want := sendN; (a.kind != broadcast || r == a.root) && uint64(len(s)) != want {
			return nil, gpu.Errorf(op, gpu.ErrInvalidValue, "rank %d sent %d bytes, want %d", r, len(s), want)
		}
	}
	return sends, nil
}

// exchangeErr maps an exchanger's error to the gpu sentinel a collective
// fails with: a rank lost or the group aborted is ErrDeviceLost (the sim's
// error when a rank destroyed its communicator), a timeout ErrTimeout.
func exchangeErr(op string, err error) error {
	sentinel := gpu.ErrDeviceLost
	if errors.Is(err, rendezvous.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		sentinel = gpu.ErrTimeout
	}
	return fmt.Errorf("%w: %s across processes: %w", sentinel, op, err)
}
